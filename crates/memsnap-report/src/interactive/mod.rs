//! The interactive report: today's HTML page (verdict, key numbers, tables, static figures) plus
//! an embedded data blob and an inline script that turn the figures into a timeline that zooms
//! from the whole run down to single events, a segment map and a flamegraph at any moment,
//! stacks under the pointer, sortable tables and a device picker. One file, nothing fetched: it
//! works from `file://` and as an e-mail attachment, and without scripts it is the static page.
//!
//! The page stays small on huge dumps because the blob holds what a browser can draw, not the
//! trace: per device a min/max pyramid of the counters over the event index (`pyramid.rs`), the
//! events one by one only for some windows (`detail.rs`), and the blocks up to a budget
//! (`blocks.rs`), each cut named by a constant below with its reason and stated in the page.
//!
//! Everything from the snapshot is untrusted. The blob is JSON inside
//! `<script type="application/json">` with `<`, `>`, `&`, the line separators and every control
//! or bidi character `\u`-escaped (`blob.rs`), so no string can close the element or reach a
//! reader as a control; the script only ever puts text into the page through `textContent` and
//! canvas text, never as markup. A Content-Security-Policy forbids every fetch.
//!
//! Files: `data.rs` (the blob's model and how it is built), `pyramid.rs`, `detail.rs`,
//! `blocks.rs` (what is embedded), `blob.rs` (JSON safe in a script element), `page.rs` (the page
//! around it), `app.js` and `app.css` (the script and its styles, included as they are).
//!
//! The output is deterministic: the same input gives the same bytes on every machine and thread
//! count (sorted tables, integers only, no time or path of the machine that made it).

mod blob;
mod blocks;
mod data;
mod detail;
mod page;
mod pyramid;
#[cfg(test)]
mod tests;

pub use data::{Detail, PageData};
pub use page::{build_page, page, page_with};

/// Buckets of the coarsest pyramid level at most: about two per pixel of a wide screen, so the
/// whole run is drawn from one level without losing a peak between pixels.
pub const TOP_BUCKETS: usize = 2048;

/// Buckets of all pyramid levels together, per page (shared by the devices with a trace). At
/// about 30 bytes a bucket this keeps the pyramid near 3 MB; on the 12.3 M-event bench file it
/// reaches 256 events a bucket, a tenth of one iteration.
pub const PYRAMID_BUCKETS: usize = 100_000;

/// Events embedded one by one, per page (shared by the devices with a trace): about 30 bytes an
/// event, so at most about 4 MB. Traces up to this size are embedded whole; longer ones get the
/// windows of the peak, the out-of-memory errors, the first and last iteration and then the
/// busiest windows (`detail.rs`).
pub const RAW_EVENTS: usize = 131_072;

/// Events in one window of the event-by-event detail (the unit that is embedded or not).
pub const WINDOW_EVENTS: usize = 4096;

/// Blocks embedded, per page (shared by the devices with a trace): about 35 bytes a block, so at
/// most about 3.5 MB. Beyond it the suspects' blocks, the blocks live at the peak and at the
/// end, and those that the detailed windows allocate or free are kept first, then the largest;
/// the page says how many were left out and how many bytes they held.
pub const MAX_BLOCKS: usize = 100_000;

/// Distinct stacks embedded, per page. Stacks of blocks and events beyond it are shown as "not
/// embedded"; real files stay far below (the bench files have a few thousand).
pub const MAX_STACKS: usize = 30_000;

/// Frames kept of one stack (innermost first; the rest counted): a recursion thousands of
/// frames deep would otherwise weigh megabytes.
pub const MAX_STACK_FRAMES: usize = 200;

/// Segments (or expandable mapped ranges) embedded per device, the largest first: the segment
/// map draws a few hundred rows at most, and a hostile file may list millions.
pub const MAX_SEGMENTS: usize = 20_000;

/// Labelled phases and external annotations embedded per device (the first in trace order):
/// more are per-item tags, not phases to see on a chart.
pub const MAX_PHASE_LABELS: usize = 2000;

/// Spans of each phase list (iterations, backward and forward passes, optimizer steps,
/// evaluation windows) embedded per device, the first ones: real runs have thousands; a hostile
/// trace could make every event one.
pub const MAX_SPANS: usize = 50_000;

/// Out-of-memory events embedded per device (the first ones).
pub const MAX_OOMS: usize = 1000;

/// A device's share of a per-page budget: in proportion to its `amount` (events, blocks) of
/// the file's `total`, at least one.
fn share(budget: usize, amount: usize, total: usize) -> usize {
    if total == 0 {
        return budget;
    }
    ((budget as u128 * amount as u128 / total as u128) as usize).max(1)
}
