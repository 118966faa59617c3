//! The seam between the frontend and whatever executes graphs.
//!
//! Every graph the frontend runs becomes an [`Executable`] for a [`Target`] here. Traced graphs
//! ([`compile_fused`]) are fused into a plan and run by the CPU plan executor or, on a GPU, as
//! NVRTC-compiled kernels (CUDA graphs in reduce-overhead mode, autotuned in max-autotune mode).
//! Eager one-op graphs ([`compile_graph`]) run on the CPU reference, or on a GPU as one cached
//! kernel per op structure.
//!
//! **Invariant:** an `Executable` is pure: the same inputs give the same outputs, and it never
//! keeps a reference to an input after `run` returns.

use crate::cuda::CudaTensor;
use crate::logging;
use crate::timeline::{self, Track};
use crate::{Device, Error, Mode, Result, Tensor};
use braze_codegen::KernelCode;
use braze_cuda::{ExecOptions, PlanExecutable};
use braze_ir::{Graph, HostTensor};
use braze_passes::FusionOptions;
use braze_plan::{BufferRole, Plan};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// A graph made ready to run.
pub trait Executable: Send + Sync {
    /// Runs on `inputs`, one per graph input in order, and returns one tensor per graph output.
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>>;

    /// Kernels generated for the graph and launches per call, for backends that generate
    /// kernels; the CPU reference interprets the graph and has none.
    fn kernel_counts(&self) -> Option<KernelCounts> {
        None
    }

    /// The fused plan, for backends that run one.
    fn plan(&self) -> Option<Arc<Plan>> {
        None
    }

