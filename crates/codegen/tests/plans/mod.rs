//! The plans that the codegen tests snapshot, covering every kernel family: IR graphs compiled by
//! `braze_passes::compile_to_plan`, so each kernel is typed and shaped as the real pipeline makes
//! it (f32 intermediates and accumulators behind bf16 loads and stores, for one). A plan is built
//! by hand only where the passes cannot produce its shape; the fixture says why.

#![allow(dead_code)]

use braze_ir::{AttentionInput, BinaryOp, DType, Graph, NodeId, Op, ReduceOp, Shape, SourceLoc, UnaryOp};
use braze_passes::{compile_to_plan, FusionOptions};
use braze_plan::{
    Body, Buffer, BufferId, BufferRole, ItemReduction, Kernel, KernelKind, MultiReduce, Plan, PlanOutput, SourceOp,
};

/// Builds an IR graph whose ops carry source locations (`examples/model.rs`, a line per op), then
/// compiles it with the default fusion options.
#[derive(Default)]
pub struct GraphBuilder {
    graph: Graph,
    ops: u32,
}

impl GraphBuilder {
    pub fn input(&mut self, dtype: DType, shape: &[usize]) -> NodeId {
        self.graph.input(dtype, shape.to_vec())
    }

    fn loc(&mut self) -> Option<SourceLoc> {
        self.ops += 1;
        Some(SourceLoc {
            file: "examples/model.rs".into(),
            line: 9 + self.ops,
            col: 17,
            backward: false,
            recomputed: false,
        })
    }

    pub fn op(&mut self, op: Op, operands: &[NodeId]) -> NodeId {
        let loc = self.loc();
        let what = format!("{op:?}");
        self.graph.add(op, operands, loc).unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    pub fn constant(&mut self, value: f64, dtype: DType) -> NodeId {
        self.graph.constant(value, dtype)
    }

    pub fn arange(&mut self, n: usize, dtype: DType) -> NodeId {
        let loc = self.loc();
        let id = self.graph.arange(n, dtype).unwrap();
        self.graph.set_loc(id, loc);
        id
    }

    pub fn unary(&mut self, op: UnaryOp, x: NodeId) -> NodeId {
        self.op(Op::Unary { op }, &[x])
    }

    pub fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
        self.op(Op::Binary { op }, &[a, b])
    }

    pub fn cast(&mut self, x: NodeId, dtype: DType) -> NodeId {
        let shape = self.graph.node(x).shape.clone();
        let loc = self.loc();
        self.graph.add_declared(Op::Cast, &[x], dtype, shape, loc).expect("cast")
    }

    pub fn reduce(&mut self, op: ReduceOp, x: NodeId, axes: &[usize], keepdim: bool) -> NodeId {
        self.op(Op::Reduce { op, axes: axes.to_vec(), keepdim }, &[x])
    }

    /// A reduction over every axis.
    pub fn reduce_all(&mut self, op: ReduceOp, x: NodeId) -> NodeId {
        let rank = self.graph.node(x).shape.rank();
        self.reduce(op, x, &(0..rank).collect::<Vec<_>>(), false)
    }

    /// The plan the passes make of the graph with these outputs: one kernel, which the tests
    /// generate as kernel 0.
    pub fn compile(self, outputs: &[NodeId]) -> Plan {
        self.compile_with(outputs, &FusionOptions::default())
    }

    /// [`GraphBuilder::compile`] with other fusion options.
    pub fn compile_with(self, outputs: &[NodeId], options: &FusionOptions) -> Plan {
        self.compile_into(outputs, options, 1)
    }

    /// The plan of `kernels` kernels the passes make of the graph; the tests generate kernel 0.
    pub fn compile_into(mut self, outputs: &[NodeId], options: &FusionOptions, kernels: usize) -> Plan {
        self.graph.set_outputs(outputs.to_vec());
        let plan = compile_to_plan(&self.graph, options).unwrap_or_else(|e| panic!("{e}"));
        plan.validate().unwrap_or_else(|e| panic!("{e}\n{plan}"));
        assert_eq!(plan.kernels.len(), kernels, "a fixture of {kernels} kernel(s):\n{plan}");
        plan
    }
}

/// The sum of every element of an f32 `[n]`, as an eager op compiles it: a multi-reduce item
/// however short.
pub fn eager_sum(n: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let x = g.input(DType::F32, &[n]);
    let s = g.op(Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdim: false }, &[x]);
    g.compile_with(&[s], &FusionOptions { full_reductions_in_multi_reduce: true, ..FusionOptions::default() })
}

