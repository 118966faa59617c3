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

/// Six elementwise chains with no path between them: over different shapes and dtypes (f32,
/// bf16, f16, i32), one over zero elements, two reading the same input, with a row vector and a
/// scalar broadcast into them. Fusion makes one pointwise kernel of each, then groups them all
/// into one multi-pointwise kernel.
pub fn independent_chains() -> Graph {
    let mut g = Graph::new();
    let a = g.input(DType::F32, [5, 7]);
    let bias = g.input(DType::F32, [7]);
    let s = g.input(DType::F32, []);
    let b = g.input(DType::BF16, [33]);
    let c = g.input(DType::F16, [2, 3, 4]);
    let d = g.input(DType::F32, [0, 3]);
    let ints = g.input(DType::I32, [10]);
    let ab = mul(&mut g, a, bias);
    let e = un(&mut g, UnaryOp::Exp, ab);
    let y1 = add(&mut g, e, s);
    let b32 = g.cast(b, DType::F32).unwrap();
    let t = un(&mut g, UnaryOp::Tanh, b32);
    let ts = mul(&mut g, t, s);
    let y2 = g.cast(ts, DType::BF16).unwrap();
    let sig = un(&mut g, UnaryOp::Sigmoid, c);
    let y3 = mul(&mut g, sig, c);
    let ds = mul(&mut g, d, s);
    let one = g.constant(1.0, DType::F32);
    let y4 = add(&mut g, ds, one);
    let three = g.constant(3.0, DType::I32);
    let y5 = mul(&mut g, ints, three);
    let r = un(&mut g, UnaryOp::Relu, a);
    let y6 = bin(&mut g, BinaryOp::Sub, r, bias);
    g.set_outputs(vec![y1, y2, y3, y4, y5, y6]);
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
