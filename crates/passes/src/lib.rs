//! braze-passes: graph rewrites and fusion into a kernel [`Plan`].
//!
//! In the order things run: [`optimize`] removes dead code, decomposes composites
//! ([`Decompose`]) and then simplifies ([`Simplify`]), merges common subexpressions
//! ([`CommonSubexpressions`]) and removes dead code ([`DeadCode`]) until nothing changes, then
//! gives the backward of a joint graph its own copies of cheap activations ([`Recompute`]) and full
//! reductions their own copies of elementwise values other kernels read too
//! ([`ReductionPrologues`]); [`fuse`]
//! groups the ops into kernels of a few families (pointwise, row reduction with prologue and
//! epilogue, multi-tensor reduction, matmul with epilogue, concat), then groups mutually
//! independent pointwise kernels into multi-pointwise kernels (one launch each), writes the
//! attention gradients a concat joins straight into its buffer (no concat kernel), and writes the
//! [`braze_plan::Plan`] that codegen and the executors consume. [`compile_to_plan`] does both.
//! The plan types, their validator, text and JSON forms and the memory plan live in `braze-plan`.
//!
//! **Invariant:** passes keep the graph valid (verified after every pass in debug builds); the
//! plans fusion writes pass `Plan::validate` (checked in debug builds), compute every graph value
//! in exactly one kernel and read each input buffer once per distinct view per kernel.
//!
//! Logging: `braze::graph` (the optimized IR, rewrites) and `braze::plan` (the plan at debug
//! level; fusion decisions and refused merges at trace level).

mod common_subexpressions;
mod dead_code;
mod decompose;
mod error;
mod fusion;
mod pass;
mod pipeline;
mod recompute;
mod reduction_prologues;
mod simplify;

pub use common_subexpressions::CommonSubexpressions;
pub use dead_code::DeadCode;
pub use decompose::Decompose;
pub use error::{PassError, Result};
pub use fusion::{compile_to_plan, compile_to_plan_timed, fuse, FusionOptions, PlanTimes};
pub use pass::{Pass, PassManager, PassSnapshot};
pub use pipeline::optimize;
pub use recompute::Recompute;
pub use reduction_prologues::ReductionPrologues;
pub use simplify::Simplify;