/// `relu(x * w + r) * s + 0.5` over `[64, 256]`: `w` `[256]`, `r` `[64, 1]`, `s` a scalar.
pub fn pointwise_broadcast_f32() -> Plan {
    let mut g = GraphBuilder::default();
    let x = g.input(DType::F32, &[64, 256]);
    let w = g.input(DType::F32, &[256]);
    let r = g.input(DType::F32, &[64, 1]);
    let s = g.input(DType::F32, &[1]);
    let m = g.binary(BinaryOp::Mul, x, w);
    let a = g.binary(BinaryOp::Add, m, r);
    let y = g.unary(UnaryOp::Relu, a);
    let z = g.binary(BinaryOp::Mul, y, s);
    let half = g.constant(0.5, DType::F32);
    let o = g.binary(BinaryOp::Add, z, half);
    g.compile(&[o])
}

/// `gelu_erf(x * a + b) * c` over `n` elements of `dtype` (the `ew_chain` workload).
pub fn ew_chain(dtype: DType, n: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let v: Vec<NodeId> = (0..4).map(|_| g.input(dtype, &[n])).collect();
    let m = g.binary(BinaryOp::Mul, v[0], v[1]);
    let a = g.binary(BinaryOp::Add, m, v[2]);
    let e = g.unary(UnaryOp::GeluErf, a);
    let o = g.binary(BinaryOp::Mul, e, v[3]);
    g.compile(&[o])
}

/// `x * arange(n)` in bf16 and the arange itself as f32, in one kernel: each lane's element index
/// computed where the vector of `x` is loaded (bf16 rounds the indices past 256).
pub fn pointwise_arange(n: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let x = g.input(DType::BF16, &[n]);
    let ids = g.arange(n, DType::BF16);
    let y = g.binary(BinaryOp::Mul, x, ids);
    let wide = g.cast(ids, DType::F32);
    g.compile(&[y, wide])
}

/// Three outputs of three dtypes from `x` `[48, 40]` and the transpose of `t` `[40, 48]`:
/// `s = x + t^T` (f32), `s > t^T` (bool), `int(s * 100)` (i32). The outputs share the one chain
/// (fusion keeps sibling consumers of the loads in kernels of their own).
pub fn pointwise_multi_output() -> Plan {
    let mut g = GraphBuilder::default();
    let x = g.input(DType::F32, &[48, 40]);
    let t = g.input(DType::F32, &[40, 48]);
    let tt = g.op(Op::Permute { perm: vec![1, 0] }, &[t]);
    let s = g.binary(BinaryOp::Add, x, tt);
    let gt = g.binary(BinaryOp::Gt, s, tt);
    let hundred = g.constant(100.0, DType::F32);
    let m = g.binary(BinaryOp::Mul, s, hundred);
    let i = g.cast(m, DType::I32);
    g.compile(&[s, gt, i])
}

/// Independent updates `p - g * lr` of an f32 `[33, 17]`, a bf16 `[1000]` and an empty
/// parameter (`lr` a scalar broadcast into each), and a bias broadcast over rows: four pointwise
/// kernels with no path between them, which fusion groups into one multi-pointwise kernel.
pub fn sgd_updates() -> Plan {
    let mut g = GraphBuilder::default();
    let lr = g.input(DType::F32, &[]);
    let mut outputs = Vec::new();
    for (dtype, shape) in [(DType::F32, vec![33, 17]), (DType::BF16, vec![1000]), (DType::F32, vec![0, 4])] {
        let p = g.input(dtype, &shape);
        let grad = g.input(dtype, &shape);
        let (p32, g32) = (g.cast(p, DType::F32), g.cast(grad, DType::F32));
        let step = g.binary(BinaryOp::Mul, g32, lr);
        let next = g.binary(BinaryOp::Sub, p32, step);
        outputs.push(g.cast(next, dtype));
    }
    let x = g.input(DType::F32, &[64, 8]);
    let bias = g.input(DType::F32, &[8]);
    outputs.push(g.binary(BinaryOp::Add, x, bias));
    g.compile(&outputs)
}

/// `exp(x0 * x1 * ...)` of `streams` tensors of `dtype` over `[n]`: one pointwise kernel
/// streaming that many inputs.
pub fn pointwise_streams(dtype: DType, n: usize, streams: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let first = g.input(dtype, &[n]);
    let product = (1..streams).fold(first, |acc, _| {
        let x = g.input(dtype, &[n]);
        g.binary(BinaryOp::Mul, acc, x)
    });
    let out = g.unary(UnaryOp::Exp, product);
    g.compile(&[out])
}

