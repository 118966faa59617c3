//! Runs a fused [`Plan`] on one device: compiles its kernels (in parallel, through the kernel
//! cache), places intermediates in one arena by liveness, prepares workspaces and tables once,
//! then per call binds the caller's buffers, launches (or replays a CUDA graph of) every kernel
//! and hands back the outputs.
//!
//! A plan with index checks (gathers) reports an index out of range at a later call, not at the
//! call whose run met it: the check words are copied to pinned host memory after the run without
//! waiting, and read at the next run or host synchronization (see `checks`). No call waits for
//! the device because of checks.
//!
//! Outputs come from a small ring of output sets owned by the executable: a set is reused only
//! when the caller has dropped every tensor it handed out, so a result is never overwritten
//! behind the caller's back, and a steady loop that drops last step's results allocates nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use braze_codegen::{GeneratedKernel, KernelCode, KernelConfig, Param, TableSpec};
use braze_ir::DType;
use braze_plan::MemoryPlan;
use braze_plan::{BufferId, BufferRole, MatMul, Plan};

use crate::autotune::AutotuneStore;
use crate::blas::{BlasLt, MatmulDtype, MatmulSpec, MatrixRef};
use crate::buffer::DeviceBuffer;
use crate::cache::KernelCache;
use crate::checks::CheckRing;
use crate::device::CudaDevice;
use crate::error::{CudaError, Result};
use crate::graph::CapturedGraph;
use crate::kernel::Kernel;
use crate::launch::KernelArg;
use crate::nvrtc::{CompileOptions, CompiledModule, KernelResources};
use crate::spans::{PendingSpan, SpanStream};

mod tuning;

pub use tuning::TuningProgress;

/// Output sets kept for reuse; beyond this a call gets fresh buffers that are not retained.
const RETAINED_OUTPUT_SETS: usize = 4;
/// CUDA graphs kept per output set (one per distinct set of input addresses).
const GRAPHS_PER_OUTPUT_SET: usize = 4;

/// The GPU time of one kernel of a profiled run ([`PlanExecutable::run_profiled`]).
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    pub kernel: String,
    /// The plan kernel's family (`pointwise`, `row`, `matmul`, ...).
    pub family: &'static str,
    pub ms: f32,
}

