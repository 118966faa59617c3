//! Per-kernel GPU times of one compiled call ([`crate::Compiled::profile`]): while a profiled
//! call runs on this thread, each GPU plan it runs launches its kernels between timing events
//! (directly, not as a CUDA graph replay) and leaves their times here.

use crate::Result;
use braze_cuda::KernelTime;
use std::cell::RefCell;

thread_local! {
    static COLLECTED: RefCell<Option<Vec<KernelTime>>> = const { RefCell::new(None) };
}

/// Runs `f` collecting the kernel times of the GPU plans it runs, in launch order.
pub(crate) fn collect<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, Vec<KernelTime>)> {
    let outer = COLLECTED.with(|c| c.borrow_mut().replace(Vec::new()));
    let result = f();
    let times = COLLECTED.with(|c| std::mem::replace(&mut *c.borrow_mut(), outer)).unwrap_or_default();
    Ok((result?, times))
}

/// Whether a profiled call is running on this thread.
pub(crate) fn is_collecting() -> bool {
    COLLECTED.with(|c| c.borrow().is_some())
}

/// Adds the kernel times of one plan run to the profiled call's.
pub(crate) fn record(times: Vec<KernelTime>) {
    COLLECTED.with(|c| {
        if let Some(all) = c.borrow_mut().as_mut() {
            all.extend(times);
        }
    });
}
