//! Phases found from the trace alone: backward passes, forward passes, optimizer steps,
//! iterations and evaluation windows.

use memsnap_model::{Action, Annotation, FrameId, StackId, TraceEvent, NO_TIME};
use rustc_hash::FxHashMap;

use crate::stacks::{StackInfo, StackTable};

/// A half-open range of event indices `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn contains(&self, i: u32) -> bool {
        self.start <= i && i < self.end
    }
}

/// A backward pass: from the allocation that launched it (whose stack holds the user's
/// `.backward()` line) to the next event with Python frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backward {
    pub span: Span,
    /// The `.backward()` line.
    pub line: Option<FrameId>,
}

/// One call of a model from one user line: consecutive events inside `nn.Module` calls with
/// the same forward call site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForwardPass {
    pub span: Span,
    pub call_site: Option<FrameId>,
    /// A backward starts after this pass and before the next pass from the same call site (and,
    /// when passes from other call sites run in between, one of those backwards frees a block
    /// this pass allocated).
    pub trained: bool,
    /// The last allocation of the pass (usually the model's output).
    pub last_alloc: Option<u32>,
}

/// How iterations were found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IterationSource {
    /// Repeated `.backward()` from one line.
    Backward,
    /// Repeated forward passes from one call site (inference / evaluation loops).
    Forward,
    /// `external_annotations` with a repeating name.
    Annotation,
    /// The program's loop, read from the user's statements that allocate (see
    /// [`loop_iterations`]): for a trace with no backward, no model call and no annotation
    /// (CUDA-graph replays, which allocate nothing; plain tensor code).
    Loop,
    None,
}

#[derive(Clone, Debug)]
pub struct Phases {
    pub backwards: Vec<Backward>,
    pub forwards: Vec<ForwardPass>,
    /// Event indices where an iteration starts (sorted). Iteration `k` is
    /// `[boundaries[k], boundaries[k+1])`; events before the first boundary belong to no
    /// iteration.
    pub boundaries: Vec<u32>,
    pub iteration_source: IterationSource,
    /// The line that defines iterations (backward line or forward call site).
    pub iteration_line: Option<FrameId>,
    /// Name of the annotation that defines iterations, when annotations were used.
    pub iteration_annotation: Option<String>,
    /// Runs of consecutive forward passes without backward (evaluation / inference windows).
    pub eval_windows: Vec<Span>,
    /// Optimizer steps: runs of events inside `torch.optim`.
    pub optimizer_steps: Vec<Span>,
    pub event_count: u32,
    /// Events (sorted) run by threads the program started ([`StackInfo::worker_thread`]) while
    /// another thread, the one the script runs in, drives the passes: an evaluation worker's
    /// model calls, interleaved with the training step's events. They open and close no window
    /// of the main thread's and belong to none of its passes or backwards: what they keep is the
    /// worker's (`reference_leak`'s origin `worker_thread`). Empty when no thread started from Python allocated, or when the
    /// passes are the started threads' (the script's thread records no Python-framed event, or
    /// only a started thread runs model calls or launches backward passes: the training loop
    /// itself runs in a thread, as Ray Train runs the user's function, or a server runs each
    /// request's `generate` in one).
    ///
    /// [`StackInfo::worker_thread`]: crate::stacks::StackInfo::worker_thread
    pub worker_events: Vec<u32>,
    /// The free events carry their block's *allocation* stack, not the stack of the code that
    /// freed it (`_record_memory_history(context="alloc")`; see [`free_stacks_are_alloc_stacks`]).
    /// Their frames then say nothing about where the program was when the block was freed.
    pub free_stacks_from_alloc: bool,
    /// Backward passes whose launch line the trace does not show (see `EngineRun`).
    pub unnamed_launches: UnnamedLaunches,
}

/// [`Phases::unnamed_launches`]: how many, and where the first one lies: the user line of the
/// Python-framed event just before it and of the one just after it (`None`: that event ran no
/// user code), or no event after it (the trace ends in it).
#[derive(Clone, Copy, Debug, Default)]
pub struct UnnamedLaunches {
    pub count: usize,
    pub first_between: Option<(Option<FrameId>, Option<Option<FrameId>>)>,
}

impl Phases {
    /// How many optimizer steps the trace shows: the `torch/optim` windows that allocate (a
    /// step's state and scratch), or, when more, the iterations that hold an optimizer window.
    /// A step that allocates nothing (SGD in place) leaves no event of its own, only the
    /// `zero_grad(set_to_none=True)` that frees the gradients, once per iteration (ab05); and a
    /// `zero_grad` called apart from the step, after the forward pass, is a window that only
    /// frees, which is not a step of its own (ad03: 16 steps, not 31).
    pub fn steps_shown(&self, events: &[TraceEvent]) -> usize {
        let allocating = self
            .optimizer_steps
            .iter()
            .filter(|w| events[w.start as usize..w.end as usize].iter().any(|e| e.action() == Action::Alloc))
            .count();
        let mut iterations: Vec<usize> =
            self.optimizer_steps.iter().filter_map(|w| self.iteration_of(w.start)).collect();
        iterations.dedup();
        allocating.max(iterations.len())
    }

    /// Is event `i` one of [`Phases::worker_events`]?
    pub fn on_worker(&self, i: u32) -> bool {
        !self.worker_events.is_empty() && self.worker_events.binary_search(&i).is_ok()
    }

    /// The backward pass containing event `i`.
    pub fn backward_at(&self, i: u32) -> Option<&Backward> {
        self.backward_index_at(i).map(|k| &self.backwards[k])
    }

    /// Index (into [`Phases::backwards`]) of the backward pass containing event `i` (none for
    /// a worker thread's event).
    pub fn backward_index_at(&self, i: u32) -> Option<usize> {
        if self.on_worker(i) {
            return None;
        }
        let k = self.backwards.partition_point(|b| b.span.start <= i);
        (k > 0 && self.backwards[k - 1].span.contains(i)).then(|| k - 1)
    }

    /// The forward pass containing event `i`, with its index into [`Phases::forwards`] (none
    /// for a worker thread's event).
    pub fn forward_at(&self, i: u32) -> Option<(usize, &ForwardPass)> {
        if self.on_worker(i) {
            return None;
        }
        let k = self.forwards.partition_point(|f| f.span.start <= i);
        (k > 0).then(|| (k - 1, &self.forwards[k - 1])).filter(|(_, f)| f.span.contains(i))
    }

    /// The stretch of the trace between iteration boundaries that contains event `i`: 0 before
    /// the first boundary, `k + 1` in iteration `k`.
    pub fn stretch_of(&self, i: u32) -> usize {
        self.boundaries.partition_point(|&b| b <= i)
    }

