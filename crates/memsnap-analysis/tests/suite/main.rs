//! The integration tests of `memsnap-analysis` in one test binary: detectors, thresholds and the analysis over real fixtures.
mod common;

mod allocator_cache;
mod detector_fragmentation;
mod detector_no_grad_missing;
mod detector_oom;
mod detector_reference_leak;
mod detector_retained_graph;
mod detector_unreleased_gradient;
mod recording_and_control_flow;
mod thresholds;