/// AdamW-shaped updates of two f32 parameters with bf16 gradients: `m' = 0.9 m + 0.1 g`,
/// `v' = 0.99 v + 0.01 g^2`, `p' = p - lr m' / (sqrt(v') + 1e-8)`, the moments f32 and `lr` a
/// device scalar. Independent, so fusion makes one multi-pointwise kernel of them.
pub fn adam_updates(sizes: &[usize]) -> Plan {
    let mut g = GraphBuilder::default();
    let lr = g.input(DType::F32, &[]);
    let mut outputs = Vec::new();
    for &n in sizes {
        let (p, grad, m, v) = (
            g.input(DType::F32, &[n]),
            g.input(DType::BF16, &[n]),
            g.input(DType::F32, &[n]),
            g.input(DType::F32, &[n]),
        );
        let g32 = g.cast(grad, DType::F32);
        let scaled = |g: &mut GraphBuilder, x: NodeId, by: f64| {
            let c = g.constant(by, DType::F32);
            g.binary(BinaryOp::Mul, x, c)
        };
        let (m_kept, g_part) = (scaled(&mut g, m, 0.9), scaled(&mut g, g32, 0.1));
        let m_next = g.binary(BinaryOp::Add, m_kept, g_part);
        let squared = g.binary(BinaryOp::Mul, g32, g32);
        let (v_kept, sq_part) = (scaled(&mut g, v, 0.99), scaled(&mut g, squared, 0.01));
        let v_next = g.binary(BinaryOp::Add, v_kept, sq_part);
        let root = g.unary(UnaryOp::Sqrt, v_next);
        let eps = g.constant(1e-8, DType::F32);
        let denominator = g.binary(BinaryOp::Add, root, eps);
        let ratio = g.binary(BinaryOp::Div, m_next, denominator);
        let step = g.binary(BinaryOp::Mul, ratio, lr);
        let p_next = g.binary(BinaryOp::Sub, p, step);
        outputs.extend([p_next, m_next, v_next]);
    }
    g.compile(&outputs)
}

/// Every unary op and the float binary ops on a bf16 tensor, with casts through f16 and bool.
pub fn pointwise_every_float_op() -> Plan {
    let n = 1000;
    let mut g = GraphBuilder::default();
    let x = g.input(DType::BF16, &[n]);
    let y16 = g.input(DType::F16, &[n]);
    let y = g.cast(y16, DType::BF16);
    let mut acc = x;
    for &op in UnaryOp::ALL {
        if matches!(op, UnaryOp::IsNan | UnaryOp::IsFinite | UnaryOp::Not) {
            continue;
        }
        let u = g.unary(op, acc);
        acc = g.binary(BinaryOp::Add, u, y);
    }
    for op in [BinaryOp::Sub, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min, BinaryOp::Pow] {
        acc = g.binary(op, acc, y);
    }
    let nan = g.unary(UnaryOp::IsNan, acc);
    let finite = g.unary(UnaryOp::IsFinite, acc);
    let x_is_zero = g.cast(x, DType::Bool);
    let not = g.unary(UnaryOp::Not, x_is_zero);
    let either = g.binary(BinaryOp::Or, nan, not);
    let both = g.binary(BinaryOp::And, either, finite);
    let chosen = g.op(Op::Where, &[both, acc, y]);
    let rounded = g.cast(chosen, DType::F16);
    let back = g.cast(rounded, DType::BF16);
    g.compile(&[back, both])
}

/// Integer arithmetic, comparisons and casts on i32 and i64 data.
pub fn pointwise_int_ops() -> Plan {
    let n = 4096;
    let mut g = GraphBuilder::default();
    let a = g.input(DType::I32, &[n]);
    let c = g.input(DType::I64, &[n]);
    let f = g.input(DType::F32, &[n]);
    let seven = g.constant(7.0, DType::I32);
    let mut x = a;
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min] {
        x = g.binary(op, x, seven);
    }
    for op in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu] {
        x = g.unary(op, x);
    }
    let fi = g.cast(f, DType::I32);
    let x = g.binary(BinaryOp::Add, x, fi);
    let wide = g.cast(x, DType::I64);
    let q = g.binary(BinaryOp::Div, c, wide);
    let fl = g.cast(f, DType::I64);
    let q = g.binary(BinaryOp::Mul, q, fl);
    let lt = g.binary(BinaryOp::Lt, q, c);
    let as_float = g.cast(lt, DType::F32);
    let back = g.cast(q, DType::F32);
    let y = g.binary(BinaryOp::Add, as_float, back);
    g.compile(&[x, q, y])
}

/// `x * 2 + 1` over `[3, 2^30]` f32: past 2^31 elements, so index math must be 64-bit.
pub fn pointwise_huge() -> Plan {
    let mut g = GraphBuilder::default();
    let x = g.input(DType::F32, &[3, 1 << 30]);
    let two = g.constant(2.0, DType::F32);
    let one = g.constant(1.0, DType::F32);
    let m = g.binary(BinaryOp::Mul, x, two);
    let a = g.binary(BinaryOp::Add, m, one);
    g.compile(&[a])
}

