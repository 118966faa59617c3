//! Seeded initialization: each new parameter draws from its own seed, so a model built twice
//! from one seed is the same on every device.

use crate::Result;
use braze::{DType, Device, Tensor};

/// Makes parameters: normals, zeros and ones of one dtype on one device, requiring grad.
#[derive(Clone, Debug)]
pub struct Init {
    pub dtype: DType,
    pub device: Device,
    seed: u64,
    drawn: u64,
}

impl Init {
    pub fn new(dtype: DType, device: Device, seed: u64) -> Init {
        Init { dtype, device, seed, drawn: 0 }
    }

    /// Normal values with mean 0 and standard deviation `std` (drawn in f32, rounded once).
    pub fn normal(&mut self, shape: &[usize], std: f64) -> Result<Tensor> {
        let seed = self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(self.drawn);
        self.drawn += 1;
        self.param(Tensor::randn_std(shape.to_vec(), self.dtype, std, seed)?)
    }

    pub fn zeros(&mut self, shape: &[usize]) -> Result<Tensor> {
        self.param(Tensor::zeros(shape.to_vec(), self.dtype, Device::Cpu)?)
    }

    pub fn ones(&mut self, shape: &[usize]) -> Result<Tensor> {
        self.param(Tensor::ones(shape.to_vec(), self.dtype, Device::Cpu)?)
    }

    fn param(&self, values: Tensor) -> Result<Tensor> {
        let t = values.to_device(self.device)?;
        t.set_requires_grad(true)?;
        Ok(t)
    }
}
