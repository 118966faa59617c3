//! Pinned (page-locked) host memory and the device's copy stream, for transfers that overlap
//! compute: a pool of pinned buffers, each reused only once the copy that last used it has
//! completed; host-to-device copies on a second stream, ordered against the compute stream by
//! events (never a device-wide synchronization); and device-to-host reads into pinned memory
//! that the host collects once their event has completed, so reading never stalls the queue.
//!
//! A copy from pageable memory (an ordinary `Vec`) has to be staged by the driver and cannot
//! overlap anything; a copy from pinned memory runs on the copy engine while kernels run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::result as driver_result;
use cudarc::driver::{CudaEvent, CudaStream, PinnedHostSlice};

use crate::buffer::DeviceBuffer;
use crate::capture_gate::{outside_capture, DropOutsideCapture, StreamGate};
use crate::device::{lock, CudaDevice};
use crate::error::{CudaError, Result};
use crate::spans::{PendingSpan, SpanStream};

/// Smallest pinned allocation; smaller requests round up so the pool can reuse them.
const MIN_PINNED_BYTES: usize = 4096;
/// Free buffers a pool keeps; more are freed when given back.
const POOL_CAPACITY: usize = 16;

/// Page-locked host memory of one device's context, with the event of the last copy that read
/// or wrote it: the host touches it only after that event has completed.
#[derive(Debug)]
pub struct PinnedBuffer {
    host: DropOutsideCapture<PinnedHostSlice<u8>>,
    /// Bytes in use (at most the allocation's size).
    len: usize,
    /// Recorded after the last copy that uses the memory; unrecorded means idle.
    last_copy: CudaEvent,
    /// When the buffer was last given back to its pool (the pool's count of returns): among busy
    /// buffers the one returned first has the copy enqueued first.
    returned: u64,
}

impl PinnedBuffer {
    /// Bytes in use.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated.
    pub fn capacity(&self) -> usize {
        self.host.len()
    }

    /// Whether no copy reading or writing this memory is still queued or running.
    pub fn is_idle(&self) -> Result<bool> {
        Ok(self.last_copy.try_is_complete()?)
    }

    /// The bytes in use, for the host to fill; waits for the last copy that used them (only that
    /// copy, not the device).
    pub fn as_mut_bytes(&mut self) -> Result<&mut [u8]> {
        self.last_copy.synchronize()?;
        let len = self.len;
        Ok(&mut self.host.as_mut_slice()?[..len])
    }

    /// The bytes in use once the last copy has completed; `None` while it has not (no waiting).
    pub fn try_bytes(&self) -> Result<Option<&[u8]>> {
        if !self.is_idle()? {
            return Ok(None);
        }
        Ok(Some(&self.host.as_slice()?[..self.len]))
    }
}

impl PinnedBuffer {
    /// A new allocation of at least `bytes` (rounded up to a power of two, at least 4 KiB), idle.
    pub(crate) fn alloc(device: &CudaDevice, bytes: usize) -> Result<PinnedBuffer> {
        let capacity = bytes.max(MIN_PINNED_BYTES).next_power_of_two();
        let ctx = device.context();
        // SAFETY: the pinned memory is uninitialised; the host reads only bytes a copy (or the
        // host itself) wrote first. Flags 0 (not write-combined): the host both writes and reads it.
        let host = outside_capture(|| unsafe { ctx.alloc_pinned_with_flags::<u8>(capacity, 0) })?;
        let last_copy = ctx.new_event(None)?;
        Ok(PinnedBuffer { host: DropOutsideCapture::new(host), len: bytes, last_copy, returned: 0 })
    }

    /// The bytes in use once the last copy has completed, waiting for that copy (only that
    /// copy, not the device).
    pub(crate) fn wait_bytes(&self) -> Result<&[u8]> {
        self.last_copy.synchronize()?;
        Ok(&self.host.as_slice()?[..self.len])
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // A copy may still read or write the memory that is freed with the fields.
        let _ = self.last_copy.synchronize();
    }
}

/// Pinned buffers of one device, reused: [`PinnedPool::take`] hands out an idle buffer large
/// enough when there is one and allocates only otherwise (pinning memory is slow: it maps and
/// locks pages).
#[derive(Debug)]
pub struct PinnedPool {
    device: Arc<CudaDevice>,
    free: Mutex<Vec<PinnedBuffer>>,
    allocations: AtomicU64,
    returns: AtomicU64,
}

