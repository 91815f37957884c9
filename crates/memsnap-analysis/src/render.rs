//! The words of a suspect, rendered from its typed facts. Nothing here decides anything.

use memsnap_model::{agree, format_bytes, plural};

use crate::cache::AllocatorCache;
use crate::evidence::{Evidence, GradientHold, GraphHold, LeakOrigin, Occurrence, OomCause, Severity, Suspect};
use crate::site::Site;

fn site(s: &Option<Site>) -> String {
    s.as_ref().map_or("an unknown line".to_string(), |s| s.short())
}

/// `1 forward pass`, `2 forward passes`.
fn forward_passes(n: usize) -> String {
    plural(n as u64, "forward pass", "forward passes")
}

/// The shared tail: what the memory does over time and what the peak would be without it.
fn numbers(s: &Suspect, peak: u64) -> String {
    let mut parts = Vec::new();
    match s.severity {
        Severity::Leak => {
            parts.push(format!("{} still allocated when the snapshot was taken", format_bytes(s.bytes, 2)));
            if let Some(g) = s.growth_bytes_per_iteration {
                parts.push(format!("growing by {} per {} (median)", format_bytes(g, 2), s.growth_unit.name()));
            }
        }
        Severity::Held => parts.push(format!(
            "{} held at the dump; whether it grows is not known (the file records no allocation: record with `enabled=\"all\"` to tell)",
            format_bytes(s.bytes, 2)
        )),
        Severity::Peak => parts.push(format!("up to {} held at once, released later", format_bytes(s.bytes, 2))),
        Severity::Waste => parts.push(format!("{} held, bounded", format_bytes(s.bytes, 2))),
    }
    if let Some(w) = s.peak_without {
        if w < peak {
            parts.push(format!("peak {}, {} without this", format_bytes(peak, 2), format_bytes(w, 2)));
        }
    }
    if let Some(it) = &s.iterations {
        if matches!(s.severity, Severity::Leak) && s.growth_unit == Occurrence::Iteration {
            let by = match (it.source, &it.site, &it.annotation) {
                ("annotation", _, Some(a)) => format!("the annotation {:?}", memsnap_model::clip(a)),
                ("backward", Some(l), _) => format!("the backward pass at {}", l.short()),
                ("forward", Some(l), _) => format!("the forward call at {}", l.short()),
                ("loop", Some(l), _) => format!("the loop's statement at {}", l.short()),
                _ => "repeated calls".to_string(),
            };
            parts.push(format!("iterations delimited by {by}"));
        }
    }
    parts.join("; ")
}

