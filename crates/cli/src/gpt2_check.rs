//! `braze gpt2-check`: braze-nn's GPT-2 from PyTorch's initial weights and batches
//! (`benches/torch_gpt2.py --write DIR`), trained with braze's compiled step (clip and AdamW as
//! nanoGPT's) on PyTorch's batches. The first steps' logits and losses are compared with
//! PyTorch's (`step-{k}.safetensors`), then the whole loss curve (`curve.safetensors`: every
//! step's batch, loss and gradient norm), side by side, against a tolerance that grows with the
//! steps, as two runs of chaotic training drift apart. f32 on both sides, or both under bf16
//! autocast.

use anyhow::{bail, ensure, Context, Result};
use braze::{compile, DType, Device, HostTensor, Tensor};
use braze_nn::checkpoint::{load_model, TensorFile};
use braze_nn::{Gpt2, Gpt2Config, OptimizerConfig, Trainer};
use braze_workloads::gpt2::GPT2_STEP_LR;
use std::path::Path;

/// The curve's tolerance is `early` over the first `EARLY_STEPS` steps (0-based steps 0..=9)...
const EARLY_STEPS: usize = 10;
/// ... growing linearly to `late` at the `LATE_STEPS`-th step (step 49) and staying there.
const LATE_STEPS: usize = 50;

/// Both sides' arithmetic: what PyTorch ran (`torch_gpt2.py --autocast`) and braze runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// f32 parameters and math (PyTorch eager f32, no TF32; braze f32 without TF32).
    F32,
    /// f32 parameters, the forward and loss under bf16 autocast (`torch.autocast(dtype=
    /// torch.bfloat16)`; braze's `Trainer::with_autocast(Some(DType::BF16))`).
    Bf16Autocast,
}

/// How far braze may be from PyTorch, relative unless said otherwise.
struct Tolerance {
    /// The loss at a step whose logits are compared too (the first steps).
    step_loss: f64,
    /// Logits of the first sequence: absolute, times max(1, the largest |logit| PyTorch wrote).
    logits: f64,
    /// The curve (losses, and gradient norms over the first `EARLY_STEPS`) up to `EARLY_STEPS`.
    early: f64,
    /// The curve at `LATE_STEPS` and after.
    late: f64,
}

impl Precision {
    pub fn parse(s: &str) -> std::result::Result<Precision, String> {
        match s {
            "none" | "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16Autocast),
            _ => Err(format!("expected none (f32) or bf16, got `{s}`")),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16Autocast => "bf16 autocast",
        }
    }

    fn autocast(self) -> Option<DType> {
        match self {
            Precision::F32 => None,
            Precision::Bf16Autocast => Some(DType::BF16),
        }
    }

    fn tolerance(self) -> Tolerance {
        match self {
            // f32 on both sides: what differs is the order of sums (GEMM tiling, reductions,
            // attention), a few f32 ulps per op, so step 0 agrees to ~1e-6 (1.7e-7 measured at
            // full size on an H200) and the logits to ~1e-5. Training then amplifies those
            // differences: AdamW's first updates are about lr * sign(g) per element, so an
            // element whose gradient is at the rounding noise steps by +lr on one side and -lr
            // on the other, and the parameters drift apart step by step (chaotic training).
            // Hence 1e-3 over the first 10 steps (a hundred times the noise of one step, far
            // below a wrong gradient or optimizer step, which shows at once) and 2e-2 by step 50.
            Precision::F32 => Tolerance { step_loss: 1e-4, logits: 2e-3, early: 1e-3, late: 2e-2 },
            // bf16 autocast on both sides: matmul and attention operands are rounded to bf16
            // (8 significant bits, 2^-9 = 2e-3 relative each), the two sides round f32 values
            // that differ in their last bits and accumulate in other orders (flash attention's
            // bf16 probabilities, split-K), so logits differ by a few bf16 ulps of the largest
            // logit and the loss by ~1e-3 from step 0, and the drift starts from that: 2e-2
            // early, 5e-2 by step 50.
            Precision::Bf16Autocast => Tolerance { step_loss: 2e-2, logits: 3e-2, early: 2e-2, late: 5e-2 },
        }
    }
}

