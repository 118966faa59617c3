//! The training workload `mlp_step` (`benches/workloads.md`, "Training"): one compiled step
//! (forward, loss, backward, AdamW) timed like the forward workloads, with its launches, host
//! syncs and peak device memory, then replayed as a CUDA graph and max-autotuned; a 1,000-step
//! learning-rate schedule that must not retrace; and, given PyTorch's run (`torch_train.py
//! --write DIR`), the first steps' loss and gradients against PyTorch's.

use super::{ran, Bench};
use crate::torch_check::{self, mlp_step_shape, TorchRun};
use anyhow::Result;
use braze::optim::{Optimizer, StateDType};
use braze::{DType, Mode};
use braze_workloads::{mlp_training_step, Sizes, TrainingStep, MLP_STEP_LAYERS, MLP_STEP_LR};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;

/// Steps run after the first before the steady-state peak memory is taken, and over which it is.
const WARM_STEPS: usize = 2;
const PEAK_STEPS: usize = 3;
/// Steps of the learning-rate schedule.
const SCHEDULE_STEPS: usize = 1000;
/// Back-to-back steps whose host clock tells whether the host keeps ahead of the GPU.
const HOST_STEPS: usize = 30;

impl Bench {
    /// With `state` [`StateDType::OfParams`] (AdamW's moments in bf16, as `torch.optim.AdamW`
    /// keeps them for bf16 parameters), the rows' variants end in `, bf16 state` and the
    /// max-autotune and schedule runs are left to the f32-state step.
    pub(super) fn mlp_step(
        &mut self,
        rows: usize,
        hidden: usize,
        state: StateDType,
        torch_weights: Option<&Path>,
    ) -> Result<()> {
        let sizes = Sizes { rows, hidden, dtype: DType::BF16, seed: 0, optimizer_state: state, ..Sizes::default() };
        let tag = state_tag(state);
        let shape = mlp_step_shape(&sizes);
        let dtype = sizes.dtype.to_string();
        let dev = self.timer.device.clone();
        self.timer.sync()?;
        // What was allocated before the model (the timer's L2 flush buffer) is not the step's.
        let before_model = dev.memory_in_use();
        let step = mlp_training_step(&sizes, self.device())?;
        let compiled = step.workload.compile().fullgraph(true).mode(Mode::Default).name("mlp_step");
        let inputs = &step.workload.inputs;
        let cache_before = braze::kernel_cache_stats();
        let start = Instant::now();
        let explanation = compiled.explain(inputs)?;
        self.timer.sync()?;
        let first_call = start.elapsed();
        let compiles = braze::kernel_cache_stats().compiles - cache_before.compiles;
        for _ in 0..WARM_STEPS {
            ran(compiled.call(inputs))?;
        }
        // The steady-state peak, as torch_train.py takes PyTorch's: reset after warm-up, then
        // a few steps.
        self.timer.sync()?;
        dev.reset_peak_memory();
        let mut losses = Vec::new();
        for _ in 0..PEAK_STEPS {
            losses.push(compiled.call(inputs)?.remove(0));
        }
        self.timer.sync()?;
        let peak = dev.peak_memory().saturating_sub(before_model);
        let losses: Vec<f64> = losses.iter().map(|l| Ok(l.to_host()?.get_f64(0))).collect::<braze::Result<_>>()?;
        let timing = self.bench(&mut || ran(compiled.call(inputs)), self.rep_ms)?;
        let us = timing.median_us;
        let inner = 4 * hidden;
        // Forward 2 matmuls a layer, backward twice the forward's FLOPs.
        let flops = 3.0 * 2.0 * 2.0 * (rows * hidden * inner * MLP_STEP_LAYERS) as f64;
        let mut row = json!({
            "workload": "mlp_step", "shape": shape, "dtype": dtype, "variant": format!("braze compiled{tag}"),
            "us": us, "gbps": null, "reps": timing.reps, "tflops": flops / (us * 1e-6) / 1e12,
            "kernels": explanation.kernels, "launches": explanation.launches,
            "host_syncs": explanation.host_syncs, "graphs": explanation.graphs.len(),
            "peak_bytes": peak, "peak_mb": peak as f64 / 1e6,
            "first_call_s": first_call.as_secs_f64(), "first_call_nvrtc_compiles": compiles,
            "arena_mb": explanation.arena_bytes.map(|b| b as f64 / 1e6),
            "saved_for_backward_mb": explanation.saved_for_backward.as_ref().map(|s| s.bytes as f64 / 1e6),
            "losses": losses,
        });
        if explanation.host_syncs != 0 || explanation.graphs.len() != 1 {
            self.failures.push(format!(
                "mlp_step {shape}: {} graph(s), {} host sync(s) per step; the step must be one graph with none",
                explanation.graphs.len(),
                explanation.host_syncs
            ));
        }
        if losses.iter().any(|l| !l.is_finite()) {
            self.failures.push(format!("mlp_step {shape}: a non-finite loss: {losses:?}"));
        }
        let check = match torch_weights {
            Some(dir) => Some(self.check_against_torch(dir, state)?),
            None => None,
        };
        if let Some((verdict, _)) = &check {
            row["check"] = json!(verdict);
        }
        self.emit(row);
        self.host_per_step(&shape, &dtype, tag, &mut || ran(compiled.call(inputs)))?;
        self.kernel_profile("mlp_step", &format!("{shape}{tag}"), &dtype, us, &mut || Ok(compiled.profile(inputs)?.1))?;
        // The same step replayed as one CUDA graph: what launch gaps and host work cost.
        let replayed = step.workload.compile().fullgraph(true).mode(Mode::ReduceOverhead).name("mlp_step");
        for _ in 0..WARM_STEPS {
            ran(replayed.call(inputs))?;
        }
        let graph_timing = self.bench(&mut || ran(replayed.call(inputs)), self.rep_ms)?;
        self.emit(json!({
            "workload": "mlp_step", "shape": shape, "dtype": dtype, "variant": format!("braze reduce-overhead{tag}"),
            "us": graph_timing.median_us, "gbps": null, "reps": graph_timing.reps,
            "tflops": flops / (graph_timing.median_us * 1e-6) / 1e12,
        }));
        self.host_per_step(&shape, &dtype, &format!("+graphs{tag}"), &mut || ran(replayed.call(inputs)))?;
        drop(replayed);
        if state == StateDType::OfParams {
            if let Some((_, check_row)) = check {
                self.emit(check_row);
            }
            return Ok(());
        }
        if self.autotune {
            self.mlp_step_autotuned(&step, &shape, &dtype, flops)?;
        }
        self.schedule(&step.optimizer, &shape, &dtype, &mut || ran(compiled.call(inputs)), &|| compiled.stats())?;
        if let Some((_, check_row)) = check {
            self.emit(check_row);
        }
        Ok(())
    }

