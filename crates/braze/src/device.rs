//! Where a tensor lives.

use crate::{Error, Result};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory; ops run on the CPU reference executor.
    Cpu,
    /// CUDA device by ordinal.
    Cuda(usize),
}

impl Device {
    /// The CUDA device `ordinal`, if this build can use it. No CUDA backend is linked into the
    /// frontend yet, so this returns [`Error::DeviceUnavailable`].
    pub fn cuda(ordinal: usize) -> Result<Device> {
        Err(Error::DeviceUnavailable { op: "Device::cuda".into(), device: Device::Cuda(ordinal) })
    }

    /// Errors unless tensors can be created on this device.
    pub(crate) fn check_available(self, op: &str) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda(_) => Err(Error::DeviceUnavailable { op: op.to_string(), device: self }),
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
