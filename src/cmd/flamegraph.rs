//! `memsnap flamegraph FILE [--at MOMENT] [--folded] [-o OUT]`: live memory
//! by stack at one moment, as folded stacks (the `flamegraph.pl`/inferno/speedscope format,
//! bytes as counts) or as an SVG icicle chart with the user's frames highlighted.

use std::path::PathBuf;

use memsnap_analysis::{find_phases, LiveBlock, Moments, StackTable};
use memsnap_replay::DeviceReplay;
use memsnap_report::text::fmt_count;

use crate::exit::Exit;
use crate::text::fmt_bytes;
use memsnap_report::{flamegraph_svg, folded_text, live_folded, without_native_frames, FlameOptions};

use crate::load::load;
use crate::moment::At;
use crate::output::{write_output, Content};
use crate::pipeline::file_name;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub snapshot: crate::args::SnapshotFile,
    /// The moment: `start`, `peak` (of allocated bytes), `end` (after the last event), `oom`,
    /// `event:N`, `+1.25s` (after the trace start), `iteration:K` or `us:EPOCH`.
    #[arg(long, default_value = "peak", value_parser = crate::moment::parse)]
    pub at: At,
    /// Write folded stacks (`outer;…;inner BYTES` lines) instead of an SVG. Also chosen by an
    /// output name ending in `.folded` or `.txt`.
    #[arg(long)]
    pub folded: bool,
    /// Keep C++ and interpreter frames (`??:0`, `.cpp`, …) in stacks that also have Python
    /// frames. By default they are left out: a `stacks="all"` recording interleaves dozens of
    /// them that bury the Python frames (the bytes stay, merged into the Python stacks).
    #[arg(long)]
    pub native: bool,
    /// Only this device (default: every device; with several, each stack starts with
    /// `[cuda:N]`).
    #[arg(long)]
    pub device: Option<u32>,
    /// Output file (default: stdout).
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
    /// Width of the SVG in pixels.
    #[arg(long, default_value_t = 1200)]
    pub width: u32,
}

/// Whether to write folded stacks (else SVG): `--folded`, else the output's extension (`.folded`
/// or `.txt` folded, `.svg` or stdout SVG). Any other extension is an error, as for `report`,
/// rather than an SVG under a name that says otherwise (`-o x.png`).
fn folded_output(output: &std::path::Path, folded: bool) -> anyhow::Result<bool> {
    if folded {
        return Ok(true);
    }
    match output.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()).as_deref() {
        Some("folded" | "txt") => Ok(true),
        Some("svg") => Ok(false),
        _ if output.as_os_str() == "-" => Ok(false),
        _ => anyhow::bail!(
            "{}: cannot tell the format from the extension; use .svg for an SVG, .folded or .txt for folded stacks, or --folded",
            crate::emit::shown_path(output)
        ),
    }
}

pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let at = args.at;
    let folded_out = folded_output(&args.output, args.folded)?;
    // The live blocks at one moment need the replay, the stack table and the device's phases,
    // not the analysis (lifecycle, detectors), which `analyze` runs: a third of its time after
    // the read on the 1 GB bench file.
    let loaded = load(&args.snapshot.file)?;
    let snap = &loaded.snapshot;
    let phase = crate::progress::phase("replaying the allocator");
    let (replay, stacks) = rayon::join(|| memsnap_replay::replay(snap), || StackTable::new(snap));
    phase.finish_and_clear();
    let stacks = &stacks;

    let devices: Vec<&DeviceReplay> =
        replay.devices.iter().filter(|d| args.device.is_none_or(|x| x == d.device)).collect();
    if devices.is_empty() {
        match args.device {
            Some(d) => anyhow::bail!("{}: no device {d} in this snapshot", args.snapshot.file.display()),
            None => anyhow::bail!("{}: the snapshot holds no device", args.snapshot.file.display()),
        }
    }
    let multi = devices.len() > 1;
    let mut folded: Vec<(String, u64)> = Vec::new();
    let mut total = 0u64;
    let mut blocks_n = 0usize;
    let mut whens = Vec::new();
    let annotations = snap.annotations_by_device();
    let moments = Moments::new(snap, stacks);
    for &d in &devices {
        let events = snap.trace(d.device).map_or(&[][..], |t| &t.events[..]);
        let annotations = annotations.get(&d.device).map_or(&[][..], |a| &a[..]);
        let phases = find_phases(events, stacks, annotations);
        let peak = d.peaks.allocated.event_index;
        // The moments `analyze` shows: its peak, and its end (the last event; the peak, which is
        // the dump, without a trace).
        let (idx, when) = match at {
            At::Peak => (peak, "at the peak".to_string()),
            At::End => (events.len().checked_sub(1).or(peak), "at the end of the trace".to_string()),
            _ => {
                let idx = at
                    .resolve(events, peak, || phases.boundaries.clone())
                    .map_err(|e| anyhow::anyhow!("device {}: {e}", d.device))?;
                let when = match idx {
                    Some(i) => format!("after event {}", fmt_count(i as u64)),
                    None => "before the first event".into(),
                };
                (idx, when)
            }
        };
        let (_, blocks): (_, Vec<LiveBlock>) = moments.at(&phases, d, idx.map(|i| i as u32));
        total += blocks.iter().map(|b| b.size).sum::<u64>();
        blocks_n += blocks.len();
        whens.push(if multi { format!("device {} {when}", d.device) } else { when });
        for (path, bytes) in live_folded(snap, stacks, &blocks, !folded_out) {
            let path = if multi { format!("[cuda:{}];{path}", d.device) } else { path };
            folded.push((path, bytes));
        }
    }
    folded.sort();
    let hidden_native = if args.native {
        false
    } else {
        let (kept, hidden) = without_native_frames(folded);
        folded = kept;
        hidden
    };

    let (text, content) = if folded_out {
        (folded_text(&folded), Content::Text)
    } else {
        let name = file_name(&loaded.path);
        let dev = if multi { "all devices".to_string() } else { format!("device {}", devices[0].device) };
        let svg = flamegraph_svg(
            &folded,
            &FlameOptions {
                width: args.width as f64,
                title: format!("Live memory by stack: {name}, {dev}"),
                subtitle: format!(
                    "{} in {} blocks {}{}",
                    fmt_bytes(total),
                    fmt_count(blocks_n as u64),
                    whens.join("; "),
                    if hidden_native { " · C++ frames hidden (--native shows them)" } else { "" }
                ),
                root_label: "all allocated memory".into(),
                ..FlameOptions::default()
            },
        );
        (svg, Content::Markup)
    };
    write_output(&args.output, &text, content)?;
    drop(devices);
    crate::emit::leave((replay, loaded));
    Ok(Exit::SUCCESS)
}
