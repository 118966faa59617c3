//! Graph breaks: everything that needs a tensor's value on the host while a compiled function is
//! being traced, and the tensor methods that cause them.
//!
//! In fullgraph mode the first break is an [`Error::GraphBreak`] and tracing stops there. In
//! lenient mode the graph recorded so far runs, its results become concrete, and tracing goes on
//! in a new graph: the function is split into graphs at its breaks and gives the eager result.
//! Inside a compiled function every host read is a break, also of a concrete tensor (a captured
//! weight), because a value read on the host would otherwise be baked into the cached graph.

use crate::tensor::caller;
use crate::{trace, Device, Element, Error, Result, Tensor};
use braze_ir::{HostData, HostTensor, SourceLoc};
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
}

impl BreakKind {
    pub fn name(self) -> &'static str {
        match self {
            BreakKind::HostRead => "host_read",
            BreakKind::BoolCoercion => "bool_coercion",
            BreakKind::CopyToCpu => "copy_to_cpu",
            BreakKind::OpaqueHostFn => "opaque_host_fn",
            BreakKind::DataDependentShape => "data_dependent_shape",
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

    pub(crate) fn to_error(&self) -> Error {
        Error::GraphBreak { kind: self.kind, op: self.op.clone(), loc: self.loc.clone(), hint: self.hint }
    }
}

/// `host_read at src/main.rs:12:17: keep the metric on the device and read it every N steps (item)`
impl fmt::Display for GraphBreak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}: {} ({})", self.kind, self.loc, self.hint, self.op)
    }
}

impl Tensor {
    /// All elements in row-major order. `T` must be the tensor's dtype (`f64` reads f32).
    /// Inside a compiled function this is a [`BreakKind::HostRead`].
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let loc = caller();
        self.read_as::<T>("to_vec", BreakKind::HostRead, loc)
    }

    /// The value of a tensor with exactly one element. A [`BreakKind::HostRead`] inside a
    /// compiled function.
    #[track_caller]
    pub fn item<T: Element>(&self) -> Result<T> {
        let loc = caller();
        self.check_one_element("item", &loc)?;
        let values = self.read_as::<T>("item", BreakKind::HostRead, loc.clone())?;
        values.first().copied().ok_or_else(|| Error::invalid("item", &loc, "the tensor is empty"))
    }

    /// A one-element tensor as a Rust `bool` (non-zero is true, NaN is true), e.g.
    /// `if loss.any_nan()?.to_bool()? { .. }`. A [`BreakKind::BoolCoercion`] inside a compiled
    /// function.
    #[track_caller]
    pub fn to_bool(&self) -> Result<bool> {
        let loc = caller();
        self.check_one_element("to_bool", &loc)?;
        let host = trace::host_value(self, BreakKind::BoolCoercion, "to_bool", loc.clone())?;
        if host.numel() != 1 {
            return Err(Error::invalid("to_bool", &loc, format!("expected one element, got shape {}", host.shape())));
        }
        Ok(host.get_f64(0) != 0.0)
    }

    /// A copy of the data in host memory. A [`BreakKind::CopyToCpu`] inside a compiled function.
    #[track_caller]
    pub fn to_host(&self) -> Result<HostTensor> {
        let loc = caller();
        let host = trace::host_value(self, BreakKind::CopyToCpu, "to_host", loc)?;
        Ok((*host).clone())
    }

    /// This tensor on `device` (itself when it is there already). Moving a traced tensor to the
    /// CPU is a [`BreakKind::CopyToCpu`].
    #[track_caller]
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        let loc = caller();
        device.check_available("to_device")?;
        if self.is_traced() {
            // A copy to the CPU needs the value on the host whatever the trace's device, so code
            // developed on the CPU backend shows the same breaks it will have on a GPU.
            if device == self.device() && device != Device::Cpu {
                return Ok(self.clone());
            }
            if device != Device::Cpu {
                return Err(Error::invalid(
                    "to_device",
                    &loc,
                    format!(
                        "a traced tensor on {} cannot move to {device} inside a compiled function; move the \
                         inputs before the call",
                        self.device()
                    ),
                ));
            }
            let host = trace::host_value(self, BreakKind::CopyToCpu, "to_device", loc)?;
            return Ok(Tensor::from_host((*host).clone()));
        }
        if device == self.device() {
            return Ok(self.clone());
        }
        let host = self
            .read_host("to_device")?
            .ok_or_else(|| Error::StaleTrace { op: "to_device".into(), loc: Some(loc.clone()) })?;
        match device {
            Device::Cpu => Ok(Tensor::from_host((*host).clone())),
            Device::Cuda(ordinal) => {
                Ok(Tensor::from_cuda(crate::cuda::CudaTensor::upload(&host, ordinal, "to_device")?))
            }
        }
    }

    /// The indices of the non-zero elements (NaN counts as non-zero) as an i64 tensor of shape
    /// `[count, rank]`. Its shape depends on the data: a [`BreakKind::DataDependentShape`] inside a
    /// compiled function.
    #[track_caller]
    pub fn nonzero(&self) -> Result<Tensor> {
        let loc = caller();
        let host = trace::host_value(self, BreakKind::DataDependentShape, "nonzero", loc.clone())?;
        let shape = host.shape();
        let strides = shape.strides();
        let mut indices: Vec<i64> = Vec::new();
        let mut count = 0;
        for flat in 0..host.numel() {
            if host.get_f64(flat) != 0.0 {
                count += 1;
                indices.extend(shape.dims().iter().zip(&strides).map(|(&dim, &stride)| ((flat / stride) % dim) as i64));
            }
        }
        let result = HostTensor::new([count, shape.rank()], HostData::I64(indices))
            .map_err(|ir| Error::ir("nonzero", &loc, ir))?;
        Ok(Tensor::from_host(result))
    }

    fn read_as<T: Element>(&self, op: &str, kind: BreakKind, loc: SourceLoc) -> Result<Vec<T>> {
        let dtype = self.dtype();
        if dtype != T::DTYPE {
            // The element type asked for is the expectation: `to_vec::<i32>()` of an f32 tensor
            // says "expected dtype i32, got f32".
            return Err(Error::DTypeMismatch { op: op.to_string(), loc: Some(loc), expected: T::DTYPE, actual: dtype });
        }
        let host = trace::host_value(self, kind, op, loc.clone())?;
        T::from_data(host.data()).ok_or_else(|| Error::DTypeMismatch {
            op: op.to_string(),
            loc: Some(loc),
            expected: T::DTYPE,
            actual: host.dtype(),
        })
    }

    fn check_one_element(&self, op: &str, loc: &SourceLoc) -> Result<()> {
        let shape = self.shape();
        if shape.numel() == 1 {
            Ok(())
        } else {
            Err(Error::invalid(op, loc, format!("expected a tensor with exactly one element, got shape {shape}")))
        }
    }
}
