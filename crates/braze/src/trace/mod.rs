//! Tracing: running a function on traced tensors that record ops into a thread-local trace, as
//! jax.jit does, and eager execution of the same ops when no trace is active.
//!
//! A trace records into a *segment* graph. Values of the trace are either pending (a node of the
//! current segment) or concrete (a call argument, a captured tensor, or the result of a segment
//! that already ran). A concrete value used by an op becomes an input of the segment. When a graph
//! break needs a pending value on the host (lenient mode), the segment runs with every pending
//! value that still has a live handle as an output; those values turn concrete and tracing goes on
//! in a new segment. In fullgraph mode the first break aborts the trace before anything runs.

mod recording;

use crate::backend::{self, Executable, GraphCache, Target};
use crate::mode::Mode;
use crate::signature::TensorSig;
use crate::sync_debug::sync_point;
use crate::{BreakKind, Device, Error, GraphBreak, Result, Tensor};
use braze_ir::{DType, Graph, HostTensor, NodeId, Op, Shape, SourceLoc};
use recording::Trace;
pub(crate) use recording::{GradAtEntry, WriteBacks};
use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::Arc;

thread_local! {
    static ACTIVE: RefCell<Option<Trace>> = const { RefCell::new(None) };
}

/// Whether a compiled function is being traced on this thread.
pub(crate) fn is_active() -> bool {
    // Borrowed mutably means an op of the active trace is recording.
    ACTIVE.with(|cell| cell.try_borrow().map(|slot| slot.is_some()).unwrap_or(true))
}

/// Adds nodes for one user-level op, each carrying the user's source location.
pub(crate) struct OpBuilder<'g> {
    graph: &'g mut Graph,
    loc: SourceLoc,
    /// The autocast region the op was called in.
    autocast: Option<DType>,
}

