//! The segment map at one moment: each segment a bar, its blocks coloured by state, so memory
//! that is reserved but split into unusable holes (fragmentation) is visible.
//!
//! Segments are listed largest first (then most free first) and capped (`max_segments`); bar
//! length is proportional to segment size, with a floor so that small segments stay legible.
//! Segments with exactly the same layout (size and blocks) share one row marked `×N`, so a
//! hundred identical 2 MiB segments do not push everything else off the page. Inside a bar each
//! block is drawn with its own hover text; when a segment has more blocks than the bar has room
//! for, they are merged into fixed-width cells coloured by the state that holds most bytes in
//! each, which bounds the output on huge dumps.

use std::fmt::Write as _;

use memsnap_analysis::{attr_label, attribute, Phases, StackTable};
use memsnap_model::{BlockState, SegmentType, Snapshot};
use memsnap_replay::{DeviceReplay, MemoryMap, SegmentView};

use crate::text::{escape, fmt_bytes, fmt_count, num, open_figure, pct};

pub const ALLOCATED_COLOR: &str = "#3b6fb6";
pub const PENDING_COLOR: &str = "#f4a259";
pub const FREE_COLOR: &str = "#f2f2f2";

/// Smallest cell when runs are merged, in pixels.
const CELL: f64 = 3.0;

/// One drawn piece of a segment.
#[derive(Clone, Debug)]
pub struct Run {
    pub state: BlockState,
    /// Offset and length in bytes from the segment's start.
    pub offset: u64,
    pub bytes: u64,
    pub title: String,
}

#[derive(Clone, Debug)]
pub struct SegmentRow {
    pub label: String,
    pub title: String,
    pub size: u64,
    pub runs: Vec<Run>,
    /// Segments drawn by this row (identical layouts share a row).
    pub count: usize,
}

#[derive(Clone, Debug)]
pub struct SegmentMap {
    pub device: u32,
    pub when: String,
    pub rows: Vec<SegmentRow>,
    pub hidden: usize,
    pub hidden_bytes: u64,
    pub total_segments: usize,
    pub reserved: u64,
    pub allocated: u64,
    pub pending: u64,
    pub free: u64,
    pub free_blocks: usize,
}

fn pool(s: &SegmentView) -> String {
    pool_name(s.segment_type, s.pool_id, s.is_expandable)
}

/// A segment's pool as the segment maps (static and interactive) name it.
pub(crate) fn pool_name(segment_type: SegmentType, pool_id: (u64, u64), is_expandable: bool) -> String {
    let mut p = match segment_type {
        SegmentType::Small => "small pool",
        SegmentType::Large => "large pool",
        SegmentType::Unknown => "pool unknown",
    }
    .to_string();
    if let Some(kind) = memsnap_model::PoolKind::of(pool_id).title() {
        let _ = write!(p, ", {kind} ({}, {})", pool_id.0, pool_id.1);
    }
    if is_expandable {
        p.push_str(", expandable");
    }
    p
}

