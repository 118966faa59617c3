//! What can go wrong when differentiating a graph.

use braze_ir::{DType, IrError};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum AutodiffError {
    #[error("no gradient for {node} ({op}): it is {dtype}, and only float values have gradients")]
    NotFloat { node: String, op: &'static str, dtype: DType },
    #[error("the gradient seeded into {value} must be {expected} or broadcast to it, got {actual}")]
    Seed { value: String, expected: String, actual: String },
    #[error("no gradient through `{op}` ({node}{}): it has no gradient rule (second-order gradients of attention are not supported)", at.as_ref().map(|loc| format!(" at {loc}")).unwrap_or_default())]
    NoRule { node: String, op: &'static str, at: Option<braze_ir::SourceLoc> },
    #[error("building the backward graph: {0}")]
    Ir(#[from] IrError),
}

pub type Result<T> = std::result::Result<T, AutodiffError>;
