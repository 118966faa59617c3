//! Every IR op as a `Tensor` method. Each records the caller's `file:line:col` on its nodes, runs
//! eagerly outside a compiled function and records into the trace inside one.
//!
//! Axes are `i64` and may be negative (counted from the end). A scalar argument becomes a
//! constant; operands of different dtypes are promoted as PyTorch's (`promotion`).

use crate::promotion;
use crate::tensor::caller;
use crate::trace::apply;
use crate::trace::OpBuilder;
use crate::{Error, Result, Tensor};
use braze_ir::infer::normalize_axis;
use braze_ir::{BinaryOp, DType, IrError, NodeId, Op, ReduceOp, Shape, SourceLoc, UnaryOp};

/// A `Tensor` method per unary op of the op table (`braze_ir::elementwise`).
macro_rules! unary_methods {
    ($($(#[doc = $doc:literal])* $op:ident $name:ident;)*) => {
        impl Tensor {
            $(
                $(#[doc = $doc])*
                #[track_caller]
                pub fn $name(&self) -> Result<Tensor> {
                    self.unary(stringify!($name), UnaryOp::$op, caller())
                }
            )*
        }
    };
}

braze_ir::for_each_unary_op!(unary_methods);

/// Two `Tensor` methods per binary op of the op table: with a tensor and with a scalar.
macro_rules! binary_methods {
    ($($(#[doc = $doc:literal])* $op:ident $name:ident, $scalar:ident;)*) => {
        impl Tensor {
            $(
                $(#[doc = $doc])*
                /// Operands broadcast together; different dtypes promote as PyTorch's do.
                #[track_caller]
                pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                    self.binary(stringify!($name), BinaryOp::$op, other, caller())
                }

                #[doc = concat!("`", stringify!($name), "` with a host scalar (a whole number is an integer scalar, ",
                    "anything else a float scalar that makes an integer or bool tensor f32).")]
                #[track_caller]
                pub fn $scalar(&self, value: f64) -> Result<Tensor> {
                    self.binary_scalar(stringify!($scalar), BinaryOp::$op, value, caller())
                }
            )*
        }
    };
}

braze_ir::for_each_binary_op!(binary_methods);

// Result dtypes as PyTorch's: `sum` of bool, i32 or i64 is i64 (accumulated in i64, true counts
// 1), `mean` is for floats only (an integer mean is an error: cast first), `max` and `min` keep
// the dtype. Typing lives in `braze_ir::infer`.
macro_rules! reductions {
    ($($name:ident, $all:ident => $op:ident;)*) => {
        impl Tensor {
            $(
                #[doc = concat!("`", stringify!($name), "` over `axes` (negative axes count from the end; ",
                    "an empty list reduces nothing), keeping reduced dims as size 1 with `keepdim`. ",
                    "As in PyTorch, a sum of bool, i32 or i64 is i64 and a mean of them is an error.")]
                #[track_caller]
                pub fn $name(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
                    self.reduce(stringify!($name), ReduceOp::$op, Some(axes), keepdim, caller())
                }

                #[doc = concat!("`", stringify!($name), "` over all axes: a rank-0 tensor.")]
                #[track_caller]
                pub fn $all(&self) -> Result<Tensor> {
                    self.reduce(stringify!($all), ReduceOp::$op, None, false, caller())
                }
            )*
        }
    };
}

reductions! {
    sum, sum_all => Sum;
    mean, mean_all => Mean;
    max, max_all => Max;
    min, min_all => Min;
}

impl Tensor {
    fn unary(&self, name: &'static str, op: UnaryOp, loc: SourceLoc) -> Result<Tensor> {
        apply(name, &[self], loc, |b, x| b.op(Op::Unary { op }, &[x[0]]))
    }

    /// Operands of different dtypes are cast to their promoted dtype first (`promotion`); logical
    /// ops take bools as they are.
    fn binary(&self, name: &'static str, op: BinaryOp, other: &Tensor, loc: SourceLoc) -> Result<Tensor> {
        apply(name, &[self, other], loc, |b, x| {
            let x = if promotes(op) { promote(b, x)? } else { x.to_vec() };
            b.op(Op::Binary { op }, &[x[0], x[1]])
        })
    }

    /// The scalar is a constant of the dtype the tensor and it promote to.
    fn binary_scalar(&self, name: &'static str, op: BinaryOp, value: f64, loc: SourceLoc) -> Result<Tensor> {
        apply(name, &[self], loc, |b, x| {
            let dtype = if promotes(op) { promotion::with_scalar(b.dtype(x[0]), value) } else { b.dtype(x[0]) };
            let operand = b.cast_if_needed(x[0], dtype)?;
            let scalar = b.constant(value, dtype);
            b.op(Op::Binary { op }, &[operand, scalar])
        })
    }

    /// `axes: None` reduces every axis.
    fn reduce(
        &self,
        name: &'static str,
        op: ReduceOp,
        axes: Option<&[i64]>,
        keepdim: bool,
        loc: SourceLoc,
    ) -> Result<Tensor> {
        apply(name, &[self], loc, |b, x| {
            let rank = b.shape(x[0]).rank();
            let axes = match axes {
                Some(axes) => normalize_axes(name, axes, rank)?,
                None => (0..rank).collect(),
            };
            b.op(Op::Reduce { op, axes, keepdim }, &[x[0]])
        })
    }

    /// `cond ? a : b` elementwise, all three broadcast together; `cond` is bool, `a` and `b` are
    /// promoted to a common dtype.
    #[track_caller]
    pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        apply("where_", &[cond, a, b], caller(), |g, x| {
            let values = promote(g, &x[1..])?;
            g.op(Op::Where, &[x[0], values[0], values[1]])
        })
    }

    /// Converts to `dtype` (floats to ints truncate toward zero; anything to bool is `!= 0`).
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> Result<Tensor> {
        apply("cast", &[self], caller(), |b, x| b.cast(x[0], dtype))
    }

    /// The same elements in row-major order with a new shape of equal size.
    #[track_caller]
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        apply("reshape", &[self], caller(), |b, x| b.reshape(x[0], shape.clone()))
    }

    /// NumPy broadcast to `shape`.
    #[track_caller]
    pub fn broadcast_to(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        apply("broadcast_to", &[self], caller(), |b, x| b.broadcast_to(x[0], shape.clone()))
    }

    /// Output dim `i` is input dim `perm[i]`.
    #[track_caller]
    pub fn permute(&self, perm: &[i64]) -> Result<Tensor> {
        apply("permute", &[self], caller(), |b, x| {
            let rank = b.shape(x[0]).rank();
            let perm = perm.iter().map(|&a| normalize_axis("permute", a, rank)).collect::<braze_ir::Result<_>>()?;
            b.op(Op::Permute { perm }, &[x[0]])
        })
    }

    /// Swaps two axes.
    #[track_caller]
    pub fn transpose(&self, axis_a: i64, axis_b: i64) -> Result<Tensor> {
        apply("transpose", &[self], caller(), |b, x| {
            let rank = b.shape(x[0]).rank();
            let (i, j) = (normalize_axis("transpose", axis_a, rank)?, normalize_axis("transpose", axis_b, rank)?);
            let mut perm: Vec<usize> = (0..rank).collect();
            perm.swap(i, j);
            b.op(Op::Permute { perm }, &[x[0]])
        })
    }

    /// Elements `start, start + step, ...` below `end` along `axis`.
    #[track_caller]
    pub fn slice(&self, axis: i64, start: usize, end: usize, step: usize) -> Result<Tensor> {
        apply("slice", &[self], caller(), |b, x| {
            let axis = normalize_axis("slice", axis, b.shape(x[0]).rank())?;
            b.op(Op::Slice { axis, start, end, step }, &[x[0]])
        })
    }

    /// Joins tensors along an existing `axis`.
    #[track_caller]
    pub fn concat(tensors: &[Tensor], axis: i64) -> Result<Tensor> {
        let loc = caller();
        let operands = non_empty("concat", tensors, &loc)?;
        apply("concat", &operands, loc, |b, x| {
            let axis = normalize_axis("concat", axis, b.shape(x[0]).rank())?;
            b.op(Op::Concat { axis }, x)
        })
    }

    /// Stacks same-shaped tensors along a new `axis`.
    #[track_caller]
    pub fn stack(tensors: &[Tensor], axis: i64) -> Result<Tensor> {
        let loc = caller();
        let operands = non_empty("stack", tensors, &loc)?;
        apply("stack", &operands, loc, |b, x| {
            let axis = normalize_axis("stack", axis, b.shape(x[0]).rank() + 1)?;
            b.op(Op::Stack { axis }, x)
        })
    }

    /// `[.., m, k] @ [.., k, n]` with broadcast batch dims.
    #[track_caller]
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        apply("matmul", &[self, other], caller(), |b, x| b.op(Op::MatMul, &[x[0], x[1]]))
    }

    /// `(x - mean) / sqrt(var + eps) * weight + bias` over the last dim.
    #[track_caller]
    pub fn layer_norm(&self, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
        apply("layer_norm", &[self, weight, bias], caller(), |b, x| b.op(Op::LayerNorm { eps }, &[x[0], x[1], x[2]]))
    }

    /// `x / sqrt(mean(x^2) + eps) * weight` over the last dim.
    #[track_caller]
    pub fn rms_norm(&self, weight: &Tensor, eps: f64) -> Result<Tensor> {
        apply("rms_norm", &[self, weight], caller(), |b, x| b.op(Op::RmsNorm { eps }, &[x[0], x[1]]))
    }

    #[track_caller]
    pub fn softmax(&self, axis: i64) -> Result<Tensor> {
        apply("softmax", &[self], caller(), |b, x| {
            let axis = normalize_axis("softmax", axis, b.shape(x[0]).rank())?;
            b.op(Op::Softmax { axis }, &[x[0]])
        })
    }

    /// `softmax(q k^T scale [+ causal mask]) v` over `[batch, heads, seq, head_dim]` queries
    /// (`self`), keys and values of one shape and float dtype, as PyTorch's
    /// `scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)`; `scale` defaults
    /// to `1 / sqrt(head_dim)`. Compiled, it is one flash-attention kernel (no `seq x seq`
    /// matrix in memory), and its backward two.
    #[track_caller]
    pub fn scaled_dot_product_attention(
        &self,
        key: &Tensor,
        value: &Tensor,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<Tensor> {
        apply("scaled_dot_product_attention", &[self, key, value], caller(), |b, x| {
            let head_dim = b.shape(x[0]).dims().last().copied().unwrap_or(0);
            let scale = scale.unwrap_or(if head_dim == 0 { 1.0 } else { 1.0 / (head_dim as f64).sqrt() });
            b.op(Op::Attention { causal, scale }, &[x[0], x[1], x[2]])
        })
    }

    /// `log(softmax(x))` along `axis`, computed as `x - max - log(sum(exp(x - max)))` (no
    /// underflow to `-inf` where a probability rounds to 0).
    #[track_caller]
    pub fn log_softmax(&self, axis: i64) -> Result<Tensor> {
        apply("log_softmax", &[self], caller(), |b, x| {
            let axis = normalize_axis("log_softmax", axis, b.shape(x[0]).rank())?;
            b.op(Op::LogSoftmax { axis }, &[x[0]])
        })
    }

    /// PyTorch's `cross_entropy(logits, targets, ignore_index=..)` with the mean reduction: self
    /// is logits `[N, V]` (float), `targets` `[N]` (i32 or i64) class indices. Rows whose target
    /// is `ignore_index` (PyTorch's default is -100) count for nothing and get zero gradients; the
    /// mean over no rows is NaN. A target outside `0..V` is an error eagerly (the targets are
    /// read on the host, a host sync); compiled (where they stay on the device) it makes the
    /// loss NaN. Compiled, the forward is a row
    /// kernel and a sum over the rows, the backward one pass writing `(softmax - onehot) * g /
    /// count` per row; f16/bf16 logits compute in f32.
    #[track_caller]
    pub fn cross_entropy(&self, targets: &Tensor, ignore_index: i64) -> Result<Tensor> {
        let loc = caller();
        let dims = self.shape().dims().to_vec();
        let classes = dims.get(1).copied().unwrap_or(0);
        if !crate::trace::is_active() && dims.len() == 2 && targets.dtype().is_int() && !targets.is_traced() {
            check_targets(targets, classes, ignore_index, &loc)?;
        }
        // i32 class ids whatever the targets' width (the IR narrows i64 targets once per row):
        // the loss's row kernel reads one beside every logit, so they are data (an arange op
        // would be a pointwise kernel of its own).
        let index_dtype = if classes <= i32::MAX as usize { DType::I32 } else { DType::I64 };
        let class_ids = Tensor::arange_data(classes, index_dtype, self.device(), &loc)?;
        apply("cross_entropy", &[self, targets, &class_ids], loc, |b, x| {
            b.op(Op::CrossEntropy { ignore_index }, &[x[0], x[1], x[2]])
        })
    }

    /// PyTorch's `index_select(x, axis, indices)`: the slices of self at `indices` (a 1-D i32 or
    /// i64 tensor) along `axis`, in their order (repeats allowed). An index outside
    /// `0..shape[axis]` is an error naming it: eagerly the indices are read on the host (a host
    /// sync); compiled the read is clamped and the error is reported without a host wait: on the
    /// CPU backend by the call itself, on a GPU by a later call of the function or at the latest
    /// by the next host read (`to_vec`, `item`, ...) on this thread, as CUDA reports device-side
    /// asserts. The gradient is a deterministic scatter-add into the selected slices.
    #[track_caller]
    pub fn index_select(&self, axis: i64, indices: &Tensor) -> Result<Tensor> {
        let loc = caller();
        if indices.rank() != 1 {
            return Err(Error::invalid(
                "index_select",
                &loc,
                format!("indices must be 1-D, got shape {}", indices.shape()),
            ));
        }
        self.gather("index_select", axis, indices, loc)
    }

    /// PyTorch's `F.embedding(indices, weight)` with self the weight `[V, C]`: row `indices[..]`
    /// of the weight for every index (i32 or i64, any shape), `[.., C]`. Out-of-range indices
    /// are errors as in [`Tensor::index_select`]; compiled, the row read is a load inside the
    /// pointwise kernel that uses it (an embedding, a positional add and a cast are one
    /// kernel). The weight's gradient sums the rows' gradients per index in a fixed order (the
    /// same bits on every run), added to any other use of the weight (tied weights).
    #[track_caller]
    pub fn embedding(&self, indices: &Tensor) -> Result<Tensor> {
        let loc = caller();
        if self.rank() != 2 {
            return Err(Error::invalid(
                "embedding",
                &loc,
                format!("the weight must be [num_embeddings, dim], got shape {}", self.shape()),
            ));
        }
        self.gather("embedding", 0, indices, loc)
    }

    fn gather(&self, name: &'static str, axis: i64, indices: &Tensor, loc: SourceLoc) -> Result<Tensor> {
        if !indices.dtype().is_int() {
            return Err(Error::invalid(name, &loc, format!("indices must be i32 or i64, got {}", indices.dtype())));
        }
        let axis_index = normalize_axis(name, axis, self.rank()).map_err(|e| Error::ir(name, &loc, e))?;
        if !crate::trace::is_active() && !indices.is_traced() && !self.is_traced() {
            check_indices(name, indices, self.shape().dims()[axis_index], &loc)?;
        }
        apply(name, &[self, indices], loc, |b, x| b.op(Op::IndexSelect { axis: axis_index }, &[x[0], x[1]]))
    }

    /// PyTorch's `dropout(x, p, training)`: each element zeroed with probability `p`, the others
    /// scaled by `1 / (1 - p)`; the identity when `training` is false. The mask is drawn by
    /// Philox 4x32-10 (the `philox` op) with counter `offset + i` at element `i` (row-major)
    /// under key `seed`, both rank-0 i64 tensors: device values, so a step that advances
    /// `offset` (by at least the element count) draws a new mask on every call without
    /// retracing, even replayed as a CUDA graph. Every backend draws the same bits, and the
    /// backward recomputes the mask from the counter instead of storing it.
    #[track_caller]
    pub fn dropout(&self, p: f64, seed: &Tensor, offset: &Tensor, training: bool) -> Result<Tensor> {
        let loc = caller();
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::invalid("dropout", &loc, format!("p must be in [0, 1], got {p}")));
        }
        for (name, t) in [("seed", seed), ("offset", offset)] {
            if t.dtype() != DType::I64 || t.rank() != 0 {
                return Err(Error::invalid(
                    "dropout",
                    &loc,
                    format!("{name} must be a rank-0 i64 tensor, got {}{}", t.dtype(), t.shape()),
                ));
            }
        }
        if !self.dtype().is_float() {
            return Err(Error::invalid("dropout", &loc, format!("expected a float tensor, got {}", self.dtype())));
        }
        if !training {
            return Ok(self.clone());
        }
        // The flat element index as a sum of one small broadcast vector per dim (`i * stride`).
        let dims = self.shape().dims().to_vec();
        let mut lanes = Vec::with_capacity(dims.len());
        for (d, &n) in dims.iter().enumerate() {
            let stride: usize = dims[d + 1..].iter().product();
            let values: Vec<f64> = (0..n).map(|i| (i * stride) as f64).collect();
            let mut shape = vec![1; dims.len()];
            shape[d] = n;
            let host = braze_ir::HostTensor::from_f64(DType::I64, shape, &values)
                .map_err(|e| Error::ir("dropout", &loc, e))?;
            lanes.push(Tensor::from_host(host).to_device(self.device())?);
        }
        let mut operands = vec![self, seed, offset];
        operands.extend(lanes.iter());
        // P(r < threshold) = threshold / 2^32 for the 32-bit word r.
        let threshold = (p * 4_294_967_296.0).round();
        let scale = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
        apply("dropout", &operands, loc, |b, x| {
            let mut counter = x[2];
            for &lane in &x[3..] {
                counter = b.op(Op::Binary { op: BinaryOp::Add }, &[counter, lane])?;
            }
            let bits = b.op(Op::Binary { op: BinaryOp::Philox }, &[counter, x[1]])?;
            let threshold = b.constant(threshold, DType::I64);
            let keep = b.op(Op::Binary { op: BinaryOp::Ge }, &[bits, threshold])?;
            let dtype = b.dtype(x[0]);
            let wide = b.cast_if_needed(x[0], DType::F32)?;
            let scale = b.constant(scale, DType::F32);
            let scaled = b.op(Op::Binary { op: BinaryOp::Mul }, &[wide, scale])?;
            let zero = b.constant(0.0, DType::F32);
            let kept = b.op(Op::Where, &[keep, scaled, zero])?;
            b.cast_if_needed(kept, dtype)
        })
    }

    /// `min(max(x, min), max)` with scalar bounds of this tensor's dtype, as `torch.clamp`:
    /// NaN stays NaN, and `min > max` gives `max` everywhere.
    #[track_caller]
    pub fn clamp(&self, min: f64, max: f64) -> Result<Tensor> {
        apply("clamp", &[self], caller(), |b, x| {
            let dtype = b.dtype(x[0]);
            let (low, high) = (b.constant(min, dtype), b.constant(max, dtype));
            let raised = b.op(Op::Binary { op: BinaryOp::Max }, &[x[0], low])?;
            b.op(Op::Binary { op: BinaryOp::Min }, &[raised, high])
        })
    }

    /// A rank-0 bool tensor: whether any element is NaN (`isnan`, then `max` over all axes).
    /// It stays on the device; reading it with `to_bool` is what syncs.
    #[track_caller]
    pub fn any_nan(&self) -> Result<Tensor> {
        apply("any_nan", &[self], caller(), |b, x| {
            let nan = b.op(Op::Unary { op: UnaryOp::IsNan }, &[x[0]])?;
            let rank = b.shape(nan).rank();
            b.op(Op::Reduce { op: ReduceOp::Max, axes: (0..rank).collect(), keepdim: false }, &[nan])
        })
    }
}

