//! The fuzzer's random numbers: braze-cpu's splitmix64, the one generator of reproducible test
//! data, so a seed gives the same graphs on every machine and with every `rand` version.
//!
//! The fuzzer's own copy drew `unit` as `(next >> 11) / 2^53` and `chance(p)` as
//! `(next >> 11) < p * 2^53`; `SplitMix64` computes `(next >> 11) * 2^-53` and compares it with
//! `p`. Scaling by a power of two is exact, so both give the same values and the same decisions,
//! and every documented seed still draws the graphs it drew.

pub use braze_cpu::SplitMix64 as Rng;
