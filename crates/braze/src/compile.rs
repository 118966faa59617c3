//! `compile`: a function traced once per input signature and replayed from a cache.

use crate::autograd::compiled::GraphSite;
use crate::backend::{self, GraphCache, Target};
use crate::explain::{Explanation, RunReport};
use crate::logging::{self, targets};
use crate::mode::Mode;
use crate::signature::{format_signature, TensorSig};
use crate::tensor::caller;
use crate::trace::{self, Binding, GradAtEntry, GraphRun, SplitRun, TraceConfig, TraceOutcome, WholeGraph, WriteBacks};
use crate::{Device, Error, GraphBreak, Result, Tensor};
use braze_ir::{DType, Graph, NodeId};
use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

/// Compiles `f`: the first call with a given input signature (dtype, shape and device of every
/// input) traces `f` by running it on traced tensors that record ops instead of computing, and
/// later calls with that signature run the recorded graph without running `f` again.
///
/// What `f` computes from host values is fixed at trace time: f64 scalars, shapes, loop counts,
/// and any branch on a Rust value are baked into the graph. Tensors `f` captures from its
/// environment (a model's weights) are not: they become graph inputs bound by identity, so
/// [`Tensor::assign`] on a captured weight is seen by the next call, and a new dtype or shape of
/// one traces again. Concrete tensors that `f` creates from host data are bound the same way, and
/// so keep their trace-time value.
///
/// Anything that needs a tensor's value on the host inside `f` is a graph break (see
/// [`crate::BreakKind`]). With `fullgraph(true)` the first break is an error; otherwise the
/// function is split at its breaks, every call runs `f` again (so host control flow on tensor
/// values stays right) and reuses the compiled pieces.
///
/// ```
/// use braze::{compile, DType, Tensor};
/// let f = compile(|a: &[Tensor]| Ok(vec![a[0].relu()?.add(&a[1])?])).fullgraph(true);
/// let x = Tensor::from_vec(vec![-1.0f32, 2.0], [2])?;
/// let y = f.call(&[x.clone(), x])?;
/// assert_eq!(y[0].to_vec::<f32>()?, vec![-1.0, 4.0]);
/// # Ok::<(), braze::Error>(())
/// ```
#[track_caller]
pub fn compile<F>(f: F) -> Compiled<F>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    logging::init();
    Compiled {
        f,
        name: format!("function compiled at {}", caller()),
        fullgraph: false,
        mode: Mode::Default,
        recompile_limit: 8,
        input_names: Vec::new(),
        state: Mutex::new(CacheState::default()),
        tracing: Mutex::new(()),
        graphs: Arc::new(GraphCache::default()),
    }
}

/// A compiled function; see [`compile`].
///
/// `Send + Sync` when `F` is: one compiled function may be called from many threads at once.
/// Cached calls run concurrently up to the executable (a GPU executable runs one call at a time,
/// its calls ordered on the device's stream); a new signature is traced by one thread while
/// calls with the same new signature on other threads wait for it and then hit the cache.
pub struct Compiled<F> {
    f: F,
    name: String,
    fullgraph: bool,
    mode: Mode,
    recompile_limit: usize,
    input_names: Vec<String>,
    state: Mutex<CacheState>,
    /// Held while tracing a new signature, so concurrent first calls trace it once.
    tracing: Mutex<()>,
    /// Graphs of functions split by breaks, by structure.
    graphs: Arc<GraphCache>,
}

/// A function traced into one graph, unrun ([`Compiled::trace_graph`]).
#[derive(Clone, Debug)]
pub struct TracedGraph {
    pub graph: braze_ir::Graph,
    /// `(graph output, graph input)`: outputs the caller writes back into captured inputs.
    pub in_place: Vec<(usize, usize)>,
}

/// Counters of one compiled function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// Input signatures traced and cached.
    pub traces: usize,
    /// Traces caused by a signature change (all traces but the first).
    pub recompiles: usize,
    /// Calls served by a cached signature.
    pub cache_hits: usize,
    /// Calls run eagerly because the recompile limit was reached (lenient mode).
    pub eager_fallbacks: usize,
    /// Graphs compiled: one per signature without breaks, one per distinct piece of a split
    /// function.
    pub graphs_compiled: usize,
}

#[derive(Default)]
struct CacheState {
    entries: Vec<Arc<Entry>>,
    /// The entry the last call hit and its arguments: a call with the very same tensors skips
    /// the per-argument signature check (thousands of gradients cost no locks per call).
    last_hit: Option<(Arc<Entry>, crate::tensor::SameTensors)>,
    recompile_reasons: Vec<String>,
    stats: CompileStats,
    whole_graphs_compiled: usize,
    warned_limit: bool,
}

