//! The graph: a petgraph `StableGraph` behind a newtype. Operand order lives in each node;
//! edges (operand -> user, weighted by operand slot) mirror it so users can be found quickly.

use crate::infer::{infer, Declared};
use crate::{DType, IrError, Literal, Op, Result, Shape};
use petgraph::stable_graph::{NodeIndex, StableGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;

/// A node of one graph. Prints as `%n` with its raw index; the text form renumbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub NodeIndex<u32>);

impl NodeId {
    pub fn index(self) -> usize {
        self.0.index()
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0.index())
    }
}

/// Where in the user's code an op was recorded.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SourceLoc {
    pub file: String,
    pub line: u32,
    pub col: u32,
    /// The op belongs to the backward of the op recorded here (appended by autodiff). Passes
    /// carry locations over to the ops they derive, so fused plans still tell forward from
    /// backward work (what `explain` reports as saved for backward).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub backward: bool,
    /// A backward op recomputing a forward value from values the backward holds anyway, so the
    /// value need not be held from the forward: fusion keeps it out of kernels that hold forward
    /// ops, where it would be computed early and held after all.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recomputed: bool,
}

impl SourceLoc {
    pub fn from_location(loc: &std::panic::Location<'_>) -> SourceLoc {
        SourceLoc {
            file: loc.file().to_string(),
            line: loc.line(),
            col: loc.column(),
            backward: false,
            recomputed: false,
        }
    }

    /// The same place, marking an op of its backward.
    pub fn backward_of(&self) -> SourceLoc {
        SourceLoc { backward: true, ..self.clone() }
    }

    /// The same place, marking a backward op that recomputes a forward value.
    pub fn recomputed_of(&self) -> SourceLoc {
        SourceLoc { backward: true, recomputed: true, ..self.clone() }
    }
}

impl fmt::Display for SourceLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub operands: Vec<NodeId>,
    pub dtype: DType,
    pub shape: Shape,
    pub loc: Option<SourceLoc>,
}

/// A dataflow graph of tensor ops with ordered inputs and outputs.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    graph: StableGraph<Node, usize>,
    inputs: Vec<NodeId>,
    outputs: Vec<NodeId>,
}

impl Graph {
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Adds graph input number `inputs().len()`.
    pub fn input(&mut self, dtype: DType, shape: impl Into<Shape>) -> NodeId {
        let index = self.inputs.len();
        let id = self.push(Node { op: Op::Input { index }, operands: vec![], dtype, shape: shape.into(), loc: None });
        self.inputs.push(id);
        id
    }

    /// A scalar constant of `dtype` from an f64, converted with cast semantics (an integral value
    /// converts to an integer dtype exactly); see [`Graph::literal`] for integers beyond 2^53.
    pub fn constant(&mut self, value: f64, dtype: DType) -> NodeId {
        self.literal(Literal::of_f64(value, dtype), dtype)
    }

    /// A scalar constant of `dtype` holding `value` converted to the dtype's kind
    /// ([`Literal::to_dtype`]), so an i64 keeps every bit.
    pub fn literal(&mut self, value: Literal, dtype: DType) -> NodeId {
        let value = value.to_dtype(dtype);
        self.push(Node { op: Op::Constant { value }, operands: vec![], dtype, shape: Shape::scalar(), loc: None })
    }

    /// `0, 1, .., n - 1` as a rank-1 node of `dtype` (any number type).
    pub fn arange(&mut self, n: usize, dtype: DType) -> Result<NodeId> {
        self.add_declared(Op::Arange, &[], dtype, Shape(vec![n]), None)
    }

    pub fn cast(&mut self, x: NodeId, dtype: DType) -> Result<NodeId> {
        let shape = self.node(x).shape.clone();
        self.add_declared(Op::Cast, &[x], dtype, shape, None)
    }

    pub fn reshape(&mut self, x: NodeId, shape: impl Into<Shape>) -> Result<NodeId> {
        let dtype = self.node(x).dtype;
        self.add_declared(Op::Reshape, &[x], dtype, shape.into(), None)
    }