    /// The iteration that contains event `i`.
    pub fn iteration_of(&self, i: u32) -> Option<usize> {
        self.stretch_of(i).checked_sub(1)
    }

    pub fn iteration_count(&self) -> usize {
        self.boundaries.len()
    }

    /// `[start, end)` of iteration `k`.
    pub fn iteration_span(&self, k: usize) -> Span {
        Span { start: self.boundaries[k], end: self.boundaries.get(k + 1).copied().unwrap_or(self.event_count) }
    }

    pub fn in_optimizer(&self, i: u32) -> bool {
        let k = self.optimizer_steps.partition_point(|s| s.start <= i);
        k > 0 && self.optimizer_steps[k - 1].contains(i)
    }
}

/// A forward pass that an allocation of another thread ended, and that may go on.
///
/// Mechanism. The interpreter switches threads in the middle of a model call (every few
/// milliseconds, and at every call that lets the GIL go), so another thread's allocations (the
/// script's clients while a thread it started runs the model, or the reverse) can fall inside a
/// pass, and the pass runs on when its thread resumes. Its next allocation then comes from
/// inside the model, where a new pass from that call site starts with the model's first
/// operation: the stack its passes start with ([`PassStarts`]). That operation can
/// allocate more than once with that stack (a convolution's output, then its cuDNN workspace),
/// so while the pass has allocated with no other stack, another allocation with it is the same
/// operation going on (bn01: a ResNet scored on a thread, preprocessing on the script's).
/// Ended at the other thread's allocation, the pass would leave the tensors it still uses
/// reading as having outlived it, saved for a backward (bg04: a dynamic batcher's thread under
/// `inference_mode`, its clients' `result().mean(0)` on the script's thread, read as a pass run
/// with grad).
#[derive(Clone, Copy)]
struct Suspended {
    worker: bool,
    call_site: Option<FrameId>,
    /// The pass had allocated with a stack other than its call site's start stack.
    past_first_op: bool,
}

impl Suspended {
    /// Is model-call event `e` (of `info`) this pass going on: from its thread and call site,
    /// and not the first allocation of a new pass (made with the start stack once the pass
    /// had gone past its first operation)?
    fn resumed_by(&self, info: &StackInfo, e: &TraceEvent, starts: &PassStarts) -> bool {
        info.worker_thread == self.worker
            && info.forward_call == self.call_site
            && (e.action() != Action::Alloc || !self.past_first_op || !starts.opens(self.call_site, e.stack))
    }
}

/// Per model call site, the stack its passes start with: the most frequent stack of an
/// allocation that opens a pass (a model-call allocation whose Python-framed allocation before
/// it was not one from that call site); ties go to the lowest stack id. Empty unless both the
/// script's thread and a thread it started made Python-framed allocations, and the started
/// threads' events are not set apart ([`Phases::worker_events`]): only then can another
/// thread's allocation fall inside a pass (see [`Suspended`]).
struct PassStarts(FxHashMap<Option<FrameId>, StackId>);

impl PassStarts {
    fn of(events: &[TraceEvent], stacks: &StackTable, worker_events: &[u32]) -> PassStarts {
        let python = |worker: bool| stacks.infos.iter().any(|i| i.python && i.worker_thread == worker);
        if !worker_events.is_empty() || !python(true) || !python(false) {
            return PassStarts(FxHashMap::default());
        }
        let mut counts: FxHashMap<(Option<FrameId>, StackId), u32> = FxHashMap::default();
        // The call site of the last Python-framed allocation when it was a model call's.
        let mut previous: Option<Option<FrameId>> = None;
        for e in events.iter().filter(|e| e.action() == Action::Alloc) {
            let info = stacks.get(e.stack);
            if !info.python || info.recompute || info.backward_launch {
                continue;
            }
            let call = info.forward.then_some(info.forward_call);
            if let Some(site) = call.filter(|&site| previous != Some(site)) {
                *counts.entry((site, e.stack)).or_default() += 1;
            }
            previous = call;
        }
        let mut best: FxHashMap<Option<FrameId>, (u32, StackId)> = FxHashMap::default();
        for ((site, stack), n) in counts {
            let b = best.entry(site).or_insert((n, stack));
            if n > b.0 || n == b.0 && stack < b.1 {
                *b = (n, stack);
            }
        }
        PassStarts(best.into_iter().map(|(site, (_, stack))| (site, stack)).collect())
    }

    /// Is `stack` the one passes from `site` start with?
    fn opens(&self, site: Option<FrameId>, stack: StackId) -> bool {
        self.0.get(&site) == Some(&stack)
    }
}

