//! Gradients, as PyTorch autograd gives them: a float tensor that requires grad (usually a
//! captured weight), `loss.backward()`, `param.grad()`, accumulation over several backward
//! calls, `no_grad` regions and `detach`.
//!
//! Outside `compile()` every op on a tensor that needs a gradient leaves a [`tape`] entry (the
//! op's one-op graph and its operands), and every compiled graph whose outputs need one leaves a
//! node whose backward is a compiled graph ([`compiled`]); `backward()` joins the op entries
//! reachable from the loss into one graph, appends its backward with `braze_autodiff`, runs it,
//! and goes on through the compiled nodes it reaches. Inside a compiled function `backward()`
//! appends the backward ops to the trace itself, so forward and backward are one joint graph
//! that is optimized and fused together, and the gradients are written to `.grad` after each
//! call; gradients flowing on into pieces before a graph break run those pieces' backwards.

mod api;
pub(crate) mod compiled;
mod functional;
pub(crate) mod tape;

use std::cell::Cell;

pub use functional::{grad, value_and_grad};

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Whether ops on this thread record what gradients need (false inside [`no_grad`]).
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Runs `f` with gradient recording off on this thread (as `torch.no_grad()`): its results need
/// no gradient and hold no tape. Restores the previous setting afterwards, also on unwind.
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GRAD_ENABLED.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(GRAD_ENABLED.with(|g| g.replace(false)));
    f()
}