/// Every target is a class of `0..classes` or `ignore_index` (an eager check on the host).
fn check_targets(targets: &Tensor, classes: usize, ignore_index: i64, loc: &SourceLoc) -> Result<()> {
    let host = crate::trace::host_value(targets, crate::BreakKind::HostRead, "cross_entropy", loc.clone())?;
    let values: Vec<i64> = match host.data() {
        braze_ir::HostData::I32(v) => v.iter().map(|&t| t.into()).collect(),
        braze_ir::HostData::I64(v) => v.clone(),
        _ => return Ok(()), // not indices: the op's typing reports it
    };
    let bad = values.into_iter().enumerate().find(|&(_, t)| t != ignore_index && (t < 0 || t as u64 >= classes as u64));
    match bad {
        Some((row, target)) => Err(Error::invalid(
            "cross_entropy",
            loc,
            format!(
                "target {target} of row {row} is out of range: expected 0..{classes} or ignore_index {ignore_index}"
            ),
        )),
        None => Ok(()),
    }
}

/// Every index is in `0..bound` (an eager check on the host).
fn check_indices(op: &str, indices: &Tensor, bound: usize, loc: &SourceLoc) -> Result<()> {
    let host = crate::trace::host_value(indices, crate::BreakKind::HostRead, op, loc.clone())?;
    let values: Vec<i64> = match host.data() {
        braze_ir::HostData::I32(v) => v.iter().map(|&t| t.into()).collect(),
        braze_ir::HostData::I64(v) => v.clone(),
        _ => return Ok(()),
    };
    match values.into_iter().enumerate().find(|&(_, i)| i < 0 || i as u64 >= bound as u64) {
        Some((at, index)) => Err(Error::invalid(
            op,
            loc,
            format!("index {index} (at position {at} of the indices) is out of range: expected 0..{bound}"),
        )),
        None => Ok(()),
    }
}

