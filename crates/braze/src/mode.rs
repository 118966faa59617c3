//! Compile modes: how hard the backend works for speed.

use std::fmt;

/// How hard the backend works for speed. The CPU reference runs every mode the same way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    #[default]
    Default,
    /// Fewer launches per call (CUDA graph replay) at the cost of pinned buffers.
    ReduceOverhead,
    /// Autotune kernel configurations on first compile.
    MaxAutotune,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Default => "default",
            Mode::ReduceOverhead => "reduce-overhead",
            Mode::MaxAutotune => "max-autotune",
        })
    }
}
