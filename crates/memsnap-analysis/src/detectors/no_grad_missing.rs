//! `no_grad_missing`: forward passes that no backward consumes, run with grad enabled.
//!
//! Mechanism. With grad on, every operation saves tensors for a backward; a pass that is never
//! backpropagated (evaluation, inference, a logging pass) keeps them until its output dies, and
//! for good if its output or loss is stored. Under `no_grad` / `inference_mode` only the outputs
//! outlive the pass. The lifecycle tells both facts per pass: no backward freed any of its
//! blocks, and many of its blocks outlived it (`grad_on`). Passes whose call site trains and
//! whose backward had not come yet when the trace ended (deferred backward, an OOM first) are not
//! evaluation (`AwaitingBackward`) and are left to `retained_graph`.
//!
//! Claims: the blocks of those passes alive after each pass's unit ended. Severity `leak` when
//! they are kept to the end from pass after pass, else `peak`; `waste` when they do not set the
//! peak but held at least `min_peak_share` of it, and the passes kept about as many blocks as
//! the model's training passes save (`Thresholds::training_saved_share`): graphs held for
//! nothing, which a larger batch there would make the peak. Blocks kept to the end of a pass
//! whose graph was let go (`Lifecycle::graph_held`: only a detached output or the inputs stay)
//! are `reference_leak`'s: `no_grad` would not have freed them. Near miss: the same loop under
//! `no_grad` (only outputs survive); a pass consumed by a later backward.

use std::collections::{BTreeMap, BTreeSet};

use memsnap_model::{FrameId, StackId};

use super::{median, Context, Detector, Finding};
use crate::evidence::{Evidence, Occurrence, Severity, SuspectKind};
use crate::lifecycle::{BlockFate, UnitFate};

pub struct NoGradMissing;

#[derive(Default)]
struct Group {
    units: Vec<usize>,
    blocks: Vec<usize>,
    kept_units: BTreeSet<usize>,
    held: bool,
    windows: BTreeSet<usize>,
    saved: Vec<u64>,
    survived: Vec<u32>,
    pass_blocks: Vec<u32>,
    largest: (u64, StackId),
}

/// Where the evaluation's own code calls into code it shares with training: the innermost user
/// frame, outward of the model call `call`, of the first of `units`' passes that none of
/// `trained` (the stacks the training passes from that call site, consumed by a backward,
/// started with) runs through. `None` without such training passes (the call site is then the
/// evaluation's own line).
fn evaluation_line(
    cx: &Context,
    units: &[usize],
    call: Option<FrameId>,
    trained: &BTreeSet<StackId>,
) -> Option<FrameId> {
    let (call, &first) = (call?, units.first()?);
    if trained.is_empty() {
        return None;
    }
    let unit = &cx.lifecycle.units[first];
    let frames = &cx.snap.stack(cx.events[unit.pass_span.start as usize].stack).frames;
    let from = frames.iter().position(|&f| f == call)?;
    frames[from + 1..]
        .iter()
        .copied()
        .filter(|&f| cx.stacks.is_user(f))
        .find(|&f| !trained.iter().any(|&s| cx.stacks.contains(s, f)))
}

impl Detector for NoGradMissing {
    fn kind(&self) -> SuspectKind {
        SuspectKind::NoGradMissing
    }