    pub fn broadcast_to(&mut self, x: NodeId, shape: impl Into<Shape>) -> Result<NodeId> {
        let dtype = self.node(x).dtype;
        self.add_declared(Op::BroadcastTo, &[x], dtype, shape.into(), None)
    }

    /// Adds an op whose result follows from its operands (everything but input, constant, cast,
    /// reshape and broadcast_to).
    pub fn add(&mut self, op: Op, operands: &[NodeId], loc: Option<SourceLoc>) -> Result<NodeId> {
        let types = self.operand_types(operands)?;
        let refs: Vec<(DType, &Shape)> = types.iter().map(|(d, s)| (*d, s)).collect();
        let (dtype, shape) = infer(&op, &refs, None)?;
        Ok(self.push(Node { op, operands: operands.to_vec(), dtype, shape, loc }))
    }

    /// Adds any op with an explicitly declared result; checked against the typing rules.
    pub fn add_declared(
        &mut self,
        op: Op,
        operands: &[NodeId],
        dtype: DType,
        shape: Shape,
        loc: Option<SourceLoc>,
    ) -> Result<NodeId> {
        if let Op::Input { .. } = op {
            return Err(IrError::Verify { node: "input".into(), detail: "use Graph::input to add inputs".into() });
        }
        let types = self.operand_types(operands)?;
        let refs: Vec<(DType, &Shape)> = types.iter().map(|(d, s)| (*d, s)).collect();
        let (dtype, shape) = infer(&op, &refs, Some(Declared { dtype, shape: &shape }))?;
        Ok(self.push(Node { op, operands: operands.to_vec(), dtype, shape, loc }))
    }

    fn operand_types(&self, operands: &[NodeId]) -> Result<Vec<(DType, Shape)>> {
        operands
            .iter()
            .map(|&o| {
                self.graph.node_weight(o.0).map(|n| (n.dtype, n.shape.clone())).ok_or_else(|| IrError::Verify {
                    node: o.to_string(),
                    detail: "operand is not in this graph".into(),
                })
            })
            .collect()
    }

    fn push(&mut self, node: Node) -> NodeId {
        let operands = node.operands.clone();
        let id = NodeId(self.graph.add_node(node));
        for (slot, o) in operands.into_iter().enumerate() {
            self.graph.add_edge(o.0, id.0, slot);
        }
        id
    }

    /// Sets the loc of a node (the frontend records it after building).
    pub fn set_loc(&mut self, id: NodeId, loc: Option<SourceLoc>) {
        self.graph[id.0].loc = loc;
    }

    pub fn set_outputs(&mut self, outputs: Vec<NodeId>) {
        self.outputs = outputs;
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.graph[id.0]
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.graph.contains_node(id.0)
    }

    pub fn inputs(&self) -> &[NodeId] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[NodeId] {
        &self.outputs
    }

    pub fn len(&self) -> usize {
        self.graph.node_count()
    }

    pub fn is_empty(&self) -> bool {
        self.graph.node_count() == 0
    }

    /// Number of nodes that compute something (not inputs or constants).
    pub fn op_count(&self) -> usize {
        self.graph.node_weights().filter(|n| !matches!(n.op, Op::Input { .. } | Op::Constant { .. })).count()
    }

    /// Nodes that read `id`, each once, in index order.
    pub fn users(&self, id: NodeId) -> Vec<NodeId> {
        let mut users: Vec<NodeId> = self.graph.neighbors_directed(id.0, Direction::Outgoing).map(NodeId).collect();
        users.sort();
        users.dedup();
        users
    }

    /// How many operand slots and graph outputs read `id`.
    pub fn use_count(&self, id: NodeId) -> usize {
        self.graph.edges_directed(id.0, Direction::Outgoing).count() + self.outputs.iter().filter(|&&o| o == id).count()
    }

    pub fn is_output(&self, id: NodeId) -> bool {
        self.outputs.contains(&id)
    }

