use braze_ir::IrError;
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
    /// A plan that refers to something it does not define (a missing buffer, an operand out of
    /// range, a value of the wrong kind); the message names the kernel and the field.
    #[error("invalid plan: {0}")]
    InvalidPlan(String),
}

pub type Result<T> = std::result::Result<T, CpuError>;