/// Whether `op` promotes mixed dtypes: logical and/or are defined on bools only.
fn promotes(op: BinaryOp) -> bool {
    !matches!(op, BinaryOp::And | BinaryOp::Or)
}

/// The operands cast to their common dtype (unchanged where they share one already).
fn promote(b: &mut OpBuilder<'_>, x: &[NodeId]) -> braze_ir::Result<Vec<NodeId>> {
    let typed: Vec<(DType, usize)> = x.iter().map(|&id| (b.dtype(id), b.shape(id).rank())).collect();
    let dtype = promotion::result_type(&typed);
    x.iter().map(|&id| b.cast_if_needed(id, dtype)).collect()
}

/// Resolves negative axes, rejects repeats, and sorts.
fn normalize_axes(op: &str, axes: &[i64], rank: usize) -> braze_ir::Result<Vec<usize>> {
    let mut out: Vec<usize> = Vec::with_capacity(axes.len());
    for &axis in axes {
        let resolved = normalize_axis(op, axis, rank)?;
        if out.contains(&resolved) {
            return Err(IrError::ShapeMismatch {
                op: op.to_string(),
                detail: format!("axis {axis} repeats an axis already given in {axes:?}"),
            });
        }
        out.push(resolved);
    }
    out.sort_unstable();
    Ok(out)
}

