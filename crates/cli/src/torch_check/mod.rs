//! `mlp_step` beside PyTorch's: the initial weights, inputs, losses and gradients that
//! `benches/torch_train.py --write DIR` saves as safetensors, loaded into braze's training step,
//! which then runs the same steps compiled; each step's loss and every gradient are compared with
//! PyTorch's ([`compare`] says how).
//!
//! The directory holds:
//! - `weights.safetensors`: the initial parameters, named as [`braze_workloads::TrainingStep`]
//!   names them (`layers.{l}.{w1,b1,w2,b2,g,beta}`, `w1` as `[hidden, 4 hidden]`: `x @ w1`), and
//!   in its metadata `workload`, `rows`, `hidden`, `layers`, `dtype`, `lr` and `steps`;
//! - `step-{k}.safetensors` for each step `k` from 0: the inputs `x` and `target`, the parameters
//!   the step starts from `param.{name}`, PyTorch's `loss` and `grad.{param}` (eager, bf16),
//!   `f32.loss` and `f32.grad.{param}` (the same step in f32 from the same parameters, widened:
//!   the reference both bf16 results are measured against), and `updated.{param}`, the
//!   parameters after PyTorch's AdamW step.
//!
//! Every step starts braze from PyTorch's parameters of that step, so its loss and gradients are
//! compared at the very same point (a trajectory of its own would drift by the rounding of each
//! update and judge the gradients at other parameters); the parameters braze's optimizer then
//! writes are compared with PyTorch's updated ones. The optimizer's moments are braze's own,
//! accumulated from its gradients of the earlier steps.

mod compare;
mod files;
#[cfg(test)]
mod tests;

pub use compare::{TensorCheck, Verdict};

use anyhow::{bail, Context, Result};
use braze::{DType, Device, HostTensor, Mode, Tensor};
use braze_workloads::{mlp_training_step, Sizes, TrainingStep, MLP_STEP_LAYERS, MLP_STEP_LR};
use files::TensorFile;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const WEIGHTS_FILE: &str = "weights.safetensors";

fn step_file(k: usize) -> String {
    format!("step-{k}.safetensors")
}

/// What `torch_train.py --write` saved: sizes, initial weights, and where each step's file is.
pub struct TorchRun {
    dir: PathBuf,
    pub sizes: Sizes,
    pub steps: usize,
    weights: HashMap<String, HostTensor>,
}

/// One step as PyTorch ran it.
struct TorchStep {
    x: HostTensor,
    target: HostTensor,
    loss: HostTensor,
    f32_loss: HostTensor,
    file: TensorFile,
    path: PathBuf,
}

impl TorchRun {
    pub fn open(dir: &Path) -> Result<TorchRun> {
        let path = dir.join(WEIGHTS_FILE);
        let file = TensorFile::read(&path)?;
        let workload: String = file.meta("workload", &path)?;
        if workload != "mlp_step" {
            bail!("{}: weights of `{workload}`, expected mlp_step", path.display());
        }
        let layers: usize = file.meta("layers", &path)?;
        if layers != MLP_STEP_LAYERS {
            bail!("{}: {layers} layers, braze's mlp_step has {MLP_STEP_LAYERS}", path.display());
        }
        let lr: f64 = file.meta("lr", &path)?;
        if lr != MLP_STEP_LR {
            bail!("{}: learning rate {lr}, braze's mlp_step trains with {MLP_STEP_LR}", path.display());
        }
        let dtype: String = file.meta("dtype", &path)?;
        let dtype = DType::parse(&dtype).with_context(|| format!("{}: unknown dtype `{dtype}`", path.display()))?;
        let sizes =
            Sizes { rows: file.meta("rows", &path)?, hidden: file.meta("hidden", &path)?, dtype, ..Sizes::default() };
        let steps = file.meta("steps", &path)?;
        Ok(TorchRun { dir: dir.to_path_buf(), sizes, steps, weights: file.tensors })
    }

    fn step(&self, k: usize) -> Result<TorchStep> {
        let path = self.dir.join(step_file(k));
        let mut file = TensorFile::read(&path)?;
        Ok(TorchStep {
            x: file.take("x", &path)?,
            target: file.take("target", &path)?,
            loss: file.take("loss", &path)?,
            f32_loss: file.take("f32.loss", &path)?,
            file,
            path,
        })
    }

    /// `[rows]x[hidden] h[4 hidden]`, the shape key of `braze bench` and `torch_train.py`.
    pub fn shape(&self) -> String {
        mlp_step_shape(&self.sizes)
    }
}

/// The row key of `mlp_step` at `sizes` in `braze bench` and `torch_train.py`.
pub fn mlp_step_shape(sizes: &Sizes) -> String {
    format!("{}x{} h{} L{MLP_STEP_LAYERS}", sizes.rows, sizes.hidden, 4 * sizes.hidden)
}

/// Sets every parameter of `step` to the weight of its name: each must be there, with the
/// parameter's dtype and shape, and no weight may be left over.
pub fn load_params(step: &TrainingStep, weights: &HashMap<String, HostTensor>) -> Result<()> {
    for (name, param) in &step.params {
        let weight = weights.get(name).with_context(|| format!("no weight `{name}` for braze's parameter"))?;
        if weight.dtype() != param.dtype() || weight.shape() != &param.shape() {
            bail!(
                "weight `{name}` is {}{}, braze's parameter {}{}",
                weight.dtype(),
                weight.shape(),
                param.dtype(),
                param.shape()
            );
        }
        param.assign(&Tensor::from_host(weight.clone()).to_device(param.device())?)?;
    }
    let mut extra: Vec<&str> =
        weights.keys().filter(|k| !step.params.iter().any(|(n, _)| n == *k)).map(String::as_str).collect();
    if !extra.is_empty() {
        extra.sort_unstable();
        bail!("weights with no braze parameter of their name: {}", extra.join(", "));
    }
    Ok(())
}

