//! Hand-built plans covering every kernel family, shared by the codegen tests.

#![allow(dead_code)]

use braze_ir::{BinaryOp, DType, Literal, ReduceOp, Shape, SourceLoc, UnaryOp};
use braze_plan::{
    Body, Buffer, BufferId, BufferRole, Concat, Expr, Kernel, KernelKind, MatMul, MultiReduce, Plan, PlanOutput,
    Pointwise, RowKernel, SourceOp, Store, ValueId,
};

/// Builds a one-kernel plan: buffers, then the kernel.
#[derive(Default)]
pub struct PlanBuilder {
    plan: Plan,
}

impl PlanBuilder {
    pub fn input(&mut self, dtype: DType, numel: usize) -> BufferId {
        let id = BufferId(self.plan.buffers.len());
        self.plan.buffers.push(Buffer { dtype, numel, role: BufferRole::Input(self.plan.inputs.len()) });
        self.plan.inputs.push(id);
        id
    }

    pub fn output(&mut self, dtype: DType, shape: &[usize]) -> BufferId {
        let id = BufferId(self.plan.buffers.len());
        let shape = Shape::new(shape.to_vec());
        self.plan.buffers.push(Buffer { dtype, numel: shape.numel(), role: BufferRole::Output });
        self.plan.outputs.push(PlanOutput { buffer: id, shape });
        id
    }

    pub fn kernel(
        mut self,
        name: &str,
        kind: KernelKind,
        inputs: Vec<BufferId>,
        outputs: Vec<BufferId>,
        ops: &[&str],
    ) -> Plan {
        let sources = ops
            .iter()
            .enumerate()
            .map(|(i, op)| SourceOp {
                op: op.to_string(),
                loc: Some(SourceLoc { file: "examples/model.rs".into(), line: 10 + i as u32, col: 17 }),
            })
            .collect();
        self.plan.kernels.push(Kernel { name: name.into(), kind, inputs, outputs, sources });
        self.plan
    }
}

fn load(body: &mut Body, input: usize, strides: &[usize], dtype: DType) -> ValueId {
    body.push(Expr::Load { input, offset: 0, strides: strides.to_vec() }, dtype)
}

fn bin(body: &mut Body, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
    let dtype = body.values[a.0].dtype;
    let dtype = op.result_dtype(dtype);
    body.push(Expr::Binary { op, a, b }, dtype)
}

fn un(body: &mut Body, op: UnaryOp, x: ValueId) -> ValueId {
    let dtype = op.result_dtype(body.values[x.0].dtype);
    body.push(Expr::Unary { op, x }, dtype)
}

fn constant(body: &mut Body, value: f64, dtype: DType) -> ValueId {
    body.push(Expr::Const { value: Literal::of_f64(value, dtype) }, dtype)
}

fn reduce(body: &mut Body, op: ReduceOp, x: ValueId) -> ValueId {
    let dtype = body.values[x.0].dtype;
    body.push(Expr::Reduce { op, x }, dtype)
}

/// `relu(x * w + r) * s + 0.5` over `[64, 256]`: `w` `[256]`, `r` `[64, 1]`, `s` a scalar.
pub fn pointwise_broadcast_f32() -> Plan {
    let mut p = PlanBuilder::default();
    let x = p.input(DType::F32, 64 * 256);
    let w = p.input(DType::F32, 256);
    let r = p.input(DType::F32, 64);
    let s = p.input(DType::F32, 1);
    let out = p.output(DType::F32, &[64, 256]);
    let mut b = Body::default();
    let vx = load(&mut b, 0, &[256, 1], DType::F32);
    let vw = load(&mut b, 1, &[0, 1], DType::F32);
    let vr = load(&mut b, 2, &[1, 0], DType::F32);
    let vs = load(&mut b, 3, &[0, 0], DType::F32);
    let m = bin(&mut b, BinaryOp::Mul, vx, vw);
    let a = bin(&mut b, BinaryOp::Add, m, vr);
    let y = un(&mut b, UnaryOp::Relu, a);
    let z = bin(&mut b, BinaryOp::Mul, y, vs);
    let half = constant(&mut b, 0.5, DType::F32);
    let o = bin(&mut b, BinaryOp::Add, z, half);
    b.stores.push(Store { value: o, output: 0 });
    let kind = KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![64, 256]), body: b });
    p.kernel("pw_mul_add_relu_mul_add_f32_k0", kind, vec![x, w, r, s], vec![out], &["mul", "add", "relu", "mul", "add"])
}

