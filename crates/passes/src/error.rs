//! The crate's one error type.

use braze_ir::IrError;
use braze_plan::PlanError;
use thiserror::Error;

/// Everything a pass or the fusion can reject.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PassError {
    /// The input graph (or a node a pass tried to build) failed the IR's typing rules.
    #[error(transparent)]
    Ir(#[from] IrError),
    /// A pass left a graph that no longer verifies: a bug in that pass, reported by its name.
    #[error("pass `{pass}` produced an invalid graph: {source}")]
    InvalidGraph { pass: &'static str, source: IrError },
    /// Fusion met a node in a form the earlier stages should have removed (a bug, not a user error).
    #[error("fusion cannot lower {node} ({op}): {detail}")]
    Lowering { node: String, op: String, detail: String },
    /// Fusion wrote a plan that breaks a rule of `braze_plan::Plan::validate` (a bug in fusion).
    #[error(transparent)]
    InvalidPlan(#[from] PlanError),
}

pub type Result<T> = std::result::Result<T, PassError>;