/// What a run records besides its outputs.
enum Observe<'a> {
    Nothing,
    /// Each kernel's GPU time, waited for.
    Profile(&'a mut Vec<KernelTime>),
    /// Timeline spans, not waited for.
    Trace(&'a mut Vec<PendingSpan>),
}

/// How an executable runs.
#[derive(Clone, Debug, Default)]
pub struct ExecOptions {
    /// Replay the plan as a CUDA graph (captured when input buffers seen in a recent call come
    /// again).
    pub cuda_graphs: bool,
    /// Fill outputs with 0xFF (NaN for floats) before each run, so an element no kernel wrote
    /// cannot pass a comparison. For tests; costs a memset per output.
    pub poison_outputs: bool,
    /// Let f32 matmuls use TF32 tensor cores (about 1e-3 relative error).
    pub allow_tf32: bool,
    /// Launch configurations chosen per kernel index, overriding the remembered or default one.
    pub configs: HashMap<usize, KernelConfig>,
}

/// What building an executable cost and produced, for `explain` and benchmarks.
#[derive(Clone, Debug, Default)]
pub struct BuildReport {
    pub kernels: usize,
    /// Device launches per call (kernel launches plus library calls).
    pub launches: usize,
    pub compile_ms: f64,
    pub nvrtc_compiles: u64,
    pub cache_hits: u64,
    pub arena_bytes: usize,
    pub arena_unshared_bytes: usize,
    pub resources: Vec<KernelResources>,
}

enum ReadyKernel {
    Cuda(CudaKernel),
    /// A cuBLASLt call, with the rank of its algorithm among the heuristic's candidates.
    Blas {
        matmul: MatMul,
        algorithm: usize,
    },
    /// A kernel over zero elements: nothing to launch.
    Empty,
}

struct CudaKernel {
    code: GeneratedKernel,
    config: KernelConfig,
    /// One function per launch, in launch order.
    functions: Vec<Kernel>,
    scratch: Vec<DeviceBuffer>,
    tables: Vec<ReadyTable>,
}

struct ReadyTable {
    buffer: DeviceBuffer,
    /// For input-pointer tables: the pointers last uploaded.
    uploaded: Option<Vec<u64>>,
    pointers: bool,
}

struct OutputSet {
    /// Indexed by plan buffer id; `Some` for buffers with the `Output` role.
    buffers: Vec<Option<DeviceBuffer>>,
    graphs: Vec<(Vec<u64>, CapturedGraph)>,
    /// Input addresses of the last few direct runs with this set, the latest last: a graph is
    /// captured for addresses seen again, so inputs alternating between a few buffers (a
    /// double-buffered prefetcher's batches) replay too, not only the same buffers call after call.
    recent_direct: Vec<Vec<u64>>,
}

impl OutputSet {
    /// Free when nobody but this set (and its graphs) holds its buffers.
    fn is_free(&self) -> bool {
        self.buffers.iter().flatten().all(|b| !self.is_held(b))
    }

    /// Whether someone besides this set and its graphs holds `buffer`.
    fn is_held(&self, buffer: &DeviceBuffer) -> bool {
        Arc::strong_count(&buffer.slice) > 1 + self.graphs.len()
    }

    /// Bytes of the buffers someone else holds, and of all the set's buffers.
    fn held_bytes(&self) -> (usize, usize) {
        self.buffers.iter().flatten().fold((0, 0), |(held, all), b| {
            (held + if self.is_held(b) { b.len_bytes() } else { 0 }, all + b.len_bytes())
        })
    }
}

/// A plan ready to run on one device for one input signature.
pub struct PlanExecutable {
    device: Arc<CudaDevice>,
    plan: Plan,
    kernels: Vec<ReadyKernel>,
    memory: MemoryPlan,
    arena: Option<DeviceBuffer>,
    output_sets: Vec<OutputSet>,
    blas: Option<BlasLt>,
    options: ExecOptions,
    report: BuildReport,
    /// Set after a run whose inputs were checked: the output set the tables were last filled
    /// for, and the input addresses of that run, so a caller passing the very same buffers again
    /// skips the per-input work (thousands of inputs cost no per-input checks per call).
    tables_for_set: Option<usize>,
    last_addresses: Vec<u64>,
    /// The plan's check words (two `u64` per check, zero between runs), when it has checks,
    /// and the pinned slots they are copied into after each run.
    checks: Option<(DeviceBuffer, Arc<CheckRing>)>,
}

fn device_dtype(dtype: DType) -> Result<MatmulDtype> {
    match dtype {
        DType::F32 => Ok(MatmulDtype::F32),
        DType::F16 => Ok(MatmulDtype::F16),
        DType::BF16 => Ok(MatmulDtype::BF16),
        other => Err(CudaError::InvalidArgument(format!("matmul is not defined for {other}"))),
    }
}

/// Compiles the CUDA C of every kernel of `codes` through `cache`, in order: `None` for a
/// library call or a kernel with nothing to launch. Kernels are compiled as their units
/// ([`crate::unit`]): those that differ only in name and comments (one per layer of a model)
/// share one compile and one module. The distinct units compile in parallel on
/// [`compile_threads`] threads, the longest sources first so that no long compile starts last.
/// The first error in kernel order is returned.
pub fn compile_kernels(
    codes: &[KernelCode],
    cache: &KernelCache,
    options: &CompileOptions,
) -> Result<Vec<Option<Arc<CompiledModule>>>> {
    compile_kernels_on(codes, cache, options, compile_threads())
}

/// Threads [`compile_kernels`] uses: `BRAZE_COMPILE_THREADS`, else one per available core.
pub fn compile_threads() -> usize {
    std::env::var("BRAZE_COMPILE_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// [`compile_kernels`] on at most `threads` threads.
pub fn compile_kernels_on(
    codes: &[KernelCode],
    cache: &KernelCache,
    options: &CompileOptions,
    threads: usize,
) -> Result<Vec<Option<Arc<CompiledModule>>>> {
    // The unit of each kernel that launches anything, as an index into `units`.
    let mut units: Vec<String> = Vec::new();
    let mut index_of: HashMap<String, usize> = HashMap::new();
    let unit_of: Vec<Option<usize>> = codes
        .iter()
        .map(|code| match code {
            KernelCode::Cuda(g) if !g.launches.is_empty() => {
                let unit = crate::unit::unit_source(&g.name, &g.source);
                Some(*index_of.entry(unit).or_insert_with_key(|unit| {
                    units.push(unit.clone());
                    units.len() - 1
                }))
            }
            _ => None,
        })
        .collect();
    drop(index_of);
    let mut order: Vec<usize> = (0..units.len()).collect();
    order.sort_by_key(|&u| std::cmp::Reverse(units[u].len()));
    let results: Vec<std::sync::OnceLock<Result<Arc<CompiledModule>>>> =
        (0..units.len()).map(|_| std::sync::OnceLock::new()).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || loop {
        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(&u) = order.get(i) else { break };
        let _ = results[u].set(cache.get_or_compile(&units[u], crate::unit::UNIT_NAME, options));
    };
    let workers = threads.clamp(1, units.len().max(1));
    if workers == 1 {
        work();
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers).map(|_| scope.spawn(work)).collect();
            for handle in handles {
                // A panicking worker leaves its unit without a result, reported below.
                let _ = handle.join();
            }
        });
    }
    let mut results: Vec<Option<Result<Arc<CompiledModule>>>> = results.into_iter().map(|r| r.into_inner()).collect();
    let mut modules = Vec::with_capacity(codes.len());
    for (code, unit) in codes.iter().zip(unit_of) {
        let (Some(u), KernelCode::Cuda(g)) = (unit, code) else {
            modules.push(None);
            continue;
        };
        match results[u].take() {
            Some(Ok(module)) => {
                results[u] = Some(Ok(module.clone()));
                modules.push(Some(module));
            }
            // The unit was compiled as `UNIT_NAME`: name the first kernel that has it.
            Some(Err(CudaError::Compile { log, source_code, .. })) => {
                return Err(CudaError::Compile { name: g.name.clone(), log, source_code })
            }
            Some(Err(other)) => return Err(other),
            None => {
                return Err(CudaError::InvalidArgument(format!("compiling `{}`: the compile thread panicked", g.name)))
            }
        }
    }
    Ok(modules)
}

