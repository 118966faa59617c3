//! Keeping other threads' work out of a CUDA graph capture.
//!
//! A capture records whatever is enqueued on the capturing stream, whichever thread enqueues it:
//! with one stream per [`crate::CudaDevice`], a launch, copy, memset, stream-ordered allocation
//! or free, event record or graph replay issued by another thread during a capture would become
//! part of the graph (and never run eagerly), or invalidate the capture. Separately, some calls
//! that act on the whole context (allocating or freeing pinned host memory, loading or unloading
//! modules, creating or destroying cuBLASLt handles, destroying graphs, opening devices) can
//! invalidate a capture in progress on any stream.
//!
//! **The choice: gates, not private capture streams.** Each device's stream has a [`StreamGate`],
//! a reader-writer lock: every operation of this crate that enqueues on the stream or frees
//! memory ordered on it holds it shared for the duration of the call; a capture holds it
//! exclusively from `begin_capture` to `end_capture`. The context-wide calls above go through one
//! process-wide context gate in the same way, and every capture holds it exclusively as well.
//! The alternative, capturing on a private stream that no other thread uses, would also let
//! other threads keep launching during a capture, but every operation would then have to pick
//! its stream per thread, replays would have to be issued on the device stream rather than on the
//! stream cudarc's graph remembers, and the context-wide calls would still need a gate. Captures
//! are rare (once per compiled function, output set and set of input addresses) and short (they
//! record, they do not run), so making other threads wait for one is cheap, while an uncontended
//! shared acquisition per launch costs a few nanoseconds.
//!
//! Captures use `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: only the capturing thread is barred from
//! calls that are unsafe during a capture, so other threads keep working on other devices (other
//! streams) while one captures; the gates keep them off the capturing stream and the context.
//!
//! **Lock order.** A thread may take the context gate while it holds a stream gate, never the
//! reverse; a capture takes its stream gate, then the context gate. Gates are re-entrant per
//! thread (an operation made of other operations, such as an upload that allocates, takes each
//! gate once), and a thread that captures passes through every gate, since it holds the context
//! gate exclusively and so is the only capture in the process. A capture cannot start on a thread
//! that holds a gate shared (it would wait for itself); it is refused with an error instead.
//!
//! **Drops during a capture.** A value whose drop must pass a gate (a device buffer, a loaded
//! module, pinned memory, a graph) and that the capturing thread drops inside the capture is kept
//! until the capture has ended, then dropped through its gate: freeing it inside the capture
//! would record the free into the graph.

use std::cell::{Cell, RefCell};
use std::sync::{Arc, PoisonError, RwLock};

/// Held shared by the context-wide calls listed in the module docs, exclusively by captures.
static CONTEXT_GATE: RwLock<()> = RwLock::new(());

thread_local! {
    /// Whether this thread is inside a capture (holding a stream gate and the context gate
    /// exclusively).
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
    /// The gates this thread holds shared, by address, so nested operations do not take them again
    /// (a second shared acquisition could wait behind a capture that waits for the first).
    static HELD: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    /// Drops put off until this thread's capture ends.
    static DEFERRED: RefCell<Vec<Box<dyn FnOnce()>>> = const { RefCell::new(Vec::new()) };
}

/// The gate of one device's stream (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct StreamGate {
    lock: RwLock<()>,
}

impl StreamGate {
    /// Runs `operation`, which enqueues on this gate's stream, while no capture is in progress on
    /// it on another thread.
    pub(crate) fn shared<R>(&self, operation: impl FnOnce() -> R) -> R {
        hold_shared(&self.lock, operation)
    }

    /// Drops `value`, whose destruction is ordered on this gate's stream, through the gate; on the
    /// capturing thread, once its capture has ended.
    pub(crate) fn drop_outside_capture<T: 'static>(self: &Arc<Self>, value: T) {
        if CAPTURING.get() {
            let gate = self.clone();
            DEFERRED.with_borrow_mut(|deferred| deferred.push(Box::new(move || gate.shared(|| drop(value)))));
        } else {
            self.shared(|| drop(value));
        }
    }

    /// Runs `capture` with this stream and the context to itself: other threads' operations on
    /// the stream and context-wide calls wait until it returns. Errors (with the reason) instead
    /// when this thread is already capturing or holds a gate.
    pub(crate) fn exclusive<R>(&self, capture: impl FnOnce() -> R) -> Result<R, &'static str> {
        if CAPTURING.get() {
            return Err("a capture is already in progress on this thread");
        }
        if HELD.with_borrow(|held| !held.is_empty()) {
            return Err("a capture cannot start inside another operation of this device on the same thread");
        }
        // Dropped last, after both gates are released: values the capture dropped go now.
        let _deferred = RunDeferred;
        let _stream = self.lock.write().unwrap_or_else(PoisonError::into_inner);
        let _context = CONTEXT_GATE.write().unwrap_or_else(PoisonError::into_inner);
        let _capturing = CapturingHere::enter();
        Ok(capture())
    }
}

/// Runs `operation`, a context-wide call (see the module docs), while no capture is in progress
/// on another thread.
pub(crate) fn outside_capture<R>(operation: impl FnOnce() -> R) -> R {
    hold_shared(&CONTEXT_GATE, operation)
}

