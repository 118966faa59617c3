//! The graph interpreter: evaluates every node of a [`Graph`] with the reference semantics
//! described in the crate docs.

use crate::attention;
use crate::scalar::{empty_data, push, Scalar, ScalarExt};
use crate::walk::{extend_range, gather, walk};
use crate::{CpuError, Result};
use braze_ir::elementwise::{nan_max, nan_min};
use braze_ir::infer::reduced_shape;
use braze_ir::{DType, Graph, HostData, HostTensor, Node, NodeId, Op, ReduceOp, Shape};
use std::borrow::Cow;
use std::collections::HashMap;

/// Evaluates `graph` on `inputs` and returns its outputs in order.
///
/// The inputs must match the graph's inputs in count, dtype and shape. Every intermediate is
/// dropped as soon as its last reader has run, so peak memory stays near the live set.
pub fn eval_graph(graph: &Graph, inputs: &[HostTensor]) -> Result<Vec<HostTensor>> {
    graph.verify()?;
    check_inputs(graph, inputs)?;
    let order = graph.topo_order();

    // Each node's value is released after the last node that reads it (dead nodes right away);
    // graph outputs are kept to the end.
    let mut last_reader: HashMap<NodeId, usize> = HashMap::with_capacity(order.len());
    for (position, &id) in order.iter().enumerate() {
        last_reader.insert(id, position);
        for &operand in &graph.node(id).operands {
            last_reader.insert(operand, position);
        }
    }
    let mut release_after: Vec<Vec<NodeId>> = vec![Vec::new(); order.len()];
    for (&id, &position) in &last_reader {
        if !graph.is_output(id) {
            release_after[position].push(id);
        }
    }

    let mut values: HashMap<NodeId, Cow<'_, HostTensor>> = HashMap::new();
    for (position, &id) in order.iter().enumerate() {
        let node = graph.node(id);
        let value = match node.op {
            Op::Input { index } => Cow::Borrowed(&inputs[index]),
            _ => {
                let operands: Vec<&HostTensor> = node
                    .operands
                    .iter()
                    .map(|o| values.get(o).map(|v| v.as_ref()).expect("operands are evaluated before their users"))
                    .collect();
                Cow::Owned(eval_node(node, &operands)?)
            }
        };
        values.insert(id, value);
        for released in &release_after[position] {
            values.remove(released);
        }
    }
    Ok(graph
        .outputs()
        .iter()
        .map(|o| values.get(o).expect("graph outputs are kept to the end").clone().into_owned())
        .collect())
}

/// Checks count, dtype and shape of every input against the graph's signature.
fn check_inputs(graph: &Graph, inputs: &[HostTensor]) -> Result<()> {
    if inputs.len() != graph.inputs().len() {
        return Err(CpuError::Arity { expected: graph.inputs().len(), actual: inputs.len() });
    }
    for (index, (&id, given)) in graph.inputs().iter().zip(inputs).enumerate() {
        let want = graph.node(id);
        if want.dtype != given.dtype() || want.shape != *given.shape() {
            return Err(CpuError::InputMismatch {
                index,
                expected: format!("{}{}", want.dtype, want.shape),
                actual: format!("{}{}", given.dtype(), given.shape()),
            });
        }
    }
    Ok(())
}

