//! What each interned stack says about the code that allocated: its site (innermost user
//! frame), the forward call site, and whether it is a backward launch, a forward pass or an
//! optimizer step. Computed once per distinct stack (a file has thousands of stacks, not
//! millions), then looked up per event.

use memsnap_model::{classify_filename, FrameId, FrameKind, Snapshot, StackId};
use rustc_hash::FxHashSet;

/// Facts about one stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackInfo {
    /// Innermost frame of the user's own code.
    pub site: Option<FrameId>,
    /// Outermost frame of the user's own code (the loop body of the script).
    pub outer_site: Option<FrameId>,
    /// The user frame that called the outermost `nn.Module` (the line that runs the model).
    pub forward_call: Option<FrameId>,
    /// The user frame that called the innermost `nn.Module` (the line inside a model's
    /// `forward` that produced the tensor).
    pub module_call: Option<FrameId>,
    /// The user code inside the innermost `nn.Module` call is not the module's `forward` but a
    /// hook the module machinery ran (`register_forward_hook`, a forward pre-hook), or code such
    /// a hook called: `Module.__call__` runs hooks and `forward` from the same functions
    /// (`_call_impl` / its `inner`) but from different lines, so the called user function is the
    /// module's forward when it is named `forward` or called from a line that calls `forward`
    /// elsewhere in the file (a decorated or replaced forward: [`forward_callers`]). What a
    /// hook allocates (`out.clone()` in a debug hook) is the hook's, not the model's, so its line
    /// is the user's own (`site`), not `module_call`.
    pub in_module_hook: bool,
    /// The function the innermost `nn.Module` call ran is a hook, the user's or a library's
    /// (`torch.nn.utils.prune`'s forward pre-hook, which re-makes `weight` from `weight_orig`
    /// and the mask before every forward, `spectral_norm`'s, `weight_norm`'s), not the module's
    /// `forward`: see `in_module_hook`, which is this for the user's own code.
    pub made_by_module_hook: bool,
    /// User code inside the innermost `nn.Module` call (or outside any) runs as a
    /// `__torch_dispatch__` or `__torch_function__` handler: a `TorchDispatchMode`, a
    /// `TorchFunctionMode` or a tensor subclass the user wrote, which PyTorch calls for every
    /// operation from inside the op, not from the model's code. What it keeps of the outputs it
    /// sees (an activation-statistics mode appending every matmul's output: s17) is the
    /// handler's, so, as for a hook, its line is the user's own (`site`).
    pub in_dispatch_handler: bool,
    /// The stack launches a backward pass (`torch.autograd.backward` / `_make_grads`); `site`
    /// is then the `.backward()` line.
    pub backward_launch: bool,
    /// The launch is `torch.autograd.grad` (called directly, or by `torch.func.grad` / `vjp`),
    /// which returns the gradients it computes to its caller instead of adding them into the
    /// leaves' `.grad`.
    pub grad_call: bool,
    /// Inside a call to autograd's Python API for derivatives (`torch.autograd.grad` /
    /// `backward` in `torch/autograd/__init__.py`, `torch.autograd.functional`'s `jacobian`,
    /// `hessian`, `vjp`, `hvp`, or a `torch.func` eager transform), whether or not this
    /// allocation is the launch itself: such a call may prepare its seeds here (the batched
    /// basis of a vectorized `jacobian`) and then launch a backward that allocates nothing
    /// from Python ([`crate::phases`]' silent launches).
    pub in_autograd_api: bool,
    /// Inside `torch.optim`.
    pub optimizer: bool,
    /// The innermost user frame is inside the `torch.optim` call: user code the step ran, i.e.
    /// an optimizer the user wrote (a subclass whose `step` `Optimizer`'s step wrapper calls), a
    /// step hook, or the closure handed to `step(closure)`. For `torch.optim`'s own optimizers
    /// the site is the line that calls `step()`.
    pub optimizer_code: bool,
    /// Inside an `nn.Module` call.
    pub forward: bool,
    /// Passes through a loss function (`cross_entropy`, `*_loss`, …).
    pub loss: bool,
    /// Innermost Python frame (user or library): the operation that allocated.
    pub innermost_python: Option<FrameId>,
    /// Has at least one Python frame (user or library). Stacks of only native frames
    /// (`stacks="all"` backward threads) count as frameless for attribution.
    pub python: bool,
    /// Python code the autograd engine runs during a backward pass, from its own thread: the
    /// stack bottoms out in torch's autograd machinery (`torch/autograd/function.py` `apply`,
    /// saved-tensor hooks, `torch/utils/checkpoint.py`, compiled backwards under
    /// `torch/_functorch`) with no user frame outside it. Activation checkpointing recomputes its
    /// forward regions this way, and `torch.compile` runs its backward this way. So does a
    /// backward formula the dispatcher runs in Python ([`dispatcher_python`]: `torch.func`'s
    /// `vmap` over `grad` runs `nll_loss_backward`'s decomposition on the engine's thread, whose
    /// stack is that decomposition alone: s75). These allocations belong to the backward pass,
    /// not to a forward pass.
    pub recompute: bool,
    /// A hook the autograd engine runs during a backward, from its own thread: the outermost
    /// Python frame is a function of the user's (`Tensor.register_hook`,
    /// `register_post_accumulate_grad_hook`), not a module body, or `torch/utils/hooks.py`'s
    /// (a module's full backward hook). Nothing in Python called it: the main thread's stack
    /// bottoms out in the script's `<module>` (or a launcher's code: `runpy`, pytest), another
    /// Python thread's in `threading`. Its allocations (`g.norm()` in a logging hook: s82)
    /// happen inside the backward pass and do not end it. A library's own engine callbacks
    /// (FSDP's pre- and post-backward hooks) are left as they were: they end the window, and
    /// what FSDP frees in them is its resharding, not the backward freeing a pass (l02).
    pub native_callback: bool,
    /// Run by a thread the program started (`threading.Thread`, a `concurrent.futures` pool):
    /// the outermost Python frame is `threading.py`'s bootstrap. Such a thread (an evaluation
    /// worker, a prefetcher) runs beside the training loop, its events interleaved with the
    /// loop's in one trace ([`crate::phases::Phases::worker_events`]).
    pub worker_thread: bool,
    /// A `torch.func` transform's own code with no user code inside it: the innermost Python
    /// frame is an eager transform's (`grad_and_value_impl`, `vjp`, `vmap`'s wrappers:
    /// [`eager_transform`]).
    /// `torch.func.grad` computes its gradients with `torch.autograd.grad(create_graph=True)`,
    /// so the backward frees none of the graph's saved tensors; the transform releases the
    /// graph when it returns, from these frames, still inside the user's call (ab01: the saved
    /// tensors of each step's functional forward freed right after its backward window).
    pub transform_code: bool,
    /// Run under a `torch.func` transform: some Python frame is an eager transform's
    /// (`transform_code` is the case where the innermost one is).
    pub under_transform: bool,
    /// Inside `torch/optim/lbfgs.py`: L-BFGS keeps the last `history_size` (100 by default)
    /// pairs of update directions, each a flat tensor the size of all parameters, so its state
    /// grows each step until it holds that many, then drops the oldest: bounded by design.
    pub lbfgs: bool,
    /// Model or optimizer construction: `Module.to/cuda/_apply` or a module's `__init__` /
    /// `reset_parameters` (parameters and buffers), or a parameter copied by `copy.deepcopy`, as
    /// opposed to tensors made by running code.
    pub construction: bool,
    /// Made by transformers' KV cache (`transformers/cache_utils.py`, the `Cache` classes'
    /// `update`): the keys and values a model holds between decoding steps, one pair of tensors
    /// per layer, re-made larger each token.
    pub kv_cache: bool,
    /// A forward allocation under activation checkpointing (`torch/utils/checkpoint.py` with
    /// user frames outside it, not the recomputation in a backward): autograd saves only the
    /// checkpointed segments' inputs, and the segments' own tensors die inside the pass.
    pub checkpointed: bool,
    /// The user frames from `forward_call` outwards (the user code path that ran the model),
    /// hashed: two passes with the same value were run by the same code path, line for line.
    /// 0 when the stack is not inside a module call.
    pub caller_chain: u64,
    /// The user frame that called the function holding `forward_call` (one user frame further
    /// out): for a model run in a loop inside a helper (`generate()`), the line that called the
    /// helper.
    pub forward_caller: Option<FrameId>,
    /// User frames inside the outermost `nn.Module` call (0 outside one): 1 when the
    /// allocation is a statement of the model's own `forward` (or of a library module it called
    /// directly), more when it is deeper in the user's submodules or helpers.
    pub model_depth: u8,
}

