//! What a compiled call did: its graphs, breaks, host synchronizations and recompiles.

use crate::mode::Mode;
use crate::trace::GraphRun;
use crate::GraphBreak;
use braze_ir::Graph;
use braze_plan::{saved_for_backward, BufferRole, MemoryPlan, SavedForBackward};
use std::fmt;
use std::sync::Arc;

/// What one call did, for `explain`.
#[derive(Default)]
pub(crate) struct RunReport {
    pub runs: Vec<GraphRun>,
    pub breaks: Vec<GraphBreak>,
    pub eager_fallback: bool,
}

#[derive(Clone, Debug)]
pub struct Explanation {
    pub function: String,
    pub mode: Mode,
    pub fullgraph: bool,
    /// The graphs the call ran, in order: one without breaks, one per piece of a split function.
    pub graphs: Vec<Arc<Graph>>,
    pub breaks: Vec<GraphBreak>,
    /// Times the host waited for tensor values in the call, i.e. per step of a loop that calls
    /// it once a step ([`crate::sync_count`] over the call): each break reads values on the host,
    /// as does any eager read of a call that fell back to eager execution; a fullgraph call has none.
    pub host_syncs: usize,
    /// Traces caused by a new signature so far, and why each happened.
    pub recompiles: usize,
    pub recompile_reasons: Vec<String>,
    /// The call ran eagerly because the recompile limit was reached.
    pub eager_fallback: bool,
    /// Kernels generated for the graphs and launches per call; `None` where the backend
    /// interprets graphs instead (the CPU reference).
    pub kernels: Option<usize>,
    pub launches: Option<usize>,
    /// What the backward kernels read from the forward ones (activations held between the two),
    /// summed over the plans; `None` without a backward in any fused plan.
    pub saved_for_backward: Option<SavedForBackward>,
    /// Bytes of the arena holding the fused plans' intermediates (buffers whose lifetimes do not
    /// overlap share it), summed over the plans; `None` without fused plans.
    pub arena_bytes: Option<usize>,
    /// Device memory one call of the largest fused plan holds at its peak: its inputs (the
    /// batch, and captured tensors such as parameters and optimizer state), its outputs that are
    /// not written in place, and its arena; `None` without fused plans. Kernels' small scratch
    /// and the matmul library's workspace come on top.
    pub peak: Option<PeakMemory>,
    /// Assigned captured tensors the graphs update in place: written directly by the kernel that
    /// computes the new value, or (where that could clobber values still to be read) through a
    /// temporary and a copy kernel. Assignments in neither count swap in new data after the call.
    pub write_backs_in_place: usize,
    pub write_backs_copied: usize,
}

impl Explanation {
    pub(crate) fn new(
        function: &str,
        mode: Mode,
        fullgraph: bool,
        report: RunReport,
        recompile_reasons: Vec<String>,
    ) -> Explanation {
        let counts: Option<Vec<_>> = report.runs.iter().map(|run| run.exe.kernel_counts()).collect();
        let counts = counts.filter(|c| !c.is_empty());
        let plans: Vec<_> = report.runs.iter().filter_map(|run| run.exe.plan()).collect();
        let saved = plans
            .iter()
            .filter_map(|p| saved_for_backward(p))
            .reduce(|a, b| SavedForBackward { buffers: a.buffers + b.buffers, bytes: a.bytes + b.bytes });
        let arenas: Vec<usize> = plans.iter().map(|p| MemoryPlan::for_plan(p).arena_bytes).collect();
        let arena_bytes = (!plans.is_empty()).then(|| arenas.iter().sum());
        let peak = plans.iter().zip(&arenas).map(|(p, &arena)| PeakMemory::of(p, arena)).max_by_key(PeakMemory::total);
        let write_backs = plans.iter().fold((0, 0), |(direct, copied), plan| {
            let w = plan.write_backs();
            (direct + w.direct, copied + w.copied)
        });
        Explanation {
            function: function.to_string(),
            mode,
            fullgraph,
            graphs: report.runs.iter().map(|run| run.graph.clone()).collect(),
            host_syncs: report.breaks.len(),
            breaks: report.breaks,
            recompiles: recompile_reasons.len(),
            recompile_reasons,
            eager_fallback: report.eager_fallback,
            kernels: counts.as_ref().map(|c| c.iter().map(|k| k.kernels).sum()),
            launches: counts.as_ref().map(|c| c.iter().map(|k| k.launches_per_call).sum()),
            saved_for_backward: saved,
            arena_bytes,
            peak,
            write_backs_in_place: write_backs.0,
            write_backs_copied: write_backs.1,
        }
    }
}