/// One node on its already evaluated operands (the graph has been verified, so the operand
/// dtypes and shapes are those the node's op expects).
fn eval_node(node: &Node, operands: &[&HostTensor]) -> Result<HostTensor> {
    let (dtype, shape) = (node.dtype, &node.shape);
    let data = match &node.op {
        Op::Input { .. } => unreachable!("inputs are bound, not evaluated"),
        Op::Constant { value } => {
            let mut data = empty_data(dtype, 1);
            push(&mut data, *value);
            data
        }
        Op::Arange => {
            let mut data = empty_data(dtype, shape.numel());
            for i in 0..shape.numel() {
                push(&mut data, if dtype.is_float() { Scalar::Float(i as f64) } else { Scalar::Int(i as i64) });
            }
            data
        }
        Op::Cast => elementwise(dtype, shape, [operands[0]], |[x]| x),
        Op::Unary { op } => {
            let f = op.def().semantics.f64;
            elementwise(dtype, shape, [operands[0]], |[x]| f(x))
        }
        Op::Binary { op } => {
            let f = op.def().semantics.f64;
            elementwise(dtype, shape, [operands[0], operands[1]], |[a, b]| f(a, b))
        }
        Op::Where => elementwise(dtype, shape, [operands[0], operands[1], operands[2]], |[cond, a, b]| match cond {
            Scalar::Bool(true) => a,
            Scalar::Bool(false) => b,
            _ => unreachable!("where's condition is bool after type checking"),
        }),
        Op::Reduce { op, axes, keepdim: _ } => reduce(*op, operands[0], axes, dtype),
        Op::Reshape => operands[0].data().clone(),
        Op::BroadcastTo => gather(operands[0].data(), shape, 0, &operands[0].shape().broadcast_strides(shape)),
        Op::Permute { perm } => {
            let own = operands[0].shape().strides();
            let strides: Vec<usize> = perm.iter().map(|&p| own[p]).collect();
            gather(operands[0].data(), shape, 0, &strides)
        }
        Op::Slice { axis, start, end: _, step } => {
            let mut strides = operands[0].shape().strides();
            let base = start * strides[*axis];
            strides[*axis] *= step;
            gather(operands[0].data(), shape, base, &strides)
        }
        Op::Concat { axis } => {
            let extents: Vec<usize> = operands.iter().map(|t| t.shape().dims()[*axis]).collect();
            join(dtype, shape, *axis, operands, &extents)
        }
        Op::Stack { axis } => join(dtype, shape, *axis, operands, &vec![1; operands.len()]),
        Op::MatMul => matmul(dtype, shape, operands[0], operands[1]),
        Op::LayerNorm { eps } => layer_norm(dtype, operands[0], operands[1], Some(operands[2]), *eps, true),
        Op::RmsNorm { eps } => layer_norm(dtype, operands[0], operands[1], None, *eps, false),
        Op::Attention { causal, scale } => attention::attention(dtype, operands, *causal, *scale, false),
        Op::AttentionLse { causal, scale } => attention::attention(dtype, operands, *causal, *scale, true),
        Op::AttentionGrad { causal, scale, wrt } => attention::attention_grad(dtype, operands, *causal, *scale, *wrt),
        Op::Softmax { axis } => softmax(dtype, operands[0], *axis, false),
        Op::LogSoftmax { axis } => softmax(dtype, operands[0], *axis, true),
        Op::CrossEntropy { ignore_index } => cross_entropy(dtype, operands, *ignore_index),
        Op::IndexSelect { axis } => index_select(dtype, operands[0], operands[1], *axis)?,
        Op::IndexAdd { axis, size } => index_add(dtype, operands[0], operands[1], *axis, *size),
    };
    Ok(HostTensor::new(shape.clone(), data)?)
}

/// `f` applied to the NumPy-broadcast operands at every position of `shape`, each result
/// converted to `dtype` (rounded for floats, wrapped for integers).
fn elementwise<const N: usize>(
    dtype: DType,
    shape: &Shape,
    operands: [&HostTensor; N],
    f: impl Fn([Scalar; N]) -> Scalar,
) -> HostData {
    let strides: [Vec<usize>; N] = operands.map(|t| t.shape().broadcast_strides(shape));
    let stride_refs: [&[usize]; N] = std::array::from_fn(|k| strides[k].as_slice());
    let mut out = empty_data(dtype, shape.numel());
    walk(shape.dims(), stride_refs, |offsets| {
        let values = std::array::from_fn(|k| Scalar::read(operands[k].data(), offsets[k]));
        push(&mut out, f(values));
    });
    out
}