/// Find the phases of one device's trace.
pub fn find_phases(events: &[TraceEvent], stacks: &StackTable, annotations: &[Annotation]) -> Phases {
    let n = events.len() as u32;
    let mut backwards: Vec<Backward> = Vec::new();
    let mut forwards: Vec<ForwardPass> = Vec::new();
    let mut optimizer_steps: Vec<Span> = Vec::new();
    let mut open_backward: Option<Backward> = None;
    let mut open_forward: Option<ForwardPass> = None;
    let mut open_opt: Option<Span> = None;
    let free_stacks_from_alloc = free_stacks_are_alloc_stacks(events);
    // With `free_stacks_from_alloc`: the addresses the open forward pass allocated.
    let mut open_forward_blocks: rustc_hash::FxHashSet<u64> = Default::default();
    // Whether the open forward pass has allocated with a stack other than its call site's start
    // stack; the last pass when another thread's allocation ended it (`Suspended`).
    let mut open_forward_past_first_op = false;
    let mut suspended: Option<Suspended> = None;
    let worker_events = worker_events(events, stacks);
    let starts = PassStarts::of(events, stacks, &worker_events);
    // The thread of a pass is that of the event that opened it.
    let in_worker = |f: &ForwardPass| stacks.get(events[f.span.start as usize].stack).worker_thread;
    // Runs of frameless allocations outside every launched backward window (see `EngineRun`),
    // and the run being read: (its first event, the Python-framed event before it, whether it
    // freed anything).
    let mut engine_runs: Vec<EngineRun> = Vec::new();
    let mut open_run: Option<(u32, u32, bool)> = None;
    let mut last_framed: Option<u32> = None;

    for (i, e) in events.iter().enumerate() {
        let i = i as u32;
        if !matches!(e.action(), Action::Alloc | Action::FreeRequested | Action::FreeCompleted) {
            continue;
        }
        if free_stacks_from_alloc && e.action() != Action::Alloc {
            // A free that carries the allocation's stack (`context="alloc"`) would look like the
            // forward pass that allocated the block running again: inside a backward pass it
            // would end the backward window and stretch that forward pass over it. The program
            // position is unknown at such a free, so it belongs to whatever window is open, like
            // a frameless event; but the free of a block the open forward pass allocated, before
            // anything outside the pass allocates, is that pass letting its intermediates go as
            // it runs on and returns (a no-grad layer frees its input once its output is made;
            // free-time stacks, `context="all"`, show these frees inside the pass). Without
            // them the pass would end at its last allocation and what it freed after would
            // read as outliving it: saved tensors of a grad-on pass (q33's no-grad rollouts).
            if let Some(f) = open_forward.as_mut() {
                if open_forward_blocks.contains(&e.addr) {
                    f.span.end = i + 1;
                }
            }
            if let Some(run) = open_run.as_mut() {
                run.2 = true;
            }
            continue;
        }
        let info = stacks.get(e.stack);
        if info.worker_thread && !worker_events.is_empty() {
            // Another thread's: it neither continues nor ends the main thread's windows.
            continue;
        }
        if !info.python || info.recompute {
            // Frameless (or native-only) events belong to whatever window is open, and so do
            // checkpoint recomputations, which the engine runs inside a backward pass. Outside
            // every window they are a backward whose launch allocated nothing from Python.
            if open_backward.is_none() {
                match open_run.as_mut() {
                    Some(run) => run.2 |= e.action() != Action::Alloc,
                    None => {
                        if let (Some(before), Action::Alloc) = (last_framed, e.action()) {
                            open_run = Some((i, before, false));
                        }
                    }
                }
            }
            continue;
        }
        if info.transform_code && open_backward.is_some() {
            // A `torch.func` transform letting go of the graph its backward kept: part of that
            // backward, as a plain `.backward()` frees the saved tensors inside its window.
            continue;
        }
        if info.native_callback {
            // So does a hook the engine runs; an optimizer it steps is still a step (one stepped
            // per parameter from `register_post_accumulate_grad_hook`: s94).
            optimizer_window(&mut open_opt, &mut optimizer_steps, info.optimizer, e.action() == Action::Alloc, i);
            continue;
        }
        if let Some((start, before, true)) = open_run.take() {
            engine_runs.push(EngineRun { span: Span { start, end: i }, before, after: Some(i) });
        }
        last_framed = Some(i);
        // Backward windows: opened by a launch, closed by the next Python-framed event.
        if info.backward_launch && e.action() == Action::Alloc {
            if let Some(b) = open_backward.take() {
                backwards.push(Backward { span: Span { start: b.span.start, end: i }, line: b.line });
            }
            open_backward = Some(Backward { span: Span { start: i, end: i + 1 }, line: info.site });
        } else if !info.backward_launch {
            if let Some(b) = open_backward.take() {
                backwards.push(Backward { span: Span { start: b.span.start, end: i }, line: b.line });
            }
        }
        // Forward passes.
        if info.forward && !info.backward_launch {
            if open_forward.is_none() {
                if let Some(s) = suspended.take().filter(|s| s.resumed_by(&info, e, &starts)) {
                    open_forward = forwards.pop();
                    open_forward_past_first_op = s.past_first_op;
                }
            }
            match &mut open_forward {
                Some(f) if f.call_site == info.forward_call => {
                    f.span.end = i + 1;
                    if e.action() == Action::Alloc {
                        f.last_alloc = Some(i);
                        open_forward_past_first_op |= !starts.opens(f.call_site, e.stack);
                        if free_stacks_from_alloc {
                            open_forward_blocks.insert(e.addr);
                        }
                    }
                }
                _ => {
                    if let Some(f) = open_forward.take() {
                        forwards.push(f);
                    }
                    open_forward_blocks.clear();
                    if free_stacks_from_alloc && e.action() == Action::Alloc {
                        open_forward_blocks.insert(e.addr);
                    }
                    let last_alloc = (e.action() == Action::Alloc).then_some(i);
                    open_forward_past_first_op = last_alloc.is_some() && !starts.opens(info.forward_call, e.stack);
                    suspended = None;
                    open_forward = Some(ForwardPass {
                        span: Span { start: i, end: i + 1 },
                        call_site: info.forward_call,
                        trained: false,
                        last_alloc,
                    });
                }
            }
        } else if e.action() == Action::Alloc {
            match open_forward.take() {
                Some(f) => {
                    let worker = in_worker(&f);
                    suspended = (worker != info.worker_thread).then_some(Suspended {
                        worker,
                        call_site: f.call_site,
                        past_first_op: open_forward_past_first_op,
                    });
                    forwards.push(f);
                }
                None if suspended.is_some_and(|s| s.worker == info.worker_thread) => suspended = None,
                None => {}
            }
        }
        optimizer_window(&mut open_opt, &mut optimizer_steps, info.optimizer, e.action() == Action::Alloc, i);
    }
    if let Some(b) = open_backward.take() {
        backwards.push(Backward { span: Span { start: b.span.start, end: n }, line: b.line });
    }
    if let Some(f) = open_forward.take() {
        forwards.push(f);
    }
    if let Some(s) = open_opt.take() {
        optimizer_steps.push(s);
    }

    if let Some((start, before, true)) = open_run.take() {
        engine_runs.push(EngineRun { span: Span { start, end: n }, before, after: None });
    }
    let mut unnamed_launches = UnnamedLaunches::default();
    if !engine_runs.is_empty() {
        // A run right after Python code with no user frame at all follows a library's callback
        // that the engine ran on its own thread (FSDP's post-backward hooks end the window they
        // run in): the same backward going on, the launched one before it.
        let launched: Vec<(u32, Option<FrameId>)> = backwards.iter().map(|b| (b.span.start, b.line)).collect();
        for r in &engine_runs {
            let after_callback = stacks.get(events[r.before as usize].stack).site.is_none();
            let line = if after_callback {
                let k = launched.partition_point(|(start, _)| *start < r.span.start);
                k.checked_sub(1).and_then(|k| launched[k].1)
            } else {
                r.launch_line(events, stacks)
            };
            if line.is_none() {
                unnamed_launches.count += 1;
                let site = |i: u32| stacks.get(events[i as usize].stack).site;
                unnamed_launches.first_between.get_or_insert((site(r.before), r.after.map(site)));
            }
            backwards.push(Backward { span: r.span, line });
        }
        backwards.sort_by_key(|b| b.span.start);
    }

    // A pass is "trained" if a backward starts after it and before the next pass from the same
    // call site. When passes from other lines run in between (an evaluation loop followed by
    // training), the backward must also free something this pass allocated: a backward frees
    // the activations of the graph it runs through.
    for k in 0..forwards.len() {
        let site = forwards[k].call_site;
        let end = forwards[k + 1..].iter().find(|f| f.call_site == site).map_or(n, |f| f.span.start);
        let after = forwards[k].span.start;
        let j = backwards.partition_point(|b| b.span.start < after);
        let Some(b) = backwards.get(j).filter(|b| b.span.start < end) else {
            forwards[k].trained = false;
            continue;
        };
        let other_between =
            forwards[k + 1..].iter().take_while(|f| f.span.start < b.span.start).any(|f| f.call_site != site);
        // Any backward before the next pass from this line may be the one that runs through it
        // (a GAN's generator pass is followed by the discriminator's backward first).
        forwards[k].trained = !other_between
            || backwards[j..]
                .iter()
                .take_while(|b| b.span.start < end)
                .take(8)
                .any(|b| backward_frees_pass(events, forwards[k].span, b.span));
    }

    differentiated_later(events, &backwards, &mut forwards);

    // Evaluation windows: maximal runs of untrained passes.
    let mut eval_windows: Vec<Span> = Vec::new();
    for f in forwards.iter().filter(|f| !f.trained) {
        match eval_windows.last_mut() {
            // Merge with the previous run when no backward started in between.
            Some(w) if !backwards.iter().any(|b| b.span.start >= w.end && b.span.start < f.span.start) => {
                w.end = f.span.end
            }
            _ => eval_windows.push(f.span),
        }
    }

    // Iterations: the most frequent backward line; else the most frequent forward call site;
    // else a repeating annotation.
    let mut phases = Phases {
        backwards,
        forwards,
        boundaries: Vec::new(),
        iteration_source: IterationSource::None,
        iteration_line: None,
        iteration_annotation: None,
        eval_windows,
        optimizer_steps,
        event_count: n,
        worker_events,
        free_stacks_from_alloc,
        unnamed_launches,
    };
    if let Some(line) = iteration_backward_line(events, &phases.backwards, &phases.optimizer_steps) {
        let starts: Vec<u32> = phases.backwards.iter().filter(|b| b.line == line).map(|b| b.span.start).collect();
        if starts.len() >= 2 {
            // An iteration starts with the forward pass that feeds its backward: move each
            // boundary back to the first forward pass after the previous backward. A backward
            // with no forward pass since the previous one goes through a graph already
            // differentiated (`retain_graph=True` and a second backward or `autograd.grad`
            // over it: GradNorm's per-task gradient norms, j07): the same step, not a new
            // iteration, in a program whose backward passes are fed by forward passes at all.
            let fed = phases.forwards.iter().any(|f| f.trained);
            let mut bounds = Vec::with_capacity(starts.len());
            let mut prev_end = 0u32;
            for &s in &starts {
                let first_fwd = phases
                    .forwards
                    .iter()
                    .find(|f| f.trained && f.span.start >= prev_end && f.span.start < s)
                    .map(|f| f.span.start);
                match first_fwd {
                    Some(f) => bounds.push(f),
                    None if !fed || bounds.is_empty() => bounds.push(s),
                    None => {}
                }
                prev_end = phases.backward_at(s).map_or(s + 1, |b| b.span.end);
            }
            bounds.dedup();
            phases.boundaries = bounds;
            phases.iteration_source = IterationSource::Backward;
            phases.iteration_line = line;
            return phases;
        }
    }
    if let Some(site) = most_frequent(phases.forwards.iter().map(|f| f.call_site)) {
        let starts: Vec<u32> = phases.forwards.iter().filter(|f| f.call_site == site).map(|f| f.span.start).collect();
        if starts.len() >= 2 {
            phases.boundaries = starts;
            phases.iteration_source = IterationSource::Forward;
            phases.iteration_line = site;
            return phases;
        }
    }
    if let Some((name, bounds)) = annotation_iterations(events, annotations) {
        phases.boundaries = bounds;
        phases.iteration_source = IterationSource::Annotation;
        phases.iteration_annotation = Some(name);
        return phases;
    }
    if phases.backwards.is_empty() && phases.forwards.is_empty() {
        if let Some((line, bounds)) = loop_iterations(events, stacks, &phases) {
            phases.boundaries = bounds;
            phases.iteration_source = IterationSource::Loop;
            phases.iteration_line = Some(line);
        }
    }
    phases
}