pub fn evidence(s: &Suspect, peak: u64) -> String {
    let tail = numbers(s, peak);
    match &s.facts {
        Evidence::RetainedGraph {
            hold,
            graphs,
            held_blocks,
            forward_call,
            backward_line,
            root,
            held_lines,
            operations,
            input_lines,
        } => {
            let lines = if held_lines.is_empty() {
                String::new()
            } else {
                format!(", saved at {}", held_lines.iter().map(|l| l.short()).collect::<Vec<_>>().join(", "))
            };
            let n = graphs.unwrap_or_default() as u64;
            let held = plural(*held_blocks, "saved tensor", "saved tensors");
            // The words of a hold a reference keeps: "their graphs (N saved tensors, saved at …)
            // were" still alive, so a reference keeps "them, rooted at …".
            let still_alive =
                format!("{} ({held}{lines}) {}", agree(n, "its graph", "their graphs"), agree(n, "was", "were"));
            let kept = format!(
                "{}{}",
                agree(n, "it", "them"),
                root.as_ref().map_or(String::new(), |r| format!(", rooted at the value made at {}", r.short()))
            );
            let head = match hold {
                GraphHold::RetainedByBackward => format!(
                    "The backward pass at {} ran right after {} (called at {}) and freed none of {} {}{}: the graph was kept (`retain_graph=True`, or `create_graph=True`, which implies it).",
                    site(backward_line),
                    if n == 1 { forward_passes(graphs.unwrap_or_default()) } else { format!("each of {}", forward_passes(graphs.unwrap_or_default())) },
                    site(forward_call),
                    agree(n, "its", "their"),
                    held,
                    lines
                ),
                GraphHold::RetainedThenKept => format!(
                    "The backward pass at {} ran right after {} (called at {}) and kept {} (`retain_graph=True`, or `create_graph=True`), and another backward went through the same {} before any other pass ran, so that was needed; yet {} still alive after the step, so a reference keeps {}.",
                    site(backward_line),
                    if n == 1 { forward_passes(graphs.unwrap_or_default()) } else { format!("each of {}", forward_passes(graphs.unwrap_or_default())) },
                    site(forward_call),
                    agree(n, "its graph", "their graphs"),
                    agree(n, "graph", "graphs"),
                    still_alive,
                    kept
                ),
                GraphHold::KeptReference => format!(
                    "{} called at {} ran with grad enabled and no backward; {} still alive two passes later, so a reference keeps {}.",
                    forward_passes(graphs.unwrap_or_default()),
                    site(forward_call),
                    still_alive,
                    kept
                ),
                GraphHold::SkippedBackward => format!(
                    "{} called at {} ran with grad enabled, between passes of the same code that a backward consumed, and {} backward never ran (the step left between forward and backward: an exception, a `continue`); {} still alive two passes later, so a reference keeps {}.",
                    forward_passes(graphs.unwrap_or_default()),
                    site(forward_call),
                    agree(n, "its", "their"),
                    still_alive,
                    kept
                ),
                GraphHold::SeenAtDump => format!(
                    "{} alive at the dump were made by {} inside the model call at {}{}, each several times{}{}: what autograd saves for a backward, so the graphs of several passes are alive, and a reference to a tensor that carries them (a loss or an output kept without `.item()` / `.detach()`) keeps them. This is read from the dump alone (the trace has no stacks, as with `context=\"state\"`, or there is no trace), so which reference keeps them, and whether a backward ran, the file cannot say.",
                    plural(*held_blocks, "block", "blocks"),
                    plural(operations.unwrap_or_default() as u64, "operation", "different operations"),
                    site(forward_call),
                    lines,
                    graphs.map_or(String::new(), |k| format!(", in {}", plural(k as u64, "iteration", "iterations"))),
                    if input_lines.is_empty() {
                        String::new()
                    } else {
                        format!(
                            ", with the passes' inputs made before each pass at {} (a model's first layer saves its input, a loss its target; if the code also keeps them, they stay when the graphs are let go)",
                            input_lines.iter().map(|s| s.short()).collect::<Vec<_>>().join(", ")
                        )
                    },
                ),
                GraphHold::AwaitingBackward => format!(
                    "{} called at {} built {} ({}{}) for a backward that had not run when the trace ended{}.",
                    forward_passes(graphs.unwrap_or_default()),
                    site(forward_call),
                    agree(n, "a graph", "graphs"),
                    held,
                    lines,
                    root.as_ref().map_or(String::new(), |r| format!(
                        "; {} kept through the value made at {}",
                        agree(n, "it is", "they are"),
                        r.short()
                    ))
                ),
            };
            format!("{head} {tail}.")
        }
        Evidence::NoGradMissing {
            passes,
            windows,
            survived_blocks,
            pass_blocks,
            saved_bytes_per_pass,
            call_site,
            reached_from,
            graphs_held,
        } => format!(
            "{} called at {} ({}{}) {} never followed by a backward that used {}, yet {} of the {} a pass allocates outlived it ({} per pass): autograd saved {} for a backward that never comes{}. {tail}.",
            forward_passes(*passes),
            site(call_site),
            plural(*windows as u64, "evaluation window", "evaluation windows"),
            reached_from.as_ref().map_or(String::new(), |r| format!(
                "; reached from {}, which no training pass goes through: the call also serves training",
                r.short()
            )),
            agree(*passes as u64, "was", "were"),
            agree(*passes as u64, "it", "them"),
            survived_blocks,
            plural(u64::from(*pass_blocks), "block", "blocks"),
            format_bytes(*saved_bytes_per_pass, 2),
            agree(u64::from(*survived_blocks), "it", "them"),
            if *graphs_held { ", and the graphs are kept afterwards" } else { "" }
        ) + &if s.severity == Severity::Waste {
            format!(
                " They did not set the peak ({}, reached elsewhere), but held {:.0}% of it at their height, for nothing: a larger batch here would set it.",
                format_bytes(peak, 2),
                100.0 * s.bytes as f64 / peak.max(1) as f64
            )
        } else {
            String::new()
        },
        Evidence::ReferenceLeak {
            origin,
            blocks,
            occurrences,
            eligible,
            occurrence,
            made_at,
            before_trace,
            operations,
            tensors,
            cleared,
            level,
            kept_with,
        } => {
            let what = match origin {
                LeakOrigin::TrainedForward => "outputs or intermediates of forward passes whose graphs a backward already freed, so no graph that a backward ran through holds them: a reference does, or the graph of a value made from them that no backward ran through (a statistic of an activation kept without `.detach()`)",
                LeakOrigin::NoGradForward => "outputs of forward passes run without grad (or tensors the code right after them made from them), so no graph holds them",
                LeakOrigin::ReleasedGraphForward => "outputs or inputs of forward passes run with grad that no backward ran through, kept after their graphs were let go (a detached output, the batch), so no graph holds them",
                LeakOrigin::UserCode => "tensors made at this line outside any model call",
                LeakOrigin::LeafGradients => "gradients that the backward at this line gave to tensors your code made with `requires_grad=True` (or `requires_grad_()`) and keeps: a leaf's `.grad` has the leaf's size and lives as long as the leaf (each kept beside a kept tensor of its size that your code made before the backward)",
                LeakOrigin::WorkerThread => "tensors that a thread the program started (`threading.Thread`, a thread pool's worker) made at this line, beside the main loop (a model call there counts as the worker's, not as a pass of the loop's)",
                LeakOrigin::GradResults => "gradients that `torch.autograd.grad` (here or under `torch.func.grad`) computed at this line and returned, of no parameter's size (with respect to inputs or activations, or per example under `vmap`): the caller keeps them",
                LeakOrigin::Backward => "tensors made by the autograd engine that are not parameter gradients (the gradient of an activation, as a backward hook receives it, or as `retain_grad()` keeps it in the activation's `.grad` for as long as the activation lives)",
                LeakOrigin::OptimizerState => "optimizer state (moments, momentum buffers) that the step at this line made for parameters it had not seen before, in every iteration: the optimizer is handed new parameters each iteration (`add_param_group` in the loop, a new tensor in its parameter list) and keeps them and their state",
                LeakOrigin::OptimizerStateRemade => "optimizer state (moments, momentum buffers) that the step at this line made again for the same parameters (the sizes of the first state made again, and no more gradients alive than the first time but for parameters new since): a new optimizer is made every few iterations (a restart, one per epoch or task) while the earlier ones stay referenced, each with its state",
                LeakOrigin::OptimizerStateOrphaned => "optimizer state (moments, momentum buffers) that the step at this line made for parameters that were freed afterwards (no tensor of its sizes but optimizer state is alive at the end): an optimizer holds its parameters, so this state is kept without its optimizer, once per model let go; `Optimizer.state_dict()` returns the live state tensors, not copies",
                LeakOrigin::OptimizerKeepsPerStep => "tensors that your code, run by the optimizer's `step` (a `step` you wrote, or a hook registered on it), made at this line in every iteration, of the same sizes, for the same parameters (no more gradients were alive than the first time, so no new parameters needed state): state is made once per parameter, so that code keeps something each time the step runs (a list of updates, gradients or parameter copies, a history)",
                LeakOrigin::ModelsKept => "parameters and buffers of a model built at this line (`Module.__init__`, `.to()`/`.cuda()`, `copy.deepcopy(model)`) again and again, every copy still allocated: each model built is kept (a list of trained models or of results that hold them, a dict of checkpoints), not only the one the loop variable holds (with its parameters' `.grad`, where a backward made them)",
                LeakOrigin::OptimizerHistory => "L-BFGS's history of update directions, made by the step at this line: each step keeps a new pair of vectors the size of all parameters, up to `history_size` pairs (100 by default), then drops the oldest, so it grows by design until then and is bounded",
                LeakOrigin::Unattributed => "tensors recorded without stacks, so the line that made them cannot be named",
                LeakOrigin::Regrown => "one tensor re-made larger from the previous one each time (as `x = torch.cat([x, new])` does): each allocation frees the one before it, yet the live tensor grows and is never let go",
                LeakOrigin::StateOnly => "live at the dump from this one line (the file has no trace: this rests on the dump-time state only)",
                LeakOrigin::DumpStacksOnly => "live at the dump from this one line (the trace carries no stacks, as with `context=\"state\"`: only the dump's blocks name their lines, so this rests on the dump-time state)",
            };
            if matches!(origin, LeakOrigin::StateOnly | LeakOrigin::DumpStacksOnly) {
                let ops = operations.map_or(String::new(), |n| format!(
                    " They were made by {n} different operations inside the model call, each several times, as autograd's saved tensors are, but the trace shows none of the statistics a norm saves for its backward (two blocks of one size made one right after the other), which no hook or output list ever sees: so they read as outputs kept per module (a forward hook on every module, a per-layer log); if nothing keeps module outputs, they are the graphs of a model that saves no such statistics (no norm layer, or norms in eval mode), kept by a loss or an output stored without `.item()` / `.detach()`."
                ));
                // Without stacks in the trace, its events still say when each block was made.
                let when = if *origin == LeakOrigin::DumpStacksOnly && *occurrences > 0 && *eligible > 0 {
                    format!(
                        " The trace's events at their addresses say when they were made: in {} of {}.",
                        occurrences,
                        plural(*eligible as u64, occurrence.name(), occurrence.plural_name())
                    )
                } else {
                    String::new()
                };
                format!("{} {what}.{when}{ops} {tail}.", plural(*blocks, "block", "blocks"))
            } else if *origin == LeakOrigin::Regrown {
                // One block of each tensor's chain is alive at a time: the words count the
                // versions, and the tensors when the line re-makes several.
                let of = match tensors.unwrap_or(1) {
                    1 => "one tensor".to_string(),
                    n => format!("{n} tensors, one per call of this line in a pass (each layer that runs it),"),
                };
                format!(
                    "{} of {of} from {} of {}, the last still allocated at the end: {what}. {tail}.",
                    plural(*blocks, "version", "versions"),
                    occurrences,
                    plural(*eligible as u64, occurrence.name(), occurrence.plural_name()),
                )
            } else {
                // The optimizer itself holds L-BFGS's history, by design.
                let held = if *origin == LeakOrigin::OptimizerHistory {
                    String::new()
                } else {
                    format!("; a reference outlives each {}", occurrence.name())
                };
                let earlier = before_trace.map_or(String::new(), |bt| format!(
                    " A further {} ({}) of the sizes it keeps, alive at the dump, {} made by this line before the trace began (the dump's stacks say so; the trace starts mid-run): what is kept is likely more than the trace shows.",
                    plural(bt.blocks, "block", "blocks"),
                    format_bytes(bt.bytes, 2),
                    agree(bt.blocks, "was", "were")
                ));
                // Let go only by resets: what the dump shows is one period's worth.
                let resets = cleared.map_or(String::new(), |c| format!(
                    " Before these, the line let go of all it had kept at once ({} in the trace, the longest after {}: a list emptied or an accumulator set back at an epoch's end), then kept one per iteration again: the level rises through every period, by as much again for each iteration the period has.",
                    plural(c.clears as u64, "reset", "resets"),
                    plural(c.longest_period as u64, "iteration", "iterations")
                ));
                // A store that overwrites what it holds, and holds more at every start.
                let rising = level.map_or(String::new(), |l| format!(
                    " The line let go of {} of its tensors in the trace, each as a new one took its place (an entry overwritten, a slot rebound), so few {} kept any to the end; yet at the start of each {} it held more: {} ({}) at the first, {} ({}) at the last, more bytes than ever before at the start of {} of the last {}. A store that gains entries while it updates those it has (a dict gaining keys, a list appended to beside its slots), not a cache at its capacity, which holds as much from one {} to the next.",
                    l.let_go,
                    occurrence.plural_name(),
                    occurrence.name(),
                    plural(l.first_blocks, "tensor", "tensors"),
                    format_bytes(l.first_bytes, 2),
                    plural(l.last_blocks, "tensor", "tensors"),
                    format_bytes(l.last_bytes, 2),
                    l.new_highs,
                    plural(l.later as u64, occurrence.name(), occurrence.plural_name()),
                    occurrence.name()
                ));
                // Lines kept in the same occurrences, each too small alone: one record.
                let with = if kept_with.is_empty() {
                    String::new()
                } else {
                    format!(
                        " They count those made at {}, kept in exactly the same {}: one record holding them all (a tuple or dict appended each time, as a replay buffer's transition), each line's share too small to report alone.",
                        kept_with.iter().map(Site::short).collect::<Vec<_>>().join(", "),
                        occurrence.plural_name()
                    )
                };
                format!(
                    "{} from {} of {} {} still allocated at the end: {what}{held}.{}{rising}{with}{resets}{earlier} {tail}.",
                    plural(*blocks, "block", "blocks"),
                    occurrences,
                    plural(*eligible as u64, occurrence.name(), occurrence.plural_name()),
                    agree(*blocks, "is", "are"),
                    made_at.as_ref().map_or(String::new(), |m| format!(
                        " The largest was made inside the model, at {}: what keeps it took it from what the call here returned, or the model's own code keeps it.",
                        m.short()
                    ))
                )
            }
        }
        Evidence::UnreleasedGradient { hold, blocks, backward_line, released_at } => match hold {
            GradientHold::KeptEachStep { blocks_per_step, distinct_sizes, sets_before_trace, .. } => format!(
                "{} allocated by the backward pass at {} ({} per step, of {}) {} still allocated{}: gradients of every step kept. {tail}.",
                plural(*blocks, "block", "blocks"),
                site(backward_line),
                blocks_per_step,
                plural(*distinct_sizes as u64, "parameter size", "parameter sizes"),
                agree(*blocks, "is", "are"),
                match sets_before_trace {
                    0 => String::new(),
                    n => format!(
                        ", and {} more like {} without a line, made before the trace began, beyond the model's own copies (parameters, optimizer moments, gradients, an EMA)",
                        n,
                        if *n == 1 { "set" } else { "sets" }
                    ),
                }
            ),
            GradientHold::SeenAtDump { generations, distinct_sizes } => format!(
                "{} alive at the dump have no Python frame (the autograd engine's thread, where a backward makes gradients) and parameters' sizes: for {}, at least {} per parameter, where a program holds one (the current `.grad`), so the gradients of at least {} earlier backward passes are kept. This is read from the dump alone (the trace has no stacks, as with `context=\"state\"`, or there is no trace), so which reference keeps them the file cannot say. {tail}.",
                plural(*blocks, "block", "blocks"),
                plural(*distinct_sizes as u64, "parameter size", "parameter sizes"),
                generations,
                generations.saturating_sub(1)
            ),
            GradientHold::NeverCleared { remade_in, distinct_sizes } => format!(
                "{} of {} made by the first backward pass at {} {} never made again, while the later backward passes made the other gradients again in {}: these parameters require grad, but no optimizer clears their `.grad` (a teacher run with grad, a backbone meant to be frozen), so every backward adds into gradients nothing reads. {tail}.",
                plural(*blocks, "block", "blocks"),
                plural(*distinct_sizes as u64, "parameter size", "parameter sizes"),
                site(backward_line),
                agree(*blocks, "was", "were"),
                plural(*remade_in as u64, "iteration", "iterations")
            ),
            GradientHold::ThroughEvaluation { window_start, passes, share_of_allocated, every_step } => {
                // What began, and what the gradients were held through.
                let (began, through) = if *every_step {
                    (
                        "the passes without grad that each step runs (acting, a teacher or target network, an evaluation every step)",
                        "passes that never use",
                    )
                } else {
                    ("evaluation", "a phase that never uses")
                };
                format!(
                    "When {began} began (event {}, {} without backward), {} of parameter sizes from the backward pass at {} {} still allocated ({:.0}% of the most allocated while it ran): gradients held through {through} them. {tail}.",
                    window_start,
                    forward_passes(*passes),
                    plural(*blocks, "block", "blocks"),
                    site(backward_line),
                    agree(*blocks, "was", "were"),
                    100.0 * share_of_allocated
                ) + &released_at.as_ref().map_or(String::new(), |r| {
                    format!(" {} freed only later, by {}.", agree(*blocks, "It was", "They were"), r.short())
                })
            }
        },
        Evidence::Fragmentation {
            reserved,
            allocated,
            inactive_split,
            largest_free_block,
            peak_reserved,
            allocated_at_peak_reserved,
            ..
        } => format!(
            "At dump {} is reserved but only {} allocated; {} ({:.0}% of reserved) is free but inside split segments that also hold live blocks, so neither larger requests nor empty_cache() can use it. Largest free block {}. Reserved peaked at {}{}.",
            format_bytes(*reserved, 2),
            format_bytes(*allocated, 2),
            format_bytes(*inactive_split, 2),
            100.0 * *inactive_split as f64 / (*reserved).max(1) as f64,
            format_bytes(*largest_free_block, 2),
            format_bytes(*peak_reserved, 2),
            allocated_at_peak_reserved.map_or(String::new(), |a| format!(" while {} was allocated", format_bytes(a, 2)))
        ),
        Evidence::Oom {
            count,
            event,
            requested,
            allocated,
            reserved,
            cached_free,
            largest_free_block,
            device_free,
            cause,
            holders,
            user_chain,
        } => {
            let cause = match cause {
                OomCause::FreeBlockLargeEnough => "a free cached block was large enough, so another stream or pool held it".to_string(),
                OomCause::Fragmented => format!(
                    "{} was cached free but the largest free block was only {}: fragmentation",
                    format_bytes(*cached_free, 2),
                    format_bytes(*largest_free_block, 2)
                ),
                OomCause::ProcessLimit => format!(
                    "the device still had {} free, so a per-process limit (`set_per_process_memory_fraction`) or memory outside this allocator stopped it",
                    format_bytes(*device_free, 2)
                ),
                OomCause::DeviceFull => format!("the device had only {} free: the GPU was full", format_bytes(*device_free, 2)),
            };
            let chain: Vec<String> = user_chain.iter().map(|s| s.short()).collect();
            let held: Vec<String> = holders.iter().map(|h| format!("{} {}", format_bytes(h.bytes, 2), h.label)).collect();
            format!(
                "{}; the last one under user code{} asked for {} (event {}) while {} was allocated and {} reserved ({} cached free, largest free block {}); {}. Memory was held by: {}.",
                plural(*count as u64, "OOM event", "OOM events"),
                if chain.is_empty() { String::new() } else { format!(" ({})", chain.join(" <- ")) },
                format_bytes(*requested, 2),
                event,
                format_bytes(*allocated, 2),
                format_bytes(*reserved, 2),
                format_bytes(*cached_free, 2),
                format_bytes(*largest_free_block, 2),
                cause,
                if held.is_empty() { "nothing".to_string() } else { held.join("; ") }
            )
        }
    }
}

