//! Each unary elementwise op's entry: typing, properties, semantics, CUDA C and derivative.

use super::ops::{BinaryOp, UnaryOp};
use super::real::Real;
use super::{Accepts, CType, CudaExpr, CudaHelper, DVal, Derivative, DerivativeBuilder, Elem, Exactness, Yields};
use super::{Elem::Bool as B, Elem::Float as F, Elem::Int as I};

/// Scalar semantics of a unary op, one definition instantiated for both computing types.
#[derive(Clone, Copy)]
pub struct UnarySemantics {
    pub f64: fn(Elem<f64>) -> Elem<f64>,
    pub f32: fn(Elem<f32>) -> Elem<f32>,
}

/// Everything the pipeline knows about a unary op.
#[derive(Clone, Copy)]
pub struct UnaryDef {
    /// The name in the IR text form.
    pub name: &'static str,
    pub accepts: Accepts,
    pub yields: Yields,
    pub exactness: Exactness,
    /// False where a last-bit change of a float operand can change the result by more than a
    /// last-bit amount (steps, predicates).
    pub continuous: bool,
    pub semantics: UnarySemantics,
    /// The CUDA C expression for operand `x` in registers of the given type; `None` for a type
    /// the op does not accept.
    pub cuda: fn(x: &str, ty: CType) -> Option<CudaExpr>,
    /// A cheaper expression for a float value rounded to 16 bits (bf16, f16), where `cuda`'s
    /// f32 accuracy costs more arithmetic than the rounding leaves of it: within 2e-5 relative
    /// (the GELUs, whose kernels are bound by their arithmetic at 16 bits). `None`: `cuda`.
    pub narrow_cuda: Option<fn(x: &str) -> CudaExpr>,
    pub derivative: Derivative,
}

/// `go::<f64>` and `go::<f32>` of one generic definition whose arms are given per element kind.
macro_rules! semantics {
    ($($pat:pat => $value:expr),+ $(,)?) => {{
        #[allow(unreachable_patterns, unused_variables)]
        fn go<R: Real>(e: Elem<R>) -> Elem<R> {
            match e {
                $($pat => $value,)+
                other => unreachable!("{other:?} passed type checking"),
            }
        }
        UnarySemantics { f64: go::<f64>, f32: go::<f32> }
    }};
}

fn float_only(x: &str, ty: CType, f: impl FnOnce(&str) -> CudaExpr) -> Option<CudaExpr> {
    (ty == CType::Float).then(|| f(x))
}

macro_rules! libm_call {
    ($name:literal) => {
        |x: &str, ty: CType| float_only(x, ty, |x| CudaExpr::plain(format!(concat!($name, "({})"), x)))
    };
}

macro_rules! helper_call {
    ($helper:expr) => {
        |x: &str, ty: CType| float_only(x, ty, |x| CudaExpr::call(&$helper, &[x]))
    };
}

/// `(T)(0 - (U)x)`: integer negation that wraps.
fn wrapping_neg_c(x: &str, ty: CType) -> String {
    format!("({})({} - ({}){x})", ty.signed(), ty.unsigned_zero(), ty.unsigned())
}

