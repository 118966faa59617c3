//! The gradient rule of every op: given a node and the gradient flowing into it, the gradients
//! flowing into its operands. Elementwise ops use the derivative formulas of the op table; the
//! match below has an arm for every op, so a new op without a rule does not compile.

use crate::builder::Emit;
use crate::{AutodiffError, Result};
use braze_ir::elementwise::{Derivative, Partials};
use braze_ir::infer::reduced_shape;
use braze_ir::{AttentionInput, BinaryOp, DType, NodeId, Op, ReduceOp, Shape, UnaryOp};

/// `(operand, gradient)` pairs for the operands of `id` that get a gradient.
pub(crate) fn operand_grads(e: &mut Emit<'_>, id: NodeId, grad: NodeId) -> Result<Vec<(NodeId, NodeId)>> {
    let node = e.graph().node(id).clone();
    let x = node.operands.first().copied().unwrap_or(id);
    let shapes: Vec<Shape> = node.operands.iter().map(|&o| e.shape(o)).collect();
    let grads = match &node.op {
        Op::Input { .. } | Op::Constant { .. } | Op::Arange => vec![],
        Op::Cast => {
            let from = e.graph().node(x).dtype;
            if from.is_float() {
                vec![(x, e.cast(grad, from)?)]
            } else {
                vec![]
            }
        }
        Op::Unary { op } => match op.def().derivative {
            // In f32 for f16/bf16 (as PyTorch computes them): the formula's constants and steps
            // were rounded to bf16 (gelu's 1 / sqrt(2 pi) became 0.3984375).
            Derivative::Formula(formula) => in_f32(e, &[x], grad, |e, wide, g| {
                let y = widened(e, id)?;
                let d = e.formula(&[wide[0], y], |b, v| vec![formula(b, v[0], v[1])])?[0];
                Ok(vec![(wide[0], e.mul(g, d)?)])
            })?,
            Derivative::Zero => vec![(x, e.zeros(&shapes[0])?)],
            Derivative::NotDifferentiable => vec![],
        },
        Op::Binary { op } => match op.def().partials {
            Partials::Formula(formula) => in_f32(e, &node.operands, grad, |e, wide, g| {
                let y = widened(e, id)?;
                let d = e.formula(&[wide[0], wide[1], y], |builder, v| {
                    let (da, db) = formula(builder, v[0], v[1], v[2]);
                    vec![da, db]
                })?;
                let ga = e.mul(g, d[0])?;
                let gb = e.mul(g, d[1])?;
                Ok(vec![(wide[0], e.sum_to(ga, &shapes[0])?), (wide[1], e.sum_to(gb, &shapes[1])?)])
            })?,
            Partials::Gradients(formula) => in_f32(e, &node.operands, grad, |e, wide, g| {
                let y = widened(e, id)?;
                let d = e.formula(&[wide[0], wide[1], y, g], |builder, v| {
                    let (ga, gb) = formula(builder, v[0], v[1], v[2], v[3]);
                    vec![ga, gb]
                })?;
                Ok(vec![(wide[0], e.sum_to(d[0], &shapes[0])?), (wide[1], e.sum_to(d[1], &shapes[1])?)])
            })?,
            Partials::NotDifferentiable => vec![],
        },
        Op::Where => {
            let (cond, a, b) = (node.operands[0], node.operands[1], node.operands[2]);
            let zero = e.constant(0.0);
            let ga = e.select(cond, grad, zero)?;
            let gb = e.select(cond, zero, grad)?;
            vec![(a, e.sum_to(ga, &shapes[1])?), (b, e.sum_to(gb, &shapes[2])?)]
        }
        Op::Reduce { op, axes, keepdim } => vec![(x, reduce_grad(e, *op, x, id, grad, axes, *keepdim)?)],
        Op::Reshape => vec![(x, e.reshape(grad, &shapes[0])?)],
        Op::BroadcastTo => vec![(x, e.sum_to(grad, &shapes[0])?)],
        Op::Permute { perm } => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            vec![(x, e.op(Op::Permute { perm: inverse }, &[grad])?)]
        }
        Op::Slice { axis, start, end: _, step } => vec![(x, slice_grad(e, grad, &shapes[0], *axis, *start, *step)?)],
        Op::Concat { axis } => {
            let mut offset = 0;
            let mut grads = Vec::with_capacity(node.operands.len());
            for (&operand, shape) in node.operands.iter().zip(&shapes) {
                let size = shape.dims()[*axis];
                let part = e.op(Op::Slice { axis: *axis, start: offset, end: offset + size, step: 1 }, &[grad])?;
                grads.push((operand, part));
                offset += size;
            }
            grads
        }
        Op::Stack { axis } => {
            let mut grads = Vec::with_capacity(node.operands.len());
            for (i, (&operand, shape)) in node.operands.iter().zip(&shapes).enumerate() {
                let part = e.op(Op::Slice { axis: *axis, start: i, end: i + 1, step: 1 }, &[grad])?;
                grads.push((operand, e.reshape(part, shape)?));
            }
            grads
        }
        Op::MatMul => {
            let (a, b) = (node.operands[0], node.operands[1]);
            let bt = e.transpose_last(b)?;
            let ga = e.op(Op::MatMul, &[grad, bt])?;
            let gb = match shared_matrix_grad(e, a, grad, &shapes[0], &shapes[1])? {
                Some(gb) => gb,
                None => {
                    let at = e.transpose_last(a)?;
                    let gb = e.op(Op::MatMul, &[at, grad])?;
                    e.sum_to(gb, &shapes[1])?
                }
            };
            vec![(a, e.sum_to(ga, &shapes[0])?), (b, gb)]
        }
        Op::LayerNorm { eps } => in_f32(e, &node.operands, grad, |e, x, g| layer_norm_grads(e, x, g, *eps))?,
        Op::RmsNorm { eps } => in_f32(e, &node.operands, grad, |e, x, g| rms_norm_grads(e, x, g, *eps))?,
        Op::Softmax { axis } => {
            // y (g - sum(g y)) along the axis.
            let gy = e.mul(grad, id)?;
            let total = e.reduce(ReduceOp::Sum, gy, &[*axis], true)?;
            let centered = e.sub(grad, total)?;
            vec![(x, e.mul(id, centered)?)]
        }
        Op::Attention { causal, scale } => attention_grads(e, id, &node.operands, grad, *causal, *scale)?,
        // What these compute is only ever a backward's intermediate: a gradient through them
        // (second order) has no rule.
        Op::AttentionLse { .. } | Op::AttentionGrad { .. } => {
            return Err(AutodiffError::NoRule { node: id.to_string(), op: node.op.name(), at: node.loc.clone() })
        }
        Op::LogSoftmax { axis } => in_f32(e, &node.operands, grad, |e, x, g| {
            // g - softmax(x) sum(g) along the axis, the softmax recomputed as exp(y) from the
            // widened output (the backward of a row kernel, no saved probabilities).
            let y = widened(e, id)?;
            let p = e.unary(UnaryOp::Exp, y)?;
            let total = e.reduce(ReduceOp::Sum, g, &[*axis], true)?;
            let spread = e.mul(p, total)?;
            Ok(vec![(x[0], e.sub(g, spread)?)])
        })?,
        Op::CrossEntropy { ignore_index } => {
            let wide = widened(e, x)?;
            let g = widened(e, grad)?;
            let dx = e.with_dtype(DType::F32, |e| {
                cross_entropy_grad(e, wide, node.operands[1], node.operands[2], g, *ignore_index)
            })?;
            vec![(x, e.cast_if_needed(dx, node.dtype)?)]
        }
        Op::IndexSelect { axis } => {
            // A scatter-add of the gradient into the selected rows, in f32 for f16/bf16 (many
            // indices may hit one row); the indices get none.
            let g = widened(e, grad)?;
            let size = shapes[0].dims()[*axis];
            let dx = e.op(Op::IndexAdd { axis: *axis, size }, &[g, node.operands[1]])?;
            vec![(x, e.cast_if_needed(dx, node.dtype)?)]
        }
        Op::IndexAdd { axis, .. } => {
            // Each source slice went to one row: its gradient is that row's gradient.
            vec![(x, e.op(Op::IndexSelect { axis: *axis }, &[grad, node.operands[1]])?)]
        }
    };
    Ok(grads)
}

