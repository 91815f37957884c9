//! `oom`: an allocation failed.
//!
//! Mechanism. The allocator records an `oom` trace entry when a request cannot be served even
//! after freeing its cache (`device_free`: what the driver said was free). The dump of an
//! out-of-memory observer ends right there. Reported: the last OOM raised under the user's code
//! (frameless ones are usually library requests that PyTorch retries with a leaner algorithm,
//! e.g. cuDNN workspaces), requested vs free, the largest free block (fragmentation or not), and
//! the top holders at that moment. What filled memory is its own suspect (e.g. `retained_graph`
//! for graphs kept for a deferred backward).

use std::collections::BTreeMap;

use memsnap_model::{Action, BlockState, StackId};

use super::{Context, Detector, Finding};
use crate::attribution::{attr_label, Attr};
use crate::evidence::{Evidence, Holder, Occurrence, OomCause, Severity, SuspectKind};
use crate::site::Site;

pub struct Oom;

/// Holders listed in the evidence.
const HOLDERS: usize = 3;
/// How far back to look for the line that asked, when the OOM event itself has no frames.
const ASKING_LINE_LOOKBACK: usize = 10_000;

impl Detector for Oom {
    fn kind(&self) -> SuspectKind {
        SuspectKind::Oom
    }

    fn detect(&self, cx: &Context) -> Vec<Finding> {
        let events = cx.events;
        let ooms: Vec<usize> =
            events.iter().enumerate().filter(|(_, e)| e.action() == Action::Oom).map(|(i, _)| i).collect();
        let Some(&last) = ooms.last() else { return Vec::new() };
        let i = ooms.iter().rev().copied().find(|&k| cx.stacks.get(events[k].stack).site.is_some()).unwrap_or(last);
        let e = &events[i];
        let before = i.checked_sub(1);
        let d = cx.replay;
        let totals = d.series.after(before);
        let cached_free = totals.reserved.saturating_sub(totals.allocated);
        let largest_free = d
            .state_after(before)
            .segments
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state == BlockState::Inactive)
            .map(|b| b.size)
            .max()
            .unwrap_or(0);
        let t = before.map(|x| x as u32);
        let mut by: BTreeMap<Attr, u64> = BTreeMap::new();
        // A block still allocated at the dump is the dump's block at its address, whose stack
        // the allocator kept: the holders are named under `context="state"` too (s81).
        for b in d.blocks.iter().filter(|b| b.state_after(t) == Some(BlockState::Allocated)) {
            let b = crate::with_dump_stack(b, d.device, cx.dump_stacks);
            *by.entry(cx.attr(&b)).or_default() += b.size;
        }
        let mut top: Vec<(Attr, u64)> = by.into_iter().collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let holders =
            top.iter().take(HOLDERS).map(|(a, b)| Holder { label: attr_label(cx.snap, *a), bytes: *b }).collect();
        let stack = if e.stack != StackId::EMPTY {
            e.stack
        } else {
            events[..i]
                .iter()
                .rev()
                .take(ASKING_LINE_LOOKBACK)
                .find(|x| cx.stacks.get(x.stack).site.is_some())
                .map_or(StackId::EMPTY, |x| x.stack)
        };
        // Inside a model, the line that ran the model is the actionable one.
        let info = cx.stacks.get(stack);
        let site = info.forward_call.or(info.site).map(|f| cx.site(f));
        let user_chain: Vec<Site> =
            cx.snap.stack(stack).frames.iter().filter(|f| cx.stacks.is_user(**f)).map(|&f| cx.site(f)).collect();
        let requested = e.size;
        let device_free = e.device_free();
        let cause = if largest_free >= requested {
            OomCause::FreeBlockLargeEnough
        } else if cached_free >= requested {
            OomCause::Fragmented
        } else if device_free >= requested {
            OomCause::ProcessLimit
        } else {
            OomCause::DeviceFull
        };
        vec![Finding {
            occurrences: 0,
            kind: SuspectKind::Oom,
            severity: Severity::Peak,
            confidence: 1.0,
            blocks: Vec::new(),
            occurrence: Occurrence::Iteration,
            boundaries: Vec::new(),
            bytes: Some(requested),
            site,
            stack,
            facts: Evidence::Oom {
                count: ooms.len(),
                event: i as u32,
                requested,
                allocated: totals.allocated,
                reserved: totals.reserved,
                cached_free,
                largest_free_block: largest_free,
                device_free,
                cause,
                holders,
                user_chain,
            },
        }]
    }
}