static RELU: CudaHelper = CudaHelper {
    name: "relu_f32",
    source: &[
        "// relu(NaN) = NaN and relu(-0) = +0.",
        "__device__ __forceinline__ float relu_f32(float x) { return (x > 0.0f || x != x) ? x : 0.0f; }",
    ],
    requires: &[],
};
// ptxas of CUDA 13.0 for sm_90 takes the cleared sign bit of `abs.f32` as "not negative" and
// folds `fabsf(x) > -1` to true, NaN included (GPU fuzz seed 6,644; the PTX is right). The
// result through an identity byte permute (removed after that fold) keeps the comparison.
static ABS_F32: CudaHelper = CudaHelper {
    name: "abs_f32",
    source: &[
        "// |x| through an identity permute: ptxas 13.0 folds a comparison of fabsf with a negative to true, NaN included.",
        "__device__ __forceinline__ float abs_f32(float x) {",
        "  unsigned bits = __float_as_uint(fabsf(x));",
        "  asm(\"prmt.b32 %0, %0, 0, 0x3210;\" : \"+r\"(bits));",
        "  return __uint_as_float(bits);",
        "}",
    ],
    requires: &[],
};
static IS_FINITE: CudaHelper = CudaHelper {
    name: "is_finite_f32",
    source: &[
        "__device__ __forceinline__ bool is_finite_f32(float x) { return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u; }",
    ],
    requires: &[],
};
/// `Q(t)` of [`ERFCX`]: `erfc(z) exp(z^2) = t Q(t)` for `t = 1 / (1 + z / 2)`, one home for the
/// fit that the exact and the narrow Gaussians share.
static ERFCX_FIT: CudaHelper = CudaHelper {
    name: "erfcx_fit_f32",
    source: &[
        "// Q(t), a degree-10 fit of erfc(z) exp(z^2) / t for t = 1 / (1 + z / 2), z >= 0.",
        "__device__ __forceinline__ float erfcx_fit_f32(float t) {",
        "  float q = 0.042352594f;",
        "  q = fmaf(q, t, -0.23085766f);",
        "  q = fmaf(q, t, 0.48617887f);",
        "  q = fmaf(q, t, -0.4469775f);",
        "  q = fmaf(q, t, 0.12708952f);",
        "  q = fmaf(q, t, -0.057232507f);",
        "  q = fmaf(q, t, 0.09300059f);",
        "  q = fmaf(q, t, 0.17537683f);",
        "  q = fmaf(q, t, 0.2468806f);",
        "  q = fmaf(q, t, 0.28209385f);",
        "  q = fmaf(q, t, 0.2820948f);",
        "  return q;",
        "}",
    ],
    requires: &[],
};
/// `erfc(z) exp(z^2)` for `z >= 0` as `t Q(t)`, `t = 1 / (1 + z / 2)`: `Q` a degree-10 fit of
/// relative error 1.1e-8 on all of `t` in `[0, 1]` (least squares for the relative error against
/// 40-digit values), the reciprocal refined by one Newton step. With `exp(-z^2)` computed from
/// an exact split of `z^2`, `erfc` is within 5 ulp of the correctly rounded value plus `expf`'s
/// error (a C port measured 5.0 with a correctly rounded `expf`; GELU 6.5 and its derivative 5.4
/// for |x| <= 12.5, past which `Phi` is subnormal), at about half the instructions of `erfcf`.
static ERFCX: CudaHelper = CudaHelper {
    name: "erfcx_nonneg_f32",
    source: &[
        "// erfc(z) exp(z^2) for z >= 0 (z up to ~1e19: t stays finite), as t Q(t), t = 1 / (1 + z / 2).",
        "__device__ __forceinline__ float erfcx_nonneg_f32(float z) {",
        "  const float d = fmaf(0.5f, z, 1.0f);",
        "  const float r = __fdividef(1.0f, d);",
        "  const float t = fmaf(r, fmaf(-d, r, 1.0f), r);",
        "  return t * erfcx_fit_f32(t);",
        "}",
        "// exp(-(hi + lo)) for lo below hi's last place (hi + lo an exact square).",
        "__device__ __forceinline__ float exp_neg_split_f32(float hi, float lo) {",
        "  const float e = expf(-hi);",
        "  return fmaf(e, -lo, e);",
        "}",
    ],
    requires: &[&ERFCX_FIT],
};
static ERFC: CudaHelper = CudaHelper {
    name: "erfc_f32",
    source: &[
        "// erfc(x): erfcx(|x|) exp(-x^2), 2 minus that for negative x; 0 past 10.06 (below f32's",
        "// least subnormal) and 2 below -10.06.",
        "__device__ __forceinline__ float erfc_f32(float x) {",
        "  const float z = fminf(fabsf(x), 10.0625f);",
        "  const float hi = z * z;",
        "  const float e = erfcx_nonneg_f32(z) * exp_neg_split_f32(hi, fmaf(z, z, -hi));",
        "  return x != x ? x : (x < 0.0f ? 2.0f - e : e);",
        "}",
    ],
    requires: &[&ERFCX],
};
static NORMAL_CDF: CudaHelper = CudaHelper {
    name: "normal_cdf_f32",
    source: &[
        "// Phi(x), the standard normal CDF, and in *gauss exp(-x^2 / 2): Phi(-|x|) = erfc(|x| / sqrt 2) / 2",
        "// with the square taken from x itself (no rounding of x / sqrt 2 in the exponent), so the",
        "// tails keep their relative accuracy. |x| is held at 15, where exp(-x^2 / 2) is 0 in f32.",
        "__device__ __forceinline__ float normal_cdf_f32(float x, float* gauss) {",
        "  const float a = fminf(fabsf(x), 15.0f);",
        "  const float hi = a * a;",
        "  const float g = exp_neg_split_f32(0.5f * hi, 0.5f * fmaf(a, a, -hi));",
        "  *gauss = g;",
        "  const float tail = 0.5f * erfcx_nonneg_f32(a * 0.70710678f) * g;",
        "  return x >= 0.0f ? 1.0f - tail : tail;",
        "}",
    ],
    requires: &[&ERFCX],
};
static GELU_ERF: CudaHelper = CudaHelper {
    name: "gelu_erf_f32",
    source: &[
        "// x Phi(x). A kernel with the derivative too computes normal_cdf_f32 once for both.",
        "__device__ __forceinline__ float gelu_erf_f32(float x) {",
        "  float gauss;",
        "  return x * normal_cdf_f32(x, &gauss);",
        "}",
    ],
    requires: &[&NORMAL_CDF],
};
static GELU_ERF_GRAD: CudaHelper = CudaHelper {
    name: "gelu_erf_grad_f32",
    source: &[
        "// Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi), from one Gaussian.",
        "__device__ __forceinline__ float gelu_erf_grad_f32(float x) {",
        "  float gauss;",
        "  const float cdf = normal_cdf_f32(x, &gauss);",
        "  return fmaf(x, 0.39894228f * gauss, cdf);",
        "}",
    ],
    requires: &[&NORMAL_CDF],
};
/// `normal_cdf_f32` for values rounded to 16 bits: the same `erfcx` fit with the reciprocal
/// unrefined and `exp(-x^2 / 2)` from `__expf` (relative error about |x|^2 2^-24, 1.1e-5 at
/// |x| = 15), so the whole is within 2e-5 relative where the 16-bit result is normal: a tenth of
/// f16's half ulp and less of bf16's, at about two thirds of the instructions.
static NORMAL_CDF_NARROW: CudaHelper = CudaHelper {
    name: "normal_cdf_narrow_f32",
    source: &[
        "// Phi(x) and in *gauss exp(-x^2 / 2), for a result rounded to 16 bits (see normal_cdf_f32).",
        "__device__ __forceinline__ float normal_cdf_narrow_f32(float x, float* gauss) {",
        "  const float a = fminf(fabsf(x), 15.0f);",
        "  const float g = __expf(-0.5f * a * a);",
        "  *gauss = g;",
        "  const float z = a * 0.70710678f;",
        "  const float t = __fdividef(1.0f, fmaf(0.5f, z, 1.0f));",
        "  const float tail = 0.5f * t * erfcx_fit_f32(t) * g;",
        "  return x >= 0.0f ? 1.0f - tail : tail;",
        "}",
    ],
    requires: &[&ERFCX_FIT],
};
static GELU_ERF_NARROW: CudaHelper = CudaHelper {
    name: "gelu_erf_narrow_f32",
    source: &[
        "// x Phi(x) for a result rounded to 16 bits.",
        "__device__ __forceinline__ float gelu_erf_narrow_f32(float x) {",
        "  float gauss;",
        "  return x * normal_cdf_narrow_f32(x, &gauss);",
        "}",
    ],
    requires: &[&NORMAL_CDF_NARROW],
};
static GELU_ERF_GRAD_NARROW: CudaHelper = CudaHelper {
    name: "gelu_erf_grad_narrow_f32",
    source: &[
        "// Phi(x) + x phi(x) for a result rounded to 16 bits.",
        "__device__ __forceinline__ float gelu_erf_grad_narrow_f32(float x) {",
        "  float gauss;",
        "  const float cdf = normal_cdf_narrow_f32(x, &gauss);",
        "  return fmaf(x, 0.39894228f * gauss, cdf);",
        "}",
    ],
    requires: &[&NORMAL_CDF_NARROW],
};
static GELU_TANH: CudaHelper = CudaHelper {
    name: "gelu_tanh_f32",
    source: &[
        "// 0.5 x (1 + tanh(u)), as PyTorch computes it. u is rounded step by step as the derivative's ops",
        "// round it, so that a kernel computing both evaluates one tanh (the compiler merges the calls).",
        "__device__ __forceinline__ float gelu_tanh_f32(float x) {",
        "  const float u = __fmul_rn(0.7978846f, x + __fmul_rn(0.044715f, __fmul_rn(__fmul_rn(x, x), x)));",
        "  return __fmul_rn(0.5f, __fmul_rn(x, 1.0f + tanhf(u)));",
        "}",
    ],
    requires: &[],
};
static SILU: CudaHelper = CudaHelper {
    name: "silu_f32",
    source: &["__device__ __forceinline__ float silu_f32(float x) { return x / (1.0f + expf(-x)); }"],
    requires: &[],
};
static SIGMOID: CudaHelper = CudaHelper {
    name: "sigmoid_f32",
    source: &["__device__ __forceinline__ float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }"],
    requires: &[],
};
static SOFTPLUS: CudaHelper = CudaHelper {
    name: "softplus_f32",
    source: &[
        "// log(1 + exp(x)), and x itself above the threshold 20 (where they agree in f32).",
        "__device__ __forceinline__ float softplus_f32(float x) { return x > 20.0f ? x : log1pf(expf(x)); }",
    ],
    requires: &[],
};