/// `(hits * softmax(x) - onehot(target)) * g / count` on rows whose target is not
/// `ignore_index` (`hits`, the row's columns of the target class, is 1 for classes `0..V`; a row
/// without one is NaN, as its loss), 0 on the others, in f32: one pass over each row once its
/// max and sum of exponentials are known (the same nodes as the forward's decomposition
/// computes, so they are shared), the probabilities never stored. The probabilities are
/// `exp(x - max - log(sum))`, as PyTorch's log-softmax backward takes them: no division per
/// logit (which cost a third of the fused loss kernel's instructions at GPT-2's vocabulary).
fn cross_entropy_grad(
    e: &mut Emit<'_>,
    x: NodeId,
    targets: NodeId,
    classes: NodeId,
    g: NodeId,
    ignore_index: i64,
) -> Result<NodeId> {
    let shape = e.shape(x);
    let rows = shape.dims()[0];
    let max = e.reduce(ReduceOp::Max, x, &[1], true)?;
    let shifted = e.sub(x, max)?;
    let exp = e.unary(UnaryOp::Exp, shifted)?;
    let sum = e.reduce(ReduceOp::Sum, exp, &[1], true)?;
    let log_sum = e.unary(UnaryOp::Log, sum)?;
    let log_p = e.sub(shifted, log_sum)?;
    let p = e.unary(UnaryOp::Exp, log_p)?;
    let target_dtype = e.graph().node(targets).dtype;
    let column_of = e.reshape(targets, &Shape(vec![rows, 1]))?;
    let onehot = e.class_onehot(targets, classes)?;
    let ignored = e.constant_of(ignore_index as f64, target_dtype);
    let valid = e.binary(BinaryOp::Ne, column_of, ignored)?;
    let counted = e.cast(valid, DType::F32)?;
    let count = e.reduce(ReduceOp::Sum, counted, &[0, 1], false)?;
    let scale = e.div(g, count)?;
    let hot = e.cast(onehot, DType::F32)?;
    let hits = e.reduce(ReduceOp::Sum, hot, &[1], true)?;
    // As the forward's decomposition: any hit from the count, not another reduction per logit.
    let none = e.constant_of(0.0, DType::F32);
    let hit = e.binary(BinaryOp::Gt, hits, none)?;
    let spread = e.mul(hits, p)?;
    let diff = e.sub(spread, hot)?;
    let nan = e.constant(f64::NAN);
    let diff = e.select(hit, diff, nan)?;
    let zero = e.constant(0.0);
    let kept = e.select(valid, diff, zero)?;
    e.mul(kept, scale)
}

