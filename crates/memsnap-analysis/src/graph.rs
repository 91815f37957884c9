//! The block ↔ stack ↔ frame graph of the memory live at one moment.
//!
//! Nodes are live blocks, the stacks that allocated them and their frames; edges go
//! block → stack (allocated by), stack → innermost frame, and frame → caller frame along each
//! stack. Frameless backward allocations hang off the stack that launched their backward pass,
//! under a synthetic `[autograd engine]` frame. From the graph: bytes by site (innermost user
//! frame), inclusive bytes by frame, and folded stacks for flamegraphs.

use std::collections::{BTreeMap, HashMap};

use memsnap_model::{clip, FrameId, Snapshot, StackId};
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;
use petgraph::Direction;

use crate::attribution::Attr;
use crate::site::short_path;
use crate::stacks::StackTable;

/// A node of the memory graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Block {
        address: u64,
        size: u64,
    },
    /// The stack that allocated (for frameless backward blocks: the stack that launched the
    /// backward pass).
    Stack(StackId),
    Frame(FrameId),
    /// A frame that does not exist in the file: `[autograd engine]`, `[allocated before the
    /// trace]`, `[no frames recorded]`.
    Synthetic(&'static str),
}

/// A live block as the graph needs it.
#[derive(Clone, Copy, Debug)]
pub struct LiveBlock {
    pub address: u64,
    pub size: u64,
    pub attr: Attr,
    /// The stack to hang the block from (the launch stack for backward blocks).
    pub stack: StackId,
}

pub struct MemoryGraph {
    pub graph: DiGraph<Node, ()>,
    stack_nodes: BTreeMap<StackId, NodeIndex>,
    frame_nodes: BTreeMap<(Option<NodeIndex>, FrameId), NodeIndex>,
    roots: BTreeMap<&'static str, NodeIndex>,
}

pub const AUTOGRAD: &str = "[autograd engine]";
pub const PRE_TRACE: &str = "[allocated before the trace]";
pub const NO_FRAMES: &str = "[no frames recorded]";

impl MemoryGraph {
    /// Build the graph of `blocks`. Frames are nodes of a calling-context tree: one frame node
    /// per (caller node, frame), so a frame reached through two different callers is two nodes
    /// and inclusive bytes are exact.
    pub fn build(snap: &Snapshot, blocks: &[LiveBlock]) -> MemoryGraph {
        let mut g = MemoryGraph {
            graph: DiGraph::new(),
            stack_nodes: BTreeMap::new(),
            frame_nodes: BTreeMap::new(),
            roots: BTreeMap::new(),
        };
        for b in blocks {
            let leaf = match b.attr {
                Attr::PreTrace => g.root(PRE_TRACE),
                Attr::NoFrames => g.root(NO_FRAMES),
                Attr::Backward(_) => {
                    let s = g.stack_node(snap, b.stack);
                    g.synthetic_child(s, AUTOGRAD)
                }
                Attr::Site(_) | Attr::Library => g.stack_node(snap, b.stack),
            };
            let bn = g.graph.add_node(Node::Block { address: b.address, size: b.size });
            g.graph.add_edge(bn, leaf, ());
        }
        g
    }

    fn root(&mut self, name: &'static str) -> NodeIndex {
        if let Some(&n) = self.roots.get(name) {
            return n;
        }
        let n = self.graph.add_node(Node::Synthetic(name));
        self.roots.insert(name, n);
        n
    }

    fn synthetic_child(&mut self, parent: NodeIndex, name: &'static str) -> NodeIndex {
        if let Some(e) = self
            .graph
            .edges_directed(parent, Direction::Incoming)
            .find(|e| self.graph[e.source()] == Node::Synthetic(name))
        {
            return e.source();
        }
        let n = self.graph.add_node(Node::Synthetic(name));
        self.graph.add_edge(n, parent, ());
        n
    }

    /// The node of a stack, creating its frame chain (outermost first) on first use.
    fn stack_node(&mut self, snap: &Snapshot, stack: StackId) -> NodeIndex {
        if let Some(&n) = self.stack_nodes.get(&stack) {
            return n;
        }
        let frames = &snap.stack(stack).frames;
        let mut caller: Option<NodeIndex> = None;
        for &f in frames.iter().rev() {
            let key = (caller, f);
            let node = match self.frame_nodes.get(&key) {
                Some(&n) => n,
                None => {
                    let n = self.graph.add_node(Node::Frame(f));
                    if let Some(c) = caller {
                        self.graph.add_edge(n, c, ());
                    }
                    self.frame_nodes.insert(key, n);
                    n
                }
            };
            caller = Some(node);
        }
        let sn = self.graph.add_node(Node::Stack(stack));
        match caller {
            Some(innermost) => {
                self.graph.add_edge(sn, innermost, ());
            }
            None => {
                let r = self.root(NO_FRAMES);
                self.graph.add_edge(sn, r, ());
            }
        }
        self.stack_nodes.insert(stack, sn);
        sn
    }