impl<'g> OpBuilder<'g> {
    pub(crate) fn new(graph: &'g mut Graph, loc: SourceLoc) -> OpBuilder<'g> {
        OpBuilder { graph, loc, autocast: crate::autocast::autocast_dtype() }
    }

    /// Adds `op`, its float operands first cast as the autocast region asks (`autocast`).
    pub(crate) fn op(&mut self, op: Op, operands: &[NodeId]) -> braze_ir::Result<NodeId> {
        let mut cast = Vec::with_capacity(operands.len());
        for &x in operands {
            cast.push(match crate::autocast::operand_dtype(&op, self.autocast, self.dtype(x)) {
                Some(dtype) => self.cast(x, dtype)?,
                None => x,
            });
        }
        self.graph.add(op, &cast, Some(self.loc.clone()))
    }

    pub(crate) fn constant(&mut self, value: f64, dtype: DType) -> NodeId {
        let id = self.graph.constant(value, dtype);
        self.graph.set_loc(id, Some(self.loc.clone()));
        id
    }

    pub(crate) fn arange(&mut self, n: usize, dtype: DType) -> braze_ir::Result<NodeId> {
        let id = self.graph.arange(n, dtype)?;
        self.graph.set_loc(id, Some(self.loc.clone()));
        Ok(id)
    }

    pub(crate) fn cast(&mut self, x: NodeId, dtype: DType) -> braze_ir::Result<NodeId> {
        let id = self.graph.cast(x, dtype)?;
        self.graph.set_loc(id, Some(self.loc.clone()));
        Ok(id)
    }

    /// `x` as `dtype`: a cast only where it differs.
    pub(crate) fn cast_if_needed(&mut self, x: NodeId, dtype: DType) -> braze_ir::Result<NodeId> {
        if self.dtype(x) == dtype {
            return Ok(x);
        }
        self.cast(x, dtype)
    }

    pub(crate) fn reshape(&mut self, x: NodeId, shape: Shape) -> braze_ir::Result<NodeId> {
        let id = self.graph.reshape(x, shape)?;
        self.graph.set_loc(id, Some(self.loc.clone()));
        Ok(id)
    }

    pub(crate) fn broadcast_to(&mut self, x: NodeId, shape: Shape) -> braze_ir::Result<NodeId> {
        let id = self.graph.broadcast_to(x, shape)?;
        self.graph.set_loc(id, Some(self.loc.clone()));
        Ok(id)
    }

    pub(crate) fn shape(&self, x: NodeId) -> &Shape {
        &self.graph.node(x).shape
    }

    pub(crate) fn dtype(&self, x: NodeId) -> DType {
        self.graph.node(x).dtype
    }
}

/// Applies one user-level op: recorded into the active trace, or run eagerly as a one-op graph.
/// `build` adds the op's nodes given the operands' nodes.
pub(crate) fn apply(
    op: &'static str,
    operands: &[&Tensor],
    loc: SourceLoc,
    build: impl Fn(&mut OpBuilder<'_>, &[NodeId]) -> braze_ir::Result<NodeId>,
) -> Result<Tensor> {
    let recorded = ACTIVE.with(|cell| cell.borrow_mut().as_mut().map(|trace| trace.record(op, operands, &loc, &build)));
    match recorded {
        Some(result) => result,
        None => eager(op, operands, &loc, &build),
    }
}

/// Eager execution: the op as a graph of its own, compiled and run at once (nothing cached).
fn eager(
    op: &'static str,
    operands: &[&Tensor],
    loc: &SourceLoc,
    build: &dyn Fn(&mut OpBuilder<'_>, &[NodeId]) -> braze_ir::Result<NodeId>,
) -> Result<Tensor> {
    let _span = crate::timeline::host_span("eager", || format!("eager `{op}`"), Some(loc.to_string()));
    let mut graph = Graph::new();
    let mut ids = Vec::with_capacity(operands.len());
    let mut device = None;
    for t in operands {
        if t.is_traced() {
            return Err(Error::StaleTrace { op: op.to_string(), loc: Some(loc.clone()) });
        }
        let here = t.device();
        match device {
            Some(expected) if expected != here => {
                return Err(Error::DeviceMismatch { op: op.into(), loc: Some(loc.clone()), expected, actual: here })
            }
            _ => device = Some(here),
        }
        ids.push(graph.input(t.dtype(), t.shape()));
    }
    let out = build(&mut OpBuilder::new(&mut graph, loc.clone()), &ids).map_err(|ir| Error::ir(op, loc, ir))?;
    graph.set_outputs(vec![out]);
    let target = Target { device: device.unwrap_or(Device::Cpu), mode: Mode::Default };
    let inputs: Vec<Tensor> = operands.iter().map(|t| (*t).clone()).collect();
    let mut outputs =
        backend::compile_graph(&graph, target)?.run(&inputs).map_err(|e| with_context(e, &format!("{op} at {loc}")))?;
    let result = outputs.pop().ok_or_else(|| Error::invalid(op, loc, "the executor returned no result"))?;
    crate::autograd::tape::record(&result, &graph, operands);
    Ok(result)
}

/// Runs `f` on the active trace, if there is one.
fn on_trace<R>(f: impl FnOnce(&mut Trace) -> R) -> Option<R> {
    ACTIVE.with(|cell| cell.borrow_mut().as_mut().map(f))
}

/// `root.backward()` inside a compiled function: the backward ops appended to the trace.
pub(crate) fn backward(root: &Tensor, seed: Option<&Tensor>, loc: &SourceLoc) -> Option<Result<()>> {
    on_trace(|trace| trace.backward(root, seed, loc))
}

/// Gradients of `root` with respect to `wrt` inside a compiled function (the functional form).
pub(crate) fn gradients(root: &Tensor, wrt: &[Tensor], loc: &SourceLoc) -> Option<Result<Vec<Option<Tensor>>>> {
    on_trace(|trace| trace.gradients(root, wrt, loc))
}

/// `t.grad()` inside a compiled function.
pub(crate) fn grad_of(t: &Tensor) -> Option<Option<Tensor>> {
    on_trace(|trace| trace.grad_of(t))
}

/// `t.zero_grad()` inside a compiled function.
pub(crate) fn zero_grad(t: &Tensor) -> Option<()> {
    on_trace(|trace| trace.set_grad(t, None))
}

/// `t.set_grad(grad)` inside a compiled function.
pub(crate) fn set_grad(t: &Tensor, grad: Option<&Tensor>) -> Option<()> {
    on_trace(|trace| trace.set_grad(t, grad))
}

/// `target.assign(value)` inside a compiled function.
pub(crate) fn assign(target: &Tensor, value: &Tensor, loc: &SourceLoc) -> Option<Result<()>> {
    on_trace(|trace| trace.assign(target, value, loc))
}

/// `t.detach()` inside a compiled function.
pub(crate) fn detach(t: &Tensor, loc: &SourceLoc) -> Option<Result<Tensor>> {
    on_trace(|trace| trace.detach(t, loc))
}

/// `full`/`zeros`/`ones`: a constant broadcast to `shape` inside a trace, host data otherwise.
pub(crate) fn full(
    op: &'static str,
    shape: Shape,
    value: f64,
    dtype: DType,
    device: Device,
    loc: SourceLoc,
) -> Result<Tensor> {
    device.check_available(op)?;
    if is_active() {
        apply(op, &[], loc, |b, _| {
            let scalar = b.constant(value, dtype);
            b.broadcast_to(scalar, shape.clone())
        })
    } else {
        match device {
            Device::Cpu => Ok(Tensor::from_host(HostTensor::full(dtype, shape, value))),
            Device::Cuda(ordinal) => {
                let element = HostTensor::full(dtype, Shape::scalar(), value);
                Ok(Tensor::from_cuda(crate::cuda::CudaTensor::full(&element, shape, ordinal, op)?))
            }
        }
    }
}

/// The host data of `tensor` for a host-side read of `kind`. Inside a trace this is a graph
/// break: an error in fullgraph mode, a split of the graph in lenient mode.
pub(crate) fn host_value(tensor: &Tensor, kind: BreakKind, op: &str, loc: SourceLoc) -> Result<Arc<HostTensor>> {
    let in_trace = ACTIVE.with(|cell| {
        cell.borrow_mut().as_mut().map(|trace| {
            let value = trace.value_of(tensor, op, Some(&loc))?;
            // A fullgraph trace stops at the break: nothing runs, nothing is read.
            trace.graph_break(kind, op, &loc, &[value])?;
            let _sync = sync_point(kind, op, &loc)?;
            trace.host_of(value, op, &loc)
        })
    });
    match in_trace {
        Some(result) => result,
        None => {
            if tensor.is_traced() {
                return Err(Error::StaleTrace { op: op.to_string(), loc: Some(loc) });
            }
            let _sync = sync_point(kind, op, &loc)?;
            tensor.read_host(op)?.ok_or_else(|| Error::StaleTrace { op: op.to_string(), loc: Some(loc) })
        }
    }
}

/// Runs an opaque host function on `inputs`; inside a trace it is a graph break.
pub(crate) fn host_call(
    op: &str,
    inputs: &[Tensor],
    loc: SourceLoc,
    host_fn: &dyn Fn(&[HostTensor]) -> Result<Vec<HostTensor>>,
) -> Result<Vec<Tensor>> {
    let in_trace = ACTIVE.with(|cell| {
        cell.borrow_mut().as_mut().map(|trace| {
            let values = inputs.iter().map(|t| trace.value_of(t, op, Some(&loc))).collect::<Result<Vec<usize>>>()?;
            trace.graph_break(BreakKind::OpaqueHostFn, op, &loc, &values)?;
            let _sync = sync_point(BreakKind::OpaqueHostFn, op, &loc)?;
            let need_grad = values.iter().any(|&v| trace.needs_grad(v));
            let host =
                values.iter().map(|&v| trace.host_of(v, op, &loc).map(|h| (*h).clone())).collect::<Result<Vec<_>>>()?;
            Ok((host, need_grad))
        })
    });
    let (host_inputs, need_grad) = match in_trace {
        Some(result) => result?,
        None => {
            let reads_values = !inputs.is_empty() && !inputs.iter().any(Tensor::is_traced);
            let _sync = reads_values.then(|| sync_point(BreakKind::OpaqueHostFn, op, &loc)).transpose()?;
            let host = inputs
                .iter()
                .map(|t| {
                    t.read_host(op)?
                        .map(|h| (*h).clone())
                        .ok_or_else(|| Error::StaleTrace { op: op.to_string(), loc: Some(loc.clone()) })
                })
                .collect::<Result<Vec<_>>>()?;
            (host, inputs.iter().any(Tensor::needs_grad))
        }
    };
    // Host code may use tensors itself; those run eagerly, outside the trace.
    let outputs: Vec<Tensor> = suspended(|| host_fn(&host_inputs))?.into_iter().map(Tensor::from_host).collect();
    crate::autograd::tape::record_opaque(&outputs, need_grad, op, &loc);
    Ok(outputs)
}

/// Runs `f` with this thread's trace set aside, restoring it afterwards (also on unwind).
fn suspended<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Trace>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let trace = self.0.take();
            ACTIVE.with(|cell| *cell.borrow_mut() = trace);
        }
    }
    let _restore = Restore(ACTIVE.with(|cell| cell.borrow_mut().take()));
    f()
}