    /// Whether the host keeps ahead of the GPU: the host clock per step of back-to-back steps,
    /// returning from the call alone and until the device finished, and the uploads a step makes
    /// and how many of them waited for queued GPU work. A call that returns in about a step's GPU
    /// time is waiting for the GPU, so every step starts on an idle GPU.
    fn host_per_step(
        &mut self,
        shape: &str,
        dtype: &str,
        suffix: &str,
        step: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        let dev = self.timer.device.clone();
        let (uploads_before, waits_before) = dev.upload_stats();
        let (enqueue, total) = self.timer.host_per_call(step, HOST_STEPS)?;
        let (uploads_after, waits_after) = dev.upload_stats();
        let steps = (HOST_STEPS + HOST_STEPS.min(100)) as f64;
        let note = format!(
            "host clock per step over {HOST_STEPS} back-to-back steps, until the device finished; returning from \
             the call alone: {:.1} us; uploads a step: {:.2}, of which waited for queued work: {:.2}",
            super::micros(enqueue),
            (uploads_after - uploads_before) as f64 / steps,
            (waits_after - waits_before) as f64 / steps,
        );
        self.info("mlp_step", shape, dtype, &format!("info host per step{suffix}"), Some(super::micros(total)), &note);
        Ok(())
    }

    /// mlp_step in max-autotune mode: its first call times every kernel's candidates
    /// (cuBLASLt's algorithms for the matmuls among them) on the step's own operands.
    fn mlp_step_autotuned(&mut self, step: &TrainingStep, shape: &str, dtype: &str, flops: f64) -> Result<()> {
        let inputs = &step.workload.inputs;
        let tuned = step.workload.compile().fullgraph(true).mode(Mode::MaxAutotune).name("mlp_step");
        let start = Instant::now();
        ran(tuned.call(inputs))?;
        self.timer.sync()?;
        let tuning = start.elapsed();
        for _ in 0..WARM_STEPS {
            ran(tuned.call(inputs))?;
        }
        let tuned_timing = self.bench(&mut || ran(tuned.call(inputs)), self.rep_ms)?;
        let tuned_loss = tuned.call(inputs)?.remove(0).to_host()?.get_f64(0);
        if !tuned_loss.is_finite() {
            self.failures.push(format!("mlp_step {shape} max-autotune: a non-finite loss {tuned_loss}"));
        }
        self.emit(json!({
            "workload": "mlp_step", "shape": shape, "dtype": dtype, "variant": "braze compiled+autotune",
            "us": tuned_timing.median_us, "gbps": null, "reps": tuned_timing.reps,
            "tflops": flops / (tuned_timing.median_us * 1e-6) / 1e12, "tuning_s": tuning.as_secs_f64(),
        }));
        drop(tuned);
        Ok(())
    }

