//! Each binary elementwise op's entry: typing, properties, semantics, CUDA C and derivative.

use super::ops::{BinaryOp, UnaryOp};
use super::real::{nan_max, nan_min, Real};
use super::{Accepts, CType, CudaExpr, CudaHelper, DVal, DerivativeBuilder, Elem, Exactness, Partials, Yields};
use super::{Elem::Bool as B, Elem::Float as F, Elem::Int as I};

/// Scalar semantics of a binary op, one definition instantiated for both computing types.
#[derive(Clone, Copy)]
pub struct BinarySemantics {
    pub f64: fn(Elem<f64>, Elem<f64>) -> Elem<f64>,
    pub f32: fn(Elem<f32>, Elem<f32>) -> Elem<f32>,
}

/// Everything the pipeline knows about a binary op.
#[derive(Clone, Copy)]
pub struct BinaryDef {
    /// The name in the IR text form.
    pub name: &'static str,
    pub accepts: Accepts,
    pub yields: Yields,
    pub exactness: Exactness,
    /// False where a last-bit change of a float operand can change the result by more than a
    /// last-bit amount (comparisons; `pow` of a negative base).
    pub continuous: bool,
    pub commutative: bool,
    pub semantics: BinarySemantics,
    /// The CUDA C expression for operands `a` and `b` in registers of the given type; `None`
    /// for a type the op does not accept.
    pub cuda: fn(a: &str, b: &str, ty: CType) -> Option<CudaExpr>,
    pub partials: Partials,
}

/// `go::<f64>` and `go::<f32>` of one generic definition whose arms are given per element kind.
macro_rules! semantics {
    ($($pat:pat => $value:expr),+ $(,)?) => {{
        #[allow(unreachable_patterns, unused_variables)]
        fn go<R: Real>(a: Elem<R>, b: Elem<R>) -> Elem<R> {
            match (a, b) {
                $($pat => $value,)+
                other => unreachable!("{other:?} passed type checking"),
            }
        }
        BinarySemantics { f64: go::<f64>, f32: go::<f32> }
    }};
}

/// A comparison on any two elements of one kind; IEEE for floats (NaN compares false except
/// with `ne`).
macro_rules! comparison {
    ($symbol:tt) => {
        semantics!(
            (F(a), F(b)) => B(a $symbol b),
            (I(a), I(b)) => B(a $symbol b),
            (B(a), B(b)) => B(a $symbol b),
        )
    };
}

macro_rules! comparison_cuda {
    ($symbol:literal) => {
        |a: &str, b: &str, _: CType| Some(CudaExpr::plain(format!(concat!("{} ", $symbol, " {}"), a, b)))
    };
}

/// `(T)((U)a op (U)b)`: integer arithmetic that wraps.
fn wrapping_c(a: &str, symbol: &str, b: &str, ty: CType) -> String {
    let (t, u) = (ty.signed(), ty.unsigned());
    format!("({t})(({u}){a} {symbol} ({u}){b})")
}

/// Float `a op b`, integers wrapping, no bools.
fn arithmetic_c(a: &str, symbol: &str, b: &str, ty: CType) -> Option<CudaExpr> {
    match ty {
        CType::Float => Some(CudaExpr::plain(format!("{a} {symbol} {b}"))),
        CType::I32 | CType::I64 => Some(CudaExpr::plain(wrapping_c(a, symbol, b, ty))),
        CType::Bool => None,
    }
}

static PHILOX: CudaHelper = CudaHelper {
    name: "philox",
    source: &[
        "// Philox 4x32-10, first word, at counter (lo, hi, 0, 0) under key (lo, hi): the reference's stream.",
        "__device__ __forceinline__ long long philox(long long counter, long long key) {",
        "  unsigned c0 = (unsigned)counter, c1 = (unsigned)((unsigned long long)counter >> 32), c2 = 0u, c3 = 0u;",
        "  unsigned k0 = (unsigned)key, k1 = (unsigned)((unsigned long long)key >> 32);",
        "  #pragma unroll",
        "  for (int round = 0; round < 10; ++round) {",
        "    if (round > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }",
        "    const unsigned hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;",
        "    const unsigned hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;",
        "    c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;",
        "  }",
        "  return (long long)c0;",
        "}",
    ],
    requires: &[],
};

