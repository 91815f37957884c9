//! The page's model against the replay it comes from, on real fixtures: the pyramid keeps the
//! peak, the detailed windows give the counters event by event, the blocks rebuild allocated
//! bytes at any moment and the segments reserved bytes, and budgets cut in the stated order.

use std::io::Read;
use std::path::Path;

use memsnap_analysis::{analyze, Analysis};
use memsnap_model::{read_snapshot, Snapshot};
use memsnap_replay::{replay, Replay};

use super::data::{self, DeviceData};
use super::{blocks, detail, pyramid};
use crate::ReportInput;

fn load(rel: &str) -> (Snapshot, Replay, Analysis) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(rel);
    let raw = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let bytes = if raw.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        let mut out = Vec::new();
        xz2::read::XzDecoder::new(&raw[..]).read_to_end(&mut out).unwrap();
        out
    } else {
        raw
    };
    let snap = read_snapshot(&bytes).unwrap();
    let replay = replay(&snap);
    let analysis = analyze(&snap, &replay);
    (snap, replay, analysis)
}

fn page(snap: &Snapshot, replay: &Replay, analysis: &Analysis) -> data::PageData {
    data::build(
        &ReportInput {
            snapshot: snap,
            replay,
            analysis,
            file_name: "x.pickle",
            file_bytes: 0,
            pickle_bytes: 0,
            file_caveats: &[],
        },
        &data::Detail::default(),
    )
}

/// Allocated bytes after event `t` from the page's blocks, as the script computes them.
fn allocated_from_blocks(d: &DeviceData, t: i64) -> u64 {
    let b = &d.blocks;
    let mut a = -1i64;
    let mut sum = 0;
    for i in 0..b.size.len() {
        a += b.a[i];
        let reached = |e: Option<i64>| e.is_some_and(|e| t >= 0 && a + e <= t);
        let born = a < 0 || (t >= 0 && a <= t);
        if born && !reached(b.c[i]) && !reached(b.f[i]) && !b.pending.contains(&(i as u32)) {
            sum += b.size[i] * d.quantum;
        }
    }
    sum
}

#[test]
fn the_model_rebuilds_the_replay_exactly() {
    for rel in ["dev/s03_loss_history_leak.pickle.xz", "dev/s10_streams.pickle.xz", "multi/m01_two_gpu_pipeline.pickle"]
    {
        let (snap, replay, analysis) = load(rel);
        let p = page(&snap, &replay, &analysis);
        assert_eq!(p.devices.len(), replay.devices.len(), "{rel}");
        for (d, r) in p.devices.iter().zip(&replay.devices) {
            let q = d.quantum;
            assert!(q >= 512 && q.is_power_of_two(), "{rel}: quantum {q}");
            // The coarsest level keeps the peak.
            let top = &d.levels[0];
            assert_eq!(top.amax.iter().max().unwrap() * q, r.peaks.allocated.value, "{rel}: peak");
            assert_eq!(top.rmax.iter().max().unwrap() * q, r.peaks.reserved.value, "{rel}: reserved peak");
            // Small traces are embedded whole, and the windows give every counter exactly.
            assert_eq!(d.windows.len(), d.windows_total, "{rel}");
            for w in &d.windows {
                let (mut a, mut res, mut x) = (w.start[0] as i64, w.start[1] as i64, w.start[2] as i64);
                for j in 0..w.act.len() {
                    (a, res, x) = (a + w.da[j], res + w.dr[j], x + w.dx[j]);
                    let t = r.series.after(Some(w.first + j));
                    assert_eq!(
                        [a as u64 * q, res as u64 * q, x as u64 * q],
                        [t.allocated, t.reserved, t.active],
                        "{rel}: event {}",
                        w.first + j
                    );
                }
            }
            // Blocks give allocated bytes at any moment.
            assert_eq!(d.blocks.size.len(), r.blocks.len());
            for t in [0, d.events / 3, d.events / 2, d.events - 1] {
                assert_eq!(allocated_from_blocks(d, t as i64), r.series.after(Some(t)).allocated, "{rel}: after {t}");
            }
            assert_eq!(allocated_from_blocks(d, -1), r.series.start.allocated, "{rel}: start");
            // Segments give reserved bytes at the end.
            let live: u64 = (0..d.segments.size.len())
                .filter(|&j| d.segments.released[j].is_none())
                .map(|j| d.segments.size[j])
                .sum();
            assert_eq!(live, r.series.after(Some(d.events - 1)).reserved, "{rel}: reserved at the end");
            // Every block is placed in a segment, inside it.
            for i in 0..d.blocks.size.len() {
                let s = d.blocks.seg[i];
                assert!(s >= 0, "{rel}: block {i} in no segment");
                assert!((d.blocks.off[i] + d.blocks.size[i]) * q <= d.segments.size[s as usize], "{rel}: block {i}");
            }
        }
    }
}