pub fn advice(s: &Suspect) -> String {
    match &s.facts {
        Evidence::RetainedGraph { hold: GraphHold::RetainedByBackward, .. } => "Drop `retain_graph=True` unless a second backward through the same graph follows, and `create_graph=True` unless a gradient of the gradients is taken (adapting or probing only to evaluate needs first-order gradients); if the loss or outputs are also stored, store `loss.item()` / `out.detach()`. To carry state across steps (RNN hidden state), `detach()` it at each step.".into(),
        Evidence::RetainedGraph { hold: GraphHold::RetainedThenKept, .. } => "Keeping the graph is needed here (a second backward goes through it), but it must go once the step's last backward ran: store what you log or reuse without its history (`losses.append(loss.detach())`, `loss.item()`), or `del` the tensors that hold it before the next step.".into(),
        Evidence::RetainedGraph { hold: GraphHold::KeptReference, .. } => "Keep numbers, not tensors with history: `losses.append(loss.item())`, `total += loss.item()`, `outs.append(out.detach().cpu())`; and run evaluation under `torch.no_grad()` so no graph is built.".into(),
        Evidence::RetainedGraph { hold: GraphHold::SkippedBackward, .. } => "Let go of a skipped step's tensors: keep `str(e)` or `e.with_traceback(None)`, not the caught exception (its traceback holds the frames whose locals hold the loss and outputs), and `del` or `.item()` the loss and outputs before skipping; `no_grad` is not the fix, this code path trains.".into(),
        Evidence::RetainedGraph { hold: GraphHold::SeenAtDump, .. } => "Keep numbers or detached tensors, not tensors with history: `losses.append(loss.item())`, `outs.append(out.detach())`; run evaluation under `torch.no_grad()`; drop `retain_graph=True` where no second backward follows. To see which line keeps the graphs, record with stacks on the trace (`_record_memory_history(enabled=\"all\", context=\"all\")`).".into(),
        Evidence::RetainedGraph { hold: GraphHold::AwaitingBackward, .. } => "Each kept loss holds its whole graph until the backward runs: call `backward()` per micro-batch (gradients accumulate in `.grad`) instead of collecting losses, or run fewer micro-batches per step.".into(),
        Evidence::NoGradMissing { reached_from: Some(r), .. } => format!("Wrap the evaluation at {} in `with torch.no_grad():` (or `torch.inference_mode()`, or decorate its function with `@torch.no_grad()`), not the shared model call, which training needs with grad; keep only detached results: `preds.append(out.argmax(-1).cpu())`, `losses.append(loss.item())`.", r.short()),
        Evidence::NoGradMissing { .. } => "Wrap the whole evaluation loop in `with torch.no_grad():` (or `torch.inference_mode()`), not just the model call, and keep only detached results: `preds.append(out.argmax(-1).cpu())`, `losses.append(loss.item())`.".into(),
        Evidence::ReferenceLeak { origin: LeakOrigin::Unattributed, .. } => "Record with stacks (`torch.cuda.memory._record_memory_history(stacks=\"python\")`) and dump again so memsnap can name the line; meanwhile look for tensors appended to lists or caches every iteration.".into(),
        Evidence::ReferenceLeak { origin: LeakOrigin::Regrown, .. } => "Bound the tensor that grows by concatenation: keep only its last N rows (`x = torch.cat([x, new])[-N:]`), or preallocate a fixed-size ring buffer and write into it (as MoCo's queue does); if every row is needed, move them to the CPU (`new.cpu()`) and concatenate there.".into(),
        Evidence::ReferenceLeak { origin: LeakOrigin::OptimizerState, .. } => "Create parameters and register them with the optimizer once, before the loop: every `add_param_group` (or new tensor in its parameter list) is kept by the optimizer for good, with its state (Adam: two moments the size of the parameter). To reset a parameter, write into it in place (`with torch.no_grad(): p.copy_(init)`); to drop one, remove its group and its `optimizer.state[p]` entry.".into(),
        Evidence::ReferenceLeak { origin: LeakOrigin::OptimizerStateRemade, .. } => "Keep one optimizer and reset it in place to restart (`optimizer.state.clear()`, then set each group's `lr`), or drop every reference to the old optimizer before making the next: a list or dict of optimizers, the LR schedulers built on them (each holds its optimizer), closures and logs. Each optimizer kept keeps its state (Adam: two moments the size of every parameter).".into(),
        Evidence::ReferenceLeak { origin: LeakOrigin::OptimizerStateOrphaned, .. } => "Store the state away from the GPU (`torch.save(opt.state_dict(), path)` at once, or a copy with every state tensor moved by `.cpu()`), or keep only the run you will continue; a stored `state_dict()` keeps the optimizer's moments on the GPU after the model and optimizer are deleted.".into(),
        Evidence::ReferenceLeak { origin: LeakOrigin::OptimizerKeepsPerStep, .. } => "Keep in the optimizer (or its step hook) only what the next step needs, updated in place (`buf.mul_(m).add_(g)`); for a history, store a statistic (`update.norm().item()`) or a CPU copy (`update.detach().cpu()`), or a bounded `collections.deque(maxlen=k)`.".into(),
        Evidence::ReferenceLeak { origin: LeakOrigin::ModelsKept, .. } => "Keep what each round needs, not its model: the score (`loss.item()`), the weights on the CPU (`{k: v.cpu() for k, v in model.state_dict().items()}`) or on disk (`torch.save(model.state_dict(), path)`); keep at most the best model on the GPU and drop the others with their optimizers and schedulers. A model that must stay should not keep its gradients: `model.zero_grad(set_to_none=True)` before storing it.".into(),
        Evidence::ReferenceLeak { origin: LeakOrigin::OptimizerHistory, .. } => "Nothing leaks: L-BFGS stops growing at `history_size` pairs. To hold less, lower it (`torch.optim.LBFGS(params, history_size=k)`: about 2 × k × the parameters' bytes, plus the flat gradient).".into(),
        Evidence::ReferenceLeak { origin: LeakOrigin::GradResults, .. } => "Keep what the gradients are needed for, not the gradients: a norm or a score (`g.norm().item()`), or `g.detach().cpu()`; drop the returned tensors (and whatever holds them: a list, a dict, a log) once they are used.".into(),
        Evidence::ReferenceLeak { origin: LeakOrigin::LeafGradients, .. } => "Store the leaf without its gradient: `t.detach()` (or `t.detach().cpu()`) rather than `t`, or set `t.grad = None` once the gradient is used; a kept leaf keeps its `.grad`.".into(),
        Evidence::ReferenceLeak { origin: LeakOrigin::WorkerThread, .. } => "Bound what the worker hands over and what it collects: a `queue.Queue(maxsize=k)` makes a producer wait for the loop; keep numbers or CPU copies (`out.argmax(1).cpu()`, `loss.item()`) rather than GPU tensors, and clear what it gathers once it is used. Grad mode is per thread: a `torch.no_grad()` in the main thread does not cover a worker's model calls, so enter it inside the thread's function.".into(),
        Evidence::ReferenceLeak { origin: LeakOrigin::Backward, .. } => "Look for backward hooks (`register_full_backward_hook`, `Tensor.register_hook`) that store tensors, and for activations that were given `retain_grad()` and are kept (their `.grad` goes with them); keep `t.detach().cpu()` or a statistic (`t.norm().item()`), or clear the container every step.".into(),
        Evidence::ReferenceLeak { .. } => "Find what keeps these tensors alive (a forward hook, a dict cache, a closure, a global list) and bound it: clear or evict entries, `del` the reference, or keep `t.detach().cpu()` / a summary statistic instead of the GPU tensor.".into(),
        Evidence::UnreleasedGradient { hold: GradientHold::KeptEachStep { returned_by_grad_call: true, .. }, .. } => "Do not keep the gradients `torch.autograd.grad` returns: store a statistic (`g.norm().item()`) or a CPU copy (`g.detach().cpu()`), or keep only the sets you read again (a `collections.deque(maxlen=2)` for a comparison with the previous step).".into(),
        Evidence::UnreleasedGradient { hold: GradientHold::KeptEachStep { .. } | GradientHold::SeenAtDump { .. }, .. } => "Do not keep references to `.grad` tensors: store `p.grad.norm().item()` or `p.grad.detach().cpu()`, and clear gradients with `optimizer.zero_grad(set_to_none=True)`.".into(),
        Evidence::UnreleasedGradient { hold: GradientHold::NeverCleared { .. }, .. } => "Stop gradients where none is wanted: run a fixed model (a teacher, a target network) under `torch.no_grad()` or detach its output, and freeze what no optimizer trains (`module.requires_grad_(False)`); a parameter outside every optimizer still gets a `.grad` from each backward, and `optimizer.zero_grad()` never clears it.".into(),
        Evidence::UnreleasedGradient { hold: GradientHold::ThroughEvaluation { .. }, .. } => "Release gradients before evaluating: `optimizer.zero_grad(set_to_none=True)` right after `optimizer.step()` (not at the start of the next step, and not `set_to_none=False`).".into(),
        Evidence::Fragmentation { cached_free_at_end, .. } => format!(
            "Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` so segments grow instead of splitting; make tensor sizes uniform (pad or bucket variable-length batches); allocate long-lived tensors up front, not between short-lived ones; call `torch.cuda.empty_cache()` only at phase boundaries. ({} cached free at the end.)",
            format_bytes(*cached_free_at_end, 2)
        ),
        Evidence::Oom { cause: OomCause::Fragmented, .. } => "Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` to avoid fragmentation, or free the largest holders listed in the evidence before this allocation.".into(),
        Evidence::Oom { .. } => "Reduce what is live at this point: the largest holders are listed in the evidence (free them or move them to CPU first); otherwise reduce the batch size or sequence length, use activation checkpointing or mixed precision, or raise the process memory limit.".into(),
    }
}

