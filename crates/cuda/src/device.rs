//! One GPU: its context, its stream, device memory, transfers and timing.
//!
//! Everything a [`CudaDevice`] does is enqueued on one non-default stream, so operations are
//! ordered by submission and the only calls that wait for the GPU are [`CudaDevice::download`]
//! (and its variants), [`CudaDevice::synchronize`] and timer reads. The first two also report
//! the index checks of earlier plan runs that no call reported yet (see `checks`).
//!
//! A `CudaDevice` is shared between threads (`Arc<CudaDevice>` is `Send + Sync`): its operations
//! may be called from any thread at once, and each is ordered on the stream as a whole. While
//! one thread captures a CUDA graph on the stream, other threads' operations on it wait at the
//! device's capture gate (see `capture_gate`) instead of being recorded into the graph.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use cudarc::driver::result as driver_result;
use cudarc::driver::sys::{self as driver_sys, CUdevice_attribute};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, PinnedHostSlice};

use braze_codegen::Target;

use crate::buffer::{bytes_of, values_from_bytes, Allocation, DeviceBuffer, MemoryCounter, PodScalar};
use crate::capture_gate::{outside_capture, DropOutsideCapture, StreamGate};
use crate::error::{CudaError, Result};
use crate::kernel::Kernel;

/// Bytes per pinned staging chunk for uploads.
const UPLOAD_CHUNK_BYTES: usize = 8 << 20;
/// Staging chunks for uploads, filled one after another: an upload waits only when it needs a
/// chunk whose copies from its previous fill have not finished, i.e. when more than three
/// chunks' worth of uploads are in flight.
const UPLOAD_CHUNKS: usize = 4;
/// Uploads are staged at offsets of this alignment inside a chunk.
const UPLOAD_ALIGN: usize = 256;
/// Largest pinned buffer kept for downloads; bigger downloads go through it in pieces.
const DOWNLOAD_STAGING_MAX_BYTES: usize = 64 << 20;

/// Whether the CUDA driver library can be loaded. Checked before any driver call because cudarc
/// panics when a dynamically loaded library is missing.
pub fn driver_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to dlopen the candidate library names and drops the
    // handles again; it touches no driver state.
    *AVAILABLE.get_or_init(|| unsafe { driver_sys::is_culib_present() })
}

/// Number of CUDA devices, or an error saying why there are none to count.
pub fn device_count() -> Result<usize> {
    if !driver_available() {
        return Err(CudaError::DriverUnavailable);
    }
    driver_result::init()?;
    Ok(usize::try_from(CudaContext::device_count()?).unwrap_or(0))
}

/// Whether GPU work is possible here: the driver loads and sees at least one device.
/// Never panics; tests use it to skip on machines without a GPU.
pub fn cuda_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| device_count().is_ok_and(|count| count > 0))
}