    /// Folded stacks (`outer;…;inner bytes`), one line per distinct path, sorted. Frame labels
    /// are `function (file:line)`; user frames are prefixed with `*` when `mark_user` is set so
    /// a renderer can highlight them.
    pub fn folded(&self, snap: &Snapshot, stacks: &StackTable, mark_user: bool) -> Vec<(String, u64)> {
        let mut out: BTreeMap<String, u64> = BTreeMap::new();
        // A frame is labelled once, however many paths it is on.
        let mut labels: HashMap<FrameId, String> = HashMap::new();
        for (leaf, bytes) in self.bytes_by_leaf() {
            let mut path: Vec<String> = Vec::new();
            for c in self.path_from(leaf) {
                match &self.graph[c] {
                    Node::Frame(f) => {
                        path.push(labels.entry(*f).or_insert_with(|| frame_label(snap, stacks, *f, mark_user)).clone())
                    }
                    Node::Synthetic(s) => path.push((*s).to_string()),
                    Node::Stack(_) | Node::Block { .. } => {}
                }
            }
            path.reverse();
            let total = out.entry(path.join(";")).or_default();
            *total = total.saturating_add(bytes);
        }
        out.into_iter().collect()
    }

    /// Inclusive bytes per frame (summed over every calling context of the frame, a frame that
    /// recurs on one path counted once for it), sorted by bytes then frame id.
    pub fn inclusive_by_frame(&self) -> Vec<(FrameId, u64)> {
        let mut by: BTreeMap<FrameId, u64> = BTreeMap::new();
        let mut seen: rustc_hash::FxHashSet<FrameId> = Default::default();
        for (leaf, bytes) in self.bytes_by_leaf() {
            seen.clear();
            for c in self.path_from(leaf) {
                if let Node::Frame(f) = self.graph[c] {
                    if seen.insert(f) {
                        let total = by.entry(f).or_default();
                        *total = total.saturating_add(bytes);
                    }
                }
            }
        }
        let mut v: Vec<(FrameId, u64)> = by.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    /// Live bytes per node that blocks hang from (a stack, or a synthetic frame), in node order.
    /// The walks above run once per such node, not once per block: many blocks share one stack
    /// (a file may give 100 000 blocks one stack of 100 000 frames), and a walk per block would
    /// cost blocks × depth.
    fn bytes_by_leaf(&self) -> BTreeMap<NodeIndex, u64> {
        let mut by: BTreeMap<NodeIndex, u64> = BTreeMap::new();
        for n in self.graph.node_indices() {
            let Node::Block { size, .. } = self.graph[n] else { continue };
            if let Some(leaf) = self.graph.neighbors_directed(n, Direction::Outgoing).next() {
                let total = by.entry(leaf).or_default();
                *total = total.saturating_add(size);
            }
        }
        by
    }

    /// `node`, then its caller, and so on to the outermost frame.
    fn path_from(&self, node: NodeIndex) -> impl Iterator<Item = NodeIndex> + '_ {
        std::iter::successors(Some(node), move |&c| self.graph.neighbors_directed(c, Direction::Outgoing).next())
    }

    pub fn block_count(&self) -> usize {
        self.graph.node_indices().filter(|&n| matches!(self.graph[n], Node::Block { .. })).count()
    }
}

/// `function (file:line)`, with a leading `*` for user frames when asked. The names are
/// [`clip`]ped: a label is for people (and flamegraph tools), not a key.
pub fn frame_label(snap: &Snapshot, stacks: &StackTable, f: FrameId, mark_user: bool) -> String {
    let fr = snap.frame(f);
    let mark = if mark_user && stacks.is_user(f) { "*" } else { "" };
    // Folded-stack syntax reserves ';' and the trailing space before the count.
    let clean = |s: &str| clip(s).replace([';', '\n'], ",");
    format!("{mark}{} ({}:{})", clean(snap.str(fr.name)), clean(short_path(snap.str(fr.filename))), fr.line)
}
