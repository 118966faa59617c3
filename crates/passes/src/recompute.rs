//! Recomputing cheap forward values in the backward, the idea of AOTAutograd's min-cut
//! partitioner: in a joint forward and backward graph, a value the backward reads after the gap
//! (past a backward matmul, so never in the kernel that computes it) need not be held from the
//! forward when the backward can compute it again, through elementwise ops and views, from values
//! that are fewer bytes to hold: values the backward holds anyway (`gelu(h)` from `h`, which the
//! GELU gradient reads), values much smaller than it (a row's mean and scale), or a narrower
//! value behind it (a layer norm's f32 normalized input from the bf16 `x + y` it normalizes). The
//! forward's value then dies at its last forward reader, and the backward's copy joins the
//! backward's elementwise and row kernels.
//!
//! Backward values computed from forward values alone (the normalized input in a gradient
//! formula) count as forward ones: fusion would compute them beside the forward and hold them.
//! Copies carry the recomputed mark ([`braze_ir::SourceLoc::recomputed`]), which keeps them out of
//! the forward's kernels.
//!
//! A value the backward reads only as a matmul operand is recomputed only where the backward
//! reads its operand elementwise too (the copy joins that kernel as a second output); else the
//! copy would be a kernel of its own.
//!
//! Integer and bool elementwise values (index arithmetic, random bits, masks) are recomputed the
//! same way, with the whole chain of such values behind them, where that chain starts from graph
//! inputs and constants only: a dropout's mask is drawn again from its counter in the backward
//! instead of being stored between the passes.
//!
//! Forward and backward are told apart by the backward mark autodiff puts on the source
//! locations of the ops it appends ([`braze_ir::SourceLoc::backward`]); a graph without marked
//! ops is left alone. Runs once, after common subexpressions (which would merge the copy back).

use crate::pass::Pass;
use crate::Result;
use braze_ir::{Graph, NodeId, Op};
use std::collections::HashMap;

pub struct Recompute;

impl Pass for Recompute {
    fn name(&self) -> &'static str {
        "recompute"
    }

    fn run(&self, g: &mut Graph) -> Result<bool> {
        let is_backward = |g: &Graph, id: NodeId| g.node(id).loc.as_ref().is_some_and(|loc| loc.backward);
        let order = g.topo_order();
        // Backward values that read no backward matmul's result (a layer norm's normalized input
        // in its gradient formula): fusion computes them beside the forward values they read,
        // before the gap, so they are held like forward values.
        let mut pre_gap: HashMap<NodeId, bool> = HashMap::new();
        for &id in &order {
            let node = g.node(id);
            let before = !is_backward(g, id)
                || (!matches!(node.op, Op::MatMul) && node.operands.iter().all(|o| pre_gap.get(o) == Some(&true)));
            pre_gap.insert(id, before);
        }
        // Whether each op reads its operands after the gap (a backward op past a backward
        // matmul; a view where its readers do), and whether the backward needs its value after
        // the gap (read there, or through backward ops before it that are: an activation's
        // gradient of the forward's `h`, which fusion computes beside the gradient it
        // multiplies). Recomputed copies, added below, read after the gap.
        let mut reads_after: HashMap<NodeId, bool> = HashMap::new();
        let mut needed: HashMap<NodeId, bool> = HashMap::new();
        for &id in order.iter().rev() {
            let node = g.node(id);
            let users = g.users(id);
            let reads = if node.op.is_view() {
                users.iter().any(|u| reads_after[u])
            } else {
                is_backward(g, id) && !pre_gap[&id]
            };
            let backward = is_backward(g, id);
            needed.insert(id, reads || (backward && users.iter().any(|u| needed[u])));
            reads_after.insert(id, reads);
        }
        let recomputed = |g: &Graph, u: NodeId| g.node(u).loc.as_ref().is_some_and(|loc| loc.recomputed);
        let after_gap = |g: &Graph, u: NodeId| reads_after.get(&u).copied().unwrap_or(false) || recomputed(g, u);
        let early = |g: &Graph, x: NodeId| pre_gap.get(&x) == Some(&true) && !g.is_output(x);
        // The backward's copy of each recomputed value: a chain of activations is recomputed
        // from the first operand the backward holds.
        let mut copies: HashMap<NodeId, NodeId> = HashMap::new();
        for id in order {
            let node = g.node(id);
            if is_index_or_mask(g, id) && !is_backward(g, id) && !g.is_output(id) {
                let backward: Vec<NodeId> = g.users(id).into_iter().filter(|&u| is_backward(g, u)).collect();
                let forward_reads = g.users(id).iter().any(|&u| !is_backward(g, u));
                if !backward.is_empty() && forward_reads && from_inputs(g, id, &is_backward) {
                    let copy = copy_chain(g, id, &mut copies)?;
                    for user in backward {
                        g.replace_uses_in(user, id, copy);
                    }
                }
                continue;
            }
            if !node.dtype.is_float() || !is_elementwise(g, id) || !early(g, id) {
                continue;
            }
            let backward: Vec<NodeId> = g.users(id).into_iter().filter(|&u| after_gap(g, u)).collect();
            if backward.is_empty() {
                continue;
            }
            // Held for the backward anyway, by readers other than the value itself.
            let held = |g: &Graph, x: NodeId| {
                copies.contains_key(&x)
                    || matches!(g.node(x).op, Op::Input { .. } | Op::Constant { .. } | Op::Arange)
                    || g.is_output(x)
                    || g.users(x).iter().any(|&u| u != id && (needed.get(&u) == Some(&true) || recomputed(g, u)))
            };
            let Some((leaves, chain)) = recompute_leaves(g, id, &held, &early) else { continue };
            // Recomputing holds the leaves the backward did not read yet instead of the value:
            // worth it only when they are fewer bytes (`x + y` in bf16 behind a layer norm's f32
            // normalized value; an activation's operand that the backward reads anyway).
            let newly_held: usize = leaves.iter().filter(|&&x| !held(g, x)).map(|&x| bytes(g, x)).sum();
            if newly_held >= bytes(g, id) {
                continue;
            }
            // A copy read only by matmuls is a kernel of its own unless the backward reads an
            // operand elementwise too: then fusion puts the copy in that kernel as a second output.
            let sibling = node.operands.iter().any(|&o| {
                let source = copies.get(&o).copied().unwrap_or(o);
                g.users(source).iter().any(|&u| u != id && is_backward(g, u) && is_elementwise(g, u))
            });
            if backward.iter().all(|&u| feeds_matmuls(g, u)) && !sibling {
                continue;
            }
            // Only across a gap: where the backward reads the value only after a matmul that
            // follows it (a later layer's), else the backward's reader may share the forward's
            // kernel (the last layer norm's backward beside the loss) and nothing is held.
            if !backward.iter().all(|&u| follows_through_matmul(g, &chain, u)) {
                continue;
            }
            // A copy for each reader, so that each fuses it into its own kernel (a layer norm's
            // gradient row kernel and its weight's column kernel) instead of one storing it for
            // the other.
            for user in backward {
                let mut own = HashMap::new();
                let copy = copy_float_chain(g, id, &leaves, &mut own)?;
                g.replace_uses_in(user, id, copy);
                for (original, copied) in own {
                    copies.entry(original).or_insert(copied);
                }
            }
        }
        Ok(!copies.is_empty())
    }
}

