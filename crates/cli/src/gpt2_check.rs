//! `braze gpt2-check`: braze-nn's GPT-2 from PyTorch's initial weights and batches
//! (`benches/torch_gpt2.py --write DIR`), each step's logits and loss compared with PyTorch's in
//! f32, training on with the compiled step (clip and AdamW as nanoGPT's) so later steps check
//! the optimizer too.

use anyhow::{bail, Context, Result};
use braze::{compile, Device, Tensor};
use braze_nn::checkpoint::{load_model, TensorFile};
use braze_nn::{Gpt2, Gpt2Config, OptimizerConfig, Trainer};
use braze_workloads::gpt2::GPT2_STEP_LR;
use std::path::Path;

/// f32 on both sides: what differs is the order of sums.
const LOSS_RTOL: f64 = 1e-4;
const LOGIT_ATOL: f64 = 2e-3;

fn meta(file: &TensorFile, key: &str) -> Result<usize> {
    let v = file.metadata.get(key).with_context(|| format!("{}: no `{key}` in its metadata", file.path))?;
    v.parse().with_context(|| format!("{}: metadata `{key}` = `{v}`", file.path))
}

/// One line per step; an error naming the first step and quantity out of tolerance.
pub fn check(dir: &Path, device: Device) -> Result<Vec<String>> {
    let weights = TensorFile::read(&dir.join("weights.safetensors"))?;
    let config = Gpt2Config {
        n_layer: meta(&weights, "n_layer")?,
        n_head: meta(&weights, "n_head")?,
        n_embd: meta(&weights, "n_embd")?,
        vocab_size: meta(&weights, "vocab_size")?,
        block_size: meta(&weights, "block_size")?,
        ..Gpt2Config::gpt2()
    };
    let steps = meta(&weights, "steps")?;
    let model = Gpt2::new(config.clone(), device, 0)?;
    load_model(&weights, &model)?;
    let opt = OptimizerConfig { lr: GPT2_STEP_LR, weight_decay: 0.1, betas: (0.9, 0.95), grad_clip: 1.0 };
    let trainer = Trainer::new(model, &opt)?;
    let step = compile(trainer.step_fn()).fullgraph(true).name("gpt2_step");
    let mut lines = Vec::new();
    for k in 0..steps {
        let file = TensorFile::read(&dir.join(format!("step-{k}.safetensors")))?;
        let take = |name: &str| -> Result<Tensor> {
            let t = file.tensors.get(name).with_context(|| format!("{}: no tensor `{name}`", file.path))?;
            Ok(Tensor::from_host(t.clone()).to_device(device)?)
        };
        let (idx, targets) = (take("idx")?, take("targets")?);
        let torch_loss = take("loss")?.to_host()?.get_f64(0);
        let torch_logits = take("logits0")?.to_host()?.to_f64_vec();
        let logits = braze::no_grad(|| trainer.model.forward(&idx))?;
        let first = logits.slice(0, 0, 1, 1)?.to_host()?.to_f64_vec();
        if first.len() != torch_logits.len() {
            bail!("step {k}: logits0 has {} values, braze's first sequence {}", torch_logits.len(), first.len());
        }
        // A NaN on either side is an infinite error (f64::max would skip it).
        let logit_err = first
            .iter()
            .zip(&torch_logits)
            .map(|(a, b)| if (a - b).is_nan() { f64::INFINITY } else { (a - b).abs() })
            .fold(0.0, f64::max);
        let loss = step.call(&[idx, targets])?[0].to_host()?.get_f64(0);
        let loss_err = (loss - torch_loss).abs() / torch_loss.abs().max(1e-12);
        lines.push(format!(
            "step {k}: loss {loss:.6} (PyTorch {torch_loss:.6}, rel err {loss_err:.2e}), logits max err {logit_err:.2e}"
        ));
        let within = loss_err <= LOSS_RTOL && logit_err <= LOGIT_ATOL; // false for a NaN loss
        if !within {
            bail!("step {k}: braze differs from PyTorch beyond tolerance: {}", lines.last().unwrap());
        }
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use braze_nn::checkpoint::save;
    use braze_nn::Module;
    use std::collections::HashMap;

    /// A run written as torch_gpt2.py writes one, from braze's own eager f32 forward; then the
    /// loss of step 1 is perturbed and the check must fail there.
    #[test]
    fn gpt2_check_reads_pytorchs_files_and_catches_a_difference() {
        let dir = std::env::temp_dir().join(format!("braze-gpt2-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config =
            Gpt2Config { n_layer: 1, n_head: 2, n_embd: 16, vocab_size: 19, block_size: 8, ..Gpt2Config::gpt2() };
        let model = Gpt2::new(config.clone(), Device::Cpu, 5).unwrap();
        let meta: HashMap<String, String> =
            [("n_layer", 1), ("n_head", 2), ("n_embd", 16), ("vocab_size", 19), ("block_size", 8), ("steps", 2)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        save(&dir.join("weights.safetensors"), &model.named_parameters(), &meta).unwrap();
        let opt = OptimizerConfig { lr: GPT2_STEP_LR, weight_decay: 0.1, betas: (0.9, 0.95), grad_clip: 1.0 };
        let trainer = Trainer::new(model, &opt).unwrap();
        let eager_step = trainer.step_fn();
        for k in 0..2u64 {
            let ids = |s: u64| -> Tensor {
                Tensor::from_vec((0..16).map(|i| ((i as u64 * 7 + s * 5 + k) % 19) as i64).collect::<Vec<_>>(), [2, 8])
                    .unwrap()
            };
            let (idx, targets) = (ids(1), ids(2));
            let logits0 = braze::no_grad(|| trainer.model.forward(&idx))
                .unwrap()
                .slice(0, 0, 1, 1)
                .unwrap()
                .reshape([8, 19])
                .unwrap();
            let loss = eager_step(&[idx.clone(), targets.clone()]).unwrap()[0].reshape([1]).unwrap();
            let loss = if k == 1 { loss.mul_scalar(1.01).unwrap() } else { loss };
            let tensors = vec![
                ("idx".into(), idx),
                ("targets".into(), targets),
                ("logits0".into(), logits0),
                ("loss".into(), loss),
            ];
            save(&dir.join(format!("step-{k}.safetensors")), &tensors, &HashMap::new()).unwrap();
        }
        let err = format!("{:#}", check(&dir, Device::Cpu).unwrap_err());
        assert!(err.starts_with("step 1:"), "step 0 passes, step 1 fails: {err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