/// Reduction over `axes` into values of `result` (i64 for integer and bool sums); the kept-dim
/// layout of the result is the same with or without `keepdim`, so only the element order
/// matters here.
fn reduce(op: ReduceOp, x: &HostTensor, axes: &[usize], result: DType) -> HostData {
    let dtype = x.dtype();
    let kept = reduced_shape(x.shape(), axes, true);
    let out_strides = kept.broadcast_strides(x.shape());
    let count: usize = axes.iter().map(|&a| x.shape().dims()[a]).product();
    let outputs = kept.numel();
    let mut out = empty_data(result, outputs);
    let mut input_index = 0;
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => {
            let identity = match op {
                ReduceOp::Sum | ReduceOp::Mean => 0.0,
                ReduceOp::Max => f64::NEG_INFINITY,
                ReduceOp::Min => f64::INFINITY,
            };
            let mut acc = vec![identity; outputs];
            walk(x.shape().dims(), [&out_strides], |[o]| {
                let v = Scalar::read(x.data(), input_index).to_f64();
                input_index += 1;
                acc[o] = match op {
                    ReduceOp::Sum | ReduceOp::Mean => acc[o] + v,
                    ReduceOp::Max => nan_max(acc[o], v),
                    ReduceOp::Min => nan_min(acc[o], v),
                };
            });
            for a in acc {
                let a = if op == ReduceOp::Mean { a / count as f64 } else { a };
                push(&mut out, Scalar::Float(a));
            }
        }
        // Integer sums and bool sums (true counts 1) in i64, integer max and min.
        DType::I32 | DType::I64 | DType::Bool if dtype != DType::Bool || op == ReduceOp::Sum => {
            let mut acc = vec![op.int_identity(dtype); outputs];
            walk(x.shape().dims(), [&out_strides], |[o]| {
                let v = match Scalar::read(x.data(), input_index) {
                    Scalar::Int(v) => v,
                    Scalar::Bool(b) => b.into(),
                    Scalar::Float(_) => unreachable!("integer or bool data"),
                };
                input_index += 1;
                acc[o] = op.combine_int(acc[o], v);
            });
            for a in acc {
                push(&mut out, Scalar::Int(a));
            }
        }
        DType::I32 | DType::I64 | DType::Bool => {
            // max is "any", min is "all"; a mean is rejected by type checking.
            let any = op == ReduceOp::Max;
            let mut acc = vec![!any; outputs];
            walk(x.shape().dims(), [&out_strides], |[o]| {
                let Scalar::Bool(v) = Scalar::read(x.data(), input_index) else { unreachable!("bool data") };
                input_index += 1;
                acc[o] = if any { acc[o] || v } else { acc[o] && v };
            });
            for a in acc {
                push(&mut out, Scalar::Bool(a));
            }
        }
    }
    out
}

/// Concatenation along `axis` where operand `i` spans `extents[i]` along it (stack is the same
/// with extent 1 and the new axis): for every position before the axis, each operand's block in
/// turn.
fn join(dtype: DType, shape: &Shape, axis: usize, operands: &[&HostTensor], extents: &[usize]) -> HostData {
    let outer: usize = shape.dims()[..axis].iter().product();
    let inner: usize = shape.dims()[axis + 1..].iter().product();
    let mut out = empty_data(dtype, shape.numel());
    for o in 0..outer {
        for (part, &extent) in operands.iter().zip(extents) {
            let block = extent * inner;
            extend_range(&mut out, part.data(), o * block..(o + 1) * block);
        }
    }
    out
}

/// Batched `[.., m, k] @ [.., k, n]` with broadcast batch dims; each dot product accumulates in
/// f64 in order of k and is rounded once.
fn matmul(dtype: DType, shape: &Shape, a: &HostTensor, b: &HostTensor) -> HostData {
    let (sa, sb) = (a.shape().dims(), b.shape().dims());
    let (m, k, n) = (sa[sa.len() - 2], sa[sa.len() - 1], sb[sb.len() - 1]);
    let batch = &shape.dims()[..shape.rank() - 2];
    let batch_shape = Shape::new(batch.to_vec());
    let a_batch = Shape::new(sa[..sa.len() - 2].to_vec()).broadcast_strides(&batch_shape);
    let b_batch = Shape::new(sb[..sb.len() - 2].to_vec()).broadcast_strides(&batch_shape);
    let mut out = empty_data(dtype, shape.numel());
    let mut b_matrix = vec![0.0f64; k * n];
    let mut row = vec![0.0f64; n];
    walk(batch, [&a_batch, &b_batch], |[a_index, b_index]| {
        let (a_base, b_base) = (a_index * m * k, b_index * k * n);
        for (i, slot) in b_matrix.iter_mut().enumerate() {
            *slot = Scalar::read(b.data(), b_base + i).to_f64();
        }
        for i in 0..m {
            row.fill(0.0);
            for p in 0..k {
                let a_ip = Scalar::read(a.data(), a_base + i * k + p).to_f64();
                for (acc, &b_pj) in row.iter_mut().zip(&b_matrix[p * n..(p + 1) * n]) {
                    *acc += a_ip * b_pj;
                }
            }
            for &v in &row {
                push(&mut out, Scalar::Float(v));
            }
        }
    });
    out
}