/// `sqrt(2 / pi)` and the cubic coefficient of the tanh form of GELU.
const GELU_TANH_C: f64 = 0.797_884_560_802_865_4;
const GELU_TANH_A: f64 = 0.044_715;

fn gelu_tanh<R: Real>(x: R) -> R {
    let u = R::of(GELU_TANH_C) * (x + R::of(GELU_TANH_A) * x * x * x);
    let e = (R::of(-2.0) * u.abs()).exp();
    if u >= R::ZERO {
        x / (R::ONE + e)
    } else {
        x * e / (R::ONE + e)
    }
}

fn sigmoid<R: Real>(x: R) -> R {
    R::ONE / (R::ONE + (-x).exp())
}

// ---- derivative formulas --------------------------------------------------------------------

fn mul(d: &mut dyn DerivativeBuilder, a: DVal, b: DVal) -> DVal {
    d.binary(BinaryOp::Mul, a, b)
}

fn scaled(d: &mut dyn DerivativeBuilder, c: f64, x: DVal) -> DVal {
    let c = d.constant(c);
    mul(d, c, x)
}

/// `1 - v`.
fn one_minus(d: &mut dyn DerivativeBuilder, v: DVal) -> DVal {
    let one = d.constant(1.0);
    d.binary(BinaryOp::Sub, one, v)
}