    /// The CUDA C of each generated kernel as `(name, source)`, in plan order.
    fn kernel_sources(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelCounts {
    pub kernels: usize,
    pub launches_per_call: usize,
}

/// What a graph is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub device: Device,
    /// CUDA graphs (reduce-overhead) and autotuning (max-autotune) on the GPU; the CPU ignores it.
    pub mode: Mode,
}

static ALLOW_TF32: AtomicBool = AtomicBool::new(false);

/// Lets f32 matmuls compiled from now on use TF32 tensor cores (about 1e-3 relative error, several
/// times faster). Off by default: f32 matmuls are exact FP32. Like PyTorch's
/// `torch.backends.cuda.matmul.allow_tf32`, it is a process-wide setting.
pub fn set_allow_tf32(allow: bool) {
    ALLOW_TF32.store(allow, Ordering::Relaxed);
}

/// Whether f32 matmuls compiled now may use TF32.
pub fn allow_tf32() -> bool {
    ALLOW_TF32.load(Ordering::Relaxed)
}

/// Makes a one-op eager graph runnable on `target`: the CPU reference on the CPU; on a GPU a
/// fused plan of one kernel, cached by the graph's structure so each op compiles once per process.
pub fn compile_graph(graph: &Graph, target: Target) -> Result<Arc<dyn Executable>> {
    match target.device {
        Device::Cpu => Ok(Arc::new(CpuGraph { graph: graph.clone() })),
        Device::Cuda(_) => {
            static EAGER: OnceLock<GraphCache> = OnceLock::new();
            let cache = EAGER.get_or_init(GraphCache::default);
            let (exe, _) = cache.get_or_compile_with(graph, target, |g, t| {
                Ok(Arc::new(CudaPlan::new(g, t, &[], Extents::AnyWhereLoadsAllow)?) as Arc<dyn Executable>)
            })?;
            Ok(exe)
        }
    }
}

/// Makes a traced graph runnable: fused into a plan, run by the CPU plan executor or on the GPU.
pub fn compile_fused(graph: &Graph, target: Target) -> Result<Arc<dyn Executable>> {
    compile_fused_in_place(graph, target, &[])
}

/// [`compile_fused`] for a graph with write-backs: each `(output, input)` of `in_place` says the
/// caller stores that output into that input's tensor. The plan writes it into the input's
/// memory where that is safe ([`braze_plan::BufferRole::InPlace`]), and a run then updates the
/// input tensor in place; the output it returns for it shares the input's data.
pub fn compile_fused_in_place(
    graph: &Graph,
    target: Target,
    in_place: &[(usize, usize)],
) -> Result<Arc<dyn Executable>> {
    match target.device {
        Device::Cpu => Ok(Arc::new(CpuPlan::new(graph, in_place)?)),
        Device::Cuda(_) => Ok(Arc::new(CudaPlan::new(graph, target, in_place, Extents::Literal)?)),
    }
}

fn fuse(graph: &Graph, in_place: &[(usize, usize)]) -> Result<Plan> {
    fuse_with(graph, &FusionOptions { in_place: in_place.to_vec(), ..FusionOptions::default() })
}

fn fuse_with(graph: &Graph, options: &FusionOptions) -> Result<Plan> {
    braze_passes::compile_to_plan(graph, options)
        .map_err(|e| Error::Compile { context: "fusion".into(), passes: Box::new(e) })
}

/// The GPU that plans run on the CPU backend are generated for (kernel sources for display and
/// dumps, launch counts for `explain`): no GPU is in use, so none can be asked, and the H200 that
/// braze is tuned on is assumed.
pub fn assumed_gpu_target() -> braze_codegen::Target {
    braze_codegen::Target::h200()
}

/// CUDA C of every kernel of `plan` with codegen's default configurations for the
/// [`assumed_gpu_target`], for display and dumps on machines without a GPU.
fn default_sources(plan: &Plan) -> Vec<(String, String)> {
    let target = assumed_gpu_target();
    (0..plan.kernels.len())
        .filter_map(|k| {
            match braze_codegen::generate(plan, k, &braze_codegen::default_config(plan, k, &target), &target) {
                Ok(KernelCode::Cuda(g)) => Some((g.name, g.source)),
                _ => None,
            }
        })
        .collect()
}

/// Launches per call of `plan` on the [`assumed_gpu_target`].
fn launches_per_call(plan: &Plan) -> usize {
    let target = assumed_gpu_target();
    (0..plan.kernels.len())
        .map(|k| match braze_codegen::generate(plan, k, &braze_codegen::default_config(plan, k, &target), &target) {
            Ok(KernelCode::Cuda(g)) => g.launches.len(),
            Ok(KernelCode::CuBlasLt(_)) => 1,
            Err(_) => 0,
        })
        .sum()
}

fn host_inputs(inputs: &[Tensor]) -> Result<Vec<HostTensor>> {
    let mut host: Vec<HostTensor> = Vec::with_capacity(inputs.len());
    for (index, input) in inputs.iter().enumerate() {
        match input.host_data() {
            Some(data) => host.push((*data).clone()),
            None if !input.is_traced() => {
                return Err(Error::DeviceMismatch {
                    op: format!("graph input {index}"),
                    loc: None,
                    expected: Device::Cpu,
                    actual: input.device(),
                })
            }
            None => return Err(Error::StaleTrace { op: format!("graph input {index}"), loc: None }),
        }
    }
    Ok(host)
}

/// The CPU reference: interprets the graph with `braze_cpu::eval_graph`.
struct CpuGraph {
    graph: Graph,
}

impl CpuGraph {
    /// The op of a one-op eager graph (the last op, for a timeline's span name).
    fn op_name(&self) -> String {
        let ops = self.graph.topo_order();
        ops.last().map_or_else(|| "graph".to_string(), |&id| self.graph.node(id).op.name().to_string())
    }
}

impl Executable for CpuGraph {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let host = host_inputs(inputs)?;
        let started = std::time::Instant::now();
        let outputs = braze_cpu::eval_graph(&self.graph, &host)
            .map_err(|cpu| Error::Cpu { context: "CPU reference executor".into(), cpu: Box::new(cpu) })?;
        if timeline::is_recording() {
            timeline::device_span(Track::Compute, "eager", self.op_name(), started, std::time::Instant::now());
        }
        Ok(outputs.into_iter().map(Tensor::from_host).collect())
    }
}

/// A fused plan run on the CPU by `braze_cpu::eval_plan`, kernel by kernel, with the loop
/// structure and f32 arithmetic of the GPU kernels.
struct CpuPlan {
    plan: Arc<Plan>,
    launches: usize,
}

