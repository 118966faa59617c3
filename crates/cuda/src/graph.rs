//! CUDA graph capture and replay: record a sequence of launches once, then submit the whole
//! sequence with one driver call, removing per-launch CPU overhead.

use std::cell::Cell;
use std::sync::{Arc, PoisonError, RwLock};

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;

use crate::buffer::DeviceBuffer;
use crate::device::{lock, CudaDevice};
use crate::error::{CudaError, Result};
use crate::launch::Kernel;

/// Serialises captures against operations on other threads that can invalidate a capture in the
/// same context: allocating or freeing pinned host memory, loading or unloading modules,
/// creating or destroying cuBLASLt handles, opening or closing a device. Those hold it shared
/// (through [`outside_capture`]); a capture holds it exclusively for its (short) duration.
static CAPTURE_GATE: RwLock<()> = RwLock::new(());

thread_local! {
    /// Whether this thread is inside `capture_graph`'s closure. Such operations issued by the
    /// capturing thread itself skip the gate (they would otherwise deadlock); the capture then
    /// reports them as failed instead.
    static CAPTURING_ON_THIS_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Runs `operation` while no CUDA graph capture is in progress on another thread.
pub(crate) fn outside_capture<R>(operation: impl FnOnce() -> R) -> R {
    if CAPTURING_ON_THIS_THREAD.get() {
        return operation();
    }
    let _shared = CAPTURE_GATE.read().unwrap_or_else(PoisonError::into_inner);
    operation()
}

/// Owns a value whose destruction must not overlap a capture on another thread (see
/// [`outside_capture`]); the value is dropped through the gate.
#[derive(Debug)]
pub(crate) struct DropOutsideCapture<T>(Option<T>);

impl<T> DropOutsideCapture<T> {
    pub(crate) fn new(value: T) -> Self {
        DropOutsideCapture(Some(value))
    }
}

impl<T> std::ops::Deref for DropOutsideCapture<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("present until dropped")
    }
}

impl<T> std::ops::DerefMut for DropOutsideCapture<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0.as_mut().expect("present until dropped")
    }
}

impl<T> Drop for DropOutsideCapture<T> {
    fn drop(&mut self) {
        if let Some(value) = self.0.take() {
            outside_capture(|| drop(value));
        }
    }
}

/// Marks the current thread as capturing until dropped (also on panic).
struct CapturingHere;

impl CapturingHere {
    fn enter() -> Self {
        CAPTURING_ON_THIS_THREAD.set(true);
        CapturingHere
    }
}

impl Drop for CapturingHere {
    fn drop(&mut self) {
        CAPTURING_ON_THIS_THREAD.set(false);
    }
}

/// What a capture in progress has referenced, so the graph can keep it alive.
#[derive(Debug, Default)]
pub(crate) struct CaptureRecord {
    buffers: Vec<DeviceBuffer>,
    kernels: Vec<Kernel>,
}

impl CaptureRecord {
    pub(crate) fn keep_buffer(&mut self, buffer: &DeviceBuffer) {
        if !self.buffers.iter().any(|kept| kept.same_allocation(buffer)) {
            self.buffers.push(buffer.clone());
        }
    }

    pub(crate) fn keep_kernel(&mut self, kernel: &Kernel) {
        self.kernels.push(kernel.clone());
    }
}

/// A captured, instantiated graph. It holds the buffers and kernels it references, so they
/// stay valid for every replay even if the caller drops its own handles.
///
/// `Send` but not `Sync`: CUDA graph objects may move between threads but must not be used from
/// several threads at once.
pub struct CapturedGraph {
    graph: CudaGraph,
    device: Arc<CudaDevice>,
    buffers: Vec<DeviceBuffer>,
    kernels: Vec<Kernel>,
}

// SAFETY: the driver allows a graph and its executable instance to be used from any thread as
// long as no two calls on them run at once. `CapturedGraph` is not `Sync`, so a shared reference
// never reaches two threads; moving it to another thread (as an executable behind a mutex does)
// keeps every use exclusive. The buffers and kernels it holds are `Send` already.
unsafe impl Send for CapturedGraph {}

impl std::fmt::Debug for CapturedGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapturedGraph")
            .field("buffers", &self.buffers.len())
            .field("kernels", &self.kernels.len())
            .finish()
    }
}

impl CapturedGraph {
    /// Enqueues one replay of the whole graph on the device's stream (does not wait).
    pub fn replay(&self) -> Result<()> {
        self.graph.launch()?;
        Ok(())
    }

    /// Uploads the graph to the device ahead of the first replay, so that replay is not slower.
    pub fn prepare(&self) -> Result<()> {
        self.graph.upload()?;
        Ok(())
    }

    /// The device the graph replays on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// Distinct allocations the graph keeps alive.
    pub fn retained_buffers(&self) -> usize {
        self.buffers.len()
    }

    /// Kernel launches recorded in the graph.
    pub fn kernel_launches(&self) -> usize {
        self.kernels.len()
    }
}

impl CudaDevice {
    /// Captures the work `record` enqueues on this device into a CUDA graph, without running
    /// it. Inside `record`, launches, memsets, device copies and cuBLASLt matmuls are allowed;
    /// allocation, uploads, downloads, synchronisation and timing are rejected with
    /// [`CudaError::Capture`], since a graph cannot replay them correctly. Capture is
    /// thread-local, and operations of this crate on other threads that could invalidate it
    /// (pinned memory, module and cuBLASLt handle lifetimes, opening and closing devices) wait
    /// until it ends; other threads should not enqueue work on this device meanwhile.
    pub fn capture_graph(self: &Arc<Self>, record: impl FnOnce() -> Result<()>) -> Result<CapturedGraph> {
        if CAPTURING_ON_THIS_THREAD.get() {
            return Err(CudaError::Capture("a capture is already in progress on this thread".into()));
        }
        let _exclusive = CAPTURE_GATE.write().unwrap_or_else(PoisonError::into_inner);
        {
            let mut state = lock(&self.capture);
            if state.is_some() {
                return Err(CudaError::Capture("a capture is already in progress on this device".into()));
            }
            *state = Some(CaptureRecord::default());
        }
        if let Err(err) = self.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) {
            *lock(&self.capture) = None;
            return Err(err.into());
        }

        let recorded = {
            let _capturing = CapturingHere::enter();
            record()
        };
        // The capture must end on every path, or the stream stays unusable.
        let ended = self.stream.end_capture(CUgraphInstantiate_flags(0));
        let kept = lock(&self.capture).take().unwrap_or_default();

        recorded?;
        let graph = ended
            .map_err(|err| CudaError::Capture(format!("ending the capture failed: {err}")))?
            .ok_or_else(|| CudaError::Capture("the capture produced no graph".into()))?;
        Ok(CapturedGraph { graph, device: self.clone(), buffers: kept.buffers, kernels: kept.kernels })
    }
}