/// Per-stack facts for a whole snapshot, indexed by `StackId`.
pub struct StackTable {
    pub infos: Vec<StackInfo>,
    pub frame_kinds: Vec<FrameKind>,
    /// The user frames of each stack, innermost first.
    pub user_frames: Vec<Box<[FrameId]>>,
}

impl StackTable {
    pub fn new(snap: &Snapshot) -> StackTable {
        let frame_kinds: Vec<FrameKind> = snap.frames.iter().map(|f| classify_filename(snap.str(f.filename))).collect();
        let forward_callers = forward_callers(snap, &frame_kinds);
        let mut infos: Vec<StackInfo> =
            snap.stacks.iter().map(|s| info(snap, &frame_kinds, &forward_callers, &s.frames)).collect();
        // A callback is told from the main thread's stacks by what they bottom out in; a file
        // none of whose stacks reaches a module body or a launcher (a producer that records only
        // the innermost frames, a synthetic file) cannot tell them apart.
        if !infos.iter().any(|i| i.python && !i.native_callback) {
            infos.iter_mut().for_each(|i| i.native_callback = false);
        }
        let user_frames = snap
            .stacks
            .iter()
            .map(|s| s.frames.iter().copied().filter(|f| frame_kinds[f.0 as usize] == FrameKind::User).collect())
            .collect();
        StackTable { infos, frame_kinds, user_frames }
    }