/// `gelu_erf(x * a + b) * c` over `n` elements of `dtype` (the `ew_chain` workload).
pub fn ew_chain(dtype: DType, n: usize) -> Plan {
    let mut p = PlanBuilder::default();
    let ins: Vec<BufferId> = (0..4).map(|_| p.input(dtype, n)).collect();
    let out = p.output(dtype, &[n]);
    let mut b = Body::default();
    let v: Vec<ValueId> = (0..4).map(|i| load(&mut b, i, &[1], dtype)).collect();
    let m = bin(&mut b, BinaryOp::Mul, v[0], v[1]);
    let a = bin(&mut b, BinaryOp::Add, m, v[2]);
    let g = un(&mut b, UnaryOp::GeluErf, a);
    let o = bin(&mut b, BinaryOp::Mul, g, v[3]);
    b.stores.push(Store { value: o, output: 0 });
    let kind = KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![n]), body: b });
    let name = format!("pw_mul_add_gelu_erf_mul_{}_k0", dtype.name());
    p.kernel(&name, kind, ins, vec![out], &["mul", "add", "gelu_erf", "mul"])
}

/// Three outputs of three dtypes from `x` `[48, 40]` and the transpose of `t` `[40, 48]`:
/// `x + t^T` (f32), `x > t^T` (bool), `int(x * 100)` (i32).
pub fn pointwise_multi_output() -> Plan {
    let mut p = PlanBuilder::default();
    let x = p.input(DType::F32, 48 * 40);
    let t = p.input(DType::F32, 40 * 48);
    let sum = p.output(DType::F32, &[48, 40]);
    let greater = p.output(DType::Bool, &[48, 40]);
    let scaled = p.output(DType::I32, &[48, 40]);
    let mut b = Body::default();
    let vx = load(&mut b, 0, &[40, 1], DType::F32);
    let vt = load(&mut b, 1, &[1, 48], DType::F32);
    let s = bin(&mut b, BinaryOp::Add, vx, vt);
    let g = bin(&mut b, BinaryOp::Gt, vx, vt);
    let hundred = constant(&mut b, 100.0, DType::F32);
    let m = bin(&mut b, BinaryOp::Mul, vx, hundred);
    let i = b.push(Expr::Cast { x: m }, DType::I32);
    b.stores.push(Store { value: s, output: 0 });
    b.stores.push(Store { value: g, output: 1 });
    b.stores.push(Store { value: i, output: 2 });
    let kind = KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![48, 40]), body: b });
    p.kernel(
        "pw_add_gt_mul_cast_k0",
        kind,
        vec![x, t],
        vec![sum, greater, scaled],
        &["permute", "add", "gt", "mul", "cast"],
    )
}

