//! Stochastic gradient descent with momentum, Nesterov momentum and weight decay, as
//! `torch.optim.SGD` defines them.

use super::{any_non_finite, count_skip, in_f32, update, Optimizer, ParamGroup, StateDType};
use crate::{DType, Result, Tensor};

pub struct Sgd {
    group: ParamGroup,
    momentum: f64,
    nesterov: bool,
    weight_decay: f64,
    /// Momentum buffers, zero at first: `momentum * 0 + g` is PyTorch's first buffer.
    buffers: Vec<Tensor>,
    /// The buffers' dtype ([`Sgd::state_dtype`]).
    state: StateDType,
}

impl Sgd {
    /// Plain SGD over `params` (float tensors that require grad) with learning rate `lr`.
    pub fn new(params: &[Tensor], lr: f64) -> Result<Sgd> {
        Ok(Sgd {
            group: ParamGroup::new("Sgd", params, lr)?,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            buffers: Vec::new(),
            state: StateDType::F32,
        })
    }

    /// Momentum (and Nesterov momentum when `nesterov`).
    pub fn momentum(mut self, momentum: f64, nesterov: bool) -> Result<Sgd> {
        self.momentum = momentum;
        self.nesterov = nesterov;
        self.buffers = self.group.params.iter().map(|p| self.state.zeros_like(p)).collect::<Result<_>>()?;
        Ok(self)
    }

    /// Keeps the momentum buffers in `state` (f32 by default); they start again from zero, so
    /// this belongs with the construction, before the first step.
    pub fn state_dtype(mut self, state: StateDType) -> Result<Sgd> {
        self.state = state;
        if !self.buffers.is_empty() {
            self.buffers = self.group.params.iter().map(|p| state.zeros_like(p)).collect::<Result<_>>()?;
        }
        Ok(self)
    }

    /// L2 weight decay added to the gradient.
    pub fn weight_decay(mut self, weight_decay: f64) -> Sgd {
        self.weight_decay = weight_decay;
        self
    }
}

impl Optimizer for Sgd {
    fn step(&self) -> Result<()> {
        self.update_all(any_non_finite(&self.group.params)?)
    }

    fn step_skipping(&self, non_finite: &Tensor) -> Result<()> {
        self.update_all(Some(non_finite.clone()))
    }

    fn zero_grad(&self) {
        self.group.zero_grad();
    }

    fn set_lr(&self, lr: f64) -> Result<()> {
        self.group.set_lr(lr)
    }

    fn skipped_steps(&self) -> &Tensor {
        &self.group.skipped
    }
}

impl Sgd {
    /// Every parameter's update, kept as it was where `skip` is set.
    fn update_all(&self, skip: Option<Tensor>) -> Result<()> {
        for (i, p) in self.group.params.iter().enumerate() {
            let Some(grad) = p.grad() else { continue };
            let p32 = p.cast(DType::F32)?;
            let mut g = grad.cast(DType::F32)?;
            if self.weight_decay != 0.0 {
                g = g.add(&p32.mul_scalar(self.weight_decay)?)?;
            }
            if let Some(buffer) = self.buffers.get(i) {
                let next = in_f32(buffer)?.mul_scalar(self.momentum)?.add(&g)?;
                update(buffer, &next, skip.as_ref())?;
                g = if self.nesterov { g.add(&next.mul_scalar(self.momentum)?)? } else { next };
            }
            let next = p32.sub(&g.mul(&self.group.lr)?)?.cast(p.dtype())?;
            update(p, &next, skip.as_ref())?;
        }
        count_skip(&self.group.skipped, skip.as_ref())
    }
}
