//! Recomputing cheap forward values in the backward, the idea of AOTAutograd's min-cut
//! partitioner: in a joint forward and backward graph, an activation (a unary elementwise op or a
//! cast) whose operand the backward reads anyway need not be held from the forward until the
//! backward reads it; the backward computes it again from that operand. The forward's value then
//! dies at its last forward reader, so a training step holds one tensor per such activation less
//! between its forward and its backward (for an MLP, `gelu(h)` beside `h`), at the cost of one
//! more elementwise pass in the backward, which fusion joins to the backward's other elementwise
//! work on `h` where it can.
//!
//! A value the backward reads only as a matmul operand is held, not recomputed: the copy would be
//! a kernel of its own.
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
        // The backward's copy of each recomputed value: a chain of activations is recomputed
        // from the first operand the backward holds.
        let mut copies: HashMap<NodeId, NodeId> = HashMap::new();
        for id in g.topo_order() {
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
            if !matches!(node.op, Op::Unary { .. } | Op::Cast) || is_backward(g, id) || g.is_output(id) {
                continue;
            }
            let operand = node.operands[0];
            let users = g.users(id);
            let (backward, forward): (Vec<NodeId>, Vec<NodeId>) = users.iter().partition(|&&u| is_backward(g, u));
            // Only where the forward still reads the value (else nothing is held for long) and the
            // operand is available to the backward anyway (else recomputing would hold it instead).
            let source = copies.get(&operand).copied().unwrap_or(operand);
            let operand_held = source != operand
                || matches!(g.node(operand).op, Op::Input { .. })
                || g.users(operand).iter().any(|&u| u != id && is_backward(g, u));
            if backward.is_empty()
                || forward.is_empty()
                || !operand_held
                || backward.iter().all(|&u| feeds_matmuls(g, u))
            {
                continue;
            }
            let (op, dtype, shape) = (node.op.clone(), node.dtype, node.shape.clone());
            let loc = node.loc.as_ref().map(|l| l.backward_of());
            let copy = g.add_declared(op, &[source], dtype, shape, loc)?;
            for user in backward {
                g.replace_uses_in(user, id, copy);
            }
            copies.insert(id, copy);
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