/// Every unary op and the float binary ops on a bf16 tensor, with casts through f16 and bool.
pub fn pointwise_every_float_op() -> Plan {
    let n = 1000;
    let mut p = PlanBuilder::default();
    let x = p.input(DType::BF16, n);
    let y = p.input(DType::F16, n);
    let out = p.output(DType::BF16, &[n]);
    let flags = p.output(DType::Bool, &[n]);
    let mut b = Body::default();
    let vx = load(&mut b, 0, &[1], DType::BF16);
    let vy16 = load(&mut b, 1, &[1], DType::F16);
    let vy = b.push(Expr::Cast { x: vy16 }, DType::BF16);
    let mut acc = vx;
    for &op in UnaryOp::ALL {
        if matches!(op, UnaryOp::IsNan | UnaryOp::IsFinite | UnaryOp::Not) {
            continue;
        }
        let u = un(&mut b, op, acc);
        acc = bin(&mut b, BinaryOp::Add, u, vy);
    }
    for op in [BinaryOp::Sub, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min, BinaryOp::Pow] {
        acc = bin(&mut b, op, acc, vy);
    }
    let nan = un(&mut b, UnaryOp::IsNan, acc);
    let finite = un(&mut b, UnaryOp::IsFinite, acc);
    let not = un(&mut b, UnaryOp::Not, vx);
    let either = bin(&mut b, BinaryOp::Or, nan, not);
    let both = bin(&mut b, BinaryOp::And, either, finite);
    let chosen = b.push(Expr::Where { cond: both, a: acc, b: vy }, DType::BF16);
    let rounded = b.push(Expr::Cast { x: chosen }, DType::F16);
    let back = b.push(Expr::Cast { x: rounded }, DType::BF16);
    b.stores.push(Store { value: back, output: 0 });
    b.stores.push(Store { value: both, output: 1 });
    let kind = KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![n]), body: b });
    p.kernel(
        "pw_every_float_op_bf16_k0",
        kind,
        vec![x, y],
        vec![out, flags],
        &["unary ops", "binary ops", "where", "cast"],
    )
}

/// Integer arithmetic, comparisons and casts on i32 and i64 data.
pub fn pointwise_int_ops() -> Plan {
    let n = 4096;
    let mut p = PlanBuilder::default();
    let a = p.input(DType::I32, n);
    let c = p.input(DType::I64, n);
    let f = p.input(DType::F32, n);
    let o32 = p.output(DType::I32, &[n]);
    let o64 = p.output(DType::I64, &[n]);
    let of = p.output(DType::F32, &[n]);
    let mut b = Body::default();
    let va = load(&mut b, 0, &[1], DType::I32);
    let vc = load(&mut b, 1, &[1], DType::I64);
    let vf = load(&mut b, 2, &[1], DType::F32);
    let seven = constant(&mut b, 7.0, DType::I32);
    let mut x = va;
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min] {
        x = bin(&mut b, op, x, seven);
    }
    for op in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu] {
        x = un(&mut b, op, x);
    }
    let fi = b.push(Expr::Cast { x: vf }, DType::I32);
    let x = bin(&mut b, BinaryOp::Add, x, fi);
    let wide = b.push(Expr::Cast { x }, DType::I64);
    let q = bin(&mut b, BinaryOp::Div, vc, wide);
    let fl = b.push(Expr::Cast { x: vf }, DType::I64);
    let q = bin(&mut b, BinaryOp::Mul, q, fl);
    let lt = bin(&mut b, BinaryOp::Lt, q, vc);
    let as_float = b.push(Expr::Cast { x: lt }, DType::F32);
    let back = b.push(Expr::Cast { x: q }, DType::F32);
    let y = bin(&mut b, BinaryOp::Add, as_float, back);
    b.stores.push(Store { value: x, output: 0 });
    b.stores.push(Store { value: q, output: 1 });
    b.stores.push(Store { value: y, output: 2 });
    let kind = KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![n]), body: b });
    p.kernel("pw_int_ops_k0", kind, vec![a, c, f], vec![o32, o64, of], &["integer ops", "cast"])
}

/// `x * 2 + 1` over `[3, 2^30]` f32: past 2^31 elements, so index math must be 64-bit.
pub fn pointwise_huge() -> Plan {
    let n = 3usize << 30;
    let mut p = PlanBuilder::default();
    let x = p.input(DType::F32, n);
    let out = p.output(DType::F32, &[3, 1 << 30]);
    let mut b = Body::default();
    let vx = load(&mut b, 0, &[1 << 30, 1], DType::F32);
    let two = constant(&mut b, 2.0, DType::F32);
    let one = constant(&mut b, 1.0, DType::F32);
    let m = bin(&mut b, BinaryOp::Mul, vx, two);
    let a = bin(&mut b, BinaryOp::Add, m, one);
    b.stores.push(Store { value: a, output: 0 });
    let kind = KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![3, 1 << 30]), body: b });
    p.kernel("pw_mul_add_f32_k0", kind, vec![x], vec![out], &["mul", "add"])
}

