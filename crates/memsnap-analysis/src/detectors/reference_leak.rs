//! `reference_leak`: tensors that no autograd graph holds, kept by a Python reference, step after
//! step.
//!
//! Mechanism. After a backward has consumed a graph, or when a pass ran without grad, nothing of
//! autograd holds its tensors: if they stay allocated, a reference does (a forward hook storing
//! outputs, a metrics dict, a cache, a closure, a global list). What is kept is outputs or
//! intermediates, never saved tensors (those are `retained_graph`'s). Claims, for blocks still
//! allocated at the end of the trace:
//! - blocks of forward passes a backward consumed, or of passes run without grad;
//! - tensors made by the user's code outside any model call (not construction, not optimizer);
//! - tensors made by the autograd engine that are not parameter gradients (a backward hook);
//! - with no stacks at all, growth that cannot be placed;
//!
//! and they must come from `min_leak_occurrences` occurrences or more (a leak repeats).
//! With no trace at all (state-only recordings) it reads the dump: many live blocks from one line.
//! Near misses: the last step's tensors alive at the dump; a bounded cache that evicts.

use std::collections::{BTreeMap, BTreeSet};

use memsnap_model::{FrameId, StackId};

use super::{Context, Detector, Finding};
use crate::attribution::Attr;
use crate::evidence::{Evidence, LeakOrigin, Occurrence, Severity, SuspectKind};
use crate::lifecycle::{BlockFate, UnitFate};

pub struct ReferenceLeak;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Line(Option<FrameId>, Origin),
    Unattributed,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Origin {
    Trained,
    NoGrad,
    User,
    Backward,
}

#[derive(Default)]
struct Group {
    blocks: Vec<usize>,
    kept: BTreeSet<usize>,
    eligible: BTreeSet<usize>,
    largest: (u64, StackId),
    pass_occurrences: bool,
}

impl Detector for ReferenceLeak {
    fn kind(&self) -> SuspectKind {
        SuspectKind::ReferenceLeak
    }

