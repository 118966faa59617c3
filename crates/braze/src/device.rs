//! Where a tensor lives.

use crate::Result;
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory; ops run on the CPU reference executor.
    Cpu,
    /// CUDA device by ordinal.
    Cuda(usize),
}

impl Device {
    /// The CUDA device `ordinal`, opened now; [`Error::DeviceUnavailable`] when there is no
    /// driver or no such GPU.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        crate::cuda::device(ordinal, "Device::cuda")?;
        Ok(Device::Cuda(ordinal))
    }

    /// The first GPU when there is one, else the CPU.
    pub fn best_available() -> Device {
        Device::cuda(0).unwrap_or(Device::Cpu)
    }

    /// Errors unless tensors can be created on this device.
    pub(crate) fn check_available(self, op: &str) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda(ordinal) => crate::cuda::device(ordinal, op).map(|_| ()),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
        }
    }
}
