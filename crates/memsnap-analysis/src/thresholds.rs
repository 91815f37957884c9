//! Every number a detector decides with, in one place, each with its reason.
//!
//! The numbers are not fitted to fixtures: each rests on how autograd and the caching allocator
//! behave (the reason says how). Tests mutate them through [`Thresholds`] to show that each one
//! matters (`tests/suite/thresholds.rs`).

/// The thresholds of every detector. [`Thresholds::DEFAULT`] is what `analyze` uses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// Bytes below which a suspect is not reported (1 MiB). Below it, no change a user could make
    /// matters next to a CUDA context (~500 MiB) and the allocator's 2 MiB small-pool segments.
    pub min_suspect_bytes: u64,
    /// Occurrences after which a leak is reported whatever its size (50): growth seen in that many
    /// iterations is without bound, and a 512-byte loss kept per step is 5 MB after 10,000 steps.
    pub small_leak_occurrences: usize,
    /// A forward pass is judged for "grad enabled" only when it allocated at least this many
    /// blocks (4): with fewer, the output alone is a large share of what it allocated.
    pub min_pass_blocks: u32,
    /// Blocks of a forward pass still alive when it returns from which autograd saved them (4).
    /// Under `no_grad` only the outputs survive a pass (one tensor, or a few for modules that
    /// return several: an LSTM language model returns its logits and its two states, 3 blocks,
    /// carried to the next chunk under `inference_mode`: ak18); with grad enabled every
    /// operation's saved inputs survive besides.
    pub min_saved_blocks: u32,
    /// Share of a pass's blocks alive when it returns that means autograd saved them (0.3). With
    /// grad enabled most operations save an input or output (linear, matmul, norms, activations,
    /// softmax, dropout masks): typically 50-80% survive. Under `no_grad` the outputs survive, plus
    /// a KV cache (2 tensors per layer of ~15 allocations): under 20%.
    pub saved_fraction: f64,
    /// Distinct allocation stacks among a pass's surviving blocks that mean autograd saved them
    /// even below `saved_fraction` (16), when at least `sparse_saved_fraction` of the pass's
    /// blocks survive. Autograd saves tensors all through a model, so with grad on the survivors
    /// come from dozens of lines (every layer type's convolutions, norms, activations); a model
    /// whose pass also runs much non-differentiable code (a detector's anchors, box decoding,
    /// sampling and NMS: three quarters of its blocks) falls under `saved_fraction` while its
    /// survivors still span 30-40 stacks. Under `no_grad` the survivors are the outputs and the
    /// cache writes, from a handful of lines (2-3 on the fixtures' KV caches, each layer's cache
    /// write sharing one stack).
    pub min_saved_stacks: u32,
    /// Share of a pass's blocks that must survive it for `min_saved_stacks` to count (0.15).
    pub sparse_saved_fraction: f64,
    /// Share of the surviving blocks of the model's training passes (median; those of the same
    /// call site, else all) that passes no backward uses must keep for their graphs to be
    /// reported as waste when they do not set the peak (0.75). Autograd saves the same tensors
    /// whether or not a backward follows (eval mode drops only dropout masks and batch-norm
    /// statistics), so a pass run with grad on keeps about what a training pass keeps. Under
    /// `no_grad` only its outputs survive: a shallow model that returns several tensors (an
    /// LSTM's output and its two states, of 9 blocks) passes `saved_fraction` with them alone,
    /// yet keeps fewer than its training passes save. At the peak the peak itself is the
    /// evidence; away from it, this comparison is. The same share reads a pass run under
    /// activation checkpointing as grad on when it keeps that much of what the checkpointed
    /// training passes keep (`Lifecycle`): checkpointing saves only each segment's input, too
    /// few blocks for `saved_fraction` or `min_saved_stacks`.
    pub training_saved_share: f64,
    /// Share of the peak that a suspect of severity `peak` must account for (0.05): one that is
    /// released later matters only through the peak, and a few percent of it is within what batch
    /// composition and allocator rounding move anyway.
    pub min_peak_share: f64,
    /// Distinct occurrences (iterations or passes) that must leave memory behind for growth to be
    /// a leak (3). Two could be a pair of buffers swapped each step; three kept copies of the
    /// same thing are accumulation.
    pub min_leak_occurrences: usize,
    /// Share of the occurrences that allocated at a site which must leave memory behind for it to
    /// be growth (0.5): a cache that keeps one entry in ten is bounded by its policy, not leaking.
    pub leak_occurrence_share: f64,
    /// Share of the occurrences from the first that kept memory on which a site whose kept
    /// tensors nothing ever let go must keep some (0.2), for it to be growth though it keeps in
    /// fewer than `leak_occurrence_share` of all: a leak that starts after a warm-up, or keeps
    /// one step in a few (`if step % 3 == 0: samples.append(pred)`). A cache bounded by its
    /// policy lets entries go (evicts), which these never do; the kept occurrences must also go
    /// on to the end of the trace (no longer gap after the last than between two), so a set
    /// filled once and then left (the first batches kept as a fixed sample) is not growth.
    pub unevicted_leak_share: f64,
    /// Units whose graphs must still be alive two passes later before a kept graph is reported
    /// (2). Rebinding a variable (`loss = ...`) keeps at most one previous graph alive at a time.
    pub min_held_graphs: usize,
    /// Blocks of this size or less are the scalar roots users keep (512 B: the allocator's
    /// smallest block; a 0-dim loss or a running sum is one such block).
    pub scalar_root_bytes: u64,
    /// Kept backward blocks per step that mean gradients rather than a hook's tensor (2): a
    /// backward allocates one gradient per parameter, and every model has weights and biases.
    pub min_gradients_per_step: u64,
    /// Share of the most memory allocated during an evaluation window that the gradients held
    /// through it must make up to be reported as waste (0.01): below it, clearing them would not
    /// change the window's peak measurably.
    pub grad_waste_share: f64,
    /// Same-site live blocks that make a state-only leak suspect (8): with no trace, a line that
    /// holds many blocks of one kind at dump time (not parameters, optimizer state or gradients)
    /// is what a cache or a list of outputs looks like.
    pub state_min_same_site_blocks: u64,
    /// Different operations inside one model call whose blocks are each alive at least
    /// `min_leak_occurrences` times at the dump that make a state-only group kept graphs rather
    /// than kept outputs (5): autograd saves tensors of most operations of a pass (matmul inputs,
    /// activation outputs, dropout masks, norm statistics), while a hook, a returned
    /// `hidden_states` tuple or a cache keeps one operation's output per layer. Five leaves out
    /// a block that keeps two or three tensors per layer (an attention map and an output) and
    /// takes a transformer or CNN whose graphs are kept (most keep ten or more).
    pub state_graph_min_ops: u64,
    /// Confidence ceiling of a suspect that rests on the dump-time state alone (0.5).
    pub state_only_confidence: f64,
    /// Fragmentation: inactive split bytes at least this large (32 MiB)...
    pub fragmentation_min_split_bytes: u64,
    /// ... and at least this share of reserved memory (0.3) ...
    pub fragmentation_min_split_share: f64,
    /// ... while allocated memory is at most this share of reserved (0.6). Split free blocks are
    /// memory that neither larger requests nor `empty_cache()` can use.
    pub fragmentation_max_allocated_share: f64,
    /// ... and no single hole holds more than this share of the split bytes (0.5). Holes hurt
    /// when they are scattered: one hole that holds most of them (the input of a setup step
    /// freed beside its output: ad10's 164 MiB of 167) serves every request up to its size, as
    /// cache does. The fragmentation the fixtures plant leaves its largest hole 9-15% of them.
    pub fragmentation_max_largest_hole_share: f64,
    /// ... and not when at least this share (half) of the live bytes that pin the split
    /// segments belong to a `leak` suspect's blocks. A leak keeps tensors made between the
    /// step's short-lived ones, so its blocks pin the segments they were carved from and the
    /// holes beside them only serve requests that fit: the split bytes are the leak's footprint,
    /// which fixing the leak frees, not a separate problem whose fix is an allocator setting
    /// (ah13's hook clones, n25's kept outputs, ad08's kept images).
    pub fragmentation_leak_pin_share: f64,
    /// Share of a re-made tensor's growth (0.5) that the allocated level at the start of its
    /// iterations must grow by over the same iterations for the tensor to be a leak, asked of the
    /// tensors a line re-makes one per call (`reference_leak::versions_per_call`). A leak makes
    /// the program hold more, so the level at one point of the loop rises with the tensor; when
    /// it rises by less than half as much, other memory shrank as the tensor grew (rows moved
    /// from an unlabeled pool into a labeled set re-made larger, as s19 does with one tensor),
    /// and the bytes moved rather than grew. Half leaves room for what else the iterations free
    /// or make as they go.
    pub regrown_level_share: f64,
    /// Share of the reserved peak above the allocated peak (0.35) from which the allocator-cache
    /// section advises on reserved memory (expandable segments, uniform shapes). Some excess is
    /// structural: requests round up (512 B, 2 MiB), small requests take 2 MiB segments and
    /// 1-10 MiB ones 20 MiB segments, and remainders too small to split stay with their block;
    /// steady training and inference programs reserve up to about a quarter more than they ever
    /// allocate at once (0.27 at most over the 130 real programs of `fixtures/`). Beyond a third,
    /// the cache held bytes in blocks that did not fit later requests.
    pub reserved_excess_share: f64,
    /// ... and by at least this many bytes (32 MiB). A program that makes one request of each
    /// size class keeps a partly used 2 MiB small segment and 20 MiB large segment per stream
    /// as cache, so on a small program (a few MiB allocated) the share alone is granularity,
    /// with no shape or phase to blame.
    pub reserved_excess_min_bytes: u64,
}

impl Thresholds {
    pub const DEFAULT: Thresholds = Thresholds {
        min_suspect_bytes: 1 << 20,
        small_leak_occurrences: 50,
        min_pass_blocks: 4,
        min_saved_blocks: 4,
        saved_fraction: 0.3,
        min_saved_stacks: 16,
        sparse_saved_fraction: 0.15,
        training_saved_share: 0.75,
        min_peak_share: 0.05,
        min_leak_occurrences: 3,
        leak_occurrence_share: 0.5,
        unevicted_leak_share: 0.2,
        min_held_graphs: 2,
        scalar_root_bytes: 512,
        min_gradients_per_step: 2,
        grad_waste_share: 0.01,
        state_min_same_site_blocks: 8,
        state_graph_min_ops: 5,
        state_only_confidence: 0.5,
        fragmentation_min_split_bytes: 32 << 20,
        fragmentation_min_split_share: 0.3,
        fragmentation_max_allocated_share: 0.6,
        fragmentation_max_largest_hole_share: 0.5,
        fragmentation_leak_pin_share: 0.5,
        regrown_level_share: 0.5,
        reserved_excess_share: 0.35,
        reserved_excess_min_bytes: 32 << 20,
    };
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds::DEFAULT
    }
}
