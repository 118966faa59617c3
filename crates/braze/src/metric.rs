//! Device-side metrics: running sums (a loss, an accuracy) kept on the device and read without
//! stalling the queue. [`DeviceMetric::add`] adds a value with device ops (nothing is read);
//! every N adds (or on [`DeviceMetric::request`]) the sum is copied into pinned memory on the
//! compute stream, after the work that produced it, and [`DeviceMetric::poll`] collects the copy
//! once its event has completed. Neither is a host synchronization ([`crate::sync_count`]
//! does not move): the host reads a value the GPU has already delivered, a step or more late.

use crate::prefetch::PinnedPool;
use crate::{autograd, DType, Device, Error, Result, Tensor};
use std::collections::VecDeque;

/// A running sum on the device, read asynchronously.
pub struct DeviceMetric {
    name: String,
    device: Device,
    sum: Option<Tensor>,
    /// Values the sum holds (a `set` counts as one, and restarts the count).
    added: u64,
    /// Calls of `add` and `set`, for the read cadence.
    updates: u64,
    read_every: u64,
    pool: Option<PinnedPool>,
    pending: VecDeque<PendingRead>,
    latest: Option<MetricReading>,
}

/// A value of a metric as the host received it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MetricReading {
    /// The sum of every value added up to the read.
    pub sum: f64,
    /// How many values the sum holds.
    pub count: u64,
}

impl MetricReading {
    /// The mean of the values added (NaN before any).
    pub fn mean(&self) -> f64 {
        self.sum / self.count as f64
    }
}

enum PendingRead {
    /// The CPU backend: the value was on the host already.
    Ready(MetricReading),
    Cuda {
        pinned: braze_cuda::PinnedBuffer,
        count: u64,
    },
}

impl DeviceMetric {
    /// A metric named `name` whose sum lives on `device`; read only on [`DeviceMetric::request`]
    /// until [`DeviceMetric::read_every`] says otherwise.
    pub fn new(name: impl Into<String>, device: Device) -> DeviceMetric {
        DeviceMetric {
            name: name.into(),
            device,
            sum: None,
            added: 0,
            updates: 0,
            read_every: 0,
            pool: None,
            pending: VecDeque::new(),
            latest: None,
        }
    }

    /// Requests a read every `n` adds or sets (0: never by itself).
    pub fn read_every(mut self, n: u64) -> DeviceMetric {
        self.read_every = n;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds the sum of `value`'s elements (any float dtype, on the metric's device) to the
    /// running sum, with device ops: nothing is read on the host.
    #[track_caller]
    pub fn add(&mut self, value: &Tensor) -> Result<()> {
        let v = self.summed(value, "add")?;
        let sum = match &self.sum {
            Some(sum) => autograd::no_grad(|| sum.add(&v))?,
            None => v,
        };
        self.update(sum, self.added + 1)
    }

    /// Sets the metric to the sum of `value`'s elements, one value: for a count kept on the
    /// device elsewhere (an optimizer's [`crate::optim::Optimizer::skipped_steps`]), read like
    /// any metric, without waiting. A read requested after this reports the value as the queue
    /// reaches it: later updates of `value` do not change a read already requested. An `add`
    /// after it adds onto the value set.
    #[track_caller]
    pub fn set(&mut self, value: &Tensor) -> Result<()> {
        let v = self.summed(value, "set")?;
        self.update(v, 1)
    }

    /// The f32 sum of `value`'s elements, with device ops, after checking its device.
    #[track_caller]
    fn summed(&self, value: &Tensor, op: &str) -> Result<Tensor> {
        if value.device() != self.device {
            return Err(Error::DeviceMismatch {
                op: format!("DeviceMetric::{op} (`{}`)", self.name),
                loc: Some(crate::tensor::caller()),
                expected: self.device,
                actual: value.device(),
            });
        }
        autograd::no_grad(|| value.detach()?.cast(DType::F32)?.sum_all())
    }

    /// Holds `sum` of `added` values, and requests a read when the cadence says so.
    fn update(&mut self, sum: Tensor, added: u64) -> Result<()> {
        self.sum = Some(sum);
        self.added = added;
        self.updates += 1;
        if self.read_every > 0 && self.updates.is_multiple_of(self.read_every) {
            self.request()?;
        }
        Ok(())
    }

    /// Enqueues a read of the running sum into pinned memory (no waiting).
    pub fn request(&mut self) -> Result<()> {
        let Some(sum) = &self.sum else { return Ok(()) };
        let count = self.added;
        match self.device {
            Device::Cpu => {
                let host = sum.host_data().ok_or_else(|| self.not_concrete())?;
                let value = if host.numel() > 0 { host.get_f64(0) } else { f64::NAN };
                self.pending.push_back(PendingRead::Ready(MetricReading { sum: value, count }));
            }
            Device::Cuda(ordinal) => {
                let (buffer, _) = sum.cuda_buffer_on().ok_or_else(|| self.not_concrete())?;
                if self.pool.is_none() {
                    self.pool = Some(PinnedPool::new(self.device)?);
                }
                let pool = self.pool.as_ref().and_then(PinnedPool::cuda).ok_or_else(|| self.not_concrete())?;
                let cuda = |e| Error::cuda("DeviceMetric::request", e);
                let mut pinned = pool.take(buffer.len_bytes()).map_err(cuda)?;
                crate::cuda::device(ordinal, "DeviceMetric::request")?
                    .download_pinned_async(&buffer, &mut pinned)
                    .map_err(cuda)?;
                self.pending.push_back(PendingRead::Cuda { pinned, count });
            }
        }
        Ok(())
    }

    /// The newest reading that arrived since the last poll, if any (never waits).
    pub fn poll(&mut self) -> Result<Option<MetricReading>> {
        let mut arrived = None;
        while let Some(front) = self.pending.front() {
            let reading = match front {
                PendingRead::Ready(reading) => *reading,
                PendingRead::Cuda { pinned, count } => {
                    match pinned.try_bytes().map_err(|e| Error::cuda("DeviceMetric::poll", e))? {
                        Some(bytes) if bytes.len() >= 4 => MetricReading {
                            sum: f64::from(f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])),
                            count: *count,
                        },
                        Some(_) => MetricReading { sum: f64::NAN, count: *count },
                        None => break,
                    }
                }
            };
            if let Some(PendingRead::Cuda { pinned, .. }) = self.pending.pop_front() {
                if let Some(pool) = self.pool.as_ref().and_then(PinnedPool::cuda) {
                    pool.give_back(pinned);
                }
            }
            arrived = Some(reading);
        }
        if arrived.is_some() {
            self.latest = arrived;
        }
        Ok(arrived)
    }

    /// The newest reading received so far.
    pub fn latest(&self) -> Option<MetricReading> {
        self.latest
    }

    /// Reads requested and not yet arrived.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    fn not_concrete(&self) -> Error {
        Error::InvalidArgument {
            op: format!("DeviceMetric (`{}`)", self.name),
            loc: None,
            detail: "the running sum is not a concrete tensor (was the metric used inside a compiled function?)".into(),
        }
    }
}
