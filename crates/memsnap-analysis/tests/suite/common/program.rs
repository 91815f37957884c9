//! A small PyTorch program as allocator events: a two-block MLP-style network called through
//! `nn.Module`, cross-entropy, `.backward()` (frameless engine allocations after the
//! `torch/autograd` launch), Adam and `zero_grad`, with the stacks PyTorch records
//! (`stacks="python"`: innermost frame first, library frames under `site-packages`).
//!
//! The network (`/home/u/model.py`):
//!
//! ```text
//! 20  class Block(nn.Module):          40  class Net(nn.Module):  def forward(self, idx):
//! 21      h = self.norm(x)             40      x = self.emb(idx)
//! 22      h = self.fc1(h)              42      for blk in self.blocks: x = blk(x)
//! 23      h = self.act(h)   # GELU     43      x = self.norm(x)
//! 24      h = self.fc2(h)              44      return self.head(x)
//! 25      return x + h
//! ```
//!
//! Five distinct operations allocate in a forward pass (innermost Python frames): `embedding`,
//! `layer_norm`, `Linear.forward`, `GELU.forward` and the residual add at `model.py:25`.

use super::{Blk, Fr, TraceBuilder, GRANULE};

macro_rules! torch {
    ($p:literal) => {
        concat!("/usr/lib/python3.11/site-packages/torch/", $p)
    };
}

pub const MODULE: &str = torch!("nn/modules/module.py");
pub const LINEAR: &str = torch!("nn/modules/linear.py");
pub const NORMALIZATION: &str = torch!("nn/modules/normalization.py");
pub const ACTIVATION: &str = torch!("nn/modules/activation.py");
pub const SPARSE: &str = torch!("nn/modules/sparse.py");
pub const FUNCTIONAL: &str = torch!("nn/functional.py");
pub const AUTOGRAD: &str = torch!("autograd/__init__.py");
pub const TENSOR: &str = torch!("_tensor.py");
pub const ADAM: &str = torch!("optim/adam.py");
pub const OPTIMIZER: &str = torch!("optim/optimizer.py");

pub const TRAIN: &str = "/home/u/train.py";
pub const MODEL: &str = "/home/u/model.py";

pub const CALL: Fr = (MODULE, 1750, "_call_impl");
pub const WRAP: Fr = (MODULE, 1739, "_wrapped_call_impl");

/// A frame of the training script's top level.
pub const fn top(line: u32) -> Fr {
    (TRAIN, line, "<module>")
}

