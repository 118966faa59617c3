//! The eager tape and the backward engine. Each eager op on tensors that need gradients keeps its
//! one-op graph and operands on its result; each compiled graph whose outputs need gradients keeps
//! a [`CompiledNode`] on them (`compiled.rs`); host code on such tensors marks its results opaque.
//!
//! `backward` joins the op entries reachable from the root into one graph and appends its
//! backward with `braze_autodiff`, stopping at leaves and at compiled outputs. The gradients that
//! reach compiled outputs wait until every contribution to that node has arrived; the nodes then
//! run their compiled backwards, latest first (a node's inputs were computed before it), each
//! continuing through the op entries below it in the same way.

use crate::backend::{self, Target};
use crate::mode::Mode;
use crate::tensor::{CompiledNode, TapeEntry, TensorInner};
use crate::{Error, Result, Tensor};
use braze_ir::{Graph, NodeId, Op, SourceLoc};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Records `result` as computed by `graph` from `operands` when gradients are on and one of
/// the operands needs a gradient.
pub(crate) fn record(result: &Tensor, graph: &Graph, operands: &[&Tensor]) {
    if !super::is_grad_enabled() || !result.dtype().is_float() || !operands.iter().any(|t| t.needs_grad()) {
        return;
    }
    let entry =
        TapeEntry::Op { graph: Arc::new(graph.clone()), operands: operands.iter().map(|t| (*t).clone()).collect() };
    // A fresh result has no tape yet; `set` cannot fail.
    let _ = result.inner.autograd.tape.set(Arc::new(entry));
}

/// Marks the float `outputs` of host code `op` (called at `loc`) as opaque to gradients when
/// gradients are on and one of its inputs needed a gradient.
pub(crate) fn record_opaque(outputs: &[Tensor], inputs_need_grad: bool, op: &str, loc: &SourceLoc) {
    if !super::is_grad_enabled() || !inputs_need_grad {
        return;
    }
    for t in outputs.iter().filter(|t| t.dtype().is_float()) {
        let _ = t.inner.autograd.tape.set(Arc::new(TapeEntry::Opaque { op: op.to_string(), loc: loc.clone() }));
    }
}

/// The gradient flowing into a root of a backward.
pub(crate) enum Seed {
    /// 1, for a one-element root.
    One,
    Given(Tensor),
}

fn key(t: &Tensor) -> *const TensorInner {
    Arc::as_ptr(&t.inner)
}

/// Copies `part`'s nodes into `g`, its input `i` read from `inputs[i]`; returns its output.
fn splice(g: &mut Graph, part: &Graph, inputs: &[NodeId]) -> braze_ir::Result<NodeId> {
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    for id in part.topo_order() {
        let node = part.node(id);
        let new = match node.op {
            Op::Input { index } => inputs[index],
            _ => {
                let operands: Vec<NodeId> = node.operands.iter().map(|o| map[o]).collect();
                g.add_declared(node.op.clone(), &operands, node.dtype, node.shape.clone(), node.loc.clone())?
            }
        };
        map.insert(id, new);
    }
    Ok(map[&part.outputs()[0]])
}

/// Accumulates the gradients of `root` (seeded with `seed`, or 1 for a one-element root) into
/// every leaf it depends on that requires grad.
pub(crate) fn backward(root: &Tensor, seed: Option<&Tensor>, loc: SourceLoc) -> Result<()> {
    let op = "backward";
    if !root.needs_grad() {
        return Err(Error::invalid(
            op,
            &loc,
            "this tensor does not need a gradient: no tensor it was computed from requires grad \
             (call set_requires_grad(true) on the weights first)",
        ));
    }
    let seed = match seed {
        Some(s) => Seed::Given(s.clone()),
        None if root.numel() == 1 => Seed::One,
        None => {
            return Err(Error::invalid(
                op,
                &loc,
                format!(
                    "a gradient can be seeded implicitly only for a one-element result, this one is {}{}; \
                     use backward_with(grad)",
                    root.dtype(),
                    root.shape()
                ),
            ))
        }
    };
    let grads = leaf_gradients(vec![(root.clone(), seed)], &loc)?;
    super::no_grad(|| grads.into_iter().try_for_each(|(leaf, grad)| accumulate(&leaf, grad)))
}

/// A compiled node some gradient reached, and the contributions to each of its outputs so far.
struct Pending {
    node: Arc<CompiledNode>,
    grads: Vec<Vec<Tensor>>,
}

/// The gradients flowing from `roots` into every leaf that requires grad, one pair per
/// contribution (a leaf may appear more than once). Runs graphs only, no ops: it also serves
/// `backward()` inside a compiled function, where ops would record into the trace.
pub(crate) fn leaf_gradients(roots: Vec<(Tensor, Seed)>, loc: &SourceLoc) -> Result<Vec<(Tensor, Tensor)>> {
    let mut pending: BTreeMap<u64, Pending> = BTreeMap::new();
    let mut leaves = Vec::new();
    through_ops(roots, &mut pending, &mut leaves, loc)?;
    while let Some((_, Pending { node, grads })) = pending.pop_last() {
        let outputs = grads.into_iter().map(|parts| sum(parts, loc)).collect::<Result<Vec<_>>>()?;
        let input_grads = (node.backward)(&outputs, loc)?;
        let roots =
            node.inputs.iter().zip(input_grads).filter_map(|(t, g)| g.map(|g| (t.clone(), Seed::Given(g)))).collect();
        through_ops(roots, &mut pending, &mut leaves, loc)?;
    }
    Ok(leaves)
}

