//! Reproducible random test data: a self-contained splitmix64 generator and Box-Muller normals
//! with platform-independent `libm` math, so a seed gives the same tensor on every machine.

use crate::scalar::ScalarExt;
use crate::scalar::{empty_data, push, Scalar};
use braze_ir::{DType, HostTensor, Shape};

/// splitmix64 (Steele, Lea and Flood): tiny, fast and well mixed, and the same stream on every
/// machine and with every `rand` version; good enough for test data, not for cryptography. The
/// one generator of reproducible test data in the project.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is below 2^-40 for any `n` under 2^24).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.next_unit() < p
    }

    /// One of `items` (not empty), uniformly: `items[self.below(items.len())]`.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// A pair of independent standard normals (Box-Muller).
    pub fn next_normal_pair(&mut self) -> (f64, f64) {
        let u1 = 1.0 - self.next_unit(); // in (0, 1], so the log is finite
        let u2 = self.next_unit();
        let radius = libm::sqrt(-2.0 * libm::log(u1));
        let angle = 2.0 * std::f64::consts::PI * u2;
        (radius * libm::cos(angle), radius * libm::sin(angle))
    }
}

/// A tensor of `dtype` and `shape` filled from `seed`: standard normals (rounded to the dtype)
/// for floats, integers uniform in [-8, 8], bools true with probability 1/2. A non-empty result
/// is never all zeros (element 0 becomes 1 if it would be), so tests cannot pass vacuously.
pub fn random_tensor(dtype: DType, shape: impl Into<Shape>, seed: u64) -> HostTensor {
    let shape = shape.into();
    let numel = shape.numel();
    let mut rng = SplitMix64::new(seed);
    let values: Vec<Scalar> = match dtype {
        DType::F32 | DType::F16 | DType::BF16 => {
            let mut values = Vec::with_capacity(numel + 1);
            while values.len() < numel {
                let (a, b) = rng.next_normal_pair();
                values.push(Scalar::Float(a));
                values.push(Scalar::Float(b));
            }
            values.truncate(numel);
            values
        }
        DType::I32 | DType::I64 => (0..numel).map(|_| Scalar::Int((rng.next_u64() % 17) as i64 - 8)).collect(),
        DType::Bool => (0..numel).map(|_| Scalar::Bool(rng.next_u64() >> 63 == 1)).collect(),
    };
    let mut data = empty_data(dtype, numel);
    for v in values {
        push(&mut data, v);
    }
    if numel > 0 && (0..numel).all(|i| Scalar::read(&data, i).to_f64() == 0.0) {
        let mut fixed = empty_data(dtype, numel);
        push(&mut fixed, Scalar::Int(1));
        for i in 1..numel {
            push(&mut fixed, Scalar::read(&data, i));
        }
        data = fixed;
    }
    HostTensor::new(shape, data).expect("one value per element")
}

/// Overwrites about 5% of a float tensor's elements with NaN, 2% with +Inf, 2% with -Inf and 5%
/// with zeros of either sign, chosen from `seed`; integer and bool tensors are left unchanged.
pub fn inject_specials(t: &mut HostTensor, seed: u64) {
    if !t.dtype().is_float() {
        return;
    }
    // A stream distinct from random_tensor's for the same seed.
    let mut rng = SplitMix64::new(seed ^ 0x5DEC_1A15_0F5E_ED00);
    let mut data = empty_data(t.dtype(), t.numel());
    for i in 0..t.numel() {
        let u = rng.next_unit();
        let negative_zero = rng.next_u64() >> 63 == 1;
        let value = if u < 0.05 {
            f64::NAN
        } else if u < 0.07 {
            f64::INFINITY
        } else if u < 0.09 {
            f64::NEG_INFINITY
        } else if u < 0.14 {
            if negative_zero {
                -0.0
            } else {
                0.0
            }
        } else {
            Scalar::read(t.data(), i).to_f64()
        };
        push(&mut data, Scalar::Float(value));
    }
    *t = HostTensor::new(t.shape().clone(), data).expect("same element count");
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    #[test]
    fn splitmix64_matches_the_reference_stream() {
        // The published test vector of splitmix64.c for seed 1234567.
        let mut rng = SplitMix64::new(1_234_567);
        let first: Vec<u64> = (0..5).map(|_| rng.next_u64()).collect();
        assert_eq!(
            first,
            [6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431, 16408922859458223821]
        );
    }

    #[test]
    fn derived_draws_stay_in_range() {
        let mut rng = SplitMix64::new(7);
        for _ in 0..10_000 {
            assert!((0.0..1.0).contains(&rng.next_unit()));
            assert!(rng.below(5) < 5);
        }
        let hits = (0..10_000).filter(|_| rng.chance(0.25)).count();
        assert!((2_200..2_800).contains(&hits), "{hits} of 10000 draws at p=0.25");
        let mut rng = SplitMix64::new(7);
        assert!(!(0..1000).any(|_| rng.chance(0.0)));
    }
}