/// Iterations of the program's own loop, for a trace with no backward pass and no model call
/// to count them by: a service replaying a CUDA graph (`torch.compile(mode="reduce-overhead")`,
/// whose replays allocate nothing), plain tensor code. A loop runs the same statements again
/// and again, so the allocating statements of its body come back in the same order, each
/// entered once per pass: one statement, entered again after others ran, marks the passes.
///
/// The statements are read at the level where the user's code varies: the outermost user frame
/// of every Python-framed allocation of the program's own thread, or, while every allocation
/// runs under one and the same frame (`main()`), the frame inside it. Each time a statement's
/// allocations begin again after another statement's, it is entered once more; the statement
/// entered most often (ties: the one entered first) starts each iteration. A loop whose body
/// has one allocating statement (`u = step(u)`) enters it once and stays: its passes show one
/// level further in, in the lines of the function that statement calls, so the reading goes
/// into the statement that allocated most while a statement in there is entered at least
/// [`DEEPER_LOOP_FACTOR`] times as often (a function with a loop of its own, called once per
/// pass, enters its inner statements as often as it is called: no deeper). Needs the chosen
/// statement entered at least twice.
fn loop_iterations(events: &[TraceEvent], stacks: &StackTable, phases: &Phases) -> Option<(FrameId, Vec<u32>)> {
    let mut scope: Vec<(u32, &[FrameId])> = events
        .iter()
        .enumerate()
        .filter(|(i, e)| e.action() == Action::Alloc && !phases.on_worker(*i as u32))
        .filter_map(|(i, e)| {
            let info = stacks.get(e.stack);
            let user = &stacks.user_frames[e.stack.0 as usize];
            (info.python && !info.recompute && !user.is_empty()).then_some((i as u32, &user[..]))
        })
        .collect();
    let mut depth = varying_depth(&scope, 0)?;
    // The statements of the level being read, and which of them was entered most often.
    let mut level = statements(&scope, depth);
    let mut best = most_entered(&level)?;
    while let Some(dominant) =
        level.iter().max_by(|a, b| a.allocations.cmp(&b.allocations).then(b.first.cmp(&a.first))).map(|s| s.frame)
    {
        let inner: Vec<(u32, &[FrameId])> =
            scope.iter().copied().filter(|(_, f)| frame_at(f, depth) == Some(dominant)).collect();
        let Some(inner_depth) = varying_depth(&inner, depth + 1) else { break };
        let deeper = statements(&inner, inner_depth);
        match most_entered(&deeper) {
            Some(k) if deeper[k].starts.len() >= DEEPER_LOOP_FACTOR * level[best].starts.len() => {
                (scope, depth, level, best) = (inner, inner_depth, deeper, k);
            }
            _ => break,
        }
    }
    let best = level.swap_remove(best);
    (best.starts.len() >= 2).then_some((best.frame, best.starts))
}