impl PinnedPool {
    pub fn new(device: &Arc<CudaDevice>) -> PinnedPool {
        PinnedPool {
            device: device.clone(),
            free: Mutex::new(Vec::new()),
            allocations: AtomicU64::new(0),
            returns: AtomicU64::new(0),
        }
    }

    /// A buffer of `bytes` in use: an idle one from the pool when one is large enough, else a
    /// new allocation while the pool has pinned fewer than it keeps, else the busy one given back
    /// first (its host accessors wait for its copy). A busy buffer is the last resort because its
    /// copy may be ordered after all the compute work enqueued before it (an upload waits for
    /// that work): waiting for the newest would let the compute stream drain before the host
    /// enqueues more, while the oldest is as many steps back as the pool holds buffers.
    pub fn take(&self, bytes: usize) -> Result<PinnedBuffer> {
        let reused = {
            let mut free = lock(&self.free);
            let fits: Vec<usize> = (0..free.len()).filter(|&i| free[i].capacity() >= bytes).collect();
            let idle = fits.iter().copied().find(|&i| free[i].is_idle().unwrap_or(false));
            let pinned_enough = self.allocations.load(Ordering::Relaxed) >= POOL_CAPACITY as u64;
            let oldest = fits.iter().copied().min_by_key(|&i| free[i].returned);
            let busy = oldest.filter(|_| pinned_enough);
            idle.or(busy).map(|i| free.swap_remove(i))
        };
        if let Some(mut buffer) = reused {
            buffer.len = bytes;
            return Ok(buffer);
        }
        let buffer = PinnedBuffer::alloc(&self.device, bytes)?;
        self.allocations.fetch_add(1, Ordering::Relaxed);
        Ok(buffer)
    }

    /// Returns a buffer for reuse (it may still be in a copy: it is handed out again only after).
    pub fn give_back(&self, mut buffer: PinnedBuffer) {
        buffer.returned = self.returns.fetch_add(1, Ordering::Relaxed);
        let mut free = lock(&self.free);
        if free.len() < POOL_CAPACITY {
            free.push(buffer);
        }
    }

    /// Pinned allocations made so far: a steady loop reuses its buffers and adds none.
    pub fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::Relaxed)
    }
}

/// The end of a copy on the copy stream. The compute stream is made to wait for it by
/// [`CudaDevice::wait_for`], or when the mark is dropped: either way before the copy's
/// destination (kept alive by the mark) can be freed on the compute stream and reused.
#[derive(Debug)]
pub struct StreamMark {
    event: CudaEvent,
    destination: Option<DeviceBuffer>,
    compute: Arc<CudaStream>,
    gate: Arc<StreamGate>,
}

impl StreamMark {
    /// Whether the copy has completed (no waiting).
    pub fn is_complete(&self) -> Result<bool> {
        Ok(self.event.try_is_complete()?)
    }

    fn make_compute_wait(&mut self) -> Result<()> {
        let Some(destination) = self.destination.take() else { return Ok(()) };
        let waited = self.gate.shared(|| self.compute.wait(&self.event));
        // Let go of the destination only now: its free, if this was the last handle, is then
        // ordered on the compute stream after the copy.
        drop(destination);
        Ok(waited?)
    }
}

impl Drop for StreamMark {
    fn drop(&mut self) {
        let _ = self.make_compute_wait();
    }
}

impl CudaDevice {
    /// The second stream, for copies that overlap the compute stream's work; created on first use.
    pub(crate) fn copy_stream(&self) -> Result<Arc<CudaStream>> {
        let mut slot = lock(&self.copy_stream);
        if let Some(stream) = slot.as_ref() {
            return Ok(stream.clone());
        }
        let stream = outside_capture(|| self.ctx.new_stream())?;
        *slot = Some(stream.clone());
        Ok(stream)
    }

