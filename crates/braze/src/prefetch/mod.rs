//! Keeping the GPU fed: batches copied host-to-device from pinned memory on a second stream
//! while the current step runs ([`Prefetcher`]), the pinned buffers they go through
//! ([`PinnedPool`]), and the report of pageable copies that cannot overlap anything.
//!
//! A [`Prefetcher`] is double-buffered: when it hands out batch N it has already made the compute
//! stream wait for batch N's copy (an event, enqueued: the host does not wait) and enqueues the
//! copy of batch N+1 on the copy stream, which runs while step N computes. The tensors it hands
//! out are ordinary device tensors: a compiled step reads them where they are, with no copy.
//!
//! On the CPU backend the copy stream is a worker thread copying out of the stand-in pinned
//! buffers, so the order of batches, the reuse of buffers and the overlap show on a timeline
//! without a GPU.

mod pool;

pub use pool::{PinnedBuffer, PinnedPool};

use crate::cuda::CudaTensor;
use crate::logging::targets;
use crate::timeline::{self, Track};
use crate::{Device, Error, Result, Tensor};
use braze_ir::{DType, HostTensor, Shape, SourceLoc};
use pool::{BufferInner, SharedPool};
use std::cell::Cell;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

thread_local! {
    static PAGEABLE: Cell<u64> = const { Cell::new(0) };
}

/// Host-to-device copies from pageable memory on this thread so far (`to_device` of a host
/// tensor onto a GPU). Each is staged by the driver and cannot overlap compute; a
/// [`Prefetcher`] copies from pinned memory instead.
pub fn pageable_copy_count() -> u64 {
    PAGEABLE.with(Cell::get)
}

/// Counts and reports (`BRAZE_LOG=syncs`) a pageable host-to-device copy of `bytes` at `loc`.
pub(crate) fn report_pageable_copy(bytes: usize, loc: &SourceLoc) {
    PAGEABLE.with(|count| count.set(count.get() + 1));
    crate::logging::init();
    tracing::debug!(
        target: targets::SYNCS,
        bytes,
        location = %loc,
        "pageable host-to-device copy of {bytes} B at {loc}: it cannot overlap compute; hint: \
         braze::Prefetcher copies batches from pinned memory on a copy stream"
    );
}

/// One batch of host tensors from a prefetcher's source: owned, or shared with the source (an
/// `Arc`, so a source that cycles over batches it prepared hands them out without copying them;
/// a prefetcher only reads a batch, into pinned memory).
pub enum Batch {
    Owned(Vec<HostTensor>),
    Shared(Arc<Vec<HostTensor>>),
}

impl Batch {
    fn tensors(&self) -> &[HostTensor] {
        match self {
            Batch::Owned(tensors) => tensors,
            Batch::Shared(tensors) => tensors,
        }
    }
}

/// What a prefetcher's source yields: one batch of host tensors.
pub trait IntoBatch {
    fn into_batch(self) -> Result<Batch>;
}

impl IntoBatch for Vec<HostTensor> {
    fn into_batch(self) -> Result<Batch> {
        Ok(Batch::Owned(self))
    }
}

impl IntoBatch for Result<Vec<HostTensor>> {
    fn into_batch(self) -> Result<Batch> {
        self.map(Batch::Owned)
    }
}

impl IntoBatch for Arc<Vec<HostTensor>> {
    fn into_batch(self) -> Result<Batch> {
        Ok(Batch::Shared(self))
    }
}

/// A data-loading adapter: yields the batches of `source` as tensors on `device`, each copied
/// from pinned memory on the copy stream while the previous step runs (see the module docs).
pub struct Prefetcher<I> {
    source: I,
    device: Device,
    pool: SharedPool,
    engine: CopyEngine,
    in_flight: Option<InFlight>,
    started: bool,
    next_index: u64,
    /// The source's (or a copy's) error met while starting the next batch, handed out after the
    /// batch before it.
    deferred: Option<Error>,
}

enum CopyEngine {
    /// The CPU backend's copy stream: a worker thread.
    Cpu { jobs: Option<Sender<CpuCopy>>, worker: Option<JoinHandle<()>> },
    Cuda {
        ordinal: usize,
        device: Arc<braze_cuda::CudaDevice>,
        /// Device buffers of batches handed out, taken again for a later batch once nothing else
        /// holds them: a loop's batches land at the same few addresses, so a step replayed as a
        /// CUDA graph finds a graph for them instead of capturing one per new address.
        landed: Vec<braze_cuda::DeviceBuffer>,
    },
}

