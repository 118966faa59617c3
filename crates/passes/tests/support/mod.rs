//! Shared by the test files: graph builders for the benchmark workloads. Graphs and plans are
//! run by `braze-cpu`'s reference (`eval_graph`, `eval_plan`), the one interpreter of both.

#![allow(dead_code)]

use braze_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, UnaryOp};

// ---- graph building ---------------------------------------------------------------------------

pub fn un(g: &mut Graph, op: UnaryOp, x: NodeId) -> NodeId {
    g.add(Op::Unary { op }, &[x], None).unwrap()
}

pub fn bin(g: &mut Graph, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
    g.add(Op::Binary { op }, &[a, b], None).unwrap()
}

pub fn add(g: &mut Graph, a: NodeId, b: NodeId) -> NodeId {
    bin(g, BinaryOp::Add, a, b)
}

pub fn mul(g: &mut Graph, a: NodeId, b: NodeId) -> NodeId {
    bin(g, BinaryOp::Mul, a, b)
}

pub fn op(g: &mut Graph, op: Op, operands: &[NodeId]) -> NodeId {
    g.add(op, operands, None).unwrap()
}

pub fn sum(g: &mut Graph, x: NodeId, axes: &[usize], keepdim: bool) -> NodeId {
    op(g, Op::Reduce { op: ReduceOp::Sum, axes: axes.to_vec(), keepdim }, &[x])
}

pub fn softmax(rows: usize, cols: usize, axis: usize) -> Graph {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [rows, cols]);
    let y = op(&mut g, Op::Softmax { axis }, &[x]);
    g.set_outputs(vec![y]);
    g
}

/// The generator behind [`log_uniform_sizes`]; its exact sequence is part of the plan snapshots.
struct Lcg(u64);

impl Lcg {
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}
