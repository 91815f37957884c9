//! What made a snapshot: which kind of accelerator, where the file says it, and whether it
//! was converted from profiler output rather than dumped by the allocator.
//!
//! No key names the device type: CUDA, ROCm (through `torch.cuda`), XPU, Ascend NPU and MTIA
//! builds write the same format. What differs is what each producer's C++ puts in
//! `allocator_settings`, the actions it knows, and the paths in its stacks:
//! - `torch.cuda` (torch/csrc/cuda/memory_snapshot.cpp) writes the key `PYTORCH_CUDA_ALLOC_CONF`
//!   with the CUDA allocator's settings (`max_split_size`, …). A ROCm build writes the same
//!   file (the HIP allocator is the hipified CUDA one), so the file says "CUDA or ROCm".
//! - `torch.xpu` (torch/csrc/xpu/Module.cpp, `_xpu_memorySnapshot`, 2.11+) writes settings with
//!   only `PYTORCH_ALLOC_CONF` and `expandable_segments`, and no `external_annotations`.
//! - `torch_npu` (Ascend) has its own `workspace_snapshot` trace action.
//! - Python frames under `torch/xpu/`, `torch/mtia/` or `torch_npu/` name their device directly.
//!
//! A file with none of these (a bare segment list, a profiler-converted file) says nothing, and
//! then nothing is claimed.

use crate::Snapshot;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceType {
    /// NVIDIA CUDA, or AMD ROCm through `torch.cuda` (the two write the same file).
    Cuda,
    Xpu,
    Npu,
    Mtia,
}

impl DeviceType {
    pub fn name(self) -> &'static str {
        match self {
            DeviceType::Cuda => "cuda",
            DeviceType::Xpu => "xpu",
            DeviceType::Npu => "npu",
            DeviceType::Mtia => "mtia",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            DeviceType::Cuda => "CUDA or ROCm (the two write the same file)",
            DeviceType::Xpu => "Intel XPU",
            DeviceType::Npu => "Ascend NPU",
            DeviceType::Mtia => "MTIA",
        }
    }
}

/// The device type and what in the file says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceTypeEvidence {
    pub device_type: DeviceType,
    pub evidence: String,
}

/// Path fragments of Python frames that belong to one device's module.
const FRAME_PATHS: [(&str, DeviceType); 4] = [
    ("torch_npu/", DeviceType::Npu),
    ("torch/xpu/", DeviceType::Xpu),
    ("torch/mtia/", DeviceType::Mtia),
    ("torch/cuda/", DeviceType::Cuda),
];

impl Snapshot {
    /// The device type, from the most specific evidence the file holds; `None` when it holds
    /// none.
    pub fn device_type(&self) -> Option<DeviceTypeEvidence> {
        let found = |device_type, evidence: String| Some(DeviceTypeEvidence { device_type, evidence });
        if self.source.unknown_actions.contains_key("workspace_snapshot") {
            return found(DeviceType::Npu, "trace action workspace_snapshot, which only torch_npu writes".into());
        }
        let raw = &self.settings.raw;
        if raw.contains_key("PYTORCH_ALLOC_CONF")
            && !raw.contains_key("PYTORCH_CUDA_ALLOC_CONF")
            && !raw.contains_key("max_split_size")
        {
            return found(
                DeviceType::Xpu,
                "allocator_settings has PYTORCH_ALLOC_CONF and none of the CUDA allocator's keys, as torch.xpu writes it".into(),
            );
        }
        for (fragment, device_type) in FRAME_PATHS {
            if self.frames.iter().any(|f| self.str(f.filename).contains(fragment)) {
                return found(device_type, format!("Python frames in {fragment}"));
            }
        }
        if raw.contains_key("PYTORCH_CUDA_ALLOC_CONF") {
            return found(
                DeviceType::Cuda,
                "allocator_settings.PYTORCH_CUDA_ALLOC_CONF, which torch.cuda writes".into(),
            );
        }
        None
    }
}

impl Snapshot {
    /// The file was made by `torch.cuda._memory_viz._profile_to_snapshot` (PyTorch's
    /// `profile_plot`) from a `torch.profiler` run, not dumped by the allocator. The converter
    /// writes only `segments` and `device_traces`; its trace entries have no `time_us`; its
    /// frames are `{filename: "none", line: 0, name}` (Python function names only). Those three
    /// together are what no allocator dump writes (every release since 2.3 writes
    /// `allocator_settings`, since 2.2 `time_us`). Fixture `formats/f07_profiler_converted`.
    pub fn profiler_converted(&self) -> bool {
        // Cheapest tests first: an allocator dump fails the settings test at once.
        if !self.source.has_trace_key || !self.settings.raw.is_empty() || !self.annotations.is_empty() {
            return false;
        }
        let converter_frames = !self.frames.is_empty()
            && self.frames.iter().all(|f| f.line == 0 && self.str(f.filename) == PROFILER_FRAME_FILENAME);
        if !converter_frames {
            return false;
        }
        let facts = self.trace_facts();
        let entries: u64 = facts.iter().map(|f| f.entries).sum();
        entries > 0 && facts.iter().map(|f| f.events_without_time).sum::<u64>() == entries
    }

    /// The device index under which a profiler-converted file puts CPU memory: one past the
    /// CUDA devices of the machine that made it, which is its last trace list.
    pub fn profiler_cpu_device(&self) -> Option<u32> {
        (self.profiler_converted() && self.traces.len() >= 2).then(|| self.traces.len() as u32 - 1)
    }
}

/// The `filename` `_profile_to_snapshot` gives every frame (with line 0).
pub const PROFILER_FRAME_FILENAME: &str = "none";

impl Snapshot {
    /// Why a trace starts mid-run, as far as the file tells: tensors made before the profiler
    /// started (a profiler-converted file); else from `trace_alloc_overflowed` when the file
    /// has it; else both causes, which a file without the flag cannot tell apart.
    pub fn mid_run_cause(&self) -> String {
        if self.profiler_converted() {
            return "tensors made before the profiler started".to_string();
        }
        let s = &self.settings;
        let ring = match s.trace_max_entries {
            Some(n) => format!("the ring buffer of {n} entries"),
            None => "the ring buffer".to_string(),
        };
        match s.trace_overflowed {
            Some(true) => format!("{ring} wrapped: allocator_settings.trace_alloc_overflowed"),
            Some(false) => "recording started late: allocator_settings.trace_alloc_overflowed is false".to_string(),
            None => "ring buffer wrapped or recording started late".to_string(),
        }
    }
}