/// The device as codegen's [`Target`]: name, compute capability (which is also the NVRTC
/// architecture), SM count and the thread and shared-memory limits, from its attributes.
fn read_target(ctx: &CudaContext) -> Result<Target> {
    let attribute = |attr| -> Result<u32> { Ok(u32::try_from(ctx.attribute(attr)?).unwrap_or(0)) };
    use CUdevice_attribute::*;
    Ok(Target {
        name: ctx.name()?,
        compute_capability: (
            attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        sm_count: attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        max_threads_per_block: attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        max_threads_per_sm: attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?,
        shared_memory_per_block: attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?,
        shared_memory_per_block_optin: attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
    })
}

/// A GPU with one stream that all of this crate's work on it is ordered on.
#[derive(Debug)]
pub struct CudaDevice {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    ordinal: usize,
    /// The device as codegen sees it: name, compute capability, SM count and limits.
    target: Target,
    allocations: AtomicU64,
    /// Modules loaded, to show that shared code loads once.
    pub(crate) module_loads: AtomicU64,
    /// Bytes held by this device's live buffers, and their peak.
    memory: Arc<MemoryCounter>,
    /// Keeps other threads off `stream` while a CUDA graph is captured on it (see
    /// `capture_gate`): every operation that enqueues on the stream passes it.
    pub(crate) gate: Arc<StreamGate>,
    /// Set while a CUDA graph is being captured on `stream`; only the capturing thread gets past
    /// the gate to see it.
    pub(crate) capture: Mutex<Option<CaptureRecord>>,
    upload_staging: Mutex<UploadStaging>,
    download_staging: Mutex<Option<DropOutsideCapture<PinnedHostSlice<u8>>>>,
    /// The second stream, of pinned copies that overlap compute (see `pinned`); made on first use.
    pub(crate) copy_stream: Mutex<Option<Arc<CudaStream>>>,
    /// The check slots of this device's executables (see `checks`), read at host syncs.
    pub(crate) check_rings: Mutex<Vec<Arc<dyn PendingChecks>>>,
    /// The functions of compiled modules loaded on this device, shared by every executable that
    /// runs them (see `CudaDevice::shared_function`).
    pub(crate) loaded: Mutex<crate::kernel::LoadedFunctions>,
}

/// Check words of an executable's runs, copied to the host without waiting, that the device
/// reads at host synchronizations (the slots of `checks`).
pub(crate) trait PendingChecks: std::fmt::Debug + Send + Sync {
    /// Reads the completed copies (of the runs `thread` enqueued, or of all runs) without
    /// waiting; the first raised check is the error.
    fn poll_completed(&self, thread: Option<std::thread::ThreadId>) -> Result<()>;

    /// Whether a read is still owed: a copy not yet read, or an error not yet reported.
    fn owes_a_read(&self) -> bool;
}

/// Pinned chunks that uploads are copied through. Uploads are packed into the current chunk
/// one after another, so a run of small uploads (a pointer table, a scalar) shares one chunk
/// instead of each taking a chunk of its own and soon waiting on copies queued behind all the
/// stream's work.
#[derive(Debug, Default)]
struct UploadStaging {
    chunks: Vec<StagingChunk>,
    /// The chunk being filled, and the bytes of it used since it was last taken.
    current: usize,
    used: usize,
    /// Uploads staged, and those that had to wait for a chunk's earlier copies.
    uploads: u64,
    waits: u64,
}

#[derive(Debug)]
struct StagingChunk {
    host: DropOutsideCapture<PinnedHostSlice<u8>>,
    /// Recorded after each copy that reads `host`; the chunk is free once the latest completes
    /// (stream order: the earlier copies completed before it).
    copied: CudaEvent,
}

impl UploadStaging {
    /// Where a piece of `len` bytes (at most a chunk) is staged: a chunk index and an offset,
    /// moving to the next chunk (and waiting for its earlier copies) when the current one is
    /// full. Allocates chunks on first use.
    fn place(&mut self, device: &CudaDevice, len: usize) -> Result<(usize, usize)> {
        self.uploads += 1;
        if self.chunks.is_empty() || self.used + len > UPLOAD_CHUNK_BYTES {
            if !self.chunks.is_empty() {
                self.current = (self.current + 1) % UPLOAD_CHUNKS;
            }
            if self.current == self.chunks.len() {
                // SAFETY: the pinned memory is uninitialised; it is only written (by `upload_into`)
                // before being read by a copy of exactly the written range.
                let host = outside_capture(|| unsafe { device.ctx.alloc_pinned::<u8>(UPLOAD_CHUNK_BYTES) })?;
                let copied = device.ctx.new_event(None)?;
                self.chunks.push(StagingChunk { host: DropOutsideCapture::new(host), copied });
            }
            let chunk = &self.chunks[self.current];
            if !chunk.copied.try_is_complete()? {
                self.waits += 1;
            }
            // The previous fill's copies out of this chunk must have read it.
            chunk.copied.synchronize()?;
            self.used = 0;
        }
        let offset = self.used;
        self.used = (offset + len).next_multiple_of(UPLOAD_ALIGN);
        Ok((self.current, offset))
    }
}

impl CudaDevice {
    /// Opens device `ordinal` (its primary context) with a fresh non-blocking stream.
    pub fn new(ordinal: usize) -> Result<Arc<Self>> {
        outside_capture(|| Self::open(ordinal))
    }

    fn open(ordinal: usize) -> Result<Arc<Self>> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: this turns off cudarc's per-buffer event tracking for buffers allocated through
        // this `CudaContext` handle. That tracking exists to order uses of one buffer across
        // several streams; every buffer of a `CudaDevice` is allocated, used and freed on the
        // device's single stream, where the stream itself orders all of it. It is switched off
        // before any buffer or stream exists, and also keeps event records out of graph
        // captures, which is why cudarc's own graph test does the same.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let target = read_target(&ctx)?;
        Ok(Arc::new(CudaDevice {
            ctx,
            stream,
            ordinal,
            target,
            allocations: AtomicU64::new(0),
            module_loads: AtomicU64::new(0),
            memory: Arc::default(),
            gate: Arc::default(),
            capture: Mutex::new(None),
            upload_staging: Mutex::new(UploadStaging::default()),
            download_staging: Mutex::new(None),
            copy_stream: Mutex::new(None),
            check_rings: Mutex::new(Vec::new()),
            loaded: Mutex::new(Default::default()),
        }))
    }

    /// Device ordinal this was opened with.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Marketing name, e.g. "NVIDIA H200".
    pub fn name(&self) -> &str {
        &self.target.name
    }

    /// What codegen chooses launch configurations for, read from this device's attributes.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// `(major, minor)`, e.g. `(9, 0)` on Hopper; decides which `sm_XX` to compile for.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.target.compute_capability
    }

    /// The `sm_XX` architecture string matching this device, for [`crate::CompileOptions`]: the
    /// same one codegen's [`Target::arch`] names.
    pub fn arch(&self) -> String {
        self.target.arch()
    }

    /// Largest shared memory per block a kernel can opt in to, in bytes.
    pub fn max_shared_per_block_optin(&self) -> u32 {
        self.target.shared_memory_per_block_optin
    }

    /// The underlying cudarc context, for interop with other cudarc-based code.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream all work of this device is ordered on. Work enqueued on it directly, rather than
    /// through this crate, bypasses the capture gate and may land in a graph another thread is
    /// capturing.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// How many modules have been loaded on this device.
    pub fn module_load_count(&self) -> u64 {
        self.module_loads.load(Ordering::Relaxed)
    }

    /// How many device allocations this device has made. Memory plans allocate once up front,
    /// so tests assert this does not grow per call.
    pub fn allocation_count(&self) -> u64 {
        self.allocations.load(Ordering::Relaxed)
    }

    /// Uploads staged so far (pieces of at most 8 MiB), and how many of them waited for a staging
    /// chunk's earlier copies: a host stall behind queued GPU work, which a loop that uploads a
    /// few small values a step should never see.
    pub fn upload_stats(&self) -> (u64, u64) {
        let staging = lock(&self.upload_staging);
        (staging.uploads, staging.waits)
    }

    /// Bytes held by this device's buffers now (as allocated: a zero-byte buffer holds one byte).
    pub fn memory_in_use(&self) -> u64 {
        self.memory.live()
    }

    /// The most bytes this device's buffers held at once since it was opened or since
    /// [`CudaDevice::reset_peak_memory`]: `torch.cuda.max_memory_allocated` for braze (without
    /// the caching allocator's rounding, which PyTorch's figure includes).
    pub fn peak_memory(&self) -> u64 {
        self.memory.peak()
    }

    /// Starts a new peak from the bytes in use now (`torch.cuda.reset_peak_memory_stats`).
    pub fn reset_peak_memory(&self) {
        self.memory.reset_peak();
    }

    /// Free and total device memory in bytes.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// Allocates `bytes` of uninitialised device memory (stream-ordered).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        self.gate.shared(|| {
            self.reject_during_capture("allocating device memory")?;
            // SAFETY: the memory is uninitialised; it is only exposed as `DeviceBuffer`, whose reads
            // happen on the device or through explicit downloads, never as typed Rust values
            // without a copy. A zero-byte request allocates one byte so the pointer is valid.
            let slice = unsafe { self.stream.alloc::<u8>(bytes.max(1)) }?;
            self.allocations.fetch_add(1, Ordering::Relaxed);
            let allocation = Allocation::new(slice, self.gate.clone(), self.memory.clone());
            Ok(DeviceBuffer { slice: Arc::new(allocation), len_bytes: bytes })
        })
    }

    /// Allocates `bytes` of zeroed device memory.
    pub fn alloc_zeroed(&self, bytes: usize) -> Result<DeviceBuffer> {
        let buffer = self.alloc(bytes)?;
        self.memset_d8(&buffer, 0)?;
        Ok(buffer)
    }

    /// Sets every byte of `buffer` to `value`; `0xFF` poisons float outputs with NaN so that
    /// an output a kernel forgot to write cannot pass a comparison.
    pub fn memset_d8(&self, buffer: &DeviceBuffer, value: u8) -> Result<()> {
        self.memset_d8_range(buffer, 0, buffer.len_bytes, value)
    }

    /// Fills `buffer` with copies of the element `pattern` (1, 2, 4 or 8 bytes, little-endian),
    /// on the stream: one `cuMemsetD8/D16/D32` call, or for 8-byte elements whose halves differ,
    /// one strided 32-bit memset per half. No host data of the buffer's size is made or copied.
    pub fn fill(&self, buffer: &DeviceBuffer, pattern: &[u8]) -> Result<()> {
        let width = pattern.len();
        if !matches!(width, 1 | 2 | 4 | 8) || !buffer.len_bytes.is_multiple_of(width) {
            return Err(CudaError::InvalidArgument(format!(
                "fill: a {width}-byte element does not tile a buffer of {} bytes",
                buffer.len_bytes
            )));
        }
        let count = buffer.len_bytes / width;
        let word = |bytes: &[u8]| u32::from_le_bytes(bytes.try_into().expect("4 bytes"));
        let (lo, hi) = if width == 8 { (word(&pattern[..4]), word(&pattern[4..])) } else { (0, 0) };
        if pattern.iter().all(|&b| b == pattern[0]) {
            return self.memset_d8(buffer, pattern[0]);
        }
        self.gate.shared(|| {
            let address = self.checked_range(buffer, 0, buffer.len_bytes, "fill")?;
            if count == 0 {
                return Ok(());
            }
            self.ctx.bind_to_thread()?;
            let stream = self.stream.cu_stream();
            // SAFETY: every store lies inside `buffer`'s live allocation: `count` elements of
            // `width` bytes are exactly its length (checked above), and a strided memset writes
            // 4 bytes at each of `count` rows of `width` bytes from `address` or `address + 4`;
            // the memsets are ordered on the stream with every other use of the buffer.
            unsafe {
                match width {
                    2 => driver_sys::cuMemsetD16Async(
                        address,
                        u16::from_le_bytes([pattern[0], pattern[1]]),
                        count,
                        stream,
                    )
                    .result()?,
                    4 => driver_sys::cuMemsetD32Async(address, word(pattern), count, stream).result()?,
                    8 if lo == hi => driver_sys::cuMemsetD32Async(address, lo, 2 * count, stream).result()?,
                    _ => {
                        driver_sys::cuMemsetD2D32Async(address, 8, lo, 1, count, stream).result()?;
                        driver_sys::cuMemsetD2D32Async(address + 4, 8, hi, 1, count, stream).result()?;
                    }
                }
            }
            self.note_captured_buffer(buffer);
            Ok(())
        })
    }

    /// Sets `len` bytes of `buffer` starting at `offset` to `value`.
    pub fn memset_d8_range(&self, buffer: &DeviceBuffer, offset: usize, len: usize, value: u8) -> Result<()> {
        self.gate.shared(|| {
            let address = self.checked_range(buffer, offset, len, "memset")?;
            if len == 0 {
                return Ok(());
            }
            self.ctx.bind_to_thread()?;
            // SAFETY: `address..address + len` lies inside `buffer`'s live allocation (checked
            // above), and the memset is ordered on the stream with every other use of the buffer.
            unsafe { driver_result::memset_d8_async(address, value, len, self.stream.cu_stream()) }?;
            self.note_captured_buffer(buffer);
            Ok(())
        })
    }

    /// Copies `len` bytes between device buffers (stream-ordered; may be captured in a graph).
    pub fn copy(
        &self,
        src: &DeviceBuffer,
        src_offset: usize,
        dst: &DeviceBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.gate.shared(|| {
            let from = self.checked_range(src, src_offset, len, "copy source")?;
            let to = self.checked_range(dst, dst_offset, len, "copy destination")?;
            if len == 0 {
                return Ok(());
            }
            self.ctx.bind_to_thread()?;
            // SAFETY: both ranges lie inside live allocations of this device (checked above); the
            // copy is ordered on the stream with all other uses of both buffers. Overlapping ranges
            // of one allocation are the caller's concern, as with `memcpy`.
            unsafe { driver_result::memcpy_dtod_async(to, from, len, self.stream.cu_stream()) }?;
            self.note_captured_buffer(src);
            self.note_captured_buffer(dst);
            Ok(())
        })
    }

    /// Allocates a buffer and fills it with `data`.
    pub fn upload(&self, data: &[u8]) -> Result<DeviceBuffer> {
        let buffer = self.alloc(data.len())?;
        self.upload_into(&buffer, 0, data)?;
        Ok(buffer)
    }

    /// Allocates a buffer and fills it with typed values.
    pub fn upload_values<T: PodScalar>(&self, values: &[T]) -> Result<DeviceBuffer> {
        self.upload(bytes_of(values))
    }

    /// Writes `data` into `dst` at `offset` without allocating. Asynchronous: `data` is copied
    /// into pinned staging memory and the device copy is enqueued, so the caller may reuse
    /// `data` at once. Only when more than the staging capacity (32 MiB) is in flight does this
    /// wait for the oldest staged copy to finish.
    pub fn upload_into(&self, dst: &DeviceBuffer, offset: usize, data: &[u8]) -> Result<()> {
        self.gate.shared(|| {
            self.reject_during_capture("uploading from the host")?;
            let address = self.checked_range(dst, offset, data.len(), "upload")?;
            let mut staging = lock(&self.upload_staging);
            let mut done = 0usize;
            while done < data.len() {
                let piece = &data[done..(done + UPLOAD_CHUNK_BYTES).min(data.len())];
                let (index, at) = staging.place(self, piece.len())?;
                let chunk = &mut staging.chunks[index];
                chunk.host.as_mut_slice()?[at..at + piece.len()].copy_from_slice(piece);
                let staged = &chunk.host.as_slice()?[at..at + piece.len()];
                self.ctx.bind_to_thread()?;
                // SAFETY: the destination range lies inside `dst` (checked above); the source is
                // pinned memory owned by `chunk`, which stays allocated (it lives in
                // `self.upload_staging`, and dropping the device synchronises the stream first),
                // and this range is not written again until `chunk.copied`, recorded right after
                // this copy or after a later one, has completed (`UploadStaging::place`).
                unsafe { driver_result::memcpy_htod_async(address + done as u64, staged, self.stream.cu_stream()) }?;
                chunk.copied.record(&self.stream)?;
                done += piece.len();
            }
            Ok(())
        })
    }

    /// Reads a whole buffer back to the host; waits for all work enqueued before it.
    pub fn download(&self, src: &DeviceBuffer) -> Result<Vec<u8>> {
        let mut out = vec![0u8; src.len_bytes];
        self.download_into(src, 0, &mut out)?;
        Ok(out)
    }

    /// Reads a whole buffer back as typed values (trailing partial values are dropped).
    pub fn download_values<T: PodScalar>(&self, src: &DeviceBuffer) -> Result<Vec<T>> {
        Ok(values_from_bytes(&self.download(src)?))
    }

    /// Reads `out.len()` bytes of `src` starting at `offset` into `out`, through pinned memory.
    ///
    /// A host synchronization: an index out of range that an earlier run of a plan, enqueued on
    /// this device by this thread, met is reported here ([`CudaError::IndexOutOfRange`], after `out` was filled) unless a
    /// call before already reported it (see [`CudaDevice::poll_checks`]).
    pub fn download_into(&self, src: &DeviceBuffer, offset: usize, out: &mut [u8]) -> Result<()> {
        self.download_waiting(src, offset, out)?;
        self.poll_checks()
    }

    fn download_waiting(&self, src: &DeviceBuffer, offset: usize, out: &mut [u8]) -> Result<()> {
        self.gate.shared(|| {
            self.reject_during_capture("downloading to the host")?;
            let address = self.checked_range(src, offset, out.len(), "download")?;
            if out.is_empty() {
                return Ok(());
            }
            let mut staging = lock(&self.download_staging);
            let wanted = out.len().min(DOWNLOAD_STAGING_MAX_BYTES);
            if staging.as_ref().is_none_or(|host| host.len() < wanted) {
                *staging = None;
                // SAFETY: uninitialised pinned memory, only read after a copy has filled the part
                // that is read. Flags 0 (not write-combined) keep host reads of it fast.
                let host = outside_capture(|| unsafe { self.ctx.alloc_pinned_with_flags::<u8>(wanted, 0) })?;
                *staging = Some(DropOutsideCapture::new(host));
            }
            let host = staging.as_mut().expect("staging buffer allocated above");
            for (index, piece) in out.chunks_mut(host.len()).enumerate() {
                let piece_offset = (index * host.len()) as u64;
                let landing = &mut host.as_mut_slice()?[..piece.len()];
                self.ctx.bind_to_thread()?;
                // SAFETY: the source range lies inside `src` (checked above); the destination is
                // pinned memory of exactly `piece.len()` bytes, exclusively borrowed here, and the
                // stream is synchronised before it is read or reused.
                unsafe { driver_result::memcpy_dtoh_async(landing, address + piece_offset, self.stream.cu_stream()) }?;
                self.stream.synchronize()?;
                piece.copy_from_slice(&host.as_slice()?[..piece.len()]);
            }
            Ok(())
        })
    }

    /// Waits until all work enqueued on the device's stream has finished, and reports any
    /// asynchronous error it raised (e.g. an illegal address in an earlier kernel), or else an
    /// index out of range that an earlier run of a plan, enqueued by this thread, met and no call
    /// reported yet
    /// ([`CudaDevice::poll_checks`]).
    pub fn synchronize(&self) -> Result<()> {
        self.gate.shared(|| -> Result<()> {
            self.reject_during_capture("synchronizing")?;
            self.stream.synchronize()?;
            self.ctx.check_err()?;
            Ok(())
        })?;
        self.poll_checks()
    }

    /// A pair of timing events on this device's stream.
    pub fn event_timer(&self) -> Result<EventTimer> {
        let timing = Some(driver_sys::CUevent_flags::CU_EVENT_DEFAULT);
        Ok(EventTimer {
            start: self.ctx.new_event(timing)?,
            end: self.ctx.new_event(timing)?,
            stream: self.stream.clone(),
            gate: self.gate.clone(),
        })
    }

    /// GPU time, in milliseconds, of the work `enqueue` puts on the stream (waits for it).
    pub fn time_ms(&self, enqueue: impl FnOnce() -> Result<()>) -> Result<f32> {
        self.gate.shared(|| {
            self.reject_during_capture("timing")?;
            let timer = self.event_timer()?;
            timer.start()?;
            enqueue()?;
            timer.stop()?;
            timer.elapsed_ms()
        })
    }

    pub(crate) fn checked_range(&self, buffer: &DeviceBuffer, offset: usize, len: usize, what: &str) -> Result<u64> {
        if buffer.cu_context() != self.ctx.cu_ctx() {
            return Err(CudaError::InvalidArgument(format!("{what}: buffer belongs to another device")));
        }
        buffer.address_of_range(offset, len).ok_or_else(|| {
            CudaError::InvalidArgument(format!(
                "{what}: bytes {offset}..{offset}+{len} out of range for a buffer of {} bytes",
                buffer.len_bytes
            ))
        })
    }

    pub(crate) fn is_capturing(&self) -> bool {
        lock(&self.capture).is_some()
    }

    pub(crate) fn reject_during_capture(&self, what: &str) -> Result<()> {
        if self.is_capturing() {
            return Err(CudaError::Capture(format!("{what} is not allowed while a CUDA graph is being captured")));
        }
        Ok(())
    }

    /// Keeps `buffer` alive for as long as the graph being captured (if any) exists.
    pub(crate) fn note_captured_buffer(&self, buffer: &DeviceBuffer) {
        if let Some(record) = lock(&self.capture).as_mut() {
            record.keep_buffer(buffer);
        }
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Staged uploads may still be reading pinned memory that is freed with the fields.
        self.ctx.record_err(self.stream.synchronize());
        if let Some(copy) = lock(&self.copy_stream).as_ref() {
            self.ctx.record_err(copy.synchronize());
        }
    }
}