/// `x + 1` over `[0, 16]`: nothing to launch.
pub fn pointwise_empty() -> Plan {
    let mut p = PlanBuilder::default();
    let x = p.input(DType::F32, 0);
    let out = p.output(DType::F32, &[0, 16]);
    let mut b = Body::default();
    let vx = load(&mut b, 0, &[16, 1], DType::F32);
    let one = constant(&mut b, 1.0, DType::F32);
    let a = bin(&mut b, BinaryOp::Add, vx, one);
    b.stores.push(Store { value: a, output: 0 });
    let kind = KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![0, 16]), body: b });
    p.kernel("pw_add_f32_k0", kind, vec![x], vec![out], &["add"])
}

/// Appends `layer_norm(x, w, b, eps)` over the columns (w, b: `[cols]` at input slots
/// `w_slot`, `w_slot + 1`), returns the normalised value.
fn layer_norm(b: &mut Body, x: ValueId, w_slot: usize, cols: usize, dtype: DType) -> ValueId {
    let sum = reduce(b, ReduceOp::Sum, x);
    let inv = constant(b, 1.0 / cols as f64, dtype);
    let mean = bin(b, BinaryOp::Mul, sum, inv);
    let d = bin(b, BinaryOp::Sub, x, mean);
    let dd = bin(b, BinaryOp::Mul, d, d);
    let ss = reduce(b, ReduceOp::Sum, dd);
    let var = bin(b, BinaryOp::Mul, ss, inv);
    let eps = constant(b, 1e-5, dtype);
    let ve = bin(b, BinaryOp::Add, var, eps);
    let rstd = un(b, UnaryOp::Rsqrt, ve);
    let n = bin(b, BinaryOp::Mul, d, rstd);
    let w = load(b, w_slot, &[0, 1], dtype);
    let scaled = bin(b, BinaryOp::Mul, n, w);
    let bias = load(b, w_slot + 1, &[0, 1], dtype);
    bin(b, BinaryOp::Add, scaled, bias)
}

/// `relu(layer_norm(x, w, b)) + res` over `[rows, cols]` (the `ln_relu_res` workload).
pub fn ln_relu_res(dtype: DType, rows: usize, cols: usize) -> Plan {
    let mut p = PlanBuilder::default();
    let x = p.input(dtype, rows * cols);
    let w = p.input(dtype, cols);
    let bias = p.input(dtype, cols);
    let res = p.input(dtype, rows * cols);
    let out = p.output(dtype, &[rows, cols]);
    let mut b = Body::default();
    let vx = load(&mut b, 0, &[cols, 1], dtype);
    let ln = layer_norm(&mut b, vx, 1, cols, dtype);
    let r = un(&mut b, UnaryOp::Relu, ln);
    let vres = load(&mut b, 3, &[cols, 1], dtype);
    let y = bin(&mut b, BinaryOp::Add, r, vres);
    b.stores.push(Store { value: y, output: 0 });
    let kind = KernelKind::Row(RowKernel { outer: vec![rows], inner: vec![cols], body: b });
    let name = format!("row_layer_norm_relu_add_{}_k0", dtype.name());
    p.kernel(&name, kind, vec![x, w, bias, res], vec![out], &["layer_norm", "relu", "add"])
}