/// `exp(-x^2 / 2)`, times `scale`.
fn gaussian(d: &mut dyn DerivativeBuilder, x: DVal, scale: f64) -> DVal {
    let xx = mul(d, x, x);
    let half = scaled(d, -0.5, xx);
    let e = d.unary(UnaryOp::Exp, half);
    scaled(d, scale, e)
}

/// `Phi(x) + x phi(x)`, GELU's derivative (`GeluErfGrad`'s semantics).
fn gelu_erf_grad<R: Real>(x: R) -> R {
    let cdf = R::of(0.5) * (x * R::of(-std::f64::consts::FRAC_1_SQRT_2)).erfc();
    let pdf =
        R::of(0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2) * (R::of(-0.5) * x * x).exp();
    cdf + x * pdf
}

fn d_gelu_erf_grad(d: &mut dyn DerivativeBuilder, x: DVal, _y: DVal) -> DVal {
    // d/dx (Phi + x phi) = 2 phi + x phi' = phi (2 - x^2).
    let pdf = gaussian(d, x, 0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2);
    let xx = mul(d, x, x);
    let two = d.constant(2.0);
    let factor = d.binary(BinaryOp::Sub, two, xx);
    mul(d, pdf, factor)
}

fn d_gelu_tanh(d: &mut dyn DerivativeBuilder, x: DVal, _y: DVal) -> DVal {
    // 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2), t = tanh(c (x + a x^3)).
    let xx = mul(d, x, x);
    let xxx = mul(d, xx, x);
    let cubic = scaled(d, GELU_TANH_A, xxx);
    let inner = d.binary(BinaryOp::Add, x, cubic);
    let u = scaled(d, GELU_TANH_C, inner);
    let t = d.unary(UnaryOp::Tanh, u);
    let one = d.constant(1.0);
    let one_plus_t = d.binary(BinaryOp::Add, one, t);
    let left = scaled(d, 0.5, one_plus_t);
    let tt = mul(d, t, t);
    let sech2 = one_minus(d, tt);
    let xx3a = scaled(d, 3.0 * GELU_TANH_A, xx);
    let one = d.constant(1.0);
    let du = d.binary(BinaryOp::Add, one, xx3a);
    let du = scaled(d, 0.5 * GELU_TANH_C, du);
    let right = mul(d, x, sech2);
    let right = mul(d, right, du);
    d.binary(BinaryOp::Add, left, right)
}

