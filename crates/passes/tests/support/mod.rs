//! Shared by the test files: graph builders for the benchmark workloads and a small f64
//! interpreter for graphs and plans, so fusion can be checked against the graph it came from.
//! (Rounding to f16/bf16 is ignored on both sides: the interpreters compare indexing, broadcasting
//! and op order, not precision.)

#![allow(dead_code)]

use braze_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, Shape, UnaryOp};
use braze_passes::{Activation, Body, Expr, KernelKind, Plan};

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

// ---- interpreter ------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

pub struct Lcg(pub u64);

impl Lcg {
    pub fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Random inputs for every graph input: floats in [-2, 2), ints in [-5, 5], bools.
pub fn random_inputs(g: &Graph, seed: u64) -> Vec<Tensor> {
    let mut rng = Lcg(seed);
    g.inputs()
        .iter()
        .map(|&i| {
            let n = g.node(i);
            let data = (0..n.shape.numel())
                .map(|_| match n.dtype {
                    DType::Bool => (rng.unit() < 0.5) as u8 as f64,
                    DType::I32 | DType::I64 => (rng.unit() * 11.0).floor() - 5.0,
                    _ => rng.unit() * 4.0 - 2.0,
                })
                .collect();
            Tensor { shape: n.shape.dims().to_vec(), data }
        })
        .collect()
}

fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        if dims[d] > 0 {
            idx[d] = flat % dims[d];
            flat /= dims[d];
        }
    }
    idx
}

fn strides(dims: &[usize]) -> Vec<usize> {
    Shape(dims.to_vec()).strides()
}

/// Index into a tensor of `dims` for an index of `out` (NumPy broadcasting).
fn broadcast_index(idx: &[usize], dims: &[usize]) -> usize {
    let lead = idx.len() - dims.len();
    let st = strides(dims);
    (0..dims.len()).map(|d| if dims[d] == 1 { 0 } else { idx[lead + d] * st[d] }).sum()
}

pub fn erf(x: f64) -> f64 {
    // Numerical Recipes erfc (Chebyshev), relative error below 1.2e-7: the same on both sides.
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418
                        + t * (-0.18628806
                            + t * (0.27886807
                                + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
            .exp();
    if x >= 0.0 {
        1.0 - r
    } else {
        r - 1.0
    }
}

fn unary(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Reciprocal => 1.0 / x,
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::GeluErf => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        UnaryOp::GeluTanh => {
            0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        }
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::IsNan => x.is_nan() as u8 as f64,
        UnaryOp::IsFinite => x.is_finite() as u8 as f64,
        UnaryOp::Not => (x == 0.0) as u8 as f64,
    }
}

fn binary(op: BinaryOp, a: f64, b: f64, dtype: DType) -> f64 {
    let int = dtype.is_int();
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div if int => {
            if b == 0.0 {
                0.0
            } else {
                (a / b).trunc()
            }
        }
        BinaryOp::Div => a / b,
        BinaryOp::Max => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        }
        BinaryOp::Min => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        }
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Eq => (a == b) as u8 as f64,
        BinaryOp::Ne => (a != b) as u8 as f64,
        BinaryOp::Lt => (a < b) as u8 as f64,
        BinaryOp::Le => (a <= b) as u8 as f64,
        BinaryOp::Gt => (a > b) as u8 as f64,
        BinaryOp::Ge => (a >= b) as u8 as f64,
        BinaryOp::And => (a != 0.0 && b != 0.0) as u8 as f64,
        BinaryOp::Or => (a != 0.0 || b != 0.0) as u8 as f64,
    }
}

fn cast(x: f64, to: DType) -> f64 {
    match to {
        DType::Bool => (x != 0.0) as u8 as f64,
        DType::I32 | DType::I64 => x.trunc(),
        _ => x,
    }
}

fn reduce_values(op: ReduceOp, values: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = values.collect();
    match op {
        ReduceOp::Sum => v.iter().sum(),
        ReduceOp::Mean => v.iter().sum::<f64>() / v.len() as f64,
        ReduceOp::Max => {
            v.iter().fold(f64::NEG_INFINITY, |a, &b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) })
        }
        ReduceOp::Min => {
            v.iter().fold(f64::INFINITY, |a, &b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.min(b) })
        }
    }
}