struct Entry {
    inputs: Vec<TensorSig>,
    /// The autocast region the function was traced in: a call in another traces it again.
    autocast: Option<DType>,
    kind: EntryKind,
}

enum EntryKind {
    /// Traced without a break: replay the graph, never run the function again.
    Whole(WholeEntry),
    /// Traced with breaks: run the function again on each call, reusing compiled segments.
    Replay,
}

/// A function traced into one graph: the graph, what its inputs are bound to, what each call
/// writes back, and what its backward needs.
struct WholeEntry {
    run: GraphRun,
    bindings: Vec<Binding>,
    writes: WriteBacks,
    /// Nodes gradients do not flow through.
    stopped: Arc<HashSet<NodeId>>,
    target: Target,
    /// Inputs the plan overwrites in place (captured tensors assigned inside the function).
    written_in_place: Vec<usize>,
}

impl Entry {
    fn matches_inputs(&self, args: &[Tensor]) -> bool {
        self.autocast == crate::autocast_dtype()
            && self.inputs.len() == args.len()
            && self.inputs.iter().zip(args).all(|(sig, arg)| sig.matches(arg))
    }

    /// Why a captured tensor no longer fits the graph, if one does not.
    fn captured_change(&self) -> Option<String> {
        let EntryKind::Whole(WholeEntry { bindings, writes, .. }) = &self.kind else { return None };
        let binding_change = bindings.iter().find_map(|binding| match binding {
            Binding::Captured { tensor, traced_as, first_use } if !traced_as.matches(tensor) => {
                let place = first_use.as_ref().map(|loc| format!(" (first used at {loc})")).unwrap_or_default();
                Some(format!("captured tensor{place} {}", traced_as.change_to(&TensorSig::of(tensor))))
            }
            _ => None,
        });
        // The trace assumed each parameter it accumulated into had (or had no) gradient.
        binding_change.or_else(|| {
            writes.grads.iter().find_map(|effect| {
                let now = effect.param.inner.autograd.grad();
                match (&effect.entry, now) {
                    (GradAtEntry::Absent, Some(_)) => Some("a parameter has a gradient now and had none".into()),
                    (GradAtEntry::Present(_), None) => Some("a parameter has no gradient now and had one".into()),
                    (GradAtEntry::Present(sig), Some(grad)) if !sig.matches(&grad) => {
                        Some(format!("a parameter's gradient {}", sig.change_to(&TensorSig::of(&grad))))
                    }
                    _ => None,
                }
            })
        })
    }
}

