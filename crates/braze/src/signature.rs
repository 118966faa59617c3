//! Input signatures: the dtype, shape and device a compiled graph assumes of each tensor.

use crate::tensor::Storage;
use crate::{Device, Tensor};
use braze_ir::{DType, Shape};
use std::fmt;

/// What a compiled graph assumes about one tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TensorSig {
    dtype: DType,
    shape: Shape,
    device: Device,
}

impl TensorSig {
    pub(crate) fn of(t: &Tensor) -> TensorSig {
        TensorSig { dtype: t.dtype(), shape: t.shape(), device: t.device() }
    }

    /// Allocation-free check of `t` against the signature.
    pub(crate) fn matches(&self, t: &Tensor) -> bool {
        match &*t.storage() {
            Storage::Host(h) => self.device == Device::Cpu && h.dtype() == self.dtype && h.shape() == &self.shape,
            Storage::Cuda(c) => {
                self.device == Device::Cuda(c.ordinal) && c.dtype == self.dtype && c.shape == self.shape
            }
            Storage::Traced(_) => false,
        }
    }

    /// How `now` differs from this signature, e.g. `shape changed from [64,256] to [32,256]`.
    pub(crate) fn change_to(&self, now: &TensorSig) -> String {
        if self.dtype != now.dtype {
            format!("dtype changed from {} to {}", self.dtype, now.dtype)
        } else if self.shape != now.shape {
            format!("shape changed from {} to {}", self.shape, now.shape)
        } else if self.device != now.device {
            format!("device changed from {} to {}", self.device, now.device)
        } else {
            "did not change".into()
        }
    }
}

impl fmt::Display for TensorSig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)?;
        if self.device != Device::Cpu {
            write!(f, "@{}", self.device)?;
        }
        Ok(())
    }
}

pub(crate) fn format_signature(sigs: &[TensorSig]) -> String {
    let parts: Vec<String> = sigs.iter().map(|s| s.to_string()).collect();
    format!("({})", parts.join(", "))
}
