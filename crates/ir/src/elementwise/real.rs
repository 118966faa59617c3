//! The float type an elementwise op computes in: `f64` in the reference, `f32` in fused kernels.
//! Every op's scalar semantics is written once, generic over [`Real`], and so runs in both.

use std::fmt::Debug;
use std::ops::{Add, Div, Mul, Neg, Sub};

/// The arithmetic and math functions elementwise ops use. The `f32` functions are those a CUDA
/// kernel calls (`expf`, `erff`, ...), so the CPU plan executor computes as the kernels do.
pub trait Real:
    Copy
    + Debug
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    /// The nearest value of this type.
    fn of(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn is_nan(self) -> bool;
    fn is_finite(self) -> bool;
    fn is_sign_negative(self) -> bool;
    fn abs(self) -> Self;
    fn exp(self) -> Self;
    fn exp_m1(self) -> Self;
    fn ln(self) -> Self;
    fn ln_1p(self) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
    fn erf(self) -> Self;
    fn erfc(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn floor(self) -> Self;
    fn ceil(self) -> Self;
    /// Round half to even (as `rintf` and `torch.round`).
    fn round_even(self) -> Self;
    fn powf(self, e: Self) -> Self;
}

macro_rules! impl_real {
    ($t:ty, $erf:path, $erfc:path) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            fn of(v: f64) -> Self {
                v as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn is_finite(self) -> bool {
                <$t>::is_finite(self)
            }
            fn is_sign_negative(self) -> bool {
                <$t>::is_sign_negative(self)
            }
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn exp_m1(self) -> Self {
                <$t>::exp_m1(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn ln_1p(self) -> Self {
                <$t>::ln_1p(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            fn erf(self) -> Self {
                $erf(self)
            }
            fn erfc(self) -> Self {
                $erfc(self)
            }
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            fn floor(self) -> Self {
                <$t>::floor(self)
            }
            fn ceil(self) -> Self {
                <$t>::ceil(self)
            }
            fn round_even(self) -> Self {
                <$t>::round_ties_even(self)
            }
            fn powf(self, e: Self) -> Self {
                <$t>::powf(self, e)
            }
        }
    };
}

// libm's erf/erfc (musl's, about 1 ulp): the same on every platform.
impl_real!(f64, libm::erf, libm::erfc);
impl_real!(f32, libm::erff, libm::erfcf);

/// IEEE 754-2019 `maximum`: NaN if either is NaN, and +0 is above -0.
pub fn nan_max<R: Real>(a: R, b: R) -> R {
    if a.is_nan() || b.is_nan() {
        R::of(f64::NAN)
    } else if a > b || (a == b && b.is_sign_negative()) {
        a
    } else {
        b
    }
}

/// IEEE 754-2019 `minimum`: NaN if either is NaN, and -0 is below +0.
pub fn nan_min<R: Real>(a: R, b: R) -> R {
    if a.is_nan() || b.is_nan() {
        R::of(f64::NAN)
    } else if a < b || (a == b && a.is_sign_negative()) {
        a
    } else {
        b
    }
}