impl Tolerance {
    /// The curve's tolerance at (0-based) step `k`.
    fn curve(&self, k: usize) -> f64 {
        if k < EARLY_STEPS {
            return self.early;
        }
        let f = ((k + 1 - EARLY_STEPS) as f64 / (LATE_STEPS - EARLY_STEPS) as f64).min(1.0);
        self.early + (self.late - self.early) * f
    }
}

/// What `check` found: the lines to print, and one message per step out of tolerance.
pub struct Report {
    pub lines: Vec<String>,
    pub failures: Vec<String>,
}

impl Report {
    /// An error naming the first step out of tolerance, if any.
    pub fn verdict(&self) -> Result<()> {
        match self.failures.as_slice() {
            [] => Ok(()),
            [one] => bail!("braze differs from PyTorch beyond tolerance: {one}"),
            [first, rest @ ..] => {
                bail!("braze differs from PyTorch beyond tolerance: {first} (and {} more steps)", rest.len())
            }
        }
    }
}

fn meta(file: &TensorFile, key: &str) -> Result<usize> {
    let v = file.metadata.get(key).with_context(|| format!("{}: no `{key}` in its metadata", file.path))?;
    v.parse().with_context(|| format!("{}: metadata `{key}` = `{v}`", file.path))
}

fn host<'a>(file: &'a TensorFile, name: &str) -> Result<&'a HostTensor> {
    file.tensors.get(name).with_context(|| format!("{}: no tensor `{name}`", file.path))
}

/// |a - b| / |b|; a NaN on either side is an infinite difference (f64::max would skip it).
fn rel_diff(a: f64, b: f64) -> f64 {
    let d = (a - b).abs() / b.abs().max(1e-12);
    if d.is_nan() {
        f64::INFINITY
    } else {
        d
    }
}

/// PyTorch's curve: every step's batch (`[B, T]` token ids, row-major), loss and gradient norm.
struct Curve {
    batch: [usize; 2],
    idx: Vec<i64>,
    targets: Vec<i64>,
    loss: Vec<f64>,
    grad_norm: Option<Vec<f64>>,
}

impl Curve {
    fn read(path: &Path) -> Result<(Curve, Option<String>)> {
        let file = TensorFile::read(path)?;
        let steps = meta(&file, "steps")?;
        let (idx, targets) = (host(&file, "idx")?, host(&file, "targets")?);
        let dims = idx.shape().dims().to_vec();
        ensure!(
            dims.len() == 3 && dims[0] == steps && idx.dtype() == DType::I64,
            "{}: `idx` is {}{}, not i64 [{steps}, B, T]",
            file.path,
            idx.dtype(),
            idx.shape()
        );
        ensure!(
            targets.shape() == idx.shape() && targets.dtype() == DType::I64,
            "{}: `targets` is {}{}, `idx` {}{}",
            file.path,
            targets.dtype(),
            targets.shape(),
            idx.dtype(),
            idx.shape()
        );
        let per_step = |name: &str| -> Result<Vec<f64>> {
            let t = host(&file, name)?;
            ensure!(t.numel() == steps, "{}: `{name}` has {} values for {steps} steps", file.path, t.numel());
            Ok(t.to_f64_vec())
        };
        let curve = Curve {
            batch: [dims[1], dims[2]],
            idx: Tensor::from_host(idx.clone()).to_vec::<i64>()?,
            targets: Tensor::from_host(targets.clone()).to_vec::<i64>()?,
            loss: per_step("loss")?,
            grad_norm: if file.tensors.contains_key("grad_norm") { Some(per_step("grad_norm")?) } else { None },
        };
        Ok((curve, file.metadata.get("autocast").cloned()))
    }

    fn steps(&self) -> usize {
        self.loss.len()
    }

    fn batch(&self, k: usize, device: Device) -> Result<(Tensor, Tensor)> {
        let n = self.batch[0] * self.batch[1];
        let take = |v: &[i64]| -> Result<Tensor> {
            Ok(Tensor::from_vec(v[k * n..(k + 1) * n].to_vec(), self.batch)?.to_device(device)?)
        };
        Ok((take(&self.idx)?, take(&self.targets)?))
    }
}

