//! Optimizers written with the `Tensor` API, so the same code runs eagerly and inside a compiled
//! training step, where each update is part of the step's one graph: parameters and optimizer
//! state are captured tensors updated with `assign`, and the learning rate and step count are
//! device scalars, so a learning-rate schedule that changes every step never retraces.
//!
//! State is kept in f32 whatever the parameters' dtype unless asked to follow the parameters'
//! dtype ([`StateDType::OfParams`], what `torch.optim` and optax keep); an update computes in f32
//! and rounds once into the parameter (and, with 16-bit state, once into each state tensor).
//! Gradients with a NaN or an infinity skip the whole update on the device (no host read) and
//! count the skip in [`Optimizer::skipped_steps`].

mod adamw;
mod clip;
mod sgd;

pub use adamw::AdamW;
pub use clip::{clip_grad_norm, clip_grad_norm_checked};
pub use sgd::Sgd;

use crate::{DType, Result, Tensor};

/// The dtype an optimizer keeps its per-parameter state in (AdamW's moments, SGD's momentum).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StateDType {
    /// f32 whatever the parameters' dtype: the more accurate choice for 16-bit parameters.
    #[default]
    F32,
    /// The dtype of each parameter, as `torch.optim` (`zeros_like(param)`) and optax keep it:
    /// for bf16 parameters, half the state's bytes and memory traffic. The update still
    /// computes in f32 from the unrounded new state, as PyTorch's fused AdamW does.
    OfParams,
}

impl StateDType {
    /// Zeros for the state of `param`, on its device.
    fn zeros_like(self, param: &Tensor) -> Result<Tensor> {
        let dtype = match self {
            StateDType::F32 => DType::F32,
            StateDType::OfParams => param.dtype(),
        };
        Tensor::zeros(param.shape(), dtype, param.device())
    }
}

/// What every optimizer here offers.
pub trait Optimizer {
    /// One update of every parameter that has a gradient; skipped (on the device) when any of
    /// those gradients holds a NaN or an infinity.
    fn step(&self) -> Result<()>;

    /// [`Optimizer::step`], skipped when `non_finite` (a bool device scalar) is set instead of
    /// checking the gradients itself: for a caller that already knows, as
    /// [`clip_grad_norm_checked`] does, so that the check costs no pass of its own over every
    /// gradient and the update need not wait for one.
    fn step_skipping(&self, non_finite: &Tensor) -> Result<()>;

    /// Drops every parameter's gradient.
    fn zero_grad(&self);

    /// Sets the learning rate for the next steps: a device scalar, so compiled steps that read it
    /// are not traced again.
    fn set_lr(&self, lr: f64) -> Result<()>;

    /// How many steps were skipped because a gradient held a NaN or an infinity (a device
    /// scalar; reading it on the host waits for the device, [`crate::DeviceMetric::set`] reads it
    /// without waiting).
    fn skipped_steps(&self) -> &Tensor;
}

/// What every optimizer here keeps: its parameters, the learning rate and the count of skipped
/// steps, both device scalars on the first parameter's device.
struct ParamGroup {
    params: Vec<Tensor>,
    lr: Tensor,
    skipped: Tensor,
}

impl ParamGroup {
    fn new(optimizer: &str, params: &[Tensor], lr: f64) -> Result<ParamGroup> {
        let first = params.first().ok_or_else(|| crate::Error::InvalidArgument {
            op: format!("{optimizer}::new"),
            loc: None,
            detail: "no parameters".into(),
        })?;
        Ok(ParamGroup { params: params.to_vec(), lr: device_scalar(lr, first)?, skipped: device_scalar(0.0, first)? })
    }

    fn zero_grad(&self) {
        self.params.iter().for_each(Tensor::zero_grad);
    }

    fn set_lr(&self, lr: f64) -> Result<()> {
        self.lr.assign(&device_scalar(lr, &self.lr)?)
    }
}

/// A one-element f32 tensor on `like`'s device.
fn device_scalar(value: f64, like: &Tensor) -> Result<Tensor> {
    Tensor::full([], value, DType::F32, like.device())
}

/// `t` in f32: itself when it is, else a cast (so f32 state adds no op to the graph).
fn in_f32(t: &Tensor) -> Result<Tensor> {
    if t.dtype() == DType::F32 {
        Ok(t.clone())
    } else {
        t.cast(DType::F32)
    }
}

/// A bool scalar: whether any gradient of `params` holds a NaN or an infinity.
fn any_non_finite(params: &[Tensor]) -> Result<Option<Tensor>> {
    let mut found: Option<Tensor> = None;
    for p in params {
        if let Some(g) = p.grad() {
            let bad = g.isfinite()?.logical_not()?.max_all()?;
            found = Some(match found {
                Some(f) => f.logical_or(&bad)?,
                None => bad,
            });
        }
    }
    Ok(found)
}

/// `state.assign(where(skip, state, new))`: the update (rounded to the state's dtype), unless
/// `skip`.
fn update(state: &Tensor, new: &Tensor, skip: Option<&Tensor>) -> Result<()> {
    let new = if new.dtype() == state.dtype() { new.clone() } else { new.cast(state.dtype())? };
    let kept = match skip {
        Some(skip) => Tensor::where_(skip, state, &new)?,
        None => new,
    };
    state.assign(&kept)
}

/// Counts one more skipped step when `skip` is set.
fn count_skip(skipped: &Tensor, skip: Option<&Tensor>) -> Result<()> {
    if let Some(skip) = skip {
        skipped.assign(&skipped.add(&skip.cast(DType::F32)?)?)?;
    }
    Ok(())
}
