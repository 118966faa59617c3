//! nanoGPT's pre-norm transformer `Block`: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.

use crate::{CausalSelfAttention, Init, LayerNorm, Mlp, Module, Result};
use braze::Tensor;

pub struct Block {
    pub ln_1: LayerNorm,
    pub attn: CausalSelfAttention,
    pub ln_2: LayerNorm,
    pub mlp: Mlp,
}

impl Block {
    /// `n_layer` sets the residual projections' initial scale, `0.02 / sqrt(2 n_layer)`.
    pub fn new(init: &mut Init, n_embd: usize, n_head: usize, n_layer: usize, bias: bool) -> Result<Block> {
        let proj_std = 0.02 / (2.0 * n_layer.max(1) as f64).sqrt();
        Ok(Block {
            ln_1: LayerNorm::new(init, n_embd, bias)?,
            attn: CausalSelfAttention::new(init, n_embd, n_head, bias, proj_std)?,
            ln_2: LayerNorm::new(init, n_embd, bias)?,
            mlp: Mlp::new(init, n_embd, bias, proj_std)?,
        })
    }

    /// `x`: `[B, T, C]`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.add(&self.attn.forward(&self.ln_1.forward(x)?)?)?;
        Ok(x.add(&self.mlp.forward(&self.ln_2.forward(&x)?)?)?)
    }
}

impl Module for Block {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.ln_1.visit_parameters(&format!("{prefix}ln_1."), visit);
        self.attn.visit_parameters(&format!("{prefix}attn."), visit);
        self.ln_2.visit_parameters(&format!("{prefix}ln_2."), visit);
        self.mlp.visit_parameters(&format!("{prefix}mlp."), visit);
    }
}
