//! Summing a value's gradient contributions. The gradients of disjoint slices of one tensor (a
//! fused qkv projection split into q, k and v) arrive as copies of the whole tensor, zero outside
//! each slice; added up they would be written and read back once per slice. They are joined into
//! one concat of the slices' gradients instead, with zeros only where no slice reads, and the
//! other contributions are added to that.

use crate::builder::Emit;
use crate::Result;
use braze_ir::{Graph, NodeId, Op, Shape};

/// The sum of `parts` (each of the value's dtype and shape), in order.
pub(crate) fn sum(e: &mut Emit<'_>, parts: &[NodeId]) -> Result<NodeId> {
    let mut rest: Vec<NodeId> = parts.to_vec();
    let joined = join_pieces(e, &mut rest)?;
    let mut total = joined;
    for part in rest {
        total = Some(match total {
            Some(t) => e.add(t, part)?,
            None => part,
        });
    }
    Ok(total.expect("a value with a gradient has at least one contribution"))
}

/// A contribution that is zero except for one piece along `axis`.
struct Piece {
    part: NodeId,
    axis: usize,
    start: usize,
    piece: NodeId,
}

/// Joins the contributions of `parts` that are zero-padded pieces along one axis, not
/// overlapping, when there are at least two; those leave `parts`.
fn join_pieces(e: &mut Emit<'_>, parts: &mut Vec<NodeId>) -> Result<Option<NodeId>> {
    let g = e.graph();
    let pieces: Vec<Piece> = parts.iter().filter_map(|&p| padded_piece(g, p)).collect();
    let Some(axis) = pieces.first().map(|p| p.axis) else { return Ok(None) };
    let mut pieces: Vec<Piece> = pieces.into_iter().filter(|p| p.axis == axis).collect();
    pieces.sort_by_key(|p| p.start);
    let size = |g: &Graph, x: NodeId| g.node(x).shape.dims()[axis];
    let disjoint = pieces.windows(2).all(|w| w[0].start + size(g, w[0].piece) <= w[1].start);
    if pieces.len() < 2 || !disjoint {
        return Ok(None);
    }
    let shape = g.node(parts[0]).shape.clone();
    let dtype = g.node(parts[0]).dtype;
    let with_size = |n: usize| {
        let mut dims = shape.dims().to_vec();
        dims[axis] = n;
        Shape::new(dims)
    };
    let mut operands = Vec::new();
    let mut at = 0;
    for p in &pieces {
        if p.start > at {
            let zero = e.constant_of(0.0, dtype);
            operands.push(e.broadcast(zero, &with_size(p.start - at))?);
        }
        operands.push(p.piece);
        at = p.start + size(e.graph(), p.piece);
    }
    if at < shape.dims()[axis] {
        let zero = e.constant_of(0.0, dtype);
        operands.push(e.broadcast(zero, &with_size(shape.dims()[axis] - at))?);
    }
    parts.retain(|part| !pieces.iter().any(|p| p.part == *part));
    Ok(Some(if operands.len() == 1 { operands[0] } else { e.op(Op::Concat { axis }, &operands)? }))
}

/// `part` as a piece: a concat along some axis of zeros and one other operand.
fn padded_piece(g: &Graph, part: NodeId) -> Option<Piece> {
    let node = g.node(part);
    let Op::Concat { axis } = node.op else { return None };
    let mut found = None;
    let mut start = 0;
    for &o in &node.operands {
        if !is_zero(g, o) {
            if found.is_some() {
                return None;
            }
            found = Some((start, o));
        }
        start += g.node(o).shape.dims()[axis];
    }
    let (start, piece) = found?;
    Some(Piece { part, axis, start, piece })
}

/// Whether `x` is a constant 0 (+0.0 for floats), seen through views.
fn is_zero(g: &Graph, mut x: NodeId) -> bool {
    loop {
        match &g.node(x).op {
            Op::Constant { value } => return value.as_f64() == 0.0 && value.as_f64().is_sign_positive(),
            Op::Reshape | Op::BroadcastTo => x = g.node(x).operands[0],
            _ => return false,
        }
    }
}