/// Frames, innermost first, from parts.
pub fn chain(parts: &[&[Fr]]) -> Vec<Fr> {
    parts.iter().flat_map(|p| p.iter().copied()).collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grad {
    /// Autograd records the graph: saved tensors live until backward (or the graph) frees them.
    Enabled,
    /// `torch.no_grad()`: every intermediate dies as soon as the next operation has used it.
    NoGrad,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroGrad {
    /// `zero_grad(set_to_none=True)`: gradients are freed.
    SetToNone,
    /// `zero_grad(set_to_none=False)`: gradients are zeroed in place and stay allocated.
    InPlace,
    /// `zero_grad(set_to_none=True)` while something else still references the `.grad`
    /// tensors (e.g. `grad_log.append({n: p.grad ...})`): nothing is freed, and the next
    /// backward allocates new gradients.
    SetToNoneButReferenced,
}

/// What one forward pass left allocated.
#[derive(Clone, Debug)]
pub struct Pass {
    /// Tensors autograd saved for backward (empty under `no_grad`).
    pub saved: Vec<Blk>,
    pub saved_bytes: u64,
    /// The `fc2` outputs of each block, when the caller asked to keep them (a forward hook).
    pub fc2: Vec<Blk>,
    pub fc2_bytes: u64,
    pub logits: Blk,
}

pub struct Program {
    pub t: TraceBuilder,
    /// Activation size (the `fc1`/`GELU` outputs and logits are twice this).
    pub act: u64,
    pub params: Vec<(Blk, u64)>,
    pub grads: Vec<Option<Blk>>,
    pub state: Vec<Blk>,
}

/// Parameter sizes in 2 MiB granules: emb, (norm, fc1, fc2) × 2, norm, head.
const PARAMS: [u64; 9] = [2, 1, 2, 2, 1, 2, 2, 1, 2];

impl Program {
    /// `model = Net().cuda()` at `train.py:9`, with activations of `act_granules` × 2 MiB.
    pub fn new(act_granules: u64) -> Program {
        Program::with_builder(TraceBuilder::new(), act_granules)
    }

    pub fn with_builder(mut t: TraceBuilder, act_granules: u64) -> Program {
        let stack = [(MODULE, 1155, "<lambda>"), (MODULE, 942, "_apply"), (MODULE, 1155, "cuda"), top(9)];
        let params: Vec<(Blk, u64)> = PARAMS
            .iter()
            .map(|&g| {
                let size = g * GRANULE;
                (t.alloc(size, &stack), size)
            })
            .collect();
        let n = params.len();
        Program { t, act: act_granules * GRANULE, params, grads: vec![None; n], state: Vec::new() }
    }

    pub fn param_bytes(&self) -> u64 {
        self.params.iter().map(|p| p.1).sum()
    }

    /// `x = torch.randint(...)` at a user line.
    pub fn batch(&mut self, caller: &[Fr]) -> Blk {
        self.t.alloc(GRANULE, caller)
    }

    /// `model(x)` called from `caller` (innermost user frame first).
    pub fn forward(&mut self, caller: &[Fr], grad: Grad, keep_fc2: bool) -> Pass {
        let (a, w) = (self.act, 2 * self.act);
        let nograd = grad == Grad::NoGrad;
        let top = chain(&[&[CALL, WRAP], caller]);
        let net = |line: u32| chain(&[&[(MODEL, line, "forward")], &top]);
        let blk = |line: u32| chain(&[&[(MODEL, line, "forward"), CALL, WRAP], &net(42)]);
        let emb_op = [(FUNCTIONAL, 2551, "embedding"), (SPARSE, 190, "forward"), CALL, WRAP];
        let ln_op = [(FUNCTIONAL, 2910, "layer_norm"), (NORMALIZATION, 217, "forward"), CALL, WRAP];
        let linear_op = [(LINEAR, 125, "forward"), CALL, WRAP];
        let gelu_op = [(ACTIVATION, 734, "forward"), CALL, WRAP];

        let t = &mut self.t;
        let mut saved = Vec::new();
        let mut fc2s = Vec::new();
        let emb = t.alloc(a, &chain(&[&emb_op, &net(40)]));
        if !nograd {
            saved.push(emb);
        }
        let mut x = emb;
        for _ in 0..2 {
            let ln = t.alloc(a, &chain(&[&ln_op, &blk(21)]));
            let fc1 = t.alloc(w, &chain(&[&linear_op, &blk(22)]));
            if nograd {
                t.free(ln, &blk(22));
            }
            let act = t.alloc(w, &chain(&[&gelu_op, &blk(23)]));
            if nograd {
                t.free(fc1, &blk(23));
            }
            let fc2 = t.alloc(a, &chain(&[&linear_op, &blk(24)]));
            if nograd {
                t.free(act, &blk(24));
            }
            let y = t.alloc(a, &blk(25));
            if keep_fc2 {
                fc2s.push(fc2);
            } else {
                t.free(fc2, &blk(25));
            }
            if nograd {
                t.free(x, &net(42));
            } else {
                saved.extend([ln, fc1, act, y]);
            }
            x = y;
        }
        let lnf = t.alloc(a, &chain(&[&ln_op, &net(43)]));
        if nograd {
            t.free(x, &net(43));
        } else {
            saved.push(lnf);
        }
        let logits = t.alloc(w, &chain(&[&linear_op, &net(44)]));
        if nograd {
            t.free(lnf, &net(44));
        }
        // emb and the final norm, and per block its norm, fc1, GELU and residual outputs.
        let saved_bytes = if nograd { 0 } else { 2 * a + 2 * (2 * a + 2 * w) };
        let fc2_bytes = fc2s.len() as u64 * a;
        let pass = Pass { saved, saved_bytes, fc2: fc2s, fc2_bytes, logits };
        assert_eq!(pass.saved.len(), if nograd { 0 } else { 10 });
        pass
    }

    /// `loss = F.cross_entropy(logits, y)` at `caller`.
    pub fn loss(&mut self, caller: &[Fr]) -> Blk {
        self.t.alloc(GRANULE, &chain(&[&[(FUNCTIONAL, 3479, "cross_entropy")], caller]))
    }

    /// `loss.backward(retain_graph=...)` at `caller`: the launch allocation under
    /// `torch/autograd` (`_make_grads`), then frameless engine allocations: gradients of the
    /// parameters that have none, gradients of activations (freed as it goes), and the saved
    /// tensors of the passes that fed the loss, freed unless the graph is retained. Returns the
    /// gradients it allocated.
    pub fn backward(&mut self, caller: &[Fr], passes: &[&Pass], retain_graph: bool) -> Vec<Blk> {
        let launch =
            chain(&[&[(AUTOGRAD, 220, "_make_grads"), (AUTOGRAD, 347, "backward"), (TENSOR, 626, "backward")], caller]);
        let t = &mut self.t;
        let seed = t.alloc(GRANULE, &launch);
        let mut tmp = t.alloc(2 * self.act, &[]);
        t.free(seed, &[]);
        let mut saved: Vec<Blk> =
            if retain_graph { Vec::new() } else { passes.iter().flat_map(|p| p.saved.iter().copied()).collect() };
        let mut new_grads = Vec::new();
        for k in (0..self.params.len()).rev() {
            if self.grads[k].is_none() {
                let g = t.alloc(self.params[k].1, &[]);
                self.grads[k] = Some(g);
                new_grads.push(g);
            }
            let next = t.alloc(self.act, &[]);
            t.free(tmp, &[]);
            tmp = next;
            if let Some(s) = saved.pop() {
                t.free(s, &[]);
            }
        }
        while let Some(s) = saved.pop() {
            t.free(s, &[]);
        }
        t.free(tmp, &[]);
        new_grads
    }

    /// `opt.step()` (Adam) at `caller`: state on the first step, a temporary every step.
    pub fn step(&mut self, caller: &[Fr]) {
        let step = [(ADAM, 248, "step"), (OPTIMIZER, 81, "_use_grad"), (OPTIMIZER, 533, "wrapper")];
        let t = &mut self.t;
        if self.state.is_empty() {
            for k in 0..self.params.len() {
                let size = self.params[k].1;
                for line in [178, 182] {
                    let s = t.alloc(
                        size,
                        &chain(&[&[(ADAM, line, "_init_group"), (ADAM, 238, "step")], &step[1..], caller]),
                    );
                    self.state.push(s);
                }
            }
        }
        let multi = chain(&[
            &[(ADAM, 791, "_multi_tensor_adam"), (ADAM, 971, "adam"), (OPTIMIZER, 151, "maybe_fallback")],
            &step,
            caller,
        ]);
        let tmp = t.alloc(2 * GRANULE, &multi);
        t.free(tmp, &multi[1..]);
    }

    /// `opt.zero_grad(...)` at `caller`. Returns the gradients that stay allocated because
    /// something references them ([`ZeroGrad::SetToNoneButReferenced`]).
    pub fn zero_grad(&mut self, caller: &[Fr], mode: ZeroGrad) -> Vec<Blk> {
        let stack = chain(&[&[(OPTIMIZER, 1066, "zero_grad")], caller]);
        let mut kept = Vec::new();
        match mode {
            ZeroGrad::InPlace => {}
            ZeroGrad::SetToNone => {
                for g in self.grads.iter_mut() {
                    if let Some(b) = g.take() {
                        self.t.free(b, &stack);
                    }
                }
            }
            ZeroGrad::SetToNoneButReferenced => kept.extend(self.grads.iter_mut().filter_map(|g| g.take())),
        }
        kept
    }
}
