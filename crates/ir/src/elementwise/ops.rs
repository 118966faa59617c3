//! The op lists: every unary and binary elementwise op as an enum variant and the name of its
//! `Tensor` method. The entries with each op's semantics are in `unary.rs` and `binary.rs`.

use serde::{Deserialize, Serialize};

/// Calls `$callback!` with every unary op as `Variant method;`, each with the doc of its
/// `Tensor` method. The order is the enum's (new ops go at the end).
#[macro_export]
macro_rules! for_each_unary_op {
    ($callback:ident) => {
        $callback! {
            /// `-x` (integers wrap).
            Neg neg;
            /// `|x|` (integers wrap).
            Abs abs;
            Exp exp;
            /// Natural logarithm.
            Log log;
            Sqrt sqrt;
            /// `1 / sqrt(x)`.
            Rsqrt rsqrt;
            /// `1 / x`.
            Reciprocal reciprocal;
            /// `max(x, 0)`; NaN stays NaN, -0 becomes +0.
            Relu relu;
            /// Exact GELU: `x / 2 * (1 + erf(x / sqrt(2)))`.
            GeluErf gelu;
            /// GELU with the tanh approximation.
            GeluTanh gelu_tanh;
            /// `x * sigmoid(x)`.
            Silu silu;
            Sigmoid sigmoid;
            Tanh tanh;
            /// Bool tensor: where the value is NaN.
            IsNan isnan;
            /// Bool tensor: where the value is neither NaN nor infinite.
            IsFinite isfinite;
            /// Bool negation (on numbers: `x == 0`).
            Not logical_not;
            /// The error function.
            Erf erf;
            /// `log(1 + x)`, accurate near 0.
            Log1p log1p;
            /// `exp(x) - 1`, accurate near 0.
            Expm1 expm1;
            Sin sin;
            Cos cos;
            /// Largest integer not above `x` (integers unchanged).
            Floor floor;
            /// Smallest integer not below `x` (integers unchanged).
            Ceil ceil;
            /// Nearest integer, halves to even (as `torch.round`; integers unchanged).
            Round round;
            /// -1, 0 or 1 by the sign of `x`; a zero keeps its sign and NaN stays NaN.
            Sign sign;
            /// `log(1 + exp(x))`, and `x` itself above 20 (as `torch.nn.functional.softplus`).
            Softplus softplus;
            /// `x * x` (integers wrap).
            Square square;
            /// The complementary error function `1 - erf(x)`, without its cancellation for
            /// large `x`.
            Erfc erfc;
            /// The derivative of exact GELU, `Phi(x) + x phi(x)` (standard normal CDF and
            /// density): GELU's backward, one op so a kernel evaluates the Gaussian once.
            GeluErfGrad gelu_grad;
        }
    };
}

macro_rules! declare_unary_ops {
    ($($(#[doc = $doc:literal])* $variant:ident $method:ident;)*) => {
        /// A unary elementwise op. Its definition is [`UnaryOp::def`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum UnaryOp {
            $($(#[doc = $doc])* $variant,)*
        }

        impl UnaryOp {
            /// Every unary op, in declaration order.
            pub const ALL: &'static [UnaryOp] = &[$(UnaryOp::$variant),*];

            /// The name of its `Tensor` method.
            pub fn method(self) -> &'static str {
                match self {
                    $(UnaryOp::$variant => stringify!($method),)*
                }
            }
        }
    };
}

for_each_unary_op!(declare_unary_ops);

/// Calls `$callback!` with every binary op as `Variant method, scalar_method;` (the method with
/// a tensor operand and the one with a scalar), each with the doc of its `Tensor` methods.
#[macro_export]
macro_rules! for_each_binary_op {
    ($callback:ident) => {
        $callback! {
            Add add, add_scalar;
            Sub sub, sub_scalar;
            Mul mul, mul_scalar;
            /// Floats divide as IEEE says; integers truncate, with `x / 0 == 0`.
            Div div, div_scalar;
            /// Elementwise maximum; NaN if either side is NaN (as `torch.maximum`).
            Max maximum, maximum_scalar;
            /// Elementwise minimum; NaN if either side is NaN (as `torch.minimum`).
            Min minimum, minimum_scalar;
            /// Float power.
            Pow pow, pow_scalar;
            /// Bool result.
            Eq eq, eq_scalar;
            /// Bool result.
            Ne ne, ne_scalar;
            /// Bool result.
            Lt lt, lt_scalar;
            /// Bool result.
            Le le, le_scalar;
            /// Bool result.
            Gt gt, gt_scalar;
            /// Bool result.
            Ge ge, ge_scalar;
            /// Logical and of bools.
            And logical_and, logical_and_scalar;
            /// Logical or of bools.
            Or logical_or, logical_or_scalar;
            /// Random bits of integers: the first word of Philox 4x32-10 at this counter under
            /// `other` as the key (both as 64-bit patterns), in `0..2^32` (i32: its bits).
            Philox philox, philox_scalar;
        }
    };
}

macro_rules! declare_binary_ops {
    ($($(#[doc = $doc:literal])* $variant:ident $method:ident, $scalar:ident;)*) => {
        /// A binary elementwise op; operands broadcast together and share a dtype. Its
        /// definition is [`BinaryOp::def`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum BinaryOp {
            $($(#[doc = $doc])* $variant,)*
        }

        impl BinaryOp {
            /// Every binary op, in declaration order.
            pub const ALL: &'static [BinaryOp] = &[$(BinaryOp::$variant),*];

            /// The name of its `Tensor` method.
            pub fn method(self) -> &'static str {
                match self {
                    $(BinaryOp::$variant => stringify!($method),)*
                }
            }
        }
    };
}

for_each_binary_op!(declare_binary_ops);