impl<F> Compiled<F>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    /// `true`: any graph break is an error and the function must trace into one graph.
    pub fn fullgraph(mut self, fullgraph: bool) -> Self {
        self.fullgraph = fullgraph;
        self
    }

    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// How many input signatures are traced and cached (default 8). A new signature past it is
    /// an error in fullgraph mode and runs eagerly, with one warning, otherwise.
    pub fn recompile_limit(mut self, limit: usize) -> Self {
        self.recompile_limit = limit;
        self
    }

    /// The name used in logs and errors (default: where `compile` was called).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Names the inputs and fixes their number: a call with another count is an error that names
    /// the missing inputs, and recompile reasons name the input that changed.
    pub fn input_names(mut self, names: &[&str]) -> Self {
        self.input_names = names.iter().map(|n| n.to_string()).collect();
        self
    }

    pub fn get_name(&self) -> &str {
        &self.name
    }

    pub fn get_mode(&self) -> Mode {
        self.mode
    }

    pub fn is_fullgraph(&self) -> bool {
        self.fullgraph
    }

    pub fn stats(&self) -> CompileStats {
        let state = self.lock();
        CompileStats {
            recompiles: state.stats.traces.saturating_sub(1),
            graphs_compiled: state.whole_graphs_compiled + self.graphs.compiled(),
            ..state.stats
        }
    }

    /// Whether a call with `args` would run from the cache, without tracing: the guard check a
    /// call makes, O(number of inputs) and allocation-free.
    pub fn is_cached(&self, args: &[Tensor]) -> bool {
        find_entry(&self.lock().entries, args).is_ok()
    }

    /// Runs the function on `args`: from the cache when this signature was traced before.
    pub fn call(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        self.run(args, None)
    }

    /// Runs the function as [`Compiled::call`] does and reports its graphs, breaks, host
    /// synchronizations and recompiles.
    pub fn explain(&self, args: &[Tensor]) -> Result<Explanation> {
        let mut report = RunReport::default();
        let syncs_before = crate::sync_count();
        self.run(args, Some(&mut report))?;
        let syncs = crate::sync_count() - syncs_before;
        let state = self.lock();
        let mut explanation =
            Explanation::new(&self.name, self.mode, self.fullgraph, report, state.recompile_reasons.clone());
        explanation.host_syncs = usize::try_from(syncs).unwrap_or(usize::MAX);
        Ok(explanation)
    }

    /// Traces the function on `args` into one graph without compiling or running it, and
    /// without touching the cache: the graph a first [`Compiled::call`] would compile, with the
    /// `(output, input)` write-backs its plan may do in place
    /// ([`braze_passes::FusionOptions::in_place`]). Any graph break is an error, as with
    /// `fullgraph(true)`. For measuring and inspecting compiles of workloads too large to run on
    /// the machine at hand (the CPU backend would execute the graph).
    pub fn trace_graph(&self, args: &[Tensor]) -> Result<TracedGraph> {
        self.check_arity(args)?;
        let target = self.target(args)?;
        match trace::trace_call(&self.f, args, self.trace_config(target, true, false))? {
            TraceOutcome::Whole(WholeGraph { graph, bindings, writes, .. }) => {
                let in_place = writes.in_place_requests(&bindings);
                Ok(TracedGraph { graph, in_place })
            }
            // Unreachable in strict mode: the first break aborts the trace.
            TraceOutcome::Split(split) => Err(Error::InvalidArgument {
                op: format!("`{}`", self.name),
                loc: None,
                detail: format!("traced into {} graphs; trace_graph needs one", split.runs.len()),
            }),
        }
    }

    /// The kernels the function compiles to on `args`, as text to review: for each graph, its
    /// fused plan and the CUDA C of every generated kernel (a cuBLASLt matmul has none). The text
    /// is deterministic for one braze version and target, so a user's own test can snapshot it
    /// (`insta::assert_snapshot!(f.kernel_snapshot(&args)?)`) and `cargo insta review` shows what
    /// a braze upgrade changed. Kernels are generated for the device of the first argument (on
    /// the CPU, for the GPU codegen assumes there, an H200): keep such snapshots to one kind of
    /// machine, the CPU backend in CI for instance. Runs the function once, as `explain` does.
    pub fn kernel_snapshot(&self, args: &[Tensor]) -> Result<String> {
        use std::fmt::Write as _;
        let explanation = self.explain(args)?;
        let device = args.first().map(Tensor::device).unwrap_or(Device::Cpu);
        let mut text = String::new();
        for (g, graph) in explanation.graphs.iter().enumerate() {
            let exe = backend::compile_fused(graph, Target { device, mode: self.mode })?;
            let _ = writeln!(text, "==== graph {g}: {} ops ====", graph.op_count());
            let Some(plan) = exe.plan() else { continue };
            let _ = write!(text, "{plan}");
            let sources = exe.kernel_sources();
            for (k, kernel) in plan.kernels.iter().enumerate() {
                let _ = writeln!(text, "\n---- kernel {k}: {} ({}) ----", kernel.name, kernel.kind.family());
                match sources.iter().find(|(name, _)| *name == kernel.name) {
                    Some((_, source)) => text.push_str(source),
                    None => text.push_str("(no generated CUDA C: a cuBLASLt matmul or a kernel with nothing to do)\n"),
                }
            }
        }
        Ok(text)
    }

    /// Calls the function with every GPU kernel it runs timed: the results and each kernel's
    /// GPU time, in launch order. The kernels launch one by one between timing events and the
    /// call waits for them, even in [`Mode::ReduceOverhead`]; on the CPU the list is empty.
    pub fn profile(&self, args: &[Tensor]) -> Result<(Vec<Tensor>, Vec<braze_cuda::KernelTime>)> {
        crate::profile::collect(|| self.run(args, None))
    }

    /// The graph the function traces to on `args` and the tensors its inputs are bound to for
    /// a call on them, in input order: the arguments and what the function captures (weights,
    /// optimizer state, gradients it accumulates into), as `torch.export` hands out a program
    /// and its state. Traces (and runs once, as `explain` does) when `args` are not cached; a
    /// function traced with breaks has no one graph, which is an error naming the breaks.
    pub fn export(&self, args: &[Tensor]) -> Result<(Arc<Graph>, Vec<Tensor>)> {
        if !self.is_cached(args) {
            self.run(args, None)?;
        }
        let (Some(entry), _) = self.lookup(args) else {
            return Err(Error::InvalidArgument {
                op: format!("export `{}`", self.name),
                loc: None,
                detail: "the call's signature was not cached after tracing it".into(),
            });
        };
        match &entry.kind {
            EntryKind::Whole(whole) => Ok((whole.run.graph.clone(), self.bound_inputs(&whole.bindings, args)?)),
            EntryKind::Replay => Err(Error::InvalidArgument {
                op: format!("export `{}`", self.name),
                loc: None,
                detail: "the function has graph breaks, so no one graph (see explain's breaks)".into(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CacheState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn run(&self, args: &[Tensor], report: Option<&mut RunReport>) -> Result<Vec<Tensor>> {
        // Called while another compiled function traces: trace into the caller's graph.
        if trace::is_active() {
            return (self.f)(args);
        }
        let _span = crate::timeline::host_span("call", || format!("call {}", self.name), None);
        self.check_arity(args)?;
        // A cache hit needs no device scan: every input's device is part of the signature.
        if let (Some(entry), _) = self.lookup(args) {
            return self.run_entry(&entry, args, report);
        }
        // One thread traces a new signature; others calling with it meanwhile wait here and
        // then find it cached.
        let _tracing = self.tracing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match self.lookup(args) {
            (Some(entry), _) => self.run_entry(&entry, args, report),
            (None, reason) => {
                let target = self.target(args)?;
                self.trace_new(args, target, reason, report)
            }
        }
    }

    fn run_entry(&self, entry: &Entry, args: &[Tensor], report: Option<&mut RunReport>) -> Result<Vec<Tensor>> {
        match &entry.kind {
            EntryKind::Whole(whole) => {
                if let Some(report) = report {
                    report.runs.push(whole.run.clone());
                }
                self.run_whole(whole, args)
            }
            EntryKind::Replay => {
                let target = self.target(args)?;
                let split = trace::replay_call(&self.f, args, self.trace_config(target, false, true))?;
                Ok(take_split(split, report))
            }
        }
    }

    fn check_arity(&self, args: &[Tensor]) -> Result<()> {
        if self.input_names.is_empty() || self.input_names.len() == args.len() {
            return Ok(());
        }
        Err(Error::Arity {
            function: self.name.clone(),
            expected: self.input_names.len(),
            actual: args.len(),
            names: self.input_names.clone(),
        })
    }

    /// The device every input is on.
    fn target(&self, args: &[Tensor]) -> Result<Target> {
        let device = args.first().map(Tensor::device).unwrap_or(Device::Cpu);
        for (i, arg) in args.iter().enumerate().skip(1) {
            if arg.device() != device {
                return Err(Error::DeviceMismatch {
                    op: format!("`{}` {}", self.name, self.input_label(i)),
                    loc: None,
                    expected: device,
                    actual: arg.device(),
                });
            }
        }
        Ok(Target { device, mode: self.mode })
    }

    /// The cached entry for `args`, or why none fits (`None` on the first call).
    fn lookup(&self, args: &[Tensor]) -> (Option<Arc<Entry>>, Option<String>) {
        let mut state = self.lock();
        if let Some((entry, same)) = &state.last_hit {
            if same.matches(args) && entry.autocast == crate::autocast_dtype() && entry.captured_change().is_none() {
                let entry = entry.clone();
                state.stats.cache_hits += 1;
                return (Some(entry), None);
            }
        }
        match find_entry(&state.entries, args).map(Arc::clone) {
            Ok(entry) => {
                state.stats.cache_hits += 1;
                let mut same = crate::tensor::SameTensors::default();
                same.remember(args);
                state.last_hit = Some((entry.clone(), same));
                (Some(entry), None)
            }
            Err(captured_reason) => {
                let reason = captured_reason.or_else(|| state.entries.last().map(|e| self.describe_change(e, args)));
                (None, reason)
            }
        }
    }

    fn describe_change(&self, entry: &Entry, args: &[Tensor]) -> String {
        let region = crate::autocast_dtype();
        if entry.autocast != region {
            let name = |r: Option<DType>| r.map_or("off".to_string(), |d| d.to_string());
            return format!("autocast changed from {} to {}", name(entry.autocast), name(region));
        }
        let old = &entry.inputs;
        if old.len() != args.len() {
            return format!("number of inputs changed from {} to {}", old.len(), args.len());
        }
        for (i, (sig, arg)) in old.iter().zip(args).enumerate() {
            if !sig.matches(arg) {
                return format!("{} {}", self.input_label(i), sig.change_to(&TensorSig::of(arg)));
            }
        }
        "a new signature".into()
    }

    fn input_label(&self, i: usize) -> String {
        match self.input_names.get(i) {
            Some(name) => format!("input {i} ({name})"),
            None => format!("input {i}"),
        }
    }

    fn trace_config(&self, target: Target, strict: bool, replay: bool) -> TraceConfig {
        TraceConfig { strict, function: self.name.clone(), target, graphs: self.graphs.clone(), replay }
    }

    fn run_whole(&self, whole: &WholeEntry, args: &[Tensor]) -> Result<Vec<Tensor>> {
        let WholeEntry { run, bindings, writes, .. } = whole;
        writes.release_replaced_grads();
        let (inputs, mut outputs) = self.run_bound(run, bindings, &whole.written_in_place, args)?;
        // Gradients and assigned values come after the returned values.
        let returned = writes.first_output().unwrap_or(outputs.len());
        let site = GraphSite {
            graph: run.graph.clone(),
            stopped: whole.stopped.clone(),
            target: whole.target,
            cache: self.graphs.clone(),
            name: format!("`{}`", self.name),
        };
        crate::autograd::compiled::record(site, &inputs, &outputs[..returned]);
        writes.apply(&outputs)?;
        outputs.truncate(returned);
        Ok(outputs)
    }

    /// Runs the graph on its bound inputs; returns the inputs and the outputs. Inputs in
    /// `written_in_place` are overwritten by the run.
    fn run_bound(
        &self,
        run: &GraphRun,
        bindings: &[Binding],
        written_in_place: &[usize],
        args: &[Tensor],
    ) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        let running = |e| trace::with_context(e, &format!("running `{}`", self.name));
        // The graph's inputs are exactly the arguments, in order: pass them through uncopied.
        let direct = bindings.len() == args.len()
            && bindings.iter().enumerate().all(|(i, b)| matches!(b, Binding::Arg(j) if *j == i));
        if direct {
            return Ok((args.to_vec(), run.exe.run(args).map_err(running)?));
        }
        let mut inputs = self.bound_inputs(bindings, args)?;
        unalias(&mut inputs, written_in_place)?;
        let outputs = run.exe.run(&inputs).map_err(running)?;
        Ok((inputs, outputs))
    }

    /// The tensors bound to a graph's inputs for a call on `args`, in input order.
    fn bound_inputs(&self, bindings: &[Binding], args: &[Tensor]) -> Result<Vec<Tensor>> {
        let mut inputs = Vec::with_capacity(bindings.len());
        for binding in bindings {
            inputs.push(match binding {
                Binding::Arg(i) => args.get(*i).cloned().ok_or_else(|| Error::Arity {
                    function: self.name.clone(),
                    expected: i + 1,
                    actual: args.len(),
                    names: self.input_names.clone(),
                })?,
                Binding::Captured { tensor, .. } => tensor.clone(),
                // Present: the entry's guard checked it before this call.
                Binding::GradOf { param, .. } => param.inner.autograd.grad().ok_or_else(|| Error::InvalidArgument {
                    op: format!("`{}`", self.name),
                    loc: None,
                    detail: "a parameter's gradient was dropped while the call ran".into(),
                })?,
            });
        }
        Ok(inputs)
    }

    fn trace_new(
        &self,
        args: &[Tensor],
        target: Target,
        reason: Option<String>,
        report: Option<&mut RunReport>,
    ) -> Result<Vec<Tensor>> {
        let _span = crate::timeline::host_span("trace", || format!("trace {}", self.name), None);
        let signature: Vec<TensorSig> = args.iter().map(TensorSig::of).collect();
        if self.past_limit(&signature, reason.as_deref())? {
            if let Some(report) = report {
                report.eager_fallback = true;
            }
            return (self.f)(args);
        }
        if let Some(reason) = &reason {
            tracing::debug!(target: targets::RECOMPILES, "recompiling {}: {reason}", self.name);
        }
        let signature_text = format_signature(&signature);
        let outcome = match trace::trace_call(&self.f, args, self.trace_config(target, self.fullgraph, false)) {
            Ok(outcome) => outcome,
            Err(error) => {
                if let Error::GraphBreak { kind, op, loc, hint } = &error {
                    let found = GraphBreak { kind: *kind, op: op.clone(), loc: loc.clone(), hint };
                    logging::breaks_traced(&self.name, &signature_text, &[found]);
                }
                return Err(error);
            }
        };
        let (outputs, kind) = match outcome {
            TraceOutcome::Whole(WholeGraph { graph, bindings, writes, stopped }) => {
                logging::breaks_traced(&self.name, &signature_text, &[]);
                let exe = backend::compile_traced(&graph, target, &self.name, &writes.in_place_requests(&bindings))?;
                let written_in_place = exe.plan().map(|plan| plan.in_place_inputs()).unwrap_or_default();
                let run = GraphRun { graph: Arc::new(graph), exe };
                self.lock().whole_graphs_compiled += 1;
                let whole = WholeEntry { run, bindings, writes, stopped, target, written_in_place };
                let outputs = self.run_whole(&whole, args)?;
                if let Some(report) = report {
                    report.runs.push(whole.run.clone());
                }
                (outputs, EntryKind::Whole(whole))
            }
            TraceOutcome::Split(split) => {
                logging::breaks_traced(&self.name, &signature_text, &split.breaks);
                (take_split(split, report), EntryKind::Replay)
            }
        };
        let mut state = self.lock();
        // A signature traced again (a captured tensor changed) replaces its old entry.
        let autocast = crate::autocast_dtype();
        state.entries.retain(|e| e.inputs != signature || e.autocast != autocast);
        state.last_hit = None;
        state.entries.push(Arc::new(Entry { inputs: signature, autocast, kind }));
        state.stats.traces += 1;
        if let Some(reason) = reason {
            state.recompile_reasons.push(reason);
        }
        Ok(outputs)
    }

    /// Whether tracing `signature` would pass the recompile limit: an error in fullgraph mode,
    /// `true` (run eagerly) otherwise.
    fn past_limit(&self, signature: &[TensorSig], reason: Option<&str>) -> Result<bool> {
        let mut state = self.lock();
        let replaces = state.entries.iter().any(|e| e.inputs == signature);
        if replaces || state.entries.len() < self.recompile_limit {
            return Ok(false);
        }
        let new_signature = format_signature(signature);
        if self.fullgraph {
            return Err(Error::RecompileLimit {
                function: self.name.clone(),
                limit: self.recompile_limit,
                new_signature,
                signatures: state.entries.iter().map(|e| format_signature(&e.inputs)).collect(),
            });
        }
        let why = reason.unwrap_or("a new signature");
        if state.warned_limit {
            tracing::debug!(target: targets::RECOMPILES, "{}: running eagerly for {new_signature} ({why})", self.name);
        } else {
            state.warned_limit = true;
            tracing::warn!(
                target: targets::RECOMPILES,
                "{} reached its recompile limit of {}: calls with new signatures run eagerly from now on \
                 (this one: {new_signature}, {why})",
                self.name,
                self.recompile_limit
            );
        }
        state.stats.eager_fallbacks += 1;
        Ok(true)
    }
}

/// Gives every input that shares its data with an input the run overwrites in place (a weight
/// both captured and passed as an argument) a copy of its own, so it still reads the old values.
fn unalias(inputs: &mut [Tensor], written_in_place: &[usize]) -> Result<()> {
    if written_in_place.is_empty() {
        return Ok(());
    }
    let written: HashSet<usize> = written_in_place.iter().map(|&i| inputs[i].data_ptr()).collect();
    for (j, input) in inputs.iter_mut().enumerate() {
        if !written_in_place.contains(&j) && written.contains(&input.data_ptr()) {
            *input = crate::no_grad(|| input.mul_scalar(1.0))?;
        }
    }
    Ok(())
}

/// The entry whose guards `args` pass; otherwise why an entry traced for these inputs no longer
/// fits (a captured tensor changed), if one was.
fn find_entry<'e>(entries: &'e [Arc<Entry>], args: &[Tensor]) -> std::result::Result<&'e Arc<Entry>, Option<String>> {
    let mut captured_reason = None;
    for entry in entries {
        if !entry.matches_inputs(args) {
            continue;
        }
        match entry.captured_change() {
            None => return Ok(entry),
            Some(reason) => captured_reason = Some(reason),
        }
    }
    Err(captured_reason)
}

/// The outputs of a split run, its graphs and breaks going to `report`.
fn take_split(split: SplitRun, report: Option<&mut RunReport>) -> Vec<Tensor> {
    if let Some(report) = report {
        report.runs.extend(split.runs);
        report.breaks.extend(split.breaks);
    }
    split.outputs
}
