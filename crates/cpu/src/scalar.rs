//! One element at a time: reading and writing host data, rounding to a dtype, and the reference
//! semantics of every elementwise op on f64 floats, i64 integers and bools.

use braze_ir::{BinaryOp, DType, HostData, UnaryOp};
use half::{bf16, f16};

/// An element widened to its computing type: floats in f64, integers in i64.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Scalar {
    Float(f64),
    Int(i64),
    Bool(bool),
}

impl Scalar {
    /// The element at flat offset `i` of `data`, widened without loss.
    pub(crate) fn read(data: &HostData, i: usize) -> Scalar {
        match data {
            HostData::F32(v) => Scalar::Float(v[i] as f64),
            HostData::F16(v) => Scalar::Float(v[i].to_f64()),
            HostData::BF16(v) => Scalar::Float(v[i].to_f64()),
            HostData::I32(v) => Scalar::Int(v[i] as i64),
            HostData::I64(v) => Scalar::Int(v[i]),
            HostData::Bool(v) => Scalar::Bool(v[i]),
        }
    }

    /// The value as a float (bool as 0/1); the caller knows it is numeric.
    pub(crate) fn as_f64(self) -> f64 {
        match self {
            Scalar::Float(x) => x,
            Scalar::Int(x) => x as f64,
            Scalar::Bool(b) => b as u8 as f64,
        }
    }

    fn as_bool(self) -> bool {
        match self {
            Scalar::Float(x) => x != 0.0,
            Scalar::Int(x) => x != 0,
            Scalar::Bool(b) => b,
        }
    }
}

/// Empty storage of `dtype` with room for `capacity` elements.
pub(crate) fn empty_data(dtype: DType, capacity: usize) -> HostData {
    match dtype {
        DType::F32 => HostData::F32(Vec::with_capacity(capacity)),
        DType::F16 => HostData::F16(Vec::with_capacity(capacity)),
        DType::BF16 => HostData::BF16(Vec::with_capacity(capacity)),
        DType::I32 => HostData::I32(Vec::with_capacity(capacity)),
        DType::I64 => HostData::I64(Vec::with_capacity(capacity)),
        DType::Bool => HostData::Bool(Vec::with_capacity(capacity)),
    }
}

/// Appends `value` converted to the storage's dtype with cast semantics: floats round to nearest
/// even, float -> int truncates toward zero and saturates (NaN -> 0), int -> int wraps,
/// anything -> bool is `!= 0`, bool -> number is 0/1.
pub(crate) fn push(data: &mut HostData, value: Scalar) {
    match (data, value) {
        (HostData::F32(v), Scalar::Int(x)) => v.push(x as f32),
        (HostData::F32(v), s) => v.push(s.as_f64() as f32),
        (HostData::F16(v), s) => v.push(f64_to_f16(s.as_f64())),
        (HostData::BF16(v), s) => v.push(f64_to_bf16(s.as_f64())),
        (HostData::I32(v), Scalar::Float(x)) => v.push(x as i32),
        (HostData::I32(v), Scalar::Int(x)) => v.push(x as i32),
        (HostData::I32(v), Scalar::Bool(b)) => v.push(b as i32),
        (HostData::I64(v), Scalar::Float(x)) => v.push(x as i64),
        (HostData::I64(v), Scalar::Int(x)) => v.push(x),
        (HostData::I64(v), Scalar::Bool(b)) => v.push(b as i64),
        (HostData::Bool(v), s) => v.push(s.as_bool()),
    }
}

/// Rounds toward zero to f32 and marks inexact results by setting the lowest mantissa bit
/// ("round to odd"). Rounding that result once more to a format at least two bits narrower
/// gives the correctly rounded value, which rounding through a plain f32 would not.
fn f64_to_f32_round_to_odd(v: f64) -> f32 {
    let nearest = v as f32;
    if nearest.is_nan() || nearest as f64 == v {
        return nearest;
    }
    let mut bits = nearest.to_bits();
    if (nearest as f64).abs() > v.abs() {
        // `nearest` rounded away from zero (possibly to infinity): step its magnitude back.
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// f64 -> f16, round to nearest even in one step. `half`'s own `from_f64` drops the low 32 bits
/// of the f64 first, which misrounds values just above a tie.
pub(crate) fn f64_to_f16(v: f64) -> f16 {
    f16::from_f32(f64_to_f32_round_to_odd(v))
}

/// f64 -> bf16, round to nearest even in one step (see [`f64_to_f16`]).
pub(crate) fn f64_to_bf16(v: f64) -> bf16 {
    bf16::from_f32(f64_to_f32_round_to_odd(v))
}

/// IEEE 754-2019 `maximum`: NaN if either is NaN, and +0 is above -0.
pub(crate) fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a > b || (a == b && b.is_sign_negative()) {
        a
    } else {
        b
    }
}

/// IEEE 754-2019 `minimum`: NaN if either is NaN, and -0 is below +0.
pub(crate) fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a < b || (a == b && a.is_sign_negative()) {
        a
    } else {
        b
    }
}

/// `0.5 x (1 + erf(x / sqrt 2))`, computed as `0.5 x erfc(-x / sqrt 2)`: `1 + erf` cancels for
/// negative `x` (to 0 below about -8), `erfc` keeps its relative accuracy.
pub(crate) fn gelu_erf(x: f64) -> f64 {
    0.5 * x * libm::erfc(-x / std::f64::consts::SQRT_2)
}