/// Backpropagates `roots` through the op entries below them in one joined graph, up to leaves
/// (their gradients go to `leaves`) and compiled outputs (theirs to `pending`).
fn through_ops(
    roots: Vec<(Tensor, Seed)>,
    pending: &mut BTreeMap<u64, Pending>,
    leaves: &mut Vec<(Tensor, Tensor)>,
    loc: &SourceLoc,
) -> Result<()> {
    let op = "backward";
    let Some(device) = roots.first().map(|(t, _)| t.device()) else { return Ok(()) };
    let mut g = Graph::new();
    let mut node_of: HashMap<*const TensorInner, NodeId> = HashMap::new();
    let mut inputs: Vec<Tensor> = Vec::new();
    // Graph inputs gradients are asked for: leaves that require grad, compiled and opaque results.
    let mut stops: Vec<(NodeId, Tensor)> = Vec::new();
    // Post-order without recursion: a chain of thousands of ops must not overflow the stack.
    let mut stack: Vec<(Tensor, bool)> = roots.iter().rev().map(|(t, _)| (t.clone(), false)).collect();
    while let Some((t, expanded)) = stack.pop() {
        if node_of.contains_key(&key(&t)) {
            continue;
        }
        match t.inner.autograd.tape.get().map(|e| &**e) {
            Some(TapeEntry::Op { operands, .. }) if !expanded => {
                stack.push((t.clone(), true));
                for o in operands.iter().rev() {
                    if !node_of.contains_key(&key(o)) {
                        stack.push((o.clone(), false));
                    }
                }
            }
            Some(TapeEntry::Op { graph, operands }) => {
                let ids: Vec<NodeId> = operands.iter().map(|o| node_of[&key(o)]).collect();
                let id = splice(&mut g, graph, &ids).map_err(|ir| Error::ir(op, loc, ir))?;
                node_of.insert(key(&t), id);
            }
            entry => {
                let id = g.input(t.dtype(), t.shape());
                inputs.push(t.clone());
                if entry.is_some() || t.inner.autograd.requires_grad() {
                    stops.push((id, t.clone()));
                }
                node_of.insert(key(&t), id);
            }
        }
    }
    let mut seeds = Vec::with_capacity(roots.len());
    for (root, seed) in &roots {
        let seed_id = match seed {
            Seed::One => g.constant(1.0, root.dtype()),
            Seed::Given(s) => {
                inputs.push(s.clone());
                g.input(s.dtype(), s.shape())
            }
        };
        seeds.push((node_of[&key(root)], seed_id));
    }
    let wrt: Vec<NodeId> = stops.iter().map(|(id, _)| *id).collect();
    let grads = braze_autodiff::backward(&mut g, &seeds, &wrt).map_err(|e| Error::Gradient {
        op: op.into(),
        loc: Some(loc.clone()),
        autodiff: Box::new(e),
    })?;
    let mut outputs = Vec::new();
    let mut receivers = Vec::new();
    for ((_, stop), grad) in stops.iter().zip(grads) {
        let Some(grad) = grad else { continue };
        if let Some(TapeEntry::Opaque { op: host_op, loc: at }) = stop.inner.autograd.tape.get().map(|e| &**e) {
            return Err(Error::invalid(
                op,
                loc,
                format!(
                    "the gradient would flow through `{host_op}` at {at}, host code that has no derivative; \
                     detach its inputs, or write it with braze ops (CustomOp::traceable)"
                ),
            ));
        }
        outputs.push(grad);
        receivers.push(stop.clone());
    }
    if outputs.is_empty() {
        return Ok(());
    }
    g.set_outputs(outputs);
    let target = Target { device, mode: Mode::Default };
    let results = backend::compile_graph(&g, target)?.run(&inputs)?;
    for (stop, grad) in receivers.into_iter().zip(results) {
        match stop.inner.autograd.tape.get().map(|e| &**e) {
            Some(TapeEntry::Compiled { node, output }) => {
                let slot = pending
                    .entry(node.seq)
                    .or_insert_with(|| Pending { node: node.clone(), grads: vec![Vec::new(); node.outputs] });
                slot.grads[*output].push(grad);
            }
            _ => leaves.push((stop, grad)),
        }
    }
    Ok(())
}

/// The sum of `parts` (`None` when there are none), as one graph.
fn sum(parts: Vec<Tensor>, loc: &SourceLoc) -> Result<Option<Tensor>> {
    if parts.len() <= 1 {
        return Ok(parts.into_iter().next());
    }
    let mut g = Graph::new();
    let ids: Vec<NodeId> = parts.iter().map(|p| g.input(p.dtype(), p.shape())).collect();
    let mut total = ids[0];
    for &id in &ids[1..] {
        total = g
            .add(Op::Binary { op: braze_ir::BinaryOp::Add }, &[total, id], Some(loc.clone()))
            .map_err(|ir| Error::ir("backward", loc, ir))?;
    }
    g.set_outputs(vec![total]);
    let target = Target { device: parts[0].device(), mode: Mode::Default };
    Ok(backend::compile_graph(&g, target)?.run(&parts)?.pop())
}

/// Adds `grad` to `leaf`'s gradient (or sets it).
pub(crate) fn accumulate(leaf: &Tensor, grad: Tensor) -> Result<()> {
    let meta = &leaf.inner.autograd;
    let total = match meta.grad() {
        Some(existing) => existing.add(&grad)?,
        None => grad,
    };
    meta.set_grad(Some(total));
    Ok(())
}
