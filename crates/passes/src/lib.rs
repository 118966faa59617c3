//! braze-passes: graph rewrites and fusion into a kernel [`Plan`].

pub mod memory;
pub mod plan;

pub use plan::*;