/// `x + 1` over `[0, 16]`: nothing to launch.
pub fn pointwise_empty() -> Plan {
    let mut g = GraphBuilder::default();
    let x = g.input(DType::F32, &[0, 16]);
    let one = g.constant(1.0, DType::F32);
    let a = g.binary(BinaryOp::Add, x, one);
    g.compile(&[a])
}

/// `relu(layer_norm(x, w, b)) + x` on `x`: one layer of `tiny_block`, or `ln_relu_res` with the
/// residual `res` in place of `x`.
fn ln_relu_add(g: &mut GraphBuilder, x: NodeId, w: NodeId, b: NodeId, res: NodeId) -> NodeId {
    let ln = g.op(Op::LayerNorm { eps: 1e-5 }, &[x, w, b]);
    let r = g.unary(UnaryOp::Relu, ln);
    g.binary(BinaryOp::Add, r, res)
}

/// `relu(layer_norm(x, w, b)) + res` over `[rows, cols]` (the `ln_relu_res` workload).
pub fn ln_relu_res(dtype: DType, rows: usize, cols: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let x = g.input(dtype, &[rows, cols]);
    let w = g.input(dtype, &[cols]);
    let b = g.input(dtype, &[cols]);
    let res = g.input(dtype, &[rows, cols]);
    let y = ln_relu_add(&mut g, x, w, b, res);
    g.compile(&[y])
}

/// `layers` chained `x = relu(layer_norm(x, w_i, b_i)) + x` on `[rows, cols]` f32 in one kernel
/// (the `tiny_block` workload has 16 layers on `[64, 256]`).
pub fn chained_layers(layers: usize, rows: usize, cols: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let mut x = g.input(DType::F32, &[rows, cols]);
    let weights: Vec<(NodeId, NodeId)> =
        (0..layers).map(|_| (g.input(DType::F32, &[cols]), g.input(DType::F32, &[cols]))).collect();
    for (w, b) in weights {
        x = ln_relu_add(&mut g, x, w, b, x);
    }
    g.compile(&[x])
}

/// `softmax(x)` over the last dim of `[rows, cols]` f32, also storing each row's max.
pub fn softmax(rows: usize, cols: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let x = g.input(DType::F32, &[rows, cols]);
    let y = g.op(Op::Softmax { axis: 1 }, &[x]);
    let m = g.reduce(ReduceOp::Max, x, &[1], true);
    g.compile(&[y, m])
}

/// `log_softmax(x)` over the last dim of `[rows, cols]` of `dtype`: at GPT-2's vocabulary a row is
/// longer than a block's cache and is read in chunks.
pub fn log_softmax(dtype: DType, rows: usize, cols: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let x = g.input(dtype, &[rows, cols]);
    let y = g.op(Op::LogSoftmax { axis: 1 }, &[x]);
    g.compile(&[y])
}

/// `mean(x, axis=1)` of `x` `[a, r, c]` bf16: a reduction over a non-trailing axis, so the row
/// domain is `outer [a, c]`, `inner [r]` with column stride `c`.
pub fn mean_middle_axis(a: usize, r: usize, c: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let x = g.input(DType::BF16, &[a, r, c]);
    let m = g.reduce(ReduceOp::Mean, x, &[1], false);
    g.compile(&[m])
}

/// `stack([t.sum() for t in ts])` over tensors of the given lengths.
pub fn multi_sum(items: &[usize], dtype: DType) -> Plan {
    if items.is_empty() {
        return multi_sum_of_nothing(dtype);
    }
    let mut g = GraphBuilder::default();
    let ins: Vec<NodeId> = items.iter().map(|&n| g.input(dtype, &[n])).collect();
    let sums: Vec<NodeId> = ins.into_iter().map(|t| g.reduce_all(ReduceOp::Sum, t)).collect();
    let out = g.op(Op::Stack { axis: 0 }, &sums);
    g.compile(&[out])
}

