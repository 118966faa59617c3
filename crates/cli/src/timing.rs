//! Timing: `triton.testing.do_bench` on braze's CUDA stream (the method of
//! `benches/torch_baseline.py`), and host-clock medians for the CPU.

use anyhow::{Context, Result};
use braze_cuda::{CudaDevice, DeviceBuffer};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes written before every timed repetition to evict the L2 cache, as do_bench does.
const FLUSH_BYTES: usize = 256_000_000;

/// Medians of one measurement.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub median_us: f64,
    pub reps: usize,
}

/// GPU timing with CUDA events recorded on the stream braze enqueues all its work on.
pub struct GpuTimer {
    pub device: Arc<CudaDevice>,
    flush: DeviceBuffer,
}

impl GpuTimer {
    pub fn new(ordinal: usize) -> Result<GpuTimer> {
        let device = braze::cuda_device(ordinal).context("opening the CUDA device")?;
        let flush = device.alloc(FLUSH_BYTES).context("allocating the L2 flush buffer")?;
        Ok(GpuTimer { device, flush })
    }

    pub fn sync(&self) -> Result<()> {
        self.device.synchronize().context("synchronizing the device")
    }

    /// do_bench: one call, an estimate from 5 calls, `warmup_ms` worth of warm-up calls, then
    /// `rep_ms` worth of repetitions, each preceded by an L2 flush and timed by its own pair of
    /// events; the median (midpoint of the two middle values for an even count).
    pub fn do_bench(&self, f: &mut dyn FnMut() -> Result<()>, warmup_ms: f64, rep_ms: f64) -> Result<Timing> {
        f()?;
        self.sync()?;
        let estimate = self.device.event_timer()?;
        estimate.start()?;
        for _ in 0..5 {
            self.device.memset_d8(&self.flush, 0)?;
            f()?;
        }
        estimate.stop()?;
        let estimate_ms = (estimate.elapsed_ms()? as f64 / 5.0).max(1e-4);
        let warmup = ((warmup_ms / estimate_ms) as usize).max(1);
        let reps = ((rep_ms / estimate_ms) as usize).clamp(1, 100_000);
        for _ in 0..warmup {
            f()?;
        }
        let timers = (0..reps).map(|_| self.device.event_timer()).collect::<braze_cuda::Result<Vec<_>>>()?;
        for timer in &timers {
            self.device.memset_d8(&self.flush, 0)?;
            timer.start()?;
            f()?;
            timer.stop()?;
        }
        self.sync()?;
        let mut times = timers.iter().map(|t| t.elapsed_ms().map(f64::from)).collect::<braze_cuda::Result<Vec<_>>>()?;
        Ok(Timing { median_us: median(&mut times) * 1e3, reps })
    }

    /// Host-clock time per call of `calls` back-to-back calls: `(enqueue, total)`, where
    /// `enqueue` stops when the last call returns and `total` after the device finished.
    pub fn host_per_call(&self, f: &mut dyn FnMut() -> Result<()>, calls: usize) -> Result<(Duration, Duration)> {
        for _ in 0..calls.min(100) {
            f()?;
        }
        self.sync()?;
        let start = Instant::now();
        for _ in 0..calls {
            f()?;
        }
        let enqueued = start.elapsed();
        self.sync()?;
        let total = start.elapsed();
        let n = calls.max(1) as u32;
        Ok((enqueued / n, total / n))
    }
}

/// Median of `values` (sorted in place); the midpoint of the middle two for an even count.
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Host-clock median of `runs` calls of `f` (each one complete when it returns).
pub fn host_median(runs: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<Duration> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        f()?;
        times.push(start.elapsed().as_secs_f64());
    }
    Ok(Duration::from_secs_f64(median(&mut times)))
}

/// `1.23 ms`, `45.6 us` or `2.10 s`.
pub fn fmt_us(us: f64) -> String {
    if !us.is_finite() {
        "n/a".into()
    } else if us >= 1e6 {
        format!("{:.2} s", us / 1e6)
    } else if us >= 1e4 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{us:.1} us")
    }
}
