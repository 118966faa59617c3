//! Tensors filled with one value (`full`, `zeros`, `ones`): a recorded constant inside a trace,
//! host or device data outside.

use crate::tensor::caller;
use crate::{trace, Device, Result, Tensor};
use braze_ir::{DType, Shape};

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
}