    fn detect(&self, cx: &Context) -> Vec<Finding> {
        let lc = cx.lifecycle;
        let mut groups: BTreeMap<Option<FrameId>, Group> = BTreeMap::new();
        for (u, unit) in lc.units.iter().enumerate() {
            if unit.fate != UnitFate::Unconsumed || !unit.grad_on {
                continue;
            }
            let g = groups.entry(unit.call_site).or_default();
            g.units.push(u);
            g.saved.push(unit.saved_bytes);
            g.survived.push(unit.survived_pass);
            g.pass_blocks.push(unit.pass_blocks);
            if let Some(w) = cx.phases.eval_windows.iter().position(|w| w.contains(unit.pass_span.start)) {
                g.windows.insert(w);
            }
            // With the graph let go, what stays to the end (a detached output, the inputs) is
            // held by a reference, not by this pass's missing `no_grad`: `reference_leak`'s.
            let graph_held = lc.graph_held(u);
            for ub in &lc.blocks[u] {
                if matches!(ub.fate, BlockFate::Temporary) || !graph_held && ub.fate == BlockFate::Kept {
                    continue;
                }
                let b = &cx.replay.blocks[ub.block];
                g.blocks.push(ub.block);
                match ub.fate {
                    BlockFate::Kept => {
                        g.kept_units.insert(u);
                        g.held = true;
                    }
                    BlockFate::ReleasedLater(_) => g.held = true,
                    _ => {}
                }
                if b.size > g.largest.0 {
                    g.largest = (b.size, cx.event_stack(b));
                }
            }
        }
        // The model's training passes (consumed by a backward), per call site: the blocks that
        // survive them (what autograd saves for it; also over all) and the stacks they start
        // with (the code path training runs the call through).
        let mut by_site: BTreeMap<Option<FrameId>, (Vec<u32>, BTreeSet<StackId>)> = BTreeMap::new();
        let mut all = Vec::new();
        for unit in &lc.units {
            if matches!(unit.fate, UnitFate::Consumed { .. }) {
                let site = by_site.entry(unit.call_site).or_default();
                site.0.push(unit.survived_pass);
                site.1.insert(cx.events[unit.pass_span.start as usize].stack);
                all.push(unit.survived_pass);
            }
        }
        let no_stacks = BTreeSet::new();
        let trained: BTreeMap<Option<FrameId>, (u32, BTreeSet<StackId>)> =
            by_site.into_iter().map(|(c, (mut v, stacks))| (c, (median(&mut v), stacks))).collect();
        let trained_all = (!all.is_empty()).then(|| median(&mut all));
        let th = cx.thresholds;
        let peak = cx.replay.peaks.allocated.value;
        let mut out = Vec::new();
        for (call, mut g) in groups {
            let kept_units = g.kept_units.len();
            let growing = cx.is_growth(kept_units, g.units.len());
            let survived_blocks = median(&mut g.survived);
            let boundaries: Vec<u32> = g.units.iter().map(|&u| lc.units[u].span.start).collect();
            let mut severity = if growing { Severity::Leak } else { Severity::Peak };
            let reference = trained.get(&call).map(|t| t.0).or(trained_all);
            let saves_like_training =
                reference.is_none_or(|r| f64::from(survived_blocks) >= th.training_saved_share * f64::from(r));
            if severity == Severity::Peak && saves_like_training {
                // Measured here only for these groups: a walk over the device's series.
                let m = super::measure(cx, &g.blocks, &boundaries);
                if !super::raises_peak(cx, &m, m.max_live) && m.max_live as f64 >= th.min_peak_share * peak as f64 {
                    severity = Severity::Waste;
                }
            }
            let facts = Evidence::NoGradMissing {
                passes: g.units.len(),
                windows: g.windows.len().max(1),
                survived_blocks,
                pass_blocks: median(&mut g.pass_blocks),
                saved_bytes_per_pass: median(&mut g.saved),
                call_site: call.map(|f| cx.site(f)),
                reached_from: evaluation_line(cx, &g.units, call, trained.get(&call).map_or(&no_stacks, |t| &t.1))
                    .map(|f| cx.site(f)),
                graphs_held: g.held,
            };
            out.push(Finding {
                kind: SuspectKind::NoGradMissing,
                severity,
                confidence: cx.growth_confidence(g.units.len(), g.units.len()).min(0.95),
                blocks: g.blocks,
                occurrence: Occurrence::Pass,
                boundaries,
                bytes: None,
                site: call.map(|f| cx.site(f)),
                stack: g.largest.1,
                facts,
                occurrences: kept_units,
            });
        }
        out
    }
}