/// A multi-reduce of no items, built by hand: a graph cannot stack zero tensors, so the passes
/// never write this plan, but the kernel generator must still accept it (an empty launch).
fn multi_sum_of_nothing(dtype: DType) -> Plan {
    let mut plan = Plan::default();
    let out = BufferId(0);
    plan.buffers.push(Buffer { dtype, numel: 0, role: BufferRole::Output });
    plan.outputs.push(PlanOutput { buffer: out, shape: Shape::new(vec![0]) });
    let mut prologue = Body::default();
    prologue.push(MultiReduce::element_load(), dtype);
    let reductions = vec![ItemReduction { op: ReduceOp::Sum, dtype, leaves: 1, prologue }];
    let kind =
        KernelKind::MultiReduce(MultiReduce { reductions, items: vec![], epilogue: Body::default(), stores: vec![] });
    let sources = ["sum", "stack"]
        .iter()
        .enumerate()
        .map(|(i, op)| SourceOp {
            op: op.to_string(),
            loc: Some(SourceLoc {
                file: "examples/model.rs".into(),
                line: 10 + i as u32,
                col: 17,
                backward: false,
                recomputed: false,
            }),
        })
        .collect();
    let name = format!("multi_sum_0x_{}_k0", dtype.name());
    plan.kernels.push(Kernel { name, kind, inputs: vec![], outputs: vec![out], sources });
    plan
}

/// `stack([t.abs().max() for t in ts])` in bf16 (a prologue per element).
pub fn multi_max_abs(items: &[usize]) -> Plan {
    let mut g = GraphBuilder::default();
    let ins: Vec<NodeId> = items.iter().map(|&n| g.input(DType::BF16, &[n])).collect();
    let maxes: Vec<NodeId> = ins
        .into_iter()
        .map(|t| {
            let a = g.unary(UnaryOp::Abs, t);
            g.reduce_all(ReduceOp::Max, a)
        })
        .collect();
    let out = g.op(Op::Stack { axis: 0 }, &maxes);
    g.compile(&[out])
}

/// Prologues over two tensors per item, folded with adds: `sum((p - q)^2)` of f32 pairs of the
/// given lengths, and dot products `sum(f32(p) * f32(q))` of bf16 pairs.
pub fn multi_two_leaves(f32: &[usize], bf16: &[usize]) -> Plan {
    let mut g = GraphBuilder::default();
    let mut total: Option<NodeId> = None;
    for (dtype, sizes) in [(DType::F32, f32), (DType::BF16, bf16)] {
        for &n in sizes {
            let (p, q) = (g.input(dtype, &[n]), g.input(dtype, &[n]));
            let s = if dtype == DType::F32 {
                let d = g.binary(BinaryOp::Sub, p, q);
                let sq = g.binary(BinaryOp::Mul, d, d);
                g.reduce_all(ReduceOp::Sum, sq)
            } else {
                let (p, q) = (g.cast(p, DType::F32), g.cast(q, DType::F32));
                let pq = g.binary(BinaryOp::Mul, p, q);
                g.reduce_all(ReduceOp::Sum, pq)
            };
            total = Some(match total {
                Some(total) => g.binary(BinaryOp::Add, total, s),
                None => s,
            });
        }
    }
    g.compile(&[total.expect("at least one pair")])
}

/// The global gradient norm and the clip scale of `clip_grad_norm`, over bf16 and f32
/// gradients: `sum(f32(g)^2)` per gradient folded with adds, then `sqrt`, `min(1, c / (n + eps))`.
pub fn multi_grad_norm(bf16: &[usize], f32: &[usize]) -> Plan {
    let mut g = GraphBuilder::default();
    let mut total: Option<NodeId> = None;
    for (dtype, sizes) in [(DType::BF16, bf16), (DType::F32, f32)] {
        for &n in sizes {
            let t = g.input(dtype, &[n]);
            let t = if dtype == DType::F32 { t } else { g.cast(t, DType::F32) };
            let sq = g.binary(BinaryOp::Mul, t, t);
            let s = g.reduce_all(ReduceOp::Sum, sq);
            total = Some(match total {
                Some(total) => g.binary(BinaryOp::Add, total, s),
                None => s,
            });
        }
    }
    let norm = g.unary(UnaryOp::Sqrt, total.expect("some gradients"));
    let eps = g.constant(1e-6, DType::F32);
    let shifted = g.binary(BinaryOp::Add, norm, eps);
    let inverse = g.unary(UnaryOp::Reciprocal, shifted);
    let max_norm = g.constant(1.0, DType::F32);
    let ratio = g.binary(BinaryOp::Mul, inverse, max_norm);
    let scale = g.binary(BinaryOp::Min, ratio, max_norm);
    g.compile(&[norm, scale])
}

/// `any(!isfinite(t))` per tensor, folded with `logical_or`.
pub fn multi_any_non_finite(f32: &[usize], f16: &[usize]) -> Plan {
    let mut g = GraphBuilder::default();
    let mut found: Option<NodeId> = None;
    for (dtype, sizes) in [(DType::F32, f32), (DType::F16, f16)] {
        for &n in sizes {
            let t = g.input(dtype, &[n]);
            let finite = g.unary(UnaryOp::IsFinite, t);
            let bad = g.unary(UnaryOp::Not, finite);
            let any = g.reduce_all(ReduceOp::Max, bad);
            found = Some(match found {
                Some(f) => g.binary(BinaryOp::Or, f, any),
                None => any,
            });
        }
    }
    g.compile(&[found.expect("some tensors")])
}

