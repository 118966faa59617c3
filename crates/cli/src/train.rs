//! `braze train`: a small GPT trained on a synthetic language it generates (additions written as
//! characters, `7+5=12;`), the whole step compiled fullgraph; a progress bar with the loss and
//! tokens/s, an evaluation on held-out text, a safetensors checkpoint, and resuming from one.

use anyhow::{bail, Context, Result};
use braze::{compile, DType, Device, Tensor};
use braze_nn::checkpoint::{self, TensorFile};
use braze_nn::{Gpt2, Gpt2Config, OptimizerConfig, Trainer};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The characters of the language, one token each.
pub const ALPHABET: &[u8] = b"0123456789+=;";

/// The model's checkpoint (PyTorch names) and the optimizer's, in a checkpoint directory.
const MODEL_FILE: &str = "model.safetensors";
const OPTIMIZER_FILE: &str = "optimizer.safetensors";

#[derive(Clone, Debug)]
pub struct TrainOptions {
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    pub block_size: usize,
    pub batch: usize,
    pub steps: usize,
    pub lr: f64,
    pub dtype: DType,
    /// The forward and loss in an autocast region of this dtype.
    pub autocast: Option<DType>,
    pub seed: u64,
    pub eval_batches: usize,
    /// Read the loss back (a host sync) every this many steps.
    pub log_every: usize,
    pub out: Option<PathBuf>,
    pub resume: Option<PathBuf>,
    pub progress: bool,
}

impl Default for TrainOptions {
    fn default() -> TrainOptions {
        TrainOptions {
            n_layer: 2,
            n_head: 2,
            n_embd: 32,
            block_size: 32,
            batch: 8,
            steps: 200,
            lr: 3e-3,
            dtype: DType::F32,
            autocast: None,
            seed: 0,
            eval_batches: 4,
            log_every: 10,
            out: None,
            resume: None,
            progress: true,
        }
    }
}

/// What a run did.
pub struct TrainReport {
    pub first_loss: f32,
    pub last_loss: f32,
    pub eval_loss: f32,
    pub steps_done: usize,
    pub tokens_per_s: f64,
    /// The training loss read at each logging step: (step, counted from 1 over the resumed
    /// steps too, and the loss).
    pub curve: Vec<(usize, f32)>,
}

/// splitmix64: a small seeded generator, the same text on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Text of the language from `seed`: additions of one-digit numbers, each `a+b=c;`.
pub fn synthetic_text(chars: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    let mut text = Vec::with_capacity(chars + 16);
    while text.len() < chars {
        let (a, b) = (rng.below(10), rng.below(10));
        text.extend_from_slice(format!("{a}+{b}={};", a + b).as_bytes());
    }
    text.truncate(chars);
    text
}

fn encode(text: &[u8]) -> Vec<i64> {
    text.iter().map(|c| ALPHABET.iter().position(|a| a == c).expect("a character of the alphabet") as i64).collect()
}

/// `batch` windows of `t + 1` tokens at random places of `tokens`: inputs and next-token targets.
fn batch(tokens: &[i64], batch: usize, t: usize, rng: &mut Rng, device: Device) -> Result<[Tensor; 2]> {
    let (mut idx, mut targets) = (Vec::with_capacity(batch * t), Vec::with_capacity(batch * t));
    for _ in 0..batch {
        let start = rng.below((tokens.len() - t - 1) as u64) as usize;
        idx.extend_from_slice(&tokens[start..start + t]);
        targets.extend_from_slice(&tokens[start + 1..start + t + 1]);
    }
    Ok([
        Tensor::from_vec(idx, [batch, t])?.to_device(device)?,
        Tensor::from_vec(targets, [batch, t])?.to_device(device)?,
    ])
}

fn config(o: &TrainOptions) -> Gpt2Config {
    Gpt2Config {
        block_size: o.block_size,
        vocab_size: ALPHABET.len(),
        n_layer: o.n_layer,
        n_head: o.n_head,
        n_embd: o.n_embd,
        bias: true,
        dtype: o.dtype,
    }
}

