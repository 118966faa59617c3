//! Running a graph's plan on the GPU with braze-cuda: compiled by NVRTC (on any thread), then
//! launched directly and replayed as a CUDA graph on new data (on the thread holding the
//! device), each judged against the references, and the direct launches compared with the CPU
//! plan executor.

use crate::common::{check_module, random_inputs};
use crate::judge::{close, exact_values, judge, References, Verdict};
use crate::run::{run_on_cpu, stage, CpuRun, Failure, Stage};
use braze_codegen::{default_config, plan_sources, KernelCode, KernelConfig, Target};
use braze_cuda::{
    compile_kernels_on, CompileOptions, CudaDevice, DeviceBuffer, ExecOptions, KernelCache, PlanExecutable,
};
use braze_ir::{Graph, HostTensor};
use braze_plan::Plan;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Offset of the seed of the data a CUDA graph is captured with, so that the data it replays on
/// differs from it.
const CAPTURE_DATA_SEED: u64 = 0x5EED_CAFE;

/// The device, opened once. Every use holds its lock, so no two threads of this binary launch
/// on it at once (a launch from another thread while one captures would land in that graph).
static DEVICE: OnceLock<Mutex<Arc<CudaDevice>>> = OnceLock::new();

/// The GPU, or `None` after printing why there is none; with `BRAZE_REQUIRE_CUDA=1` a missing
/// GPU or NVRTC fails instead.
pub fn gpu() -> Option<MutexGuard<'static, Arc<CudaDevice>>> {
    let required = std::env::var("BRAZE_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    if !braze_cuda::cuda_available() {
        assert!(!required, "BRAZE_REQUIRE_CUDA=1 but no CUDA device is usable");
        println!("skipped: no CUDA device");
        return None;
    }
    if !braze_cuda::nvrtc_available() {
        assert!(!required, "BRAZE_REQUIRE_CUDA=1 but NVRTC (libnvrtc) was not found");
        println!("skipped: NVRTC not found (set LD_LIBRARY_PATH to the directory holding libnvrtc)");
        return None;
    }
    let device = DEVICE.get_or_init(|| Mutex::new(CudaDevice::new(0).expect("opening CUDA device 0")));
    Some(device.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
}

/// A plan's kernels compiled for the device, in a cache of their own that
/// `PlanExecutable::new` finds them in, with the configurations they were generated with.
pub struct Compiled {
    cache: KernelCache,
    configs: HashMap<usize, KernelConfig>,
    /// CUDA kernels compiled.
    pub kernels: usize,
}

/// Generates and compiles `plan`'s kernels as `PlanExecutable::new` does (codegen's default
/// configurations for `target`, NVRTC for its architecture), and checks that every launched
/// entry exists and none spills. Touches no device, so any thread may run it.
pub fn compile_plan(plan: &Plan, target: &Target) -> Result<Compiled, Failure> {
    let configs: Vec<KernelConfig> = (0..plan.kernels.len()).map(|k| default_config(plan, k, target)).collect();
    let code = stage(Stage::Codegen, || plan_sources(plan, &configs, target).map_err(|e| e.to_string()))?;
    stage(Stage::Compile, || {
        let cache = KernelCache::in_memory();
        let options = CompileOptions { arch: target.arch(), ..CompileOptions::default() };
        // The executor's own compile path (units keyed as it keys them), one thread: the fuzz
        // already prepares graphs on every core.
        let modules = compile_kernels_on(&code, &cache, &options, 1).map_err(|e| e.to_string())?;
        let mut kernels = 0;
        for (c, module) in code.iter().zip(&modules) {
            if let (KernelCode::Cuda(kernel), Some(module)) = (c, module) {
                check_module(kernel, module)?;
                kernels += 1;
            }
        }
        Ok(Compiled { cache, configs: configs.into_iter().enumerate().collect(), kernels })
    })
}

/// How the GPU's direct launches compare with the CPU plan executor, element by element.
#[derive(Clone, Copy, Debug, Default)]
pub struct Agreement {
    pub identical: usize,
    /// Different, within the output's tolerance of each other.
    pub within_tolerance: usize,
    /// Further apart, both accepted by the judge (the reference is unstable there or needed
    /// the spread).
    pub beyond_tolerance: usize,
}

impl Agreement {
    pub fn add(&mut self, other: Agreement) {
        self.identical += other.identical;
        self.within_tolerance += other.within_tolerance;
        self.beyond_tolerance += other.beyond_tolerance;
    }
}

/// What one graph produced on the GPU.
#[derive(Default)]
pub struct GpuProduced {
    pub direct: Verdict,
    pub replay: Verdict,
    pub agreement: Agreement,
    /// NVRTC compiles `PlanExecutable::new` made itself: 0 unless the kernels compiled by
    /// [`compile_plan`] are not the ones it generates.
    pub compiled_on_device_thread: u64,
}

/// The data a CUDA graph of `graph` is captured with before it replays on other data.
pub fn capture_data(graph: &Graph, seed: u64) -> Vec<HostTensor> {
    random_inputs(graph, seed ^ CAPTURE_DATA_SEED, |_| false)
}

fn upload(device: &CudaDevice, inputs: &[HostTensor]) -> Result<Vec<DeviceBuffer>, String> {
    inputs.iter().map(|t| device.upload(&t.to_bytes()).map_err(|e| format!("upload: {e}"))).collect()
}

