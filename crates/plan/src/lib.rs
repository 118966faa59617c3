//! braze-plan: the plan contract between fusion, which writes plans, and every backend that runs
//! them (the CPU executor in `braze-cpu`, codegen in `braze-codegen`, the GPU executor in
//! `braze-cuda`).
//!
//! - [`Plan`] and its parts: buffers, kernels of six families (pointwise, row reduction,
//!   column reduction, multi-tensor reduction, matmul, concat, and multi-tensor pointwise:
//!   independent pointwise programs in one launch) and their SSA [`Body`] programs (`plan.rs`);
//! - the one validator, [`Plan::validate`], which checks every [`Rule`] of the contract, each
//!   documented on its variant (`validate.rs`; the multi-reduce family's in
//!   `validate_multi_reduce.rs`);
//! - the deterministic text form (`Display`, for review and snapshots) and the JSON form
//!   ([`Plan::to_json`], [`Plan::from_json`]);
//! - the memory plan: where each intermediate lives in one arena ([`MemoryPlan`]).
//!
//! **Invariant:** knows nothing of graphs' passes, devices or kernel source; a plan that
//! [`Plan::validate`] accepts runs on every backend without an out-of-bounds access or a type
//! confusion, and computes every value in exactly one kernel (attention gradients may write one
//! buffer's rows side by side, each its own columns: [`Plan::output_part`]).

mod error;
mod json;
pub mod memory;
mod plan;
pub mod saved;
mod text;
mod validate;
mod validate_multi_reduce;

pub use error::{PlanError, Result, Rule};
pub use memory::MemoryPlan;
pub use plan::*;
pub use saved::{saved_for_backward, SavedForBackward};