/// What the allocator's cache holds at the dump and how reserved memory grew, as sentences (see
/// [`crate::cache`] for the mechanism each one rests on).
pub fn cache_words(c: &AllocatorCache) -> Vec<String> {
    let mut out = Vec::new();
    if c.cached_free == 0 {
        out.push(format!(
            "At the dump all {} reserved is allocated: the allocator caches nothing.",
            format_bytes(c.reserved, 2)
        ));
    } else {
        let mut parts = Vec::new();
        if c.free_segment_bytes > 0 {
            parts.push(format!(
                "{} in {} that hold no allocated block",
                format_bytes(c.free_segment_bytes, 2),
                plural(c.free_segments, "segment", "segments")
            ));
        }
        if c.hole_bytes > 0 {
            parts.push(format!(
                "{} in holes of segments that hold live blocks (reused by requests that fit; no call returns them)",
                format_bytes(c.hole_bytes, 2)
            ));
        }
        if c.expandable_free_bytes > 0 {
            parts.push(format!(
                "{} free in expandable segments ({} of it in whole pages, which `empty_cache()` unmaps)",
                format_bytes(c.expandable_free_bytes, 2),
                format_bytes(c.expandable_unmappable_bytes, 2)
            ));
        }
        if c.private_free_bytes > 0 {
            parts.push(format!(
                "{} free in private pools (CUDA graphs, `MemPool`: kept while the pool lives)",
                format_bytes(c.private_free_bytes, 2)
            ));
        }
        if c.pending_free_bytes > 0 {
            parts.push(format!(
                "{} freed but still in use by a stream (cached once its work completes)",
                format_bytes(c.pending_free_bytes, 2)
            ));
        }
        if c.unlisted_bytes > 0 {
            parts.push(format!(
                "{} in no block the segment table lists (its blocks do not cover their segments, which the allocator's always do: the file was not written by PyTorch as it is)",
                format_bytes(c.unlisted_bytes, 2)
            ));
        }
        out.push(format!(
            "At the dump {} is reserved and {} allocated: {} is the allocator's cache of freed blocks, kept for reuse (`nvidia-smi` and `memory_reserved()` count it, `memory_allocated()` does not), not live tensors: {}. `torch.cuda.empty_cache()` would return {} to the driver.",
            format_bytes(c.reserved, 2),
            format_bytes(c.allocated, 2),
            format_bytes(c.cached_free, 2),
            parts.join("; "),
            format_bytes(c.empty_cache_returns, 2)
        ));
    }
    let Some(g) = &c.growth else { return out };
    let mut s = format!(
        "Reserved peaked at {} ({} allocated at that moment; allocated peaked at {}).",
        format_bytes(g.peak_reserved, 2),
        format_bytes(g.allocated_at_peak_reserved, 2),
        format_bytes(g.peak_allocated, 2)
    );
    if g.made > 0 {
        s.push_str(&format!(
            " During the trace {} {} made ({})",
            plural(g.made, "segment", "segments"),
            match (c.expandable, g.made == 1) {
                (true, _) => "or mapped ranges of expandable segments were",
                (false, true) => "was",
                (false, false) => "were",
            },
            format_bytes(g.made_bytes, 2)
        ));
        if g.made_while_cached > 0 {
            s.push_str(&format!(
                ", {} ({}) while at least {} own size sat cached free in {} pool (small or large) on {} stream: the cache had the bytes in blocks that could not take the request, too small or split up (tensor shapes that change between steps, long-lived tensors carved out between short-lived ones)",
                if g.made_while_cached == g.made { "all of them".to_string() } else { format!("{} of them", g.made_while_cached) },
                format_bytes(g.made_while_cached_bytes, 2),
                if g.made_while_cached == 1 { "its" } else { "their" },
                if g.made_while_cached == 1 { "its" } else { "their" },
                if g.made_while_cached == 1 { "its" } else { "their" }
            ));
            if let Some(l) = g.largest_while_cached {
                s.push_str(&format!(
                    "; {} was {}, made at event {} with {} cached free in its pool and stream",
                    if g.made_while_cached > 1 { "the largest" } else { "it" },
                    format_bytes(l.size, 2),
                    l.event_index,
                    format_bytes(l.cached_free_before, 2)
                ));
            }
        }
        s.push('.');
    } else {
        s.push_str(" No segment was made during the trace.");
    }
    if g.released > 0 {
        s.push_str(&format!(
            " {} ({}) {} released during the trace (`empty_cache()`, or the allocator freeing its cache to retry a failed `cudaMalloc`).",
            plural(g.released, "segment", "segments"),
            format_bytes(g.released_bytes, 2),
            if g.released == 1 { "was" } else { "were" }
        ));
    }
    out.push(s);
    if g.excess {
        out.push(format!(
            "Reserved memory peaked {} ({:.0}%) above the most ever allocated at once. Where that matters (an OOM, a GPU shared with other processes): {}padding or bucketing shapes keeps cached blocks reusable; `torch.cuda.empty_cache()` between phases returns segments that hold no allocated block, but does not lower the peak.",
            format_bytes(g.peak_reserved.saturating_sub(g.peak_allocated), 2),
            100.0 * g.peak_reserved.saturating_sub(g.peak_allocated) as f64 / g.peak_reserved.max(1) as f64,
            if c.expandable { "" } else { "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` lets a segment grow in place instead of adding new ones; " }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::SuspectKind;

    #[test]
    fn forward_passes_agree_with_their_count() {
        assert_eq!(forward_passes(1), "1 forward pass");
        assert_eq!(forward_passes(3), "3 forward passes");
    }

    fn leak(blocks: u64, eligible: usize, occurrence: Occurrence) -> Suspect {
        Suspect {
            kind: SuspectKind::ReferenceLeak,
            severity: Severity::Leak,
            confidence: 0.9,
            device: 0,
            bytes: 3 << 20,
            bytes_at_peak: 0,
            peak_without: None,
            growth_bytes_per_iteration: None,
            growth_unit: occurrence,
            site: None,
            stack: Vec::new(),
            iterations: None,
            facts: Evidence::ReferenceLeak {
                origin: LeakOrigin::UserCode,
                blocks,
                occurrences: eligible,
                eligible,
                occurrence,
                made_at: None,
                before_trace: None,
                operations: None,
                tensors: None,
                cleared: None,
                level: None,
                kept_with: Vec::new(),
            },
            evidence: String::new(),
            advice: String::new(),
        }
    }

    #[test]
    fn occurrences_are_counted_in_words() {
        let e = evidence(&leak(3, 3, Occurrence::Pass), 0);
        assert!(e.starts_with("3 blocks from 3 of 3 passes are still allocated"), "{e}");
        let e = evidence(&leak(1, 1, Occurrence::Iteration), 0);
        assert!(e.starts_with("1 block from 1 of 1 iteration is still allocated"), "{e}");
        assert!(e.contains("3.00 MiB still allocated"), "{e}");
    }
}
