//! nanoGPT's `MLP`: `c_proj(gelu_tanh(c_fc(x)))`, four times as wide inside.

use crate::{Init, Linear, Module, Result};
use braze::Tensor;

pub struct Mlp {
    pub c_fc: Linear,
    pub c_proj: Linear,
}

impl Mlp {
    pub fn new(init: &mut Init, n_embd: usize, bias: bool, proj_std: f64) -> Result<Mlp> {
        Ok(Mlp {
            c_fc: Linear::new(init, n_embd, 4 * n_embd, bias, 0.02)?,
            c_proj: Linear::new(init, 4 * n_embd, n_embd, bias, proj_std)?,
        })
    }

    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.c_proj.forward(&self.c_fc.forward(x)?.gelu_tanh()?)
    }
}

impl Module for Mlp {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.c_fc.visit_parameters(&format!("{prefix}c_fc."), visit);
        self.c_proj.visit_parameters(&format!("{prefix}c_proj."), visit);
    }
}
