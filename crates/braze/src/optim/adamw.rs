//! AdamW: Adam with decoupled weight decay and bias correction, as `torch.optim.AdamW` defines it.

use super::{any_non_finite, count_skip, device_scalar, in_f32, update, Optimizer, ParamGroup, StateDType};
use crate::{DType, Result, Tensor};

pub struct AdamW {
    group: ParamGroup,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    /// Steps taken so far (f32 device scalar), for the bias correction.
    step: Tensor,
    /// First and second moments, in f32 or the parameters' dtypes ([`AdamW::state_dtype`]).
    m: Vec<Tensor>,
    v: Vec<Tensor>,
}

impl AdamW {
    /// AdamW with PyTorch's defaults (betas 0.9 and 0.999, eps 1e-8, weight decay 0.01).
    pub fn new(params: &[Tensor], lr: f64) -> Result<AdamW> {
        let group = ParamGroup::new("AdamW", params, lr)?;
        Ok(AdamW {
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            step: device_scalar(0.0, &group.lr)?,
            m: params.iter().map(|p| StateDType::F32.zeros_like(p)).collect::<Result<_>>()?,
            v: params.iter().map(|p| StateDType::F32.zeros_like(p)).collect::<Result<_>>()?,
            group,
        })
    }

    /// Keeps the moments in `state` (f32 by default); the moments start again from zero, so
    /// this belongs with the construction, before the first step.
    pub fn state_dtype(mut self, state: StateDType) -> Result<AdamW> {
        self.m = self.group.params.iter().map(|p| state.zeros_like(p)).collect::<Result<_>>()?;
        self.v = self.group.params.iter().map(|p| state.zeros_like(p)).collect::<Result<_>>()?;
        Ok(self)
    }

    pub fn betas(mut self, beta1: f64, beta2: f64) -> AdamW {
        self.betas = (beta1, beta2);
        self
    }

    pub fn eps(mut self, eps: f64) -> AdamW {
        self.eps = eps;
        self
    }

    pub fn weight_decay(mut self, weight_decay: f64) -> AdamW {
        self.weight_decay = weight_decay;
        self
    }

    /// The step count so far (a device scalar).
    pub fn steps(&self) -> &Tensor {
        &self.step
    }

    /// The first and second moments, one of each per parameter in the order given to `new`
    /// (PyTorch's `exp_avg` and `exp_avg_sq`): with [`AdamW::steps`], the state a checkpoint
    /// saves and `assign`s back to resume.
    pub fn moments(&self) -> (&[Tensor], &[Tensor]) {
        (&self.m, &self.v)
    }
}

impl Optimizer for AdamW {
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

impl AdamW {
    /// Every parameter's update, kept as it was where `skip` is set.
    fn update_all(&self, skip: Option<Tensor>) -> Result<()> {
        let (b1, b2) = self.betas;
        let step = self.step.add_scalar(1.0)?;
        // 1 - beta^step on the device: the step count never reaches the host.
        let correction = |beta: f64| -> Result<Tensor> {
            let powered = Tensor::full([], beta, DType::F32, step.device())?.pow(&step)?;
            powered.neg()?.add_scalar(1.0)
        };
        let (c1, c2) = (correction(b1)?, correction(b2)?);
        let step_size = self.group.lr.div(&c1)?;
        let sqrt_c2 = c2.sqrt()?;
        for (i, p) in self.group.params.iter().enumerate() {
            let Some(grad) = p.grad() else { continue };
            let g = grad.cast(DType::F32)?;
            let decayed = p.cast(DType::F32)?.mul(&self.group.lr.mul_scalar(-self.weight_decay)?.add_scalar(1.0)?)?;
            let m = in_f32(&self.m[i])?.mul_scalar(b1)?.add(&g.mul_scalar(1.0 - b1)?)?;
            let v = in_f32(&self.v[i])?.mul_scalar(b2)?.add(&g.mul(&g)?.mul_scalar(1.0 - b2)?)?;
            let denom = v.sqrt()?.div(&sqrt_c2)?.add_scalar(self.eps)?;
            let next = decayed.sub(&m.div(&denom)?.mul(&step_size)?)?.cast(p.dtype())?;
            update(&self.m[i], &m, skip.as_ref())?;
            update(&self.v[i], &v, skip.as_ref())?;
            update(p, &next, skip.as_ref())?;
        }
        update(&self.step, &step, skip.as_ref())?;
        count_skip(&self.group.skipped, skip.as_ref())
    }
}