/// Every compared tensor of every step, and how the compiled step behaved meanwhile.
pub struct CheckReport {
    pub shape: String,
    pub steps: usize,
    pub checks: Vec<TensorCheck>,
    /// Traces after the first over the compared steps (must be 0).
    pub recompiles: usize,
}

impl CheckReport {
    /// One line per failed tensor, `step k name: why`.
    pub fn failures(&self) -> Vec<String> {
        let mut failures: Vec<String> = self
            .checks
            .iter()
            .filter(|c| c.verdict == Verdict::Fail)
            .map(|c| {
                format!(
                    "step {} {}: rel L2 error {:.3e} against PyTorch; {}",
                    c.step,
                    c.name,
                    c.rel_l2,
                    c.detail.as_deref().unwrap_or("")
                )
            })
            .collect();
        if self.recompiles > 0 {
            failures.push(format!("the compiled step traced {} more time(s) over the compared steps", self.recompiles));
        }
        failures
    }

    /// `loss 3/3 pass, grads 72/72 pass (5 as accurate as torch vs f32), updates 72/72 pass; worst ...`.
    pub fn summary(&self) -> String {
        let count = |prefix: &str| {
            let of: Vec<&TensorCheck> = self.checks.iter().filter(|c| c.name.starts_with(prefix)).collect();
            let passed = of.iter().filter(|c| c.verdict != Verdict::Fail).count();
            let accurate = of.iter().filter(|c| c.verdict == Verdict::PassAsAccurate).count();
            let note = if accurate > 0 { format!(" ({accurate} as accurate as torch vs f32)") } else { String::new() };
            format!("{passed}/{} pass{note}", of.len())
        };
        let worst =
            self.checks.iter().filter(|c| !c.name.starts_with("updated.")).max_by(|a, b| a.rel_l2.total_cmp(&b.rel_l2));
        let worst = worst
            .map_or(String::new(), |c| format!("; largest rel L2 error {:.2e} (step {} {})", c.rel_l2, c.step, c.name));
        format!(
            "{} steps: loss {}, grads {}, updates {}{worst}",
            self.steps,
            count("loss"),
            count("grad."),
            count("updated.")
        )
    }

    pub fn print(&self) {
        println!(
            "{:>4} {:24} {:>10} {:>11} {:>10} {:>11} {:>11}  check",
            "step", "tensor", "max err", "max / rms", "rel L2", "braze v f32", "torch v f32"
        );
        for c in &self.checks {
            let f32 = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.3e}"));
            println!(
                "{:>4} {:24} {:>10.3e} {:>11.3e} {:>10.3e} {:>11} {:>11}  {}",
                c.step,
                c.name,
                c.max_abs_error,
                c.max_error_over_rms,
                c.rel_l2,
                f32(c.f32.map(|f| f.braze_rel_rms)),
                f32(c.f32.map(|f| f.torch_rel_rms)),
                c.verdict.as_str()
            );
        }
        println!("{}", self.summary());
    }

    pub fn to_json(&self) -> Value {
        json!({
            "steps": self.steps,
            "recompiles": self.recompiles,
            "tensors": self.checks.iter().map(TensorCheck::to_json).collect::<Vec<_>>(),
        })
    }
}

/// braze's `mlp_step` compiled (fullgraph, `mode`) on `device`, run on PyTorch's inputs of each
/// saved step from PyTorch's parameters of that step; the loss, every gradient and every
/// parameter after the optimizer's update compared.
pub fn check_steps(run: &TorchRun, device: Device, mode: Mode) -> Result<CheckReport> {
    let step = mlp_training_step(&run.sizes, device)?;
    load_params(&step, &run.weights)?;
    let compiled = step.workload.compile().fullgraph(true).mode(mode);
    let mut checks = Vec::new();
    for k in 0..run.steps {
        let mut torch = run.step(k)?;
        let inputs = [Tensor::from_host(torch.x.clone()), Tensor::from_host(torch.target.clone())]
            .iter()
            .map(|t| t.to_device(device))
            .collect::<braze::Result<Vec<_>>>()?;
        let mut before = HashMap::new();
        for (name, _) in &step.params {
            before.insert(name.clone(), torch.file.take(&format!("param.{name}"), &torch.path)?);
        }
        load_params(&step, &before)?;
        let loss = compiled.call(&inputs)?[0].to_host()?;
        checks.push(compare::compare_tensor(k, "loss", &loss, &torch.loss, Some(&torch.f32_loss))?);
        for (name, param) in &step.params {
            let grad = param.grad().with_context(|| format!("step {k}: braze left no gradient in {name}"))?;
            let want = torch.file.take(&format!("grad.{name}"), &torch.path)?;
            let wide = torch.file.take(&format!("f32.grad.{name}"), &torch.path)?;
            checks.push(compare::compare_tensor(k, &format!("grad.{name}"), &grad.to_host()?, &want, Some(&wide))?);
        }
        for (name, param) in &step.params {
            let updated = torch.file.take(&format!("updated.{name}"), &torch.path)?;
            let check = compare::compare_update(
                k,
                &format!("updated.{name}"),
                &param.to_host()?,
                &updated,
                &before[name],
                MLP_STEP_LR,
            )?;
            checks.push(check);
        }
    }
    Ok(CheckReport { shape: run.shape(), steps: run.steps, checks, recompiles: compiled.stats().recompiles })
}