/// What one call of a fused plan holds in device memory at its peak, by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeakMemory {
    /// The plan's inputs: the arguments and the captured tensors.
    pub inputs: usize,
    /// Outputs in memory of their own (those written in place into an input count as inputs).
    pub outputs: usize,
    /// The arena of intermediates.
    pub intermediates: usize,
}

impl PeakMemory {
    /// `plan`'s, whose arena takes `arena_bytes`.
    fn of(plan: &braze_plan::Plan, arena_bytes: usize) -> PeakMemory {
        let bytes_of = |role: fn(&BufferRole) -> bool| -> usize {
            plan.buffers.iter().filter(|b| role(&b.role)).map(|b| b.bytes()).sum()
        };
        PeakMemory {
            inputs: bytes_of(|r| matches!(r, BufferRole::Input(_))),
            outputs: bytes_of(|r| matches!(r, BufferRole::Output)),
            intermediates: arena_bytes,
        }
    }

    pub fn total(&self) -> usize {
        self.inputs + self.outputs + self.intermediates
    }
}

/// Bytes as B, KiB or MiB, one decimal.
fn human_bytes(bytes: usize) -> String {
    match bytes {
        b if b < 1 << 10 => format!("{b} B"),
        b if b < 1 << 20 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)),
    }
}

fn or_na(value: Option<usize>) -> String {
    value.map_or_else(|| "n/a".to_string(), |v| v.to_string())
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "function: {} (mode: {}, fullgraph: {})", self.function, self.mode, self.fullgraph)?;
        writeln!(f, "graphs: {}", self.graphs.len())?;
        for (i, graph) in self.graphs.iter().enumerate() {
            writeln!(f, "  graph {i}: {} ops", graph.op_count())?;
        }
        if self.eager_fallback {
            writeln!(f, "eager fallback: the recompile limit was reached, this call ran op by op")?;
        }
        writeln!(f, "breaks: {}", self.breaks.len())?;
        for b in &self.breaks {
            writeln!(f, "break: {b}")?;
        }
        writeln!(f, "host syncs: {} per step", self.host_syncs)?;
        writeln!(f, "recompiles: {}", self.recompiles)?;
        for reason in &self.recompile_reasons {
            writeln!(f, "  recompile: {reason}")?;
        }
        if self.write_backs_in_place + self.write_backs_copied > 0 {
            writeln!(
                f,
                "write-backs: {} in place, {} through a copy",
                self.write_backs_in_place, self.write_backs_copied
            )?;
        }
        writeln!(f, "kernels: {}", or_na(self.kernels))?;
        writeln!(f, "launches: {}", or_na(self.launches))?;
        if let Some(bytes) = self.arena_bytes {
            writeln!(f, "intermediates: {} in one arena", human_bytes(bytes))?;
        }
        if let Some(peak) = self.peak {
            writeln!(
                f,
                "peak memory: {} a call ({} inputs and captured tensors, {} outputs, {} intermediates)",
                human_bytes(peak.total()),
                human_bytes(peak.inputs),
                human_bytes(peak.outputs),
                human_bytes(peak.intermediates)
            )?;
        }
        if let Some(saved) = self.saved_for_backward {
            writeln!(f, "saved for backward: {} in {} buffers", human_bytes(saved.bytes), saved.buffers)?;
        }
        Ok(())
    }
}