static MAX_F32: CudaHelper = CudaHelper {
    name: "max_f32",
    source: &[
        "// NaN-propagating maximum (fmaxf would drop the NaN).",
        "__device__ __forceinline__ float max_f32(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }",
    ],
    requires: &[],
};
// ptxas of CUDA 13.0 folds a negated operand into a three-input VIMNMX3 on sm_90 and loses the
// negation: `max(max(x, -y), -z)` ran as `max(x, y, -z)`. An identity byte permute of each operand
// (which ptxas removes afterwards) keeps every negation an instruction of its own.
static MAX_I32: CudaHelper = CudaHelper {
    name: "max_i32",
    source: &[
        "// Operands through an identity permute: ptxas 13.0 drops a negation it folds into VIMNMX3.",
        "__device__ __forceinline__ int max_i32(int a, int b) {",
        "  asm(\"prmt.b32 %0, %0, 0, 0x3210;\" : \"+r\"(a));",
        "  asm(\"prmt.b32 %0, %0, 0, 0x3210;\" : \"+r\"(b));",
        "  return a > b ? a : b;",
        "}",
    ],
    requires: &[],
};
static MIN_I32: CudaHelper = CudaHelper {
    name: "min_i32",
    source: &[
        "// Operands through an identity permute: ptxas 13.0 drops a negation it folds into VIMNMX3.",
        "__device__ __forceinline__ int min_i32(int a, int b) {",
        "  asm(\"prmt.b32 %0, %0, 0, 0x3210;\" : \"+r\"(a));",
        "  asm(\"prmt.b32 %0, %0, 0, 0x3210;\" : \"+r\"(b));",
        "  return a < b ? a : b;",
        "}",
    ],
    requires: &[],
};
static MIN_F32: CudaHelper = CudaHelper {
    name: "min_f32",
    source: &[
        "// NaN-propagating minimum (fminf would drop the NaN).",
        "__device__ __forceinline__ float min_f32(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }",
    ],
    requires: &[],
};
static DIV_I32: CudaHelper = CudaHelper {
    name: "div_i32",
    source: &[
        "// Truncating division with x / 0 == 0 and INT_MIN / -1 wrapping, as on the host.",
        "__device__ __forceinline__ int div_i32(int a, int b) { return b == 0 ? 0 : (b == -1 ? (int)(0u - (unsigned)a) : a / b); }",
    ],
    requires: &[],
};
static DIV_I64: CudaHelper = CudaHelper {
    name: "div_i64",
    source: &[
        "// Truncating division with x / 0 == 0 and INT64_MIN / -1 wrapping, as on the host.",
        "__device__ __forceinline__ long long div_i64(long long a, long long b) {",
        "  return b == 0 ? 0 : (b == -1 ? (long long)(0ull - (unsigned long long)a) : a / b);",
        "}",
    ],
    requires: &[],
};

// ---- derivative formulas --------------------------------------------------------------------

/// The share of the gradient a max/min operand `x` gets against `other`: all of it where it was
/// chosen (`wins`), half on a tie, none where the other was chosen (as PyTorch splits ties).
fn selected_share(d: &mut dyn DerivativeBuilder, x: DVal, other: DVal, loses: BinaryOp) -> DVal {
    let (zero, half, one) = (d.constant(0.0), d.constant(0.5), d.constant(1.0));
    let lost = d.binary(loses, x, other);
    let tie = d.binary(BinaryOp::Eq, x, other);
    let tie_or_win = d.select(tie, half, one);
    d.select(lost, zero, tie_or_win)
}

/// Pow's operand gradients for the incoming gradient `g`, as PyTorch's `pow_backward_self` and
/// `pow_backward_exponent`: `where(b == 0, 0, g b a^(b-1))` for the base (0 at `0^0`, whose
/// partial `0 * 0^-1` is NaN, and whatever `g` is, since `y` is 1 for every base there) and
/// `g where(a == 0 && b >= 0, 0, y ln(a))` for the exponent (0 where `0^b` is 0 or 1 rather than
/// `0 * -inf`).
fn pow_gradients(d: &mut dyn DerivativeBuilder, a: DVal, b: DVal, y: DVal, g: DVal) -> (DVal, DVal) {
    let (zero, one) = (d.constant(0.0), d.constant(1.0));
    let b_minus_one = d.binary(BinaryOp::Sub, b, one);
    let power = d.binary(BinaryOp::Pow, a, b_minus_one);
    let da = d.binary(BinaryOp::Mul, b, power);
    let ga = d.binary(BinaryOp::Mul, g, da);
    let b_zero = d.binary(BinaryOp::Eq, b, zero);
    let ga = d.select(b_zero, zero, ga);
    let ln_a = d.unary(UnaryOp::Log, a);
    let db = d.binary(BinaryOp::Mul, y, ln_a);
    let a_zero = d.binary(BinaryOp::Eq, a, zero);
    let b_nonnegative = d.binary(BinaryOp::Ge, b, zero);
    let zero_base = d.binary(BinaryOp::And, a_zero, b_nonnegative);
    let db = d.select(zero_base, zero, db);
    (ga, d.binary(BinaryOp::Mul, g, db))
}

