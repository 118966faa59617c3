//! The trace itself: its values (pending in the current segment, or concrete), the segment
//! graph ops record into, graph breaks, and running a segment when a break needs its values.

mod gradients;

use super::{with_context, Binding, GraphRun, OpBuilder, SplitRun, TraceConfig, WholeGraph};
use crate::autograd::compiled::GraphSite;
use crate::logging::targets;
use crate::signature::TensorSig;
use crate::tensor::{Storage, TensorInner, TracedRef};
use crate::{BreakKind, Error, GraphBreak, Result, Tensor};
use braze_ir::{DType, Graph, HostTensor, NodeId, Op, Shape, SourceLoc};
pub(crate) use gradients::{GradAtEntry, WriteBacks};
use gradients::{GradEffect, GradSlot};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

static NEXT_TRACE_ID: AtomicU64 = AtomicU64::new(1);

type ValueId = usize;

enum ValueState {
    /// A node of the current segment.
    Pending(NodeId),
    Concrete(Tensor),
    /// Was pending when its segment ran, with no handle left: nobody can use it.
    Dropped,
}

enum Origin {
    Arg(usize),
    /// The gradient a parameter had when the call began (read by `grad()` or accumulated into
    /// by `backward()`): bound to the parameter's gradient on each call.
    GradOf(Tensor),
    /// A concrete tensor met in an op, and where.
    Captured(Option<SourceLoc>),
    /// The result of an op of this trace.
    Computed,
}

struct Value {
    dtype: DType,
    shape: Shape,
    state: ValueState,
    origin: Origin,
    /// The traced handle of a computed value; alive while user code can still use the value.
    handle: Weak<TensorInner>,
}

#[derive(Default)]
struct Segment {
    graph: Graph,
    /// Graph input `i` reads value `bindings[i]`.
    bindings: Vec<ValueId>,
    input_nodes: HashMap<ValueId, NodeId>,
    /// Computed values of this segment, in creation order.
    pending: Vec<ValueId>,
    /// Nodes gradients do not flow through (computed under `no_grad`, or detached).
    stopped: HashSet<NodeId>,
}

pub(super) struct Trace {
    id: u64,
    config: TraceConfig,
    values: Vec<Value>,
    /// Concrete tensors already seen, by handle identity.
    captured: HashMap<*const TensorInner, ValueId>,
    segment: Segment,
    runs: Vec<GraphRun>,
    pub(super) breaks: Vec<GraphBreak>,
    /// The break that stopped a fullgraph trace; every later op fails with it.
    pub(super) aborted: Option<GraphBreak>,
    grads: Vec<GradSlot>,
    /// `assign`s inside the function: the target and its new value.
    assigns: Vec<(Tensor, Tensor)>,
}

impl Trace {
    pub(super) fn new(config: TraceConfig) -> Trace {
        Trace {
            id: NEXT_TRACE_ID.fetch_add(1, Ordering::Relaxed),
            config,
            values: Vec::new(),
            captured: HashMap::new(),
            segment: Segment::default(),
            runs: Vec::new(),
            breaks: Vec::new(),
            aborted: None,
            grads: Vec::new(),
            assigns: Vec::new(),
        }
    }

    /// Makes each argument graph input `i` and returns the traced handles `f` receives.
    pub(super) fn bind_args(&mut self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        let mut handles = Vec::with_capacity(args.len());
        for (i, arg) in args.iter().enumerate() {
            if arg.is_traced() {
                return Err(Error::StaleTrace { op: format!("input {i}"), loc: None });
            }
            let (dtype, shape) = (arg.dtype(), arg.shape());
            let value = self.values.len();
            let node = self.segment.graph.input(dtype, shape.clone());
            self.segment.input_nodes.insert(value, node);
            self.segment.bindings.push(value);
            handles.push(self.traced_handle(value, dtype, shape.clone()));
            self.values.push(Value {
                dtype,
                shape,
                state: ValueState::Concrete(arg.clone()),
                origin: Origin::Arg(i),
                handle: Weak::new(),
            });
        }
        Ok(handles)
    }

