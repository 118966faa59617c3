//! Keeping the GPU busy: one training loop written two ways, each run with a timeline, for
//! either model the loops train (`mlp_step`, or nanoGPT's `gpt2_step`). The naive loop reads its
//! metric with a host copy every step, checks for NaN in an `if`, uploads each batch from
//! pageable memory and launches op by op; the braze loop calls a strict compiled step in
//! reduce-overhead mode (CUDA graph replays, where the executor finds the inputs' addresses
//! again), keeps its metrics on the device (read every `read_every` steps) and takes its batches
//! from a pinned prefetcher. `braze demo` shows both side by side; `braze bench --only busy`
//! (`mlp_step`) and `--only busy_gpt2` measure them at a real size.

use anyhow::{bail, Result};
use braze::timeline::{self, Summary, Trace, Track};
use braze::{pageable_copy_count, sync_count, DType, Device, DeviceMetric, HostTensor, Mode, Prefetcher, Tensor};
use braze_workloads::gpt2::{gpt2_training_step, random_token_ids, Gpt2Sizes};
use braze_workloads::{mlp_training_step, Sizes, Workload};
use std::sync::Arc;
use std::time::Instant;

/// This file's text, to print the source line of each sync the naive loop had.
const SOURCE: &str = include_str!("busy.rs");

/// Distinct batches the loops cycle through.
const BATCHES: usize = 4;
/// Steps run before the measured ones (tracing, compiling, first launches).
const WARMUP_STEPS: u64 = 2;

/// What the loops train.
#[derive(Clone, Debug)]
pub enum LoopModel {
    /// `mlp_step` on batches `x` and `target` of `[rows, hidden]`.
    Mlp { rows: usize, hidden: usize, dtype: DType },
    /// `gpt2_step` (nanoGPT's step: f32 parameters, the forward autocast to the sizes' dtype when
    /// it is 16-bit) on batches of token ids `idx` and `targets`, `[batch, seq]` i64.
    Gpt2(Gpt2Sizes),
}

#[derive(Clone, Debug)]
pub struct LoopSizes {
    pub model: LoopModel,
    pub steps: u64,
    /// The braze loop reads its device metrics every this many steps.
    pub read_every: u64,
}

impl LoopModel {
    /// The step on fresh seeded parameters (the same for both loops): inputs a batch, first
    /// output the loss.
    fn workload(&self, device: Device) -> Result<Workload> {
        Ok(match self {
            LoopModel::Mlp { rows, hidden, dtype } => {
                let sizes = Sizes { rows: *rows, hidden: *hidden, dtype: *dtype, ..Sizes::default() };
                mlp_training_step(&sizes, device)?.workload
            }
            LoopModel::Gpt2(sizes) => gpt2_training_step(sizes, device)?.0,
        })
    }

    /// The same host batches for both loops.
    fn batches(&self) -> Result<Vec<Vec<HostTensor>>> {
        (0..BATCHES as u64)
            .map(|b| match self {
                LoopModel::Mlp { rows, hidden, dtype } => Ok(vec![
                    braze_cpu::random_tensor(*dtype, [*rows, *hidden], 7000 + b),
                    braze_cpu::random_tensor(*dtype, [*rows, *hidden], 8000 + b),
                ]),
                LoopModel::Gpt2(sizes) => {
                    Ok(vec![random_token_ids(sizes, 7000 + b)?, random_token_ids(sizes, 8000 + b)?])
                }
            })
            .collect()
    }

    /// The batch's shape (`[2048,1024]`) or the model's (`L12 B16 T1024 C768`).
    pub fn shape(&self) -> String {
        match self {
            LoopModel::Mlp { rows, hidden, .. } => format!("[{rows},{hidden}]"),
            LoopModel::Gpt2(sizes) => sizes.shape("gpt2_step"),
        }
    }

    /// The dtype the step computes in.
    pub fn dtype(&self) -> DType {
        match self {
            LoopModel::Mlp { dtype, .. } => *dtype,
            LoopModel::Gpt2(sizes) => sizes.dtype,
        }
    }
}

/// One loop's run.
pub struct LoopRun {
    pub name: &'static str,
    pub steps: u64,
    pub seconds: f64,
    pub syncs: u64,
    pub pageable_copies: u64,
    /// From the loop's timeline; `None` when it ran untraced.
    pub summary: Option<Summary>,
    /// Every sync site of the loop: `file:line:col`, op, count, in order of first appearance.
    pub sync_sites: Vec<(String, String, usize)>,
    /// The mean loss of the measured steps, as the host received it.
    pub mean_loss: f64,
    /// CUDA graph replays on the timeline (0 untraced and on the CPU backend).
    pub graph_replays: usize,
}

impl LoopRun {
    pub fn steps_per_second(&self) -> f64 {
        self.steps as f64 / self.seconds
    }

    pub fn syncs_per_step(&self) -> f64 {
        self.syncs as f64 / self.steps as f64
    }
}

