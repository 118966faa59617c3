//! The gate between a CUDA graph capture and operations on other threads that would invalidate
//! it (pinned memory, module and cuBLASLt handle lifetimes, opening and closing devices).

use std::cell::Cell;
use std::sync::{PoisonError, RwLock};

/// Serialises captures against operations on other threads that can invalidate a capture in the
/// same context: allocating or freeing pinned host memory, loading or unloading modules,
/// creating or destroying cuBLASLt handles, opening or closing a device. Those hold it shared
/// (through [`outside_capture`]); a capture holds it exclusively for its (short) duration.
pub(crate) static CAPTURE_GATE: RwLock<()> = RwLock::new(());

thread_local! {
    /// Whether this thread is inside `capture_graph`'s closure. Such operations issued by the
    /// capturing thread itself skip the gate (they would otherwise deadlock); the capture then
    /// reports them as failed instead.
    pub(crate) static CAPTURING_ON_THIS_THREAD: Cell<bool> = const { Cell::new(false) };
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
pub(crate) struct CapturingHere;

impl CapturingHere {
    pub(crate) fn enter() -> Self {
        CAPTURING_ON_THIS_THREAD.set(true);
        CapturingHere
    }
}

impl Drop for CapturingHere {
    fn drop(&mut self) {
        CAPTURING_ON_THIS_THREAD.set(false);
    }
}