fn non_empty<'a>(op: &str, tensors: &'a [Tensor], loc: &SourceLoc) -> Result<Vec<&'a Tensor>> {
    if tensors.is_empty() {
        return Err(Error::invalid(op, loc, "expected at least one tensor, got 0"));
    }
    Ok(tensors.iter().collect())
}

macro_rules! operators {
    ($($trait:ident, $method:ident, $scalar:ident => $op:ident;)*) => {
        $(
            /// Returns `Result<Tensor>`, as every op does: `(&a + &b)?`.
            impl std::ops::$trait<&Tensor> for &Tensor {
                type Output = Result<Tensor>;
                #[track_caller]
                fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                    self.binary(stringify!($method), BinaryOp::$op, rhs, caller())
                }
            }

            /// The scalar becomes a constant of the tensor's dtype: `(&a * 0.5)?`.
            impl std::ops::$trait<f64> for &Tensor {
                type Output = Result<Tensor>;
                #[track_caller]
                fn $method(self, rhs: f64) -> Result<Tensor> {
                    self.binary_scalar(stringify!($scalar), BinaryOp::$op, rhs, caller())
                }
            }
        )*
    };
}

operators! {
    Add, add, add_scalar => Add;
    Sub, sub, sub_scalar => Sub;
    Mul, mul, mul_scalar => Mul;
    Div, div, div_scalar => Div;
}

impl std::ops::Neg for &Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        self.unary("neg", UnaryOp::Neg, caller())
    }
}