/// Build the map of `map` (the layout at `when`). `bar_px` is the longest bar's width.
#[allow(clippy::too_many_arguments)]
pub fn build(
    snap: &Snapshot,
    stacks: &StackTable,
    phases: &Phases,
    d: &DeviceReplay,
    map: &MemoryMap,
    when: &str,
    max_segments: usize,
    bar_px: f64,
) -> SegmentMap {
    let events = snap.trace(d.device).map_or(&[][..], |t| &t.events[..]);
    let mut order: Vec<&SegmentView> = map.segments.iter().collect();
    order.sort_by(|a, b| b.total_size.cmp(&a.total_size).then(a.address.cmp(&b.address)));
    let mut out = SegmentMap {
        device: d.device,
        when: when.to_string(),
        rows: Vec::new(),
        hidden: order.len().saturating_sub(max_segments),
        hidden_bytes: order.iter().skip(max_segments).map(|s| s.total_size).sum(),
        total_segments: order.len(),
        reserved: 0,
        allocated: 0,
        pending: 0,
        free: 0,
        free_blocks: 0,
    };
    for s in &order {
        let st = s.stats();
        out.reserved += s.total_size;
        out.allocated += st.allocated_bytes;
        out.pending += st.pending_free_bytes;
        out.free += st.free_bytes;
        out.free_blocks += st.free_blocks;
    }
    let largest = order.first().map_or(1, |s| s.total_size.max(1));
    let mut built: Vec<(SegmentRow, u64, u64)> = Vec::new();
    for s in order.iter().take(max_segments) {
        let st = s.stats();
        let px = bar_len(s.total_size, largest, bar_px);
        let title = format!(
            "segment {:#x}: {} ({}, stream {:#x})\nallocated {} ({}%), pending free {}, free {} in {} (largest {})\nfragmentation {:.2} (1 − largest free / free)",
            s.address,
            fmt_bytes(s.total_size),
            pool(s),
            s.stream,
            fmt_bytes(st.allocated_bytes),
            pct(st.allocated_bytes, s.total_size),
            fmt_bytes(st.pending_free_bytes),
            fmt_bytes(st.free_bytes),
            memsnap_model::count_of(st.free_blocks as u64, "block"),
            fmt_bytes(st.largest_free_bytes),
            st.fragmentation
        );
        let label = format!("{} · {}% free", fmt_bytes(s.total_size), pct(st.free_bytes, s.total_size));
        let mut runs: Vec<Run> = s
            .blocks
            .iter()
            .map(|b| Run {
                state: b.state,
                offset: b.address.saturating_sub(s.address),
                bytes: b.size,
                title: String::new(),
            })
            .collect();
        let cells = (px / CELL).floor().max(1.0) as usize;
        if runs.len() > cells {
            runs = merge_into_cells(&runs, s.total_size, cells);
        } else {
            for (r, b) in runs.iter_mut().zip(&s.blocks) {
                r.title = match b.state {
                    BlockState::Inactive => format!("free (cached): {}", fmt_bytes(b.size)),
                    state => {
                        let who = b
                            .lifetime
                            .and_then(|i| d.blocks.get(i))
                            .map(|bl| attr_label(snap, attribute(events, phases, stacks, bl).0))
                            .unwrap_or_default();
                        format!(
                            "{}: {} (requested {})\n{who}",
                            if state == BlockState::Allocated {
                                "allocated"
                            } else {
                                "pending free (freed, still used by another stream)"
                            },
                            fmt_bytes(b.size),
                            fmt_bytes(b.requested_size)
                        )
                    }
                };
            }
        }
        built.push((SegmentRow { label, title, size: s.total_size, runs, count: 1 }, st.free_bytes, s.address));
    }
    // Largest first, then most free, then by layout so identical segments are neighbours.
    built.sort_by(|a, b| {
        b.0.size
            .cmp(&a.0.size)
            .then(b.1.cmp(&a.1))
            .then_with(|| layout_key(&a.0).cmp(&layout_key(&b.0)))
            .then(a.2.cmp(&b.2))
    });
    for (row, _, address) in built {
        match out.rows.last_mut() {
            Some(last) if last.size == row.size && layout_key(last) == layout_key(&row) => {
                last.count += 1;
                if last.count <= 8 {
                    let _ = write!(last.title, "\nsame layout: segment {address:#x}");
                } else if last.count == 9 {
                    last.title.push_str("\n…");
                }
            }
            _ => out.rows.push(row),
        }
    }
    for row in &mut out.rows {
        if row.count > 1 {
            let _ = write!(row.label, " ×{}", row.count);
            row.title = format!("{} segments with the same layout; the first:\n{}", row.count, row.title);
        }
    }
    out
}

fn layout_key(r: &SegmentRow) -> Vec<(usize, u64, u64)> {
    r.runs.iter().map(|x| (state_index(x.state), x.offset, x.bytes)).collect()
}

/// Bar length: proportional to size, but never under 12% of the longest (or 36 px).
fn bar_len(size: u64, largest: u64, bar_px: f64) -> f64 {
    (bar_px * size as f64 / largest as f64).max((bar_px * 0.12).min(bar_px)).max(36.0_f64.min(bar_px))
}

/// Merge runs into `cells` equal cells, each coloured by the state holding most of its bytes.
fn merge_into_cells(runs: &[Run], total: u64, cells: usize) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    let mut r = 0;
    for c in 0..cells {
        let lo = (total as u128 * c as u128 / cells as u128) as u64;
        let hi = (total as u128 * (c + 1) as u128 / cells as u128) as u64;
        let mut by = [0u64; 3];
        while r < runs.len() && runs[r].offset + runs[r].bytes <= lo {
            r += 1;
        }
        let mut j = r;
        while j < runs.len() && runs[j].offset < hi {
            let a = runs[j].offset.max(lo);
            let b = (runs[j].offset + runs[j].bytes).min(hi);
            by[state_index(runs[j].state)] += b.saturating_sub(a);
            j += 1;
        }
        let best = (0..3).max_by(|&a, &b| by[a].cmp(&by[b]).then(b.cmp(&a))).unwrap_or(2);
        let state = [BlockState::Allocated, BlockState::PendingFree, BlockState::Inactive][best];
        match out.last_mut() {
            Some(last) if last.state == state => last.bytes += hi - lo,
            _ => out.push(Run { state, offset: lo, bytes: hi - lo, title: String::new() }),
        }
    }
    for run in &mut out {
        run.title = format!(
            "mostly {} ({} of this segment shown as one cell; too many blocks to draw one by one)",
            match run.state {
                BlockState::Allocated => "allocated",
                BlockState::PendingFree => "pending free",
                BlockState::Inactive => "free",
            },
            fmt_bytes(run.bytes)
        );
    }
    out
}

fn state_index(s: BlockState) -> usize {
    match s {
        BlockState::Allocated => 0,
        BlockState::PendingFree => 1,
        BlockState::Inactive => 2,
    }
}