impl CpuPlan {
    fn new(graph: &Graph, in_place: &[(usize, usize)]) -> Result<CpuPlan> {
        let plan = fuse(graph, in_place)?;
        logging::plan_compiled(&plan, &default_sources(&plan));
        let launches = launches_per_call(&plan);
        Ok(CpuPlan { plan: Arc::new(plan), launches })
    }
}

impl Executable for CpuPlan {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let host = host_inputs(inputs)?;
        let outputs = if timeline::is_recording() {
            let plan = &self.plan;
            braze_cpu::eval_plan_observed(plan, &host, &mut |k, start, end| {
                let kernel = &plan.kernels[k];
                timeline::device_span(Track::Compute, kernel.kind.family(), kernel.name.clone(), start, end);
            })
        } else {
            braze_cpu::eval_plan(&self.plan, &host)
        }
        .map_err(|cpu| Error::Cpu { context: "CPU plan executor".into(), cpu: Box::new(cpu) })?;
        Ok(outputs
            .into_iter()
            .zip(&self.plan.outputs)
            .map(|(data, out)| match self.plan.buffer(out.buffer).role {
                // Written into the input's own allocation, as the GPU executor does (unless
                // something else, e.g. data saved for a backward, shares it: then a new tensor).
                BufferRole::InPlace(i) if inputs[i].overwrite_host(&data) => inputs[i].snapshot(),
                _ => Tensor::from_host(data),
            })
            .collect())
    }

    fn kernel_counts(&self) -> Option<KernelCounts> {
        Some(KernelCounts { kernels: self.plan.kernels.len(), launches_per_call: self.launches })
    }

    fn plan(&self) -> Option<Arc<Plan>> {
        Some(self.plan.clone())
    }

    fn kernel_sources(&self) -> Vec<(String, String)> {
        default_sources(&self.plan)
    }
}

/// A fused plan compiled with NVRTC and run on a GPU.
struct CudaPlan {
    plan: Arc<Plan>,
    ordinal: usize,
    mode: Mode,
    exe: Mutex<Bound>,
    tuned: AtomicBool,
}

/// The executable and the inputs it last ran on: the same tensors again reuse the collected
/// buffers instead of locking and cloning each one. (The last call's input buffers stay
/// referenced until the next call or until the compiled function is dropped.)
struct Bound {
    exe: PlanExecutable,
    last_inputs: crate::tensor::SameTensors,
    last_buffers: Vec<braze_cuda::DeviceBuffer>,
}

/// How a GPU plan's pointwise kernels learn their element count.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Extents {
    /// As literals: each shape compiles its own code, specialised to it (a compiled function).
    Literal,
    /// At run time where the kernel's loads allow, and full reductions as multi-reduce items
    /// (whose work list is a table): an eager op's code is then the same at every size, so the
    /// kernel cache compiles it once with NVRTC instead of once per shape.
    AnyWhereLoadsAllow,
}

