//! A timeline of host and device work on one time axis, written as a Chrome/Perfetto trace.
//!
//! `BRAZE_TRACE=trace.json` starts a recording when braze is first used; [`finish`] (which the
//! `braze` CLI calls before it exits) writes the trace and prints its [`Summary`] on stderr: GPU
//! busy % over the steps and the largest gaps, with what the host was doing in each.
//! [`start`]/[`stop`] record into memory instead.
//!
//! Host spans: each compiled call, trace and compile, each host synchronization (named by its
//! op and `file:line:col`), data copies, and the program's own [`span`]s and [`step`]s. Device
//! spans: on a GPU each kernel (or each CUDA graph replay) and each copy on the copy stream, from
//! CUDA events recorded around them and read once they completed (recording never waits for
//! the GPU, except once per device for the clock's anchor); on the CPU backend the CPU
//! executor's kernel runs, so the same program shows its timeline without a GPU.

mod chrome;
mod summary;

pub use chrome::Trace;
pub use summary::{Gap, Summary};

use crate::{Error, Result};
use braze_cuda::{CudaDevice, DeviceClock, PendingSpan, SpanStream};
use std::cell::Cell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::Instant;

/// Where a span ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Track {
    /// A host thread (numbered from 1 in the order threads first recorded a span).
    Host(u64),
    /// The device's compute stream (on the CPU backend: the CPU executor's kernel runs).
    Compute,
    /// The device's copy stream (prefetched host-to-device copies).
    Copy,
}

/// One span of a timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub name: String,
    /// `call`, `trace`, `compile`, `sync`, `copy`, `step`, `user`; `kernel` families, `eager`,
    /// `graph` and `copy` on the device.
    pub category: String,
    pub track: Track,
    /// Microseconds from the start of the recording.
    pub start_us: f64,
    pub dur_us: f64,
    /// Where it came from (`file:line:col` of a sync), or sizes.
    pub detail: Option<String>,
}

impl Span {
    pub fn end_us(&self) -> f64 {
        self.start_us + self.dur_us
    }
}

struct Recorder {
    epoch: Instant,
    spans: Vec<Span>,
    /// GPU spans whose events have not been read yet, by device ordinal.
    pending: Vec<(usize, PendingSpan)>,
    clocks: HashMap<usize, DeviceClock>,
    /// Where [`finish`] writes the trace (from `BRAZE_TRACE`).
    path: Option<PathBuf>,
}

static RECORDING: AtomicBool = AtomicBool::new(false);
static RECORDER: Mutex<Option<Recorder>> = Mutex::new(None);
static FROM_ENV: Once = Once::new();

fn recorder() -> MutexGuard<'static, Option<Recorder>> {
    RECORDER.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn begin(path: Option<PathBuf>) {
    *recorder() =
        Some(Recorder { epoch: Instant::now(), spans: Vec::new(), pending: Vec::new(), clocks: HashMap::new(), path });
    RECORDING.store(true, Ordering::Release);
}

/// Whether a timeline is being recorded (starting the `BRAZE_TRACE` recording on first use).
pub fn is_recording() -> bool {
    FROM_ENV.call_once(|| {
        if let Some(path) = std::env::var_os("BRAZE_TRACE").filter(|p| !p.is_empty()) {
            begin(Some(PathBuf::from(path)));
        }
    });
    RECORDING.load(Ordering::Acquire)
}

/// Starts recording a timeline in memory (replacing one being recorded).
pub fn start() {
    FROM_ENV.call_once(|| {});
    begin(None);
}

/// Ends the recording and returns it, reading every GPU span (this waits for the GPU work they
/// cover). An error when nothing was being recorded.
pub fn stop() -> Result<Trace> {
    RECORDING.store(false, Ordering::Release);
    let taken = recorder().take();
    let Some(mut recorder) = taken else {
        return Err(Error::InvalidArgument {
            op: "timeline::stop".into(),
            loc: None,
            detail: "no timeline is being recorded: call timeline::start() or set BRAZE_TRACE".into(),
        });
    };
    recorder.read_pending(true)?;
    let mut spans = recorder.spans;
    spans.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
    Ok(Trace { spans })
}

/// The spans recorded so far, without ending the recording (reads every GPU span, waiting for
/// the work they cover); `None` when nothing is being recorded.
pub fn snapshot() -> Result<Option<Trace>> {
    let mut guard = recorder();
    let Some(recorder) = guard.as_mut() else { return Ok(None) };
    recorder.read_pending(true)?;
    let mut spans = recorder.spans.clone();
    spans.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
    Ok(Some(Trace { spans }))
}

/// Now, in microseconds on the recording's clock; `None` when nothing is being recorded.
pub fn now_us() -> Option<f64> {
    if !is_recording() {
        return None;
    }
    recorder().as_ref().map(|r| micros(r.epoch, Instant::now()))
}

