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

/// `relu(layer_norm(x, w, b)) + res`.
pub fn ln_relu_res(dtype: DType, rows: usize, cols: usize) -> Graph {
    let mut g = Graph::new();
    let x = g.input(dtype, [rows, cols]);
    let w = g.input(dtype, [cols]);
    let b = g.input(dtype, [cols]);
    let res = g.input(dtype, [rows, cols]);
    let ln = op(&mut g, Op::LayerNorm { eps: 1e-5 }, &[x, w, b]);
    let r = un(&mut g, UnaryOp::Relu, ln);
    let y = add(&mut g, r, res);
    g.set_outputs(vec![y]);
    g
}

/// `gelu_erf(x * a + b) * c` over `n` elements.
pub fn ew_chain(n: usize) -> Graph {
    let mut g = Graph::new();
    let [x, a, b, c] = [0; 4].map(|_| g.input(DType::F32, [n]));
    let xa = mul(&mut g, x, a);
    let xab = add(&mut g, xa, b);
    let act = un(&mut g, UnaryOp::GeluErf, xab);
    let y = mul(&mut g, act, c);
    g.set_outputs(vec![y]);
    g
}

/// `stack([t.sum() for t in ts])`.
pub fn multisum(sizes: &[usize]) -> Graph {
    let mut g = Graph::new();
    let sums: Vec<NodeId> = sizes
        .iter()
        .map(|&n| {
            let t = g.input(DType::F32, [n]);
            sum(&mut g, t, &[0], false)
        })
        .collect();
    let y = op(&mut g, Op::Stack { axis: 0 }, &sums);
    g.set_outputs(vec![y]);
    g
}

/// Sizes log-uniform in `[lo, hi]`, from a fixed seed.
pub fn log_uniform_sizes(k: usize, lo: f64, hi: f64, seed: u64) -> Vec<usize> {
    let mut rng = Lcg(seed);
    (0..k).map(|_| (lo.ln() + rng.unit() * (hi.ln() - lo.ln())).exp().round() as usize).collect()
}

/// `layers` times `x = relu(layer_norm(x, w_i, b_i)) + x`.
pub fn tiny_block(layers: usize, rows: usize, hidden: usize) -> Graph {
    let mut g = Graph::new();
    let mut x = g.input(DType::F32, [rows, hidden]);
    for _ in 0..layers {
        let w = g.input(DType::F32, [hidden]);
        let b = g.input(DType::F32, [hidden]);
        let ln = op(&mut g, Op::LayerNorm { eps: 1e-5 }, &[x, w, b]);
        let r = un(&mut g, UnaryOp::Relu, ln);
        x = add(&mut g, r, x);
    }
    g.set_outputs(vec![x]);
    g
}

/// `layer_norm(x + (gelu_erf(x @ w1 + b1) @ w2 + b2))`.
pub fn mlp_block(dtype: DType, rows: usize, dim: usize, hidden: usize) -> Graph {
    let mut g = Graph::new();
    let x = g.input(dtype, [rows, dim]);
    let w1 = g.input(dtype, [dim, hidden]);
    let b1 = g.input(dtype, [hidden]);
    let w2 = g.input(dtype, [hidden, dim]);
    let b2 = g.input(dtype, [dim]);
    let lw = g.input(dtype, [dim]);
    let lb = g.input(dtype, [dim]);
    let h = op(&mut g, Op::MatMul, &[x, w1]);
    let h = add(&mut g, h, b1);
    let h = un(&mut g, UnaryOp::GeluErf, h);
    let o = op(&mut g, Op::MatMul, &[h, w2]);
    let o = add(&mut g, o, b2);
    let r = add(&mut g, x, o);
    let y = op(&mut g, Op::LayerNorm { eps: 1e-5 }, &[r, lw, lb]);
    g.set_outputs(vec![y]);
    g
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
