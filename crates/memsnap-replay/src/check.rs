//! The self-check: the replayed layout after the last event must be the snapshot's own segment
//! table, segment by segment and block by block (address, size, state).

use memsnap_model::{BlockState, Segment};

use crate::output::{Mismatch, SelfCheck};
use crate::unit::EndSegment;

/// Mismatches listed per device (all are counted).
const MAX_MISMATCHES: usize = 20;

/// Compare the replayed segments (sorted by address) with the snapshot's segments of the device.
pub(crate) fn self_check(replayed: &[&EndSegment], finals: &[&Segment]) -> SelfCheck {
    let mut owned: Vec<EndSegment> = finals
        .iter()
        .map(|s| {
            let mut blocks: Vec<_> = s.blocks.iter().map(|b| (b.address, b.size, b.state)).collect();
            blocks.sort_unstable();
            EndSegment { address: s.address, size: s.total_size, blocks }
        })
        .collect();
    owned.sort_by_key(|s| s.address);
    let expected: Vec<&EndSegment> = owned.iter().collect();

    let mut found = Vec::new();
    for (snap, replay) in pair_by_address(&expected, replayed, |s| s.address) {
        match (snap, replay) {
            (Some(a), Some(b)) => {
                if a.size != b.size {
                    found.push(Mismatch::Segment {
                        address: a.address,
                        snapshot_size: Some(a.size),
                        replayed_size: Some(b.size),
                    });
                }
                for (x, y) in pair_by_address(&a.blocks, &b.blocks, |b| b.0) {
                    let side = |b: Option<&(u64, u64, BlockState)>| b.map(|b| (b.1, b.2));
                    if side(x) != side(y) {
                        let address = x.or(y).map_or(0, |b| b.0);
                        found.push(Mismatch::Block { address, snapshot: side(x), replayed: side(y) });
                    }
                }
            }
            (a, b) => found.push(Mismatch::Segment {
                address: a.or(b).map_or(0, |s| s.address),
                snapshot_size: a.map(|s| s.size),
                replayed_size: b.map(|s| s.size),
            }),
        }
    }
    let mismatch_count = found.len();
    found.truncate(MAX_MISMATCHES);
    SelfCheck { matches_snapshot: mismatch_count == 0, mismatch_count, mismatches: found }
}

/// Walk two lists sorted by address together, pairing items with equal addresses.
fn pair_by_address<'a, T>(
    left: &'a [T],
    right: &'a [T],
    address: impl Fn(&T) -> u64,
) -> Vec<(Option<&'a T>, Option<&'a T>)> {
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < left.len() || j < right.len() {
        let l = left.get(i).map(&address);
        let r = right.get(j).map(&address);
        match (l, r) {
            (Some(a), Some(b)) if a == b => {
                out.push((Some(&left[i]), Some(&right[j])));
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a < b => {
                out.push((Some(&left[i]), None));
                i += 1;
            }
            (Some(_), None) => {
                out.push((Some(&left[i]), None));
                i += 1;
            }
            _ => {
                out.push((None, Some(&right[j])));
                j += 1;
            }
        }
    }
    out
}
