//! The operation set: a small list of primitives plus composites (norms, softmax, cross entropy) that the
//! passes either match whole or decompose into primitives.

use crate::literal::format_f64;
use crate::{BinaryOp, DType, Literal, UnaryOp};
use serde::{Deserialize, Serialize};

/// A reduction. Typing follows PyTorch (see `infer`): a sum of bool, i32 or i64 values is i64,
/// a mean is defined for floats only, max and min keep the dtype (of bools: any and all).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceOp {
    Sum,
    Mean,
    /// NaN-propagating.
    Max,
    /// NaN-propagating.
    Min,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }

    /// The identity of an integer reduction of `dtype` (i32 or i64), widened to i64.
    pub fn int_identity(self, dtype: DType) -> i64 {
        let (min, max) = if dtype == DType::I32 { (i32::MIN.into(), i32::MAX.into()) } else { (i64::MIN, i64::MAX) };
        match self {
            ReduceOp::Sum | ReduceOp::Mean => 0,
            ReduceOp::Max => min,
            ReduceOp::Min => max,
        }
    }

    /// One step of an integer reduction in i64: sums wrap in i64, as PyTorch's do.
    pub fn combine_int(self, acc: i64, x: i64) -> i64 {
        match self {
            ReduceOp::Sum | ReduceOp::Mean => acc.wrapping_add(x),
            ReduceOp::Max => acc.max(x),
            ReduceOp::Min => acc.min(x),
        }
    }
}

/// Which operand of an attention an [`Op::AttentionGrad`] is the gradient of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionInput {
    Query,
    Key,
    Value,
}

impl AttentionInput {
    pub fn name(self) -> &'static str {
        match self {
            AttentionInput::Query => "query",
            AttentionInput::Key => "key",
            AttentionInput::Value => "value",
        }
    }

    /// The operand index of this input in `attention(q, k, v)` (and in `attention_grad`).
    pub fn operand(self) -> usize {
        self as usize
    }
}