impl BinaryOp {
    /// The op's entry in the table.
    pub fn def(self) -> BinaryDef {
        use Accepts::{Any, Bool, Float, Integer, Numeric};
        use Exactness::{Approximate, CorrectlyRounded, Exact};
        let comparison = |name, semantics, cuda, commutative| BinaryDef {
            name,
            accepts: Any,
            yields: Yields::Bool,
            exactness: Exact,
            continuous: false,
            commutative,
            semantics,
            cuda,
            partials: Partials::NotDifferentiable,
        };
        match self {
            BinaryOp::Add => BinaryDef {
                name: "add",
                accepts: Numeric,
                yields: Yields::Same,
                exactness: CorrectlyRounded,
                continuous: true,
                commutative: true,
                semantics: semantics!((F(a), F(b)) => F(a + b), (I(a), I(b)) => I(a.wrapping_add(b))),
                cuda: |a, b, ty| arithmetic_c(a, "+", b, ty),
                partials: Partials::Formula(|d, _, _, _| (d.constant(1.0), d.constant(1.0))),
            },
            BinaryOp::Sub => BinaryDef {
                name: "sub",
                accepts: Numeric,
                yields: Yields::Same,
                exactness: CorrectlyRounded,
                continuous: true,
                commutative: false,
                semantics: semantics!((F(a), F(b)) => F(a - b), (I(a), I(b)) => I(a.wrapping_sub(b))),
                cuda: |a, b, ty| arithmetic_c(a, "-", b, ty),
                partials: Partials::Formula(|d, _, _, _| (d.constant(1.0), d.constant(-1.0))),
            },
            BinaryOp::Mul => BinaryDef {
                name: "mul",
                accepts: Numeric,
                yields: Yields::Same,
                exactness: CorrectlyRounded,
                continuous: true,
                commutative: true,
                semantics: semantics!((F(a), F(b)) => F(a * b), (I(a), I(b)) => I(a.wrapping_mul(b))),
                // `__fmul_rn`: NVRTC would contract `a * b + c` into one fused multiply-add,
                // rounding once where the op graph (and the reference) rounds twice.
                cuda: |a, b, ty| match ty {
                    CType::Float => Some(CudaExpr::plain(format!("__fmul_rn({a}, {b})"))),
                    _ => arithmetic_c(a, "*", b, ty),
                },
                partials: Partials::Formula(|_, a, b, _| (b, a)),
            },
            BinaryOp::Div => BinaryDef {
                name: "div",
                accepts: Numeric,
                yields: Yields::Same,
                exactness: CorrectlyRounded,
                continuous: true,
                commutative: false,
                semantics: semantics!(
                    (F(a), F(b)) => F(a / b),
                    (I(a), I(b)) => I(if b == 0 { 0 } else { a.wrapping_div(b) }),
                ),
                cuda: |a, b, ty| match ty {
                    CType::Float => Some(CudaExpr::plain(format!("{a} / {b}"))),
                    CType::I32 => Some(CudaExpr::call(&DIV_I32, &[a, b])),
                    CType::I64 => Some(CudaExpr::call(&DIV_I64, &[a, b])),
                    CType::Bool => None,
                },
                partials: Partials::Formula(|d, _, b, y| {
                    let da = d.unary(UnaryOp::Reciprocal, b);
                    let y_over_b = d.binary(BinaryOp::Div, y, b);
                    (da, d.unary(UnaryOp::Neg, y_over_b))
                }),
            },
            BinaryOp::Max => BinaryDef {
                name: "max",
                accepts: Numeric,
                yields: Yields::Same,
                exactness: Exact,
                continuous: true,
                commutative: true,
                semantics: semantics!((F(a), F(b)) => F(nan_max(a, b)), (I(a), I(b)) => I(a.max(b))),
                cuda: |a, b, ty| match ty {
                    CType::Float => Some(CudaExpr::call(&MAX_F32, &[a, b])),
                    CType::I32 => Some(CudaExpr::call(&MAX_I32, &[a, b])),
                    CType::I64 => Some(CudaExpr::plain(format!("{a} > {b} ? {a} : {b}"))),
                    CType::Bool => None,
                },
                partials: Partials::Formula(|d, a, b, _| {
                    (selected_share(d, a, b, BinaryOp::Lt), selected_share(d, b, a, BinaryOp::Lt))
                }),
            },
            BinaryOp::Min => BinaryDef {
                name: "min",
                accepts: Numeric,
                yields: Yields::Same,
                exactness: Exact,
                continuous: true,
                commutative: true,
                semantics: semantics!((F(a), F(b)) => F(nan_min(a, b)), (I(a), I(b)) => I(a.min(b))),
                cuda: |a, b, ty| match ty {
                    CType::Float => Some(CudaExpr::call(&MIN_F32, &[a, b])),
                    CType::I32 => Some(CudaExpr::call(&MIN_I32, &[a, b])),
                    CType::I64 => Some(CudaExpr::plain(format!("{a} < {b} ? {a} : {b}"))),
                    CType::Bool => None,
                },
                partials: Partials::Formula(|d, a, b, _| {
                    (selected_share(d, a, b, BinaryOp::Gt), selected_share(d, b, a, BinaryOp::Gt))
                }),
            },
            BinaryOp::Pow => BinaryDef {
                name: "pow",
                accepts: Float,
                yields: Yields::Same,
                exactness: Approximate,
                // A negative base has a value only at integer exponents: an exponent one bit off
                // an integer turns a finite result into NaN (fuzz seed 91,000,810).
                continuous: false,
                commutative: false,
                semantics: semantics!((F(a), F(b)) => F(a.powf(b))),
                cuda: |a, b, ty| (ty == CType::Float).then(|| CudaExpr::plain(format!("powf({a}, {b})"))),
                partials: Partials::Gradients(pow_gradients),
            },
            BinaryOp::Eq => comparison("eq", comparison!(==), comparison_cuda!("=="), true),
            BinaryOp::Ne => comparison("ne", comparison!(!=), comparison_cuda!("!="), true),
            BinaryOp::Lt => comparison("lt", comparison!(<), comparison_cuda!("<"), false),
            BinaryOp::Le => comparison("le", comparison!(<=), comparison_cuda!("<="), false),
            BinaryOp::Gt => comparison("gt", comparison!(>), comparison_cuda!(">"), false),
            BinaryOp::Ge => comparison("ge", comparison!(>=), comparison_cuda!(">="), false),
            BinaryOp::And => BinaryDef {
                name: "and",
                accepts: Bool,
                yields: Yields::Bool,
                exactness: Exact,
                continuous: false,
                commutative: true,
                semantics: semantics!((B(a), B(b)) => B(a && b)),
                cuda: |a, b, ty| (ty == CType::Bool).then(|| CudaExpr::plain(format!("{a} && {b}"))),
                partials: Partials::NotDifferentiable,
            },
            BinaryOp::Philox => BinaryDef {
                name: "philox",
                accepts: Integer,
                yields: Yields::Same,
                exactness: Exact,
                continuous: false,
                commutative: false,
                semantics: semantics!((I(a), I(b)) => I(super::philox_word(a, b))),
                cuda: |a, b, ty| match ty {
                    CType::I64 => Some(CudaExpr::call(&PHILOX, &[a, b])),
                    CType::I32 => Some(
                        CudaExpr::plain(format!("(int)philox((long long){a}, (long long){b})")).with_helper(&PHILOX),
                    ),
                    CType::Float | CType::Bool => None,
                },
                partials: Partials::NotDifferentiable,
            },
            BinaryOp::Or => BinaryDef {
                name: "or",
                accepts: Bool,
                yields: Yields::Bool,
                exactness: Exact,
                continuous: false,
                commutative: true,
                semantics: semantics!((B(a), B(b)) => B(a || b)),
                cuda: |a, b, ty| (ty == CType::Bool).then(|| CudaExpr::plain(format!("{a} || {b}"))),
                partials: Partials::NotDifferentiable,
            },
        }
    }

    /// The name in the IR text form.
    pub fn name(self) -> &'static str {
        self.def().name
    }

    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge)
    }

    pub fn is_logical(self) -> bool {
        self.def().accepts == Accepts::Bool
    }

    pub fn is_commutative(self) -> bool {
        self.def().commutative
    }

    pub fn result_dtype(self, input: crate::DType) -> crate::DType {
        self.def().yields.dtype(input)
    }

    /// The op on two elements of one kind in f64 (the reference).
    pub fn eval_f64(self, a: Elem<f64>, b: Elem<f64>) -> Elem<f64> {
        (self.def().semantics.f64)(a, b)
    }

    /// The op on two elements of one kind in f32 (as fused kernels compute it).
    pub fn eval_f32(self, a: Elem<f32>, b: Elem<f32>) -> Elem<f32> {
        (self.def().semantics.f32)(a, b)
    }
}