impl CudaPlan {
    fn new(graph: &Graph, target: Target, in_place: &[(usize, usize)], extents: Extents) -> Result<CudaPlan> {
        let Device::Cuda(ordinal) = target.device else {
            return Err(Error::DeviceMismatch {
                op: "compile".into(),
                loc: None,
                expected: Device::Cuda(0),
                actual: target.device,
            });
        };
        let device = crate::cuda::device(ordinal, "compile")?;
        let size_free = extents == Extents::AnyWhereLoadsAllow;
        let fusion = FusionOptions {
            in_place: in_place.to_vec(),
            full_reductions_in_multi_reduce: size_free,
            ..FusionOptions::default()
        };
        let plan = fuse_with(graph, &fusion)?;
        let mut configs = std::collections::HashMap::new();
        if size_free {
            // Every config given: an eager op is not autotuned, and a plan built for a new size
            // then skips the autotune store's lookup (a codegen and a file read per kernel).
            for k in 0..plan.kernels.len() {
                let config = braze_codegen::any_extent_config(&plan, k, device.target())
                    .unwrap_or_else(|| braze_codegen::default_config(&plan, k, device.target()));
                configs.insert(k, config);
            }
        }
        let options = ExecOptions {
            cuda_graphs: target.mode == Mode::ReduceOverhead,
            allow_tf32: ALLOW_TF32.load(Ordering::Relaxed),
            poison_outputs: std::env::var_os("BRAZE_POISON_OUTPUTS").is_some_and(|v| v == "1"),
            configs,
        };
        let exe = PlanExecutable::new(&device, plan.clone(), crate::cuda::kernel_cache(), options)
            .map_err(|e| Error::cuda("compile", e))?;
        let sources = named_sources(&plan, &exe);
        logging::plan_compiled(&plan, &sources);
        Ok(CudaPlan {
            plan: Arc::new(plan),
            ordinal,
            mode: target.mode,
            exe: Mutex::new(Bound { exe, last_inputs: Default::default(), last_buffers: Vec::new() }),
            tuned: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bound> {
        self.exe.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn named_sources(plan: &Plan, exe: &PlanExecutable) -> Vec<(String, String)> {
    plan.kernels.iter().zip(exe.sources()).filter_map(|(k, s)| s.map(|s| (k.name.clone(), s.to_string()))).collect()
}

impl Executable for CudaPlan {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let mut bound = self.lock();
        let bound = &mut *bound;
        let same_inputs = bound.last_inputs.matches(inputs);
        if !same_inputs {
            bound.last_buffers = self.collect_buffers(inputs)?;
            bound.last_inputs.remember(inputs);
        }
        let buffers = &bound.last_buffers;
        let exe = &mut bound.exe;
        if self.mode == Mode::MaxAutotune && !self.tuned.swap(true, Ordering::Relaxed) {
            let mut bar = crate::tuning_bar::TuningBar::new();
            let records = exe
                .autotune_with_progress(buffers, crate::cuda::kernel_cache(), &mut |p| bar.update(p))
                .map_err(|e| Error::cuda("autotune", e))?;
            drop(bar);
            for r in records {
                tracing::debug!(target: logging::targets::AUTOTUNE, "{}: {} ({:?})", r.kernel, r.winner, r.timings_ms);
            }
        }
        let tracing_timeline = timeline::is_recording();
        if tracing_timeline {
            timeline::prepare_device(self.ordinal, &*crate::cuda::device(self.ordinal, "run")?)?;
        }
        let outputs = if crate::profile::is_collecting() {
            exe.run_profiled(buffers).map(|(outputs, times)| {
                crate::profile::record(times);
                outputs
            })
        } else if tracing_timeline {
            let mut spans = Vec::new();
            let outputs = exe.run_traced(buffers, same_inputs, &mut spans);
            timeline::gpu_spans(self.ordinal, spans)?;
            outputs
        } else if same_inputs {
            exe.run_same_inputs(buffers)
        } else {
            exe.run(buffers)
        }
        .map_err(|e| Error::cuda("run", e))?;
        Ok(outputs
            .into_iter()
            .zip(&self.plan.outputs)
            .map(|(buffer, out)| {
                Tensor::from_cuda(CudaTensor {
                    buffer,
                    dtype: self.plan.buffer(out.buffer).dtype,
                    shape: out.shape.clone(),
                    ordinal: self.ordinal,
                })
            })
            .collect())
    }

    fn kernel_counts(&self) -> Option<KernelCounts> {
        Some(KernelCounts { kernels: self.plan.kernels.len(), launches_per_call: self.lock().exe.report().launches })
    }

    fn plan(&self) -> Option<Arc<Plan>> {
        Some(self.plan.clone())
    }

    fn kernel_sources(&self) -> Vec<(String, String)> {
        named_sources(&self.plan, &self.lock().exe)
    }
}

impl CudaPlan {
    /// The device buffer of every input, checking each is on this plan's GPU.
    fn collect_buffers(&self, inputs: &[Tensor]) -> Result<Vec<braze_cuda::DeviceBuffer>> {
        let mut buffers = Vec::with_capacity(inputs.len());
        for (index, input) in inputs.iter().enumerate() {
            match input.cuda_buffer_on() {
                Some((buffer, ordinal)) if ordinal == self.ordinal => buffers.push(buffer),
                _ => {
                    return Err(Error::DeviceMismatch {
                        op: format!("graph input {index}"),
                        loc: None,
                        expected: Device::Cuda(self.ordinal),
                        actual: input.device(),
                    })
                }
            }
        }
        Ok(buffers)
    }
}

/// Compiled graphs keyed by their target device and structure (the canonical text, which
/// includes every input's dtype and shape), so a graph traced again with the same structure is
/// not compiled again. Holds at most [`GraphCache::CAPACITY`] graphs, evicting the oldest: a
/// function that bakes a changing host value into its graphs would otherwise grow it forever.
#[derive(Default)]
pub(crate) struct GraphCache {
    state: Mutex<GraphCacheState>,
}

#[derive(Default)]
struct GraphCacheState {
    by_key: HashMap<String, Arc<dyn Executable>>,
    oldest_first: VecDeque<String>,
    compiled: usize,
}

impl GraphCache {
    pub(crate) const CAPACITY: usize = 256;

    /// The executable for `graph`, compiled on a miss (`true` in the second field).
    pub(crate) fn get_or_compile(
        &self,
        graph: &Graph,
        target: Target,
        function: &str,
    ) -> Result<(Arc<dyn Executable>, bool)> {
        self.get_or_compile_with(graph, target, |g, t| compile_traced(g, t, function, &[]))
    }

    /// As [`GraphCache::get_or_compile`], compiling a miss with `compile`.
    pub(crate) fn get_or_compile_with(
        &self,
        graph: &Graph,
        target: Target,
        compile: impl FnOnce(&Graph, Target) -> Result<Arc<dyn Executable>>,
    ) -> Result<(Arc<dyn Executable>, bool)> {
        let key = format!("{}\n{}", target.device, graph.to_text());
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(exe) = state.by_key.get(&key) {
            return Ok((exe.clone(), false));
        }
        let exe = compile(graph, target)?;
        if state.oldest_first.len() >= Self::CAPACITY {
            if let Some(oldest) = state.oldest_first.pop_front() {
                state.by_key.remove(&oldest);
            }
        }
        state.oldest_first.push_back(key.clone());
        state.by_key.insert(key, exe.clone());
        state.compiled += 1;
        Ok((exe, true))
    }

    /// Graphs compiled so far (evicted ones included).
    pub(crate) fn compiled(&self) -> usize {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).compiled
    }
}

/// Compiles a graph that came from tracing a user function: logged and dumped, unlike the
/// one-op graphs of eager execution.
pub(crate) fn compile_traced(
    graph: &Graph,
    target: Target,
    function: &str,
    in_place: &[(usize, usize)],
) -> Result<Arc<dyn Executable>> {
    let _span =
        timeline::host_span("compile", || format!("compile {function}"), Some(format!("{} ops", graph.op_count())));
    logging::graph_compiled(graph, function);
    compile_fused_in_place(graph, target, in_place)
}

#[cfg(test)]
mod tests {
    use super::*;
    use braze_ir::{BinaryOp, DType, Op};

    /// `x + value`: one graph structure per value.
    fn add_constant(value: f64) -> Graph {
        let mut graph = Graph::new();
        let x = graph.input(DType::F32, [2]);
        let c = graph.constant(value, DType::F32);
        let y = graph.add(Op::Binary { op: BinaryOp::Add }, &[x, c], None).unwrap();
        graph.set_outputs(vec![y]);
        graph
    }

    #[test]
    fn graph_cache_reuses_by_structure_and_evicts_the_oldest() {
        let cache = GraphCache::default();
        let target = Target { device: Device::Cpu, mode: Mode::Default };
        let compile = |value: f64| cache.get_or_compile(&add_constant(value), target, "f").unwrap().1;
        assert!(compile(0.0));
        assert!(!compile(0.0), "same structure: reused");
        for i in 1..=GraphCache::CAPACITY {
            assert!(compile(i as f64));
        }
        assert!(compile(0.0), "the oldest graph was evicted");
        assert_eq!(cache.compiled(), GraphCache::CAPACITY + 2);
    }
}
