//! braze-autodiff: reverse-mode differentiation of IR graphs.
//!
//! [`backward`] appends the backward ops of a graph to the graph itself, so forward and backward
//! form one joint graph that the passes optimize and fuse together (what AOTAutograd gives
//! torch.compile). Elementwise ops are differentiated by the derivative formulas of their entries
//! in the op table (`braze_ir::elementwise`); every other op has its rule in [`rules`], one match
//! arm per op, so a new op without a rule does not compile.
//!
//! **Invariant:** only appends nodes (the forward graph is never changed), gives every gradient
//! the dtype and shape of its value, and reduces a broadcast operand's gradient back to the
//! operand's shape.

mod accumulate;
mod builder;
mod error;
mod rules;

pub use error::{AutodiffError, Result};

use braze_ir::{Graph, NodeId};
use builder::Emit;
use std::collections::{HashMap, HashSet};

/// Appends to `g` the gradients of the `seeds` (pairs of a value and the gradient flowing into
/// it, of the value's dtype and broadcastable to its shape) with respect to each of `wrt`.
/// Returns one gradient per `wrt` node: `None` where no differentiable path connects it to a
/// seed. Integer and bool values get no gradient; asking for one is an error.
pub fn backward(g: &mut Graph, seeds: &[(NodeId, NodeId)], wrt: &[NodeId]) -> Result<Vec<Option<NodeId>>> {
    backward_stopping(g, seeds, wrt, &HashSet::new())
}

/// [`backward`], with no gradient flowing through the `stopped` nodes into their operands (values
/// computed under `no_grad` or detached).
pub fn backward_stopping(
    g: &mut Graph,
    seeds: &[(NodeId, NodeId)],
    wrt: &[NodeId],
    stopped: &HashSet<NodeId>,
) -> Result<Vec<Option<NodeId>>> {
    for &w in wrt {
        let node = g.node(w);
        if !node.dtype.is_float() {
            return Err(AutodiffError::NotFloat { node: w.to_string(), op: node.op.name(), dtype: node.dtype });
        }
    }
    for &(value, grad) in seeds {
        let (v, s) = (g.node(value), g.node(grad));
        if v.dtype != s.dtype || !s.shape.broadcasts_to(&v.shape) {
            return Err(AutodiffError::Seed {
                value: value.to_string(),
                expected: format!("{}{}", v.dtype, v.shape),
                actual: format!("{}{}", s.dtype, s.shape),
            });
        }
    }
    let order = g.topo_order();
    let mut relevant = relevant_nodes(g, &order, seeds, wrt);
    relevant.retain(|id| !stopped.contains(id) || wrt.contains(id));
    // Every node's gradient contributions, summed when the node's turn comes (all its users
    // come before it in reverse order).
    let mut contributions: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    for &(value, grad) in seeds {
        let shape = g.node(value).shape.clone();
        let mut emit = Emit::new(g, value);
        let grad = emit.broadcast(grad, &shape)?;
        contributions.entry(value).or_default().push(grad);
    }
    let mut grads: HashMap<NodeId, NodeId> = HashMap::new();
    for &id in order.iter().rev() {
        if !relevant.contains(&id) {
            continue;
        }
        let Some(parts) = contributions.remove(&id) else { continue };
        let mut emit = Emit::new(g, id);
        let grad = accumulate::sum(&mut emit, &parts)?;
        grads.insert(id, grad);
        for (operand, operand_grad) in rules::operand_grads(&mut emit, id, grad)? {
            if relevant.contains(&operand) && emit.graph().node(operand).dtype.is_float() {
                contributions.entry(operand).or_default().push(operand_grad);
            }
        }
    }
    Ok(wrt.iter().map(|w| grads.get(w).copied()).collect())
}

/// Nodes on a path from a `wrt` node to a seed: the only ones whose gradients are needed.
fn relevant_nodes(g: &Graph, order: &[NodeId], seeds: &[(NodeId, NodeId)], wrt: &[NodeId]) -> HashSet<NodeId> {
    let mut from_wrt: HashSet<NodeId> = wrt.iter().copied().collect();
    for &id in order {
        if g.node(id).operands.iter().any(|o| from_wrt.contains(o)) {
            from_wrt.insert(id);
        }
    }
    let mut to_seed: HashSet<NodeId> = seeds.iter().map(|s| s.0).collect();
    for &id in order.iter().rev() {
        if to_seed.contains(&id) {
            to_seed.extend(g.node(id).operands.iter().copied());
        }
    }
    from_wrt.intersection(&to_seed).copied().collect()
}