/// How many times as often a statement one level in must be entered for [`loop_iterations`] to
/// read the loop there (2): a pass of the loop that calls a function once enters the function's
/// statements once; twice as often means the outer statement ran several passes unbroken.
const DEEPER_LOOP_FACTOR: usize = 2;

/// The user frame at `depth`, counted from the outermost.
fn frame_at(frames: &[FrameId], depth: usize) -> Option<FrameId> {
    frames.len().checked_sub(depth + 1).map(|k| frames[k])
}

/// The first depth from `from` on where the allocations' frames differ (`None` when they never
/// do: one statement all along).
fn varying_depth(allocs: &[(u32, &[FrameId])], from: usize) -> Option<usize> {
    let mut depth = from;
    loop {
        let first = frame_at(allocs.first()?.1, depth)?;
        if !allocs.iter().all(|(_, f)| frame_at(f, depth) == Some(first)) {
            return Some(depth);
        }
        depth += 1;
    }
}

/// A statement of [`loop_iterations`]: where each of its entries began, its first allocation
/// (by position) and how many allocations it made.
struct Statement {
    frame: FrameId,
    first: usize,
    starts: Vec<u32>,
    allocations: usize,
}

/// The statement entered most often (ties: the one entered first), by index.
fn most_entered(level: &[Statement]) -> Option<usize> {
    (0..level.len()).max_by(|&a, &b| {
        let (a, b) = (&level[a], &level[b]);
        a.starts.len().cmp(&b.starts.len()).then(b.first.cmp(&a.first))
    })
}

/// The statements at `depth`, in the order first met.
fn statements(allocs: &[(u32, &[FrameId])], depth: usize) -> Vec<Statement> {
    let mut out: Vec<Statement> = Vec::new();
    let mut index: FxHashMap<FrameId, usize> = FxHashMap::default();
    let mut previous: Option<FrameId> = None;
    for (k, &(i, frames)) in allocs.iter().enumerate() {
        let here = frame_at(frames, depth);
        if let Some(f) = here {
            let at = *index.entry(f).or_insert_with(|| {
                out.push(Statement { frame: f, first: k, starts: Vec::new(), allocations: 0 });
                out.len() - 1
            });
            let st = &mut out[at];
            st.allocations += 1;
            if here != previous {
                st.starts.push(i);
            }
        }
        previous = here;
    }
    out
}

/// [`Phases::worker_events`]: the events of threads started from Python, unless the passes are
/// theirs: the script's own thread records no Python-framed event, or runs no model call or
/// launches no backward while a started thread does (a training function run in a thread, as Ray
/// Train runs it; `generate` run in a thread per request, as streaming servers do).
fn worker_events(events: &[TraceEvent], stacks: &StackTable) -> Vec<u32> {
    if !stacks.infos.iter().any(|i| i.worker_thread) {
        return Vec::new();
    }
    // Per thread kind (the script's, a started one): Python-framed events, backward launches,
    // events inside a model call.
    let (mut main, mut worker) = ([0usize; 3], [0usize; 3]);
    let mut events_of_workers = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let info = stacks.get(e.stack);
        let counts = if info.worker_thread {
            events_of_workers.push(i as u32);
            &mut worker
        } else if info.python {
            &mut main
        } else {
            continue;
        };
        counts[0] += 1;
        counts[1] += usize::from(info.backward_launch && e.action() == Action::Alloc);
        counts[2] += usize::from(info.forward);
    }
    let theirs = |k: usize| main[k] == 0 && worker[k] > 0;
    if main[0] == 0 || theirs(1) || theirs(2) {
        events_of_workers.clear();
    }
    events_of_workers
}

/// A backward pass whose launch allocated nothing from Python: a run of frameless allocations,
/// outside every launched backward window, that follows a Python-framed event and frees
/// something (a backward frees what it consumed). Frameless allocations in a trace recorded with
/// Python stacks are the autograd engine's, made on its device thread. Its launch allocates from
/// Python only when it makes the seed itself (`torch.ones_like` of a scalar loss in
/// `_make_grads`): a call handed its seed (`autograd.grad(outputs, inputs, grad_outputs=v)`, a
/// Hessian-vector product; `loss.backward(gradient=g)`; `torch.func.vjp`'s `vjp_fn(v)`; a
/// vectorized `autograd.functional.jacobian`), and every backward of a device whose pass was
/// launched from another device's trace (a model split over GPUs), shows only the engine's work.
#[derive(Clone, Copy, Debug)]
struct EngineRun {
    span: Span,
    /// The Python-framed event just before the run, and the one that ended it.
    before: u32,
    after: Option<u32>,
}

impl EngineRun {
    /// The line that launched the run, where the trace shows it: the user's call into autograd's
    /// API that was running when the run began (the event before it was that call preparing its
    /// seeds: a vectorized `jacobian`'s basis); else the statement that was running both before
    /// and after it (`scale * autograd.grad(...)[0]`). Otherwise unknown: the launch happened
    /// somewhere between two lines, and which one the trace cannot say.
    fn launch_line(&self, events: &[TraceEvent], stacks: &StackTable) -> Option<FrameId> {
        let before = stacks.get(events[self.before as usize].stack);
        if before.in_autograd_api {
            return before.site;
        }
        let after = self.after.map(|a| stacks.get(events[a as usize].stack))?;
        (before.site.is_some() && before.site == after.site && !after.forward).then_some(before.site).flatten()
    }
}

/// How many matched frees [`free_stacks_are_alloc_stacks`] looks at (enough to decide, cheap on
/// traces of millions of events).
const FREE_STACK_SAMPLE: u32 = 4096;
/// Fewer matched frees than this: undecided, taken as free-time stacks (the default recording).
const FREE_STACK_MIN: u32 = 16;

