//! The crate's one error type. Every message names the op or argument, what was expected and
//! what came, and the caller's `file:line:col` where it is known, e.g.
//! `add at src/main.rs:12:17: cannot broadcast [3] with [4]`.
//!
//! Errors of the crates below (IR, passes, CPU, CUDA) are kept as their own types inside the
//! variants that wrap them, so callers can match on them; their text is part of the message.

use crate::{BreakKind, Device, GraphBreak};
use braze_cpu::CpuError;
use braze_ir::{DType, IrError, SourceLoc};
use braze_passes::PassError;
use std::fmt;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The operands of an op do not type-check (shape, dtype, axis, operand count).
    #[error("{}: {}", At(op, loc), ir_detail(ir))]
    Ir { op: String, loc: Option<SourceLoc>, ir: Box<IrError> },

    /// An argument the op cannot take (a value count that does not fill the shape, an empty
    /// tensor list, a repeated axis, ...).
    #[error("{}: {detail}", At(op, loc))]
    InvalidArgument { op: String, loc: Option<SourceLoc>, detail: String },

    #[error("{}: expected dtype {expected}, got {actual}", At(op, loc))]
    DTypeMismatch { op: String, loc: Option<SourceLoc>, expected: DType, actual: DType },

    #[error("{}: operands must be on one device: expected {expected}, got {actual}", At(op, loc))]
    DeviceMismatch { op: String, loc: Option<SourceLoc>, expected: Device, actual: Device },

    #[error(
        "{op}: CUDA device not available (asked for {device}): no NVIDIA driver or GPU was found; use Device::Cpu"
    )]
    DeviceUnavailable { op: String, device: Device },

    /// A graph break inside a function compiled with `fullgraph(true)`. Tracing stopped at it:
    /// nothing of the call ran.
    #[error("graph break in fullgraph mode: `{op}` at {loc} {} ({kind}); hint: {hint}", kind.description())]
    GraphBreak { kind: BreakKind, op: String, loc: SourceLoc, hint: &'static str },

    /// A host synchronization in eager code (or at a break of a lenient compiled call) while the
    /// sync debug mode is [`crate::SyncDebugMode::Error`]. The value was not read.
    #[error(
        "host synchronization in sync debug mode `error`: `{op}` at {loc} {} ({kind}); hint: {hint}",
        kind.description()
    )]
    HostSync { kind: BreakKind, op: String, loc: SourceLoc, hint: &'static str },

    /// A compiled function called with the wrong number of inputs.
    #[error("`{function}`: {}", arity_detail(*expected, *actual, names))]
    Arity { function: String, expected: usize, actual: usize, names: Vec<String> },

    /// A new input signature past the recompile limit, in fullgraph mode.
    #[error(
        "`{function}` reached its recompile limit of {limit} signatures; new signature {new_signature}, \
         cached: {}; raise it with recompile_limit(n) or keep input shapes fixed",
        signatures.join(", ")
    )]
    RecompileLimit { function: String, limit: usize, new_signature: String, signatures: Vec<String> },

    /// A tensor traced inside a compiled function, used after that call ended.
    #[error(
        "{}: this tensor was traced inside a compiled function whose call has ended; \
         return it from the function to use its value",
        At(op, loc)
    )]
    StaleTrace { op: String, loc: Option<SourceLoc> },

    /// The CPU reference executor rejected a graph or its inputs.
    #[error("{context}: {cpu}")]
    Cpu { context: String, cpu: Box<CpuError> },

    /// The CUDA runtime failed (compile, launch, transfer, cuBLASLt).
    #[error("{op}: {cuda}")]
    Cuda { op: String, cuda: Box<braze_cuda::CudaError> },

    /// Fusion rejected a graph (an internal invariant; the message names the pass).
    #[error("{context}: {passes}")]
    Compile { context: String, passes: Box<PassError> },

    /// A gradient that cannot be built (an integer input, a seed of the wrong shape).
    #[error("{}: {autodiff}", At(op, loc))]
    Gradient { op: String, loc: Option<SourceLoc>, autodiff: Box<braze_autodiff::AutodiffError> },

    /// An error raised by user code inside a custom op.
    #[error("{op}: {message}")]
    Custom { op: String, message: String },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error for a custom op's host function to return.
    pub fn custom(op: impl Into<String>, message: impl Into<String>) -> Error {
        Error::Custom { op: op.into(), message: message.into() }
    }

    pub(crate) fn ir(op: &str, loc: &SourceLoc, ir: IrError) -> Error {
        Error::Ir { op: op.to_string(), loc: Some(loc.clone()), ir: Box::new(ir) }
    }

    pub(crate) fn cuda(op: &str, cuda: braze_cuda::CudaError) -> Error {
        Error::Cuda { op: op.to_string(), cuda: Box::new(cuda) }
    }

    pub(crate) fn invalid(op: &str, loc: &SourceLoc, detail: impl Into<String>) -> Error {
        Error::InvalidArgument { op: op.to_string(), loc: Some(loc.clone()), detail: detail.into() }
    }
}

/// `op at file:line:col`, or just `op` when the location is unknown.
struct At<'a>(&'a String, &'a Option<SourceLoc>);

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            Some(loc) => write!(f, "{} at {loc}", self.0),
            None => f.write_str(self.0),
        }
    }
}

/// The IR message without its leading `op: ` (the frontend prints its own op name, which is the
/// method the user called, e.g. `maximum` rather than the IR's `max`).
fn ir_detail(ir: &IrError) -> String {
    let text = ir.to_string();
    let op = match ir {
        IrError::Arity { op, .. }
        | IrError::DTypeMismatch { op, .. }
        | IrError::ShapeMismatch { op, .. }
        | IrError::Broadcast { op, .. }
        | IrError::BadAxis { op, .. }
        | IrError::UnsupportedDType { op, .. } => op,
        _ => return text,
    };
    match text.strip_prefix(op.as_str()).and_then(|rest| rest.strip_prefix(": ")) {
        Some(detail) => detail.to_string(),
        None => text,
    }
}

fn arity_detail(expected: usize, actual: usize, names: &[String]) -> String {
    let mut text = format!("expected {expected} inputs");
    if !names.is_empty() {
        text.push_str(&format!(" ({})", names.join(", ")));
    }
    text.push_str(&format!(", got {actual}"));
    if actual < names.len() {
        text.push_str(&format!("; missing {}", names[actual..].join(", ")));
    }
    text
}

impl GraphBreak {
    /// The error a fullgraph trace stops with at this break.
    pub(crate) fn to_error(&self) -> Error {
        Error::GraphBreak { kind: self.kind, op: self.op.clone(), loc: self.loc.clone(), hint: self.hint }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fusion_errors_stay_typed_and_keep_their_message() {
        let invalid = braze_plan::PlanError::Invalid {
            rule: braze_plan::Rule::BufferIds,
            at: "kernel 0 (k0)".into(),
            detail: "reads b9".into(),
        };
        let err = Error::Compile { context: "fusion".into(), passes: Box::new(PassError::InvalidPlan(invalid)) };
        assert_eq!(err.to_string(), "fusion: invalid plan: kernel 0 (k0): reads b9 [BufferIds]");
        assert!(matches!(&err, Error::Compile { passes, .. } if matches!(**passes, PassError::InvalidPlan(_))));
    }
}
