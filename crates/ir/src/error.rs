use crate::{DType, Shape};
use thiserror::Error;

/// Errors from building, verifying or reading IR graphs. Messages name the op, the expected and
/// the actual value so a user can fix the call without reading the compiler.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum IrError {
    #[error("{op}: expected {expected} operand(s), got {actual}")]
    Arity { op: String, expected: String, actual: usize },
    #[error("{op}: operand {operand} has dtype {actual}, expected {expected}")]
    DTypeMismatch { op: String, operand: usize, expected: String, actual: DType },
    #[error("{op}: {detail}")]
    ShapeMismatch { op: String, detail: String },
    #[error("{op}: cannot broadcast {lhs} with {rhs}")]
    Broadcast { op: String, lhs: Shape, rhs: Shape },
    #[error("{op}: axis {axis} is out of range for a rank-{rank} tensor")]
    BadAxis { op: String, axis: i64, rank: usize },
    #[error("{op}: not defined for dtype {dtype}")]
    UnsupportedDType { op: String, dtype: DType },
    #[error("const: {value} is not a value of dtype {dtype}")]
    ConstantKind { value: String, dtype: DType },
    #[error("graph verification failed at {node}: {detail}")]
    Verify { node: String, detail: String },
    #[error("graph JSON: {0}")]
    Json(String),
    #[error("host tensor: {0}")]
    HostData(String),
}

pub type Result<T> = std::result::Result<T, IrError>;