    /// Does the stack pass through frame `f` (a user frame)?
    pub fn contains(&self, id: StackId, f: FrameId) -> bool {
        self.user_frames.get(id.0 as usize).is_some_and(|u| u.contains(&f))
    }

    /// Is the stack without user frames?
    pub fn userless(&self, id: StackId) -> bool {
        self.user_frames.get(id.0 as usize).is_none_or(|u| u.is_empty())
    }

    pub fn get(&self, id: StackId) -> StackInfo {
        self.infos.get(id.0 as usize).copied().unwrap_or_default()
    }

    pub fn is_user(&self, f: FrameId) -> bool {
        self.frame_kinds.get(f.0 as usize) == Some(&FrameKind::User)
    }
}

fn is_module_call(file: &str, name: &str) -> bool {
    file.ends_with("torch/nn/modules/module.py") && (name == "_call_impl" || name == "_wrapped_call_impl")
}

fn in_module_machinery(snap: &Snapshot, f: FrameId) -> bool {
    snap.str(snap.frame(f).filename).ends_with("torch/nn/modules/module.py")
}

/// The frames of `torch/nn/modules/module.py` (a function at a line: frames are interned by
/// file, line and name) that call a module's `forward`. `Module.__call__` calls `forward` from
/// one line of `_call_impl` (or of its nested `inner` when hooks are registered) and each kind of
/// hook from lines of its own, so the line tells the two apart whatever the called function's
/// name (a forward replaced by a decorated or monkeypatched function). Learned from the file:
/// lines that call a function named `forward` (every library module's), so the rule follows the
/// PyTorch version that wrote it.
fn forward_callers(snap: &Snapshot, kinds: &[FrameKind]) -> FxHashSet<FrameId> {
    let mut callers = FxHashSet::default();
    let mut seen = FxHashSet::default();
    for s in &snap.stacks {
        let mut python = s.frames.iter().copied().filter(|f| kinds[f.0 as usize] != FrameKind::Native).peekable();
        while let Some(f) = python.next() {
            let Some(&outer) = python.peek() else { break };
            if seen.insert((f, outer))
                && snap.str(snap.frame(f).name) == "forward"
                && !in_module_machinery(snap, f)
                && in_module_machinery(snap, outer)
            {
                callers.insert(outer);
            }
        }
    }
    callers
}

