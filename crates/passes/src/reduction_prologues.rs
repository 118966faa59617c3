//! Full reductions get their own copy of the elementwise values they reduce when other kernels
//! read those values too: a multi-reduce item then computes its prologue from the values' own
//! operands, and needs no kernel to have stored them first.
//!
//! What this buys: a gradient norm's `sum(cast(g) * cast(g))` reads the bf16 gradient instead of
//! an f32 copy another kernel stored for it; an optimizer's check of clipped gradients,
//! `max(!isfinite(g * scale))`, reads a one-byte flag per element instead of the stored f32
//! `g * scale` (its scalar `scale` cannot be a multi-reduce leaf, so the copy's elementwise part
//! joins the update kernel). A copy is made only when it reads no more bytes than
//! the value it replaces (the reduction reads `g` and a scalar instead of `g * scale`) and the
//! chain is short, so the reduction never does more memory traffic than before. Runs once, after
//! common subexpressions (which would merge the copies back).

use crate::pass::Pass;
use crate::Result;
use braze_ir::{Graph, NodeId, Op};
use std::collections::{HashMap, HashSet};

/// Longest elementwise chain copied for one reduction.
const MAX_COPIED: usize = 16;
/// Smallest reduction whose prologue is copied: smaller ones join a row kernel with the
/// producers of their operand (one kernel computes and reduces the values), where a copy would
/// only add work.
const MIN_ELEMENTS: usize = 1 << 16;

pub struct ReductionPrologues;

impl Pass for ReductionPrologues {
    fn name(&self) -> &'static str {
        "reduction_prologues"
    }

    fn run(&self, g: &mut Graph) -> Result<bool> {
        let mut changed = false;
        for id in g.topo_order() {
            let node = g.node(id);
            let Op::Reduce { axes, .. } = &node.op else { continue };
            let operand = node.operands[0];
            let shape = &g.node(operand).shape;
            if axes.len() != shape.rank() || shape.rank() == 0 || shape.numel() < MIN_ELEMENTS {
                continue;
            }
            let Some(chain) = prologue(g, operand) else { continue };
            let shared: HashSet<NodeId> = chain
                .iter()
                .copied()
                .filter(|&c| g.is_output(c) || g.users(c).iter().any(|u| *u != id && !chain.contains(u)))
                .collect();
            if shared.is_empty() || leaf_bytes(g, &chain) > bytes_read_without_copy(g, operand, &chain, &shared) {
                continue;
            }
            let mut copies = HashMap::new();
            let copy = copy_chain(g, operand, &chain, &mut copies)?;
            g.replace_uses_in(id, operand, copy);
            changed = true;
        }
        Ok(changed)
    }
}

/// The elementwise nodes of `x`'s shape that `x` is computed from (`x` included), as far as
/// non-elementwise values, views and constants; `None` when `x` is none, there are too many, or
/// one is a bf16 or f16 value.
fn prologue(g: &Graph, x: NodeId) -> Option<HashSet<NodeId>> {
    let shape = &g.node(x).shape;
    let in_chain = |id: NodeId| {
        let node = g.node(id);
        node.op.is_elementwise() && !matches!(node.op, Op::Constant { .. }) && node.shape == *shape
    };
    if !in_chain(x) {
        return None;
    }
    // A kernel computes bf16 and f16 values in f32 and rounds them where it stores them, so a copy
    // of a narrow value inside the reduction could differ from the stored one (an `exp` that
    // overflows only when rounded to bf16), and a max or min would then disagree with the values
    // its gradient compares it to. f32, f64, integer and bool values are computed exactly as
    // stored.
    let narrow = |id: NodeId| g.node(id).dtype.is_narrow_float();
    let mut chain = HashSet::new();
    let mut stack = vec![x];
    while let Some(id) = stack.pop() {
        if !chain.insert(id) {
            continue;
        }
        if chain.len() > MAX_COPIED {
            return None;
        }
        if narrow(id) {
            return None;
        }
        stack.extend(g.node(id).operands.iter().copied().filter(|&o| in_chain(o)));
    }
    Some(chain)
}

/// Bytes of `x`'s value in memory (of its base tensor, through views); none for constants and
/// single values, which a kernel loads once.
fn bytes(g: &Graph, mut x: NodeId) -> usize {
    while matches!(g.node(x).op, Op::Reshape | Op::BroadcastTo | Op::Permute { .. } | Op::Slice { .. }) {
        x = g.node(x).operands[0];
    }
    let node = g.node(x);
    if matches!(node.op, Op::Constant { .. }) || node.shape.numel() <= 1 {
        return 0;
    }
    node.shape.numel() * node.dtype.size_bytes()
}

/// Bytes the copied chain reads: each operand from outside it once.
fn leaf_bytes(g: &Graph, chain: &HashSet<NodeId>) -> usize {
    let leaves: HashSet<NodeId> =
        chain.iter().flat_map(|&c| g.node(c).operands.iter().copied()).filter(|o| !chain.contains(o)).collect();
    leaves.into_iter().map(|l| bytes(g, l)).sum()
}

/// Bytes the reduction reads when it copies nothing: the shared values nearest to it (stored by
/// the kernels computing them) and the operands of the part only it reads.
fn bytes_read_without_copy(g: &Graph, root: NodeId, chain: &HashSet<NodeId>, shared: &HashSet<NodeId>) -> usize {
    let mut read = HashSet::new();
    let mut seen = HashSet::new();
    let mut stack = vec![root];
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        if !chain.contains(&id) || shared.contains(&id) {
            read.insert(id);
            continue;
        }
        stack.extend(g.node(id).operands.iter().copied());
    }
    read.into_iter().map(|x| bytes(g, x)).sum()
}

fn copy_chain(
    g: &mut Graph,
    id: NodeId,
    chain: &HashSet<NodeId>,
    copies: &mut HashMap<NodeId, NodeId>,
) -> Result<NodeId> {
    if !chain.contains(&id) {
        return Ok(id);
    }
    if let Some(&copy) = copies.get(&id) {
        return Ok(copy);
    }
    let node = g.node(id).clone();
    let sources = node.operands.iter().map(|&o| copy_chain(g, o, chain, copies)).collect::<Result<Vec<_>>>()?;
    let copy = g.add_declared(node.op.clone(), &sources, node.dtype, node.shape.clone(), node.loc.clone())?;
    copies.insert(id, copy);
    Ok(copy)
}
