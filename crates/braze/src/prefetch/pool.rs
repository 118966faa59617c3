//! Pinned host memory for a device's copies: on a GPU page-locked buffers from braze-cuda's pool;
//! on the CPU backend plain host buffers standing in for them, reused by the same rule (a buffer
//! goes back into use only once the copy that last used it has completed), so code and tests
//! written against the CPU backend behave as they will on a GPU.

use crate::{Device, Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Free buffers the CPU stand-in keeps.
const CPU_POOL_CAPACITY: usize = 16;

/// Reusable pinned host buffers of one device.
pub struct PinnedPool {
    device: Device,
    inner: PoolInner,
}

enum PoolInner {
    Cpu { free: Mutex<Vec<Vec<u8>>>, allocations: AtomicU64 },
    Cuda(braze_cuda::PinnedPool),
}

/// A pinned host buffer taken from a [`PinnedPool`].
pub struct PinnedBuffer {
    pub(crate) inner: BufferInner,
}

pub(crate) enum BufferInner {
    /// The CPU stand-in: `bytes[..len]` in use. Handed to a copy by value, so the host cannot
    /// touch it while the copy runs.
    Cpu {
        bytes: Vec<u8>,
        len: usize,
    },
    Cuda(braze_cuda::PinnedBuffer),
}

impl PinnedPool {
    /// The pool of `device` (opening it on a GPU).
    pub fn new(device: Device) -> Result<PinnedPool> {
        let inner = match device {
            Device::Cpu => PoolInner::Cpu { free: Mutex::new(Vec::new()), allocations: AtomicU64::new(0) },
            Device::Cuda(ordinal) => {
                PoolInner::Cuda(braze_cuda::PinnedPool::new(&crate::cuda::device(ordinal, "PinnedPool::new")?))
            }
        };
        Ok(PinnedPool { device, inner })
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// A buffer of `bytes`: a free one large enough when there is one, else a new allocation.
    pub fn take(&self, bytes: usize) -> Result<PinnedBuffer> {
        match &self.inner {
            PoolInner::Cpu { free, allocations } => {
                let mut free = free.lock().unwrap_or_else(|p| p.into_inner());
                let bytes_vec = match free.iter().position(|b| b.capacity() >= bytes) {
                    Some(i) => free.swap_remove(i),
                    None => {
                        allocations.fetch_add(1, Ordering::Relaxed);
                        Vec::with_capacity(bytes.max(64).next_power_of_two())
                    }
                };
                let mut bytes_vec = bytes_vec;
                bytes_vec.resize(bytes, 0);
                Ok(PinnedBuffer { inner: BufferInner::Cpu { bytes: bytes_vec, len: bytes } })
            }
            PoolInner::Cuda(pool) => Ok(PinnedBuffer {
                inner: BufferInner::Cuda(pool.take(bytes).map_err(|e| Error::cuda("PinnedPool::take", e))?),
            }),
        }
    }

    /// Returns a buffer for reuse (on a GPU it may still be in a copy; it is reused after).
    pub fn give_back(&self, buffer: PinnedBuffer) {
        match (&self.inner, buffer.inner) {
            (PoolInner::Cpu { free, .. }, BufferInner::Cpu { bytes, .. }) => {
                let mut free = free.lock().unwrap_or_else(|p| p.into_inner());
                if free.len() < CPU_POOL_CAPACITY {
                    free.push(bytes);
                }
            }
            (PoolInner::Cuda(pool), BufferInner::Cuda(buffer)) => pool.give_back(buffer),
            _ => {}
        }
    }

    /// Buffers allocated so far: a steady loop reuses its buffers and allocates none.
    pub fn allocations(&self) -> u64 {
        match &self.inner {
            PoolInner::Cpu { allocations, .. } => allocations.load(Ordering::Relaxed),
            PoolInner::Cuda(pool) => pool.allocations(),
        }
    }

    pub(crate) fn cuda(&self) -> Option<&braze_cuda::PinnedPool> {
        match &self.inner {
            PoolInner::Cuda(pool) => Some(pool),
            PoolInner::Cpu { .. } => None,
        }
    }
}

impl PinnedBuffer {
    /// Bytes in use.
    pub fn len(&self) -> usize {
        match &self.inner {
            BufferInner::Cpu { len, .. } => *len,
            BufferInner::Cuda(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, for the host to fill; on a GPU this waits for the copy that last used them.
    pub fn as_mut_bytes(&mut self) -> Result<&mut [u8]> {
        match &mut self.inner {
            BufferInner::Cpu { bytes, len } => Ok(&mut bytes[..*len]),
            BufferInner::Cuda(b) => b.as_mut_bytes().map_err(|e| Error::cuda("PinnedBuffer::as_mut_bytes", e)),
        }
    }
}

/// Shared so a prefetcher and its copies hold the same pool.
pub(crate) type SharedPool = Arc<PinnedPool>;
