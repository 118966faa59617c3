//! The benchmark workloads (`benches/workloads.md`), each defined once.
//!
//! A workload is two generic functions in [`definition`]: the inputs it takes and what it
//! computes. The same definition gives two forms:
//! - [`Workload`] (from [`build`]): the `Tensor`-API function with seeded inputs, run eagerly or
//!   compiled by the CLI and the tests;
//! - [`graph`]: the IR `Graph` of the workload at any shape, for the compiler's tests, built
//!   without allocating tensor data.
//!
//! [`multisum_sizes`] draws the `multisum` tensor sizes exactly as the PyTorch baseline
//! (`benches/torch_baseline.py`) does, so both time the same tensors.
//!
//! The GPT-2 training workloads ([`gpt2`]: `block_fwd`, `block_step`, `gpt2_step`) are built on
//! braze-nn's model, whose layers are their one definition.
//!
//! **Invariant:** a workload's inputs and formula are written once, in [`definition`] (or, for
//! the GPT-2 ones, in braze-nn); every other form is derived from them.

pub mod definition;
pub mod gpt2;
pub mod graph;
mod sizes;
mod workload;

pub use gpt2::Gpt2Sizes;
pub use sizes::{multisum_sizes, Mt19937};
pub use workload::{
    ew_chain, ln_relu_res, mlp_block, mlp_step, mlp_training_step, multisum, sync_demo, tiny_block, tiny_block_inputs,
    Sizes, TrainingStep, Workload, WorkloadFn, MLP_STEP_LAYERS, MLP_STEP_LR, MLP_STEP_PARAMS, NAMES,
};

/// The workload `name` at `sizes`; the GPT-2 workloads (sizes of their own) at
/// [`Gpt2Sizes::small`].
pub fn build(name: &str, sizes: &Sizes) -> braze::Result<Workload> {
    let small = Gpt2Sizes::small();
    match name {
        "block_fwd" => gpt2::block_workload(&small, braze::Device::Cpu, false),
        "block_step" => gpt2::block_workload(&small, braze::Device::Cpu, true),
        "gpt2_step" => Ok(gpt2::gpt2_training_step(&small, braze::Device::Cpu)?.0),
        _ => workload::build_defined(name, sizes),
    }
}