/// Runs `body` over the measured steps, with a timeline when `traced`; counts its syncs and
/// pageable copies.
fn measure(name: &'static str, traced: bool, steps: u64, body: &mut dyn FnMut() -> Result<f64>) -> Result<LoopRun> {
    // A BRAZE_TRACE recording keeps going; the loop's part of it is summarized.
    let own_recording = traced && !timeline::is_recording();
    if own_recording {
        timeline::start();
    }
    let from_us = timeline::now_us();
    let (syncs, pageable) = (sync_count(), pageable_copy_count());
    let started = Instant::now();
    let mean_loss = body();
    let seconds = started.elapsed().as_secs_f64();
    let (syncs, pageable) = (sync_count() - syncs, pageable_copy_count() - pageable);
    let trace: Option<Trace> = match (own_recording, from_us) {
        (true, _) => Some(timeline::stop()?),
        (false, Some(from)) if traced => timeline::snapshot()?.map(|t| t.since(from)),
        _ => None,
    };
    let mean_loss = mean_loss?;
    // The loop's own syncs: those on the thread that ran its steps (a timeline records every
    // thread of the process).
    let spans = trace.iter().flat_map(|t| &t.spans);
    let loop_thread = spans.clone().find(|s| s.category == "step").map(|s| s.track);
    let mut sync_sites: Vec<(String, String, usize)> = Vec::new();
    for span in spans.filter(|s| s.category == "sync" && Some(s.track) == loop_thread) {
        let site = span.detail.clone().unwrap_or_default();
        match sync_sites.iter_mut().find(|(s, op, _)| *s == site && *op == span.name) {
            Some(entry) => entry.2 += 1,
            None => sync_sites.push((site, span.name.clone(), 1)),
        }
    }
    Ok(LoopRun {
        name,
        steps,
        seconds,
        syncs,
        pageable_copies: pageable,
        summary: trace.as_ref().map(Summary::of),
        graph_replays: trace
            .iter()
            .flat_map(|t| &t.spans)
            .filter(|s| s.track == Track::Compute && s.category == "graph")
            .count(),
        sync_sites,
        mean_loss,
    })
}

/// The loop as it is usually first written.
pub fn naive_loop(device: Device, sizes: &LoopSizes, traced: bool) -> Result<LoopRun> {
    let step = sizes.model.workload(device)?.function;
    let batches = sizes.model.batches()?;
    let upload = |host: &HostTensor| -> Result<Tensor> {
        let tensor = Tensor::from_host(host.clone());
        // On the CPU backend the batch is where it is used: no copy, and no sync.
        Ok(if device == Device::Cpu { tensor } else { tensor.to_device(device)? })
    };
    let run_step = |i: u64| -> Result<f64> {
        // Pageable batches: each upload is staged by the driver and overlaps nothing.
        let batch = batches[i as usize % BATCHES].iter().map(upload).collect::<Result<Vec<_>>>()?;
        // Eager: every op is its own launch.
        let loss = step(&batch)?.remove(0);
        // The metric read with a host copy every step (in the loss's own dtype: bf16 for the
        // bf16 mlp_step).
        let value = loss.to_host()?.get_f64(0);
        // A NaN check in an `if`: another sync.
        if loss.any_nan()?.to_bool()? {
            bail!("the loss is NaN at step {i}");
        }
        Ok(value)
    };
    for i in 0..WARMUP_STEPS {
        run_step(i)?;
    }
    measure("naive loop", traced, sizes.steps, &mut || {
        let mut sum = 0.0;
        for i in 0..sizes.steps {
            let _step = timeline::step(i);
            sum += run_step(i)?;
        }
        Ok(sum / sizes.steps as f64)
    })
}

/// The same loop with braze: strict compiled step (graph replay), device metrics, pinned prefetch.
pub fn braze_loop(device: Device, sizes: &LoopSizes, traced: bool) -> Result<LoopRun> {
    braze_loop_in(device, sizes, traced, Mode::ReduceOverhead)
}

/// [`braze_loop`] with the step compiled in `mode` (`Mode::Default`: its kernels launched one by
/// one instead of replayed as a CUDA graph).
pub fn braze_loop_in(device: Device, sizes: &LoopSizes, traced: bool, mode: Mode) -> Result<LoopRun> {
    let step = sizes.model.workload(device)?.compile().fullgraph(true).mode(mode);
    // Prepared once and shared with the prefetcher (as the PyTorch loop pins its batches once):
    // each step stages a batch into pinned memory, with no copy of its own before that.
    let batches: Vec<Arc<Vec<HostTensor>>> = sizes.model.batches()?.into_iter().map(Arc::new).collect();
    let source = |count: u64| {
        let batches = batches.clone();
        (0..count).map(move |i| batches[i as usize % BATCHES].clone())
    };
    for batch in Prefetcher::new(device, source(WARMUP_STEPS))? {
        step.call(&batch?)?;
    }
    let name = if mode == Mode::ReduceOverhead { "braze loop" } else { "braze loop, direct launches" };
    measure(name, traced, sizes.steps, &mut || {
        let mut loss = DeviceMetric::new("loss", device).read_every(sizes.read_every);
        let mut non_finite = DeviceMetric::new("NaN losses", device).read_every(sizes.read_every);
        for (i, batch) in Prefetcher::new(device, source(sizes.steps))?.enumerate() {
            let _step = timeline::step(i as u64);
            let value = step.call(&batch?)?.remove(0);
            loss.add(&value)?;
            non_finite.add(&value.any_nan()?)?;
            if non_finite.poll()?.is_some_and(|r| r.sum > 0.0) {
                bail!("a loss was NaN by step {i}");
            }
            loss.poll()?;
        }
        // The last reading, once the GPU has delivered it.
        loss.request()?;
        loop {
            if let Some(reading) = loss.poll()? {
                return Ok(reading.mean());
            }
            std::thread::yield_now();
        }
    })
}