/// Do the free events carry the stack of their block's allocation instead of the stack at the
/// free? The CUDA caching allocator records a free with the context gathered at the free only
/// when `_record_memory_history(context="all")`; with `context="alloc"` it records the block's
/// `context_when_allocated` on `free_requested`/`free_completed` (CUDACachingAllocator.cpp,
/// `free()`: `context ? context : block->context_when_allocated`). No key in the snapshot says
/// which was used, but the trace shows it: with free-time stacks most frees differ from their
/// allocation's stack (a forward activation is freed by the autograd engine, frameless, or by
/// a later line), while with allocation stacks every free equals it. Decided on the first
/// [`FREE_STACK_SAMPLE`] frees whose allocation is in the trace: all equal.
pub fn free_stacks_are_alloc_stacks(events: &[TraceEvent]) -> bool {
    let mut alloc_stack: std::collections::HashMap<u64, memsnap_model::StackId> = std::collections::HashMap::new();
    let (mut matched, mut equal) = (0u32, 0u32);
    for e in events {
        match e.action() {
            Action::Alloc => {
                alloc_stack.insert(e.addr, e.stack);
            }
            // The first free of the block: its request, or its completion in a trace recorded
            // without requests (`skip_actions=["free_requested"]`; k01, recorded with
            // `context="alloc"`, read so as free-time stacks had the backward's frees of saved
            // tensors run the forward pass again: 32 passes, none trained, a retained graph).
            Action::FreeRequested | Action::FreeCompleted => {
                if let Some(s) = alloc_stack.remove(&e.addr) {
                    matched += 1;
                    equal += u32::from(s == e.stack);
                    if matched >= FREE_STACK_SAMPLE {
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    matched >= FREE_STACK_MIN && equal == matched
}

/// Optimizer steps: a run of events under `torch/optim`, ended by the next allocation outside it.
fn optimizer_window(open: &mut Option<Span>, steps: &mut Vec<Span>, optimizer: bool, alloc: bool, i: u32) {
    if optimizer {
        match open {
            Some(s) => s.end = i + 1,
            None => *open = Some(Span { start: i, end: i + 1 }),
        }
    } else if alloc {
        if let Some(s) = open.take() {
            steps.push(s);
        }
    }
}

/// Passes that the rule above leaves untrained because another pass from their call site ran
/// before the next backward, yet whose saved tensors that backward frees: a recurrence unrolled
/// in the training loop (`h = cell(x[:, t], h)` called once per time step, one backward per
/// sequence: ad03), a policy called once per environment step with one backward per episode.
/// A backward frees the saved tensors of the graph it runs through, so such a pass was
/// differentiated. Each backward is asked about the untrained passes since the backward before
/// it, in one walk over their events and its own, so the whole trace is walked once.
fn differentiated_later(events: &[TraceEvent], backwards: &[Backward], forwards: &mut [ForwardPass]) {
    let mut from = 0u32;
    let mut k = 0;
    for b in backwards {
        let first = k + forwards[k..].partition_point(|f| f.span.start < from);
        let last = first + forwards[first..].partition_point(|f| f.span.start < b.span.start);
        k = last;
        from = b.span.end;
        if !forwards[first..last].iter().any(|f| !f.trained) {
            continue;
        }
        // Live blocks the untrained passes allocated, by address: the pass's index.
        let mut live: FxHashMap<u64, usize> = FxHashMap::default();
        let mut pass = first;
        let end = b.span.end.min(events.len() as u32);
        for i in forwards[first].span.start..end {
            let e = &events[i as usize];
            while pass < last && forwards[pass].span.end <= i {
                pass += 1;
            }
            match e.action() {
                Action::Alloc if pass < last && forwards[pass].span.contains(i) && !forwards[pass].trained => {
                    live.insert(e.addr, pass);
                }
                Action::FreeRequested | Action::FreeCompleted => {
                    if let Some(p) = live.remove(&e.addr) {
                        if b.span.contains(i) {
                            forwards[p].trained = true;
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// Does the backward pass free a block that the forward pass allocated and that was still
/// allocated when the backward began? A block's free is its first free event: the request, or
/// the completion in a trace recorded without requests (`skip_actions=["free_requested"]`).
fn backward_frees_pass(events: &[TraceEvent], pass: Span, backward: Span) -> bool {
    let mut live = std::collections::HashSet::new();
    for i in pass.start..backward.end.min(events.len() as u32) {
        let e = &events[i as usize];
        let free = matches!(e.action(), Action::FreeRequested | Action::FreeCompleted);
        match e.action() {
            Action::Alloc if pass.contains(i) => {
                live.insert(e.addr);
            }
            _ if free && i < backward.start => {
                live.remove(&e.addr);
            }
            _ if free && backward.contains(i) && live.contains(&e.addr) => return true,
            _ => {}
        }
    }
    false
}

/// The backward line that delimits iterations: the most frequent one, unless an optimizer step
/// never follows it while one follows another line at least twice, which is then the one (the
/// most frequent such).
///
/// Mechanism: a training step ends with the optimizer stepping on the gradients its backward
/// made; `autograd.grad` calls that differentiate something else before it (an adversarial
/// attack's gradients with respect to the input, several per step: s08; a gradient penalty)
/// can outnumber the step's own `loss.backward()`, and iterations counted by them cut a step in
/// pieces. "Follows": the next optimizer step starts after the backward ends and before the
/// next backward (of any line) starts; a step is a window of `torch/optim` frames that
/// allocates (`zero_grad(set_to_none=True)` only frees, and comes before the backward). A
/// program whose steps allocate nothing (plain SGD without momentum or weight decay, in place)
/// shows no step: the most frequent line stays.
fn iteration_backward_line(events: &[TraceEvent], backwards: &[Backward], steps: &[Span]) -> Option<Option<FrameId>> {
    let frequent = most_frequent(backwards.iter().map(|b| b.line))?;
    let allocates = |s: &Span| events[s.start as usize..s.end as usize].iter().any(|e| e.action() == Action::Alloc);
    let stepped = |k: usize| {
        let next = backwards.get(k + 1).map_or(u32::MAX, |b| b.span.start);
        let i = steps.partition_point(|s| s.start < backwards[k].span.end);
        steps[i..].iter().take_while(|s| s.start < next).any(allocates)
    };
    let stepped_lines: Vec<Option<FrameId>> =
        (0..backwards.len()).filter(|&k| stepped(k)).map(|k| backwards[k].line).collect();
    if stepped_lines.contains(&frequent) {
        return Some(frequent);
    }
    match most_frequent(stepped_lines.iter().copied()) {
        Some(line) if stepped_lines.iter().filter(|&&l| l == line).count() >= 2 => Some(line),
        _ => Some(frequent),
    }
}

/// The most frequent value (ties to the one seen first), ignoring `None`.
pub(crate) fn most_frequent(items: impl Iterator<Item = Option<FrameId>>) -> Option<Option<FrameId>> {
    let mut counts: Vec<(FrameId, u32, usize)> = Vec::new();
    for (order, it) in items.enumerate() {
        let Some(f) = it else { continue };
        match counts.iter_mut().find(|c| c.0 == f) {
            Some(c) => c.1 += 1,
            None => counts.push((f, 1, order)),
        }
    }
    counts.iter().max_by(|a, b| a.1.cmp(&b.1).then(b.2.cmp(&a.2))).map(|c| Some(c.0))
}

/// The prefix of the annotation every `torch.optim` optimizer makes around its step
/// (`Optimizer.step#AdamW.step`: `torch/optim/optimizer.py`, `profile_hook_step`), once per
/// step and so once per training iteration, whatever other regions the program annotated.
const OPTIMIZER_STEP_ANNOTATION: &str = "Optimizer.step#";

/// Iterations from `record_function` annotations, mapped to the first event at or after each
/// start time. Which repeating name (≥ 2 starts) marks an iteration:
/// - an optimizer's step (`OPTIMIZER_STEP_ANNOTATION`): the optimizer opens it once per step,
///   so it marks training iterations by the optimizer's own hand, whatever else the program
///   annotated (a region per layer, per micro-batch, per collective, per loaded batch, repeating
///   more often than the step; a region per epoch, less often);
/// - otherwise, regions nest (`record_function` is a context manager), and an iteration is the
///   outermost region that repeats: a name whose every start lies inside an open region of
///   another repeating name is a part of something larger (a layer inside a request), however
///   often it repeats. A region opened once (around the whole run, or the profiler's
///   `ProfilerStep#3`) encloses no iterations of its own and hides nothing;
/// - of those, the most frequent (ties to the first by name).
///
/// The annotation list is in the order the program opened and closed its regions (times are
/// microseconds and can tie), so one walk over it tells which regions are open at each start;
/// an END closes the latest open region of its name. Annotations without a time are left out.
/// Linear in the annotations, however many names they have.
fn annotation_iterations(events: &[TraceEvent], annotations: &[Annotation]) -> Option<(String, Vec<u32>)> {
    if events.iter().all(|e| e.time_us == NO_TIME) {
        return None;
    }
    let timed = || annotations.iter().filter(|a| a.time_us != NO_TIME);
    // Per name: starts, regions open now, and whether every start so far lay inside another
    // repeating name's open region.
    #[derive(Default)]
    struct Name {
        starts: usize,
        open: usize,
        always_inside: bool,
    }
    let mut names: rustc_hash::FxHashMap<&str, Name> = Default::default();
    for a in timed().filter(|a| a.start) {
        names.entry(&a.name).or_insert(Name { always_inside: true, ..Name::default() }).starts += 1;
    }
    let repeats = |n: &Name| n.starts >= 2;
    let mut open_repeating = 0usize;
    for a in timed() {
        let Some(n) = names.get_mut(a.name.as_str()).filter(|n| repeats(n)) else { continue };
        if a.start {
            if open_repeating == n.open {
                n.always_inside = false;
            }
            n.open += 1;
            open_repeating += 1;
        } else if n.open > 0 {
            n.open -= 1;
            open_repeating -= 1;
        }
    }
    let pick = |keep: &dyn Fn(&str, &Name) -> bool| {
        names
            .iter()
            .filter(|(name, n)| repeats(n) && keep(name, n))
            .max_by(|a, b| a.1.starts.cmp(&b.1.starts).then(b.0.cmp(a.0)))
            .map(|(name, _)| *name)
    };
    let name =
        pick(&|name, _| name.starts_with(OPTIMIZER_STEP_ANNOTATION)).or_else(|| pick(&|_, n| !n.always_inside))?;
    let at = |time_us: i64| events.partition_point(|e| e.time_us == NO_TIME || e.time_us < time_us) as u32;
    let mut starts: Vec<u32> = timed().filter(|a| a.start && a.name == name).map(|a| at(a.time_us)).collect();
    if name.starts_with(OPTIMIZER_STEP_ANNOTATION) {
        let ends: Vec<u32> = timed().filter(|a| !a.start && a.name == name).map(|a| at(a.time_us)).collect();
        let k = optimizers_in_turn(events, &starts, &ends);
        if k > 1 {
            starts = starts.into_iter().step_by(k).collect();
        }
    }
    let mut bounds: Vec<u32> = starts.into_iter().filter(|&i| (i as usize) < events.len()).collect();
    bounds.sort_unstable();
    bounds.dedup();
    (bounds.len() >= 2).then(|| (name.to_string(), bounds))
}

/// Optimizers of one class that step in turn each iteration are looked for up to this many (a
/// GAN's discriminator and generator: two; an actor, a critic and an entropy temperature: three).
const MAX_OPTIMIZERS_IN_TURN: usize = 4;

/// How many optimizers of one class step in turn per iteration, from their step regions
/// (`starts[i]..ends[i]`, event indices): 1 unless told otherwise.
///
/// Mechanism: every optimizer of a class opens the same annotation (`Optimizer.step#Adam.step`),
/// so two of them make two regions per iteration. What each step allocates is shaped by its own
/// parameters (Adam's foreach temporaries are one per parameter, of its size), the same from
/// one of its steps to the next once its state exists (its first step also makes the state). So
/// `k` optimizers stepping in turn make a sequence of allocation sizes that repeats with period
/// `k`, and whose `k` members differ with neither containing the other, since the parameter sets
/// are disjoint. One optimizer whose parameters get gradients on alternate steps only (an
/// auxiliary head trained every other step, s47) also alternates, but its smaller step is part
/// of its larger one: not two optimizers. Steps that allocate nothing (SGD without momentum,
/// fused kernels) are all alike and leave 1. Checked from the third round on (the first
/// two may make state), over at least one whole round. Regions that are not one after the
/// other (an end before its start, or after the next start: a file's own annotations may say
/// anything) leave 1, so the work is at most one look at each event.
fn optimizers_in_turn(events: &[TraceEvent], starts: &[u32], ends: &[u32]) -> usize {
    let in_order = starts.len() == ends.len()
        && starts.iter().zip(ends).all(|(s, e)| s <= e)
        && ends.iter().zip(starts.iter().skip(1)).all(|(e, next)| e <= next);
    if !in_order {
        return 1;
    }
    let sizes: Vec<Vec<u64>> = starts
        .iter()
        .zip(ends)
        .map(|(&s, &e)| {
            let mut v: Vec<u64> = events[(s as usize).min(events.len())..(e as usize).min(events.len())]
                .iter()
                .filter(|ev| ev.action() == Action::Alloc)
                .map(|ev| ev.size)
                .collect();
            v.sort_unstable();
            v
        })
        .collect();
    let n = sizes.len();
    (2..=MAX_OPTIMIZERS_IN_TURN)
        .take_while(|&k| n >= 3 * k)
        .find(|&k| {
            let periodic = (2 * k..n).all(|i| sizes[i] == sizes[i - k]);
            let round = &sizes[2 * k..3 * k];
            let distinct =
                round.iter().enumerate().all(|(a, x)| round.iter().enumerate().all(|(b, y)| a == b || !contains(y, x)));
            periodic && distinct
        })
        .unwrap_or(1)
}

/// Whether sorted multiset `big` contains sorted multiset `small`.
fn contains(big: &[u64], small: &[u64]) -> bool {
    let mut it = big.iter();
    small.iter().all(|s| it.by_ref().any(|b| b == s))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One allocation per microsecond, 0..n.
    fn events(n: i64) -> Vec<TraceEvent> {
        (0..n)
            .map(|t| {
                let mut e = TraceEvent::new(Action::Alloc, t as u64);
                e.time_us = t;
                e
            })
            .collect()
    }

    fn region(out: &mut Vec<Annotation>, name: &str, from: i64, to: i64) {
        for (start, time_us) in [(true, from), (false, to)] {
            out.push(Annotation { name: name.into(), start, device: 0, time_us });
        }
    }

    /// Steps of 100 µs: six "block" regions in the forward (not inside any other region), then
    /// the optimizer's step. The optimizer's step marks the iterations, not the blocks.
    #[test]
    fn per_layer_regions_do_not_make_iterations_when_an_optimizer_steps() {
        let mut ann = Vec::new();
        for step in 0..4 {
            let t0 = step * 100;
            for layer in 0..6 {
                region(&mut ann, "block", t0 + 10 * layer, t0 + 10 * layer + 8);
            }
            region(&mut ann, "Optimizer.step#AdamW.step", t0 + 80, t0 + 90);
        }
        let (name, bounds) = annotation_iterations(&events(400), &ann).unwrap();
        assert_eq!(name, "Optimizer.step#AdamW.step");
        assert_eq!(bounds, vec![80, 180, 280, 380]);
    }

    /// A program that wraps each step in a region of its own: what repeats inside it (a region
    /// per micro-batch, opened three times a step) is part of the step, though more frequent;
    /// and a region that starts in the same microsecond as the step's is still inside it, by
    /// the order of the list.
    #[test]
    fn regions_inside_a_repeating_region_are_parts_of_its_iterations() {
        let mut ann = Vec::new();
        for step in 0..3 {
            let t0 = step * 100;
            ann.push(Annotation { name: "train_step".into(), start: true, device: 0, time_us: t0 });
            for mb in 0..3 {
                region(&mut ann, "micro_batch", t0 + 20 * mb, t0 + 20 * mb + 15);
            }
            ann.push(Annotation { name: "train_step".into(), start: false, device: 0, time_us: t0 + 90 });
        }
        let (name, bounds) = annotation_iterations(&events(300), &ann).unwrap();
        assert_eq!(name, "train_step");
        assert_eq!(bounds, vec![0, 100, 200]);
    }

    /// Regions per epoch around the optimizer's steps repeat too, less often: the steps mark
    /// the iterations.
    #[test]
    fn an_optimizer_step_inside_epoch_regions_still_marks_the_iterations() {
        let mut ann = Vec::new();
        for epoch in 0..2 {
            let t0 = epoch * 200;
            ann.push(Annotation { name: "epoch".into(), start: true, device: 0, time_us: t0 });
            for step in 0..4 {
                region(&mut ann, "Optimizer.step#SGD.step", t0 + 50 * step + 40, t0 + 50 * step + 45);
            }
            ann.push(Annotation { name: "epoch".into(), start: false, device: 0, time_us: t0 + 199 });
        }
        let (name, bounds) = annotation_iterations(&events(400), &ann).unwrap();
        assert_eq!(name, "Optimizer.step#SGD.step");
        assert_eq!(bounds, vec![40, 90, 140, 190, 240, 290, 340, 390]);
    }

    /// A region opened once, around the whole run, hides nothing: the requests inside it are
    /// the iterations, not the layers inside them.
    #[test]
    fn a_region_opened_once_encloses_no_iterations() {
        let mut ann = Vec::new();
        ann.push(Annotation { name: "serve".into(), start: true, device: 0, time_us: 0 });
        for k in 0..5 {
            ann.push(Annotation { name: "request".into(), start: true, device: 0, time_us: k * 50 });
            for layer in 0..4 {
                region(&mut ann, "layer", k * 50 + 10 * layer, k * 50 + 10 * layer + 5);
            }
            ann.push(Annotation { name: "request".into(), start: false, device: 0, time_us: k * 50 + 45 });
        }
        let (name, bounds) = annotation_iterations(&events(400), &ann).unwrap();
        assert_eq!(name, "request");
        assert_eq!(bounds, vec![0, 50, 100, 150, 200]);
    }

    /// Steps of 100 µs, each with two optimizer steps of one class (`Optimizer.step#Adam.step`)
    /// at +40 and +80, whose events (one per microsecond) allocate `first(i)` and `second(i)`
    /// bytes at their i-th microsecond, or free where that is `None`. The first step of each
    /// also makes state (other sizes).
    fn two_steps_per_iteration(first: impl Fn(i64) -> Option<u64>, second: impl Fn(i64) -> Option<u64>) -> Vec<u32> {
        let mut ev = events(800);
        for e in &mut ev {
            let (step, at) = (e.time_us / 100, e.time_us % 100);
            let size = match at {
                40..=49 => first(at - 40),
                80..=89 => second(at - 80),
                _ => Some(7),
            };
            match size {
                Some(n) => e.size = n + 1000 * u64::from(step == 0 && at >= 40),
                None => e.set_action(Action::FreeCompleted),
            }
        }
        let mut ann = Vec::new();
        for step in 0..8 {
            region(&mut ann, "Optimizer.step#Adam.step", step * 100 + 40, step * 100 + 50);
            region(&mut ann, "Optimizer.step#Adam.step", step * 100 + 80, step * 100 + 90);
        }
        annotation_iterations(&ev, &ann).unwrap().1
    }

    /// A GAN's discriminator and generator, both Adam: their steps allocate for disjoint
    /// parameters (sizes 100.. and 200..), so every other step starts an iteration.
    #[test]
    fn two_optimizers_of_one_class_stepping_in_turn_make_one_iteration() {
        let bounds = two_steps_per_iteration(|i| Some(100 + i as u64), |i| Some(200 + i as u64));
        assert_eq!(bounds, vec![40, 140, 240, 340, 440, 540, 640, 740]);
    }

    /// A file whose step regions end before they start, or overlap, is read as one optimizer,
    /// without looking into them (no slice out of order, no quadratic walk).
    #[test]
    fn step_regions_out_of_order_are_one_optimizer() {
        let ev = events(100);
        assert_eq!(optimizers_in_turn(&ev, &[50, 10], &[40, 20]), 1);
        assert_eq!(optimizers_in_turn(&ev, &[0, 10, 20, 30, 40, 50], &[100; 6]), 1);
        assert_eq!(optimizers_in_turn(&ev, &[0, 10], &[5]), 1);
    }

    /// One optimizer whose second step in each iteration updates fewer parameters (a head
    /// trained every other step): the smaller step's sizes are part of the larger's, so both
    /// are its steps, as a second optimizer's would not be.
    #[test]
    fn one_optimizer_updating_a_subset_on_alternate_steps_is_not_two() {
        let bounds = two_steps_per_iteration(|i| Some(100 + i as u64), |i| (i < 5).then(|| 100 + i as u64));
        assert_eq!(bounds.len(), 16, "{bounds:?}");
    }
}
