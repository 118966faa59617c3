use braze_ir::IrError;
use braze_plan::PlanError;
use thiserror::Error;

/// Everything the CPU reference can reject: inputs that do not match the graph's signature, and
/// graphs or plans that fail their own checks.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CpuError {
    #[error("expected {expected} inputs, got {actual}")]
    Arity { expected: usize, actual: usize },
    #[error("input {index}: expected {expected}, got {actual}")]
    InputMismatch { index: usize, expected: String, actual: String },
    #[error(transparent)]
    Ir(#[from] IrError),
    /// An index of an `index_select` (or a plan's gather) outside `0..bound`.
    #[error("{op}: index {index} is out of range for a dimension of size {bound}")]
    IndexOutOfRange { op: String, index: i64, bound: usize },
    /// A plan that breaks a rule of [`braze_plan::Plan::validate`]; the message names the
    /// kernel and the rule.
    #[error(transparent)]
    InvalidPlan(#[from] PlanError),
}

pub type Result<T> = std::result::Result<T, CpuError>;