fn download(device: &CudaDevice, plan: &Plan, outputs: &[DeviceBuffer]) -> Result<Vec<HostTensor>, String> {
    plan.outputs
        .iter()
        .zip(outputs)
        .map(|(o, buffer)| {
            let bytes = device.download(buffer).map_err(|e| format!("download: {e}"))?;
            HostTensor::from_bytes(plan.buffer(o.buffer).dtype, o.shape.clone(), &bytes).map_err(|e| e.to_string())
        })
        .collect()
}

/// Runs `cpu.plan` (of `graph`) on the device holding `device`, with outputs poisoned before
/// every run: launched directly on `inputs`, and as a CUDA graph captured on `capture` and
/// replayed after `inputs` were written into the same buffers (so a stale replay gives
/// `capture`'s results). Both are judged against `cpu.refs`, and the direct launches compared
/// with `cpu.actual`: outputs the exactness tables call exact must agree exactly.
pub fn run_on_gpu(
    device: &Arc<CudaDevice>,
    graph: &Graph,
    cpu: &CpuRun,
    compiled: &Compiled,
    inputs: &[HostTensor],
    capture: &[HostTensor],
) -> Result<GpuProduced, Failure> {
    let mut produced = GpuProduced::default();
    let plan = &cpu.plan;
    let build = |cuda_graphs: bool| {
        let options = ExecOptions {
            cuda_graphs,
            poison_outputs: true,
            configs: compiled.configs.clone(),
            ..ExecOptions::default()
        };
        PlanExecutable::new(device, plan.clone(), &compiled.cache, options).map_err(|e| e.to_string())
    };
    let with_plan = |e: String| format!("{e}\nplan:\n{plan}");

    let mut direct = stage(Stage::GpuBuild, || build(false))?;
    produced.compiled_on_device_thread += direct.report().nvrtc_compiles;
    let actual = stage(Stage::GpuRun, || {
        let buffers = upload(device, inputs)?;
        let outputs = direct.run(&buffers).map_err(|e| e.to_string())?;
        download(device, plan, &outputs)
    })?;
    produced.direct = stage(Stage::GpuCompare, || judge(&actual, &cpu.refs).map_err(with_plan))?;
    produced.agreement =
        stage(Stage::Agreement, || agreement(graph, &actual, &cpu.actual, &cpu.refs).map_err(with_plan))?;
    drop(direct);

    let mut replayed = stage(Stage::GpuBuild, || build(true))?;
    produced.compiled_on_device_thread += replayed.report().nvrtc_compiles;
    let actual = stage(Stage::GraphRun, || {
        let buffers = upload(device, capture)?;
        // The first call launches directly, the second (same buffers, its output set free
        // again) captures and replays; the third, on new data in the same buffers, replays.
        for _ in 0..2 {
            drop(replayed.run(&buffers).map_err(|e| e.to_string())?);
        }
        for (buffer, values) in buffers.iter().zip(inputs) {
            device.upload_into(buffer, 0, &values.to_bytes()).map_err(|e| format!("upload: {e}"))?;
        }
        let outputs = replayed.run(&buffers).map_err(|e| e.to_string())?;
        download(device, plan, &outputs)
    })?;
    produced.replay = stage(Stage::GraphCompare, || judge(&actual, &cpu.refs).map_err(with_plan))?;
    Ok(produced)
}

/// The whole pipeline on `graph`, GPU included, as the fuzz runs each graph; the CUDA graph is
/// captured on [`capture_data`] of `seed`. Call without holding the device.
pub fn run_everywhere(
    graph: &Graph,
    inputs: &[HostTensor],
    seed: u64,
    target: &Target,
) -> Result<GpuProduced, Failure> {
    let cpu = run_on_cpu(graph, inputs, false)?;
    let compiled = compile_plan(&cpu.plan, target)?;
    let device = gpu().expect("a GPU was found before");
    run_on_gpu(&device, graph, &cpu, &compiled, inputs, &capture_data(graph, seed))
}

/// Compares the GPU's outputs with the CPU plan executor's, both already accepted by the judge:
/// counts the elements that differ; `Err` where an output whose value the exactness tables call
/// exact (same bits in fused kernels as in the reference) differs.
pub fn agreement(
    graph: &Graph,
    gpu: &[HostTensor],
    cpu: &[HostTensor],
    refs: &References,
) -> Result<Agreement, String> {
    let exact = exact_values(graph);
    let mut counts = Agreement::default();
    for (j, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        let is_exact = exact.contains(&graph.outputs()[j]);
        for i in 0..g.numel() {
            let (x, y) = (g.get_f64(i), c.get_f64(i));
            if x == y || (x.is_nan() && y.is_nan()) {
                counts.identical += 1;
            } else if is_exact {
                return Err(format!(
                    "output {j} ({}{}) is exact, but element {i} is {x} on the GPU and {y} in the CPU plan executor",
                    g.dtype(),
                    g.shape()
                ));
            } else if close(x, y, refs.tolerances[j], 0.0) {
                counts.within_tolerance += 1;
            } else {
                counts.beyond_tolerance += 1;
            }
        }
    }
    Ok(counts)
}