/// Puts a trace in place for the duration of a traced call; takes it out on drop if the call
/// unwinds.
struct Installed {
    taken: bool,
}

impl Installed {
    fn new(trace: Trace) -> Installed {
        ACTIVE.with(|cell| *cell.borrow_mut() = Some(trace));
        Installed { taken: false }
    }

    fn take(mut self) -> Option<Trace> {
        self.taken = true;
        ACTIVE.with(|cell| cell.borrow_mut().take())
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        if !self.taken {
            ACTIVE.with(|cell| cell.borrow_mut().take());
        }
    }
}

/// How a trace treats breaks, and where its graphs are compiled.
pub(crate) struct TraceConfig {
    pub strict: bool,
    pub function: String,
    pub target: Target,
    pub graphs: Arc<GraphCache>,
    /// Running a function cached as split, again: breaks are not logged again, new graph
    /// structures are.
    pub replay: bool,
}

/// A graph that ran (or will run) and the executable that runs it.
#[derive(Clone)]
pub(crate) struct GraphRun {
    pub graph: Arc<Graph>,
    pub exe: Arc<dyn Executable>,
}

/// What a whole-graph input is bound to on later calls.
#[derive(Clone)]
pub(crate) enum Binding {
    /// Argument `i` of the call.
    Arg(usize),
    /// A concrete tensor the function used without receiving it (a captured weight): bound by
    /// identity, so its current data is read at each call; its type at trace time is guarded.
    Captured { tensor: Tensor, traced_as: TensorSig, first_use: Option<SourceLoc> },
    /// The gradient `param` has at each call (accumulated into by `backward()`); its presence
    /// and type at trace time are guarded by the entry's gradient write-backs.
    GradOf { param: Tensor },
}

