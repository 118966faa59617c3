//! GPU spans for a timeline: timing events recorded around work on a stream without waiting,
//! read once they have completed, and placed on the host clock through an anchor event.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};

use crate::capture_gate::StreamGate;
use crate::device::CudaDevice;
use crate::error::Result;

/// Which of the device's streams a span's work ran on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SpanStream {
    /// The stream kernels, cuBLASLt calls and graph replays run on.
    Compute,
    /// The second stream of pinned host-to-device copies.
    Copy,
}

/// A span of GPU work whose start and end events are recorded on a stream and not yet read.
#[derive(Debug)]
pub struct PendingSpan {
    pub name: String,
    /// `kernel`, `matmul`, `graph`, `copy`, ...
    pub category: &'static str,
    pub stream: SpanStream,
    start: CudaEvent,
    end: CudaEvent,
    on: Arc<CudaStream>,
    gate: Arc<StreamGate>,
}

impl PendingSpan {
    /// Marks the end of the span's work (enqueued, does not wait).
    pub fn end(&self) -> Result<()> {
        Ok(self.gate.shared(|| self.end.record(&self.on))?)
    }

    /// Whether the span's work has finished (no waiting).
    pub fn is_complete(&self) -> Result<bool> {
        Ok(self.end.try_is_complete()?)
    }
}

impl CudaDevice {
    /// Starts a span of the work enqueued next on `stream` (enqueued, does not wait); end it
    /// with [`PendingSpan::end`] after that work.
    pub fn begin_span(
        &self,
        name: impl Into<String>,
        category: &'static str,
        stream: SpanStream,
    ) -> Result<PendingSpan> {
        let on = match stream {
            SpanStream::Compute => self.stream.clone(),
            SpanStream::Copy => self.copy_stream()?,
        };
        let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let span = PendingSpan {
            name: name.into(),
            category,
            stream,
            start: self.ctx.new_event(timing)?,
            end: self.ctx.new_event(timing)?,
            on,
            gate: self.gate.clone(),
        };
        self.gate.shared(|| span.start.record(&span.on))?;
        Ok(span)
    }
}

/// Places GPU events on the host clock: an anchor event recorded on the compute stream and
/// waited for once, when the clock is made, with the host time it completed at. Each span is
/// then the anchor's host time plus the GPU time from the anchor to its events.
#[derive(Debug)]
pub struct DeviceClock {
    anchor: CudaEvent,
    host: Instant,
}

impl DeviceClock {
    /// Waits for the device's queued work once (the anchor).
    pub fn new(device: &CudaDevice) -> Result<DeviceClock> {
        let anchor = device.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        device.gate.shared(|| anchor.record(&device.stream))?;
        anchor.synchronize()?;
        Ok(DeviceClock { anchor, host: Instant::now() })
    }

    /// When a completed span started and ended on the host clock (waits if it has not completed).
    pub fn host_interval(&self, span: &PendingSpan) -> Result<(Instant, Instant)> {
        let at = |event: &CudaEvent| -> Result<Instant> {
            let ms = self.anchor.elapsed_ms(event)?;
            Ok(self.host + Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
        };
        let start = at(&span.start)?;
        Ok((start, at(&span.end)?.max(start)))
    }
}