/// One IR operation. Operand counts and meanings are listed per variant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Op {
    /// Graph input number `index` (no operands).
    Input {
        index: usize,
    },
    /// A scalar (rank 0) of the node's dtype (no operands); the value's kind matches the dtype.
    Constant {
        value: Literal,
    },
    /// `0, 1, .., n - 1` in the node's dtype (a number type), `n` its one dim (no operands);
    /// f16/bf16 round the values past their integers as a cast would.
    Arange,
    /// Converts its operand to the node's dtype.
    Cast,
    Unary {
        op: UnaryOp,
    },
    /// Two operands, broadcast together; both of one dtype.
    Binary {
        op: BinaryOp,
    },
    /// `where(cond, a, b)`: three operands broadcast together, `cond` is bool.
    Where,
    /// Reduction over `axes` (sorted, unique).
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
        keepdim: bool,
    },
    /// Same elements in row-major order, new shape (the node's shape).
    Reshape,
    /// NumPy broadcast to the node's shape.
    BroadcastTo,
    /// Output dim `i` is input dim `perm[i]`.
    Permute {
        perm: Vec<usize>,
    },
    /// Elements `start, start+step, ...` below `end` along `axis`.
    Slice {
        axis: usize,
        start: usize,
        end: usize,
        step: usize,
    },
    /// Any number of operands joined along `axis`.
    Concat {
        axis: usize,
    },
    /// Any number of same-shaped operands stacked along a new `axis`.
    Stack {
        axis: usize,
    },
    /// Batched matrix product `[.., m, k] @ [.., k, n]` with broadcast batch dims.
    MatMul,
    /// `(x - mean) / sqrt(var + eps) * w + b` over the last dim; operands x, w, b.
    LayerNorm {
        eps: f64,
    },
    /// `x / sqrt(mean(x^2) + eps) * w` over the last dim; operands x, w.
    RmsNorm {
        eps: f64,
    },
    /// Softmax along `axis`.
    Softmax {
        axis: usize,
    },
    /// `softmax(q k^T scale [+ causal mask]) v` per batch and head, as PyTorch's
    /// `scaled_dot_product_attention`; operands q, k, v, each `[B, H, T, D]` of one float dtype.
    /// `causal` masks key `j > i` for query `i` (the mask is never a tensor).
    Attention {
        causal: bool,
        scale: f64,
    },
    /// The per-row natural logsumexp of the attention's masked, scaled scores, f32 `[B, H, T]`;
    /// operands q, k (what the backward needs besides the output).
    AttentionLse {
        causal: bool,
        scale: f64,
    },
    /// The gradient of an attention with respect to operand `wrt`: operands q, k, v, lse (f32
    /// `[B, H, T]`), delta = `rowsum(dout * out)` (f32 `[B, H, T]`) and dout; the result has
    /// the shape and dtype of q (k, v).
    AttentionGrad {
        causal: bool,
        scale: f64,
        wrt: AttentionInput,
    },
    /// `x - max - log(sum(exp(x - max)))` along `axis`: the log of a softmax without its
    /// rounding or underflow.
    LogSoftmax {
        axis: usize,
    },
    /// The mean over rows of `-log_softmax(logits[n])[target[n]]`, as PyTorch's `cross_entropy`;
    /// operands logits `[N, V]` (float), targets `[N]` (i32 or i64) and classes `[V]` of the
    /// targets' dtype or i32 beside i64 targets, the class of each column (the frontend passes
    /// `0..V` in i32, as data its row kernel reads; a row's loss sums `-log_softmax` over every
    /// column whose class is its target, compared as integers of any width). Rows
    /// whose target is `ignore_index` are left out of the sum and the count; a row whose target
    /// is no column's class has a NaN loss (so the mean is NaN), and a mean over no rows is NaN,
    /// as PyTorch's. The result is a scalar of the logits' dtype.
    CrossEntropy {
        ignore_index: i64,
    },
    /// `x` indexed along `axis` by every element of `indices` (i32 or i64, any shape): the
    /// result is `x.shape[..axis] ++ indices.shape ++ x.shape[axis + 1..]` (PyTorch's
    /// `index_select` for 1-D indices, `embedding` for axis 0). An index outside
    /// `0..x.shape[axis]` is an error of the reference; compiled, the read is clamped and the
    /// plan's check for it raised.
    IndexSelect {
        axis: usize,
    },
    /// The adjoint of [`Op::IndexSelect`]: zeros of `src`'s dtype with extent `size` along
    /// `axis`, plus every slice of `src` (shaped as an index_select's result) added at its
    /// index; operands src and indices. Repeated indices sum in the order of the indices, so
    /// the result has the same bits on every run.
    IndexAdd {
        axis: usize,
        size: usize,
    },
}

/// What an op does with its float operands inside an autocast region (PyTorch's
/// `torch.autocast` lists): `Lower` ops gain from 16-bit inputs and take them in the region's
/// dtype, `Float32` ops need range or accumulate and take them in f32, `Keep` ops run in the
/// dtype their operands promote to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutocastPolicy {
    Lower,
    Float32,
    Keep,
}

