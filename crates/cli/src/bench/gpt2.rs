//! The GPT-2 training workloads (`benches/workloads.md`, "Training"): `block_fwd`, `block_step`
//! and `gpt2_step` at their standard sizes, each compiled fullgraph and timed as the other
//! workloads, reported in tokens/s and TFLOP/s (nanoGPT's estimate for `gpt2_step`) beside the
//! rows of `benches/torch_gpt2.py`.

use super::{ran, Bench};
use anyhow::Result;
use braze::Mode;
use braze_workloads::gpt2::{block_workload, gpt2_step_flops, gpt2_training_step};
use braze_workloads::{Gpt2Sizes, Workload};
use serde_json::json;

/// Steps run before timing (the first traces and compiles).
const WARM_STEPS: usize = 2;

impl Bench {
    pub(super) fn gpt2_workload(&mut self, name: &'static str) -> Result<()> {
        let sizes = Gpt2Sizes::standard();
        let tokens = (sizes.batch * sizes.seq) as f64;
        let c = sizes.n_embd as f64;
        let (workload, flops, params) = match name {
            "gpt2_step" => {
                let (workload, trainer) = gpt2_training_step(&sizes, self.device())?;
                let flops = gpt2_step_flops(&trainer, &sizes);
                (workload, flops, Some(braze_workloads::gpt2::gpt2_parameters(&trainer)))
            }
            _ => {
                let backward = name == "block_step";
                // Matmuls 2 * 12 C^2 per token, attention 2 * 2 T C (causal: half), backward twice.
                let forward = tokens * (24.0 * c * c + 2.0 * sizes.seq as f64 * c);
                (block_workload(&sizes, self.device(), backward)?, if backward { 3.0 * forward } else { forward }, None)
            }
        };
        self.time_gpt2(name, &sizes, &workload, tokens, flops, params)
    }

    fn time_gpt2(
        &mut self,
        name: &str,
        sizes: &Gpt2Sizes,
        workload: &Workload,
        tokens: f64,
        flops: f64,
        params: Option<usize>,
    ) -> Result<()> {
        let shape = sizes.shape(name);
        let dtype = sizes.dtype.to_string();
        let inputs = &workload.inputs;
        // Default first (with each kernel's time in one step), then max-autotune: what tuning
        // every kernel's launch config on these shapes buys, and how long it takes.
        for mode in self.modes(&[Mode::Default, Mode::MaxAutotune]) {
            let compiled = workload.compile().fullgraph(true).mode(mode).name(name);
            let start = std::time::Instant::now();
            let explained = compiled.explain(inputs)?;
            ran(compiled.call(inputs))?;
            self.timer.sync()?;
            let first_call = start.elapsed();
            for _ in 1..WARM_STEPS {
                ran(compiled.call(inputs))?;
            }
            let timing = self.bench(&mut || ran(compiled.call(inputs)), self.rep_ms)?;
            let us = timing.median_us;
            let mut row = json!({
                "workload": name, "shape": shape, "dtype": dtype, "variant": super::mode_variant(mode),
                "us": us, "gbps": null, "reps": timing.reps,
                "tokens_per_s": tokens / (us * 1e-6), "tflops": flops / (us * 1e-6) / 1e12,
                "params": params, "kernels": explained.kernels, "launches": explained.launches,
                "host_syncs": explained.host_syncs, "graphs": explained.graphs.len(),
                "first_call_s": first_call.as_secs_f64(),
            });
            if mode == Mode::MaxAutotune {
                // The first call traced, compiled every candidate, timed them and ran the winners.
                row["tuning_s"] = json!(first_call.as_secs_f64());
            }
            self.emit(row);
            if mode == Mode::Default && name != "block_fwd" {
                self.kernel_profile(name, &shape, &dtype, us, &mut || Ok(compiled.profile(inputs)?.1))?;
            }
            if mode == Mode::Default && (explained.host_syncs != 0 || explained.graphs.len() != 1) {
                self.failures.push(format!(
                    "{name} {shape}: {} graph(s), {} host sync(s) per step; the step must be one graph with none",
                    explained.graphs.len(),
                    explained.host_syncs
                ));
            }
        }
        Ok(())
    }
}