/// Python that the dispatcher calls from C++ (decompositions, references, prims): on the main
/// thread the caller's Python frames lie beneath it, so a stack of these frames alone (no user
/// frame outside them) was made on a thread that runs no Python of its own, the autograd
/// engine's, running a backward formula written in Python.
fn dispatcher_python(file: &str) -> bool {
    ["torch/_decomp/", "torch/_refs/", "torch/_prims/", "torch/_prims_common/"].iter().any(|d| file.contains(d))
}

/// `torch.func`'s eager transforms (`grad`, `vjp`, `jacrev`, `vmap` and their wrappers), not
/// `torch.compile`'s AOT autograd, which also lives under `torch/_functorch/` and runs compiled
/// forwards and backwards of its own.
fn eager_transform(file: &str) -> bool {
    ["torch/_functorch/eager_transforms.py", "torch/_functorch/vmap.py", "torch/_functorch/apis.py"]
        .iter()
        .any(|f| file.ends_with(f))
}

fn info(snap: &Snapshot, kinds: &[FrameKind], forward_callers: &FxHashSet<FrameId>, frames: &[FrameId]) -> StackInfo {
    let mut s = StackInfo::default();
    // Frames are innermost first.
    let mut outermost_module: Option<usize> = None;
    let mut autograd_machinery: Option<usize> = None;
    let mut outermost_user: Option<usize> = None;
    let mut outermost_python: Option<(FrameKind, &str, &str)> = None;
    let mut innermost_module: Option<usize> = None;
    for (i, &f) in frames.iter().enumerate() {
        let frame = snap.frame(f);
        let file = snap.str(frame.filename);
        let name = snap.str(frame.name);
        let kind = kinds[f.0 as usize];
        if kind != FrameKind::Native {
            s.python = true;
            if s.innermost_python.is_none() {
                s.innermost_python = Some(f);
            }
        }
        if kind == FrameKind::User {
            if s.site.is_none() {
                s.site = Some(f);
            }
            s.outer_site = Some(f);
            outermost_user = Some(i);
        }
        if kind == FrameKind::Native {
            continue;
        }
        outermost_python = Some((kind, file, name));
        if file.contains("torch/autograd/")
            && (name == "_make_grads" || name == "backward" || name == "_engine_run_backward")
            || file.ends_with("torch/_tensor.py") && name == "backward"
        {
            s.backward_launch = true;
        }
        if file.ends_with("torch/autograd/__init__.py") && name == "grad" {
            s.grad_call = true;
        }
        s.in_autograd_api |= file.ends_with("torch/autograd/__init__.py")
            || file.ends_with("torch/autograd/functional.py")
            || eager_transform(file);
        let checkpoint = file.ends_with("torch/utils/checkpoint.py");
        s.checkpointed |= checkpoint;
        s.under_transform |= eager_transform(file);
        if checkpoint
            || file.contains("torch/autograd/")
            || file.contains("torch/_functorch/")
            || dispatcher_python(file)
        {
            autograd_machinery = Some(i);
        }
        // A parameter's `__deepcopy__` is a model copied (`copy.deepcopy(model)`): a model
        // built, as much as one constructed.
        if file.contains("torch/nn/modules/")
            && matches!(name, "_apply" | "to" | "cuda" | "__init__" | "reset_parameters" | "_load_from_state_dict")
            || file.ends_with("torch/nn/parameter.py") && name == "__deepcopy__"
        {
            s.construction = true;
        }
        if file.ends_with("transformers/cache_utils.py") {
            s.kv_cache = true;
        }
        // Frames run innermost first: a module call met before the optimizer's frame is a
        // forward pass the step's closure ran (a line search's trial evaluations, L-BFGS's
        // function evaluations: `step(closure)`), not the optimizer's own work (i09).
        if file.contains("torch/optim/") && !s.forward {
            s.optimizer_code |= !s.optimizer && s.site.is_some();
            s.optimizer = true;
            s.lbfgs |= file.ends_with("torch/optim/lbfgs.py");
        }
        if kind == FrameKind::User
            && innermost_module.is_none()
            && matches!(name, "__torch_dispatch__" | "__torch_function__")
        {
            s.in_dispatch_handler = true;
        }
        if is_module_call(file, name) {
            s.forward = true;
            outermost_module = Some(i);
            if innermost_module.is_none() {
                innermost_module = Some(i);
            }
        }
        let lname = name.to_ascii_lowercase();
        if file.contains("torch/nn/functional.py")
            && (lname.contains("loss") || lname.contains("entropy") || lname == "nll_loss")
            || file.contains("torch/nn/modules/loss.py")
        {
            s.loss = true;
        }
    }
    s.worker_thread = outermost_python.is_some_and(|(_, file, _)| file.ends_with("/threading.py"));
    s.transform_code = s.innermost_python.is_some_and(|f| eager_transform(snap.str(snap.frame(f).filename)));
    s.native_callback = outermost_python.is_some_and(|(kind, file, name)| {
        kind == FrameKind::User && name != "<module>" || file.ends_with("torch/utils/hooks.py")
    });
    // The engine's thread: autograd machinery is on the stack and every user frame is inside it
    // (what the engine called), none outside it. A backward launched, or a custom
    // `autograd.Function` called, from the user's loop has the user's frames outside the
    // machinery, also under `python -m` or pytest, where the outermost frame is a library's.
    s.recompute = !s.backward_launch && autograd_machinery.is_some_and(|m| outermost_user.is_none_or(|u| u < m));
    s.checkpointed &= !s.recompute && !s.backward_launch;
    let caller_user = |from: usize| frames[from + 1..].iter().copied().find(|f| kinds[f.0 as usize] == FrameKind::User);
    if let Some(i) = outermost_module {
        s.forward_call = caller_user(i);
        let inside = frames[..i].iter().filter(|f| kinds[f.0 as usize] == FrameKind::User).count();
        s.model_depth = inside.min(u8::MAX as usize) as u8;
        if let Some(j) = frames[i + 1..].iter().position(|f| kinds[f.0 as usize] == FrameKind::User) {
            s.forward_caller = caller_user(i + 1 + j);
        }
        // FNV-1a over the user frames outside the outermost module call.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for f in frames[i + 1..].iter().filter(|f| kinds[f.0 as usize] == FrameKind::User) {
            h = (h ^ u64::from(f.0)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        s.caller_chain = h.max(1);
    }
    if let Some(i) = innermost_module {
        s.module_call = caller_user(i);
        // The Python function the module machinery called: the first frame inside the
        // innermost module call that is neither native nor `torch/nn/modules/module.py` itself,
        // and the machinery's frame that called it.
        let python: Vec<FrameId> =
            frames[..=i].iter().copied().filter(|f| kinds[f.0 as usize] != FrameKind::Native).collect();
        let at = python.iter().rposition(|&f| !in_module_machinery(snap, f));
        s.made_by_module_hook = at.is_some_and(|k| {
            let (called, caller) = (python[k], python.get(k + 1).copied());
            snap.str(snap.frame(called).name) != "forward" && !caller.is_some_and(|c| forward_callers.contains(&c))
        });
        s.in_module_hook = s.made_by_module_hook && at.is_some_and(|k| kinds[python[k].0 as usize] == FrameKind::User);
    }
    s
}
