//! The GPT-2 training workloads of `benches/workloads.md` ("Training"), on braze-nn's model:
//! `block_fwd` (one block's forward), `block_step` (the same plus the backward of `mean(y)`) and
//! `gpt2_step` (nanoGPT's whole training step: cross-entropy, backward, gradient clipping 1.0,
//! AdamW with lr 3e-4 and weight decay 0.1 on matrices). The model's parameters are captured by
//! the functions; the inputs are `x` (`[B, T, C]`) or the token ids and targets (`[B, T]`, i64).

use crate::Workload;
use braze::{DType, Device, Error, HostData, HostTensor, Result, Tensor};
use braze_nn::{Block, Gpt2, Gpt2Config, Init, Module, OptimizerConfig, Trainer};
use std::sync::Arc;

/// Sizes of the GPT-2 workloads.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt2Sizes {
    pub batch: usize,
    pub seq: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    pub vocab_size: usize,
    /// The compute dtype: `block_fwd` and `block_step` hold their parameters in it; `gpt2_step`
    /// holds f32 parameters and, for bf16 or f16, runs its forward in an autocast region of it
    /// (nanoGPT's mixed precision).
    pub dtype: DType,
    pub seed: u64,
}

impl Gpt2Sizes {
    /// The benchmark's: GPT-2 124M at B=16, T=1024, in bf16.
    pub fn standard() -> Gpt2Sizes {
        Gpt2Sizes {
            batch: 16,
            seq: 1024,
            n_layer: 12,
            n_head: 12,
            n_embd: 768,
            vocab_size: 50304,
            dtype: DType::BF16,
            seed: 0,
        }
    }

    /// Small enough for the CPU reference backend.
    pub fn small() -> Gpt2Sizes {
        Gpt2Sizes { batch: 2, seq: 16, n_layer: 2, n_head: 2, n_embd: 32, vocab_size: 64, dtype: DType::F32, seed: 0 }
    }

    pub fn config(&self) -> Gpt2Config {
        Gpt2Config {
            block_size: self.seq,
            vocab_size: self.vocab_size,
            n_layer: self.n_layer,
            n_head: self.n_head,
            n_embd: self.n_embd,
            bias: true,
            dtype: self.dtype,
        }
    }

    /// `B{batch} T{seq} C{n_embd} ...` as the PyTorch baseline names its rows.
    pub fn shape(&self, name: &str) -> String {
        match name {
            "gpt2_step" => format!("L{} B{} T{} C{}", self.n_layer, self.batch, self.seq, self.n_embd),
            _ => format!("B{} T{} C{} H{}", self.batch, self.seq, self.n_embd, self.n_head),
        }
    }
}

/// nanoGPT's learning rate and weight decay of the benchmark's `gpt2_step`.
pub const GPT2_STEP_LR: f64 = 3e-4;

fn nn(e: braze_nn::Error) -> Error {
    e.into()
}

/// Uniform token ids in `0..vocab` as i64 `[batch, seq]` (a seeded LCG, the same everywhere).
pub fn random_tokens(sizes: &Gpt2Sizes, seed: u64, device: Device) -> Result<Tensor> {
    Tensor::from_host(random_token_ids(sizes, seed)?).to_device(device)
}

/// [`random_tokens`] as host data (a batch for a prefetcher to stage).
pub fn random_token_ids(sizes: &Gpt2Sizes, seed: u64) -> Result<HostTensor> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let ids: Vec<i64> = (0..sizes.batch * sizes.seq)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 33) % sizes.vocab_size as u64) as i64
        })
        .collect();
    HostTensor::new([sizes.batch, sizes.seq], HostData::I64(ids)).map_err(|e| Error::InvalidArgument {
        op: "random_token_ids".into(),
        loc: None,
        detail: e.to_string(),
    })
}

/// `block_fwd` (`backward: false`) or `block_step`: one GPT-2 block on `x` `[B, T, C]`; the step
/// returns `mean(y)` in f32 and leaves the parameters' gradients.
pub fn block_workload(sizes: &Gpt2Sizes, device: Device, backward: bool) -> Result<Workload> {
    let mut init = Init::new(sizes.dtype, device, sizes.seed);
    let block = Arc::new(Block::new(&mut init, sizes.n_embd, sizes.n_head, 1, true).map_err(nn)?);
    let x = Tensor::randn([sizes.batch, sizes.seq, sizes.n_embd], sizes.dtype, sizes.seed + 1000)?.to_device(device)?;
    let function = move |a: &[Tensor]| -> Result<Vec<Tensor>> {
        let y = block.forward(&a[0]).map_err(nn)?;
        if !backward {
            return Ok(vec![y]);
        }
        block.zero_grad();
        let loss = y.cast(DType::F32)?.mean_all()?;
        loss.backward()?;
        Ok(vec![loss])
    };
    Ok(Workload {
        name: if backward { "block_step" } else { "block_fwd" },
        input_names: vec!["x".into()],
        inputs: vec![x],
        function: Arc::new(function),
    })
}

/// `gpt2_step` with its trainer (model and optimizer, f32, the forward autocast to the sizes'
/// dtype when it is 16-bit), inputs `idx` and `targets`; each call trains one step and returns
/// the loss and the gradients' norm before clipping.
pub fn gpt2_training_step(sizes: &Gpt2Sizes, device: Device) -> Result<(Workload, Trainer)> {
    let config = Gpt2Config { dtype: DType::F32, ..sizes.config() };
    let model = Gpt2::new(config, device, sizes.seed).map_err(nn)?;
    let config = OptimizerConfig { lr: GPT2_STEP_LR, weight_decay: 0.1, betas: (0.9, 0.95), grad_clip: 1.0 };
    let autocast = (sizes.dtype != DType::F32).then_some(sizes.dtype);
    let trainer = Trainer::new(model, &config).map_err(nn)?.with_autocast(autocast);
    let workload = Workload {
        name: "gpt2_step",
        input_names: vec!["idx".into(), "targets".into()],
        inputs: vec![random_tokens(sizes, sizes.seed + 1, device)?, random_tokens(sizes, sizes.seed + 2, device)?],
        function: Arc::new(trainer.step_fn()),
    };
    Ok((workload, trainer))
}

/// nanoGPT's FLOPs of one `gpt2_step` (`6 N + 12 L C T` per token, N without positions).
pub fn gpt2_step_flops(trainer: &Trainer, sizes: &Gpt2Sizes) -> f64 {
    trainer.model.flops_per_token(sizes.seq) * (sizes.batch * sizes.seq) as f64
}

/// The parameter count of the model (tied head counted once).
pub fn gpt2_parameters(trainer: &Trainer) -> usize {
    trainer.model.num_parameters()
}