impl PlanExecutable {
    /// Generates, compiles and loads every kernel of `plan` and allocates its arena, workspaces
    /// and tables. Configurations come from `options.configs`, else from what the autotuner
    /// remembered for this device, else from codegen's defaults.
    pub fn new(device: &Arc<CudaDevice>, plan: Plan, cache: &KernelCache, options: ExecOptions) -> Result<Self> {
        let started = Instant::now();
        let stats_before = cache.stats();
        let store = AutotuneStore::open_default();
        let target = device.target();
        let mut configs = Vec::with_capacity(plan.kernels.len());
        for k in 0..plan.kernels.len() {
            let config = match options.configs.get(&k) {
                Some(c) => *c,
                None => store
                    .as_ref()
                    .and_then(|s| s.lookup(target, &plan, k))
                    .unwrap_or_else(|| braze_codegen::default_config(&plan, k, target)),
            };
            configs.push(config);
        }
        let codes = braze_codegen::plan_sources(&plan, &configs, target)?;
        let compile_options = CompileOptions { arch: target.arch(), ..CompileOptions::default() };
        let compiled = compile_kernels(&codes, cache, &compile_options)?;
        let mut report = BuildReport { kernels: plan.kernels.len(), ..BuildReport::default() };
        let mut kernels = Vec::with_capacity(codes.len());
        for (k, ((code, module), config)) in codes.into_iter().zip(compiled).zip(configs).enumerate() {
            let ready = match (code, module) {
                (KernelCode::CuBlasLt(m), _) => {
                    if m.m * m.n * m.batch.iter().product::<usize>() == 0 {
                        ReadyKernel::Empty
                    } else {
                        report.launches += 1;
                        let algorithm = match config {
                            KernelConfig::Library { algorithm } => algorithm as usize,
                            _ => 0,
                        };
                        ReadyKernel::Blas { matmul: m, algorithm }
                    }
                }
                (KernelCode::Cuda(_), None) => ReadyKernel::Empty,
                (KernelCode::Cuda(code), Some(module)) => {
                    report.resources.extend(crate::unit::resources_as(&code.name, &module.resources));
                    report.launches += code.launches.len();
                    let slots = plan.kernels[k].inputs.len();
                    ReadyKernel::Cuda(Self::load_kernel(device, code, config, &module, slots)?)
                }
            };
            kernels.push(ready);
        }
        let memory = MemoryPlan::for_plan(&plan);
        // Zero-size intermediates still get an (empty) arena so every one has a valid address.
        let has_intermediates = memory.offsets.iter().any(Option::is_some);
        let arena = if has_intermediates { Some(device.alloc(memory.arena_bytes)?) } else { None };
        let stats_after = cache.stats();
        report.compile_ms = started.elapsed().as_secs_f64() * 1e3;
        report.nvrtc_compiles = stats_after.compiles - stats_before.compiles;
        report.cache_hits =
            (stats_after.memory_hits + stats_after.disk_hits) - (stats_before.memory_hits + stats_before.disk_hits);
        report.arena_bytes = memory.arena_bytes;
        report.arena_unshared_bytes = memory.unshared_bytes;
        tracing::debug!(target: "braze::kernels", kernels = report.kernels, launches = report.launches,
            compile_ms = report.compile_ms, nvrtc = report.nvrtc_compiles, "plan built");
        let checks = match CheckRing::for_plan(device, &plan)? {
            Some(ring) => Some((device.alloc_zeroed(16 * plan.checks.len())?, ring)),
            None => None,
        };
        Ok(PlanExecutable {
            checks,
            device: device.clone(),
            plan,
            kernels,
            memory,
            arena,
            output_sets: Vec::new(),
            tables_for_set: None,
            last_addresses: Vec::new(),
            blas: None,
            options,
            report,
        })
    }

