//! Untyped device memory and the plain scalar types that may be viewed through it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr};

use crate::capture_gate::StreamGate;

/// A block of device memory, untyped because generated kernels and memory plans deal in byte
/// offsets. Cloning shares the allocation (it does not copy): captured CUDA graphs keep clones
/// so the memory they read stays alive while they can be replayed.
///
/// All work on a buffer goes through the one stream of the [`crate::CudaDevice`] that allocated
/// it, so operations on it are ordered without further synchronisation. Its memory is freed on
/// that stream when the last handle goes, from any thread: through the stream's capture gate, so
/// the free never lands in a CUDA graph another thread is capturing.
#[derive(Debug, Clone)]
pub struct DeviceBuffer {
    pub(crate) slice: Arc<Allocation>,
    pub(crate) len_bytes: usize,
}

/// Bytes of device memory a device's live buffers hold, and the most they held at once since
/// the last reset: `torch.cuda.memory_allocated` and `max_memory_allocated` for braze.
#[derive(Debug, Default)]
pub(crate) struct MemoryCounter {
    live: AtomicU64,
    peak: AtomicU64,
}

impl MemoryCounter {
    fn add(&self, bytes: u64) {
        let live = self.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(live, Ordering::Relaxed);
    }

    fn sub(&self, bytes: u64) {
        self.live.fetch_sub(bytes, Ordering::Relaxed);
    }

    pub(crate) fn live(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }

    pub(crate) fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Starts a new peak from what is live now.
    pub(crate) fn reset_peak(&self) {
        self.peak.store(self.live(), Ordering::Relaxed);
    }
}

/// Device memory that is freed through its stream's gate and counted while it lives.
#[derive(Debug)]
pub(crate) struct Allocation {
    slice: Option<CudaSlice<u8>>,
    gate: Arc<StreamGate>,
    counter: Arc<MemoryCounter>,
    bytes: u64,
}

impl Allocation {
    pub(crate) fn new(slice: CudaSlice<u8>, gate: Arc<StreamGate>, counter: Arc<MemoryCounter>) -> Self {
        let bytes = slice.len() as u64;
        counter.add(bytes);
        Allocation { slice: Some(slice), gate, counter, bytes }
    }

    fn slice(&self) -> &CudaSlice<u8> {
        self.slice.as_ref().expect("present until dropped")
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if let Some(slice) = self.slice.take() {
            self.gate.drop_outside_capture(slice);
            self.counter.sub(self.bytes);
        }
    }
}

impl DeviceBuffer {
    /// Size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    /// How many `T` fit in the buffer (rounding down).
    pub fn len_elems<T: PodScalar>(&self) -> usize {
        self.len_bytes / std::mem::size_of::<T>()
    }

    /// The device address of the first byte, for alignment checks and diagnostics.
    pub fn device_address(&self) -> u64 {
        // The device's contexts track no events, so the returned guard records nothing.
        let slice = self.slice.slice();
        let (address, _no_event_to_record) = slice.device_ptr(slice.stream());
        address
    }

    /// Whether two handles refer to the same allocation.
    pub fn same_allocation(&self, other: &DeviceBuffer) -> bool {
        Arc::ptr_eq(&self.slice, &other.slice)
    }

    /// Whether this is the only handle to its allocation: nothing else can enqueue work on it.
    pub fn is_only_handle(&self) -> bool {
        Arc::strong_count(&self.slice) == 1
    }

    /// The CUDA context this memory belongs to, to reject buffers from another device.
    pub(crate) fn cu_context(&self) -> cudarc::driver::sys::CUcontext {
        self.slice.slice().context().cu_ctx()
    }

    /// Checks that `offset..offset + len` lies inside the buffer and returns its device address.
    pub(crate) fn address_of_range(&self, offset: usize, len: usize) -> Option<u64> {
        let end = offset.checked_add(len)?;
        (end <= self.len_bytes).then(|| self.device_address() + offset as u64)
    }
}

/// Plain scalar types whose values can be moved between host and device as raw bytes.
///
/// # Safety
///
/// Implementors must have no padding and no invalid bit patterns, so that any byte sequence of
/// the right length is a valid value and any value is a valid byte sequence.
pub unsafe trait PodScalar: Copy + Send + Sync + 'static {}

// SAFETY: the primitive integer and float types have no padding and every bit pattern is a
// valid value.
unsafe impl PodScalar for u8 {}
// SAFETY: as above.
unsafe impl PodScalar for i8 {}
// SAFETY: as above.
unsafe impl PodScalar for u16 {}
// SAFETY: as above.
unsafe impl PodScalar for i16 {}
// SAFETY: as above.
unsafe impl PodScalar for u32 {}
// SAFETY: as above.
unsafe impl PodScalar for i32 {}
// SAFETY: as above.
unsafe impl PodScalar for u64 {}
// SAFETY: as above.
unsafe impl PodScalar for i64 {}
// SAFETY: as above.
unsafe impl PodScalar for f32 {}
// SAFETY: as above.
unsafe impl PodScalar for f64 {}
// SAFETY: `half::f16` is a `repr(transparent)` wrapper of `u16`.
unsafe impl PodScalar for half::f16 {}
// SAFETY: `half::bf16` is a `repr(transparent)` wrapper of `u16`.
unsafe impl PodScalar for half::bf16 {}

/// Views a slice of scalars as its bytes, to upload typed host data.
pub fn bytes_of<T: PodScalar>(values: &[T]) -> &[u8] {
    // SAFETY: `T: PodScalar` has no padding, so all `size_of_val(values)` bytes are initialised;
    // `u8` has alignment 1 and the returned slice borrows `values`, so it cannot outlive it.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) }
}

/// Reads scalars back from bytes (copying, so `bytes` needs no particular alignment).
/// Trailing bytes that do not fill a whole `T` are ignored.
pub fn values_from_bytes<T: PodScalar>(bytes: &[u8]) -> Vec<T> {
    let count = bytes.len() / std::mem::size_of::<T>();
    let mut values = Vec::<T>::with_capacity(count);
    // SAFETY: the destination has capacity for `count` values, i.e. `count * size_of::<T>()`
    // bytes, which is at most `bytes.len()`; the regions do not overlap (fresh allocation); and
    // `T: PodScalar` makes any bytes a valid `T`, so setting the length afterwards is sound.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            values.as_mut_ptr().cast::<u8>(),
            count * std::mem::size_of::<T>(),
        );
        values.set_len(count);
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_bytes_round_trip_at_any_alignment() {
        let values = [1.5f32, -2.0, f32::NAN, 1e-30];
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(bytes_of(&values));
        let back: Vec<f32> = values_from_bytes(&shifted[1..]);
        assert_eq!(
            back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            values.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        let halves = [half::bf16::from_f32(3.0), half::bf16::from_f32(-0.5)];
        assert_eq!(values_from_bytes::<half::bf16>(bytes_of(&halves)), halves);
    }
}
