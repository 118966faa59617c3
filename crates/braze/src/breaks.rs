//! Graph breaks: everything that needs a tensor's value on the host while a compiled function is
//! being traced (the tensor methods that cause them are in `host_reads.rs`).
//!
//! In fullgraph mode the first break is an [`crate::Error::GraphBreak`] and tracing stops there. In
//! lenient mode the graph recorded so far runs, its results become concrete, and tracing goes on
//! in a new graph: the function is split into graphs at its breaks and gives the eager result.
//! Inside a compiled function every host read is a break, also of a concrete tensor (a captured
//! weight), because a value read on the host would otherwise be baked into the cached graph.

use braze_ir::SourceLoc;
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakKind {
    /// `to_vec` or `item`: a value read on the host.
    HostRead,
    /// `to_bool`: a tensor turned into a Rust `bool`, typically in an `if`.
    BoolCoercion,
    /// `to_host` or `to_device(Device::Cpu)` of a traced tensor.
    CopyToCpu,
    /// A [`crate::CustomOp`] that runs host code.
    OpaqueHostFn,
    /// An op whose output shape depends on tensor values (`nonzero`).
    DataDependentShape,
    /// `backward()` whose gradients flow on into values computed outside the current graph (by
    /// a piece before an earlier break, or eagerly before the call): those run their own
    /// compiled backwards, which need this graph's gradients first.
    BackwardAcrossBreak,
}

impl BreakKind {
    pub fn name(self) -> &'static str {
        match self {
            BreakKind::HostRead => "host_read",
            BreakKind::BoolCoercion => "bool_coercion",
            BreakKind::CopyToCpu => "copy_to_cpu",
            BreakKind::OpaqueHostFn => "opaque_host_fn",
            BreakKind::DataDependentShape => "data_dependent_shape",
            BreakKind::BackwardAcrossBreak => "backward_across_break",
        }
    }

    /// What the op does that the compiler cannot trace through.
    pub fn description(self) -> &'static str {
        match self {
            BreakKind::HostRead => "reads a tensor value on the host",
            BreakKind::BoolCoercion => "turns a tensor into a Rust bool",
            BreakKind::CopyToCpu => "copies a traced tensor to the CPU",
            BreakKind::OpaqueHostFn => "runs a host function the compiler cannot see into",
            BreakKind::DataDependentShape => "has an output shape that depends on tensor values",
            BreakKind::BackwardAcrossBreak => "sends gradients into values computed outside this graph",
        }
    }

    /// One line on how to avoid the break.
    pub fn hint(self) -> &'static str {
        match self {
            BreakKind::HostRead => "keep the metric on the device and read it every N steps",
            BreakKind::BoolCoercion => "use where_() to keep the branch on the device, or check every N steps",
            BreakKind::CopyToCpu => "return the tensor from the compiled function and copy it after the call",
            BreakKind::OpaqueHostFn => "give the op a traceable implementation with CustomOp::traceable",
            BreakKind::DataDependentShape => "use a fixed-shape form (a mask with where_()) instead",
            BreakKind::BackwardAcrossBreak => {
                "call backward() after the compiled function returns, or move the earlier break after it"
            }
        }
    }
}

impl fmt::Display for BreakKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One break: its kind, the op, where the user's code called it, and a hint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphBreak {
    pub kind: BreakKind,
    pub op: String,
    pub loc: SourceLoc,
    pub hint: &'static str,
}

impl GraphBreak {
    pub(crate) fn new(kind: BreakKind, op: &str, loc: SourceLoc) -> GraphBreak {
        GraphBreak { kind, op: op.to_string(), loc, hint: kind.hint() }
    }
}

/// `host_read at src/main.rs:12:17: keep the metric on the device and read it every N steps (item)`
impl fmt::Display for GraphBreak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}: {} ({})", self.kind, self.loc, self.hint, self.op)
    }
}