/// Whether `id` is a matmul, or a view that only matmuls read: a recomputed copy read only there
/// would be a kernel of its own (a matmul fuses no elementwise prologue), one more launch and pass
/// over its operand, so the forward's value is held instead (an autocast region's bf16 copy of a
/// weight, which the backward reads transposed).
fn feeds_matmuls(g: &Graph, id: NodeId) -> bool {
    match g.node(id).op {
        Op::MatMul => true,
        Op::Permute { .. } | Op::Reshape => !g.is_output(id) && g.users(id).into_iter().all(|u| feeds_matmuls(g, u)),
        _ => false,
    }
}

/// An elementwise op of its operands' shape, which a pointwise kernel holds.
fn is_elementwise(g: &Graph, id: NodeId) -> bool {
    let op = &g.node(id).op;
    op.is_elementwise() && !matches!(op, Op::Constant { .. })
}

/// Forward elementwise ops and views behind a value that [`Recompute`] would walk at most.
const MAX_RECOMPUTED_OPS: usize = 24;

/// The values a backward copy of `id` would be computed from: walking back through forward
/// elementwise ops and views of `id`, stopping at values held for the backward anyway, at values
/// much smaller than `id` (a row's mean or scale), and at any other op (a reduction, a matmul).
/// `None` when the chain is longer than [`MAX_RECOMPUTED_OPS`].
fn recompute_leaves(
    g: &Graph,
    id: NodeId,
    held: &impl Fn(&Graph, NodeId) -> bool,
    early: &impl Fn(&Graph, NodeId) -> bool,
) -> Option<(Vec<NodeId>, Vec<NodeId>)> {
    let numel = g.node(id).shape.numel();
    let mut leaves = Vec::new();
    let mut walked = vec![id];
    let mut stack: Vec<NodeId> = g.node(id).operands.clone();
    while let Some(x) = stack.pop() {
        if walked.contains(&x) || leaves.contains(&x) {
            continue;
        }
        let node = g.node(x);
        let small = node.shape.numel().saturating_mul(8) <= numel;
        // A matmul's result with its epilogue (`+ bias`) is held as the matmul kernel stores it:
        // reading the bare product in the backward would leave the epilogue a kernel of its own.
        let on_matmul = node.operands.iter().any(|&o| matches!(g.node(o).op, Op::MatMul));
        let walkable =
            (is_elementwise(g, x) || matches!(node.op, Op::Reshape | Op::BroadcastTo)) && !on_matmul && early(g, x);
        if held(g, x) || small || !walkable {
            leaves.push(x);
            continue;
        }
        walked.push(x);
        if walked.len() > MAX_RECOMPUTED_OPS {
            return None;
        }
        stack.extend(node.operands.iter().copied());
    }
    Some((leaves, walked))
}