/// Device buffers a prefetcher keeps for reuse, per tensor of a batch: a batch in flight, the one
/// handed out, one the step may still hold, and one to spare.
const LANDED_PER_TENSOR: usize = 4;

/// One tensor's copy on the CPU worker.
struct CpuCopy {
    name: String,
    dtype: DType,
    shape: Shape,
    staged: PinnedBuffer,
    done: Sender<Result<HostTensor>>,
}

struct InFlight {
    tensors: Vec<InFlightTensor>,
}

enum InFlightTensor {
    Cpu(Receiver<Result<HostTensor>>),
    Cuda { tensor: Tensor, copied: braze_cuda::StreamMark },
}

impl<I, B> Prefetcher<I>
where
    I: Iterator<Item = B>,
    B: IntoBatch,
{
    /// Prefetches the batches of `source` onto `device`, through a pinned pool of its own.
    pub fn new(device: Device, source: impl IntoIterator<IntoIter = I>) -> Result<Prefetcher<I>> {
        Self::with_pool(Arc::new(PinnedPool::new(device)?), source)
    }

    /// As [`Prefetcher::new`], through `pool` (whose device the batches go to).
    pub fn with_pool(pool: Arc<PinnedPool>, source: impl IntoIterator<IntoIter = I>) -> Result<Prefetcher<I>> {
        let device = pool.device();
        let engine = match device {
            Device::Cpu => {
                let (jobs, queue) = mpsc::channel::<CpuCopy>();
                let copies_pool = pool.clone();
                let worker = std::thread::Builder::new()
                    .name("braze-copy".into())
                    .spawn(move || cpu_copy_stream(queue, copies_pool))
                    .map_err(|e| Error::InvalidArgument {
                        op: "Prefetcher::new".into(),
                        loc: None,
                        detail: format!("cannot start the copy thread: {e}"),
                    })?;
                CopyEngine::Cpu { jobs: Some(jobs), worker: Some(worker) }
            }
            Device::Cuda(ordinal) => CopyEngine::Cuda {
                ordinal,
                device: crate::cuda::device(ordinal, "Prefetcher::new")?,
                landed: Vec::new(),
            },
        };
        Ok(Prefetcher {
            source: source.into_iter(),
            device,
            pool,
            engine,
            in_flight: None,
            started: false,
            next_index: 0,
            deferred: None,
        })
    }

    /// The pinned pool the batches are staged in.
    pub fn pool(&self) -> &Arc<PinnedPool> {
        &self.pool
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// Stages the next batch of the source in pinned memory and enqueues its copies.
    fn start_next(&mut self) -> Result<Option<InFlight>> {
        let Some(batch) = self.source.next() else { return Ok(None) };
        let batch = batch.into_batch()?;
        let index = self.next_index;
        self.next_index += 1;
        let _span = timeline::host_span("copy", || format!("stage batch {index}"), None);
        let mut tensors = Vec::with_capacity(batch.tensors().len());
        let per_batch = batch.tensors().len();
        for (t, host) in batch.tensors().iter().enumerate() {
            let bytes = host.byte_len();
            let mut staged = self.pool.take(bytes)?;
            host.write_bytes(staged.as_mut_bytes()?);
            match &mut self.engine {
                CopyEngine::Cpu { jobs, .. } => {
                    let (done, result) = mpsc::channel();
                    let (dtype, shape) = (host.dtype(), host.shape().clone());
                    let job = CpuCopy { name: format!("copy batch {index} tensor {t}"), dtype, shape, staged, done };
                    jobs.as_ref().and_then(|jobs| jobs.send(job).ok()).ok_or_else(copy_thread_gone)?;
                    tensors.push(InFlightTensor::Cpu(result));
                }
                CopyEngine::Cuda { ordinal, device, landed } => {
                    let cuda = |e| Error::cuda("Prefetcher", e);
                    // A buffer no one else holds has no work left to enqueue on it, and the copy
                    // waits for the work already enqueued: it may land the next batch.
                    let free = landed.iter().position(|b| b.len_bytes() == bytes && b.is_only_handle());
                    let buffer = match free {
                        Some(i) => landed.remove(i),
                        None => device.alloc(bytes).map_err(cuda)?,
                    };
                    landed.push(buffer.clone());
                    if landed.len() > LANDED_PER_TENSOR * per_batch {
                        landed.remove(0);
                    }
                    let BufferInner::Cuda(pinned) = &staged.inner else {
                        unreachable!("a GPU pool stages in pinned memory")
                    };
                    let recording = timeline::is_recording();
                    if recording {
                        timeline::prepare_device(*ordinal, device)?;
                    }
                    let mut spans = Vec::new();
                    let copied =
                        device.upload_pinned_async(pinned, &buffer, recording.then_some(&mut spans)).map_err(cuda)?;
                    timeline::gpu_spans(*ordinal, spans)?;
                    self.pool.give_back(staged);
                    let tensor = Tensor::from_cuda(CudaTensor {
                        buffer,
                        dtype: host.dtype(),
                        shape: host.shape().clone(),
                        ordinal: *ordinal,
                    });
                    tensors.push(InFlightTensor::Cuda { tensor, copied });
                }
            }
        }
        Ok(Some(InFlight { tensors }))
    }

    /// The tensors of a batch whose copies were enqueued: on a GPU the compute stream is made to
    /// wait for them (the host does not); on the CPU this waits for the copy thread.
    fn finish(&self, batch: InFlight) -> Result<Vec<Tensor>> {
        batch
            .tensors
            .into_iter()
            .map(|t| match t {
                InFlightTensor::Cpu(result) => Ok(Tensor::from_host(result.recv().map_err(|_| copy_thread_gone())??)),
                InFlightTensor::Cuda { tensor, copied } => {
                    let CopyEngine::Cuda { device, .. } = &self.engine else {
                        unreachable!("GPU copies on a GPU engine")
                    };
                    device.wait_for(copied).map_err(|e| Error::cuda("Prefetcher", e))?;
                    Ok(tensor)
                }
            })
            .collect()
    }
}

fn copy_thread_gone() -> Error {
    Error::InvalidArgument { op: "Prefetcher".into(), loc: None, detail: "the copy thread stopped".into() }
}

/// The CPU backend's copy stream: copies each staged tensor out of its stand-in pinned buffer
/// into the tensor handed out, in order, then returns the buffer to the pool.
fn cpu_copy_stream(queue: Receiver<CpuCopy>, pool: SharedPool) {
    for job in queue {
        let started = Instant::now();
        let copied = match &job.staged.inner {
            BufferInner::Cpu { bytes, len } => HostTensor::from_bytes(job.dtype, job.shape, &bytes[..*len])
                .map_err(|e| Error::InvalidArgument { op: "Prefetcher".into(), loc: None, detail: e.to_string() }),
            BufferInner::Cuda(_) => unreachable!("a CPU pool stages in host memory"),
        };
        if timeline::is_recording() {
            timeline::device_span(Track::Copy, "copy", job.name, started, Instant::now());
        }
        pool.give_back(job.staged);
        let _ = job.done.send(copied);
    }
}

impl<I, B> Iterator for Prefetcher<I>
where
    I: Iterator<Item = B>,
    B: IntoBatch,
{
    type Item = Result<Vec<Tensor>>;

    /// Batch N, ready for the compute stream, after enqueueing the copy of batch N+1. An error
    /// reading or staging a batch is handed out in that batch's place.
    fn next(&mut self) -> Option<Result<Vec<Tensor>>> {
        if let Some(error) = self.deferred.take() {
            return Some(Err(error));
        }
        if !self.started {
            self.started = true;
            match self.start_next() {
                Ok(first) => self.in_flight = first,
                Err(e) => return Some(Err(e)),
            }
        }
        let current = self.in_flight.take()?;
        let batch = match self.finish(current) {
            Ok(batch) => batch,
            Err(e) => return Some(Err(e)),
        };
        match self.start_next() {
            Ok(next) => self.in_flight = next,
            Err(e) => self.deferred = Some(e),
        }
        Some(Ok(batch))
    }
}

impl<I> Drop for Prefetcher<I> {
    fn drop(&mut self) {
        if let CopyEngine::Cpu { jobs, worker } = &mut self.engine {
            drop(jobs.take());
            if let Some(worker) = worker.take() {
                let _ = worker.join();
            }
        }
    }
}