/// The cosine schedule of nanoGPT with a linear warm-up over the first 10% of the steps, down
/// to a tenth of `lr`.
fn learning_rate(lr: f64, step: usize, steps: usize) -> f64 {
    let warmup = (steps / 10).max(1);
    if step < warmup {
        return lr * (step + 1) as f64 / warmup as f64;
    }
    let progress = (step - warmup) as f64 / (steps - warmup).max(1) as f64;
    let min = lr / 10.0;
    min + 0.5 * (1.0 + (std::f64::consts::PI * progress.min(1.0)).cos()) * (lr - min)
}

fn metadata(o: &TrainOptions, step: usize) -> HashMap<String, String> {
    let c = config(o);
    HashMap::from([
        ("format".into(), "pt".into()),
        ("step".into(), step.to_string()),
        ("n_layer".into(), c.n_layer.to_string()),
        ("n_head".into(), c.n_head.to_string()),
        ("n_embd".into(), c.n_embd.to_string()),
        ("block_size".into(), c.block_size.to_string()),
        ("vocab_size".into(), c.vocab_size.to_string()),
        ("alphabet".into(), String::from_utf8_lossy(ALPHABET).into_owned()),
    ])
}

/// Loads a checkpoint directory into `trainer`; returns the step it was written at.
fn resume(dir: &Path, trainer: &Trainer) -> Result<usize> {
    let model = TensorFile::read(&dir.join(MODEL_FILE))?;
    checkpoint::load_model(&model, &*trainer.model)?;
    let state = TensorFile::read(&dir.join(OPTIMIZER_FILE))?;
    for (name, t) in trainer.optimizer.state(&*trainer.model) {
        let host = state.tensor(&name, t.shape().dims(), t.dtype())?;
        t.assign(&Tensor::from_host(host).to_device(t.device())?)?;
    }
    let step = model.metadata.get("step").context("checkpoint metadata has no `step`")?;
    step.parse().with_context(|| format!("checkpoint step `{step}` is not a number"))
}

fn save(dir: &Path, o: &TrainOptions, trainer: &Trainer, step: usize) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let meta = metadata(o, step);
    checkpoint::save_model(&dir.join(MODEL_FILE), &*trainer.model, &meta)?;
    checkpoint::save(&dir.join(OPTIMIZER_FILE), &trainer.optimizer.state(&*trainer.model), &meta)?;
    Ok(())
}

