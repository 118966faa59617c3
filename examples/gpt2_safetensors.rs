//! GPT-2 from safetensors weights with PyTorch's names (nanoGPT's `state_dict`, e.g. written by
//! `safetensors.torch.save_file(model.state_dict(), "gpt2.safetensors")`): loads them into
//! braze-nn's model, runs the forward and prints the next-token prediction.
//!
//! cargo run --release --example gpt2_safetensors -- path/to/gpt2.safetensors [n_layer n_head n_embd vocab block]
//!
//! Without a path it writes a small seeded model to a temporary file first, loads that and removes it.

use braze::{Device, Tensor};
use braze_nn::checkpoint::{load_model, save_model, TensorFile};
use braze_nn::{Gpt2, Gpt2Config};
use std::collections::HashMap;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    run(&args, Device::best_available())
}

fn run(args: &[String], dev: Device) -> Result<(), Box<dyn std::error::Error>> {
    let mut config = Gpt2Config::gpt2();
    let (path, temporary) = match args.first() {
        Some(path) => {
            let n: Vec<usize> = args[1..].iter().map(|a| a.parse()).collect::<Result<_, _>>()?;
            if let [n_layer, n_head, n_embd, vocab_size, block_size] = n[..] {
                config = Gpt2Config { n_layer, n_head, n_embd, vocab_size, block_size, ..config };
            }
            (std::path::PathBuf::from(path), false)
        }
        None => {
            config = Gpt2Config { n_layer: 2, n_head: 2, n_embd: 32, vocab_size: 64, block_size: 32, ..config };
            let path = std::env::temp_dir().join(format!("braze-example-gpt2-{}.safetensors", std::process::id()));
            save_model(&path, &Gpt2::new(config.clone(), Device::Cpu, 1)?, &HashMap::new())?;
            println!("wrote a seeded model to {}", path.display());
            (path, true)
        }
    };
    let model = Gpt2::new(config.clone(), dev, 0)?;
    let file = TensorFile::read(&path)?;
    if temporary {
        std::fs::remove_file(&path)?;
    }
    load_model(&file, &model)?;
    let idx = Tensor::from_vec((0..8i64).map(|i| i % config.vocab_size as i64).collect::<Vec<_>>(), [1, 8])?;
    let logits = braze::no_grad(|| model.forward(&idx.to_device(dev)?))?;
    let last = logits.slice(1, 7, 8, 1)?.reshape([config.vocab_size])?.to_vec::<f32>()?;
    let best = (0..last.len()).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap_or(0);
    println!("logits {}{}; next token after 0..8: {best} (logit {:.3})", logits.dtype(), logits.shape(), last[best]);
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_on_the_cpu() {
        super::run(&[], braze::Device::Cpu).expect("the example runs");
    }
}