    /// Each kernel's GPU time in one step (launched one by one between timing events, the
    /// second profiled step), printed longest first with the sums per kernel family; an info row
    /// with their total beside the step time (the difference is launch gaps and host work).
    pub(super) fn kernel_profile(
        &mut self,
        workload: &str,
        shape: &str,
        dtype: &str,
        step_us: f64,
        profile: &mut dyn FnMut() -> Result<Vec<braze::KernelTime>>,
    ) -> Result<()> {
        profile()?;
        let mut times = profile()?;
        let total_us: f64 = times.iter().map(|t| t.ms as f64 * 1e3).sum();
        let mut families: Vec<(&str, f64, usize)> = Vec::new();
        for t in &times {
            match families.iter_mut().find(|f| f.0 == t.family) {
                Some(f) => {
                    f.1 += t.ms as f64 * 1e3;
                    f.2 += 1;
                }
                None => families.push((t.family, t.ms as f64 * 1e3, 1)),
            }
        }
        families.sort_by(|a, b| b.1.total_cmp(&a.1));
        println!("# {workload} {shape}: kernel GPU times of one step, {} kernels, {total_us:.1} us", times.len());
        for (family, us, n) in &families {
            println!("#   {family:<15} {n:>3} kernels {us:>9.1} us  {:>5.1}%", 100.0 * us / total_us);
        }
        times.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        for t in &times {
            println!("#   {:>9.1} us  {}", t.ms as f64 * 1e3, t.kernel);
        }
        let by_family: Vec<String> = families.iter().map(|(f, us, n)| format!("{f} {n}: {us:.0} us")).collect();
        self.emit(json!({
            "workload": workload, "shape": shape, "dtype": dtype, "variant": "info kernel profile",
            "us": total_us, "gbps": null,
            "note": format!(
                "kernels alone {} of the step's {} ({})",
                crate::timing::fmt_us(total_us),
                crate::timing::fmt_us(step_us),
                by_family.join(", ")
            ),
        }));
        Ok(())
    }

    /// A cosine learning-rate schedule, a new rate before every step: time per step on the
    /// host clock (the device finished) and the traces it caused (must be none).
    fn schedule(
        &mut self,
        optimizer: &braze::optim::AdamW,
        shape: &str,
        dtype: &str,
        step: &mut dyn FnMut() -> Result<()>,
        stats: &dyn Fn() -> braze::CompileStats,
    ) -> Result<()> {
        let traces = stats().traces;
        self.timer.sync()?;
        let start = Instant::now();
        for i in 0..SCHEDULE_STEPS {
            let progress = i as f64 / SCHEDULE_STEPS as f64;
            optimizer.set_lr(MLP_STEP_LR * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()))?;
            step()?;
        }
        self.timer.sync()?;
        let per_step = start.elapsed().as_secs_f64() * 1e6 / SCHEDULE_STEPS as f64;
        let retraces = stats().traces - traces;
        let note = format!(
            "{SCHEDULE_STEPS} steps with a new learning rate before each (cosine from {MLP_STEP_LR}), host clock per \
             step until the device finished: {retraces} retraces"
        );
        self.emit(json!({
            "workload": "mlp_step", "shape": shape, "dtype": dtype, "variant": "info lr schedule",
            "us": per_step, "gbps": null, "retraces": retraces, "steps": SCHEDULE_STEPS,
            "note": format!("{}: {note}", crate::timing::fmt_us(per_step)),
        }));
        if retraces != 0 {
            self.failures.push(format!("mlp_step {shape}: the learning-rate schedule caused {retraces} retraces"));
        }
        Ok(())
    }

    /// braze's step from PyTorch's weights against PyTorch's losses and gradients: the verdict
    /// and an info row holding every tensor's figures; each mismatch is a failure.
    fn check_against_torch(&mut self, dir: &Path, state: StateDType) -> Result<(&'static str, Value)> {
        let mut run = TorchRun::open(dir)?;
        run.sizes.optimizer_state = state;
        println!(
            "# mlp_step {}: PyTorch's first {} steps from {}, AdamW state {state:?}",
            run.shape(),
            run.steps,
            dir.display()
        );
        let report = torch_check::check_steps(&run, self.device(), Mode::Default)?;
        report.print();
        let failures = report.failures();
        let verdict = if failures.is_empty() { "pass" } else { "FAIL" };
        for failure in &failures {
            self.failures.push(format!("mlp_step {} against PyTorch: {failure}", report.shape));
        }
        let mut row = json!({
            "workload": "mlp_step", "shape": report.shape, "dtype": run.sizes.dtype.to_string(),
            "variant": format!("info torch check{}", state_tag(state)), "us": null, "gbps": null, "check": verdict,
            "note": format!("same initial weights and inputs as PyTorch: {}", report.summary()),
        });
        row["detail"] = report.to_json();
        Ok((verdict, row))
    }
}

/// What ends the variants of an mlp_step whose AdamW keeps its moments in `state`.
fn state_tag(state: StateDType) -> &'static str {
    match state {
        StateDType::F32 => "",
        StateDType::OfParams => ", bf16 state",
    }
}