/// Whether `user` depends on one of `chain` through a matmul: then `user` runs in a kernel after
/// that matmul's, never in the kernel computing `chain`.
fn follows_through_matmul(g: &Graph, chain: &[NodeId], user: NodeId) -> bool {
    // A view is read where its readers are (a matmul reading the value transposed).
    if g.node(user).op.is_view() {
        let readers = g.users(user);
        return !readers.is_empty() && readers.iter().all(|&r| follows_through_matmul(g, chain, r));
    }
    // Depth-first over (node, a matmul passed on the way from `user`).
    let mut seen: std::collections::HashSet<(NodeId, bool)> = std::collections::HashSet::new();
    let mut stack: Vec<(NodeId, bool)> = g.node(user).operands.iter().map(|&o| (o, false)).collect();
    while let Some((x, passed)) = stack.pop() {
        if !seen.insert((x, passed)) {
            continue;
        }
        if chain.contains(&x) {
            if passed {
                return true;
            }
            continue;
        }
        let passed = passed || matches!(g.node(x).op, Op::MatMul);
        stack.extend(g.node(x).operands.iter().map(|&o| (o, passed)));
    }
    false
}

fn bytes(g: &Graph, id: NodeId) -> usize {
    let node = g.node(id);
    node.shape.numel() * node.dtype.size_bytes()
}

/// The backward's copy of `id`, copying its chain down to `leaves` (which it reads as they are,
/// or their backward copies).
fn copy_float_chain(
    g: &mut Graph,
    id: NodeId,
    leaves: &[NodeId],
    copies: &mut HashMap<NodeId, NodeId>,
) -> Result<NodeId> {
    if let Some(&copy) = copies.get(&id) {
        return Ok(copy);
    }
    if leaves.contains(&id) {
        return Ok(id);
    }
    let node = g.node(id).clone();
    let sources = node
        .operands
        .iter()
        .map(|&operand| copy_float_chain(g, operand, leaves, copies))
        .collect::<Result<Vec<_>>>()?;
    let loc = node.loc.as_ref().map(|l| l.recomputed_of());
    let copy = g.add_declared(node.op.clone(), &sources, node.dtype, node.shape.clone(), loc)?;
    copies.insert(id, copy);
    Ok(copy)
}

/// A forward integer or bool elementwise value.
fn is_index_or_mask(g: &Graph, id: NodeId) -> bool {
    let node = g.node(id);
    !node.dtype.is_float() && matches!(node.op, Op::Unary { .. } | Op::Binary { .. } | Op::Where | Op::Cast)
}

/// Whether `id` is computed by integer and bool elementwise forward ops from graph inputs,
/// constants and aranges alone.
fn from_inputs(g: &Graph, id: NodeId, is_backward: &impl Fn(&Graph, NodeId) -> bool) -> bool {
    let node = g.node(id);
    match node.op {
        Op::Input { .. } | Op::Constant { .. } | Op::Arange => true,
        _ if is_index_or_mask(g, id) && !is_backward(g, id) => {
            node.operands.iter().all(|&operand| from_inputs(g, operand, is_backward))
        }
        _ => false,
    }
}

/// The backward's copy of `id` (checked by [`from_inputs`]), copying its chain as needed.
fn copy_chain(g: &mut Graph, id: NodeId, copies: &mut HashMap<NodeId, NodeId>) -> Result<NodeId> {
    let node = g.node(id).clone();
    if matches!(node.op, Op::Input { .. } | Op::Constant { .. } | Op::Arange) {
        return Ok(id);
    }
    if let Some(&copy) = copies.get(&id) {
        return Ok(copy);
    }
    let sources = node.operands.iter().map(|&operand| copy_chain(g, operand, copies)).collect::<Result<Vec<_>>>()?;
    let loc = node.loc.as_ref().map(|l| l.backward_of());
    let copy = g.add_declared(node.op.clone(), &sources, node.dtype, node.shape.clone(), loc)?;
    copies.insert(id, copy);
    Ok(copy)
}
