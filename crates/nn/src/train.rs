//! A GPT-2 training step as one function for `compile(..).fullgraph(true)`: zero the gradients,
//! forward, cross-entropy, backward, clip, AdamW. Model and optimizer state are captured tensors,
//! so each call trains one step without a host read.

use crate::{Gpt2, Gpt2Optimizer, OptimizerConfig, Result};
use braze::Tensor;
use std::sync::Arc;

/// A model with its optimizer, shared with the step functions it hands out.
#[derive(Clone)]
pub struct Trainer {
    pub model: Arc<Gpt2>,
    pub optimizer: Arc<Gpt2Optimizer>,
}

impl Trainer {
    /// `model` with nanoGPT's optimizer groups over its parameters.
    pub fn new(model: Gpt2, config: &OptimizerConfig) -> Result<Trainer> {
        let optimizer = Arc::new(Gpt2Optimizer::new(&model, config)?);
        Ok(Trainer { model: Arc::new(model), optimizer })
    }

    /// The training step on `[idx, targets]` (`[B, T]` token ids): returns the loss before the
    /// update and the gradients' norm before clipping, both f32 scalars.
    pub fn step_fn(&self) -> impl Fn(&[Tensor]) -> braze::Result<Vec<Tensor>> + Send + Sync + 'static {
        let trainer = self.clone();
        move |a: &[Tensor]| Ok(trainer.step(arg(a, 0)?, arg(a, 1)?)?)
    }

    /// The mean loss on `[idx, targets]` without gradients (evaluation).
    pub fn eval_fn(&self) -> impl Fn(&[Tensor]) -> braze::Result<Vec<Tensor>> + Send + Sync + 'static {
        let model = self.model.clone();
        move |a: &[Tensor]| {
            let (idx, targets) = (arg(a, 0)?, arg(a, 1)?);
            braze::no_grad(|| Ok(vec![model.loss(idx, targets)?.0]))
        }
    }

    fn step(&self, idx: &Tensor, targets: &Tensor) -> Result<Vec<Tensor>> {
        self.optimizer.zero_grad();
        let (loss, _) = self.model.loss(idx, targets)?;
        loss.backward()?;
        let norm = match self.optimizer.step()? {
            Some(norm) => norm,
            None => Tensor::zeros([], braze::DType::F32, idx.device())?,
        };
        Ok(vec![loss, norm])
    }
}

fn arg(a: &[Tensor], i: usize) -> braze::Result<&Tensor> {
    a.get(i).ok_or_else(|| braze::Error::Arity {
        function: "gpt2 training step".into(),
        expected: 2,
        actual: a.len(),
        names: vec!["idx".into(), "targets".into()],
    })
}