/// `stack([(t * t).mean() for t in ts])` in f32 (a squaring prologue).
pub fn multi_mean_square(items: &[usize]) -> Plan {
    let mut g = GraphBuilder::default();
    let ins: Vec<NodeId> = items.iter().map(|&n| g.input(DType::F32, &[n])).collect();
    let means: Vec<NodeId> = ins
        .into_iter()
        .map(|t| {
            let sq = g.binary(BinaryOp::Mul, t, t);
            g.reduce_all(ReduceOp::Mean, sq)
        })
        .collect();
    let out = g.op(Op::Stack { axis: 0 }, &means);
    g.compile(&[out])
}

/// Concatenation along axis 1 of `[4, e, 32]` inputs.
pub fn concat(extents: &[usize], dtype: DType) -> Plan {
    let mut g = GraphBuilder::default();
    let ins: Vec<NodeId> = extents.iter().map(|&e| g.input(dtype, &[4, e, 32])).collect();
    let out = g.op(Op::Concat { axis: 1 }, &ins);
    g.compile(&[out])
}

/// A bf16 matmul with bias and GELU epilogue.
pub fn matmul() -> Plan {
    let mut g = GraphBuilder::default();
    let a = g.input(DType::BF16, &[64, 128]);
    let b = g.input(DType::BF16, &[128, 32]);
    let bias = g.input(DType::BF16, &[32]);
    let m = g.op(Op::MatMul, &[a, b]);
    let biased = g.binary(BinaryOp::Add, m, bias);
    let y = g.unary(UnaryOp::GeluTanh, biased);
    g.compile(&[y])
}

/// RMS norm of bf16 rows scaled per row: `y = x * (rsqrt(mean(x^2) + eps) * s) * w` with `s`
/// `[rows, 1]` (a per-row load), also storing each row's `rsqrt(...)` as f32 (a per-row store of
/// another dtype).
pub fn rms_norm_scaled(rows: usize, cols: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let x = g.input(DType::BF16, &[rows, cols]);
    let w = g.input(DType::BF16, &[cols]);
    let s = g.input(DType::BF16, &[rows, 1]);
    let sq = g.binary(BinaryOp::Mul, x, x);
    let ms = g.reduce(ReduceOp::Mean, sq, &[1], true);
    let eps = g.constant(1e-6, DType::BF16);
    let me = g.binary(BinaryOp::Add, ms, eps);
    let rstd = g.unary(UnaryOp::Rsqrt, me);
    let row_scale = g.binary(BinaryOp::Mul, rstd, s);
    let n = g.binary(BinaryOp::Mul, x, row_scale);
    let y = g.binary(BinaryOp::Mul, n, w);
    let rstd32 = g.cast(rstd, DType::F32);
    g.compile(&[y, rstd32])
}

/// Per row of an i32 `[rows, cols]`: the largest element (an i32 max, kept as `[rows, 1]`) and
/// how many elements are below it (an i64 sum of casts from bool that depends on the max: fusion
/// keeps independent reductions of one row in kernels of their own).
pub fn count_below_max(rows: usize, cols: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let x = g.input(DType::I32, &[rows, cols]);
    let largest = g.reduce(ReduceOp::Max, x, &[1], true);
    let below = g.binary(BinaryOp::Lt, x, largest);
    let as_int = g.cast(below, DType::I64);
    let count = g.reduce(ReduceOp::Sum, as_int, &[1], false);
    g.compile(&[count, largest])
}

/// A linear layer's bias grad: `sum(dy, axes=[0])` of an f32 `[rows, cols]`.
pub fn bias_grad(rows: usize, cols: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let dy = g.input(DType::F32, &[rows, cols]);
    let db = g.reduce(ReduceOp::Sum, dy, &[0], false);
    g.compile(&[db])
}

/// A bf16 layer norm's weight and bias grads, `sum(dy * xhat)` and `sum(dy)` over the leading
/// axes of `[batch, seq, hidden]`, accumulated in f32 and stored as bf16: one kernel with two
/// reductions and the product as its prologue.
pub fn norm_weight_bias_grads_bf16(batch: usize, seq: usize, hidden: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let dy = g.input(DType::BF16, &[batch, seq, hidden]);
    let xhat = g.input(DType::BF16, &[batch, seq, hidden]);
    let prod = g.binary(BinaryOp::Mul, dy, xhat);
    let dw = g.reduce(ReduceOp::Sum, prod, &[0, 1], false);
    let db = g.reduce(ReduceOp::Sum, dy, &[0, 1], false);
    g.compile(&[dw, db])
}

