//! Rounding an f64 to a narrower float in one correct step, as the reference stores values and
//! as codegen writes constants.

use half::{bf16, f16};

/// Rounds toward zero to f32 and marks inexact results by setting the lowest mantissa bit
/// ("round to odd"). Rounding that result once more to a format at least two bits narrower
/// gives the correctly rounded value, which rounding through a plain f32 would not.
pub fn f64_to_f32_round_to_odd(v: f64) -> f32 {
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
pub fn f64_to_f16(v: f64) -> f16 {
    f16::from_f32(f64_to_f32_round_to_odd(v))
}

/// f64 -> bf16, round to nearest even in one step (see [`f64_to_f16`]).
pub fn f64_to_bf16(v: f64) -> bf16 {
    bf16::from_f32(f64_to_f32_round_to_odd(v))
}

/// An integer as f32 rounded toward zero, the lowest bit set when inexact (round to odd), as
/// kernels convert integers to f16/bf16: rounding that once more rounds once from `x`.
pub fn i64_to_f32_round_to_odd(x: i64) -> f32 {
    let nearest = x as f32;
    let (back, exact) = (nearest as i128, x as i128);
    if back == exact {
        return nearest;
    }
    let mut bits = nearest.to_bits();
    if back.abs() > exact.abs() {
        // `nearest` rounded away from zero: step its magnitude back.
        bits -= 1;
    }
    f32::from_bits(bits | 1)
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