/// The text of `file:line:col`'s line when it is in this file.
pub fn source_line(site: &str) -> Option<&'static str> {
    let mut parts = site.rsplitn(3, ':');
    let (_col, line, file) = (parts.next()?, parts.next()?, parts.next()?);
    if !file.ends_with("busy.rs") {
        return None;
    }
    SOURCE.lines().nth(line.parse::<usize>().ok()?.checked_sub(1)?).map(str::trim)
}

/// The two runs side by side, and the naive loop's sync sites with their source lines.
pub fn report(naive: &LoopRun, braze: &LoopRun) -> String {
    let busy = |r: &LoopRun| r.summary.as_ref().map_or("-".to_string(), |s| format!("{:.1}%", s.busy_percent()));
    let mut out = String::new();
    out += &format!("{:24} {:>14} {:>14}\n", "", naive.name, braze.name);
    out += &format!("{:24} {:>14} {:>14}\n", "GPU busy", busy(naive), busy(braze));
    out += &format!("{:24} {:>14.1} {:>14.1}\n", "steps/s", naive.steps_per_second(), braze.steps_per_second());
    out += &format!("{:24} {:>14.2} {:>14.2}\n", "host syncs per step", naive.syncs_per_step(), braze.syncs_per_step());
    out += &format!(
        "{:24} {:>14.2} {:>14.2}\n",
        "pageable copies per step",
        naive.pageable_copies as f64 / naive.steps as f64,
        braze.pageable_copies as f64 / braze.steps as f64
    );
    out += &format!(
        "{:24} {:>14.2} {:>14.2}\n",
        "graph replays per step",
        naive.graph_replays as f64 / naive.steps as f64,
        braze.graph_replays as f64 / braze.steps as f64
    );
    if !naive.sync_sites.is_empty() {
        out += &format!("every sync of the {} ({} steps):\n", naive.name, naive.steps);
        for (site, op, count) in &naive.sync_sites {
            let line = source_line(site).map(|l| format!("    {l}")).unwrap_or_default();
            out += &format!("  {site}: {op} x{count}\n{line}\n");
        }
    }
    if let Some(summary) = &naive.summary {
        if let Some(gap) = summary.gaps.first() {
            out += &format!(
                "the {}'s largest gap: {:.3} ms, the host in {}\n",
                naive.name,
                gap.dur_us / 1e3,
                if gap.host.is_empty() { "untraced code".to_string() } else { gap.host.join("; ") }
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both loops train the small GPT-2 from the same weights on the same batches: the same
    /// losses, the naive loop's syncs at their lines, none in the braze loop.
    #[test]
    fn both_gpt2_loops_train_alike_and_only_the_naive_one_syncs() -> Result<()> {
        let sizes = LoopSizes { model: LoopModel::Gpt2(Gpt2Sizes::small()), steps: 4, read_every: 2 };
        let naive = naive_loop(Device::Cpu, &sizes, true)?;
        let fast = braze_loop(Device::Cpu, &sizes, true)?;
        assert!(
            naive.mean_loss.is_finite() && naive.mean_loss > 1.0,
            "a small GPT's first losses: {}",
            naive.mean_loss
        );
        let difference = (naive.mean_loss - fast.mean_loss).abs();
        assert!(difference < 1e-4 * naive.mean_loss, "mean loss {} vs {}", naive.mean_loss, fast.mean_loss);
        // Eagerly, the embedding and the cross-entropy read their indices on the host to check
        // their range: two syncs a step beside the loop's own two.
        assert_eq!((naive.syncs_per_step(), fast.syncs_per_step()), (4.0, 0.0));
        let ops: Vec<&str> = naive.sync_sites.iter().map(|(_, op, _)| op.as_str()).collect();
        assert_eq!(ops, ["sync `embedding`", "sync `cross_entropy`", "sync `to_host`", "sync `to_bool`"]);
        assert!(naive.sync_sites.iter().all(|(_, _, count)| *count == 4));
        assert_eq!(naive.sync_sites.iter().filter(|(site, _, _)| source_line(site).is_some()).count(), 2);
        for run in [&naive, &fast] {
            let summary = run.summary.as_ref().expect("traced");
            assert_eq!(summary.steps, 4);
            assert!(summary.busy_us > 0.0 && summary.busy_us <= summary.window_us);
        }
        Ok(())
    }
}