fn reduce(op: ReduceOp, x: &Tensor, axes: &[usize], keepdim: bool) -> Tensor {
    let kept: Vec<usize> = (0..x.shape.len()).filter(|d| !axes.contains(d)).collect();
    let out_dims: Vec<usize> = kept.iter().map(|&d| x.shape[d]).collect();
    let red_dims: Vec<usize> = axes.iter().map(|&a| x.shape[a]).collect();
    let st = strides(&x.shape);
    let n_out: usize = out_dims.iter().product();
    let n_red: usize = red_dims.iter().product();
    let data = (0..n_out)
        .map(|o| {
            let oi = unravel(o, &out_dims);
            reduce_values(
                op,
                (0..n_red).map(|r| {
                    let ri = unravel(r, &red_dims);
                    let flat: usize = kept.iter().zip(&oi).map(|(&d, &i)| i * st[d]).sum::<usize>()
                        + axes.iter().zip(&ri).map(|(&d, &i)| i * st[d]).sum::<usize>();
                    x.data[flat]
                }),
            )
        })
        .collect();
    let shape = braze_ir::infer::reduced_shape(&Shape(x.shape.clone()), axes, keepdim).0;
    Tensor { shape, data }
}

fn elementwise(out: &[usize], operands: &[&Tensor], f: impl Fn(&[f64]) -> f64) -> Tensor {
    let n: usize = out.iter().product();
    let data = (0..n)
        .map(|i| {
            let idx = unravel(i, out);
            let args: Vec<f64> = operands.iter().map(|t| t.data[broadcast_index(&idx, &t.shape)]).collect();
            f(&args)
        })
        .collect();
    Tensor { shape: out.to_vec(), data }
}

pub fn eval_graph(g: &Graph, inputs: &[Tensor]) -> Vec<Tensor> {
    let mut vals: std::collections::HashMap<NodeId, Tensor> = Default::default();
    for id in g.topo_order() {
        let node = g.node(id);
        let args: Vec<&Tensor> = node.operands.iter().map(|o| &vals[o]).collect();
        let out = node.shape.dims();
        let dt = node.dtype;
        let t = match &node.op {
            Op::Input { index } => inputs[*index].clone(),
            Op::Constant { value } => Tensor { shape: vec![], data: vec![cast(*value, dt)] },
            Op::Cast => elementwise(out, &args, |a| cast(a[0], dt)),
            Op::Unary { op } => elementwise(out, &args, |a| unary(*op, a[0])),
            Op::Binary { op } => {
                let odt = g.node(node.operands[0]).dtype;
                elementwise(out, &args, |a| binary(*op, a[0], a[1], odt))
            }
            Op::Where => elementwise(out, &args, |a| if a[0] != 0.0 { a[1] } else { a[2] }),
            Op::Reduce { op, axes, keepdim } => reduce(*op, args[0], axes, *keepdim),
            Op::Reshape => Tensor { shape: out.to_vec(), data: args[0].data.clone() },
            Op::BroadcastTo => elementwise(out, &args, |a| a[0]),
            Op::Permute { perm } => {
                let st = strides(&args[0].shape);
                let n: usize = out.iter().product();
                let data = (0..n)
                    .map(|i| {
                        let idx = unravel(i, out);
                        args[0].data[perm.iter().zip(&idx).map(|(&p, &i)| i * st[p]).sum::<usize>()]
                    })
                    .collect();
                Tensor { shape: out.to_vec(), data }
            }
            Op::Slice { axis, start, step, .. } => {
                let st = strides(&args[0].shape);
                let n: usize = out.iter().product();
                let data = (0..n)
                    .map(|i| {
                        let mut idx = unravel(i, out);
                        idx[*axis] = start + idx[*axis] * step;
                        args[0].data[idx.iter().zip(&st).map(|(a, b)| a * b).sum::<usize>()]
                    })
                    .collect();
                Tensor { shape: out.to_vec(), data }
            }
            Op::Concat { axis } => concat(out, *axis, &args),
            Op::Stack { axis } => {
                let parts: Vec<Tensor> = args
                    .iter()
                    .map(|t| {
                        let mut s = t.shape.clone();
                        s.insert(*axis, 1);
                        Tensor { shape: s, data: t.data.clone() }
                    })
                    .collect();
                concat(out, *axis, &parts.iter().collect::<Vec<_>>())
            }
            Op::MatMul => matmul(out, args[0], args[1]),
            Op::LayerNorm { eps } => norm(args[0], Some(args[1]), Some(args[2]), *eps, true),
            Op::RmsNorm { eps } => norm(args[0], Some(args[1]), None, *eps, false),
            Op::Softmax { axis } => {
                let m = reduce(ReduceOp::Max, args[0], &[*axis], true);
                let e = elementwise(out, &[args[0], &m], |a| (a[0] - a[1]).exp());
                let s = reduce(ReduceOp::Sum, &e, &[*axis], true);
                elementwise(out, &[&e, &s], |a| a[0] / a[1])
            }
        };
        vals.insert(id, t);
    }
    g.outputs().iter().map(|o| vals[o].clone()).collect()
}

