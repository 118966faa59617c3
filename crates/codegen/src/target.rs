//! The GPU that launch configurations are chosen for, as data.
//!
//! Codegen never asks a device: `braze-cuda` builds a [`Target`] from the attributes of the GPU
//! it runs on, and everything that runs without one (tests, snapshots, `braze kernels` on a
//! machine without a GPU) says which target it assumes, normally [`Target::h200`].
//!
//! A target is codegen's input rather than the plan's: fusion does not depend on the GPU, only
//! the launch configurations and grids chosen for a plan's kernels do.

use std::fmt;

/// What codegen's configuration heuristics need to know about a GPU.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// The device's name, e.g. `NVIDIA H200`.
    pub name: String,
    /// `(major, minor)`, e.g. `(9, 0)` for Hopper; the NVRTC architecture is `sm_<major><minor>`.
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors: grids are sized to fill them.
    pub sm_count: u32,
    /// Most threads in one block.
    pub max_threads_per_block: u32,
    /// Most threads resident on one SM: a persistent grid has `sm_count * max_threads_per_sm /
    /// block` blocks.
    pub max_threads_per_sm: u32,
    /// Shared memory a block may use without opting in, in bytes. Today's kernels use a few KiB
    /// of static shared memory at most, well inside it.
    pub shared_memory_per_block: u32,
    /// Shared memory a block may opt in to (static plus dynamic), in bytes.
    pub shared_memory_per_block_optin: u32,
}

impl Target {
    /// An NVIDIA H200 (Hopper, sm_90, 132 SMs), the GPU braze is tuned and measured on: the
    /// target assumed wherever no GPU is present (tests, kernel snapshots, `braze kernels` and
    /// `braze explain` on the CPU backend).
    pub fn h200() -> Target {
        Target {
            name: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            sm_count: 132,
            max_threads_per_block: 1024,
            max_threads_per_sm: 2048,
            shared_memory_per_block: 48 * 1024,
            shared_memory_per_block_optin: 227 * 1024,
        }
    }

    /// The real architecture NVRTC compiles for, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }

    /// Blocks of `block` threads that the whole GPU holds at once (a persistent grid).
    pub fn resident_blocks(&self, block: u32) -> u32 {
        self.sm_count * (self.max_threads_per_sm / block.max(1))
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}, {} SMs)", self.name, self.arch(), self.sm_count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h200_is_hopper_with_132_sms() {
        let h200 = Target::h200();
        assert_eq!(h200.arch(), "sm_90");
        assert_eq!(h200.resident_blocks(256), 132 * 8);
        assert_eq!(h200.to_string(), "NVIDIA H200 (sm_90, 132 SMs)");
    }
}
