//! braze-nn: neural-network layers on braze's `Tensor` API, and GPT-2 as nanoGPT defines it.
//!
//! Layers hold their parameters as tensors that require grad; a forward pass is ordinary `Tensor`
//! code, so it runs eagerly or traced inside `compile()` (a whole training step in one graph).
//! Parameters are named as PyTorch's `state_dict` names them (`transformer.h.0.attn.c_attn.weight`)
//! and laid out as PyTorch lays them out (a `Linear` weight is `[out, in]`), so safetensors files
//! written by PyTorch load as they are ([`checkpoint`]).
//!
//! Code map: [`Module`] (parameter iteration by name); `init` (seeded normal initialization);
//! `linear`, `embedding`, `norm`, `attention`, `mlp`, `block`: the layers; `gpt2`: the model and
//! its config; `optim`: nanoGPT's optimizer setup (AdamW with weight decay on 2-D parameters only)
//! and gradient clipping; [`checkpoint`]: safetensors load and save.
//!
//! **Invariant:** every parameter is reachable under exactly one PyTorch name through
//! [`Module::named_parameters`] (a tied parameter under the first name PyTorch gives it), and a
//! layer's forward is written once, the same eagerly and compiled.

mod attention;
mod block;
pub mod checkpoint;
mod embedding;
mod error;
mod gpt2;
mod init;
mod linear;
mod mlp;
mod module;
mod norm;
mod optim;
mod train;

pub use attention::CausalSelfAttention;
pub use block::Block;
pub use embedding::Embedding;
pub use error::{Error, Result};
pub use gpt2::{Gpt2, Gpt2Config};
pub use init::Init;
pub use linear::Linear;
pub use mlp::Mlp;
pub use module::Module;
pub use norm::{LayerNorm, RmsNorm};
pub use optim::{Gpt2Optimizer, OptimizerConfig};
pub use train::Trainer;