/// The gradient of a reduction: spread back over the reduced dims (divided by their count for a
/// mean; for max/min, shared evenly among the elements equal to the result, as PyTorch does).
fn reduce_grad(
    e: &mut Emit<'_>,
    op: ReduceOp,
    x: NodeId,
    y: NodeId,
    grad: NodeId,
    axes: &[usize],
    keepdim: bool,
) -> Result<NodeId> {
    let shape = e.shape(x);
    let kept = reduced_shape(&shape, axes, true);
    let gk = if keepdim { grad } else { e.reshape(grad, &kept)? };
    let spread = e.broadcast(gk, &shape)?;
    match op {
        ReduceOp::Sum => Ok(spread),
        ReduceOp::Mean => {
            let count: usize = axes.iter().map(|&a| shape.dims()[a]).product();
            let scale = e.constant(1.0 / count.max(1) as f64);
            e.mul(spread, scale)
        }
        ReduceOp::Max | ReduceOp::Min => {
            let yk = if keepdim { y } else { e.reshape(y, &kept)? };
            let yb = e.broadcast(yk, &shape)?;
            let hit = e.binary(BinaryOp::Eq, x, yb)?;
            let dtype = e.graph().node(x).dtype;
            let mask = e.cast(hit, dtype)?;
            let ties = e.reduce(ReduceOp::Sum, mask, axes, true)?;
            let share = e.div(mask, ties)?;
            e.mul(spread, share)
        }
    }
}

/// The gradient of `x[start::step]` along `axis`: the slice's gradient placed back at its
/// positions, zeros elsewhere (built from stack, reshape and concat).
fn slice_grad(e: &mut Emit<'_>, grad: NodeId, shape: &Shape, axis: usize, start: usize, step: usize) -> Result<NodeId> {
    let gshape = e.shape(grad);
    let taken = gshape.dims()[axis];
    let with_size = |size: usize| {
        let mut dims = shape.dims().to_vec();
        dims[axis] = size;
        Shape::new(dims)
    };
    // Interleave: each taken element followed by step - 1 zeros.
    let spaced = if step > 1 && taken > 0 {
        let zeros = e.zeros(&gshape)?;
        let mut parts = vec![grad];
        parts.extend(std::iter::repeat_n(zeros, step - 1));
        let stacked = e.op(Op::Stack { axis: axis + 1 }, &parts)?;
        let spaced = e.reshape(stacked, &with_size(taken * step))?;
        let end = (taken - 1) * step + 1;
        e.op(Op::Slice { axis, start: 0, end, step: 1 }, &[spaced])?
    } else {
        grad
    };
    let covered = e.shape(spaced).dims()[axis];
    let after = shape.dims()[axis] - start - covered;
    let mut parts = Vec::new();
    if start > 0 {
        parts.push(e.zeros(&with_size(start))?);
    }
    parts.push(spaced);
    if after > 0 {
        parts.push(e.zeros(&with_size(after))?);
    }
    if parts.len() == 1 {
        return Ok(parts[0]);
    }
    e.op(Op::Concat { axis }, &parts)
}