/// A layer-norm-like backward row over `[rows, cols]` of `dtype`: the centred row `y` stored,
/// and the column sums of `y` and `x * y` folded into the row kernel as partials over groups
/// of rows (kernel 0), reduced by a column kernel after it (kernel 1).
pub fn row_with_column_partials(dtype: DType, rows: usize, cols: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let x = g.input(dtype, &[rows, cols]);
    let xf = g.cast(x, DType::F32);
    let mean = g.reduce(ReduceOp::Mean, xf, &[1], true);
    let centred = g.binary(BinaryOp::Sub, xf, mean);
    let y = g.cast(centred, dtype);
    let yf = g.cast(y, DType::F32);
    let product = g.binary(BinaryOp::Mul, xf, yf);
    let sum_y = g.reduce(ReduceOp::Sum, yf, &[0], false);
    let sum_xy = g.reduce(ReduceOp::Sum, product, &[0], false);
    g.compile_into(&[y, sum_y, sum_xy], &FusionOptions::default(), 2)
}

/// `max(x, axes=[0])` of an f32 `[rows, cols]` with a column count no vector divides.
pub fn column_max(rows: usize, cols: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let x = g.input(DType::F32, &[rows, cols]);
    let m = g.reduce(ReduceOp::Max, x, &[0], true);
    g.compile(&[m])
}

/// Whether any element of each column of an i32 `[rows, cols]` is positive (a bool max over
/// rows, accumulated as an int).
pub fn column_any_positive(rows: usize, cols: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let x = g.input(DType::I32, &[rows, cols]);
    let zero = g.constant(0.0, DType::I32);
    let positive = g.binary(BinaryOp::Gt, x, zero);
    let any = g.reduce(ReduceOp::Max, positive, &[0], false);
    g.compile(&[any])
}

/// `attention(q, k, v)` and its lse over `[batch, heads, seq, head_dim]` operands, default scale:
/// one flash forward kernel storing both.
pub fn attention_forward(dtype: DType, shape: [usize; 4], causal: bool) -> Plan {
    let mut g = GraphBuilder::default();
    let qkv: Vec<NodeId> = (0..3).map(|_| g.input(dtype, &shape)).collect();
    let scale = 1.0 / (shape[3] as f64).sqrt();
    let out = g.op(Op::Attention { causal, scale }, &qkv);
    let lse = g.op(Op::AttentionLse { causal, scale }, &qkv[..2]);
    g.compile(&[out, lse])
}

/// The attention gradients `wrt` from given q, k, v, lse, delta and dout: the dq kernel, or
/// the dk/dv kernel.
pub fn attention_backward(dtype: DType, shape: [usize; 4], causal: bool, wrt: &[AttentionInput]) -> Plan {
    let mut g = GraphBuilder::default();
    let qkv: Vec<NodeId> = (0..3).map(|_| g.input(dtype, &shape)).collect();
    let lse = g.input(DType::F32, &shape[..3]);
    let delta = g.input(DType::F32, &shape[..3]);
    let dout = g.input(dtype, &shape);
    let scale = 1.0 / (shape[3] as f64).sqrt();
    let grads: Vec<NodeId> = wrt
        .iter()
        .map(|&wrt| g.op(Op::AttentionGrad { causal, scale, wrt }, &[qkv[0], qkv[1], qkv[2], lse, delta, dout]))
        .collect();
    g.compile(&grads)
}

/// The scatter-add of an index_select's gradient: `src` `[outer, indices, inner]` of `dtype`
/// added at `indices` (of `index`) into `[outer, size, inner]`.
pub fn index_add(dtype: DType, index: DType, outer: usize, indices: usize, inner: usize, size: usize) -> Plan {
    let mut g = GraphBuilder::default();
    let src = g.input(dtype, &[outer, indices, inner]);
    let at = g.input(index, &[indices]);
    let out = g.op(Op::IndexAdd { axis: 1, size }, &[src, at]);
    g.compile(&[out])
}

