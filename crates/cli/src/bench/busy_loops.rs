//! `busy` and `busy_gpt2`: the naive training loop and the braze loop of `braze demo` at a real
//! size, on `mlp_step` and on nanoGPT's `gpt2_step`. Each loop runs untraced for steps/s and
//! again with a timeline for GPU busy % (the trace's events cost a little time of their own);
//! `benches/torch_busy.py` (`--model gpt2` for the second) runs the same two loops in PyTorch.

use super::Bench;
use crate::busy::{self, LoopModel, LoopRun, LoopSizes};
use anyhow::Result;
use braze::{DType, Mode};
use braze_workloads::gpt2::Gpt2Sizes;
use serde_json::json;

pub fn busy_sizes() -> LoopSizes {
    LoopSizes { model: LoopModel::Mlp { rows: 2048, hidden: 1024, dtype: DType::BF16 }, steps: 200, read_every: 50 }
}

/// `gpt2_step` at its standard size over 100 steps (the target: the braze loop keeps the GPU busy
/// at least 97% of them).
pub fn busy_gpt2_sizes() -> LoopSizes {
    LoopSizes { model: LoopModel::Gpt2(Gpt2Sizes::standard()), steps: 100, read_every: 50 }
}

/// Steps of the naive `gpt2_step` loop: eager, every op its own launch, far slower per step.
const NAIVE_GPT2_STEPS: u64 = 20;

impl Bench {
    pub(super) fn busy(&mut self, sizes: &LoopSizes) -> Result<()> {
        let device = self.device();
        let naive_sizes = match sizes.model {
            LoopModel::Gpt2(_) => LoopSizes { steps: NAIVE_GPT2_STEPS.min(sizes.steps), ..sizes.clone() },
            LoopModel::Mlp { .. } => sizes.clone(),
        };
        let mut runs = vec![
            (busy::naive_loop(device, &naive_sizes, false)?, busy::naive_loop(device, &naive_sizes, true)?),
            (busy::braze_loop(device, sizes, false)?, busy::braze_loop(device, sizes, true)?),
        ];
        if let LoopModel::Gpt2(_) = sizes.model {
            // The same loop with the step's kernels launched one by one: what graph replay adds.
            let direct = |traced| busy::braze_loop_in(device, sizes, traced, Mode::Default);
            runs.push((direct(false)?, direct(true)?));
        }
        let workload = workload_name(&sizes.model);
        for (timed, traced) in &runs {
            self.busy_row(workload, &sizes.model, timed, traced);
            if let Some(summary) = &traced.summary {
                // Where the GPU waited, and what the host was doing meanwhile.
                let gaps: Vec<String> = summary
                    .gaps
                    .iter()
                    .take(3)
                    .map(|g| format!("{:.3} ms ({})", g.dur_us / 1e3, g.host.join("; ")))
                    .collect();
                let note = format!("{}: largest gaps {}", traced.name, gaps.join(", "));
                self.info(workload, &sizes.model.shape(), &sizes.model.dtype().to_string(), "info gaps", None, &note);
            }
        }
        let naive = &runs[0].1;
        for (site, op, count) in &naive.sync_sites {
            let line = busy::source_line(site).unwrap_or("");
            self.info(
                workload,
                &sizes.model.shape(),
                &sizes.model.dtype().to_string(),
                "info naive sync",
                None,
                &format!("{site}: {op} x{count}: {line}"),
            );
        }
        Ok(())
    }

    fn busy_row(&mut self, workload: &str, model: &LoopModel, timed: &LoopRun, traced: &LoopRun) {
        let busy_percent = traced.summary.as_ref().map(|s| s.busy_percent());
        let note = format!(
            "{} steps: {:.1} steps/s, GPU busy {}, {:.2} syncs/step, {:.2} pageable copies/step, mean loss {:.5}",
            timed.steps,
            timed.steps_per_second(),
            busy_percent.map_or("-".to_string(), |b| format!("{b:.1}%")),
            timed.syncs_per_step(),
            timed.pageable_copies as f64 / timed.steps as f64,
            timed.mean_loss
        );
        self.emit(json!({
            "workload": workload, "shape": model.shape(), "dtype": model.dtype().to_string(), "variant": timed.name,
            "us": 1e6 / timed.steps_per_second(), "gbps": null, "steps": timed.steps,
            "steps_per_s": timed.steps_per_second(), "busy_percent": busy_percent,
            "syncs_per_step": timed.syncs_per_step(),
            "pageable_copies_per_step": timed.pageable_copies as f64 / timed.steps as f64,
            "graph_replays_per_step": traced.graph_replays as f64 / traced.steps as f64,
            "mean_loss": timed.mean_loss,
            "note": note,
        }));
    }
}

/// The bench's name for a model's loops (rows keyed as `benches/torch_busy.py` keys them).
fn workload_name(model: &LoopModel) -> &'static str {
    match model {
        LoopModel::Mlp { .. } => "busy",
        LoopModel::Gpt2(_) => "busy_gpt2",
    }
}