fn concat(out: &[usize], axis: usize, parts: &[&Tensor]) -> Tensor {
    let n: usize = out.iter().product();
    let data = (0..n)
        .map(|i| {
            let mut idx = unravel(i, out);
            let mut part = 0;
            while idx[axis] >= parts[part].shape[axis] {
                idx[axis] -= parts[part].shape[axis];
                part += 1;
            }
            let st = strides(&parts[part].shape);
            parts[part].data[idx.iter().zip(&st).map(|(a, b)| a * b).sum::<usize>()]
        })
        .collect();
    Tensor { shape: out.to_vec(), data }
}

fn matmul(out: &[usize], a: &Tensor, b: &Tensor) -> Tensor {
    let r = out.len();
    let (m, n) = (out[r - 2], out[r - 1]);
    let k = a.shape[a.shape.len() - 1];
    let n_out: usize = out.iter().product();
    let data = (0..n_out)
        .map(|i| {
            let idx = unravel(i, out);
            (0..k)
                .map(|kk| {
                    let mut ia = idx.clone();
                    ia[r - 1] = kk;
                    let mut ib = idx.clone();
                    ib[r - 2] = kk;
                    let a_dims: Vec<usize> = a.shape.clone();
                    let b_dims: Vec<usize> = b.shape.clone();
                    let _ = (m, n);
                    a.data[broadcast_index(&ia, &a_dims)] * b.data[broadcast_index(&ib, &b_dims)]
                })
                .sum()
        })
        .collect();
    Tensor { shape: out.to_vec(), data }
}

fn norm(x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>, eps: f64, centered: bool) -> Tensor {
    let cols = *x.shape.last().unwrap();
    let mut data = x.data.clone();
    for row in data.chunks_mut(cols) {
        let mean = if centered { row.iter().sum::<f64>() / cols as f64 } else { 0.0 };
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
        let scale = 1.0 / (var + eps).sqrt();
        for (c, v) in row.iter_mut().enumerate() {
            *v = (*v - mean) * scale * w.map_or(1.0, |w| w.data[c]) + b.map_or(0.0, |b| b.data[c]);
        }
    }
    Tensor { shape: x.shape.clone(), data }
}