/// Layer norm (`bias` given, `center`: subtract the mean) or RMS norm (neither) over the last
/// dim, each row in f64: `(x - mean) / sqrt(var + eps) * w + b` with the biased variance, or
/// `x / sqrt(mean(x^2) + eps) * w`. The row's sums are those of f32 accumulators, as in the
/// kernels and in PyTorch (which normalizes f16/bf16 in f32 too): a sum of values (or of squares)
/// past f32's largest is infinite there, so such a row is what an infinite mean (NaN) or
/// variance (`x - mean` times 0) gives, not the f64 value no f32 computation reaches.
fn layer_norm(
    dtype: DType,
    x: &HostTensor,
    weight: &HostTensor,
    bias: Option<&HostTensor>,
    eps: f64,
    center: bool,
) -> HostData {
    let cols = x.shape().last();
    let rows = x.numel().checked_div(cols).unwrap_or(0);
    let read = |t: &HostTensor, i: usize| Scalar::read(t.data(), i).to_f64();
    let mut out = empty_data(dtype, x.numel());
    let mut row = vec![0.0f64; cols];
    for r in 0..rows {
        for (c, v) in row.iter_mut().enumerate() {
            *v = read(x, r * cols + c);
        }
        let past_f32 = |sum: f64| if sum.abs() > f32::MAX as f64 { sum.signum() * f64::INFINITY } else { sum };
        let mean = if center { past_f32(row.iter().sum::<f64>()) / cols as f64 } else { 0.0 };
        let var = past_f32(row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>()) / cols as f64;
        let denom = (var + eps).sqrt();
        for (c, &v) in row.iter().enumerate() {
            let mut y = (v - mean) / denom * read(weight, c);
            if let Some(bias) = bias {
                y += read(bias, c);
            }
            push(&mut out, Scalar::Float(y));
        }
    }
    out
}

/// The mean over rows whose target is not `ignore_index` of the sum of `logsumexp(row) - x` over
/// the row's logits `x` whose class is the target, in f64; a row with no such logit is NaN, no
/// rows is NaN.
fn cross_entropy(dtype: DType, operands: &[&HostTensor], ignore_index: i64) -> HostData {
    let (logits, targets, classes) = (operands[0], operands[1], operands[2]);
    let cols = logits.shape().dims()[1];
    let int = |t: &HostTensor, i: usize| match Scalar::read(t.data(), i) {
        Scalar::Int(v) => v,
        other => unreachable!("typed as an integer: {other:?}"),
    };
    let (mut total, mut count) = (0.0f64, 0usize);
    for n in 0..targets.numel() {
        let target = int(targets, n);
        if target == ignore_index {
            continue;
        }
        let row: Vec<f64> = (0..cols).map(|j| Scalar::read(logits.data(), n * cols + j).to_f64()).collect();
        let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| nan_max(m, x));
        let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        let picked: Vec<f64> = (0..cols).filter(|&j| int(classes, j) == target).map(|j| row[j]).collect();
        total += if picked.is_empty() { f64::NAN } else { picked.iter().map(|x| lse - x).sum::<f64>() };
        count += 1;
    }
    let mut out = empty_data(dtype, 1);
    push(&mut out, Scalar::Float(total / count as f64));
    out
}

