//! `memsnap trace FILE [--device D]`: the trace as readable events (the `_memory_viz trace`
//! view), with the exact block size of each allocation and free, allocated bytes after each
//! event, and each stack summarised to the user's innermost frame.

use std::fmt::Write as _;

use memsnap_model::{classify_filename, shown, Action, FrameKind, Snapshot, StackId};
use memsnap_replay::DeviceReplay;

use crate::emit::{emit, shown_path};
use crate::exit::Exit;
use crate::load::load;
use crate::pipeline::select_devices;
use crate::text::fmt_bytes;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub snapshot: crate::args::SnapshotFile,
    /// Only this device.
    #[arg(long)]
    pub device: Option<u32>,
}

/// Output is written in pieces of about this many bytes.
const PIECE: usize = 1 << 20;

pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let loaded = load(&args.snapshot.file)?;
    let snap = &loaded.snapshot;
    let replay = memsnap_replay::replay(snap);
    let devices = select_devices(&replay, args.device)?;
    let mut sites = Sites::new(snap);
    let mut out = String::with_capacity(PIECE + 4096);
    let _ = writeln!(out, "memsnap trace: {}", shown_path(&loaded.path));
    for d in devices {
        let events = snap.trace(d.device).map_or(&[][..], |t| t.events.as_slice());
        let first_time = crate::text::trace_origin(events);
        let _ = writeln!(
            out,
            "\ndevice {}: {}{}",
            d.device,
            memsnap_model::count_of(d.event_count as u64, "event"),
            start_note(d)
        );
        if let Some(t) = first_time {
            let _ = writeln!(out, "times are seconds after the first event, {}", crate::text::utc(t));
        }
        let _ = writeln!(
            out,
            "{:>9} {:>11}  {:<15} {:<16} {:>11} {:>11} {:>11}  where",
            "event", "time (s)", "action", "address", "size", "block", "allocated"
        );
        let blocks = block_sizes(d);
        for (i, e) in events.iter().enumerate() {
            let time = match (first_time, e.has_time()) {
                (Some(t0), true) => format!("{:.6}", (e.time_us - t0) as f64 / 1e6),
                _ => String::new(),
            };
            let (address, detail) = if e.action() == Action::Oom {
                (String::new(), format!("  (device free {})", fmt_bytes(e.device_free())))
            } else {
                (format!("{:#x}", e.addr), String::new())
            };
            let block = if blocks[i] > 0 { fmt_bytes(blocks[i]) } else { String::new() };
            let _ = writeln!(
                out,
                "{i:>9} {time:>11}  {:<15} {address:<16} {:>11} {block:>11} {:>11}  {}{detail}",
                e.action().name(),
                fmt_bytes(e.size),
                fmt_bytes(d.series.allocated(i)),
                sites.get(e.stack)
            );
            if out.len() >= PIECE {
                emit(&out)?;
                out.clear();
            }
        }
    }
    emit(&out)?;
    Ok(Exit::SUCCESS)
}

fn start_note(d: &DeviceReplay) -> String {
    let s = &d.start;
    if d.event_count == 0 {
        return " (no trace was recorded: only the dump-time state is known)".into();
    }
    if s.trace_complete {
        return String::new();
    }
    let mut note = format!(
        " (recording began mid-run: {} and {} existed before the first event",
        memsnap_model::count_of(s.segments as u64, "segment"),
        memsnap_model::count_of(s.blocks as u64, "block")
    );
    if s.uncertain_bytes > 0 {
        let _ = write!(note, "; their sizes are uncertain by up to {}", fmt_bytes(s.uncertain_bytes));
    }
    note.push(')');
    note
}

/// The replayed block size behind each `alloc`/`free_*` event (0 for other events).
fn block_sizes(d: &DeviceReplay) -> Vec<u64> {
    let mut sizes = vec![0u64; d.event_count];
    for b in &d.blocks {
        for e in [b.alloc_event(), b.free_requested_event(), b.free_completed_event()].into_iter().flatten() {
            sizes[e as usize] = b.size;
        }
    }
    sizes
}

/// Stack summaries, computed once per stack: the innermost frame of the user's code, else the
/// innermost library frame (marked), else the innermost frame.
struct Sites<'s> {
    snap: &'s Snapshot,
    cache: Vec<Option<String>>,
}

impl<'s> Sites<'s> {
    fn new(snap: &'s Snapshot) -> Sites<'s> {
        Sites { snap, cache: vec![None; snap.stacks.len()] }
    }

    fn get(&mut self, stack: StackId) -> &str {
        let k = stack.0 as usize;
        if k >= self.cache.len() {
            return "";
        }
        let snap = self.snap;
        self.cache[k].get_or_insert_with(|| summarize(snap, stack))
    }
}

fn summarize(snap: &Snapshot, stack: StackId) -> String {
    let frames: Vec<_> = snap.stack_frames(stack).collect();
    let kind = |f: &&memsnap_model::Frame| classify_filename(snap.str(f.filename));
    let (frame, mark) = match frames.iter().find(|f| kind(f) == FrameKind::User) {
        Some(f) => (f, ""),
        None => match frames.iter().find(|f| kind(f) == FrameKind::Library) {
            Some(f) => (f, " [library]"),
            None => match frames.first() {
                Some(f) => (f, " [native]"),
                None => return String::new(),
            },
        },
    };
    let file = snap.str(frame.filename);
    let short = file.rsplit(['/', '\\']).next().unwrap_or(file);
    format!("{}:{} {}{mark}", shown(short), frame.line, shown(snap.str(frame.name)))
}
