//! Device-side checks read without a host wait: the check words of a plan (two `u64` per check,
//! `[raised, first bad index]`, set by kernels that meet an index out of range) are copied after
//! each run into a ring of pinned host slots and read once the copy has completed, the way CUDA
//! reports device-side asserts and PyTorch reports them: **at a later API call**.
//!
//! After enqueuing a run (direct launches or a CUDA graph replay) the executable enqueues on the
//! same stream an asynchronous copy of the words into a free slot, the slot's event, and then a
//! memset of the words to zero, so the next run starts clean without a host round trip. Stream
//! order makes the copy see every kernel of the run, and the memset come after the copy and before
//! the next run's kernels. The copy and memset are enqueued after a graph replay rather than
//! captured in the graph: a captured copy would land in the same slot on every replay, so a
//! replay could overwrite a slot the host has not read yet.
//!
//! Slots are read (an event query, no waiting) at the start of the executable's next run, at
//! every host synchronization through the device ([`crate::CudaDevice::download`] and its
//! variants, [`crate::CudaDevice::synchronize`]: the stream is drained there, so every copy
//! enqueued before has completed), by [`crate::CudaDevice::poll_checks`] and
//! [`crate::PlanExecutable::poll_checks`], and when the executable is dropped. The first raised
//! check found becomes [`CudaError::IndexOutOfRange`] naming the op, its source location, the
//! index and the bound. So a bad index of run N is reported by the first of: a later run of the
//! same executable whose read finds run N's copy complete (often run N + 1 or N + 2, since the host
//! usually runs ahead of the GPU), or the next host read or synchronization of the device on the
//! thread that enqueued run N, which always finds it. Run N's own call returns its outputs
//! (computed with clamped reads). A call that reports an earlier run's check does not run.
//!
//! Threads sharing a device do not get each other's errors at their host reads: a
//! synchronization reads the slots of runs its own thread enqueued (another thread's bad index is
//! reported to that thread, at its next call or synchronization). The checks of a dropped
//! executable's runs are reported at the next synchronization of any thread.
//!
//! A run needs a free slot: when all [`CHECK_SLOTS`] are pending (the host is that many runs
//! ahead of the GPU) it waits for the oldest slot's copy, only that copy: the newer runs stay
//! queued, so the GPU does not run dry. [`crate::PlanExecutable::check_slot_waits`] counts these
//! waits.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use braze_plan::Plan;

use crate::buffer::DeviceBuffer;
use crate::device::{lock, CudaDevice, PendingChecks};
use crate::error::{CudaError, Result};
use crate::pinned::PinnedBuffer;

/// Pinned slots per executable with checks: runs whose check copies can be in flight at once.
pub const CHECK_SLOTS: usize = 8;

/// What a raised check names.
#[derive(Debug)]
struct Site {
    /// The op, with its source location when known (`index_select at src/main.rs:3:9`).
    op: String,
    bound: usize,
}

/// The pinned slots of one executable's check words (see the module docs). Shared with the
/// device, which reads it at host synchronizations and keeps it until its last copy was read.
#[derive(Debug)]
pub(crate) struct CheckRing {
    sites: Vec<Site>,
    state: Mutex<RingState>,
    /// Runs that waited for the oldest slot's copy because every slot was pending.
    waits: AtomicU64,
}

#[derive(Debug)]
struct RingState {
    free: Vec<PinnedBuffer>,
    /// Slots whose copy is enqueued and not yet read, oldest first, with the thread that
    /// enqueued the run.
    pending: VecDeque<(PinnedBuffer, ThreadId)>,
    /// A raised check read where it could not be returned (when the executable was dropped):
    /// the next read returns it.
    stashed: Option<CudaError>,
}