/// `exp(x - max) / sum(exp(x - max))` along `axis` in f64, max NaN-propagating, sum in order;
/// with `log`, `x - max - ln(sum(exp(x - max)))`.
fn softmax(dtype: DType, x: &HostTensor, axis: usize, log: bool) -> HostData {
    let dims = x.shape().dims();
    let len = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let outer: usize = dims[..axis].iter().product();
    let read = |i: usize| Scalar::read(x.data(), i).to_f64();
    // Per (outer, inner) lane: the max and the sum of exponentials along the axis.
    let mut lane_max = vec![f64::NEG_INFINITY; outer * inner];
    let mut lane_sum = vec![0.0f64; outer * inner];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| o * len * inner + j * inner + i;
            let max = (0..len).fold(f64::NEG_INFINITY, |m, j| nan_max(m, read(at(j))));
            lane_max[o * inner + i] = max;
            lane_sum[o * inner + i] = (0..len).fold(0.0, |s, j| s + (read(at(j)) - max).exp());
        }
    }
    let mut out = empty_data(dtype, x.numel());
    for flat in 0..x.numel() {
        let lane = (flat / (len * inner)) * inner + flat % inner;
        let shifted = read(flat) - lane_max[lane];
        let y = if log { shifted - lane_sum[lane].ln() } else { shifted.exp() / lane_sum[lane] };
        push(&mut out, Scalar::Float(y));
    }
    out
}

/// The indices as i64, checked against `0..bound`.
fn checked_indices(op: &str, indices: &HostTensor, bound: usize) -> Result<Vec<i64>> {
    let values: Vec<i64> = (0..indices.numel())
        .map(|i| match Scalar::read(indices.data(), i) {
            Scalar::Int(v) => v,
            other => unreachable!("indices are typed as integers: {other:?}"),
        })
        .collect();
    match values.iter().find(|&&v| v < 0 || v as u64 >= bound as u64) {
        Some(&index) => Err(CpuError::IndexOutOfRange { op: op.into(), index, bound }),
        None => Ok(values),
    }
}

/// `x[.., indices[j], ..]` for every index `j` in order: the blocks of `inner` elements after
/// `axis` copied for each position before it.
fn index_select(dtype: DType, x: &HostTensor, indices: &HostTensor, axis: usize) -> Result<HostData> {
    let dims = x.shape().dims();
    let (outer, len, inner) =
        (dims[..axis].iter().product::<usize>(), dims[axis], dims[axis + 1..].iter().product::<usize>());
    let picked = checked_indices("index_select", indices, len)?;
    let mut out = empty_data(dtype, outer * picked.len() * inner);
    for o in 0..outer {
        for &j in &picked {
            let start = (o * len + j as usize) * inner;
            extend_range(&mut out, x.data(), start..start + inner);
        }
    }
    Ok(out)
}

/// Zeros with `size` along `axis`, plus each slice of `src` at its index, summed in f64 (i64 for
/// integers) in the order of the indices and rounded once. Indices were checked by the forward;
/// one outside `0..size` adds nothing.
fn index_add(dtype: DType, src: &HostTensor, indices: &HostTensor, axis: usize, size: usize) -> HostData {
    let dims = src.shape().dims();
    let n = indices.numel();
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis + indices.shape().rank()..].iter().product();
    let mut acc = vec![Scalar::Float(0.0); outer * size * inner];
    if !dtype.is_float() {
        acc.fill(Scalar::Int(0));
    }
    for o in 0..outer {
        for j in 0..n {
            let Scalar::Int(at) = Scalar::read(indices.data(), j) else { unreachable!("integer indices") };
            if at < 0 || at as u64 >= size as u64 {
                continue;
            }
            for i in 0..inner {
                let slot = &mut acc[(o * size + at as usize) * inner + i];
                *slot = match (*slot, Scalar::read(src.data(), (o * n + j) * inner + i)) {
                    (Scalar::Int(a), Scalar::Int(b)) => Scalar::Int(a.wrapping_add(b)),
                    (a, b) => Scalar::Float(a.to_f64() + b.to_f64()),
                };
            }
        }
    }
    let mut out = empty_data(dtype, acc.len());
    for v in acc {
        push(&mut out, v);
    }
    out
}