/// `0.5 x (1 + tanh(u))` with `u = sqrt(2/pi) (x + 0.044715 x^3)`, computed as the equal
/// `x / (1 + exp(-2u))`, which does not cancel for negative `x`.
pub(crate) fn gelu_tanh(x: f64) -> f64 {
    let sqrt_2_over_pi = std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2;
    let u = sqrt_2_over_pi * (x + 0.044715 * x * x * x);
    x / (1.0 + (-2.0 * u).exp())
}

/// A unary op on a float computed in f64.
pub(crate) fn unary_float(op: UnaryOp, x: f64) -> Scalar {
    let y = match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Reciprocal => 1.0 / x,
        UnaryOp::Relu => {
            if x.is_nan() || x > 0.0 {
                x
            } else {
                0.0
            }
        }
        UnaryOp::GeluErf => gelu_erf(x),
        UnaryOp::GeluTanh => gelu_tanh(x),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::IsNan => return Scalar::Bool(x.is_nan()),
        UnaryOp::IsFinite => return Scalar::Bool(x.is_finite()),
        UnaryOp::Not => return Scalar::Bool(x == 0.0),
    };
    Scalar::Float(y)
}

/// A unary op on any element; results are in the computing type, rounded later by [`push`].
pub(crate) fn unary(op: UnaryOp, x: Scalar) -> Scalar {
    match x {
        Scalar::Float(x) => unary_float(op, x),
        Scalar::Int(x) => match op {
            UnaryOp::Neg => Scalar::Int(x.wrapping_neg()),
            UnaryOp::Abs => Scalar::Int(x.wrapping_abs()),
            UnaryOp::Relu => Scalar::Int(x.max(0)),
            UnaryOp::IsNan => Scalar::Bool(false),
            UnaryOp::IsFinite => Scalar::Bool(true),
            UnaryOp::Not => Scalar::Bool(x == 0),
            // The type checker only lets float inputs reach the transcendental ops.
            _ => unreachable!("{} on an integer passed type checking", op.name()),
        },
        Scalar::Bool(b) => match op {
            UnaryOp::Not => Scalar::Bool(!b),
            _ => unreachable!("{} on a bool passed type checking", op.name()),
        },
    }
}

/// Comparison result of two ordered values; IEEE for floats (any NaN compares false except `ne`).
fn compare<T: PartialOrd>(op: BinaryOp, a: T, b: T) -> bool {
    match op {
        BinaryOp::Eq => a == b,
        BinaryOp::Ne => a != b,
        BinaryOp::Lt => a < b,
        BinaryOp::Le => a <= b,
        BinaryOp::Gt => a > b,
        BinaryOp::Ge => a >= b,
        _ => unreachable!("{} is not a comparison", op.name()),
    }
}

/// A binary op on two floats computed in f64.
pub(crate) fn binary_float(op: BinaryOp, a: f64, b: f64) -> Scalar {
    let y = match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Max => nan_max(a, b),
        BinaryOp::Min => nan_min(a, b),
        BinaryOp::Pow => a.powf(b),
        BinaryOp::And | BinaryOp::Or => unreachable!("{} on floats passed type checking", op.name()),
        _ => return Scalar::Bool(compare(op, a, b)),
    };
    Scalar::Float(y)
}

/// A binary op on two integers computed in i64 (wrapping); `x / 0 == 0`, division truncates.
pub(crate) fn binary_int(op: BinaryOp, a: i64, b: i64) -> Scalar {
    let y = match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div => {
            if b == 0 {
                0
            } else {
                a.wrapping_div(b)
            }
        }
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
        BinaryOp::Pow | BinaryOp::And | BinaryOp::Or => {
            unreachable!("{} on integers passed type checking", op.name())
        }
        _ => return Scalar::Bool(compare(op, a, b)),
    };
    Scalar::Int(y)
}

/// A binary op on two elements of one computing type.
pub(crate) fn binary(op: BinaryOp, a: Scalar, b: Scalar) -> Scalar {
    match (a, b) {
        (Scalar::Float(a), Scalar::Float(b)) => binary_float(op, a, b),
        (Scalar::Int(a), Scalar::Int(b)) => binary_int(op, a, b),
        (Scalar::Bool(a), Scalar::Bool(b)) => match op {
            BinaryOp::And => Scalar::Bool(a && b),
            BinaryOp::Or => Scalar::Bool(a || b),
            _ if op.is_comparison() => Scalar::Bool(compare(op, a, b)),
            _ => unreachable!("{} on bools passed type checking", op.name()),
        },
        _ => unreachable!("{} operands of different dtypes passed type checking", op.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrowing_is_one_correct_rounding() {
        // Just above a tie only because of a bit in the f64's low 32 bits.
        let above_tie = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
        assert_eq!(f64_to_bf16(above_tie), bf16::from_f64(1.0 + 2f64.powi(-7)));
        assert_eq!(bf16::from_f64(above_tie), bf16::ONE, "half truncates first (why we round ourselves)");
        assert_eq!(f64_to_f16(1.0 + 2f64.powi(-11) + 2f64.powi(-40)), f16::from_f64(1.0 + 2f64.powi(-10)));
        assert_eq!(f64_to_bf16(1.0 + 2f64.powi(-8)), bf16::ONE);
        assert_eq!(f64_to_bf16(-1e300), bf16::NEG_INFINITY);
        assert_eq!(f64_to_f16(1e-30), f16::ZERO);
        assert_eq!(f64_to_f16(-1e-30).to_bits(), f16::NEG_ZERO.to_bits());
        assert_eq!(f64_to_bf16(1e-39).to_f64(), bf16::from_f32(1e-39).to_f64());
        assert!(f64_to_f16(f64::NAN).is_nan());
    }
}
