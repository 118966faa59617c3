//! A training loop: a small GPT on a fixed batch, the whole step (forward, cross-entropy,
//! backward, gradient clipping, AdamW) compiled into one graph with `fullgraph(true)`, the
//! learning rate changed every step without retracing.
//!
//! cargo run --release --example training_loop

use braze::{compile, Device, Tensor};
use braze_nn::{Gpt2, Gpt2Config, OptimizerConfig, Trainer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    run(Device::best_available(), 50)
}

fn run(dev: Device, steps: usize) -> Result<(), Box<dyn std::error::Error>> {
    let config = Gpt2Config { block_size: 16, vocab_size: 32, n_layer: 2, n_head: 2, n_embd: 32, ..Gpt2Config::gpt2() };
    let trainer = Trainer::new(Gpt2::new(config, dev, 0)?, &OptimizerConfig { lr: 1e-2, ..Default::default() })?;
    let step = compile(trainer.step_fn()).fullgraph(true);
    // Next-token prediction on a repeating sequence.
    let ids: Vec<i64> = (0..4 * 17).map(|i| (i * 5 % 32) as i64).collect();
    let rows: Vec<Vec<i64>> = ids.chunks(17).map(<[i64]>::to_vec).collect();
    let idx: Vec<i64> = rows.iter().flat_map(|r| r[..16].to_vec()).collect();
    let targets: Vec<i64> = rows.iter().flat_map(|r| r[1..].to_vec()).collect();
    let idx = Tensor::from_vec(idx, [4, 16])?.to_device(dev)?;
    let targets = Tensor::from_vec(targets, [4, 16])?.to_device(dev)?;
    for k in 0..steps {
        trainer.optimizer.set_lr(1e-2 * (1.0 - k as f64 / steps as f64))?;
        let out = step.call(&[idx.clone(), targets.clone()])?;
        if k % 10 == 0 || k + 1 == steps {
            println!("step {k:>2}: loss {:.4}, grad norm {:.3}", out[0].item::<f32>()?, out[1].item::<f32>()?);
        }
    }
    println!("traces: {} (one for all steps)", step.stats().traces);
    Ok(())
}

#[cfg(test)]
mod tests {
    // 3 steps: the trace and compile, then two cached calls (50 take ~17 s in a debug build).
    #[test]
    fn runs_on_the_cpu() {
        super::run(braze::Device::Cpu, 3).expect("the example runs");
    }
}
