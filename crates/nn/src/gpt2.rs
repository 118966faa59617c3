//! GPT-2 as nanoGPT's `model.py` defines it: token and learned position embeddings, `n_layer`
//! blocks, a final layer norm and a head tied to the token embedding.

use crate::embedding::lookup;
use crate::{Block, Embedding, Error, Init, LayerNorm, Module, Result};
use braze::{DType, Device, Tensor};

/// nanoGPT's `GPTConfig`, plus the parameters' dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt2Config {
    pub block_size: usize,
    pub vocab_size: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    /// Biases in the linear layers and layer norms (GPT-2 has them).
    pub bias: bool,
    pub dtype: DType,
}

impl Gpt2Config {
    /// GPT-2 124M as nanoGPT trains it: vocabulary padded to 50,304, context 1,024.
    pub fn gpt2() -> Gpt2Config {
        Gpt2Config {
            block_size: 1024,
            vocab_size: 50304,
            n_layer: 12,
            n_head: 12,
            n_embd: 768,
            bias: true,
            dtype: DType::F32,
        }
    }
}

pub struct Gpt2 {
    pub config: Gpt2Config,
    /// `transformer.wte`: also the head's weight (`lm_head.weight` in PyTorch is the same tensor).
    pub wte: Embedding,
    pub wpe: Embedding,
    pub h: Vec<Block>,
    pub ln_f: LayerNorm,
}

/// The token id's loss is ignored where the target is this (nanoGPT's `ignore_index=-1`).
pub const IGNORE_INDEX: i64 = -1;

impl Gpt2 {
    /// A model initialized as nanoGPT's `_init_weights` does: linear and embedding weights
    /// normal with std 0.02, the residual projections (`c_proj`) 0.02 / sqrt(2 n_layer), biases
    /// zero, norm weights one. The same seed gives the same weights on every device.
    pub fn new(config: Gpt2Config, device: Device, seed: u64) -> Result<Gpt2> {
        if config.vocab_size == 0 || config.block_size == 0 || config.n_layer == 0 {
            return Err(Error::invalid(
                "Gpt2::new",
                format!("vocab_size, block_size and n_layer must be positive, got {config:?}"),
            ));
        }
        let mut init = Init::new(config.dtype, device, seed);
        let c = config.n_embd;
        let wte = Embedding::new(&mut init, config.vocab_size, c, 0.02)?;
        let wpe = Embedding::new(&mut init, config.block_size, c, 0.02)?;
        let h = (0..config.n_layer)
            .map(|_| Block::new(&mut init, c, config.n_head, config.n_layer, config.bias))
            .collect::<Result<Vec<_>>>()?;
        let ln_f = LayerNorm::new(&mut init, c, config.bias)?;
        Ok(Gpt2 { config, wte, wpe, h, ln_f })
    }

    /// Logits `[B, T, vocab_size]` of token ids `idx` (`[B, T]`, i32 or i64, `T <= block_size`).
    #[track_caller]
    pub fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        let dims = idx.shape().dims().to_vec();
        let [_, t] = dims[..] else {
            return Err(Error::invalid("Gpt2::forward", format!("expected idx of [B, T], got {}", idx.shape())));
        };
        if t > self.config.block_size {
            return Err(Error::invalid(
                "Gpt2::forward",
                format!("sequence length {t} is longer than block_size {}", self.config.block_size),
            ));
        }
        let tokens = lookup(&self.wte.weight, idx)?;
        // Positions 0..T are the first T rows of the position table.
        let positions = self.wpe.weight.slice(0, 0, t, 1)?;
        let mut x = tokens.add(&positions)?;
        for block in &self.h {
            x = block.forward(&x)?;
        }
        let x = self.ln_f.forward(&x)?;
        Ok(x.matmul(&self.wte.weight.transpose(0, 1)?)?)
    }

    /// The mean cross-entropy of `forward(idx)` against `targets` (`[B, T]`; targets equal to
    /// [`IGNORE_INDEX`] count for nothing), as an f32 scalar; and the logits.
    #[track_caller]
    pub fn loss(&self, idx: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
        let logits = self.forward(idx)?;
        let dims = logits.shape().dims().to_vec();
        let rows = dims[0] * dims[1];
        if targets.shape() != idx.shape() {
            return Err(Error::invalid(
                "Gpt2::loss",
                format!("targets must have idx's shape {}, got {}", idx.shape(), targets.shape()),
            ));
        }
        let flat = logits.reshape([rows, dims[2]])?;
        let loss = flat.cross_entropy(&targets.reshape([rows])?, IGNORE_INDEX)?.cast(DType::F32)?;
        Ok((loss, logits))
    }

    /// nanoGPT's FLOP estimate per token of a training step: `6 N + 12 L C T`, where N counts
    /// the parameters without the position table.
    pub fn flops_per_token(&self, t: usize) -> f64 {
        let n = (self.num_parameters() - self.wpe.weight.numel()) as f64;
        let Gpt2Config { n_layer, n_embd, .. } = self.config;
        6.0 * n + 12.0 * (n_layer * n_embd * t) as f64
    }
}

impl Module for Gpt2 {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.wte.visit_parameters(&format!("{prefix}transformer.wte."), visit);
        self.wpe.visit_parameters(&format!("{prefix}transformer.wpe."), visit);
        for (i, block) in self.h.iter().enumerate() {
            block.visit_parameters(&format!("{prefix}transformer.h.{i}."), visit);
        }
        self.ln_f.visit_parameters(&format!("{prefix}transformer.ln_f."), visit);
    }
}
