//! The eager tape: each op on tensors that need gradients keeps its one-op graph and operands on
//! its result; `backward` joins the entries reachable from a result into one graph, appends the
//! backward with `braze_autodiff` and runs it.

use crate::backend::{self, Target};
use crate::mode::Mode;
use crate::tensor::{TapeEntry, TensorInner};
use crate::{Error, Result, Tensor};
use braze_ir::{Graph, NodeId, Op, SourceLoc};
use std::collections::HashMap;
use std::sync::Arc;

/// Records `result` as computed by `graph` from `operands` when gradients are on and one of
/// the operands needs a gradient.
pub(crate) fn record(result: &Tensor, graph: &Graph, operands: &[&Tensor]) {
    if !super::is_grad_enabled() || !result.dtype().is_float() || !operands.iter().any(|t| t.needs_grad()) {
        return;
    }
    let entry = TapeEntry { graph: Arc::new(graph.clone()), operands: operands.iter().map(|t| (*t).clone()).collect() };
    // A fresh result has no tape yet; `set` cannot fail.
    let _ = result.inner.autograd.tape.set(Arc::new(entry));
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
    let mut g = Graph::new();
    let mut node_of: HashMap<*const TensorInner, NodeId> = HashMap::new();
    let mut inputs: Vec<Tensor> = Vec::new();
    let mut leaves: Vec<(NodeId, Tensor)> = Vec::new();
    // Post-order without recursion: a chain of thousands of ops must not overflow the stack.
    let mut stack: Vec<(Tensor, bool)> = vec![(root.clone(), false)];
    while let Some((t, expanded)) = stack.pop() {
        if node_of.contains_key(&key(&t)) {
            continue;
        }
        match t.inner.autograd.tape.get() {
            Some(entry) if !expanded => {
                stack.push((t.clone(), true));
                for o in entry.operands.iter().rev() {
                    if !node_of.contains_key(&key(o)) {
                        stack.push((o.clone(), false));
                    }
                }
            }
            Some(entry) => {
                let ids: Vec<NodeId> = entry.operands.iter().map(|o| node_of[&key(o)]).collect();
                let id = splice(&mut g, &entry.graph, &ids).map_err(|ir| Error::ir(op, &loc, ir))?;
                node_of.insert(key(&t), id);
            }
            None => {
                let id = g.input(t.dtype(), t.shape());
                inputs.push(t.clone());
                if t.inner.autograd.requires_grad() {
                    leaves.push((id, t.clone()));
                }
                node_of.insert(key(&t), id);
            }
        }
    }
    let root_id = node_of[&key(root)];
    let seed_id = match seed {
        Some(s) => {
            inputs.push(s.clone());
            g.input(s.dtype(), s.shape())
        }
        None if root.numel() == 1 => g.constant(1.0, root.dtype()),
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
    let wrt: Vec<NodeId> = leaves.iter().map(|(id, _)| *id).collect();
    let grads = braze_autodiff::backward(&mut g, &[(root_id, seed_id)], &wrt).map_err(|e| Error::Gradient {
        op: op.into(),
        loc: Some(loc.clone()),
        autodiff: Box::new(e),
    })?;
    let mut outputs = Vec::new();
    let mut receivers = Vec::new();
    for ((_, leaf), grad) in leaves.iter().zip(grads) {
        if let Some(grad) = grad {
            outputs.push(grad);
            receivers.push(leaf.clone());
        }
    }
    if outputs.is_empty() {
        return Ok(());
    }
    g.set_outputs(outputs);
    let target = Target { device: root.device(), mode: Mode::Default };
    let results = backend::compile_graph(&g, target)?.run(&inputs)?;
    super::no_grad(|| {
        for (leaf, grad) in receivers.iter().zip(results) {
            accumulate(leaf, grad)?;
        }
        Ok(())
    })
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