    fn load_kernel(
        device: &Arc<CudaDevice>,
        code: GeneratedKernel,
        config: KernelConfig,
        module: &Arc<CompiledModule>,
        input_slots: usize,
    ) -> Result<CudaKernel> {
        let functions = code
            .launches
            .iter()
            .map(|l| device.shared_function(module, &crate::unit::unit_entry(&code.name, &l.entry)))
            .collect::<Result<Vec<_>>>()?;
        let scratch = code
            .scratch
            .iter()
            .map(|s| if s.zero_init { device.alloc_zeroed(s.bytes) } else { device.alloc(s.bytes) })
            .collect::<Result<Vec<_>>>()?;
        let mut tables = Vec::with_capacity(code.tables.len());
        for spec in &code.tables {
            tables.push(match spec {
                TableSpec::Static(bytes) => {
                    ReadyTable { buffer: device.upload(bytes)?, uploaded: None, pointers: false }
                }
                // Filled before each run whose input addresses differ from the last upload.
                TableSpec::InputPointers => {
                    ReadyTable { buffer: device.alloc(8 * input_slots)?, uploaded: None, pointers: true }
                }
            });
        }
        Ok(CudaKernel { code, config, functions, scratch, tables })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn report(&self) -> &BuildReport {
        &self.report
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The configuration each kernel runs with (`None` for library calls and empty kernels).
    pub fn configs(&self) -> Vec<Option<KernelConfig>> {
        self.kernels.iter().map(|k| if let ReadyKernel::Cuda(c) = k { Some(c.config) } else { None }).collect()
    }

    /// The generated source of each CUDA kernel (`None` for library calls and empty kernels).
    pub fn sources(&self) -> Vec<Option<&str>> {
        self.kernels
            .iter()
            .map(|k| if let ReadyKernel::Cuda(c) = k { Some(c.code.source.as_str()) } else { None })
            .collect()
    }

    /// Checks the caller's buffers against the plan's inputs.
    fn check_inputs(&self, inputs: &[DeviceBuffer]) -> Result<()> {
        if inputs.len() != self.plan.inputs.len() {
            return Err(CudaError::InvalidArgument(format!(
                "the plan takes {} inputs, got {}",
                self.plan.inputs.len(),
                inputs.len()
            )));
        }
        for (i, (&id, buffer)) in self.plan.inputs.iter().zip(inputs).enumerate() {
            let want = self.plan.buffer(id).bytes();
            if buffer.len_bytes() != want {
                return Err(CudaError::InvalidArgument(format!(
                    "input {i}: expected {want} bytes ({} x {}), got {}",
                    self.plan.buffer(id).numel,
                    self.plan.buffer(id).dtype,
                    buffer.len_bytes()
                )));
            }
            if buffer.cu_context() != self.device.context().cu_ctx() {
                return Err(CudaError::InvalidArgument(format!("input {i} lives on another device")));
            }
        }
        // The plan overwrites these inputs; another input in the same memory would see it.
        for b in &self.plan.buffers {
            let BufferRole::InPlace(n) = b.role else { continue };
            let address = inputs[n].device_address();
            if let Some(j) = (0..inputs.len()).find(|&j| j != n && inputs[j].device_address() == address) {
                return Err(CudaError::InvalidArgument(format!(
                    "inputs {n} and {j} share memory, and the plan writes input {n} in place"
                )));
            }
        }
        Ok(())
    }

    /// Picks a free retained output set, or makes one; `None` means "fresh, not retained".
    fn acquire_output_set(&mut self) -> Result<usize> {
        if let Some(i) = self.output_sets.iter().position(OutputSet::is_free) {
            return Ok(i);
        }
        if let Some(i) = self.mostly_free_set() {
            // The caller holds a few small results of an earlier call (a loss kept for later)
            // while the large ones (gradients) were dropped: only the held buffers are replaced,
            // rather than a whole new set allocated beside the free memory. Without CUDA graphs
            // nothing has these addresses baked in.
            let set = &mut self.output_sets[i];
            for slot in 0..set.buffers.len() {
                let Some(buffer) = &set.buffers[slot] else { continue };
                if set.is_held(buffer) {
                    let bytes = buffer.len_bytes();
                    set.buffers[slot] = Some(self.device.alloc(bytes)?);
                }
            }
            set.recent_direct.clear();
            self.tables_for_set = None;
            return Ok(i);
        }
        let mut buffers = vec![None; self.plan.buffers.len()];
        for (i, b) in self.plan.buffers.iter().enumerate() {
            if b.role == BufferRole::Output {
                buffers[i] = Some(self.device.alloc(b.bytes())?);
            }
        }
        let set = OutputSet { buffers, graphs: Vec::new(), recent_direct: Vec::new() };
        // Set indices may shift below: the tables are refilled for whichever set runs next.
        self.tables_for_set = None;
        if self.output_sets.len() < RETAINED_OUTPUT_SETS {
            self.output_sets.push(set);
        } else {
            // Every retained set is still held by the caller: replace the oldest set's slot with
            // fresh buffers (the caller keeps the old ones alive through its own handles).
            self.output_sets.remove(0);
            self.output_sets.push(set);
        }
        Ok(self.output_sets.len() - 1)
    }

    /// Without CUDA graphs, the retained set whose held buffers are the fewest bytes, when they
    /// are at most half of its bytes.
    fn mostly_free_set(&self) -> Option<usize> {
        if self.options.cuda_graphs {
            return None;
        }
        let (i, (held, all)) =
            self.output_sets.iter().map(OutputSet::held_bytes).enumerate().min_by_key(|&(i, (held, _))| (held, i))?;
        (2 * held <= all).then_some(i)
    }

    /// Where plan buffer `id` lives for this call: a buffer and a byte offset.
    fn locate<'a>(&'a self, id: BufferId, inputs: &'a [DeviceBuffer], set: &'a OutputSet) -> (&'a DeviceBuffer, usize) {
        match self.plan.buffer(id).role {
            // An in-place output is bound to its input's own buffer: no copy, no new buffer, and a
            // captured CUDA graph replays into the same memory.
            BufferRole::Input(i) | BufferRole::InPlace(i) => (&inputs[i], 0),
            BufferRole::Output => (set.buffers[id.0].as_ref().expect("output sets hold every output buffer"), 0),
            BufferRole::Intermediate => (
                self.arena.as_ref().expect("a plan with intermediates has an arena"),
                self.memory.offsets[id.0].expect("every intermediate has an arena offset"),
            ),
        }
    }

    /// Runs the plan on `inputs` (one buffer per plan input, in order) and returns one buffer per
    /// plan output. Enqueues work on the device's stream and does not wait for it.
    ///
    /// An index out of range that this run meets is reported at a later call: by a later run
    /// (which then does not run), [`PlanExecutable::poll_checks`], or at the latest by the next
    /// host read or synchronization of the device on this thread, as
    /// [`CudaError::IndexOutOfRange`]. A run first returns such an error of an earlier run.
    pub fn run(&mut self, inputs: &[DeviceBuffer]) -> Result<Vec<DeviceBuffer>> {
        self.run_with(inputs, false)
    }

    /// As [`PlanExecutable::run`], for a caller that passes the very same buffers (same
    /// allocations, in order) as in its previous call: the per-input checks, pointer-table
    /// comparisons and address collection are skipped after the first call.
    pub fn run_same_inputs(&mut self, inputs: &[DeviceBuffer]) -> Result<Vec<DeviceBuffer>> {
        self.run_with(inputs, true)
    }

    /// As [`PlanExecutable::run`], launching every kernel directly (no CUDA graph replay) between
    /// timing events, and waiting for them: the GPU time of each kernel, in plan order.
    pub fn run_profiled(&mut self, inputs: &[DeviceBuffer]) -> Result<(Vec<DeviceBuffer>, Vec<KernelTime>)> {
        let mut times = Vec::with_capacity(self.kernels.len());
        let outputs = self.run_inner(inputs, false, Observe::Profile(&mut times))?;
        Ok((outputs, times))
    }

    /// As [`PlanExecutable::run`] (or `run_same_inputs`), with a span of GPU work for a timeline
    /// recorded around each kernel, or around the graph replay in CUDA graph mode, appended to
    /// `spans`; nothing waits for them.
    pub fn run_traced(
        &mut self,
        inputs: &[DeviceBuffer],
        same_inputs: bool,
        spans: &mut Vec<PendingSpan>,
    ) -> Result<Vec<DeviceBuffer>> {
        self.run_inner(inputs, same_inputs, Observe::Trace(spans))
    }

    fn run_with(&mut self, inputs: &[DeviceBuffer], same_inputs: bool) -> Result<Vec<DeviceBuffer>> {
        self.run_inner(inputs, same_inputs, Observe::Nothing)
    }

    /// Runs the plan, with the copy of its check words (if it has checks) enqueued after it,
    /// into a slot taken before: an earlier run's raised check, found then, is this call's error.
    fn run_inner(
        &mut self,
        inputs: &[DeviceBuffer],
        same_inputs: bool,
        mut observe: Observe<'_>,
    ) -> Result<Vec<DeviceBuffer>> {
        let Some((_, ring)) = &self.checks else { return self.enqueue_run(inputs, same_inputs, &mut observe) };
        let ring = ring.clone();
        let mut slot = ring.begin_run()?;
        let ran = self.enqueue_run(inputs, same_inputs, &mut observe);
        // Also after a failed run: kernels enqueued before the failure may have raised a check,
        // and the words must be zero for the next run.
        let spans = match &mut observe {
            Observe::Trace(spans) => Some(&mut **spans),
            _ => None,
        };
        let read = self.enqueue_check_read(&mut slot, spans);
        ring.end_run(slot, read.is_ok());
        let outputs = ran?;
        read?;
        Ok(outputs)
    }

    /// Copies the check words into `slot` and zeroes them (enqueued, with a timeline span on
    /// the compute stream when `spans` is given).
    fn enqueue_check_read(
        &self,
        slot: &mut crate::pinned::PinnedBuffer,
        spans: Option<&mut Vec<PendingSpan>>,
    ) -> Result<()> {
        let (words, _) = self.checks.as_ref().expect("called for a plan with checks");
        let Some(spans) = spans else { return self.device.enqueue_check_read(words, slot) };
        let name = format!("check words to host ({} B)", words.len_bytes());
        let span = self.device.begin_span(name, "copy", SpanStream::Compute)?;
        self.device.enqueue_check_read(words, slot)?;
        span.end()?;
        spans.push(span);
        Ok(())
    }

    /// Enqueues one run of the plan and returns its outputs.
    fn enqueue_run(
        &mut self,
        inputs: &[DeviceBuffer],
        same_inputs: bool,
        observe: &mut Observe<'_>,
    ) -> Result<Vec<DeviceBuffer>> {
        let known = same_inputs && self.tables_for_set.is_some();
        if !known {
            self.tables_for_set = None;
            self.check_inputs(inputs)?;
        }
        self.prepare()?;
        let set_index = self.acquire_output_set()?;
        if !(known && self.tables_for_set == Some(set_index)) {
            self.refresh_tables(inputs, set_index)?;
            self.tables_for_set = Some(set_index);
        }
        if !known {
            self.last_addresses = inputs.iter().map(DeviceBuffer::device_address).collect();
        }
        if self.options.poison_outputs {
            for b in self.output_sets[set_index].buffers.iter().flatten() {
                self.device.memset_d8(b, 0xFF)?;
            }
        }
        let graphs = self.options.cuda_graphs && self.report.launches > 0;
        let (profile, mut spans) = match observe {
            Observe::Nothing => (None, None),
            Observe::Profile(times) => (Some(&mut **times), None),
            Observe::Trace(spans) => (None, Some(&mut **spans)),
        };
        if let (Some(spans), false) = (spans.as_deref_mut(), graphs) {
            self.enqueue_all_traced(inputs, &self.output_sets[set_index], spans)?;
        } else if let Some(times) = profile {
            let set = &self.output_sets[set_index];
            let mut timers = Vec::with_capacity(self.kernels.len());
            for k in 0..self.kernels.len() {
                let timer = self.device.event_timer()?;
                timer.start()?;
                self.enqueue_kernel(k, inputs, set)?;
                timer.stop()?;
                timers.push(timer);
            }
            for (kernel, timer) in self.plan.kernels.iter().zip(&timers) {
                times.push(KernelTime {
                    kernel: kernel.name.clone(),
                    family: kernel.kind.family(),
                    ms: timer.elapsed_ms()?,
                });
            }
        } else if graphs {
            let addresses = &self.last_addresses;
            let set = &self.output_sets[set_index];
            let replay = set.graphs.iter().position(|(a, _)| a == addresses);
            let capture =
                replay.is_none() && set.recent_direct.contains(addresses) && set.graphs.len() < GRAPHS_PER_OUTPUT_SET;
            if replay.is_some() || capture {
                let replay_span = match spans.is_some() {
                    true => {
                        let what = if capture { "graph capture and replay" } else { "graph replay" };
                        let name = format!("{what} ({} kernels)", self.kernels.len());
                        Some(self.device.begin_span(name, "graph", SpanStream::Compute)?)
                    }
                    false => None,
                };
                if let Some(g) = replay {
                    self.output_sets[set_index].graphs[g].1.replay_reading(inputs)?;
                } else {
                    let graph = {
                        let this = &*self;
                        let set = &this.output_sets[set_index];
                        this.device.capture_graph_reading(inputs, || this.enqueue_all(inputs, set))?
                    };
                    graph.prepare()?;
                    graph.replay_reading(inputs)?;
                    let addresses = self.last_addresses.clone();
                    self.output_sets[set_index].graphs.push((addresses, graph));
                }
                if let (Some(span), Some(spans)) = (replay_span, spans) {
                    span.end()?;
                    spans.push(span);
                }
            } else {
                match spans {
                    Some(spans) => self.enqueue_all_traced(inputs, &self.output_sets[set_index], spans)?,
                    None => self.enqueue_all(inputs, &self.output_sets[set_index])?,
                }
                let recent = &mut self.output_sets[set_index].recent_direct;
                recent.retain(|a| *a != self.last_addresses);
                if recent.len() == GRAPHS_PER_OUTPUT_SET {
                    recent.remove(0);
                }
                recent.push(self.last_addresses.clone());
            }
        } else {
            self.enqueue_all(inputs, &self.output_sets[set_index])?;
        }
        let set = &self.output_sets[set_index];
        Ok(self.plan.outputs.iter().map(|o| self.locate(o.buffer, inputs, set).0.clone()).collect())
    }

    /// Reads the check words of this executable's earlier runs whose copies have completed (no
    /// waiting): the first raised check is the error, naming its op, index and bound. Runs do
    /// this themselves before they start, and the device at host synchronizations.
    pub fn poll_checks(&self) -> Result<()> {
        match &self.checks {
            Some((_, ring)) => ring.poll(false, None),
            None => Ok(()),
        }
    }

    /// As [`PlanExecutable::poll_checks`], first waiting for the check copies of every run
    /// enqueued so far (their events only, not the whole device).
    pub fn wait_checks(&self) -> Result<()> {
        match &self.checks {
            Some((_, ring)) => ring.poll(true, None),
            None => Ok(()),
        }
    }

    /// How many runs waited for the oldest run's check copy because all
    /// [`crate::CHECK_SLOTS`] slots were pending (the host that many runs ahead of the GPU).
    pub fn check_slot_waits(&self) -> u64 {
        self.checks.as_ref().map_or(0, |(_, ring)| ring.waits())
    }

    /// Uploads input-pointer tables whose pointers changed since the last call.
    fn refresh_tables(&mut self, inputs: &[DeviceBuffer], set_index: usize) -> Result<()> {
        let mut pending: Vec<(usize, usize, Vec<u64>)> = Vec::new();
        for (k, ready) in self.kernels.iter().enumerate() {
            let ReadyKernel::Cuda(cuda) = ready else { continue };
            for (t, table) in cuda.tables.iter().enumerate() {
                if !table.pointers {
                    continue;
                }
                let kernel = &self.plan.kernels[k];
                let set = &self.output_sets[set_index];
                let address = |id: BufferId| {
                    let (buffer, offset) = self.locate(id, inputs, set);
                    buffer.device_address() + offset as u64
                };
                // Compared in place first: a steady loop passes the same buffers every call.
                let unchanged = table.uploaded.as_ref().is_some_and(|up| {
                    up.len() == kernel.inputs.len() && kernel.inputs.iter().zip(up).all(|(&id, &p)| address(id) == p)
                });
                if unchanged {
                    continue;
                }
                pending.push((k, t, kernel.inputs.iter().map(|&id| address(id)).collect()));
            }
        }
        for (k, t, pointers) in pending {
            let ReadyKernel::Cuda(cuda) = &mut self.kernels[k] else { unreachable!("collected from a CUDA kernel") };
            let table = &mut cuda.tables[t];
            let bytes: Vec<u8> = pointers.iter().flat_map(|p| p.to_le_bytes()).collect();
            self.device.upload_into(&table.buffer, 0, &bytes)?;
            table.uploaded = Some(pointers);
        }
        Ok(())
    }

    /// [`PlanExecutable::enqueue_all`] with a timeline span around each kernel.
    fn enqueue_all_traced(&self, inputs: &[DeviceBuffer], set: &OutputSet, spans: &mut Vec<PendingSpan>) -> Result<()> {
        for k in 0..self.kernels.len() {
            let kernel = &self.plan.kernels[k];
            let span = self.device.begin_span(kernel.name.clone(), kernel.kind.family(), SpanStream::Compute)?;
            self.enqueue_kernel(k, inputs, set)?;
            span.end()?;
            spans.push(span);
        }
        Ok(())
    }

    /// Enqueues every kernel of the plan in order.
    fn enqueue_all(&self, inputs: &[DeviceBuffer], set: &OutputSet) -> Result<()> {
        for k in 0..self.kernels.len() {
            self.enqueue_kernel(k, inputs, set)?;
        }
        Ok(())
    }

    fn enqueue_kernel(&self, k: usize, inputs: &[DeviceBuffer], set: &OutputSet) -> Result<()> {
        let kernel = &self.plan.kernels[k];
        match &self.kernels[k] {
            ReadyKernel::Empty => Ok(()),
            ReadyKernel::Cuda(cuda) => {
                for (launch, function) in cuda.code.launches.iter().zip(&cuda.functions) {
                    let args: Vec<KernelArg<'_>> = launch
                        .params
                        .iter()
                        .map(|p| match *p {
                            Param::Input(slot) => {
                                let (b, off) = self.locate(kernel.inputs[slot], inputs, set);
                                KernelArg::BufferAt(b, off)
                            }
                            Param::Output(slot) => {
                                let (b, off) = self.locate(kernel.outputs[slot], inputs, set);
                                KernelArg::BufferAt(b, off)
                            }
                            Param::Scratch(s) => KernelArg::Buffer(&cuda.scratch[s]),
                            Param::Table(t) => KernelArg::Buffer(&cuda.tables[t].buffer),
                            Param::Checks => {
                                KernelArg::Buffer(&self.checks.as_ref().expect("a plan with gathers has checks").0)
                            }
                        })
                        .collect();
                    let g = launch.grid;
                    let b = launch.block;
                    self.device.launch(function, (g[0], g[1], g[2]), (b[0], b[1], b[2]), launch.shared_bytes, &args)?;
                }
                Ok(())
            }
            ReadyKernel::Blas { matmul: m, .. } => {
                let blas = self.blas.as_ref().expect("BLAS handle is created before the first run");
                if m.k == 0 {
                    if m.bias || m.activation.is_some() {
                        return Err(CudaError::InvalidArgument(format!(
                            "{}: a matmul with k = 0 and a fused epilogue is not supported",
                            kernel.name
                        )));
                    }
                    let (c, c_off) = self.locate(kernel.outputs[0], inputs, set);
                    let bytes = m.batch.iter().product::<usize>() * m.m * m.n * m.dtype.size_bytes();
                    return self.device.memset_d8_range(c, c_off, bytes, 0);
                }
                let (spec, [a, b, c], bias) = self.matmul_call(k, inputs, set)?;
                blas.matmul(&spec, a, b, c, bias)
            }
        }
    }

    /// The cuBLASLt spec of matmul kernel `k` (with its algorithm) and its operands A, B, C and
    /// the bias, as bound for `inputs` and `set`.
    fn matmul_call<'a>(
        &'a self,
        k: usize,
        inputs: &'a [DeviceBuffer],
        set: &'a OutputSet,
    ) -> Result<(MatmulSpec, [MatrixRef<'a>; 3], Option<MatrixRef<'a>>)> {
        let kernel = &self.plan.kernels[k];
        let ReadyKernel::Blas { matmul: m, algorithm } = &self.kernels[k] else {
            return Err(CudaError::InvalidArgument(format!("{} is not a matmul", kernel.name)));
        };
        let mut spec = MatmulSpec::new(m.m, m.n, m.k, device_dtype(m.dtype)?);
        spec.batch = m.batch.iter().product();
        spec.stride_a = m.a_batch_stride;
        spec.stride_b = m.b_batch_stride;
        spec.stride_c = m.m * m.n;
        spec.transpose_a = m.a_transposed;
        spec.transpose_b = m.b_transposed;
        spec.allow_tf32 = self.options.allow_tf32;
        spec.activation = m.activation;
        spec.algorithm = *algorithm;
        let operand = |slot: BufferId| {
            let (buffer, offset) = self.locate(slot, inputs, set);
            MatrixRef::at(buffer, offset)
        };
        let bias = m.bias.then(|| operand(kernel.inputs[2]));
        Ok((spec, [operand(kernel.inputs[0]), operand(kernel.inputs[1]), operand(kernel.outputs[0])], bias))
    }

    /// Creates what the first run needs outside any capture (the cuBLASLt handle).
    pub fn prepare(&mut self) -> Result<()> {
        if self.blas.is_none() && self.kernels.iter().any(|k| matches!(k, ReadyKernel::Blas { .. })) {
            self.blas = Some(BlasLt::new(&self.device)?);
        }
        Ok(())
    }
}

impl Drop for PlanExecutable {
    /// Reads the completed check copies: a raised check is kept for the device's next host
    /// synchronization to report (the device holds the slots until their copies were read), and
    /// logged, since a drop cannot return it.
    fn drop(&mut self) {
        let Some((_, ring)) = &self.checks else { return };
        if let Err(err) = ring.poll(false, None) {
            tracing::warn!(target: "braze::kernels", error = %err, "a dropped plan raised a device-side check");
            ring.stash(err);
        }
    }
}