pub fn color(s: BlockState) -> &'static str {
    match s {
        BlockState::Allocated => ALLOCATED_COLOR,
        BlockState::PendingFree => PENDING_COLOR,
        BlockState::Inactive => FREE_COLOR,
    }
}

const LABEL_W: f64 = 178.0;

/// Width of the longest bar in a map `width` pixels wide.
pub fn bar_width(width: f64) -> f64 {
    width - LABEL_W - 20.0
}

/// Draw the map as a complete `<svg>` of the given width.
pub fn render(m: &SegmentMap, width: f64) -> String {
    let label_w = LABEL_W;
    let bar_px = bar_width(width);
    let row_h = 13.0;
    let head = 64.0;
    let foot = if m.hidden > 0 { 22.0 } else { 6.0 };
    let h = head + row_h * m.rows.len() as f64 + foot;
    let largest = m.rows.first().map_or(1, |r| r.size.max(1));
    let mut s = String::new();
    open_figure(&mut s, width, h, "segmap");
    let _ = writeln!(
        s,
        r##"<text x="10" y="18" font-size="15" font-weight="600" fill="#1a1a1a">Segments at the {}, device {}</text>"##,
        escape(&m.when),
        m.device
    );
    let summary = format!(
        "{}, {} reserved: {} allocated, {} pending free, {} free in {} {}. Largest first; bar length ∝ size; ×N: N segments with the same layout.",
        memsnap_model::count_of(m.total_segments as u64, "segment"),
        fmt_bytes(m.reserved),
        fmt_bytes(m.allocated),
        fmt_bytes(m.pending),
        fmt_bytes(m.free),
        fmt_count(m.free_blocks as u64),
        memsnap_model::agree(m.free_blocks as u64, "block", "blocks")
    );
    let _ = writeln!(s, r##"<text x="10" y="35" font-size="12" fill="#555555">{}</text>"##, escape(&summary));
    let mut x = 10.0;
    for (c, label) in [
        (ALLOCATED_COLOR, "allocated"),
        (PENDING_COLOR, "pending free (another stream)"),
        (FREE_COLOR, "free (cached, reserved)"),
    ] {
        let _ = writeln!(
            s,
            r##"<rect x="{}" y="44" width="14" height="11" fill="{c}" stroke="#999999" stroke-width="0.5"/><text x="{}" y="54" font-size="12" fill="#222222">{label}</text>"##,
            num(x),
            num(x + 19.0)
        );
        x += 19.0 + crate::text::text_width(label, 12.0) + 20.0;
    }
    for (j, r) in m.rows.iter().enumerate() {
        let y = head + j as f64 * row_h;
        let px = bar_len(r.size, largest, bar_px);
        let _ = write!(
            s,
            r##"<g><title>{}</title><text x="{}" y="{}" font-size="10.5" fill="#333333" text-anchor="end">{}</text><rect x="{}" y="{}" width="{}" height="{}" fill="{FREE_COLOR}" stroke="#9a9a9a" stroke-width="0.6"/></g>"##,
            escape(&r.title),
            num(label_w),
            num(y + 9.5),
            escape(&r.label),
            num(label_w + 8.0),
            num(y),
            num(px),
            num(row_h - 3.0)
        );
        for run in r.runs.iter().filter(|run| run.state != BlockState::Inactive) {
            let rx = label_w + 8.0 + px * run.offset as f64 / r.size.max(1) as f64;
            let rw = (px * run.bytes as f64 / r.size.max(1) as f64).max(0.6);
            // A thin white edge shows where one block ends and the next begins.
            let edge = if rw >= 4.0 { r##" stroke="#ffffff" stroke-width="0.7""## } else { "" };
            let _ = write!(
                s,
                r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{}"{edge}><title>{}</title></rect>"#,
                num(rx),
                num(y + 0.5),
                num(rw),
                num(row_h - 4.0),
                color(run.state),
                escape(&run.title)
            );
        }
        for run in r.runs.iter().filter(|run| run.state == BlockState::Inactive) {
            let rx = label_w + 8.0 + px * run.offset as f64 / r.size.max(1) as f64;
            let rw = px * run.bytes as f64 / r.size.max(1) as f64;
            if rw >= 1.0 {
                let _ = write!(
                    s,
                    r##"<rect x="{}" y="{}" width="{}" height="{}" fill="#000000" fill-opacity="0"><title>{}</title></rect>"##,
                    num(rx),
                    num(y + 0.5),
                    num(rw),
                    num(row_h - 4.0),
                    escape(&run.title)
                );
            }
        }
        s.push('\n');
    }
    if m.hidden > 0 {
        let _ = writeln!(
            s,
            r##"<text x="10" y="{}" font-size="12" fill="#555555">{} smaller segments ({}) not shown.</text>"##,
            num(h - 8.0),
            fmt_count(m.hidden as u64),
            fmt_bytes(m.hidden_bytes)
        );
    }
    s.push_str("</svg>\n");
    s
}