    fn detect(&self, cx: &Context) -> Vec<Finding> {
        // A state-only recording (`enabled="state"`) has no allocation in its trace, at most a
        // marker entry: only the dump can speak.
        if !cx.traced {
            return state_only(cx);
        }
        let lc = cx.lifecycle;
        let mut groups: BTreeMap<Key, Group> = BTreeMap::new();
        let mut add = |key: Key, bi: usize, occ: usize, kept: bool, pass: bool, stack: StackId| {
            let g = groups.entry(key).or_default();
            g.eligible.insert(occ);
            g.pass_occurrences = pass;
            if kept {
                g.kept.insert(occ);
                g.blocks.push(bi);
                let size = cx.replay.blocks[bi].size;
                if size > g.largest.0 {
                    g.largest = (size, stack);
                }
            }
        };
        // Kept outputs of no-grad passes counted per call of the helper that runs the model
        // several times (see `Lifecycle::call_groups`): used when a pass-level count shows no
        // repetition because only one pass per call keeps something (the last decoding step's
        // KV cache, stored per request).
        let calls = lc.call_groups(cx.events, cx.stacks);
        let mut per_call: BTreeMap<Key, Group> = BTreeMap::new();
        // Forward passes whose graphs no longer hold their tensors.
        for (u, unit) in lc.units.iter().enumerate() {
            let origin = match unit.fate {
                UnitFate::Consumed { .. } => Origin::Trained,
                UnitFate::Unconsumed if !unit.grad_on => Origin::NoGrad,
                _ => continue,
            };
            let last_op =
                cx.phases.forwards[unit.pass].last_alloc.map(|la| cx.stacks.get(cx.events[la as usize].stack));
            for ub in &lc.blocks[u] {
                let b = &cx.replay.blocks[ub.block];
                let stack = cx.event_stack(b);
                let info = cx.stacks.get(stack);
                // A kept model output is fixed where the model is called; an intermediate where
                // the model's code made it.
                let output = ub.in_pass
                    && last_op.is_some_and(|l| {
                        l.innermost_python.is_some()
                            && l.innermost_python == info.innermost_python
                            && l.module_call == info.module_call
                    });
                let line = if !ub.in_pass {
                    info.site
                } else if output {
                    unit.call_site.or(info.site)
                } else {
                    info.module_call.or(info.site)
                };
                let (occ, pass) = match origin {
                    Origin::NoGrad => (u, true),
                    _ => match cx.iteration_of(b) {
                        Some(it) => (it, false),
                        None => continue,
                    },
                };
                add(Key::Line(line, origin), ub.block, occ, ub.fate == BlockFate::Kept, pass, stack);
                if origin == Origin::NoGrad {
                    let g = per_call.entry(Key::Line(line, origin)).or_default();
                    g.eligible.insert(calls[u]);
                    if ub.fate == BlockFate::Kept {
                        g.kept.insert(calls[u]);
                        g.blocks.push(ub.block);
                        let size = cx.replay.blocks[ub.block].size;
                        if size > g.largest.0 {
                            g.largest = (size, stack);
                        }
                    }
                }
            }
        }
        // Tensors outside forward passes.
        let gradient_lines: Vec<Option<FrameId>> =
            cx.kept_backward_groups().iter().filter(|g| g.gradient_like).map(|g| g.line).collect();
        for (bi, b) in cx.replay.blocks.iter().enumerate() {
            if lc.unit_of(bi).is_some() {
                continue;
            }
            let Some(it) = cx.iteration_of(b) else { continue };
            let stack = cx.event_stack(b);
            let info = cx.stacks.get(stack);
            let key = match cx.attr(b) {
                Attr::Backward(line) if !gradient_lines.contains(&line) => Key::Line(line, Origin::Backward),
                Attr::Site(s) if !info.optimizer && !info.forward && !info.construction && !info.recompute => {
                    Key::Line(Some(s), Origin::User)
                }
                Attr::NoFrames => Key::Unattributed,
                _ => continue,
            };
            let kept = b.freed_at().is_none();
            add(key, bi, it, kept, false, stack);
        }

        // Per-call counts replace per-pass counts where only they show repetition.
        let mut call_keys: BTreeSet<Key> = BTreeSet::new();
        for (key, pc) in per_call {
            let passes = groups.get(&key);
            let pass_growth = passes.is_some_and(|g| cx.is_growth(g.kept.len(), g.eligible.len()));
            if !pass_growth && pc.eligible.len() < lc.units.len() && cx.is_growth(pc.kept.len(), pc.eligible.len()) {
                groups.insert(key, pc);
                call_keys.insert(key);
            }
        }
        let mut out = Vec::new();
        for (key, g) in groups {
            if !cx.is_growth(g.kept.len(), g.eligible.len()) {
                continue;
            }
            let (line, origin) = match key {
                Key::Line(l, o) => (
                    l,
                    match o {
                        Origin::Trained => LeakOrigin::TrainedForward,
                        Origin::NoGrad => LeakOrigin::NoGradForward,
                        Origin::User => LeakOrigin::UserCode,
                        Origin::Backward => LeakOrigin::Backward,
                    },
                ),
                Key::Unattributed => (None, LeakOrigin::Unattributed),
            };
            let occurrence = if call_keys.contains(&key) {
                Occurrence::Call
            } else if g.pass_occurrences {
                Occurrence::Pass
            } else {
                Occurrence::Iteration
            };
            let boundaries = if call_keys.contains(&key) {
                // One boundary per call: the start of its first unit.
                let mut seen = BTreeSet::new();
                lc.units
                    .iter()
                    .enumerate()
                    .filter(|(u, _)| g.eligible.contains(&calls[*u]) && seen.insert(calls[*u]))
                    .map(|(_, unit)| unit.span.start)
                    .collect()
            } else if g.pass_occurrences || cx.phases.boundaries.len() < 2 {
                lc.units.iter().filter(|u| g.eligible.contains(&u.pass)).map(|u| u.span.start).collect()
            } else {
                cx.iteration_boundaries()
            };
            let mut confidence = cx.growth_confidence(g.kept.len(), g.eligible.len());
            if origin == LeakOrigin::Unattributed {
                confidence = confidence.min(cx.thresholds.state_only_confidence);
            }
            out.push(Finding {
                occurrences: g.kept.len(),
                kind: SuspectKind::ReferenceLeak,
                severity: Severity::Leak,
                confidence,
                occurrence,
                boundaries,
                bytes: None,
                site: line.map(|f| cx.site(f)),
                stack: match origin {
                    LeakOrigin::Backward => cx.backward_stack(line),
                    _ => g.largest.1,
                },
                facts: Evidence::ReferenceLeak {
                    origin,
                    blocks: g.blocks.len() as u64,
                    occurrences: g.kept.len(),
                    eligible: g.eligible.len(),
                    occurrence,
                },
                blocks: g.blocks,
            });
        }
        out
    }
}

/// No trace: live blocks at the dump grouped by the line that allocated them (the line that ran
/// the model for model outputs), leaving out parameters, optimizer state and frameless blocks.
fn state_only(cx: &Context) -> Vec<Finding> {
    let mut by: BTreeMap<FrameId, (Vec<usize>, StackId, u64)> = BTreeMap::new();
    for (bi, b) in cx.replay.blocks.iter().enumerate() {
        if b.freed_at().is_some() {
            continue;
        }
        let info = cx.stacks.get(b.stack);
        if info.construction || info.optimizer || info.backward_launch || info.recompute {
            continue;
        }
        let Some(line) = info.forward_call.or(info.site) else { continue };
        let e = by.entry(line).or_insert((Vec::new(), b.stack, 0));
        e.0.push(bi);
        if b.size > e.2 {
            e.1 = b.stack;
            e.2 = b.size;
        }
    }
    by.into_iter()
        .filter(|(_, (blocks, _, _))| blocks.len() as u64 >= cx.thresholds.state_min_same_site_blocks)
        .map(|(line, (blocks, stack, _))| Finding {
            occurrences: 0,
            kind: SuspectKind::ReferenceLeak,
            severity: Severity::Leak,
            confidence: cx.thresholds.state_only_confidence,
            occurrence: Occurrence::Iteration,
            boundaries: Vec::new(),
            bytes: None,
            site: Some(cx.site(line)),
            stack,
            facts: Evidence::ReferenceLeak {
                origin: LeakOrigin::StateOnly,
                blocks: blocks.len() as u64,
                occurrences: blocks.len(),
                eligible: blocks.len(),
                occurrence: Occurrence::Iteration,
            },
            blocks,
        })
        .collect()
}
