//! Tensors filled with one value (`full`, `zeros`, `ones`): a recorded constant inside a trace,
//! host or device data outside; `arange`: a recorded arange op inside a trace (computed in its
//! kernel, no graph input), host or device data outside.

use crate::tensor::caller;
use crate::{trace, Device, Error, Result, Tensor};
use braze_ir::HostTensor;
use braze_ir::{DType, Shape, SourceLoc};

impl Tensor {
    /// A tensor of `shape` filled with `value`. Inside a compiled function this records a
    /// constant broadcast to `shape` (no graph input).
    #[track_caller]
    pub fn full(shape: impl Into<Shape>, value: f64, dtype: DType, device: Device) -> Result<Tensor> {
        trace::full("full", shape.into(), value, dtype, device, caller())
    }

    #[track_caller]
    pub fn zeros(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        trace::full("zeros", shape.into(), 0.0, dtype, device, caller())
    }

    #[track_caller]
    pub fn ones(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        trace::full("ones", shape.into(), 1.0, dtype, device, caller())
    }

    /// `[0, 1, .., n - 1]` as a rank-1 tensor of `dtype` (a number or float; f16/bf16 round the
    /// values past their integer range as a cast would). Inside a compiled function this records
    /// an arange op: the kernel that reads it computes the values, nothing is uploaded.
    #[track_caller]
    pub fn arange(n: usize, dtype: DType, device: Device) -> Result<Tensor> {
        let loc = caller();
        check_arange(n, dtype, &loc)?;
        device.check_available("arange")?;
        if trace::is_active() {
            return trace::apply("arange", &[], loc, |b, _| b.arange(n, dtype));
        }
        Tensor::arange_data(n, dtype, device, &loc)
    }

    /// [`Tensor::arange`] as data even inside a compiled function, where it is captured as a
    /// graph input: for the ops that read it from a kernel family other than pointwise (which
    /// would compute an arange op in a pointwise kernel of its own and store it).
    pub(crate) fn arange_data(n: usize, dtype: DType, device: Device, loc: &SourceLoc) -> Result<Tensor> {
        check_arange(n, dtype, loc)?;
        device.check_available("arange")?;
        let values: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let host = HostTensor::from_f64(dtype, [n], &values).map_err(|e| Error::ir("arange", loc, e))?;
        // Made on the host and placed directly: not a copy of a tensor's values to the CPU, so
        // no host synchronization (`to_device(Cpu)` would count one).
        match device {
            Device::Cpu => Ok(Tensor::from_host(host)),
            Device::Cuda(ordinal) => Ok(Tensor::from_cuda(crate::cuda::CudaTensor::upload(&host, ordinal, "arange")?)),
        }
    }
}

fn check_arange(n: usize, dtype: DType, loc: &SourceLoc) -> Result<()> {
    if dtype == DType::Bool {
        return Err(Error::invalid("arange", loc, "expected a number dtype (f32, f16, bf16, i32, i64), got bool"));
    }
    if dtype == DType::I32 && n > i32::MAX as usize + 1 {
        return Err(Error::invalid("arange", loc, format!("{n} values do not fit i32 (at most 2^31)")));
    }
    Ok(())
}
