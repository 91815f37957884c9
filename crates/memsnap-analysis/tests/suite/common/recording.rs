//! A synthetic program's snapshot as another recording setting of
//! `torch.cuda.memory._record_memory_history` would have held it (the same program, what the
//! setting keeps of it), for tests of how the analysis reads each setting.

use memsnap_model::Snapshot;

/// What `_record_memory_history(context="alloc")` records: every free carries the stack of its
/// block's allocation instead of the stack at the free.
pub fn as_context_alloc(mut snap: Snapshot) -> Snapshot {
    for t in &mut snap.traces {
        let mut alloc_stack = std::collections::HashMap::new();
        for e in &mut t.events {
            match e.action() {
                memsnap_model::Action::Alloc => {
                    alloc_stack.insert(e.addr, e.stack);
                }
                memsnap_model::Action::FreeRequested | memsnap_model::Action::FreeCompleted => {
                    if let Some(&s) = alloc_stack.get(&e.addr) {
                        e.stack = s;
                    }
                }
                _ => {}
            }
        }
    }
    snap
}

/// What `_record_memory_history(skip_actions=["free_requested"])` records: frees only as they
/// complete.
pub fn without_free_requests(mut snap: Snapshot) -> Snapshot {
    for t in &mut snap.traces {
        t.events.retain(|e| e.action() != memsnap_model::Action::FreeRequested);
    }
    snap
}
/// `snap` as a state-only recording (`_record_memory_history(enabled="state")`) would hold it:
/// the same dump, no trace events.
pub fn dump_alone(mut snap: Snapshot) -> Snapshot {
    for t in &mut snap.traces {
        t.events.clear();
    }
    snap
}

/// `snap` as `_record_memory_history(context="state")` would have recorded it: the same trace
/// without a stack on any event; the dump's blocks keep theirs.
pub fn without_event_stacks(mut snap: Snapshot) -> Snapshot {
    for t in &mut snap.traces {
        for e in &mut t.events {
            e.stack = memsnap_model::StackId::EMPTY;
        }
    }
    snap
}

/// `snap` with the `record_function` annotation PyTorch's optimizers open at every `step()`
/// (`Optimizer.step#Adam.step`), as real recordings hold in `external_annotations`: a START at
/// the first allocation of each run of allocations under `optim/adam.py`. A trace without
/// stacks ([`without_event_stacks`]) finds its iterations by these alone.
pub fn with_step_annotations(mut snap: Snapshot) -> Snapshot {
    let in_adam = |stack: memsnap_model::StackId| {
        snap.stacks[stack.0 as usize]
            .frames
            .iter()
            .any(|&f| snap.strings[snap.frames[f.0 as usize].filename.0 as usize].ends_with("optim/adam.py"))
    };
    let mut starts = Vec::new();
    for t in &snap.traces {
        let mut inside = false;
        for e in &t.events {
            let adam = e.action() == memsnap_model::Action::Alloc && in_adam(e.stack);
            if adam && !inside {
                starts.push(memsnap_model::Annotation {
                    name: "Optimizer.step#Adam.step".into(),
                    start: true,
                    device: t.device,
                    time_us: e.time_us,
                });
            }
            inside = adam || (inside && e.action() != memsnap_model::Action::Alloc);
        }
    }
    snap.annotations.extend(starts);
    snap
}