impl CheckRing {
    /// The ring for `plan`'s checks, registered with `device`; `None` when the plan has none.
    pub(crate) fn for_plan(device: &CudaDevice, plan: &Plan) -> Result<Option<Arc<CheckRing>>> {
        if plan.checks.is_empty() {
            return Ok(None);
        }
        let sites = plan
            .checks
            .iter()
            .map(|c| Site {
                op: match &c.loc {
                    Some(loc) => format!("{} at {loc}", c.op),
                    None => c.op.clone(),
                },
                bound: c.bound,
            })
            .collect();
        // Allocated now, not in the first runs: pinning memory maps and locks pages.
        let free =
            (0..CHECK_SLOTS).map(|_| PinnedBuffer::alloc(device, 16 * plan.checks.len())).collect::<Result<_>>()?;
        let ring = Arc::new(CheckRing {
            sites,
            state: Mutex::new(RingState { free, pending: VecDeque::new(), stashed: None }),
            waits: AtomicU64::new(0),
        });
        device.register_checks(&ring);
        Ok(Some(ring))
    }

    /// The error of the first raised check in the words `bytes`, if any.
    fn raised(&self, bytes: &[u8]) -> Option<CudaError> {
        let word = |i: usize| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        self.sites.iter().enumerate().find(|&(c, _)| word(2 * c) != 0).map(|(c, site)| CudaError::IndexOutOfRange {
            op: site.op.clone(),
            index: word(2 * c + 1) as i64,
            bound: site.bound,
        })
    }

