//! nanoGPT's `configure_optimizers`: AdamW with weight decay on the parameters of two or more
//! dims (matrices and embeddings) and none on biases and norm weights, after a global
//! gradient-norm clip (`clip_grad_norm_`). Everything stays on the device: a compiled training
//! step holds the clip and both updates in its one graph.

use crate::{Error, Module, Result};
use braze::optim::{clip_grad_norm_checked, AdamW, Optimizer};
use braze::Tensor;

/// nanoGPT's optimizer settings (its `train.py` defaults for GPT-2).
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerConfig {
    pub lr: f64,
    pub weight_decay: f64,
    pub betas: (f64, f64),
    /// The largest joint L2 norm of the gradients; 0 turns clipping off.
    pub grad_clip: f64,
}

impl Default for OptimizerConfig {
    fn default() -> OptimizerConfig {
        OptimizerConfig { lr: 6e-4, weight_decay: 0.1, betas: (0.9, 0.95), grad_clip: 1.0 }
    }
}

/// Two AdamW groups (decayed and not) over every parameter of a model, with gradient clipping.
pub struct Gpt2Optimizer {
    params: Vec<Tensor>,
    decay: AdamW,
    no_decay: Option<AdamW>,
    grad_clip: f64,
}

impl Gpt2Optimizer {
    pub fn new(model: &impl Module, config: &OptimizerConfig) -> Result<Gpt2Optimizer> {
        let params = model.parameters();
        let (decay, no_decay): (Vec<Tensor>, Vec<Tensor>) = params.iter().cloned().partition(|p| p.rank() >= 2);
        if decay.is_empty() {
            return Err(Error::invalid("Gpt2Optimizer::new", "the model has no parameter of two or more dims"));
        }
        let adamw = |group: &[Tensor], weight_decay: f64| -> Result<AdamW> {
            Ok(AdamW::new(group, config.lr)?.betas(config.betas.0, config.betas.1).weight_decay(weight_decay))
        };
        Ok(Gpt2Optimizer {
            decay: adamw(&decay, config.weight_decay)?,
            no_decay: if no_decay.is_empty() { None } else { Some(adamw(&no_decay, 0.0)?) },
            params,
            grad_clip: config.grad_clip,
        })
    }

    /// Clips the gradients (when `grad_clip > 0`) and updates every parameter. Returns the
    /// gradients' joint norm before clipping (an f32 device scalar), when any has a gradient.
    ///
    /// With clipping, the step is skipped as a whole (both groups) when any gradient holds a NaN
    /// or an infinity, checked in the clip's launch ([`clip_grad_norm_checked`]); without it, each
    /// group checks its own gradients.
    pub fn step(&self) -> Result<Option<Tensor>> {
        let checked = if self.grad_clip > 0.0 { clip_grad_norm_checked(&self.params, self.grad_clip)? } else { None };
        for group in std::iter::once(&self.decay).chain(&self.no_decay) {
            match &checked {
                Some((_, non_finite)) => group.step_skipping(non_finite)?,
                None => group.step()?,
            }
        }
        Ok(checked.map(|(norm, _)| norm))
    }

    pub fn zero_grad(&self) {
        self.params.iter().for_each(Tensor::zero_grad);
    }

    /// The learning rate of the next steps (a device scalar: no retrace).
    pub fn set_lr(&self, lr: f64) -> Result<()> {
        self.decay.set_lr(lr)?;
        if let Some(no_decay) = &self.no_decay {
            no_decay.set_lr(lr)?;
        }
        Ok(())
    }

    /// The decayed parameters' AdamW (its step count is the number of steps taken).
    pub fn decayed(&self) -> &AdamW {
        &self.decay
    }

    /// The optimizer's state under names of its own: each group's step count
    /// (`optimizer.decay.step`, `optimizer.no_decay.step`) and each parameter's moments
    /// (`optimizer.exp_avg.{name}`, `optimizer.exp_avg_sq.{name}`), for a checkpoint to save
    /// and assign back.
    pub fn state(&self, model: &impl Module) -> Vec<(String, Tensor)> {
        let named = model.named_parameters();
        let (decay_names, no_decay_names): (Vec<_>, Vec<_>) = named.iter().partition(|(_, p)| p.rank() >= 2);
        let mut out = Vec::new();
        let groups = [("decay", Some(&self.decay), decay_names), ("no_decay", self.no_decay.as_ref(), no_decay_names)];
        for (group, adamw, names) in groups {
            let Some(adamw) = adamw else { continue };
            out.push((format!("optimizer.{group}.step"), adamw.steps().clone()));
            let (m, v) = adamw.moments();
            for (((name, _), m), v) in names.iter().zip(m).zip(v) {
                out.push((format!("optimizer.exp_avg.{name}"), m.clone()));
                out.push((format!("optimizer.exp_avg_sq.{name}"), v.clone()));
            }
        }
        out
    }

    /// Every parameter it updates, in the model's order.
    pub fn parameters(&self) -> &[Tensor] {
        &self.params
    }
}