    fn traced_handle(&self, value: ValueId, dtype: DType, shape: Shape) -> Tensor {
        Tensor::from_storage(Storage::Traced(TracedRef {
            trace: self.id,
            value,
            dtype,
            shape,
            device: self.config.target.device,
        }))
    }

    fn check_aborted(&self) -> Result<()> {
        match &self.aborted {
            Some(first_break) => Err(first_break.to_error()),
            None => Ok(()),
        }
    }

    pub(super) fn record(
        &mut self,
        op: &'static str,
        operands: &[&Tensor],
        loc: &SourceLoc,
        build: &dyn Fn(&mut OpBuilder<'_>, &[NodeId]) -> braze_ir::Result<NodeId>,
    ) -> Result<Tensor> {
        self.check_aborted()?;
        let mut ids = Vec::with_capacity(operands.len());
        for t in operands {
            let value = self.value_of(t, op, Some(loc))?;
            ids.push(self.node_for(value, op, Some(loc))?);
        }
        let mut builder = OpBuilder::new(&mut self.segment.graph, loc.clone());
        let node = build(&mut builder, &ids).map_err(|ir| Error::ir(op, loc, ir))?;
        if !crate::autograd::is_grad_enabled() && !ids.contains(&node) {
            self.segment.stopped.insert(node);
        }
        Ok(self.pending_value(node))
    }

    /// A new value of the trace computed by `node` of the current segment, and its handle.
    fn pending_value(&mut self, node: NodeId) -> Tensor {
        let (dtype, shape) = {
            let n = self.segment.graph.node(node);
            (n.dtype, n.shape.clone())
        };
        let value = self.values.len();
        let handle = self.traced_handle(value, dtype, shape.clone());
        self.values.push(Value {
            dtype,
            shape,
            state: ValueState::Pending(node),
            origin: Origin::Computed,
            handle: Arc::downgrade(&handle.inner),
        });
        self.segment.pending.push(value);
        handle
    }

    /// The trace value of `t`, registering a concrete tensor the first time it is seen.
    pub(super) fn value_of(&mut self, t: &Tensor, op: &str, loc: Option<&SourceLoc>) -> Result<ValueId> {
        let (dtype, shape) = match &*t.storage() {
            Storage::Traced(r) if r.trace == self.id => return Ok(r.value),
            Storage::Traced(_) => return Err(Error::StaleTrace { op: op.to_string(), loc: loc.cloned() }),
            Storage::Host(data) => (data.dtype(), data.shape().clone()),
            Storage::Cuda(data) => (data.dtype, data.shape.clone()),
        };
        let key = Arc::as_ptr(&t.inner);
        if let Some(&value) = self.captured.get(&key) {
            return Ok(value);
        }
        let value = self.values.len();
        self.values.push(Value {
            dtype,
            shape,
            state: ValueState::Concrete(t.clone()),
            origin: Origin::Captured(loc.cloned()),
            handle: Weak::new(),
        });
        self.captured.insert(key, value);
        Ok(value)
    }

    /// The node of `value` in the current segment, adding a bound input for a concrete value.
    fn node_for(&mut self, value: ValueId, op: &str, loc: Option<&SourceLoc>) -> Result<NodeId> {
        let v = &self.values[value];
        match v.state {
            ValueState::Pending(node) => Ok(node),
            ValueState::Concrete(_) => {
                if let Some(&node) = self.segment.input_nodes.get(&value) {
                    return Ok(node);
                }
                let node = self.segment.graph.input(v.dtype, v.shape.clone());
                self.segment.input_nodes.insert(value, node);
                self.segment.bindings.push(value);
                Ok(node)
            }
            ValueState::Dropped => Err(Error::StaleTrace { op: op.to_string(), loc: loc.cloned() }),
        }
    }

    fn concrete(&self, value: ValueId) -> Result<Tensor> {
        match &self.values[value].state {
            ValueState::Concrete(t) => Ok(t.clone()),
            ValueState::Pending(_) | ValueState::Dropped => {
                Err(Error::StaleTrace { op: format!("value {value} of the trace"), loc: None })
            }
        }
    }

    /// Whether gradients flow into `value` from outside the current segment: a concrete tensor
    /// that requires grad or was computed from one.
    pub(super) fn needs_grad(&self, value: ValueId) -> bool {
        matches!(&self.values[value].state, ValueState::Concrete(t) if t.needs_grad())
    }

    pub(super) fn host_of(&self, value: ValueId, op: &str, loc: &SourceLoc) -> Result<Arc<HostTensor>> {
        self.concrete(value)?
            .read_host(op)?
            .ok_or_else(|| Error::StaleTrace { op: op.to_string(), loc: Some(loc.clone()) })
    }

    /// A break at `op` that needs `reads` on the host.
    pub(super) fn graph_break(&mut self, kind: BreakKind, op: &str, loc: &SourceLoc, reads: &[ValueId]) -> Result<()> {
        self.check_aborted()?;
        let found = GraphBreak::new(kind, op, loc.clone());
        if self.config.strict {
            tracing::debug!(
                target: targets::BREAKS,
                "graph break in `{}` (fullgraph: tracing stops): {found}",
                self.config.function
            );
            let error = found.to_error();
            self.aborted = Some(found);
            return Err(error);
        }
        if !self.config.replay {
            tracing::debug!(target: targets::BREAKS, "graph break in `{}`: {found}", self.config.function);
        }
        self.breaks.push(found);
        if reads.iter().any(|&v| matches!(self.values[v].state, ValueState::Pending(_))) {
            self.flush()?;
        }
        Ok(())
    }

    /// Runs the current segment with its live pending values as outputs; they become concrete.
    fn flush(&mut self) -> Result<()> {
        let pending = std::mem::take(&mut self.segment.pending);
        let mut live = Vec::new();
        let mut nodes = Vec::new();
        for value in pending {
            let v = &mut self.values[value];
            match v.state {
                ValueState::Pending(node) if v.handle.strong_count() > 0 => {
                    live.push(value);
                    nodes.push(node);
                }
                _ => v.state = ValueState::Dropped,
            }
        }
        if live.is_empty() {
            self.segment = Segment::default();
            return Ok(());
        }
        let results = self.run_segment(nodes)?;
        for (value, tensor) in live.into_iter().zip(results) {
            self.values[value].state = ValueState::Concrete(tensor);
        }
        Ok(())
    }

    /// Compiles (or reuses, by structure) and runs the current segment with `outputs`, and starts
    /// a new segment.
    fn run_segment(&mut self, outputs: Vec<NodeId>) -> Result<Vec<Tensor>> {
        let mut segment = std::mem::take(&mut self.segment);
        for value in segment.pending.drain(..) {
            if !matches!(self.values[value].state, ValueState::Concrete(_)) {
                self.values[value].state = ValueState::Dropped;
            }
        }
        segment.graph.set_outputs(outputs);
        prune_dead(&mut segment.graph);
        let inputs = segment.bindings.iter().map(|&v| self.concrete(v)).collect::<Result<Vec<_>>>()?;
        let (exe, compiled) =
            self.config.graphs.get_or_compile(&segment.graph, self.config.target, &self.config.function)?;
        if compiled && self.config.replay {
            // A replay meets a structure its first trace did not: usually a host value baked
            // into the graph (a float computed from a read) that differs from call to call.
            tracing::debug!(
                target: targets::RECOMPILES,
                "`{}`: compiling graph {} again with a new structure (a host value baked into it changed?)",
                self.config.function,
                self.runs.len()
            );
        }
        let name = format!("graph {} of `{}`", self.runs.len(), self.config.function);
        let results = exe.run(&inputs).map_err(|e| with_context(e, &format!("running {name}")))?;
        let graph = Arc::new(segment.graph);
        let site = GraphSite {
            graph: graph.clone(),
            stopped: Arc::new(segment.stopped),
            target: self.config.target,
            cache: self.config.graphs.clone(),
            name,
        };
        crate::autograd::compiled::record(site, &inputs, &results);
        self.runs.push(GraphRun { graph, exe });
        Ok(results)
    }

    /// The current segment as the whole graph with `returned` as outputs, then the gradients and
    /// assigned values to write back.
    pub(super) fn whole_graph(&mut self, returned: &[Tensor]) -> Result<WholeGraph> {
        let mut nodes = Vec::with_capacity(returned.len());
        for t in returned {
            let value = self.value_of(t, "return", None)?;
            nodes.push(self.node_for(value, "return", None)?);
        }
        let mut effects = Vec::with_capacity(self.grads.len());
        for slot in std::mem::take(&mut self.grads) {
            let output = match &slot.current {
                Some(grad) => {
                    let value = self.value_of(grad, "grad", None)?;
                    nodes.push(self.node_for(value, "grad", None)?);
                    Some(nodes.len() - 1)
                }
                None => None,
            };
            effects.push(GradEffect { param: slot.param, output, entry: slot.entry });
        }
        let mut assigns = Vec::with_capacity(self.assigns.len());
        for (target, value) in std::mem::take(&mut self.assigns) {
            let v = self.value_of(&value, "assign", None)?;
            nodes.push(self.node_for(v, "assign", None)?);
            assigns.push((target, nodes.len() - 1));
        }
        let mut segment = std::mem::take(&mut self.segment);
        segment.graph.set_outputs(nodes);
        prune_dead(&mut segment.graph);
        let bindings = segment.bindings.iter().map(|&v| self.binding(v)).collect::<Result<Vec<_>>>()?;
        Ok(WholeGraph {
            graph: segment.graph,
            bindings,
            writes: WriteBacks { grads: effects, assigns },
            stopped: Arc::new(segment.stopped),
        })
    }

    /// Runs the last segment for the returned values still pending and collects the results.
    pub(super) fn finish_split(mut self, returned: &[Tensor]) -> Result<SplitRun> {
        let grads = std::mem::take(&mut self.grads);
        let grad_values = grads
            .iter()
            .map(|slot| slot.current.as_ref().map(|g| self.value_of(g, "grad", None)).transpose())
            .collect::<Result<Vec<Option<ValueId>>>>()?;
        let assigns = std::mem::take(&mut self.assigns);
        let mut values = returned.iter().map(|t| self.value_of(t, "return", None)).collect::<Result<Vec<ValueId>>>()?;
        let returned_count = values.len();
        values.extend(grad_values.iter().flatten());
        for (_, value) in &assigns {
            values.push(self.value_of(value, "assign", None)?);
        }
        let mut pending_returned: Vec<ValueId> = Vec::new();
        let mut nodes = Vec::new();
        for &v in &values {
            if let ValueState::Pending(node) = self.values[v].state {
                if !pending_returned.contains(&v) {
                    pending_returned.push(v);
                    nodes.push(node);
                }
            }
        }
        if !nodes.is_empty() {
            let results = self.run_segment(nodes)?;
            for (value, tensor) in pending_returned.into_iter().zip(results) {
                self.values[value].state = ValueState::Concrete(tensor);
            }
        }
        let mut outputs = values.iter().map(|&v| self.concrete(v)).collect::<Result<Vec<_>>>()?;
        let mut written = outputs.split_off(returned_count).into_iter();
        for (slot, value) in grads.iter().zip(&grad_values) {
            let grad = value.and_then(|_| written.next());
            slot.param.inner.autograd.set_grad(grad);
        }
        for ((target, _), new_data) in assigns.iter().zip(written) {
            target.replace_storage(new_data.storage().clone(), crate::tensor::caller())?;
        }
        Ok(SplitRun { outputs, runs: self.runs, breaks: self.breaks })
    }

    fn binding(&self, value: ValueId) -> Result<Binding> {
        let v = &self.values[value];
        let first_use = match &v.origin {
            Origin::Arg(i) => return Ok(Binding::Arg(*i)),
            Origin::GradOf(param) => return Ok(Binding::GradOf { param: param.clone() }),
            Origin::Captured(first_use) => first_use.clone(),
            Origin::Computed => None,
        };
        let tensor = self.concrete(value)?;
        Ok(Binding::Captured { traced_as: TensorSig::of(&tensor), tensor, first_use })
    }
}

/// Removes nodes nothing reads (inputs stay: they are the signature).
fn prune_dead(graph: &mut Graph) {
    for id in graph.topo_order().into_iter().rev() {
        if graph.use_count(id) == 0 && !matches!(graph.node(id).op, Op::Input { .. }) {
            // Cannot fail: the node is unused and not an input.
            let _ = graph.remove(id);
        }
    }
}