/// Trains braze's GPT-2 on PyTorch's batches from PyTorch's weights in `dir` and compares: the
/// first steps' logits and losses, then the loss curve and the gradient norms. `precision`,
/// when given, must be the one PyTorch's files were written with (by default it is taken from
/// them). A mismatch is a failure in the report, not an error; an error is a file that cannot
/// be read or a step braze cannot run.
pub fn check(dir: &Path, device: Device, precision: Option<Precision>) -> Result<Report> {
    let weights = TensorFile::read(&dir.join("weights.safetensors"))?;
    let config = Gpt2Config {
        n_layer: meta(&weights, "n_layer")?,
        n_head: meta(&weights, "n_head")?,
        n_embd: meta(&weights, "n_embd")?,
        vocab_size: meta(&weights, "vocab_size")?,
        block_size: meta(&weights, "block_size")?,
        ..Gpt2Config::gpt2()
    };
    let logit_steps = meta(&weights, "steps")?;
    let curve_path = dir.join("curve.safetensors");
    let (curve, curve_autocast) =
        if curve_path.exists() { Curve::read(&curve_path).map(|(c, a)| (Some(c), a))? } else { (None, None) };
    // Files from before `--autocast` are f32.
    let written = match curve_autocast.as_deref().or(weights.metadata.get("autocast").map(String::as_str)) {
        Some(s) => Precision::parse(s).map_err(|e| anyhow::anyhow!("{}: metadata `autocast`: {e}", dir.display()))?,
        None => Precision::F32,
    };
    if let Some(p) = precision {
        ensure!(
            p == written,
            "{} holds PyTorch's {} run; braze in {} would not be compared with like (write the files with \
             torch_gpt2.py --autocast {})",
            dir.display(),
            written.name(),
            p.name(),
            if p == Precision::F32 { "none" } else { "bf16" }
        );
    }
    let precision = written;
    let tol = precision.tolerance();
    let steps = logit_steps.max(curve.as_ref().map_or(0, Curve::steps));

    let model = Gpt2::new(config.clone(), device, 0)?;
    load_model(&weights, &model)?;
    let opt = OptimizerConfig { lr: GPT2_STEP_LR, weight_decay: 0.1, betas: (0.9, 0.95), grad_clip: 1.0 };
    let trainer = Trainer::new(model, &opt)?.with_autocast(precision.autocast());
    let step = compile(trainer.step_fn()).fullgraph(true).name("gpt2_step");

    let mut lines = vec![format!(
        "GPT-2 {} layers, {} heads, {} wide, vocab {}, context {}: {steps} steps ({} with logits) in {} on both \
         sides, braze on {device}",
        config.n_layer,
        config.n_head,
        config.n_embd,
        config.vocab_size,
        config.block_size,
        logit_steps.min(steps),
        precision.name()
    )];
    let mut failures = Vec::new();
    // Per step: braze's and PyTorch's loss and gradient norm.
    let mut rows: Vec<(f64, f64, f64, Option<f64>)> = Vec::new();
    for k in 0..steps {
        let mut problems = Vec::new();
        let step_file =
            if k < logit_steps { Some(TensorFile::read(&dir.join(format!("step-{k}.safetensors")))?) } else { None };
        let (idx, targets, torch_loss, torch_norm) = match &curve {
            Some(c) if k < c.steps() => {
                let (idx, targets) = c.batch(k, device)?;
                (idx, targets, c.loss[k], c.grad_norm.as_ref().map(|g| g[k]))
            }
            _ => {
                let file = step_file.as_ref().context("a step past the curve without a step file")?;
                let take = |name: &str| -> Result<Tensor> {
                    Ok(Tensor::from_host(host(file, name)?.clone()).to_device(device)?)
                };
                (take("idx")?, take("targets")?, host(file, "loss")?.get_f64(0), None)
            }
        };
        if let Some(file) = &step_file {
            // The step file and the curve are the same PyTorch run: its batch must be the curve's.
            for (name, t) in [("idx", &idx), ("targets", &targets)] {
                let theirs = Tensor::from_host(host(file, name)?.clone()).to_vec::<i64>()?;
                ensure!(theirs == t.to_vec::<i64>()?, "{}: `{name}` is not the curve's batch of step {k}", file.path);
            }
            let step_loss = host(file, "loss")?.get_f64(0);
            ensure!(step_loss == torch_loss, "{}: loss {step_loss} but the curve's step {k} {torch_loss}", file.path);
            let torch_logits = host(file, "logits0")?.to_f64_vec();
            let logits = braze::no_grad(|| match precision.autocast() {
                Some(dtype) => braze::autocast(dtype, || Ok::<_, anyhow::Error>(trainer.model.forward(&idx)?)),
                None => Ok(trainer.model.forward(&idx)?),
            })?;
            let first = logits.slice(0, 0, 1, 1)?.to_host()?.to_f64_vec();
            if first.len() != torch_logits.len() {
                bail!("step {k}: logits0 has {} values, braze's first sequence {}", torch_logits.len(), first.len());
            }
            let scale = torch_logits.iter().fold(1.0f64, |m, x| m.max(x.abs()));
            let logit_tol = tol.logits * scale;
            let logit_err = first
                .iter()
                .zip(&torch_logits)
                .map(|(a, b)| if (a - b).is_nan() { f64::INFINITY } else { (a - b).abs() })
                .fold(0.0, f64::max);
            lines.push(format!("step {k}: logits0 max err {logit_err:.2e} (tolerance {logit_tol:.2e})"));
            if logit_err > logit_tol {
                problems.push(format!("logits0 max err {logit_err:.2e} > {logit_tol:.2e}"));
            }
        }
        let out = step.call(&[idx, targets])?;
        let (loss, norm) = (out[0].to_host()?.get_f64(0), out[1].to_host()?.get_f64(0));
        let loss_diff = rel_diff(loss, torch_loss);
        let loss_tol = if step_file.is_some() { tol.step_loss.min(tol.curve(k)) } else { tol.curve(k) };
        if loss_diff > loss_tol {
            problems.push(format!(
                "loss {loss:.6} (PyTorch {torch_loss:.6}): rel diff {loss_diff:.2e} > tolerance {loss_tol:.2e}"
            ));
        }
        if let Some(torch_norm) = torch_norm {
            let norm_diff = rel_diff(norm, torch_norm);
            if k < EARLY_STEPS && norm_diff > tol.early {
                problems.push(format!(
                    "gradient norm {norm:.6} (PyTorch {torch_norm:.6}): rel diff {norm_diff:.2e} > tolerance {:.2e}",
                    tol.early
                ));
            }
        }
        if !problems.is_empty() {
            failures.push(format!("step {k}: {}", problems.join("; ")));
        }
        rows.push((loss, torch_loss, norm, torch_norm));
    }

    // The curves side by side: every 5th step, the last, and any out of tolerance.
    lines.push(format!(
        "{:>5}  {:>12}  {:>12}  {:>9}  {:>9}  {:>11}  {:>11}  {:>9}",
        "step", "braze loss", "PyTorch loss", "rel diff", "tolerance", "braze |g|", "PyTorch |g|", "rel diff"
    ));
    for (k, &(loss, torch_loss, norm, torch_norm)) in rows.iter().enumerate() {
        let failed = failures.iter().any(|f| f.starts_with(&format!("step {k}:")));
        if k % 5 != 0 && k + 1 != steps && !failed {
            continue;
        }
        let (torch_norm, norm_diff) = match torch_norm {
            Some(t) => (format!("{t:11.6}"), format!("{:9.2e}", rel_diff(norm, t))),
            None => (format!("{:>11}", "-"), format!("{:>9}", "-")),
        };
        lines.push(format!(
            "{k:5}  {loss:12.6}  {torch_loss:12.6}  {:9.2e}  {:9.2e}  {norm:11.6}  {torch_norm}  {norm_diff}{}",
            rel_diff(loss, torch_loss),
            tol.curve(k),
            if failed { "  out of tolerance" } else { "" }
        ));
    }
    let worst = |diffs: Vec<(usize, f64)>| {
        diffs.into_iter().fold(None, |w: Option<(usize, f64)>, (k, d)| match w {
            Some((_, wd)) if wd >= d => w,
            _ => Some((k, d)),
        })
    };
    if let Some((k, d)) = worst(rows.iter().enumerate().map(|(k, r)| (k, rel_diff(r.0, r.1))).collect()) {
        lines.push(format!(
            "largest loss rel diff: {d:.2e} at step {k} (tolerance there {:.2e}) over {steps} steps",
            tol.curve(k)
        ));
    }
    let norms: Vec<(usize, f64)> =
        rows.iter().enumerate().filter_map(|(k, r)| r.3.map(|t| (k, rel_diff(r.2, t)))).collect();
    if let Some((k, d)) = worst(norms) {
        lines.push(format!(
            "largest gradient-norm rel diff: {d:.2e} at step {k} (judged over steps 0-{} with tolerance {:.2e})",
            EARLY_STEPS - 1,
            tol.early
        ));
    }
    lines.push(match failures.len() {
        0 => format!(
            "verdict: match ({}: loss within {:.0e} relative to step {}, growing linearly to {:.0e} at step {})",
            precision.name(),
            tol.early,
            EARLY_STEPS - 1,
            tol.late,
            LATE_STEPS - 1
        ),
        n => format!("verdict: MISMATCH at {n} of {steps} steps, first {}", failures[0]),
    });
    Ok(Report { lines, failures })
}

