//! Which devices a report draws.
//!
//! A report draws every device of a real job: one process sees the GPUs of one host, at most 16
//! on today's largest (8 is common). A snapshot that lists far more is not a real job's — a
//! hostile or synthetic file — and each device drawn costs a full set of charts (a timeline,
//! the categories, a flamegraph, segment maps) and its share of the interactive page's data:
//! 100 000 one-block devices once made a 1.4 GB page and took 5.7 GB of memory. So a report
//! draws at most [`MAX_DRAWN_DEVICES`] — those with suspects first, then those that reserved
//! the most at their peak — and names the rest in a caveat; `memsnap summary` and `analyze`
//! still cover every device.

use std::cmp::Reverse;

use memsnap_analysis::{Analysis, DeviceAnalysis};
use memsnap_replay::{DeviceReplay, Replay};

use crate::text::{fmt_bytes, fmt_count};

/// Most devices a report draws (see the module comment): four times the GPUs of the largest
/// host, so no real snapshot comes near it.
pub const MAX_DRAWN_DEVICES: usize = 64;

/// Runs of device numbers a caveat spells out before it says "…".
const MAX_NAMED_RUNS: usize = 8;

/// A device as the report draws it: its analysis and its replay.
pub type DrawnDevice<'a> = (&'a DeviceAnalysis, &'a DeviceReplay);

/// The devices a report draws.
pub struct Drawn<'a> {
    /// In device order.
    pub devices: Vec<DrawnDevice<'a>>,
    /// Devices the report could draw (those with a replay), drawn or not.
    pub of: usize,
    /// Names the devices left out; `None` when all are drawn.
    pub caveat: Option<String>,
}

/// The devices to draw, in device order, and a caveat naming those left out (`None` when all
/// are drawn).
pub fn drawn_devices<'a>(analysis: &'a Analysis, replay: &'a Replay) -> Drawn<'a> {
    let mut all: Vec<DrawnDevice<'a>> =
        analysis.devices.iter().filter_map(|da| replay.device(da.device).map(|d| (da, d))).collect();
    let of = all.len();
    if all.len() <= MAX_DRAWN_DEVICES {
        return Drawn { devices: all, of, caveat: None };
    }
    all.sort_by_key(|(da, d)| (da.suspects.is_empty(), Reverse(d.peaks.reserved.value), d.device));
    let left_out = all.split_off(MAX_DRAWN_DEVICES);
    all.sort_by_key(|(_, d)| d.device);
    let mut numbers: Vec<u32> = left_out.iter().map(|(_, d)| d.device).collect();
    numbers.sort_unstable();
    let (largest, at) = left_out
        .iter()
        .map(|(_, d)| (d.peaks.reserved.value, Reverse(d.device)))
        .max()
        .map_or((0, 0), |(bytes, Reverse(device))| (bytes, device));
    let caveat = format!(
        "devices not drawn: the report draws {MAX_DRAWN_DEVICES} of the file's {} devices (those with suspects, then \
         those that reserved the most); the {} others ({}) reserved at most {} at their peak (device {at}); \
         `memsnap summary` and `memsnap analyze` cover every device",
        fmt_count(of as u64),
        fmt_count(left_out.len() as u64),
        runs(&numbers),
        fmt_bytes(largest),
    );
    Drawn { devices: all, of, caveat: Some(caveat) }
}

/// Sorted device numbers as runs: `3, 7–9, 12`, the first [`MAX_NAMED_RUNS`] of them.
fn runs(numbers: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < numbers.len() {
        let mut j = i;
        while j + 1 < numbers.len() && numbers[j + 1] == numbers[j] + 1 {
            j += 1;
        }
        if out.len() == MAX_NAMED_RUNS {
            out.push("…".to_string());
            break;
        }
        out.push(if i == j { numbers[i].to_string() } else { format!("{}–{}", numbers[i], numbers[j]) });
        i = j + 1;
    }
    format!("device{} {}", if numbers.len() == 1 { "" } else { "s" }, out.join(", "))
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn runs_of_device_numbers_are_joined_and_cut() {
        assert_eq!(runs(&[5]), "device 5");
        assert_eq!(runs(&[3, 7, 8, 9, 12]), "devices 3, 7–9, 12");
        let many: Vec<u32> = (0..40).map(|k| k * 2).collect();
        assert_eq!(runs(&many), "devices 0, 2, 4, 6, 8, 10, 12, 14, …");
    }
}