    /// Reads every slot whose copy has completed, oldest first, and frees it (with `thread`,
    /// only the slots of runs that thread enqueued); with `wait`, waits for the pending copies
    /// first (their events only). The first raised check found is the error; raised checks of
    /// later runs read by the same call are dropped with it (one error per read).
    pub(crate) fn poll(&self, wait: bool, thread: Option<ThreadId>) -> Result<()> {
        let mut state = lock(&self.state);
        let mut first = state.stashed.take();
        let mut i = 0;
        while i < state.pending.len() {
            let (slot, owner) = &state.pending[i];
            if thread.is_some_and(|t| t != *owner) {
                i += 1;
                continue;
            }
            let bytes = if wait { slot.wait_bytes().map(Some) } else { slot.try_bytes() };
            let bytes = match bytes {
                Ok(bytes) => bytes,
                Err(err) => {
                    // The driver failed: a raised check read so far is returned by a later read.
                    state.stashed = first;
                    return Err(err);
                }
            };
            // Copies complete in stream order: the later ones are pending too.
            let Some(bytes) = bytes else { break };
            let raised = self.raised(bytes);
            let (slot, _) = state.pending.remove(i).expect("slot i was just read");
            state.free.push(slot);
            if first.is_none() {
                first = raised;
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// A free slot for the next run's copy, after reading the completed ones (a raised check of
    /// an earlier run is returned instead, and this run should not go ahead). When every slot is
    /// pending, waits for the oldest slot's copy.
    pub(crate) fn begin_run(&self) -> Result<PinnedBuffer> {
        self.poll(false, None)?;
        let mut state = lock(&self.state);
        if let Some(slot) = state.free.pop() {
            return Ok(slot);
        }
        let (oldest, _) = state.pending.pop_front().expect("a slot is free, pending or in a run, and runs take &mut");
        self.waits.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(target: "braze::syncs", slots = CHECK_SLOTS,
            "every check slot is pending: waiting for the oldest run's check copy");
        let raised = match oldest.wait_bytes() {
            Ok(bytes) => self.raised(bytes),
            Err(err) => {
                state.free.push(oldest);
                return Err(err);
            }
        };
        match raised {
            Some(err) => {
                state.free.push(oldest);
                Err(err)
            }
            None => Ok(oldest),
        }
    }

    /// Takes back the slot of a run: pending when its copy was enqueued, else free.
    pub(crate) fn end_run(&self, slot: PinnedBuffer, copied: bool) {
        let mut state = lock(&self.state);
        if copied {
            state.pending.push_back((slot, std::thread::current().id()));
        } else {
            state.free.push(slot);
        }
    }

    /// Keeps `err` for the next read to return.
    pub(crate) fn stash(&self, err: CudaError) {
        lock(&self.state).stashed.get_or_insert(err);
    }

    pub(crate) fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }
}

impl PendingChecks for CheckRing {
    fn poll_completed(&self, thread: Option<ThreadId>) -> Result<()> {
        self.poll(false, thread)
    }

    fn owes_a_read(&self) -> bool {
        let state = lock(&self.state);
        !state.pending.is_empty() || state.stashed.is_some()
    }
}

impl CudaDevice {
    fn register_checks(&self, ring: &Arc<CheckRing>) {
        let gone = {
            let mut rings = lock(&self.check_rings);
            let gone = prune(&mut rings);
            rings.push(ring.clone() as Arc<dyn PendingChecks>);
            gone
        };
        // Freed outside the lock: freeing pinned memory passes the context gate.
        drop(gone);
    }

    /// Enqueues, after a run, the copy of the check words `words` into `slot` (and its event),
    /// then the memset of the words to zero. Neither waits.
    pub(crate) fn enqueue_check_read(&self, words: &DeviceBuffer, slot: &mut PinnedBuffer) -> Result<()> {
        self.download_pinned_async(words, slot)?;
        self.memset_d8(words, 0)
    }

    /// Reads the completed check copies of the runs this thread enqueued, of every executable on
    /// this device (no waiting), and returns the first raised check as
    /// [`CudaError::IndexOutOfRange`]. Host synchronizations through the device (downloads,
    /// [`CudaDevice::synchronize`]) do this after the stream is drained, so a bad index of an
    /// earlier run of this thread is reported there at the latest.
    pub fn poll_checks(&self) -> Result<()> {
        let thread = std::thread::current().id();
        // With whether the executable was dropped (only the device holds the ring): then every
        // slot is read, whichever thread's run it holds, since no later run will read it.
        let (rings, gone): (Vec<(Arc<dyn PendingChecks>, bool)>, _) = {
            let mut rings = lock(&self.check_rings);
            let gone = prune(&mut rings);
            let rings = rings
                .iter()
                .map(|r| {
                    let dropped = Arc::strong_count(r) == 1;
                    (r.clone(), dropped)
                })
                .collect();
            (rings, gone)
        };
        drop(gone);
        let mut first = None;
        for (ring, dropped) in rings {
            if let Err(err) = ring.poll_completed((!dropped).then_some(thread)) {
                first.get_or_insert(err);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// Takes out the rings of dropped executables (only the device holds them) whose last copy was
/// read, for the caller to drop once it let go of the lock.
fn prune(rings: &mut Vec<Arc<dyn PendingChecks>>) -> Vec<Arc<dyn PendingChecks>> {
    let (keep, gone) = std::mem::take(rings).into_iter().partition(|r| Arc::strong_count(r) > 1 || r.owes_a_read());
    *rings = keep;
    gone
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(sites: &[(&str, usize)]) -> CheckRing {
        CheckRing {
            sites: sites.iter().map(|&(op, bound)| Site { op: op.to_string(), bound }).collect(),
            state: Mutex::new(RingState { free: Vec::new(), pending: VecDeque::new(), stashed: None }),
            waits: AtomicU64::new(0),
        }
    }

    fn words(values: &[u64]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn the_first_raised_check_names_its_op_index_and_bound() {
        let ring = ring(&[("embedding at a.rs:1:1", 6), ("index_select at b.rs:2:2", 10)]);
        assert!(ring.raised(&words(&[0, 0, 0, 0])).is_none());
        let err = ring.raised(&words(&[0, 0, 1, u64::MAX])).expect("the second check is raised");
        assert!(
            matches!(&err, CudaError::IndexOutOfRange { op, index: -1, bound: 10 } if op == "index_select at b.rs:2:2"),
            "{err:?}"
        );
        let err = ring.raised(&words(&[1, 7, 1, 12])).expect("both are raised");
        assert!(matches!(err, CudaError::IndexOutOfRange { index: 7, bound: 6, .. }), "the first one is reported");
        assert!(err.to_string().contains("reported at a later call or host read"), "{err}");
    }

    #[test]
    fn a_stashed_error_is_reported_once_by_any_read() {
        let ring = ring(&[("embedding", 6)]);
        ring.poll(false, None).expect("nothing pending");
        assert!(!ring.owes_a_read());
        ring.stash(CudaError::IndexOutOfRange { op: "embedding".into(), index: 9, bound: 6 });
        assert!(ring.owes_a_read());
        let other_thread = std::thread::spawn(|| std::thread::current().id()).join().unwrap();
        assert!(ring.poll(false, Some(other_thread)).is_err(), "a dropped executable's error goes to any thread");
        ring.poll(false, None).expect("reported once");
    }
}