/// Runs a plan the way `plan.rs` defines it.
pub fn eval_plan(plan: &Plan, inputs: &[Tensor]) -> Vec<Tensor> {
    let mut bufs: Vec<Vec<f64>> = plan.buffers.iter().map(|b| vec![0.0; b.numel]).collect();
    for (i, &b) in plan.inputs.iter().enumerate() {
        bufs[b.0] = inputs[i].data.clone();
    }
    for k in &plan.kernels {
        let ins: Vec<Vec<f64>> = k.inputs.iter().map(|b| bufs[b.0].clone()).collect();
        let mut outs: Vec<Vec<f64>> = k.outputs.iter().map(|b| vec![0.0; plan.buffer(*b).numel]).collect();
        match &k.kind {
            KernelKind::Pointwise(pw) => {
                let dims = pw.shape.dims();
                for (i, idx) in (0..pw.shape.numel()).map(|i| (i, unravel(i, dims))) {
                    let vals = eval_body(&pw.body, &ins, &idx);
                    for s in &pw.body.stores {
                        outs[s.output][i] = vals[s.value.0];
                    }
                }
            }
            KernelKind::Row(row) => {
                let domain = row.domain();
                let (rows, cols) = (row.rows(), row.cols());
                let per_row = row.body.row_values(row.outer.len());
                for r in 0..rows {
                    // Every value as a vector over the row's columns.
                    let mut lanes: Vec<Vec<f64>> = Vec::new();
                    for v in &row.body.values {
                        let lane: Vec<f64> = match &v.expr {
                            Expr::Reduce { op, x } => {
                                let total = reduce_values(*op, lanes[x.0].iter().copied());
                                vec![total; cols]
                            }
                            expr => (0..cols)
                                .map(|c| {
                                    let idx = unravel(r * cols + c, domain.dims());
                                    eval_expr(expr, v.dtype, &ins, &idx, |id| lanes[id.0][c])
                                })
                                .collect(),
                        };
                        lanes.push(lane);
                    }
                    for s in &row.body.stores {
                        if per_row[s.value.0] {
                            if cols > 0 {
                                outs[s.output][r] = lanes[s.value.0][0];
                            }
                        } else {
                            for c in 0..cols {
                                outs[s.output][r * cols + c] = lanes[s.value.0][c];
                            }
                        }
                    }
                }
            }
            KernelKind::MultiReduce(mr) => {
                for (i, &n) in mr.items.iter().enumerate() {
                    let values = (0..n).map(|e| {
                        let vals = eval_body(&mr.prologue, &[vec![ins[i][e]]], &[0]);
                        *vals.last().unwrap()
                    });
                    outs[0][i] = reduce_values(mr.op, values);
                }
            }
            KernelKind::MatMul(mm) => {
                let batches: usize = mm.batch.iter().product();
                for bt in 0..batches {
                    for i in 0..mm.m {
                        for j in 0..mm.n {
                            let mut acc = 0.0;
                            for kk in 0..mm.k {
                                let a = if mm.a_transposed { kk * mm.m + i } else { i * mm.k + kk };
                                let b = if mm.b_transposed { j * mm.k + kk } else { kk * mm.n + j };
                                acc += ins[0][bt * mm.a_batch_stride + a] * ins[1][bt * mm.b_batch_stride + b];
                            }
                            if mm.bias {
                                acc += ins[2][j];
                            }
                            acc = match mm.activation {
                                Some(Activation::Relu) => unary(UnaryOp::Relu, acc),
                                Some(Activation::GeluTanh) => unary(UnaryOp::GeluTanh, acc),
                                None => acc,
                            };
                            outs[0][(bt * mm.m + i) * mm.n + j] = acc;
                        }
                    }
                }
            }
            KernelKind::Concat(cat) => {
                let parts: Vec<Tensor> = ins
                    .iter()
                    .zip(&cat.extents)
                    .map(|(data, &e)| {
                        let mut shape = cat.shape.dims().to_vec();
                        shape[cat.axis] = e;
                        Tensor { shape, data: data.clone() }
                    })
                    .collect();
                outs[0] = concat(cat.shape.dims(), cat.axis, &parts.iter().collect::<Vec<_>>()).data;
            }
        }
        for (o, b) in outs.into_iter().zip(&k.outputs) {
            bufs[b.0] = o;
        }
    }
    plan.outputs.iter().map(|o| Tensor { shape: o.shape.dims().to_vec(), data: bufs[o.buffer.0].clone() }).collect()
}

fn eval_body(body: &Body, ins: &[Vec<f64>], idx: &[usize]) -> Vec<f64> {
    let mut vals: Vec<f64> = Vec::with_capacity(body.values.len());
    for v in &body.values {
        let x = eval_expr(&v.expr, v.dtype, ins, idx, |id| vals[id.0]);
        vals.push(x);
    }
    vals
}

fn eval_expr(
    expr: &Expr,
    dtype: DType,
    ins: &[Vec<f64>],
    idx: &[usize],
    val: impl Fn(braze_passes::ValueId) -> f64,
) -> f64 {
    match expr {
        Expr::Load { input, offset, strides } => {
            ins[*input][offset + idx.iter().zip(strides).map(|(a, b)| a * b).sum::<usize>()]
        }
        Expr::Const { value } => cast(*value, dtype),
        Expr::Cast { x } => cast(val(*x), dtype),
        Expr::Unary { op, x } => unary(*op, val(*x)),
        Expr::Binary { op, a, b } => binary(*op, val(*a), val(*b), dtype),
        Expr::Where { cond, a, b } => {
            if val(*cond) != 0.0 {
                val(*a)
            } else {
                val(*b)
            }
        }
        Expr::Reduce { .. } => unreachable!("reductions are evaluated per row"),
    }
}

/// Asserts two results agree to 1e-9 (relative), NaN matching NaN.
pub fn assert_close(got: &[Tensor], want: &[Tensor], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: output count");
    for (j, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.shape, w.shape, "{what}: output {j} shape");
        for (i, (a, b)) in g.data.iter().zip(&w.data).enumerate() {
            let ok = (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-9 * (1.0 + b.abs());
            assert!(ok, "{what}: output {j} element {i}: plan {a}, graph {b}");
        }
    }
}