/// The gradients `rule` gives for an op's `operands`, computed in f32 for an f16/bf16 op and
/// rounded once, as a norm's forward is decomposed (and as PyTorch computes them). In the norm's
/// dtype, a fused kernel subtracted the rounded `mean(x)` from `x` kept in f32: over rows of
/// one element `(x - mean(x)) * rsqrt(eps)` gave `(x - bf16(x)) * 316` where eager gives 0.
fn in_f32(
    e: &mut Emit<'_>,
    operands: &[NodeId],
    grad: NodeId,
    rule: impl FnOnce(&mut Emit<'_>, &[NodeId], NodeId) -> Result<Vec<(NodeId, NodeId)>>,
) -> Result<Vec<(NodeId, NodeId)>> {
    if !e.dtype().is_narrow_float() {
        return rule(e, operands, grad);
    }
    let wide = operands.iter().map(|&o| e.cast(o, DType::F32)).collect::<Result<Vec<NodeId>>>()?;
    let g = e.cast(grad, DType::F32)?;
    let grads = e.with_dtype(DType::F32, |e| rule(e, &wide, g))?;
    grads
        .into_iter()
        .map(|(widened, d)| {
            let i = wide.iter().position(|&w| w == widened).expect("gradients of the widened operands");
            let dtype = e.graph().node(operands[i]).dtype;
            Ok((operands[i], e.cast(d, dtype)?))
        })
        .collect()
}

/// `x` in f32 where it is f16/bf16 (the forward value a derivative formula reads beside its
/// widened operands).
fn widened(e: &mut Emit<'_>, x: NodeId) -> Result<NodeId> {
    match e.graph().node(x).dtype {
        DType::F16 | DType::BF16 => e.cast(x, DType::F32),
        _ => Ok(x),
    }
}

/// `x`'s mean and `1 / sqrt(var + eps)` over the last dim, kept as size-1 dims.
fn row_statistics(e: &mut Emit<'_>, x: NodeId, eps: f64) -> Result<(NodeId, NodeId)> {
    let last = e.shape(x).rank() - 1;
    let mean = e.reduce(ReduceOp::Mean, x, &[last], true)?;
    let centered = e.sub(x, mean)?;
    let squares = e.mul(centered, centered)?;
    let var = e.reduce(ReduceOp::Mean, squares, &[last], true)?;
    let eps = e.constant(eps);
    let shifted = e.add(var, eps)?;
    let rstd = e.unary(UnaryOp::Rsqrt, shifted)?;
    Ok((mean, rstd))
}

/// `y = xhat w + b`, `xhat = (x - mean) rstd`: dx = rstd (dxhat - mean(dxhat) - xhat
/// mean(dxhat xhat)) with dxhat = g w; dw = sum(g xhat), db = sum(g) over the leading dims.
fn layer_norm_grads(e: &mut Emit<'_>, operands: &[NodeId], grad: NodeId, eps: f64) -> Result<Vec<(NodeId, NodeId)>> {
    let (x, w, b) = (operands[0], operands[1], operands[2]);
    let last = e.shape(x).rank() - 1;
    let (mean, rstd) = row_statistics(e, x, eps)?;
    let centered = e.sub(x, mean)?;
    let xhat = e.mul(centered, rstd)?;
    let dxhat = e.mul(grad, w)?;
    let mean_dxhat = e.reduce(ReduceOp::Mean, dxhat, &[last], true)?;
    let dxhat_xhat = e.mul(dxhat, xhat)?;
    let mean_dxhat_xhat = e.reduce(ReduceOp::Mean, dxhat_xhat, &[last], true)?;
    let inner = e.sub(dxhat, mean_dxhat)?;
    let correction = e.mul(xhat, mean_dxhat_xhat)?;
    let inner = e.sub(inner, correction)?;
    let dx = e.mul(rstd, inner)?;
    let g_xhat = e.mul(grad, xhat)?;
    let (w_shape, b_shape) = (e.shape(w), e.shape(b));
    let dw = e.sum_to(g_xhat, &w_shape)?;
    let db = e.sum_to(grad, &b_shape)?;
    Ok(vec![(x, dx), (w, dw), (b, db)])
}

/// `y = x r w`, `r = 1 / sqrt(mean(x^2) + eps)`: dx = r (g w - x r^2 mean(g w x)),
/// dw = sum(g x r) over the leading dims.
fn rms_norm_grads(e: &mut Emit<'_>, operands: &[NodeId], grad: NodeId, eps: f64) -> Result<Vec<(NodeId, NodeId)>> {
    let (x, w) = (operands[0], operands[1]);
    let last = e.shape(x).rank() - 1;
    let squares = e.mul(x, x)?;
    let mean_square = e.reduce(ReduceOp::Mean, squares, &[last], true)?;
    let eps = e.constant(eps);
    let shifted = e.add(mean_square, eps)?;
    let r = e.unary(UnaryOp::Rsqrt, shifted)?;
    let gw = e.mul(grad, w)?;
    let gwx = e.mul(gw, x)?;
    let mean_gwx = e.reduce(ReduceOp::Mean, gwx, &[last], true)?;
    let rr = e.mul(r, r)?;
    let scale = e.mul(rr, mean_gwx)?;
    let correction = e.mul(x, scale)?;
    let inner = e.sub(gw, correction)?;
    let dx = e.mul(r, inner)?;
    let xr = e.mul(x, r)?;
    let gxr = e.mul(grad, xr)?;
    let w_shape = e.shape(w);
    let dw = e.sum_to(gxr, &w_shape)?;
    Ok(vec![(x, dx), (w, dw)])
}

/// `out = attention(q, k, v)`: the three gradients from the f32 row statistics the backward
/// kernels read, `lse` (recomputed by `attention_lse`, which fusion computes in the forward's
/// kernel) and `delta = rowsum(dout * out)` in f32 (a row reduction), then one `attention_grad`
/// per operand (fusion puts dk and dv in one kernel).
fn attention_grads(
    e: &mut Emit<'_>,
    out: NodeId,
    operands: &[NodeId],
    grad: NodeId,
    causal: bool,
    scale: f64,
) -> Result<Vec<(NodeId, NodeId)>> {
    let (q, k, v) = (operands[0], operands[1], operands[2]);
    let lse = e.op(Op::AttentionLse { causal, scale }, &[q, k])?;
    let (wide_grad, wide_out) = (widened(e, grad)?, widened(e, out)?);
    let products = e.mul(wide_grad, wide_out)?;
    let delta = e.reduce(ReduceOp::Sum, products, &[3], false)?;
    [AttentionInput::Query, AttentionInput::Key, AttentionInput::Value]
        .into_iter()
        .map(|wrt| {
            let g = e.op(Op::AttentionGrad { causal, scale, wrt }, &[q, k, v, lse, delta, grad])?;
            Ok((operands[wrt.operand()], g))
        })
        .collect()
}

/// The gradient of a matrix `b` that every batch of `a` multiplies (a linear layer's weight, `b`
/// without batch dims or with all of them 1): one matmul contracting over the batch and the rows
/// at once, `reshape(a, [-1, k])^T reshape(grad, [-1, n])`, rather than one product per batch
/// summed afterwards (which writes every batch's `[k, n]` product to memory only to add them up).
/// `None` where `b` has a batch dim of its own or `a` has none.
fn shared_matrix_grad(
    e: &mut Emit<'_>,
    a: NodeId,
    grad: NodeId,
    a_shape: &Shape,
    b_shape: &Shape,
) -> Result<Option<NodeId>> {
    let (a_dims, b_dims) = (a_shape.dims(), b_shape.dims());
    if a_dims.len() < 3 || b_dims.len() < 2 || b_dims[..b_dims.len() - 2].iter().any(|&d| d != 1) {
        return Ok(None);
    }
    let k = a_dims[a_dims.len() - 1];
    let n = b_dims[b_dims.len() - 1];
    let rows = a_dims[..a_dims.len() - 1].iter().product::<usize>();
    let a_flat = e.reshape(a, &Shape::new(vec![rows, k]))?;
    let grad_flat = e.reshape(grad, &Shape::new(vec![rows, n]))?;
    let a_t = e.transpose_last(a_flat)?;
    let gb = e.op(Op::MatMul, &[a_t, grad_flat])?;
    Ok(Some(e.reshape(gb, b_shape)?))
}
