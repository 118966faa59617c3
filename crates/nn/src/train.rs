//! A GPT-2 training step as one function for `compile(..).fullgraph(true)`: zero the gradients,
//! forward, cross-entropy, backward, clip, AdamW. Model and optimizer state are captured tensors,
//! so each call trains one step without a host read.

use crate::{Gpt2, Gpt2Optimizer, OptimizerConfig, Result};
use braze::{DType, Tensor};
use std::sync::Arc;

/// A model with its optimizer, shared with the step functions it hands out.
#[derive(Clone)]
pub struct Trainer {
    pub model: Arc<Gpt2>,
    pub optimizer: Arc<Gpt2Optimizer>,
    /// The forward and loss run in an autocast region of this dtype (mixed precision with the
    /// model's parameters and the optimizer's state as they are, usually f32), as nanoGPT's
    /// `torch.autocast(dtype=torch.bfloat16)`.
    pub autocast: Option<DType>,
}

impl Trainer {
    /// `model` with nanoGPT's optimizer groups over its parameters, no autocast.
    pub fn new(model: Gpt2, config: &OptimizerConfig) -> Result<Trainer> {
        let optimizer = Arc::new(Gpt2Optimizer::new(&model, config)?);
        Ok(Trainer { model: Arc::new(model), optimizer, autocast: None })
    }

    /// The same trainer with its forward and loss in an autocast region of `dtype`.
    pub fn with_autocast(mut self, dtype: Option<DType>) -> Trainer {
        self.autocast = dtype;
        self
    }

    /// The model's mean loss on `idx` and `targets`, in the autocast region if there is one.
    fn loss(&self, idx: &Tensor, targets: &Tensor) -> Result<Tensor> {
        match self.autocast {
            Some(dtype) => braze::autocast(dtype, || Ok(self.model.loss(idx, targets)?.0)),
            None => Ok(self.model.loss(idx, targets)?.0),
        }
    }

    /// The training step on `[idx, targets]` (`[B, T]` token ids): returns the loss before the
    /// update and the gradients' norm before clipping, both f32 scalars.
    pub fn step_fn(&self) -> impl Fn(&[Tensor]) -> braze::Result<Vec<Tensor>> + Send + Sync + 'static {
        let trainer = self.clone();
        move |a: &[Tensor]| Ok(trainer.step(arg(a, 0)?, arg(a, 1)?)?)
    }

    /// The mean loss on `[idx, targets]` without gradients (evaluation).
    pub fn eval_fn(&self) -> impl Fn(&[Tensor]) -> braze::Result<Vec<Tensor>> + Send + Sync + 'static {
        let trainer = self.clone();
        move |a: &[Tensor]| {
            let (idx, targets) = (arg(a, 0)?, arg(a, 1)?);
            braze::no_grad(|| Ok(vec![trainer.loss(idx, targets)?]))
        }
    }

    fn step(&self, idx: &Tensor, targets: &Tensor) -> Result<Vec<Tensor>> {
        self.optimizer.zero_grad();
        let loss = self.loss(idx, targets)?;
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
