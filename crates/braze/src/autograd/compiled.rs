//! Compiled graphs on the autograd tape. Each compiled graph whose outputs need gradients (a
//! whole compiled function, or one piece of a function split at graph breaks) records one
//! [`CompiledNode`] on its outputs, as torch.compile's AOTAutograd records a `CompiledFunction`
//! node, so the tape chains the pieces' backwards across the breaks.
//!
//! A node's backward is itself a compiled graph: the forward graph with its backward appended by
//! `braze_autodiff` (the rules every other gradient uses), reading the forward's inputs and
//! outputs from what the forward saved and recomputing the other values it needs inside the
//! backward graph, where they fuse with the backward ops (pointwise recomputation is cheaper than
//! writing and reading every activation). Inputs are kept by handle with their version: a
//! backward after one of them was assigned is an error, as PyTorch's saved-tensor check. It is built on the first backward through the node and
//! compiled once per structure through the function's graph cache.

use crate::backend::{GraphCache, Target};
use crate::tensor::{CompiledNode, TapeEntry};
use crate::{Error, Result, Tensor};
use braze_ir::{Graph, NodeId, Op, SourceLoc};
use braze_passes::Pass;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static NEXT_SEQ: AtomicU64 = AtomicU64::new(1);

/// A compiled graph that ran: what its backward is built from.
pub(crate) struct GraphSite {
    pub graph: Arc<Graph>,
    /// Nodes gradients do not flow through (computed under `no_grad`, or detached).
    pub stopped: Arc<HashSet<NodeId>>,
    pub target: Target,
    pub cache: Arc<GraphCache>,
    /// Names the graph in errors and logs, e.g. "graph 1 of `f`".
    pub name: String,
}

/// An input the backward reads: the tensor itself (no copy) and its version when the forward
/// ran, to refuse a backward after its data changed (as PyTorch's saved-tensor version check).
struct Saved {
    tensor: Tensor,
    version: u64,
}

impl Saved {
    fn of(t: &Tensor) -> Saved {
        Saved { tensor: t.clone(), version: t.version() }
    }
}

/// Records a [`CompiledNode`] on each of `outputs` (the graph's first outputs; later ones are
/// write-backs) that depends differentiably on one of `inputs` needing a gradient. Nothing is
/// recorded under `no_grad` or when no input needs a gradient.
pub(crate) fn record(site: GraphSite, inputs: &[Tensor], outputs: &[Tensor]) {
    if !super::is_grad_enabled() {
        return;
    }
    let diff: Vec<usize> =
        (0..inputs.len()).filter(|&i| inputs[i].dtype().is_float() && inputs[i].needs_grad()).collect();
    if diff.is_empty() {
        return;
    }
    let graph = &site.graph;
    let mut flows: HashSet<NodeId> = diff.iter().map(|&i| graph.inputs()[i]).collect();
    for id in graph.topo_order() {
        let node = graph.node(id);
        if node.dtype.is_float() && !site.stopped.contains(&id) && node.operands.iter().any(|o| flows.contains(o)) {
            flows.insert(id);
        }
    }
    let needs: Vec<bool> = graph.outputs().iter().take(outputs.len()).map(|o| flows.contains(o)).collect();
    if !needs.contains(&true) {
        return;
    }
    let saved_inputs: Vec<Saved> = inputs.iter().map(Saved::of).collect();
    let saved_outputs: Vec<Tensor> = outputs.iter().map(Tensor::snapshot).collect();
    let node = Arc::new(CompiledNode {
        seq: NEXT_SEQ.fetch_add(1, Ordering::Relaxed),
        inputs: diff.iter().map(|&i| inputs[i].clone()).collect(),
        outputs: outputs.len(),
        backward: Box::new(move |grads, loc| backward(&site, &diff, &saved_inputs, &saved_outputs, grads, loc)),
    });
    for (output, (t, &needed)) in outputs.iter().zip(&needs).enumerate() {
        // A fresh result has no tape yet; `set` cannot fail.
        if needed && t.dtype().is_float() {
            let _ = t.inner.autograd.tape.set(Arc::new(TapeEntry::Compiled { node: node.clone(), output }));
        }
    }
}

/// The backward of the graph at `site`: the gradients flowing into its outputs (`None` where none
/// does) in, the gradient of each input `diff` names out.
fn backward(
    site: &GraphSite,
    diff: &[usize],
    saved_inputs: &[Saved],
    saved_outputs: &[Tensor],
    grads: &[Option<Tensor>],
    loc: &SourceLoc,
) -> Result<Vec<Option<Tensor>>> {
    let op = "backward";
    if saved_inputs.iter().any(|s| s.tensor.version() != s.version) {
        return Err(Error::invalid(
            op,
            loc,
            format!(
                "a tensor that {} read was assigned after it ran, so its backward would see the new \
                 values; call backward() before updating it",
                site.name
            ),
        ));
    }
    let mut g = (*site.graph).clone();
    let forward_inputs = g.inputs().to_vec();
    let forward_outputs = g.outputs().to_vec();
    let mut feed: Vec<Tensor> = saved_inputs.iter().map(|s| s.tensor.clone()).collect();
    let mut seeds = Vec::new();
    for (&value, grad) in forward_outputs.iter().zip(grads) {
        if let Some(grad) = grad {
            seeds.push((value, g.input(grad.dtype(), grad.shape())));
            feed.push(grad.clone());
        }
    }
    if seeds.is_empty() {
        return Ok(vec![None; diff.len()]);
    }
    let wrt: Vec<NodeId> = diff.iter().map(|&i| forward_inputs[i]).collect();
    let input_grads = braze_autodiff::backward_stopping(&mut g, &seeds, &wrt, &site.stopped)
        .map_err(|e| Error::Gradient { op: op.into(), loc: Some(loc.clone()), autodiff: Box::new(e) })?;
    // The forward's outputs are read from what it saved instead of being computed again.
    let mut replaced = HashSet::new();
    for (&value, data) in forward_outputs.iter().zip(saved_outputs) {
        if matches!(g.node(value).op, Op::Input { .. }) || !replaced.insert(value) {
            continue;
        }
        let saved = g.input(data.dtype(), data.shape());
        g.replace_all_uses(value, saved);
        feed.push(data.clone());
    }
    let outputs: Vec<NodeId> = input_grads.iter().flatten().copied().collect();
    if outputs.is_empty() {
        return Ok(vec![None; diff.len()]);
    }
    g.set_outputs(outputs);
    braze_passes::DeadCode
        .run(&mut g)
        .map_err(|e| Error::Compile { context: format!("backward of {}", site.name), passes: Box::new(e) })?;
    let (exe, _) = site.cache.get_or_compile(&g, site.target, &site.name)?;
    let context = format!("running the backward of {}", site.name);
    let mut results = exe.run(&feed).map_err(|e| crate::trace::with_context(e, &context))?.into_iter();
    Ok(input_grads.iter().map(|g| g.and_then(|_| results.next())).collect())
}