impl Op {
    /// The name printed in the text form.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Constant { .. } => "const",
            Op::Arange => "arange",
            Op::Cast => "cast",
            Op::Unary { op } => op.name(),
            Op::Binary { op } => op.name(),
            Op::Where => "where",
            Op::Reduce { op, .. } => op.name(),
            Op::Reshape => "reshape",
            Op::BroadcastTo => "broadcast_to",
            Op::Permute { .. } => "permute",
            Op::Slice { .. } => "slice",
            Op::Concat { .. } => "concat",
            Op::Stack { .. } => "stack",
            Op::MatMul => "matmul",
            Op::LayerNorm { .. } => "layer_norm",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Softmax { .. } => "softmax",
            Op::Attention { .. } => "attention",
            Op::AttentionLse { .. } => "attention_lse",
            Op::AttentionGrad { .. } => "attention_grad",
            Op::LogSoftmax { .. } => "log_softmax",
            Op::CrossEntropy { .. } => "cross_entropy",
            Op::IndexSelect { .. } => "index_select",
            Op::IndexAdd { .. } => "index_add",
        }
    }

    /// The op's [`AutocastPolicy`]: matmuls and attention in the region's 16-bit dtype; norms,
    /// softmaxes, the loss, sums and means, and the transcendentals PyTorch keeps in f32 (exp,
    /// log, log1p, expm1, rsqrt, reciprocal, pow) in f32; the rest as their operands promote.
    pub fn autocast(&self) -> AutocastPolicy {
        use crate::{BinaryOp, UnaryOp};
        match self {
            Op::MatMul | Op::Attention { .. } => AutocastPolicy::Lower,
            Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::Softmax { .. } | Op::LogSoftmax { .. } => {
                AutocastPolicy::Float32
            }
            Op::CrossEntropy { .. } | Op::Reduce { op: ReduceOp::Sum | ReduceOp::Mean, .. } => AutocastPolicy::Float32,
            Op::Unary {
                op: UnaryOp::Exp | UnaryOp::Log | UnaryOp::Log1p | UnaryOp::Expm1 | UnaryOp::Rsqrt | UnaryOp::Reciprocal,
            } => AutocastPolicy::Float32,
            Op::Binary { op: BinaryOp::Pow } => AutocastPolicy::Float32,
            _ => AutocastPolicy::Keep,
        }
    }

    /// The exact operand count, or `None` for variadic ops (concat, stack: at least one).
    pub fn arity(&self) -> Option<usize> {
        match self {
            Op::Input { .. } | Op::Constant { .. } | Op::Arange => Some(0),
            Op::Cast | Op::Unary { .. } | Op::Reduce { .. } | Op::Reshape | Op::BroadcastTo => Some(1),
            Op::Permute { .. } | Op::Slice { .. } | Op::Softmax { .. } | Op::LogSoftmax { .. } => Some(1),
            Op::Binary { .. } | Op::MatMul | Op::RmsNorm { .. } | Op::AttentionLse { .. } => Some(2),
            Op::IndexSelect { .. } | Op::IndexAdd { .. } => Some(2),
            Op::Where | Op::LayerNorm { .. } | Op::CrossEntropy { .. } | Op::Attention { .. } => Some(3),
            Op::AttentionGrad { .. } => Some(6),
            Op::Concat { .. } | Op::Stack { .. } => None,
        }
    }

    /// Elementwise ops: output element i depends only on operand element i (after broadcast).
    pub fn is_elementwise(&self) -> bool {
        matches!(self, Op::Cast | Op::Unary { .. } | Op::Binary { .. } | Op::Where | Op::Constant { .. })
    }

    /// Views: a new shape or order of the operand's elements, no computation (kernels fold them
    /// into their loads).
    pub fn is_view(&self) -> bool {
        matches!(self, Op::Reshape | Op::BroadcastTo | Op::Permute { .. } | Op::Slice { .. })
    }

    pub fn is_composite(&self) -> bool {
        matches!(
            self,
            Op::LayerNorm { .. }
                | Op::RmsNorm { .. }
                | Op::Softmax { .. }
                | Op::LogSoftmax { .. }
                | Op::CrossEntropy { .. }
        )
    }

    /// Attributes printed after the operands in the text form, e.g. `axes=[1], keepdim`.
    pub fn attributes(&self) -> String {
        let list = |v: &[usize]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
        match self {
            Op::Input { index } => format!("#{index}"),
            Op::Constant { value } => value.to_string(),
            Op::Reduce { axes, keepdim, .. } => {
                format!("axes=[{}]{}", list(axes), if *keepdim { ", keepdim" } else { "" })
            }
            Op::Permute { perm } => format!("perm=[{}]", list(perm)),
            Op::Slice { axis, start, end, step } => format!("axis={axis}, {start}:{end}:{step}"),
            Op::Concat { axis } | Op::Stack { axis } | Op::Softmax { axis } | Op::LogSoftmax { axis } => {
                format!("axis={axis}")
            }
            Op::LayerNorm { eps } | Op::RmsNorm { eps } => format!("eps={}", format_f64(*eps)),
            Op::Attention { causal, scale } | Op::AttentionLse { causal, scale } => {
                format!("scale={}{}", format_f64(*scale), if *causal { ", causal" } else { "" })
            }
            Op::AttentionGrad { causal, scale, wrt } => {
                format!("wrt={}, scale={}{}", wrt.name(), format_f64(*scale), if *causal { ", causal" } else { "" })
            }
            Op::CrossEntropy { ignore_index } => format!("ignore_index={ignore_index}"),
            Op::IndexSelect { axis } => format!("axis={axis}"),
            Op::IndexAdd { axis, size } => format!("axis={axis}, size={size}"),
            _ => String::new(),
        }
    }
}
