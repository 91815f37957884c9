//! What every `detector_*.rs` test file uses: `use common::prelude::*;`.

#![allow(unused_imports)]

pub use super::program::{chain, top, Grad, Pass, Program, ZeroGrad, CALL, MODEL, TRAIN, WRAP};
pub use super::recording::*;
pub use super::scenario::*;
pub use super::{Blk, Fr, TraceBuilder, MIB};
pub use memsnap_analysis::{find_phases, Evidence, GraphHold, Severity, StackTable, SuspectKind};
pub use memsnap_model::Snapshot;
