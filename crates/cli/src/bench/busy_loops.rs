//! `busy`: the naive training loop and the braze loop of `braze demo` at a real size. Each runs
//! untraced for steps/s and again with a timeline for GPU busy % (the trace's events cost a
//! little time of their own); `benches/torch_busy.py` runs the same two loops in PyTorch.

use super::Bench;
use crate::busy::{self, LoopRun, LoopSizes};
use anyhow::Result;
use braze::DType;
use serde_json::json;

pub const BUSY_SIZES: LoopSizes =
    LoopSizes { rows: 2048, hidden: 1024, dtype: DType::BF16, steps: 200, read_every: 50 };

impl Bench {
    pub(super) fn busy(&mut self) -> Result<()> {
        let sizes = BUSY_SIZES;
        let device = self.device();
        let shape = format!("[{},{}] x{}", sizes.rows, sizes.hidden, sizes.steps);
        let runs = [
            (busy::naive_loop(device, &sizes, false)?, busy::naive_loop(device, &sizes, true)?),
            (busy::braze_loop(device, &sizes, false)?, busy::braze_loop(device, &sizes, true)?),
        ];
        for (timed, traced) in &runs {
            self.busy_row(&shape, &sizes, timed, traced);
        }
        let naive = &runs[0].1;
        for (site, op, count) in &naive.sync_sites {
            let line = busy::source_line(site).unwrap_or("");
            self.info(
                "busy",
                &shape,
                &sizes.dtype.to_string(),
                "info naive sync",
                None,
                &format!("{site}: {op} x{count}: {line}"),
            );
        }
        Ok(())
    }

    fn busy_row(&mut self, shape: &str, sizes: &LoopSizes, timed: &LoopRun, traced: &LoopRun) {
        let busy_percent = traced.summary.as_ref().map(|s| s.busy_percent());
        let note = format!(
            "{:.1} steps/s, GPU busy {}, {:.2} syncs/step, {:.2} pageable copies/step, mean loss {:.5}",
            timed.steps_per_second(),
            busy_percent.map_or("-".to_string(), |b| format!("{b:.1}%")),
            timed.syncs_per_step(),
            timed.pageable_copies as f64 / timed.steps as f64,
            timed.mean_loss
        );
        self.emit(json!({
            "workload": "busy", "shape": shape, "dtype": sizes.dtype.to_string(), "variant": timed.name,
            "us": 1e6 / timed.steps_per_second(), "gbps": null,
            "steps_per_s": timed.steps_per_second(), "busy_percent": busy_percent,
            "syncs_per_step": timed.syncs_per_step(),
            "pageable_copies_per_step": timed.pageable_copies as f64 / timed.steps as f64,
            "graph_replays_per_step": traced.graph_replays as f64 / traced.steps as f64,
            "note": note,
        }));
    }
}
