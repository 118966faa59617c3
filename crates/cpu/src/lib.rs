//! braze-cpu: the CPU reference backend, the oracle every compiled kernel is checked against.
//!
//! [`eval_graph`] interprets an IR graph directly. Its semantics are the definition of each op for
//! the whole compiler:
//!
//! **Numerics.** Float ops compute in f64 and every op's result is rounded (to nearest even) to
//! the node's dtype, f32, f16 or bf16; fused GPU kernels compute in f32 and are compared with the
//! tolerances of [`tolerance`]. Integer ops compute in i64 and wrap to the node's dtype (i32
//! wraps). Bools are bools.
//!
//! **Shapes.** Broadcasting is NumPy's. Zero-size tensors are valid everywhere and give empty
//! results; a reduction over an empty axis gives its identity (below).
//!
//! **Unary.** neg, abs, exp, log, sqrt; `rsqrt(x) = 1/sqrt(x)`; `reciprocal(x) = 1/x`;
//! `relu(x)` is NaN for NaN, else `x > 0 ? x : +0.0` (so `relu(-0.0) = +0.0`);
//! `gelu_erf(x) = 0.5·x·(1 + erf(x/√2))`, computed as `0.5·x·erfc(-x/√2)`;
//! `gelu_tanh(x) = 0.5·x·(1 + tanh(u))` with `u = √(2/π)·(x + 0.044715·x³)`, computed as
//! `x/(1 + exp(-2u))` (both forms keep their relative accuracy for negative `x`, where
//! `1 + erf` and `1 + tanh` cancel); `silu(x) = x/(1 + exp(-x))`;
//! `sigmoid(x) = 1/(1 + exp(-x))`; tanh. The formulas are taken literally, so
//! `gelu_erf(-inf)`, `gelu_tanh(-inf)` and `silu(-inf)` are NaN (`-inf · 0`, `-inf / inf`).
//! isnan and isfinite give bools (false and true for integers); `not` is `!b` on bools and
//! `x == 0` on numbers. On integers neg and abs wrap and relu is `max(x, 0)`.
//!
//! **Binary.** add, sub, mul, div, `pow` (floats only, `powf`). Integer division truncates toward
//! zero and `x / 0 == 0`; integer overflow wraps. max and min propagate NaN (either NaN gives
//! NaN) and order -0 below +0. eq/ne/lt/le/gt/ge are IEEE comparisons giving bool (any NaN gives
//! false, except `ne` gives true). and/or on bools.
//!
//! **where(cond, a, b)** with all three broadcast. **cast**: float -> int truncates toward zero,
//! saturates, NaN -> 0 (Rust `as`); int -> int wraps; anything -> bool is `!= 0` (NaN -> true);
//! bool -> number is 0/1; to f32/f16/bf16 rounds to nearest even, in one rounding from the exact
//! value.
//!
//! **Reductions** sum/mean/max/min over `axes`, with or without kept dims. Floats accumulate in
//! f64 in row-major order of the reduced elements; `mean = sum / count`; max/min propagate NaN.
//! Empty reductions give sum 0, mean NaN, max -inf and min +inf for floats, dtype MIN for an
//! integer max and dtype MAX for an integer min; on bools max is "any" (empty: false) and min is
//! "all" (empty: true). As in PyTorch, sums of integers and bools (true counts 1) are i64 and
//! wrap in i64; a mean of them is a typing error.
//!
//! **Layout.** reshape (row-major), broadcast_to, permute (output dim i is input dim perm\[i\]),
//! slice {axis, start, end, step}, concat {axis}, stack {axis}.
//!
//! **matmul** `[.., m, k] @ [.., k, n]` with broadcast batch dims, each dot product accumulated
//! in f64 over k in order and rounded once (k = 0 gives zeros).
//!
//! **Composites**, each row in f64 and rounded once: `layer_norm {eps}(x, w, b)` over the last
//! dim is `(x - mean) / sqrt(var + eps) * w + b` with the biased variance (divided by n);
//! `rms_norm {eps}(x, w)` is `x / sqrt(mean(x²) + eps) * w`; `softmax {axis}` is
//! `exp(x - max) / Σ exp(x - max)` along the axis, max NaN-propagating, so a row holding NaN or
//! +inf, or only -inf, is all NaN; `log_softmax {axis}` is `x - max - ln Σ exp(x - max)`.
//!
//! **attention {causal, scale}(q, k, v)** per `[B, H]` pair, each row in f64: `softmax(scale q
//! k^T) v` with keys after the query left out when causal; **attention_lse** is the row's
//! `ln sum exp` of those scores (f32); **attention_grad {wrt}** the gradient of q, k or v from
//! the given lse and `delta = rowsum(dout * out)` (see `attention.rs`).
//!
//! **constant** is a scalar of the node's dtype (converted from its f64 value with cast
//! semantics); **input** is the bound input.
//!
//! [`eval_plan`] runs a fused [`braze_plan::Plan`] kernel by kernel the way a GPU would (f32
//! math, each kernel family's own loop structure, float sums as trees the way the kernels'
//! butterflies combine them), so fusion's indexing is testable without a GPU. [`mod@compare`] and [`random`] hold the checks and reproducible test data the other crates'
//! tests use.

mod attention;
pub mod compare;
mod error;
mod eval;
mod plan_eval;
pub mod random;
mod scalar;
mod walk;
mod wide;

pub use compare::{
    assert_close, assert_close_bounded, assert_close_with, compare, compare_either, tolerance, ulp, Bounds,
    CompareReport, Mismatch,
};
pub use error::{CpuError, Result};
pub use eval::eval_graph;
pub use plan_eval::{eval_kernel, eval_plan, eval_plan_observed};
pub use random::{inject_specials, random_tensor, SplitMix64};
pub use wide::wide_graph;