/// Trains (from scratch or from `resume`) for `steps` more steps, evaluates, checkpoints.
pub fn train(o: &TrainOptions, device: Device) -> Result<TrainReport> {
    if o.block_size < 2 || o.batch == 0 || o.steps == 0 {
        bail!("train: block_size must be at least 2 and batch and steps positive, got {o:?}");
    }
    let model = Gpt2::new(config(o), device, o.seed)?;
    let opt = OptimizerConfig { lr: o.lr, ..OptimizerConfig::default() };
    let trainer = Trainer::new(model, &opt)?.with_autocast(o.autocast);
    let start = match &o.resume {
        Some(dir) => resume(dir, &trainer).with_context(|| format!("resuming from {}", dir.display()))?,
        None => 0,
    };
    let train_tokens = encode(&synthetic_text(200_000, o.seed));
    let eval_tokens = encode(&synthetic_text(20_000, o.seed.wrapping_add(1) ^ 0x5EED));
    let step = compile(trainer.step_fn()).fullgraph(true).name("gpt2_train_step").input_names(&["idx", "targets"]);
    let eval = compile(trainer.eval_fn()).fullgraph(true).name("gpt2_eval").input_names(&["idx", "targets"]);
    let bar = if o.progress { ProgressBar::new(o.steps as u64) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed_precise}]")?);
    let mut rng = Rng(o.seed.wrapping_add(start as u64));
    let tokens_per_step = (o.batch * o.block_size) as f64;
    let (mut first_loss, mut last_loss) = (f32::NAN, f32::NAN);
    let mut timed = (Instant::now(), 0usize);
    let mut curve = Vec::new();
    for k in 0..o.steps {
        let global = start + k;
        trainer.optimizer.set_lr(learning_rate(o.lr, global, start + o.steps))?;
        let [idx, targets] = batch(&train_tokens, o.batch, o.block_size, &mut rng, device)?;
        let out = step.call(&[idx, targets])?;
        if k == 0 || (k + 1) % o.log_every.max(1) == 0 || k + 1 == o.steps {
            let loss: f32 = out[0].item()?;
            if k == 0 {
                first_loss = loss;
                timed = (Instant::now(), 1); // the first step traces and compiles: not timed
            }
            last_loss = loss;
            curve.push((global + 1, loss));
            let rate = tokens_per_step * (k + 1 - timed.1) as f64 / timed.0.elapsed().as_secs_f64().max(1e-9);
            bar.set_message(format!("loss {loss:.4}  {:.0} tok/s", if k == 0 { 0.0 } else { rate }));
        }
        bar.inc(1);
    }
    bar.finish();
    let elapsed = timed.0.elapsed().as_secs_f64().max(1e-9);
    let tokens_per_s = tokens_per_step * (o.steps - timed.1) as f64 / elapsed;
    let mut eval_rng = Rng(0xE7A1);
    let mut eval_sum = 0.0;
    for _ in 0..o.eval_batches.max(1) {
        let [idx, targets] = batch(&eval_tokens, o.batch, o.block_size, &mut eval_rng, device)?;
        eval_sum += eval.call(&[idx, targets])?[0].item::<f32>()? as f64;
    }
    let eval_loss = (eval_sum / o.eval_batches.max(1) as f64) as f32;
    if let Some(dir) = &o.out {
        save(dir, o, &trainer, start + o.steps)?;
    }
    Ok(TrainReport { first_loss, last_loss, eval_loss, steps_done: start + o.steps, tokens_per_s, curve })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_language_is_additions() {
        let text = String::from_utf8(synthetic_text(400, 3)).unwrap();
        for problem in text.split(';').skip(1).take(20) {
            let Some((lhs, sum)) = problem.split_once('=') else { continue };
            let (a, b) = lhs.split_once('+').unwrap();
            assert_eq!(a.parse::<u64>().unwrap() + b.parse::<u64>().unwrap(), sum.parse::<u64>().unwrap(), "{problem}");
        }
        assert_eq!(synthetic_text(400, 3), synthetic_text(400, 3));
    }

    #[test]
    fn a_tiny_gpt_learns_the_language_on_the_cpu_and_resumes() {
        let dir = std::env::temp_dir().join(format!("braze-train-{}", std::process::id()));
        // Small enough for the debug-build CPU plan executor: about a second a step here.
        let o = TrainOptions {
            n_embd: 16,
            block_size: 16,
            batch: 8,
            steps: 30,
            lr: 1e-2,
            eval_batches: 2,
            out: Some(dir.clone()),
            progress: false,
            ..TrainOptions::default()
        };
        let report = train(&o, Device::Cpu).unwrap();
        // ln(13) = 2.56 at the start; the characters' frequencies bring it to 2.40, what follows
        // each character (a bigram model) to 1.72, the rules of the sums to about 0.7.
        assert!((report.first_loss - 13f32.ln()).abs() < 0.2, "first loss {}", report.first_loss);
        assert!(report.eval_loss < 2.2, "eval loss {} after {} steps", report.eval_loss, report.steps_done);
        assert!(report.tokens_per_s > 0.0);
        let steps: Vec<usize> = report.curve.iter().map(|(step, _)| *step).collect();
        assert_eq!(steps, [1, 10, 20, 30], "a loss at the first step and every tenth");
        assert_eq!(report.curve.first().map(|c| c.1), Some(report.first_loss));
        assert_eq!(report.curve.last().map(|c| c.1), Some(report.last_loss));
        // Resuming starts from the saved weights and optimizer: its first loss is the trained one
        // (here in a bf16 autocast region over the same f32 weights).
        let again =
            TrainOptions { steps: 2, resume: Some(dir.clone()), out: None, autocast: Some(DType::BF16), ..o.clone() };
        let resumed = train(&again, Device::Cpu).unwrap();
        assert_eq!(resumed.steps_done, 32);
        assert_eq!(resumed.curve.first().map(|c| c.0), Some(31), "steps counted on from the checkpoint");
        assert!(resumed.first_loss < report.first_loss - 0.2, "resumed at {}", resumed.first_loss);
        let wrong = TrainOptions { n_embd: 8, ..again };
        let err = format!("{:#}", train(&wrong, Device::Cpu).err().unwrap());
        assert!(err.contains("transformer.wte.weight") && err.contains("f32[13,8]"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
