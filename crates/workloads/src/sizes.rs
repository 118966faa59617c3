//! The `multisum` tensor sizes, drawn exactly as the PyTorch baseline (`benches/torch_baseline.py`)
//! draws them: after `torch.manual_seed(seed)`, `u = torch.rand(k, dtype=torch.float64)` and
//! `size = int(exp(log(lo) + (log(hi) - log(lo)) * u))`. PyTorch's CPU generator is a standard
//! MT19937 seeded with the seed's low 32 bits, and each float64 takes two 32-bit outputs
//! (`hi << 32 | lo`), keeps the low 53 bits and scales them by 2^-53.

/// The 32-bit Mersenne Twister, as `std::mt19937` and PyTorch's `at::mt19937`.
pub struct Mt19937 {
    state: [u32; 624],
    index: usize,
}

impl Mt19937 {
    pub fn new(seed: u64) -> Mt19937 {
        let mut state = [0u32; 624];
        // PyTorch keeps the low 32 bits of the 64-bit seed.
        state[0] = seed as u32;
        for i in 1..624 {
            state[i] = 1_812_433_253u32.wrapping_mul(state[i - 1] ^ (state[i - 1] >> 30)).wrapping_add(i as u32);
        }
        Mt19937 { state, index: 624 }
    }

    fn twist(&mut self) {
        for i in 0..624 {
            let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % 624] & 0x7fff_ffff);
            let mut next = self.state[(i + 397) % 624] ^ (y >> 1);
            if y & 1 != 0 {
                next ^= 0x9908_b0df;
            }
            self.state[i] = next;
        }
        self.index = 0;
    }

    pub fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// One value of `torch.rand(.., dtype=torch.float64)` on the CPU.
    pub fn next_f64(&mut self) -> f64 {
        let hi = self.next_u32() as u64;
        let lo = self.next_u32() as u64;
        let bits = ((hi << 32) | lo) & ((1u64 << 53) - 1);
        bits as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// `k` sizes log-uniform in `[lo, hi]` (`1 <= lo <= hi`), truncated toward zero (so `exp(ln lo)`
/// rounding below `lo` gives `lo - 1`): `multisum_sizes(k, lo, hi, seed)` of
/// `benches/torch_baseline.py`. Both use the platform's `log`/`exp` (glibc's on Linux).
pub fn multisum_sizes(k: usize, lo: usize, hi: usize, seed: u64) -> Vec<usize> {
    let mut rng = Mt19937::new(seed);
    let (log_lo, log_hi) = ((lo as f64).ln(), (hi as f64).ln());
    (0..k).map(|_| (log_lo + (log_hi - log_lo) * rng.next_f64()).exp() as usize).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_mersenne_twister() {
        // The C++ standard's check: the 10000th output of a default-seeded mt19937.
        let mut rng = Mt19937::new(5489);
        assert_eq!(rng.next_u32(), 3_499_211_612);
        let last = (1..10_000).map(|_| rng.next_u32()).last();
        assert_eq!(last, Some(4_123_659_995));
        // torch.manual_seed(0); torch.rand(1) is 0.4963: the low 24 bits of 2357136044.
        let mut rng = Mt19937::new(0);
        let first = rng.next_u32();
        assert_eq!(first, 2_357_136_044);
        assert!(((first & 0xff_ffff) as f64 / (1 << 24) as f64 - 0.4963).abs() < 1e-4);
    }

    #[test]
    fn sizes_equal_pytorchs() {
        // PyTorch 2.11 draws these at the two standard multisum sizes (`benches/workloads.md`).
        let sizes = multisum_sizes(2000, 1000, 300_000, 0);
        assert_eq!(sizes[..4], [252_894, 56_670, 13_738, 190_899]);
        assert_eq!(sizes.iter().sum::<usize>(), 103_888_580);
        assert!(sizes.iter().all(|&s| (1000..=300_000).contains(&s)));
        let sizes = multisum_sizes(10_000, 100, 10_000, 0);
        assert_eq!(sizes[..4], [8711, 2603, 829, 6942]);
        assert_eq!(sizes.iter().sum::<usize>(), 21_792_878);
        // Away from the standard sizes too (`torch_baseline.py --print-sizes K LO HI SEED`).
        let sizes = multisum_sizes(500, 100, 10_000, 7);
        assert_eq!(sizes[..4], [362, 352, 5298, 2057]);
        assert_eq!(sizes.iter().sum::<usize>(), 1_146_211);
        assert_eq!(multisum_sizes(4, 2, 32, 0), [29, 14, 7, 25]);
    }

    #[test]
    fn a_seed_gives_one_sequence() {
        let sizes = multisum_sizes(500, 100, 10_000, 7);
        assert_eq!(sizes, multisum_sizes(500, 100, 10_000, 7));
        assert_ne!(sizes, multisum_sizes(500, 100, 10_000, 8));
        assert!(sizes.iter().all(|&s| (100..=10_000).contains(&s)));
        // Log-uniform: about half below the geometric mean (1000).
        let below = sizes.iter().filter(|&&s| s < 1000).count();
        assert!((200..300).contains(&below), "{below}");
        // Truncated as Python's int() truncates: exp(ln 50) is 49.999..., so 49 (PyTorch's too).
        assert_eq!(multisum_sizes(3, 50, 50, 1), [49, 49, 49]);
        assert!(multisum_sizes(0, 1, 10, 1).is_empty());
    }
}