    /// Enqueues a copy of `src` into the start of `dst` on the copy stream and returns the mark
    /// of its end. The copy waits for the compute stream's work enqueued so far (which includes
    /// `dst`'s allocation and every earlier use of its memory); the compute stream does not wait
    /// for the copy until [`CudaDevice::wait_for`] is given the mark. `src` is not written by the
    /// host until the copy has read it ([`PinnedBuffer::as_mut_bytes`] waits).
    /// With `spans`, the copy's span on the copy stream is appended to it (for a timeline).
    pub fn upload_pinned_async(
        &self,
        src: &PinnedBuffer,
        dst: &DeviceBuffer,
        spans: Option<&mut Vec<PendingSpan>>,
    ) -> Result<StreamMark> {
        self.gate.shared(|| {
            self.reject_during_capture("a copy on the copy stream")?;
            self.check_pinned(src)?;
            let address = self.checked_range(dst, 0, src.len, "pinned upload")?;
            let copy = self.copy_stream()?;
            let compute_so_far = self.ctx.new_event(None)?;
            compute_so_far.record(&self.stream)?;
            copy.wait(&compute_so_far)?;
            let span = match spans.is_some() {
                true => {
                    Some(self.begin_span(format!("copy {} B host to device", src.len), "copy", SpanStream::Copy)?)
                }
                false => None,
            };
            if src.len > 0 {
                self.ctx.bind_to_thread()?;
                let bytes = &src.host.as_slice()?[..src.len];
                // SAFETY: the destination range lies inside `dst` (checked above); the mark keeps
                // `dst` alive and makes the compute stream wait for this copy before it lets it
                // go, so its stream-ordered free (and any reuse of the memory) comes after the
                // copy. The source is pinned memory that is neither written by the host nor freed
                // before `last_copy` (recorded next) completes.
                unsafe { driver_result::memcpy_htod_async(address, bytes, copy.cu_stream()) }?;
            }
            src.last_copy.record(&copy)?;
            if let (Some(span), Some(spans)) = (span, spans) {
                span.end()?;
                spans.push(span);
            }
            let done = self.ctx.new_event(None)?;
            done.record(&copy)?;
            Ok(StreamMark {
                event: done,
                destination: Some(dst.clone()),
                compute: self.stream.clone(),
                gate: self.gate.clone(),
            })
        })
    }

    /// Makes the compute stream's later work wait until `mark` is reached (enqueued; the host
    /// does not wait).
    pub fn wait_for(&self, mut mark: StreamMark) -> Result<()> {
        if !Arc::ptr_eq(&mark.compute, &self.stream) {
            return Err(CudaError::InvalidArgument("a copy of another device".into()));
        }
        self.reject_during_capture("waiting for the copy stream")?;
        mark.make_compute_wait()
    }

    /// Enqueues a copy of `src` into `dst` (its length) on the compute stream, after the work
    /// that produces `src`; the host reads it with [`PinnedBuffer::try_bytes`] once it completed.
    pub fn download_pinned_async(&self, src: &DeviceBuffer, dst: &mut PinnedBuffer) -> Result<()> {
        self.gate.shared(|| {
            self.reject_during_capture("downloading to pinned memory")?;
            self.check_pinned(dst)?;
            let address = self.checked_range(src, 0, dst.len, "pinned download")?;
            if dst.len > 0 {
                // Not while an earlier copy still uses the memory.
                dst.last_copy.synchronize()?;
                let len = dst.len;
                let landing = &mut dst.host.as_mut_slice()?[..len];
                self.ctx.bind_to_thread()?;
                // SAFETY: the source range lies inside `src` (checked above), and the copy is
                // ordered on the stream with every other use of it; the destination is pinned
                // memory that the host reads only after `last_copy`, recorded next, completed, and
                // that is not freed before (dropping a `PinnedBuffer` waits for it).
                unsafe { driver_result::memcpy_dtoh_async(landing, address, self.stream.cu_stream()) }?;
                self.note_captured_buffer(src);
            }
            dst.last_copy.record(&self.stream)?;
            Ok(())
        })
    }

    /// Rejects a pinned buffer of another device.
    pub(crate) fn check_pinned(&self, buffer: &PinnedBuffer) -> Result<()> {
        if !Arc::ptr_eq(buffer.host.context(), &self.ctx) {
            return Err(CudaError::InvalidArgument("pinned buffer belongs to another device".into()));
        }
        Ok(())
    }
}