/// Ends the `BRAZE_TRACE` recording: writes the trace to its file and prints the summary on
/// stderr; returns the summary. `None` when `BRAZE_TRACE` is not set (or was finished).
pub fn finish() -> Result<Option<Summary>> {
    let path = {
        if !is_recording() {
            return Ok(None);
        }
        match recorder().as_ref().and_then(|r| r.path.clone()) {
            Some(path) => path,
            None => return Ok(None),
        }
    };
    let trace = stop()?;
    std::fs::write(&path, trace.to_json()).map_err(|e| Error::InvalidArgument {
        op: "BRAZE_TRACE".into(),
        loc: None,
        detail: format!("cannot write the trace to {}: {e}", path.display()),
    })?;
    let summary = Summary::of(&trace);
    eprintln!("braze timeline: {} spans written to {}\n{summary}", trace.spans.len(), path.display());
    Ok(Some(summary))
}

thread_local! {
    static THREAD: Cell<u64> = const { Cell::new(0) };
}

fn host_track() -> Track {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    Track::Host(THREAD.with(|t| {
        if t.get() == 0 {
            t.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        t.get()
    }))
}

fn micros(epoch: Instant, at: Instant) -> f64 {
    match at.checked_duration_since(epoch) {
        Some(after) => after.as_secs_f64() * 1e6,
        None => -(epoch.duration_since(at).as_secs_f64() * 1e6),
    }
}

impl Recorder {
    fn push(
        &mut self,
        name: String,
        category: &str,
        track: Track,
        start: Instant,
        end: Instant,
        detail: Option<String>,
    ) {
        // Nanoseconds are as fine as either clock resolves.
        let round = |us: f64| (us * 1e3).round() / 1e3;
        let start_us = round(micros(self.epoch, start));
        let dur_us = round((micros(self.epoch, end) - micros(self.epoch, start)).max(0.0));
        self.spans.push(Span { name, category: category.to_string(), track, start_us, dur_us, detail });
    }

    /// Reads the GPU spans that completed (all of them, waiting, when `wait`), in order.
    fn read_pending(&mut self, wait: bool) -> Result<()> {
        let pending = std::mem::take(&mut self.pending);
        for (ordinal, span) in pending {
            let done = wait || span.is_complete().map_err(|e| Error::cuda("timeline", e))?;
            let clock = self.clocks.get(&ordinal);
            match (done, clock) {
                (true, Some(clock)) => {
                    let (start, end) = clock.host_interval(&span).map_err(|e| Error::cuda("timeline", e))?;
                    let track = match span.stream {
                        SpanStream::Compute => Track::Compute,
                        SpanStream::Copy => Track::Copy,
                    };
                    self.push(span.name.clone(), span.category, track, start, end, None);
                }
                (true, None) => {}
                (false, _) => self.pending.push((ordinal, span)),
            }
        }
        Ok(())
    }
}

/// A host span, recorded when dropped (if a timeline is being recorded).
#[must_use = "the span ends when this is dropped"]
pub struct SpanGuard {
    open: Option<(String, &'static str, Option<String>, Instant, Track)>,
}

impl Drop for SpanGuard {
    fn drop(&mut self) {
        let Some((name, category, detail, start, track)) = self.open.take() else { return };
        if let Some(recorder) = recorder().as_mut() {
            recorder.push(name, category, track, start, Instant::now(), detail);
        }
    }
}

/// A span of host work named by the caller (in the trace and in the gaps' "host in" lists).
pub fn span(name: impl Into<String>) -> SpanGuard {
    host_span("user", || name.into(), None)
}

/// A training step (category `step`): the summary's GPU busy % is over the steps.
pub fn step(index: u64) -> SpanGuard {
    host_span("step", || format!("step {index}"), None)
}

/// A host span of `category`, its name built only while recording.
pub(crate) fn host_span(category: &'static str, name: impl FnOnce() -> String, detail: Option<String>) -> SpanGuard {
    if !is_recording() {
        return SpanGuard { open: None };
    }
    SpanGuard { open: Some((name(), category, detail, Instant::now(), host_track())) }
}

/// A device span measured on the host (the CPU backend's kernel runs, its copies).
pub(crate) fn device_span(track: Track, category: &'static str, name: String, start: Instant, end: Instant) {
    if let Some(recorder) = recorder().as_mut() {
        recorder.push(name, category, track, start, end, None);
    }
}

/// Makes sure device `ordinal` has a clock before GPU spans are recorded on it (waits for its
/// queued work the first time).
pub(crate) fn prepare_device(ordinal: usize, device: &CudaDevice) -> Result<()> {
    let mut guard = recorder();
    let Some(recorder) = guard.as_mut() else { return Ok(()) };
    if let std::collections::hash_map::Entry::Vacant(slot) = recorder.clocks.entry(ordinal) {
        slot.insert(DeviceClock::new(device).map_err(|e| Error::cuda("timeline", e))?);
    }
    Ok(())
}

/// Adds GPU spans of device `ordinal` (after [`prepare_device`]); reads those that completed.
pub(crate) fn gpu_spans(ordinal: usize, spans: Vec<PendingSpan>) -> Result<()> {
    let mut guard = recorder();
    let Some(recorder) = guard.as_mut() else { return Ok(()) };
    recorder.pending.extend(spans.into_iter().map(|s| (ordinal, s)));
    recorder.read_pending(false)
}