/// `layers` chained `x = relu(layer_norm(x, w_i, b_i)) + x` on `[rows, cols]` f32 in one kernel
/// (the `tiny_block` workload has 16 layers on `[64, 256]`).
pub fn chained_layers(layers: usize, rows: usize, cols: usize) -> Plan {
    let mut p = PlanBuilder::default();
    let x = p.input(DType::F32, rows * cols);
    let mut inputs = vec![x];
    for _ in 0..layers {
        inputs.push(p.input(DType::F32, cols));
        inputs.push(p.input(DType::F32, cols));
    }
    let out = p.output(DType::F32, &[rows, cols]);
    let mut b = Body::default();
    let mut v = load(&mut b, 0, &[cols, 1], DType::F32);
    let mut ops = Vec::new();
    for layer in 0..layers {
        let ln = layer_norm(&mut b, v, 1 + 2 * layer, cols, DType::F32);
        let r = un(&mut b, UnaryOp::Relu, ln);
        v = bin(&mut b, BinaryOp::Add, r, v);
        ops.extend(["layer_norm", "relu", "add"]);
    }
    b.stores.push(Store { value: v, output: 0 });
    let kind = KernelKind::Row(RowKernel { outer: vec![rows], inner: vec![cols], body: b });
    let name = format!("row_{layers}x_layer_norm_relu_add_f32_k0");
    p.kernel(&name, kind, inputs, vec![out], &ops)
}

/// `softmax(x)` over the last dim of `[rows, cols]` f32, also storing each row's max.
pub fn softmax(rows: usize, cols: usize) -> Plan {
    let mut p = PlanBuilder::default();
    let x = p.input(DType::F32, rows * cols);
    let out = p.output(DType::F32, &[rows, cols]);
    let row_max = p.output(DType::F32, &[rows, 1]);
    let mut b = Body::default();
    let vx = load(&mut b, 0, &[cols, 1], DType::F32);
    let m = reduce(&mut b, ReduceOp::Max, vx);
    let d = bin(&mut b, BinaryOp::Sub, vx, m);
    let e = un(&mut b, UnaryOp::Exp, d);
    let s = reduce(&mut b, ReduceOp::Sum, e);
    let y = bin(&mut b, BinaryOp::Div, e, s);
    b.stores.push(Store { value: y, output: 0 });
    b.stores.push(Store { value: m, output: 1 });
    let kind = KernelKind::Row(RowKernel { outer: vec![rows], inner: vec![cols], body: b });
    p.kernel("row_softmax_f32_k0", kind, vec![x], vec![out, row_max], &["softmax", "amax"])
}

/// `mean(x, axis=1)` of `x` `[a, r, c]` bf16: a reduction over a non-trailing axis, so the row
/// domain is `outer [a, c]`, `inner [r]` with column stride `c`.
pub fn mean_middle_axis(a: usize, r: usize, c: usize) -> Plan {
    let mut p = PlanBuilder::default();
    let x = p.input(DType::BF16, a * r * c);
    let out = p.output(DType::BF16, &[a, c]);
    let mut b = Body::default();
    let vx = load(&mut b, 0, &[r * c, 1, c], DType::BF16);
    let s = reduce(&mut b, ReduceOp::Sum, vx);
    let inv = constant(&mut b, 1.0 / r as f64, DType::BF16);
    let m = bin(&mut b, BinaryOp::Mul, s, inv);
    b.stores.push(Store { value: m, output: 0 });
    let kind = KernelKind::Row(RowKernel { outer: vec![a, c], inner: vec![r], body: b });
    p.kernel("row_mean_axis1_bf16_k0", kind, vec![x], vec![out], &["mean"])
}

/// `stack([t.sum() for t in ts])` over items of the given sizes.
pub fn multi_sum(items: &[usize], dtype: DType) -> Plan {
    let mut p = PlanBuilder::default();
    let ins: Vec<BufferId> = items.iter().map(|&n| p.input(dtype, n)).collect();
    let out = p.output(dtype, &[items.len()]);
    let mut prologue = Body::default();
    load(&mut prologue, 0, &[1], dtype);
    let kind = KernelKind::MultiReduce(MultiReduce { op: ReduceOp::Sum, items: items.to_vec(), prologue, dtype });
    let name = format!("multi_sum_{}x_{}_k0", items.len(), dtype.name());
    p.kernel(&name, kind, ins, vec![out], &["sum", "stack"])
}

