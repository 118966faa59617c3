//! nanoGPT's `CausalSelfAttention`: one `c_attn` projection to queries, keys and values, split
//! into heads, causal scaled dot-product attention, heads merged, `c_proj`.

use crate::{Error, Init, Linear, Module, Result};
use braze::Tensor;

pub struct CausalSelfAttention {
    pub c_attn: Linear,
    pub c_proj: Linear,
    pub n_head: usize,
}

impl CausalSelfAttention {
    /// `proj_std` is the standard deviation of `c_proj`'s weight (nanoGPT scales residual
    /// projections by `1 / sqrt(2 n_layer)`).
    pub fn new(init: &mut Init, n_embd: usize, n_head: usize, bias: bool, proj_std: f64) -> Result<Self> {
        if n_head == 0 || !n_embd.is_multiple_of(n_head) {
            return Err(Error::invalid(
                "CausalSelfAttention",
                format!("n_embd must be a multiple of n_head, got n_embd={n_embd}, n_head={n_head}"),
            ));
        }
        Ok(CausalSelfAttention {
            c_attn: Linear::new(init, n_embd, 3 * n_embd, bias, 0.02)?,
            c_proj: Linear::new(init, n_embd, n_embd, bias, proj_std)?,
            n_head,
        })
    }

    /// `x`: `[B, T, C]` to `[B, T, C]`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.shape().dims().to_vec();
        let [b, t, c] = dims[..] else {
            return Err(Error::invalid("CausalSelfAttention", format!("expected x of [B, T, C], got {}", x.shape())));
        };
        let (h, d) = (self.n_head, c / self.n_head);
        let qkv = self.c_attn.forward(x)?;
        // [B, T, C] slice -> [B, T, H, D] -> [B, H, T, D].
        let heads = |k: usize| -> Result<Tensor> {
            Ok(qkv.slice(2, k * c, (k + 1) * c, 1)?.reshape([b, t, h, d])?.transpose(1, 2)?)
        };
        let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
        let y = q.scaled_dot_product_attention(&k, &v, true, None)?;
        self.c_proj.forward(&y.transpose(1, 2)?.reshape([b, t, c])?)
    }
}

impl Module for CausalSelfAttention {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.c_attn.visit_parameters(&format!("{prefix}c_attn."), visit);
        self.c_proj.visit_parameters(&format!("{prefix}c_proj."), visit);
    }
}
