//! Every IR op as a `Tensor` method. Each records the caller's `file:line:col` on its nodes, runs
//! eagerly outside a compiled function and records into the trace inside one.
//!
//! Axes are `i64` and may be negative (counted from the end). A scalar argument becomes a
//! constant of the tensor's dtype (converted as a cast would).

use crate::tensor::caller;
use crate::trace::apply;
use crate::{Error, Result, Tensor};
use braze_ir::infer::normalize_axis;
use braze_ir::{BinaryOp, DType, IrError, Op, ReduceOp, Shape, SourceLoc, UnaryOp};

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
                /// Operands broadcast together and must share a dtype.
                #[track_caller]
                pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                    self.binary(stringify!($name), BinaryOp::$op, other, caller())
                }

                #[doc = concat!("`", stringify!($name), "` with a scalar of this tensor's dtype.")]
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

    fn binary(&self, name: &'static str, op: BinaryOp, other: &Tensor, loc: SourceLoc) -> Result<Tensor> {
        apply(name, &[self, other], loc, |b, x| b.op(Op::Binary { op }, &[x[0], x[1]]))
    }

    fn binary_scalar(&self, name: &'static str, op: BinaryOp, value: f64, loc: SourceLoc) -> Result<Tensor> {
        apply(name, &[self], loc, |b, x| {
            let scalar = b.constant(value, b.dtype(x[0]));
            b.op(Op::Binary { op }, &[x[0], scalar])
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

    /// `cond ? a : b` elementwise, all three broadcast together; `cond` is bool.
    #[track_caller]
    pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        apply("where_", &[cond, a, b], caller(), |g, x| g.op(Op::Where, &[x[0], x[1], x[2]]))
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