/// `stack([t.abs().max() for t in ts])` in bf16 (a prologue per element).
pub fn multi_max_abs(items: &[usize]) -> Plan {
    let mut p = PlanBuilder::default();
    let ins: Vec<BufferId> = items.iter().map(|&n| p.input(DType::BF16, n)).collect();
    let out = p.output(DType::BF16, &[items.len()]);
    let mut prologue = Body::default();
    let x = load(&mut prologue, 0, &[1], DType::BF16);
    un(&mut prologue, UnaryOp::Abs, x);
    let kind =
        KernelKind::MultiReduce(MultiReduce { op: ReduceOp::Max, items: items.to_vec(), prologue, dtype: DType::BF16 });
    p.kernel("multi_max_abs_bf16_k0", kind, ins, vec![out], &["abs", "amax", "stack"])
}

/// `stack([t.mean() for t in ts])` in f32 with a squaring prologue.
pub fn multi_mean_square(items: &[usize]) -> Plan {
    let mut p = PlanBuilder::default();
    let ins: Vec<BufferId> = items.iter().map(|&n| p.input(DType::F32, n)).collect();
    let out = p.output(DType::F32, &[items.len()]);
    let mut prologue = Body::default();
    let x = load(&mut prologue, 0, &[1], DType::F32);
    bin(&mut prologue, BinaryOp::Mul, x, x);
    let kind =
        KernelKind::MultiReduce(MultiReduce { op: ReduceOp::Mean, items: items.to_vec(), prologue, dtype: DType::F32 });
    p.kernel("multi_mean_square_f32_k0", kind, ins, vec![out], &["mul", "mean", "stack"])
}

/// Concatenation along axis 1 of `[4, e, 32]` f32 inputs.
pub fn concat(extents: &[usize], dtype: DType) -> Plan {
    let mut p = PlanBuilder::default();
    let ins: Vec<BufferId> = extents.iter().map(|&e| p.input(dtype, 4 * e * 32)).collect();
    let total: usize = extents.iter().sum();
    let out = p.output(dtype, &[4, total, 32]);
    let kind =
        KernelKind::Concat(Concat { shape: Shape::new(vec![4, total, 32]), axis: 1, extents: extents.to_vec(), dtype });
    let name = format!("concat_{}x_{}_k0", extents.len(), dtype.name());
    p.kernel(&name, kind, ins, vec![out], &["concat"])
}

/// A bf16 matmul with bias and GELU epilogue.
pub fn matmul() -> Plan {
    let mut p = PlanBuilder::default();
    let a = p.input(DType::BF16, 64 * 128);
    let bm = p.input(DType::BF16, 128 * 32);
    let bias = p.input(DType::BF16, 32);
    let out = p.output(DType::BF16, &[64, 32]);
    let kind = KernelKind::MatMul(MatMul {
        batch: vec![],
        m: 64,
        n: 32,
        k: 128,
        dtype: DType::BF16,
        a_batch_stride: 0,
        b_batch_stride: 0,
        a_transposed: false,
        b_transposed: false,
        bias: true,
        activation: Some(UnaryOp::GeluTanh),
    });
    p.kernel("matmul_bias_gelu_bf16_k0", kind, vec![a, bm, bias], vec![out], &["matmul", "add", "gelu_tanh"])
}

