//! Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), the
//! counter-based generator of cuRAND and PyTorch: the same counter and key give the same bits on
//! every backend, so the reference, the plan executor and the kernels draw one stream.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// The four output words for `counter` and `key` after ten rounds.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = u64::from(M0) * u64::from(c[0]);
        let p1 = u64::from(M1) * u64::from(c[2]);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The `philox` op on integers: the first word for counter `(lo, hi, 0, 0)` of `counter` and key
/// `(lo, hi)` of `key` (both as 64-bit patterns), in `0..2^32`.
pub fn philox_word(counter: i64, key: i64) -> i64 {
    let (c, k) = (counter as u64, key as u64);
    i64::from(philox4x32_10([c as u32, (c >> 32) as u32, 0, 0], [k as u32, (k >> 32) as u32])[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    // Known-answer vectors of the Random123 distribution (kat_vectors, philox4x32_10).
    #[test]
    fn known_answers() {
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
        assert_eq!(philox4x32_10([u32::MAX; 4], [u32::MAX; 2]), [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]);
        assert_eq!(
            philox4x32_10([0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344], [0xa409_3822, 0x299f_31d0]),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }
}