/// A function traced without a break: one graph, not yet run, to cache and replay without
/// running the function again.
pub(crate) struct WholeGraph {
    pub graph: Graph,
    pub bindings: Vec<Binding>,
    pub writes: WriteBacks,
    /// Nodes gradients do not flow through (computed under `no_grad`, or detached).
    pub stopped: Arc<HashSet<NodeId>>,
}

pub(crate) enum TraceOutcome {
    Whole(WholeGraph),
    /// Breaks split the function; its graphs already ran.
    Split(SplitRun),
}

/// A run of a function split into graphs at its breaks.
pub(crate) struct SplitRun {
    pub outputs: Vec<Tensor>,
    pub runs: Vec<GraphRun>,
    pub breaks: Vec<GraphBreak>,
}

/// Traces `f` on `args`: the whole graph, unrun, when there was no break; otherwise the
/// results of the graphs split at the breaks.
pub(crate) fn trace_call<F>(f: &F, args: &[Tensor], config: TraceConfig) -> Result<TraceOutcome>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>> + ?Sized,
{
    let (mut trace, returned) = run_traced(f, args, config)?;
    if trace.breaks.is_empty() {
        trace.whole_graph(&returned).map(TraceOutcome::Whole)
    } else {
        trace.finish_split(&returned).map(TraceOutcome::Split)
    }
}

/// Runs `f` on `args` split at its breaks, the graphs compiled by structure.
pub(crate) fn replay_call<F>(f: &F, args: &[Tensor], config: TraceConfig) -> Result<SplitRun>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>> + ?Sized,
{
    let (trace, returned) = run_traced(f, args, config)?;
    trace.finish_split(&returned)
}

/// Runs `f` on traced handles of `args` with a trace installed.
fn run_traced<F>(f: &F, args: &[Tensor], config: TraceConfig) -> Result<(Trace, Vec<Tensor>)>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>> + ?Sized,
{
    let mut trace = Trace::new(config);
    let handles = trace.bind_args(args)?;
    let installed = Installed::new(trace);
    let result = f(&handles);
    drop(handles);
    let Some(trace) = installed.take() else {
        return Err(Error::InvalidArgument {
            op: "compile".into(),
            loc: None,
            detail: "the trace was removed while the function ran".into(),
        });
    };
    if let Some(first_break) = &trace.aborted {
        return Err(first_break.to_error());
    }
    Ok((trace, result?))
}

/// Prefixes the context of an executor error.
pub(crate) fn with_context(error: Error, context: &str) -> Error {
    match error {
        Error::Cpu { context: inner, cpu } => Error::Cpu { context: format!("{context}: {inner}"), cpu },
        other => other,
    }
}