fn hold_shared<R>(lock: &RwLock<()>, operation: impl FnOnce() -> R) -> R {
    let key = lock as *const RwLock<()> as usize;
    if CAPTURING.get() || HELD.with_borrow(|held| held.contains(&key)) {
        return operation();
    }
    let _shared = lock.read().unwrap_or_else(PoisonError::into_inner);
    HELD.with_borrow_mut(|held| held.push(key));
    let _held = Held(key);
    operation()
}

/// Removes a gate from [`HELD`] when its shared hold ends (also on panic).
struct Held(usize);

impl Drop for Held {
    fn drop(&mut self) {
        HELD.with_borrow_mut(|held| {
            if let Some(index) = held.iter().rposition(|&key| key == self.0) {
                held.remove(index);
            }
        });
    }
}

/// Marks the current thread as capturing until dropped (also on panic).
struct CapturingHere;

impl CapturingHere {
    fn enter() -> Self {
        CAPTURING.set(true);
        CapturingHere
    }
}

impl Drop for CapturingHere {
    fn drop(&mut self) {
        CAPTURING.set(false);
    }
}

/// Runs the drops deferred during a capture when dropped.
struct RunDeferred;

impl Drop for RunDeferred {
    fn drop(&mut self) {
        for deferred in DEFERRED.take() {
            deferred();
        }
    }
}

/// Owns a value whose destruction is a context-wide call (see the module docs); it is dropped
/// through the context gate, or after the capture when the capturing thread drops it.
#[derive(Debug)]
pub(crate) struct DropOutsideCapture<T: 'static>(Option<T>);

impl<T: 'static> DropOutsideCapture<T> {
    pub(crate) fn new(value: T) -> Self {
        DropOutsideCapture(Some(value))
    }
}

impl<T: 'static> std::ops::Deref for DropOutsideCapture<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("present until dropped")
    }
}

impl<T: 'static> std::ops::DerefMut for DropOutsideCapture<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0.as_mut().expect("present until dropped")
    }
}

impl<T: 'static> Drop for DropOutsideCapture<T> {
    fn drop(&mut self) {
        let Some(value) = self.0.take() else { return };
        if CAPTURING.get() {
            DEFERRED.with_borrow_mut(|deferred| deferred.push(Box::new(move || outside_capture(|| drop(value)))));
        } else {
            outside_capture(|| drop(value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn shared_holds_are_reentrant_and_released() {
        let gate = StreamGate::default();
        let inner = gate.shared(|| gate.shared(|| outside_capture(|| outside_capture(|| 7))));
        assert_eq!(inner, 7);
        assert!(HELD.with_borrow(Vec::is_empty));
        assert_eq!(gate.exclusive(|| 1), Ok(1));
    }

    #[test]
    fn a_capture_cannot_start_while_this_thread_holds_a_gate_or_captures() {
        let gate = StreamGate::default();
        let other = StreamGate::default();
        assert!(gate.shared(|| gate.exclusive(|| ())).is_err());
        assert!(other.shared(|| gate.exclusive(|| ())).is_err());
        assert!(outside_capture(|| gate.exclusive(|| ())).is_err());
        assert_eq!(gate.exclusive(|| other.exclusive(|| ()).is_err()), Ok(true));
        // Inside a capture every gate is passed through, so the capturing thread never waits.
        assert_eq!(gate.exclusive(|| gate.shared(|| other.shared(|| outside_capture(|| 3)))), Ok(3));
    }

    #[test]
    fn other_threads_wait_for_a_capture_to_end() {
        let gate = Arc::new(StreamGate::default());
        let capturing = Arc::new(AtomicBool::new(false));
        let (started, wait_started) = mpsc::channel();
        let (release, wait_release) = mpsc::channel::<()>();
        let capture = {
            let (gate, capturing) = (gate.clone(), capturing.clone());
            std::thread::spawn(move || {
                gate.exclusive(|| {
                    capturing.store(true, Ordering::SeqCst);
                    started.send(()).unwrap();
                    wait_release.recv().unwrap();
                    capturing.store(false, Ordering::SeqCst);
                })
                .unwrap();
            })
        };
        wait_started.recv().unwrap();
        let (done, wait_done) = mpsc::channel();
        let worker = {
            let (gate, capturing) = (gate.clone(), capturing.clone());
            std::thread::spawn(move || {
                let saw_capture = gate.shared(|| capturing.load(Ordering::SeqCst));
                let saw_capture_in_context = outside_capture(|| capturing.load(Ordering::SeqCst));
                done.send((saw_capture, saw_capture_in_context)).unwrap();
            })
        };
        // The worker is blocked at the gate while the capture lasts.
        assert!(wait_done.recv_timeout(Duration::from_millis(100)).is_err());
        release.send(()).unwrap();
        assert_eq!(wait_done.recv().unwrap(), (false, false));
        capture.join().unwrap();
        worker.join().unwrap();
    }

    #[test]
    fn drops_on_the_capturing_thread_wait_for_the_capture_to_end() {
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let gate = Arc::new(StreamGate::default());
        let stream_dropped = Arc::new(AtomicBool::new(false));
        let context_dropped = Arc::new(AtomicBool::new(false));
        let during = gate
            .exclusive(|| {
                gate.drop_outside_capture(Flag(stream_dropped.clone()));
                drop(DropOutsideCapture::new(Flag(context_dropped.clone())));
                (stream_dropped.load(Ordering::SeqCst), context_dropped.load(Ordering::SeqCst))
            })
            .unwrap();
        assert_eq!(during, (false, false));
        assert!(stream_dropped.load(Ordering::SeqCst) && context_dropped.load(Ordering::SeqCst));
    }
}