    /// Makes every reader of `old` (operands and graph outputs) read `new` instead.
    pub fn replace_all_uses(&mut self, old: NodeId, new: NodeId) {
        if old == new {
            return;
        }
        let uses: Vec<(NodeIndex<u32>, usize)> =
            self.graph.edges_directed(old.0, Direction::Outgoing).map(|e| (e.target(), *e.weight())).collect();
        let edge_ids: Vec<_> = self.graph.edges_directed(old.0, Direction::Outgoing).map(|e| e.id()).collect();
        for e in edge_ids {
            self.graph.remove_edge(e);
        }
        for (user, slot) in uses {
            self.graph[user].operands[slot] = new;
            self.graph.add_edge(new.0, user, slot);
        }
        for o in self.outputs.iter_mut() {
            if *o == old {
                *o = new;
            }
        }
    }

    /// Makes `user` read `new` in every operand slot where it reads `old`.
    pub fn replace_uses_in(&mut self, user: NodeId, old: NodeId, new: NodeId) {
        let slots: Vec<(petgraph::stable_graph::EdgeIndex<u32>, usize)> =
            self.graph.edges_connecting(old.0, user.0).map(|e| (e.id(), *e.weight())).collect();
        for (edge, slot) in slots {
            self.graph.remove_edge(edge);
            self.graph[user.0].operands[slot] = new;
            self.graph.add_edge(new.0, user.0, slot);
        }
    }

    /// Removes a node nobody reads. Inputs stay (they are part of the signature).
    pub fn remove(&mut self, id: NodeId) -> Result<()> {
        if self.use_count(id) > 0 {
            return Err(IrError::Verify {
                node: id.to_string(),
                detail: "cannot remove a node that is still used".into(),
            });
        }
        if matches!(self.node(id).op, Op::Input { .. }) {
            return Err(IrError::Verify { node: id.to_string(), detail: "graph inputs cannot be removed".into() });
        }
        self.graph.remove_node(id.0);
        Ok(())
    }

    /// All nodes in a deterministic topological order: operands before users, ties broken by
    /// creation order, graph inputs first.
    pub fn topo_order(&self) -> Vec<NodeId> {
        let mut indegree: std::collections::HashMap<NodeIndex<u32>, usize> =
            self.graph.node_indices().map(|n| (n, self.graph.edges_directed(n, Direction::Incoming).count())).collect();
        let mut order: Vec<NodeId> = self.inputs.clone();
        let inputs: std::collections::HashSet<NodeId> = self.inputs.iter().copied().collect();
        let mut ready: BinaryHeap<Reverse<NodeIndex<u32>>> = BinaryHeap::new();
        for n in self.graph.node_indices() {
            if indegree[&n] == 0 && !inputs.contains(&NodeId(n)) {
                ready.push(Reverse(n));
            }
        }
        let release = |n: NodeIndex<u32>,
                       indegree: &mut std::collections::HashMap<NodeIndex<u32>, usize>,
                       ready: &mut BinaryHeap<Reverse<NodeIndex<u32>>>| {
            for e in self.graph.edges_directed(n, Direction::Outgoing) {
                let d = indegree.get_mut(&e.target()).expect("edge target is a node");
                *d -= 1;
                if *d == 0 {
                    ready.push(Reverse(e.target()));
                }
            }
        };
        for &i in &self.inputs {
            release(i.0, &mut indegree, &mut ready);
        }
        while let Some(Reverse(n)) = ready.pop() {
            order.push(NodeId(n));
            release(n, &mut indegree, &mut ready);
        }
        order
    }

    /// Node ids in creation order (not necessarily topological after rewrites).
    pub fn node_ids(&self) -> Vec<NodeId> {
        self.graph.node_indices().map(NodeId).collect()
    }

    /// The underlying petgraph graph, for analyses that want petgraph's algorithms.
    pub fn petgraph(&self) -> &StableGraph<Node, usize> {
        &self.graph
    }
}