fn d_silu(d: &mut dyn DerivativeBuilder, x: DVal, _y: DVal) -> DVal {
    // s (1 + x (1 - s)), s = sigmoid(x).
    let s = d.unary(UnaryOp::Sigmoid, x);
    let one_minus_s = one_minus(d, s);
    let x_part = mul(d, x, one_minus_s);
    let one = d.constant(1.0);
    let sum = d.binary(BinaryOp::Add, one, x_part);
    mul(d, s, sum)
}

/// 1 where `x > 0`, else 0.
fn positive_indicator(d: &mut dyn DerivativeBuilder, x: DVal) -> DVal {
    let zero = d.constant(0.0);
    let one = d.constant(1.0);
    let positive = d.binary(BinaryOp::Gt, x, zero);
    d.select(positive, one, zero)
}

impl UnaryOp {
    /// The op's entry in the table.
    pub fn def(self) -> UnaryDef {
        use Accepts::{Any, Float, Numeric};
        use Exactness::{Approximate, CorrectlyRounded, Exact};
        use Yields::{Bool, Same};
        match self {
            UnaryOp::Neg => UnaryDef {
                name: "neg",
                accepts: Numeric,
                yields: Same,
                exactness: Exact,
                continuous: true,
                semantics: semantics!(F(x) => F(-x), I(x) => I(x.wrapping_neg())),
                cuda: |x, ty| match ty {
                    CType::Float => Some(CudaExpr::plain(format!("-{x}"))),
                    CType::I32 | CType::I64 => Some(CudaExpr::plain(wrapping_neg_c(x, ty))),
                    CType::Bool => None,
                },
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, _, _| d.constant(-1.0)),
            },
            UnaryOp::Abs => UnaryDef {
                name: "abs",
                accepts: Numeric,
                yields: Same,
                exactness: Exact,
                continuous: true,
                semantics: semantics!(F(x) => F(x.abs()), I(x) => I(x.wrapping_abs())),
                cuda: |x, ty| match ty {
                    CType::Float => Some(CudaExpr::call(&ABS_F32, &[x])),
                    CType::I32 | CType::I64 => {
                        Some(CudaExpr::plain(format!("{x} < 0 ? {} : {x}", wrapping_neg_c(x, ty))))
                    }
                    CType::Bool => None,
                },
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, x, _| d.unary(UnaryOp::Sign, x)),
            },
            UnaryOp::Exp => UnaryDef {
                name: "exp",
                accepts: Float,
                yields: Same,
                exactness: Approximate,
                continuous: true,
                semantics: semantics!(F(x) => F(x.exp())),
                cuda: libm_call!("expf"),
                narrow_cuda: None,
                derivative: Derivative::Formula(|_, _, y| y),
            },
            UnaryOp::Log => UnaryDef {
                name: "log",
                accepts: Float,
                yields: Same,
                exactness: Approximate,
                continuous: true,
                semantics: semantics!(F(x) => F(x.ln())),
                cuda: libm_call!("logf"),
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, x, _| d.unary(UnaryOp::Reciprocal, x)),
            },
            UnaryOp::Sqrt => UnaryDef {
                name: "sqrt",
                accepts: Float,
                yields: Same,
                exactness: CorrectlyRounded,
                continuous: true,
                semantics: semantics!(F(x) => F(x.sqrt())),
                cuda: libm_call!("sqrtf"),
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, _, y| {
                    let half = d.constant(0.5);
                    d.binary(BinaryOp::Div, half, y)
                }),
            },
            UnaryOp::Rsqrt => UnaryDef {
                name: "rsqrt",
                accepts: Float,
                yields: Same,
                // rsqrtf is about 2 ulp: well inside the f32 tolerance, and one instruction.
                exactness: Approximate,
                continuous: true,
                semantics: semantics!(F(x) => F(R::ONE / x.sqrt())),
                cuda: libm_call!("rsqrtf"),
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, _, y| {
                    let yy = mul(d, y, y);
                    let yyy = mul(d, yy, y);
                    scaled(d, -0.5, yyy)
                }),
            },
            UnaryOp::Reciprocal => UnaryDef {
                name: "reciprocal",
                accepts: Float,
                yields: Same,
                exactness: CorrectlyRounded,
                continuous: true,
                semantics: semantics!(F(x) => F(R::ONE / x)),
                cuda: |x, ty| float_only(x, ty, |x| CudaExpr::plain(format!("1.0f / {x}"))),
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, _, y| {
                    let yy = mul(d, y, y);
                    d.unary(UnaryOp::Neg, yy)
                }),
            },
            UnaryOp::Relu => UnaryDef {
                name: "relu",
                accepts: Numeric,
                yields: Same,
                exactness: Exact,
                continuous: true,
                semantics: semantics!(
                    F(x) => F(if x.is_nan() || x > R::ZERO { x } else { R::ZERO }),
                    I(x) => I(x.max(0)),
                ),
                cuda: |x, ty| match ty {
                    CType::Float => Some(CudaExpr::call(&RELU, &[x])),
                    CType::I32 | CType::I64 => Some(CudaExpr::plain(format!("{x} > 0 ? {x} : 0"))),
                    CType::Bool => None,
                },
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, x, _| positive_indicator(d, x)),
            },
            UnaryOp::GeluErf => UnaryDef {
                name: "gelu_erf",
                accepts: Float,
                yields: Same,
                exactness: Approximate,
                continuous: true,
                // erfc keeps its relative accuracy where 1 + erf would cancel (negative x).
                semantics: semantics!(F(x) => F(R::of(0.5) * x * (x * R::of(-std::f64::consts::FRAC_1_SQRT_2)).erfc())),
                cuda: helper_call!(GELU_ERF),
                narrow_cuda: Some(|x| CudaExpr::call(&GELU_ERF_NARROW, &[x])),
                derivative: Derivative::Formula(|d, x, _| d.unary(UnaryOp::GeluErfGrad, x)),
            },
            UnaryOp::GeluTanh => UnaryDef {
                name: "gelu_tanh",
                accepts: Float,
                yields: Same,
                exactness: Approximate,
                continuous: true,
                semantics: semantics!(F(x) => F(gelu_tanh(x))),
                cuda: helper_call!(GELU_TANH),
                narrow_cuda: None,
                derivative: Derivative::Formula(d_gelu_tanh),
            },
            UnaryOp::Silu => UnaryDef {
                name: "silu",
                accepts: Float,
                yields: Same,
                exactness: Approximate,
                continuous: true,
                semantics: semantics!(F(x) => F(x / (R::ONE + (-x).exp()))),
                cuda: helper_call!(SILU),
                narrow_cuda: None,
                derivative: Derivative::Formula(d_silu),
            },
            UnaryOp::Sigmoid => UnaryDef {
                name: "sigmoid",
                accepts: Float,
                yields: Same,
                exactness: Approximate,
                continuous: true,
                semantics: semantics!(F(x) => F(sigmoid(x))),
                cuda: helper_call!(SIGMOID),
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, _, y| {
                    let one_minus_y = one_minus(d, y);
                    mul(d, y, one_minus_y)
                }),
            },
            UnaryOp::Tanh => UnaryDef {
                name: "tanh",
                accepts: Float,
                yields: Same,
                exactness: Approximate,
                continuous: true,
                semantics: semantics!(F(x) => F(x.tanh())),
                cuda: libm_call!("tanhf"),
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, _, y| {
                    let yy = mul(d, y, y);
                    one_minus(d, yy)
                }),
            },
            UnaryOp::IsNan => UnaryDef {
                name: "isnan",
                accepts: Numeric,
                yields: Bool,
                exactness: Exact,
                continuous: false,
                semantics: semantics!(F(x) => B(x.is_nan()), I(_) => B(false)),
                cuda: |x, ty| match ty {
                    CType::Float => Some(CudaExpr::plain(format!("{x} != {x}"))),
                    CType::I32 | CType::I64 => Some(CudaExpr::plain("false".into())),
                    CType::Bool => None,
                },
                narrow_cuda: None,
                derivative: Derivative::NotDifferentiable,
            },
            UnaryOp::IsFinite => UnaryDef {
                name: "isfinite",
                accepts: Numeric,
                yields: Bool,
                exactness: Exact,
                continuous: false,
                semantics: semantics!(F(x) => B(x.is_finite()), I(_) => B(true)),
                cuda: |x, ty| match ty {
                    CType::Float => Some(CudaExpr::call(&IS_FINITE, &[x])),
                    CType::I32 | CType::I64 => Some(CudaExpr::plain("true".into())),
                    CType::Bool => None,
                },
                narrow_cuda: None,
                derivative: Derivative::NotDifferentiable,
            },
            UnaryOp::Not => UnaryDef {
                name: "not",
                accepts: Any,
                yields: Bool,
                exactness: Exact,
                continuous: false,
                semantics: semantics!(F(x) => B(x == R::ZERO), I(x) => B(x == 0), B(b) => B(!b)),
                cuda: |x, ty| {
                    Some(CudaExpr::plain(match ty {
                        CType::Float => format!("{x} == 0.0f"),
                        CType::I32 | CType::I64 => format!("{x} == 0"),
                        CType::Bool => format!("!{x}"),
                    }))
                },
                narrow_cuda: None,
                derivative: Derivative::NotDifferentiable,
            },
            UnaryOp::Erf => UnaryDef {
                name: "erf",
                accepts: Float,
                yields: Same,
                exactness: Approximate,
                continuous: true,
                semantics: semantics!(F(x) => F(x.erf())),
                cuda: libm_call!("erff"),
                // 2 / sqrt(pi) exp(-x^2).
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, x, _| {
                    let x2 = scaled(d, std::f64::consts::SQRT_2, x);
                    gaussian(d, x2, std::f64::consts::FRAC_2_SQRT_PI)
                }),
            },
            UnaryOp::Erfc => UnaryDef {
                name: "erfc",
                accepts: Float,
                yields: Same,
                exactness: Approximate,
                continuous: true,
                semantics: semantics!(F(x) => F(x.erfc())),
                cuda: helper_call!(ERFC),
                // -2 / sqrt(pi) exp(-x^2).
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, x, _| {
                    let x2 = scaled(d, std::f64::consts::SQRT_2, x);
                    gaussian(d, x2, -std::f64::consts::FRAC_2_SQRT_PI)
                }),
            },
            UnaryOp::GeluErfGrad => UnaryDef {
                name: "gelu_erf_grad",
                accepts: Float,
                yields: Same,
                exactness: Approximate,
                continuous: true,
                semantics: semantics!(F(x) => F(gelu_erf_grad(x))),
                cuda: helper_call!(GELU_ERF_GRAD),
                narrow_cuda: Some(|x| CudaExpr::call(&GELU_ERF_GRAD_NARROW, &[x])),
                derivative: Derivative::Formula(d_gelu_erf_grad),
            },
            UnaryOp::Log1p => UnaryDef {
                name: "log1p",
                accepts: Float,
                yields: Same,
                exactness: Approximate,
                continuous: true,
                semantics: semantics!(F(x) => F(x.ln_1p())),
                cuda: libm_call!("log1pf"),
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, x, _| {
                    let one = d.constant(1.0);
                    let one_plus_x = d.binary(BinaryOp::Add, one, x);
                    d.unary(UnaryOp::Reciprocal, one_plus_x)
                }),
            },
            UnaryOp::Expm1 => UnaryDef {
                name: "expm1",
                accepts: Float,
                yields: Same,
                exactness: Approximate,
                continuous: true,
                semantics: semantics!(F(x) => F(x.exp_m1())),
                cuda: libm_call!("expm1f"),
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, _, y| {
                    let one = d.constant(1.0);
                    d.binary(BinaryOp::Add, y, one)
                }),
            },
            UnaryOp::Sin => UnaryDef {
                name: "sin",
                accepts: Float,
                yields: Same,
                exactness: Approximate,
                continuous: true,
                semantics: semantics!(F(x) => F(x.sin())),
                cuda: libm_call!("sinf"),
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, x, _| d.unary(UnaryOp::Cos, x)),
            },
            UnaryOp::Cos => UnaryDef {
                name: "cos",
                accepts: Float,
                yields: Same,
                exactness: Approximate,
                continuous: true,
                semantics: semantics!(F(x) => F(x.cos())),
                cuda: libm_call!("cosf"),
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, x, _| {
                    let sin = d.unary(UnaryOp::Sin, x);
                    d.unary(UnaryOp::Neg, sin)
                }),
            },
            UnaryOp::Floor => UnaryDef {
                name: "floor",
                accepts: Numeric,
                yields: Same,
                exactness: Exact,
                continuous: false,
                semantics: semantics!(F(x) => F(x.floor()), I(x) => I(x)),
                cuda: |x, ty| integer_valued(x, ty, "floorf"),
                narrow_cuda: None,
                derivative: Derivative::Zero,
            },
            UnaryOp::Ceil => UnaryDef {
                name: "ceil",
                accepts: Numeric,
                yields: Same,
                exactness: Exact,
                continuous: false,
                semantics: semantics!(F(x) => F(x.ceil()), I(x) => I(x)),
                cuda: |x, ty| integer_valued(x, ty, "ceilf"),
                narrow_cuda: None,
                derivative: Derivative::Zero,
            },
            UnaryOp::Round => UnaryDef {
                name: "round",
                accepts: Numeric,
                yields: Same,
                exactness: Exact,
                continuous: false,
                semantics: semantics!(F(x) => F(x.round_even()), I(x) => I(x)),
                // rintf rounds halves to even in the default rounding mode.
                cuda: |x, ty| integer_valued(x, ty, "rintf"),
                narrow_cuda: None,
                derivative: Derivative::Zero,
            },
            UnaryOp::Sign => UnaryDef {
                name: "sign",
                accepts: Numeric,
                yields: Same,
                exactness: Exact,
                continuous: false,
                semantics: semantics!(
                    F(x) => F(if x > R::ZERO { R::ONE } else if x < R::ZERO { -R::ONE } else { x }),
                    I(x) => I(x.signum()),
                ),
                cuda: |x, ty| match ty {
                    CType::Float => Some(CudaExpr::plain(format!("{x} > 0.0f ? 1.0f : ({x} < 0.0f ? -1.0f : {x})"))),
                    CType::I32 | CType::I64 => {
                        Some(CudaExpr::plain(format!("({})(({x} > 0) - ({x} < 0))", ty.signed())))
                    }
                    CType::Bool => None,
                },
                narrow_cuda: None,
                derivative: Derivative::Zero,
            },
            UnaryOp::Softplus => UnaryDef {
                name: "softplus",
                accepts: Float,
                yields: Same,
                exactness: Approximate,
                continuous: true,
                semantics: semantics!(F(x) => F(if x > R::of(20.0) { x } else { x.exp().ln_1p() })),
                cuda: helper_call!(SOFTPLUS),
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, x, _| d.unary(UnaryOp::Sigmoid, x)),
            },
            UnaryOp::Square => UnaryDef {
                name: "square",
                accepts: Numeric,
                yields: Same,
                exactness: CorrectlyRounded,
                continuous: true,
                semantics: semantics!(F(x) => F(x * x), I(x) => I(x.wrapping_mul(x))),
                cuda: |x, ty| match ty {
                    // Not contracted into a following add (see `BinaryOp::Mul`).
                    CType::Float => Some(CudaExpr::plain(format!("__fmul_rn({x}, {x})"))),
                    CType::I32 | CType::I64 => {
                        let (t, u) = (ty.signed(), ty.unsigned());
                        Some(CudaExpr::plain(format!("({t})(({u}){x} * ({u}){x})")))
                    }
                    CType::Bool => None,
                },
                narrow_cuda: None,
                derivative: Derivative::Formula(|d, x, _| scaled(d, 2.0, x)),
            },
        }
    }

    /// The name in the IR text form.
    pub fn name(self) -> &'static str {
        self.def().name
    }

    pub fn result_dtype(self, input: crate::DType) -> crate::DType {
        self.def().yields.dtype(input)
    }

    /// The op on one element in f64 (the reference).
    pub fn eval_f64(self, x: Elem<f64>) -> Elem<f64> {
        (self.def().semantics.f64)(x)
    }

    /// The op on one element in f32 (as fused kernels compute it).
    pub fn eval_f32(self, x: Elem<f32>) -> Elem<f32> {
        (self.def().semantics.f32)(x)
    }
}

/// A float function whose results are integers; integers pass through.
fn integer_valued(x: &str, ty: CType, function: &str) -> Option<CudaExpr> {
    match ty {
        CType::Float => Some(CudaExpr::plain(format!("{function}({x})"))),
        CType::I32 | CType::I64 => Some(CudaExpr::plain(x.to_string())),
        CType::Bool => None,
    }
}
