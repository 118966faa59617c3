//! Tensor methods that read values on the host (`to_vec`, `item`, `to_bool`, `to_host`,
//! `to_device`, `nonzero`): inside a compiled function each one is a graph break, in eager code a
//! host synchronization (`sync_debug.rs`).

use crate::tensor::caller;
use crate::{trace, BreakKind, Device, Element, Error, Result, Tensor};
use braze_ir::{HostData, HostTensor, SourceLoc};

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
        // A copy to the CPU waits for the device. A CPU tensor counts too: the same code waits
        // there on a GPU.
        let _sync = (device == Device::Cpu)
            .then(|| crate::sync_debug::sync_point(BreakKind::CopyToCpu, "to_device", &loc))
            .transpose()?;
        if device == self.device() {
            return Ok(self.clone());
        }
        let host = self
            .read_host("to_device")?
            .ok_or_else(|| Error::StaleTrace { op: "to_device".into(), loc: Some(loc.clone()) })?;
        match device {
            Device::Cpu => Ok(Tensor::from_host((*host).clone())),
            Device::Cuda(ordinal) => {
                let bytes = host.numel() * host.dtype().size_bytes();
                crate::prefetch::report_pageable_copy(bytes, &loc);
                let _copy = crate::timeline::host_span(
                    "copy",
                    || "pageable host-to-device copy".into(),
                    Some(format!("{bytes} B at {loc}")),
                );
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