/// RMS norm of bf16 rows scaled per row: `y = x * rsqrt(mean(x^2) + eps) * w * s` with `s`
/// `[rows, 1]` (a per-row load), also storing each row's `rsqrt(...)` as f32 (a per-row store of
/// another dtype).
pub fn rms_norm_scaled(rows: usize, cols: usize) -> Plan {
    let mut p = PlanBuilder::default();
    let x = p.input(DType::BF16, rows * cols);
    let w = p.input(DType::BF16, cols);
    let s = p.input(DType::BF16, rows);
    let out = p.output(DType::BF16, &[rows, cols]);
    let rstd_out = p.output(DType::F32, &[rows, 1]);
    let mut b = Body::default();
    let vx = load(&mut b, 0, &[cols, 1], DType::BF16);
    let sq = bin(&mut b, BinaryOp::Mul, vx, vx);
    let ss = reduce(&mut b, ReduceOp::Sum, sq);
    let inv = constant(&mut b, 1.0 / cols as f64, DType::BF16);
    let ms = bin(&mut b, BinaryOp::Mul, ss, inv);
    let eps = constant(&mut b, 1e-6, DType::BF16);
    let me = bin(&mut b, BinaryOp::Add, ms, eps);
    let rstd = un(&mut b, UnaryOp::Rsqrt, me);
    let vs = load(&mut b, 2, &[1, 0], DType::BF16);
    let row_scale = bin(&mut b, BinaryOp::Mul, rstd, vs);
    let n = bin(&mut b, BinaryOp::Mul, vx, row_scale);
    let vw = load(&mut b, 1, &[0, 1], DType::BF16);
    let y = bin(&mut b, BinaryOp::Mul, n, vw);
    let rstd32 = b.push(Expr::Cast { x: rstd }, DType::F32);
    b.stores.push(Store { value: y, output: 0 });
    b.stores.push(Store { value: rstd32, output: 1 });
    let kind = KernelKind::Row(RowKernel { outer: vec![rows], inner: vec![cols], body: b });
    p.kernel("row_rms_norm_mul_bf16_k0", kind, vec![x, w, s], vec![out, rstd_out], &["rms_norm", "mul"])
}

/// Per row of an i32 `[rows, cols]`: how many elements are positive (an i64 sum of casts from
/// bool) and the largest element (an i32 max).
pub fn count_positive(rows: usize, cols: usize) -> Plan {
    let mut p = PlanBuilder::default();
    let x = p.input(DType::I32, rows * cols);
    let count = p.output(DType::I64, &[rows]);
    let largest = p.output(DType::I32, &[rows]);
    let mut b = Body::default();
    let vx = load(&mut b, 0, &[cols, 1], DType::I32);
    let zero = constant(&mut b, 0.0, DType::I32);
    let positive = bin(&mut b, BinaryOp::Gt, vx, zero);
    let as_int = b.push(Expr::Cast { x: positive }, DType::I64);
    let n = reduce(&mut b, ReduceOp::Sum, as_int);
    let m = reduce(&mut b, ReduceOp::Max, vx);
    b.stores.push(Store { value: n, output: 0 });
    b.stores.push(Store { value: m, output: 1 });
    let kind = KernelKind::Row(RowKernel { outer: vec![rows], inner: vec![cols], body: b });
    p.kernel("row_count_gt_max_i32_k0", kind, vec![x], vec![count, largest], &["gt", "sum", "amax"])
}

/// Every hand-built plan, named as its snapshot.
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
        ("row_ln_relu_res_f32", ln_relu_res(DType::F32, 16_384, 4096)),
        ("row_ln_relu_res_bf16", ln_relu_res(DType::BF16, 16_384, 4096)),
        ("row_ln_relu_res_f32_1024", ln_relu_res(DType::F32, 65_536, 1024)),
        ("row_two_layers", chained_layers(2, 64, 256)),
        ("row_tiny_block_16_layers", chained_layers(16, 64, 256)),
        ("row_softmax", softmax(1024, 1000)),
        ("row_mean_middle_axis", mean_middle_axis(32, 1000, 64)),
        ("row_softmax_zero_columns", softmax(4, 0)),
        ("row_rms_norm_per_row_scale_bf16", rms_norm_scaled(4096, 2048)),
        ("row_int_count_and_max", count_positive(1000, 300)),
        ("multi_reduce_sum_5", multi_sum(&[100_000, 0, 37, 5000, 16_385], DType::F32)),
        ("multi_reduce_max_abs_bf16", multi_max_abs(&[70_000, 3, 0, 2_000, 1_024])),
        ("multi_reduce_mean_square", multi_mean_square(&[10, 300, 0])),
        ("concat_3", concat(&[10, 6, 16], DType::F32)),
        ("concat_20_bf16", concat(&[3; 20], DType::BF16)),
        ("multi_reduce_no_items", multi_sum(&[], DType::F32)),
    ]
}