#[test]
fn the_retained_graph_names_its_blocks() {
    let (snap, replay, analysis) = load("dev/s03_loss_history_leak.pickle.xz");
    let p = page(&snap, &replay, &analysis);
    let s = &p.suspects[0];
    assert_eq!(s.kind, "retained_graph");
    assert!(!s.blocks.is_empty() && s.blocks.len() == s.blocks_matched);
    // The marked blocks are what the leak holds at the end, within its stated bytes.
    let sp = &analysis.suspects()[0];
    assert!(s.bytes_matched <= replay.devices[0].series.after(Some(replay.devices[0].event_count - 1)).allocated);
    assert!(s.bytes_matched >= sp.bytes / 2, "{} marked of {} held", s.bytes_matched, sp.bytes);
    assert_eq!(s.moment, Some(replay.devices[0].event_count as u32 - 1));
}

#[test]
fn budgets_keep_the_peak_and_the_suspects_first() {
    let (snap, replay, analysis) = load("dev/s03_loss_history_leak.pickle.xz");
    let d = &replay.devices[0];
    let events = &snap.traces[0].events;
    let n = events.len();
    let stacks = &analysis.stacks;
    let phases = memsnap_analysis::find_phases(events, stacks, &[]);
    // Four windows of 512 events: the peak's first, then its whole iteration when it fits.
    let chosen = detail::choose(d, events, &phases.boundaries, n, 512, 4 * 512, &[]);
    assert_eq!(chosen.len(), 4);
    assert!(chosen.windows(2).all(|w| w[0] < w[1]));
    assert!(chosen.contains(&(d.peaks.allocated.event_index.unwrap() / 512)));
    // An event asked for comes first, with its iteration when that fits half the budget.
    let asked = phases.boundaries[1] as usize + 5;
    let chosen = detail::choose(d, events, &phases.boundaries, n, 512, 16 * 512, &[asked]);
    let (a, b) = (phases.boundaries[1] as usize, phases.boundaries[2] as usize - 1);
    assert!((a / 512..=b / 512).all(|w| chosen.contains(&w)), "iteration 2 ({a}–{b}) in {chosen:?}");
    // Blocks: the suspect's and those live at the peak, before any other.
    let sus = blocks::suspect_blocks(&snap, stacks, &phases, events, d, analysis.suspects()[0]);
    let budget = sus.len() + 10;
    let kept = blocks::select(d, &sus, &[], budget);
    assert_eq!(kept.len(), budget);
    assert!(sus.iter().all(|i| kept.contains(i)));
    let peak = d.peaks.allocated.event_index.map(|i| i as u32);
    let others: Vec<_> = kept.iter().filter(|i| !sus.contains(i)).collect();
    assert!(others.iter().all(|&&i| d.blocks[i].state_after(peak).is_some()), "then blocks live at the peak");
    // The pyramid under a budget keeps whole levels and the coarsest under `top`.
    let levels = pyramid::build(&d.series, n, 64, 600);
    assert!(levels[0].len() <= 64);
    assert!(levels.iter().map(|l| l.len()).sum::<usize>() <= 600);
    assert!(levels.windows(2).all(|w| w[0].bucket == 2 * w[1].bucket));
    assert_eq!(levels[0].allocated_max.iter().max(), Some(&d.peaks.allocated.value));
}

#[test]
fn the_same_input_gives_the_same_blob() {
    let (snap, replay, analysis) = load("dev/s10_streams.pickle.xz");
    let a = super::blob::to_script_text(&page(&snap, &replay, &analysis));
    let b = super::blob::to_script_text(&page(&snap, &replay, &analysis));
    assert_eq!(a, b);
}
