//! Running one graph through the pipeline, stage by stage, and judging its outputs.

use crate::common::{compile_for_sm90, random_inputs};
use crate::judge::{judge, References, Verdict};
use braze_codegen::{default_config, generate, KernelCode, Target};
use braze_cpu::eval_plan;
use braze_ir::{Graph, HostTensor};
use braze_passes::{compile_to_plan, FusionOptions};
use braze_plan::Plan;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// Verifying the graph and evaluating it with the reference.
    Build,
    Fuse,
    Codegen,
    Compile,
    Run,
    Compare,
    /// Loading the compiled kernels and allocating: `PlanExecutable::new` on the GPU.
    GpuBuild,
    /// Uploading, launching directly and downloading.
    GpuRun,
    /// Judging the direct launches' outputs against the references.
    GpuCompare,
    /// Capturing a CUDA graph and replaying it on new data.
    GraphRun,
    /// Judging the replay's outputs against the references.
    GraphCompare,
    /// The GPU against the CPU plan executor, on outputs whose bits must agree.
    Agreement,
}

/// The stages of the CPU pipeline.
pub const STAGES: [Stage; 6] = [Stage::Build, Stage::Fuse, Stage::Codegen, Stage::Compile, Stage::Run, Stage::Compare];

/// The stages of the CPU pipeline followed by those on the GPU.
pub const GPU_STAGES: [Stage; 12] = [
    Stage::Build,
    Stage::Fuse,
    Stage::Codegen,
    Stage::Compile,
    Stage::Run,
    Stage::Compare,
    Stage::GpuBuild,
    Stage::GpuRun,
    Stage::GpuCompare,
    Stage::GraphRun,
    Stage::GraphCompare,
    Stage::Agreement,
];

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Stage::Build => "build",
            Stage::Fuse => "fuse",
            Stage::Codegen => "codegen",
            Stage::Compile => "compile",
            Stage::Run => "run",
            Stage::Compare => "compare",
            Stage::GpuBuild => "gpu build",
            Stage::GpuRun => "gpu run",
            Stage::GpuCompare => "gpu compare",
            Stage::GraphRun => "graph replay",
            Stage::GraphCompare => "graph compare",
            Stage::Agreement => "gpu vs cpu plan",
        };
        f.write_str(name)
    }
}

#[derive(Clone, Debug)]
pub struct Failure {
    pub stage: Stage,
    pub message: String,
}

/// What one graph produced.
#[derive(Default)]
pub struct Produced {
    pub kernels: BTreeMap<&'static str, usize>,
    pub compiled: usize,
    /// How many elements needed more than the tolerance.
    pub verdict: Verdict,
}

thread_local! {
    /// Set while a stage runs, so that an expected panic does not print its message twice.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

pub fn install_quiet_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
}

/// Runs `f` as `stage`: an error or a panic is that stage's failure.
pub fn stage<T>(stage: Stage, f: impl FnOnce() -> Result<T, String>) -> Result<T, Failure> {
    QUIET.with(|q| q.set(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(false));
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(message)) => Err(Failure { stage, message }),
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic without a message".into());
            Err(Failure { stage, message: format!("panicked: {message}") })
        }
    }
}

/// The whole pipeline on `graph` with the inputs of `seed`; NVRTC compiles its kernels when
/// `nvrtc` is set.
pub fn run_graph(graph: &Graph, seed: u64, specials: bool, nvrtc: bool) -> Result<Produced, Failure> {
    run_graph_on(graph, &random_inputs(graph, seed, |_| specials), nvrtc)
}

/// [`run_graph`] on given inputs.
pub fn run_graph_on(graph: &Graph, inputs: &[HostTensor], nvrtc: bool) -> Result<Produced, Failure> {
    run_on_cpu(graph, inputs, nvrtc).map(|run| run.produced)
}

/// What the CPU pipeline made of one graph, for the GPU stages to reuse.
pub struct CpuRun {
    pub refs: References,
    pub plan: Plan,
    /// The plan's outputs from `eval_plan`.
    pub actual: Vec<HostTensor>,
    pub produced: Produced,
}

/// The pipeline on the CPU: references, fusion, codegen, NVRTC when `nvrtc` is set, `eval_plan`
/// and the judge.
pub fn run_on_cpu(graph: &Graph, inputs: &[HostTensor], nvrtc: bool) -> Result<CpuRun, Failure> {
    let refs = stage(Stage::Build, || {
        graph.verify().map_err(|e| e.to_string())?;
        References::of(graph, inputs)
    })?;
    let plan = stage(Stage::Fuse, || {
        let plan = compile_to_plan(graph, &FusionOptions::default()).map_err(|e| e.to_string())?;
        plan.validate().map_err(|e| format!("{e}\n{plan}"))?;
        Ok(plan)
    })?;
    let mut produced = Produced::default();
    let code = stage(Stage::Codegen, || {
        (0..plan.kernels.len())
            .map(|i| {
                generate(&plan, i, &default_config(&plan, i, &Target::h200()), &Target::h200())
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<KernelCode>, String>>()
    })?;
    for k in &plan.kernels {
        *produced.kernels.entry(k.kind.family()).or_default() += 1;
    }
    if nvrtc {
        stage(Stage::Compile, || {
            for c in &code {
                if let KernelCode::Cuda(kernel) = c {
                    compile_for_sm90(kernel)?;
                    produced.compiled += 1;
                }
            }
            Ok(())
        })?;
    }
    let actual = stage(Stage::Run, || eval_plan(&plan, inputs).map_err(|e| e.to_string()))?;
    produced.verdict = stage(Stage::Compare, || judge(&actual, &refs).map_err(|e| format!("{e}\nplan:\n{plan}")))?;
    Ok(CpuRun { refs, plan, actual, produced })
}
