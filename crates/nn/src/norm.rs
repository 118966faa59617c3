//! `nn.LayerNorm` (bias optional, as nanoGPT's) and `nn.RMSNorm` over the last dim.

use crate::{Init, Module, Result};
use braze::Tensor;

pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub eps: f64,
}

impl LayerNorm {
    /// Unit weight and (with `bias`) zero bias over `dim` features; eps 1e-5 as PyTorch's.
    pub fn new(init: &mut Init, dim: usize, bias: bool) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: init.ones(&[dim])?,
            bias: if bias { Some(init.zeros(&[dim])?) } else { None },
            eps: 1e-5,
        })
    }

    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let bias = match &self.bias {
            Some(b) => b.clone(),
            None => Tensor::zeros(self.weight.shape(), self.weight.dtype(), self.weight.device())?,
        };
        Ok(x.layer_norm(&self.weight, &bias, self.eps)?)
    }
}

impl Module for LayerNorm {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        visit(format!("{prefix}weight"), &self.weight);
        if let Some(b) = &self.bias {
            visit(format!("{prefix}bias"), b);
        }
    }
}

pub struct RmsNorm {
    pub weight: Tensor,
    pub eps: f64,
}

impl RmsNorm {
    /// Unit weight over `dim` features.
    pub fn new(init: &mut Init, dim: usize, eps: f64) -> Result<RmsNorm> {
        Ok(RmsNorm { weight: init.ones(&[dim])?, eps })
    }

    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.rms_norm(&self.weight, self.eps)?)
    }
}

impl Module for RmsNorm {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        visit(format!("{prefix}weight"), &self.weight);
    }
}