#[cfg(test)]
mod tests {
    use super::*;
    use braze_nn::checkpoint::save;
    use braze_nn::Module;
    use std::collections::HashMap;

    fn config() -> Gpt2Config {
        Gpt2Config { n_layer: 1, n_head: 2, n_embd: 16, vocab_size: 19, block_size: 8, ..Gpt2Config::gpt2() }
    }

    /// A run written as torch_gpt2.py writes one, from braze's own eager step (under `autocast`,
    /// "none" or "bf16"): the weights, `logit_steps` step files and a curve of `steps` steps, the
    /// loss of step `k` scaled by `f` in both for each `(k, f)` in `perturb`.
    fn fabricate(dir: &Path, steps: usize, logit_steps: usize, autocast: &str, perturb: &[(usize, f64)]) {
        std::fs::create_dir_all(dir).unwrap();
        let c = config();
        let model = Gpt2::new(c.clone(), Device::Cpu, 5).unwrap();
        let meta: HashMap<String, String> = [
            ("n_layer", c.n_layer.to_string()),
            ("n_head", c.n_head.to_string()),
            ("n_embd", c.n_embd.to_string()),
            ("vocab_size", c.vocab_size.to_string()),
            ("block_size", c.block_size.to_string()),
            ("steps", logit_steps.to_string()),
            ("curve_steps", steps.to_string()),
            ("autocast", autocast.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        save(&dir.join("weights.safetensors"), &model.named_parameters(), &meta).unwrap();
        let opt = OptimizerConfig { lr: GPT2_STEP_LR, weight_decay: 0.1, betas: (0.9, 0.95), grad_clip: 1.0 };
        let precision = Precision::parse(autocast).unwrap();
        let trainer = Trainer::new(model, &opt).unwrap().with_autocast(precision.autocast());
        let eager_step = trainer.step_fn();
        let (mut idxs, mut tgts, mut losses, mut norms) = (vec![], vec![], vec![], vec![]);
        for k in 0..steps {
            let ids = |s: usize| -> Tensor {
                Tensor::from_vec((0..16).map(|i| ((i * 7 + s * 5 + k * 3) % 19) as i64).collect::<Vec<_>>(), [2, 8])
                    .unwrap()
            };
            let (idx, targets) = (ids(1), ids(2));
            // PyTorch's logits are its forward's, before the step's update.
            let logits0 = braze::no_grad(|| match precision.autocast() {
                Some(d) => braze::autocast(d, || trainer.model.forward(&idx)),
                None => trainer.model.forward(&idx),
            })
            .unwrap()
            .slice(0, 0, 1, 1)
            .unwrap()
            .reshape([8, 19])
            .unwrap()
            .cast(DType::F32)
            .unwrap();
            let out = eager_step(&[idx.clone(), targets.clone()]).unwrap();
            let f = perturb.iter().find(|p| p.0 == k).map_or(1.0, |p| p.1);
            let loss = out[0].mul_scalar(f).unwrap().reshape([1]).unwrap();
            if k < logit_steps {
                let tensors = vec![
                    ("idx".into(), idx.clone()),
                    ("targets".into(), targets.clone()),
                    ("logits0".into(), logits0),
                    ("loss".into(), loss.clone()),
                ];
                save(&dir.join(format!("step-{k}.safetensors")), &tensors, &HashMap::new()).unwrap();
            }
            idxs.push(idx.reshape([1, 2, 8]).unwrap());
            tgts.push(targets.reshape([1, 2, 8]).unwrap());
            losses.push(loss);
            norms.push(out[1].reshape([1]).unwrap());
        }
        let cat = |ts: &[Tensor]| Tensor::concat(ts, 0).unwrap();
        let tensors = vec![
            ("idx".into(), cat(&idxs)),
            ("targets".into(), cat(&tgts)),
            ("loss".into(), cat(&losses)),
            ("grad_norm".into(), cat(&norms)),
        ];
        let meta: HashMap<String, String> =
            [("steps".to_string(), steps.to_string()), ("autocast".to_string(), autocast.to_string())].into();
        save(&dir.join("curve.safetensors"), &tensors, &meta).unwrap();
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("braze-gpt2-check-{name}-{}", std::process::id()))
    }

    /// braze's compiled step against its eager step's files: 12 steps (logits for the first 2)
    /// agree; the loss of step 1 (a step with logits) scaled by 1.01 fails there, and so does
    /// the loss of step 11 (a curve step past the early ones) scaled by 1.05.
    #[test]
    fn gpt2_check_reads_pytorchs_files_and_catches_a_difference() {
        let dir = scratch("f32");
        fabricate(&dir, 12, 2, "none", &[]);
        let report = check(&dir, Device::Cpu, None).unwrap();
        let text = report.lines.join("\n");
        assert!(report.failures.is_empty(), "{text}");
        assert!(text.contains("verdict: match (f32"), "{text}");
        // Every 5th step and the last, side by side.
        for k in [0, 5, 10, 11] {
            assert!(report.lines.iter().any(|l| l.starts_with(&format!("{k:5}  "))), "step {k}: {text}");
        }
        assert!(report.verdict().is_ok());

        fabricate(&dir, 12, 2, "none", &[(1, 1.01), (11, 1.05)]);
        let report = check(&dir, Device::Cpu, None).unwrap();
        assert_eq!(report.failures.len(), 2, "{}", report.lines.join("\n"));
        assert!(report.failures[0].starts_with("step 1: loss"), "{}", report.failures[0]);
        assert!(report.failures[1].starts_with("step 11: loss"), "{}", report.failures[1]);
        let err = format!("{:#}", report.verdict().unwrap_err());
        assert!(err.contains("step 1: loss") && err.contains("1 more steps"), "{err}");
        assert!(report.lines.last().unwrap().starts_with("verdict: MISMATCH at 2 of 12 steps, first step 1:"));
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Files written under bf16 autocast are checked under it, with its tolerance; asking for
    /// f32 against them is an error.
    #[test]
    fn gpt2_check_follows_the_files_autocast() {
        let dir = scratch("bf16");
        fabricate(&dir, 4, 1, "bf16", &[]);
        let report = check(&dir, Device::Cpu, Some(Precision::Bf16Autocast)).unwrap();
        let text = report.lines.join("\n");
        assert!(report.failures.is_empty(), "{text}");
        assert!(text.contains("in bf16 autocast on both sides") && text.contains("verdict: match (bf16"), "{text}");
        let err = format!("{:#}", check(&dir, Device::Cpu, Some(Precision::F32)).err().unwrap());
        assert!(err.contains("PyTorch's bf16 autocast run"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_curve_tolerance_grows_from_early_to_late() {
        let t = Precision::F32.tolerance();
        assert_eq!((t.curve(0), t.curve(9)), (1e-3, 1e-3));
        assert!(t.curve(10) > 1e-3 && t.curve(10) < t.curve(30));
        assert!((t.curve(49) - 2e-2).abs() < 1e-12 && t.curve(200) == t.curve(49));
    }
}