/// Measures GPU time between two points of the device's stream.
#[derive(Debug)]
pub struct EventTimer {
    start: CudaEvent,
    end: CudaEvent,
    stream: Arc<CudaStream>,
    gate: Arc<StreamGate>,
}

impl EventTimer {
    /// Marks the start point (enqueued, does not wait).
    pub fn start(&self) -> Result<()> {
        Ok(self.gate.shared(|| self.start.record(&self.stream))?)
    }

    /// Marks the end point (enqueued, does not wait).
    pub fn stop(&self) -> Result<()> {
        Ok(self.gate.shared(|| self.end.record(&self.stream))?)
    }

    /// Milliseconds between start and stop; waits for the stop point to be reached.
    pub fn elapsed_ms(&self) -> Result<f32> {
        Ok(self.start.elapsed_ms(&self.end)?)
    }
}

/// What a capture in progress has referenced, so the graph can keep it alive.
#[derive(Debug, Default)]
pub(crate) struct CaptureRecord {
    buffers: Vec<DeviceBuffer>,
    kernels: Vec<Kernel>,
}

impl CaptureRecord {
    pub(crate) fn into_parts(self) -> (Vec<DeviceBuffer>, Vec<Kernel>) {
        (self.buffers, self.kernels)
    }

    pub(crate) fn keep_buffer(&mut self, buffer: &DeviceBuffer) {
        if !self.buffers.iter().any(|kept| kept.same_allocation(buffer)) {
            self.buffers.push(buffer.clone());
        }
    }

    pub(crate) fn keep_kernel(&mut self, kernel: &Kernel) {
        self.kernels.push(kernel.clone());
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here leaves its data consistent at each step, so a panic in
    // another holder does not make the data unusable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
