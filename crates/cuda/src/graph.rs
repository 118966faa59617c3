//! CUDA graph capture and replay: record a sequence of launches once, then submit the whole
//! sequence with one driver call, removing per-launch CPU overhead.

use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;

use crate::buffer::DeviceBuffer;
use crate::capture_gate::DropOutsideCapture;
use crate::device::{lock, CaptureRecord, CudaDevice};
use crate::error::{CudaError, Result};
use crate::kernel::Kernel;

/// A captured, instantiated graph. It holds the buffers and kernels it references, so they
/// stay valid for every replay even if the caller drops its own handles; except the inputs of
/// [`CudaDevice::capture_graph_reading`], which each replay is given again and checked against.
///
/// `Send` but not `Sync`: CUDA graph objects may move between threads but must not be used from
/// several threads at once.
pub struct CapturedGraph {
    /// Destroying it is a context-wide call, kept out of other threads' captures.
    graph: DropOutsideCapture<CudaGraph>,
    device: Arc<CudaDevice>,
    buffers: Vec<DeviceBuffer>,
    kernels: Vec<Kernel>,
    /// The address and length of each input the graph reads without holding it.
    inputs: Vec<(u64, usize)>,
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
    /// Enqueues one replay of the whole graph on the device's stream (does not wait). A graph
    /// captured with inputs it does not hold replays only through [`CapturedGraph::replay_reading`].
    pub fn replay(&self) -> Result<()> {
        if !self.inputs.is_empty() {
            return Err(CudaError::InvalidArgument(format!(
                "the graph reads {} inputs it does not hold: replay it with them",
                self.inputs.len()
            )));
        }
        self.device.gate.shared(|| self.graph.launch())?;
        Ok(())
    }

    /// Enqueues one replay on `inputs`, which must lie at the addresses and have the lengths of
    /// the inputs the graph was captured reading (its kernels have those addresses baked in).
    pub fn replay_reading(&self, inputs: &[DeviceBuffer]) -> Result<()> {
        let matches =
            inputs.len() == self.inputs.len() && inputs.iter().zip(&self.inputs).all(|(b, &at)| placement(b) == at);
        if !matches {
            let given: Vec<(u64, usize)> = inputs.iter().map(placement).collect();
            return Err(CudaError::InvalidArgument(format!(
                "the graph was captured reading inputs at {:x?}, given {:x?}",
                self.inputs, given
            )));
        }
        self.device.gate.shared(|| self.graph.launch())?;
        Ok(())
    }

    /// Uploads the graph to the device ahead of the first replay, so that replay is not slower.
    pub fn prepare(&self) -> Result<()> {
        self.device.gate.shared(|| self.graph.upload())?;
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
    /// [`CudaError::Capture`], since a graph cannot replay them correctly. Buffers and modules
    /// that `record` drops are freed after the capture. Other threads may keep using this device
    /// meanwhile: their operations on it (and context-wide calls such as loading modules) wait
    /// until the capture ends, so nothing of theirs is recorded into the graph (see
    /// `capture_gate`). A capture cannot start on a thread that is already capturing, nor from
    /// inside another operation of this crate (such as [`CudaDevice::time_ms`]'s closure).
    pub fn capture_graph(self: &Arc<Self>, record: impl FnOnce() -> Result<()>) -> Result<CapturedGraph> {
        self.capture_graph_reading(&[], record)
    }

    /// As [`CudaDevice::capture_graph`], except that the graph does not keep `inputs` alive:
    /// it replays only through [`CapturedGraph::replay_reading`], given buffers at the same
    /// addresses. A caller whose inputs change from call to call (prefetched batches) can then
    /// free or reuse them while the graph lives.
    pub fn capture_graph_reading(
        self: &Arc<Self>,
        inputs: &[DeviceBuffer],
        record: impl FnOnce() -> Result<()>,
    ) -> Result<CapturedGraph> {
        self.gate
            .exclusive(|| self.capture_exclusively(inputs, record))
            .map_err(|reason| CudaError::Capture(reason.to_string()))?
    }

    /// [`CudaDevice::capture_graph_reading`] with the stream and the context to itself.
    fn capture_exclusively(
        self: &Arc<Self>,
        inputs: &[DeviceBuffer],
        record: impl FnOnce() -> Result<()>,
    ) -> Result<CapturedGraph> {
        *lock(&self.capture) = Some(CaptureRecord::default());
        // Thread-local mode: only this thread is barred from calls unsafe during a capture;
        // other threads stay free to work on other streams.
        if let Err(err) = self.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) {
            *lock(&self.capture) = None;
            return Err(err.into());
        }
        let recorded = record();
        // The capture must end on every path, or the stream stays unusable.
        let ended = self.stream.end_capture(CUgraphInstantiate_flags(0));
        let kept = lock(&self.capture).take().unwrap_or_default();

        recorded?;
        let graph = ended
            .map_err(|err| CudaError::Capture(format!("ending the capture failed: {err}")))?
            .ok_or_else(|| CudaError::Capture("the capture produced no graph".into()))?;
        let (mut buffers, kernels) = kept.into_parts();
        buffers.retain(|b| !inputs.iter().any(|input| input.same_allocation(b)));
        let inputs = inputs.iter().map(placement).collect();
        Ok(CapturedGraph { graph: DropOutsideCapture::new(graph), device: self.clone(), buffers, kernels, inputs })
    }
}

/// Where a buffer lies: its address and length, what a graph reading it has baked in.
fn placement(buffer: &DeviceBuffer) -> (u64, usize) {
    (buffer.device_address(), buffer.len_bytes())
}
