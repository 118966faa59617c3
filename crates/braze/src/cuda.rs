//! The frontend's view of CUDA: one shared [`CudaDevice`] per ordinal, the process-wide kernel
//! cache, and tensors whose data lives in device memory.

use crate::{Device, Error, Result};
use braze_cuda::{CudaDevice, DeviceBuffer, KernelCache};
use braze_ir::{DType, HostTensor, Shape};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Data of a tensor on a CUDA device: a dense row-major buffer.
pub(crate) struct CudaTensor {
    pub buffer: DeviceBuffer,
    pub dtype: DType,
    pub shape: Shape,
    pub ordinal: usize,
}

fn devices() -> &'static Mutex<HashMap<usize, Arc<CudaDevice>>> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
    DEVICES.get_or_init(Default::default)
}

/// The device `ordinal`, opened on first use and shared by every tensor and executable on it.
pub(crate) fn device(ordinal: usize, op: &str) -> Result<Arc<CudaDevice>> {
    let mut open = devices().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = open.get(&ordinal) {
        return Ok(d.clone());
    }
    if !braze_cuda::cuda_available() {
        return Err(Error::DeviceUnavailable { op: op.to_string(), device: Device::Cuda(ordinal) });
    }
    let d = CudaDevice::new(ordinal).map_err(|e| Error::cuda(op, e))?;
    open.insert(ordinal, d.clone());
    Ok(d)
}

/// The [`CudaDevice`] that tensors and compiled functions on `Device::Cuda(ordinal)` use, opened
/// on first use. All of braze's work on it is ordered on its one stream, so timing events recorded
/// there time that work, and [`CudaDevice::allocation_count`] counts braze's allocations.
pub fn cuda_device(ordinal: usize) -> Result<Arc<CudaDevice>> {
    device(ordinal, "cuda_device")
}

/// Counters of the process-wide kernel cache: NVRTC compiles, memory and disk hits.
pub fn kernel_cache_stats() -> braze_cuda::CacheStats {
    kernel_cache().stats()
}

/// Compiled kernels shared by every executable in the process: in memory, and on disk unless no
/// cache directory can be used (then a warning, and memory only).
pub(crate) fn kernel_cache() -> &'static KernelCache {
    static CACHE: OnceLock<KernelCache> = OnceLock::new();
    CACHE.get_or_init(|| {
        KernelCache::new().unwrap_or_else(|err| {
            tracing::warn!(target: "braze::kernels", error = %err, "kernel cache directory unusable; caching in memory only");
            KernelCache::in_memory()
        })
    })
}

impl CudaTensor {
    pub(crate) fn upload(host: &HostTensor, ordinal: usize, op: &str) -> Result<CudaTensor> {
        let dev = device(ordinal, op)?;
        let buffer = dev.upload(&host.to_bytes()).map_err(|e| Error::cuda(op, e))?;
        Ok(CudaTensor { buffer, dtype: host.dtype(), shape: host.shape().clone(), ordinal })
    }

    /// `shape` filled with the element `host` holds (one element) on the device: a memset, no
    /// host data of the tensor's size.
    pub(crate) fn full(element: &HostTensor, shape: Shape, ordinal: usize, op: &str) -> Result<CudaTensor> {
        let dev = device(ordinal, op)?;
        let dtype = element.dtype();
        let bytes = shape.numel().checked_mul(dtype.size_bytes()).ok_or_else(|| Error::InvalidArgument {
            op: op.to_string(),
            loc: None,
            detail: format!("{shape} elements of {dtype} overflow the address space"),
        })?;
        let buffer = dev.alloc(bytes).map_err(|e| Error::cuda(op, e))?;
        dev.fill(&buffer, &element.to_bytes()).map_err(|e| Error::cuda(op, e))?;
        Ok(CudaTensor { buffer, dtype, shape, ordinal })
    }

    /// Copies the data to the host; waits for the device's queued work.
    pub(crate) fn download(&self, op: &str) -> Result<HostTensor> {
        let dev = device(self.ordinal, op)?;
        let bytes = dev.download(&self.buffer).map_err(|e| Error::cuda(op, e))?;
        HostTensor::from_bytes(self.dtype, self.shape.clone(), &bytes).map_err(|ir| Error::InvalidArgument {
            op: op.to_string(),
            loc: None,
            detail: ir.to_string(),
        })
    }
}

/// Opening devices: `Device::Cuda` names a GPU that these open through the shared [`CudaDevice`]s.
impl Device {
    /// The CUDA device `ordinal`, opened now; [`Error::DeviceUnavailable`] when there is no
    /// driver or no such GPU.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        device(ordinal, "Device::cuda")?;
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
            Device::Cuda(ordinal) => device(ordinal, op).map(|_| ()),
        }
    }
}
