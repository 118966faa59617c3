//! Mixed precision as PyTorch's `torch.autocast`: inside [`autocast`], each op casts its float
//! operands as its entry in the op table says ([`braze_ir::Op::autocast`]): matmuls and
//! attention take them in the region's 16-bit dtype, norms, softmaxes, the loss, sums and means
//! and a few transcendentals in f32, every other op as its operands promote. Parameters and
//! optimizer state stay f32: the casts are ordinary ops, so gradients flow back through them
//! (an f32 parameter gets an f32 gradient) and, compiled, they fuse into neighbouring kernels.
//!
//! The region belongs to the thread and nests (the innermost wins; [`without_autocast`] turns it
//! off inside). A compiled function remembers the region it was traced in and is traced again
//! when called in another, as torch.compile guards on the autocast state.

use crate::Error;
use braze_ir::{AutocastPolicy, DType, Op};
use std::cell::Cell;

thread_local! {
    static REGION: Cell<Option<DType>> = const { Cell::new(None) };
}

/// The autocast dtype of this thread's region, if it is in one.
pub fn autocast_dtype() -> Option<DType> {
    REGION.with(Cell::get)
}

/// Runs `f` in an autocast region of `dtype` (bf16 or f16) on this thread, restoring the
/// previous region afterwards, also on unwind. Another dtype is an error (`f` does not run).
pub fn autocast<R, E: From<Error>>(
    dtype: DType,
    f: impl FnOnce() -> std::result::Result<R, E>,
) -> std::result::Result<R, E> {
    if !dtype.is_narrow_float() {
        return Err(Error::InvalidArgument {
            op: "autocast".into(),
            loc: None,
            detail: format!("autocast runs ops in bf16 or f16, not {dtype}"),
        }
        .into());
    }
    within(Some(dtype), f)
}

/// Runs `f` outside any autocast region (as `torch.autocast(enabled=False)` inside one).
pub fn without_autocast<R>(f: impl FnOnce() -> R) -> R {
    within(None, f)
}

fn within<R>(region: Option<DType>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<DType>);
    impl Drop for Restore {
        fn drop(&mut self) {
            REGION.with(|r| r.set(self.0));
        }
    }
    let _restore = Restore(REGION.with(|r| r.replace(region)));
    f()
}

/// The dtype `op` takes an operand of `dtype` in, inside a region of `region` (`None`: as it
/// is). Only floats are cast.
pub(crate) fn operand_dtype(op: &Op, region: Option<DType>, dtype: DType) -> Option<DType> {
    let region = region?;
    if !dtype.is_float() {
        return None;
    }
    let want = match op.autocast() {
        AutocastPolicy::Lower => region,
        AutocastPolicy::Float32 => DType::F32,
        AutocastPolicy::Keep => return None,
    };
    (want != dtype).then_some(want)
}