/// Every fixture plan, named as its snapshot.
pub fn all_plans() -> Vec<(&'static str, Plan)> {
    vec![
        ("pointwise_broadcast_f32", pointwise_broadcast_f32()),
        ("pointwise_ew_chain_f32", ew_chain(DType::F32, 1 << 26)),
        ("pointwise_bf16_vectorized", ew_chain(DType::BF16, 1_000_003)),
        ("pointwise_multi_output", pointwise_multi_output()),
        ("pointwise_every_float_op", pointwise_every_float_op()),
        ("pointwise_int_ops", pointwise_int_ops()),
        ("pointwise_64bit_index", pointwise_huge()),
        ("pointwise_empty", pointwise_empty()),
        ("pointwise_arange_bf16", pointwise_arange(1_000_003)),
        ("row_ln_relu_res_f32", ln_relu_res(DType::F32, 16_384, 4096)),
        ("row_ln_relu_res_bf16", ln_relu_res(DType::BF16, 16_384, 4096)),
        ("row_ln_relu_res_f32_1024", ln_relu_res(DType::F32, 65_536, 1024)),
        ("row_two_layers", chained_layers(2, 64, 256)),
        ("row_tiny_block_16_layers", chained_layers(16, 64, 256)),
        ("row_softmax", softmax(1024, 1000)),
        ("row_mean_middle_axis", mean_middle_axis(32, 1000, 64)),
        ("row_softmax_zero_columns", softmax(4, 0)),
        ("row_log_softmax_f32", log_softmax(DType::F32, 1024, 1000)),
        ("row_log_softmax_vocab_bf16", log_softmax(DType::BF16, 64, 50_257)),
        ("row_rms_norm_per_row_scale_bf16", rms_norm_scaled(4096, 2048)),
        ("row_int_count_and_max", count_below_max(1000, 300)),
        ("multi_reduce_sum_5", multi_sum(&[100_000, 0, 37, 5000, 16_385], DType::F32)),
        ("multi_reduce_max_abs_bf16", multi_max_abs(&[70_000, 3, 0, 2_000, 1_024])),
        ("multi_reduce_mean_square", multi_mean_square(&[10, 300, 0])),
        ("multi_reduce_grad_norm", multi_grad_norm(&[70_000, 33, 0], &[4096, 1, 20_000])),
        ("multi_reduce_any_non_finite", multi_any_non_finite(&[1000, 40_000, 7], &[300, 0])),
        ("multi_reduce_two_leaves", multi_two_leaves(&[50_000, 3, 0], &[1000, 20_000])),
        ("concat_3", concat(&[10, 6, 16], DType::F32)),
        ("concat_20_bf16", concat(&[3; 20], DType::BF16)),
        ("multi_reduce_no_items", multi_sum(&[], DType::F32)),
        ("column_bias_grad_f32", bias_grad(4096, 1024)),
        ("column_bias_grad_small_f32", bias_grad(64, 32)),
        ("column_norm_grads_bf16", norm_weight_bias_grads_bf16(8, 512, 768)),
        ("column_max_odd_columns", column_max(65_536, 7)),
        ("column_any_positive", column_any_positive(1000, 300)),
        ("multi_pointwise_sgd_updates", sgd_updates()),
        ("attention_causal_bf16_d64", attention_forward(DType::BF16, [16, 12, 1024, 64], true)),
        ("attention_f32_d128_t1000", attention_forward(DType::F32, [2, 3, 1000, 128], false)),
        ("attention_f16_t17", attention_forward(DType::F16, [1, 2, 17, 64], true)),
        // GPT-2's token embedding gradient: V = 50,304, C = 768, 16k tokens.
        ("index_add_gpt2_embedding_f32", index_add(DType::F32, DType::I64, 1, 16_384, 768, 50_304)),
        ("index_add_bf16_ragged_inner", index_add(DType::BF16, DType::I32, 3, 1000, 100, 77)),
        ("index_add_f16_wide_inner", index_add(DType::F16, DType::I64, 1, 300, 5000, 40)),
        ("index_add_f32_odd_inner", index_add(DType::F32, DType::I32, 2, 37, 7, 5)),
        ("index_add_i64", index_add(DType::I64, DType::I64, 1, 64, 12, 9)),
        ("index_add_no_indices", index_add(DType::F32, DType::I64, 2, 0, 16, 5)),
        ("index_add_64bit_index", index_add(DType::F32, DType::I32, 1, 4096, 1024, 2_200_000)),
        (
            "attention_backward_dq_causal_bf16_d64",
            attention_backward(DType::BF16, [16, 12, 1024, 64], true, &[AttentionInput::Query]),
        ),
        (
            "attention_backward_dk_dv_causal_bf16_d64",
            attention_backward(DType::BF16, [16, 12, 1024, 64], true, &[AttentionInput::Key, AttentionInput::Value]),
        ),
        (
            "attention_backward_dk_dv_f32_d128",
            attention_backward(DType::F32, [1, 2, 1000, 128], false, &[AttentionInput::Key, AttentionInput::Value]),
        ),
        (
            "attention_backward_dv_only_f16",
            attention_backward(DType::F16, [1, 1, 17, 128], false, &[AttentionInput::Value]),
        ),
    ]
}
