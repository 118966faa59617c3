//! Algebraic simplification: a table of rewrite rules, one a line, each with its identity.
//!
//! Every rule is exact for every value, NaN and signed zero included, and never leaves more work
//! than it found. So `x + 0.0` on floats stays (it turns -0.0 into +0.0), as do `x * 0` (NaN, inf)
//! and `x / x`.

use crate::{Pass, Result};
use braze_ir::{BinaryOp, DType, Graph, Literal, NodeId, Op, ReduceOp, UnaryOp};

#[derive(Clone, Copy, Debug, Default)]
pub struct Simplify;

/// A rule returns the node that computes the same value as `id` (same dtype and shape), if it
/// applies; it may add that node to the graph.
type Rule = fn(&mut Graph, NodeId) -> Result<Option<NodeId>>;

#[rustfmt::skip]
const RULES: &[(&str, Rule)] = &[
    ("mul_one", mul_one),                         // x * 1 == x
    ("div_one", div_one),                         // x / 1 == x
    ("sub_zero", sub_zero),                       // x - 0 == x      (floats: +0.0 only; -0.0 - +0.0 == -0.0)
    ("add_zero", add_zero),                       // x + (-0.0) == x (floats); x + 0 == x (ints)
    ("neg_neg", neg_neg),                         // -(-x) == x
    ("cast_same", cast_same),                     // cast(x: T, T) == x
    ("cast_round_trip", cast_round_trip),         // cast(cast(x: T, W), T) == x when W holds every value of T
    ("reshape_same", reshape_same),               // reshape(x, shape(x)) == x
    ("reshape_reshape", reshape_reshape),         // reshape(reshape(x, s), t) == reshape(x, t)
    ("reshape_keepdim", reshape_keepdim),         // reshape(reduce(x, axes, keepdim), shape of reduce(x, axes)) == reduce(x, axes)
    ("broadcast_same", broadcast_same),           // broadcast_to(x, shape(x)) == x
    ("broadcast_broadcast", broadcast_broadcast), // broadcast_to(broadcast_to(x, s), t) == broadcast_to(x, t)
    ("permute_identity", permute_identity),       // permute(x, [0, 1, ..]) == x
    ("permute_permute", permute_permute),         // permute(permute(x, p), q) == permute(x, [p[q[i]] for i])
    ("transpose_matmul", transpose_matmul),       // transpose(matmul(a, b)) == matmul(transpose(b), transpose(a)), its only reader
    ("cast_transpose", cast_transpose),           // cast(transpose(x)) == transpose(cast(x)), read only by matmuls
    ("slice_full", slice_full),                   // slice(x, axis, 0:n:1) == x where n is the axis' size
    ("reduce_no_axes", reduce_no_axes),           // reduce(x, axes=[]) == x (float sum, mean: x + 0.0; int sum: cast(x, i64))
];

impl Pass for Simplify {
    fn name(&self) -> &'static str {
        "simplify"
    }

    fn run(&self, g: &mut Graph) -> Result<bool> {
        let mut changed = false;
        for id in g.topo_order() {
            if !g.contains(id) {
                continue;
            }
            for (name, rule) in RULES {
                let Some(replacement) = rule(g, id)? else { continue };
                let (old, new) = (g.node(id), g.node(replacement));
                if old.dtype != new.dtype || old.shape != new.shape {
                    continue;
                }
                tracing::trace!(target: "braze::graph", rule = name, node = %id, "simplified");
                g.replace_all_uses(id, replacement);
                if g.use_count(id) == 0 {
                    g.remove(id)?;
                }
                changed = true;
                break;
            }
        }
        Ok(changed)
    }
}

/// The value of a scalar constant, seen through views (a broadcast constant is still one value).
fn constant_value(g: &Graph, mut id: NodeId) -> Option<Literal> {
    loop {
        match &g.node(id).op {
            Op::Constant { value } => return Some(*value),
            Op::Reshape | Op::BroadcastTo | Op::Permute { .. } | Op::Slice { .. } => id = g.node(id).operands[0],
            _ => return None,
        }
    }
}

fn binary_operands(g: &Graph, id: NodeId, want: BinaryOp) -> Option<(NodeId, NodeId)> {
    match g.node(id).op {
        Op::Binary { op } if op == want => Some((g.node(id).operands[0], g.node(id).operands[1])),
        _ => None,
    }
}

/// `x` when `x op c` (or `c op x` for commutative ops) has a constant `c` accepted by `is_identity`.
fn identity_operand(
    g: &Graph,
    id: NodeId,
    op: BinaryOp,
    either_side: bool,
    is_identity: impl Fn(Literal) -> bool,
) -> Option<NodeId> {
    let (a, b) = binary_operands(g, id, op)?;
    if constant_value(g, b).is_some_and(&is_identity) {
        return Some(a);
    }
    if either_side && constant_value(g, a).is_some_and(is_identity) {
        return Some(b);
    }
    None
}

fn is_one(c: Literal) -> bool {
    c == Literal::Float(1.0) || c == Literal::Int(1)
}

fn mul_one(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    Ok(identity_operand(g, id, BinaryOp::Mul, true, is_one))
}

fn div_one(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    Ok(identity_operand(g, id, BinaryOp::Div, false, is_one))
}

fn sub_zero(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    Ok(identity_operand(g, id, BinaryOp::Sub, false, |c| match c {
        Literal::Float(v) => v == 0.0 && v.is_sign_positive(),
        c => c == Literal::Int(0),
    }))
}

fn add_zero(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    Ok(identity_operand(g, id, BinaryOp::Add, true, |c| match c {
        Literal::Float(v) => v == 0.0 && v.is_sign_negative(),
        c => c == Literal::Int(0),
    }))
}

fn neg_neg(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    let outer = g.node(id);
    if !matches!(outer.op, Op::Unary { op: UnaryOp::Neg }) {
        return Ok(None);
    }
    let inner = g.node(outer.operands[0]);
    Ok(matches!(inner.op, Op::Unary { op: UnaryOp::Neg }).then(|| inner.operands[0]))
}

fn cast_same(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    let node = g.node(id);
    Ok((node.op == Op::Cast && g.node(node.operands[0]).dtype == node.dtype).then(|| node.operands[0]))
}

/// Whether every value of `narrow` survives a trip through `wide` unchanged.
fn holds_every_value(narrow: DType, wide: DType) -> bool {
    match (narrow, wide) {
        (DType::F16 | DType::BF16, DType::F32) | (DType::I32, DType::I64) => true,
        (DType::Bool, wide) => wide != DType::Bool,
        _ => false,
    }
}

fn cast_round_trip(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    let outer = g.node(id);
    if outer.op != Op::Cast {
        return Ok(None);
    }
    let inner = g.node(outer.operands[0]);
    if inner.op != Op::Cast {
        return Ok(None);
    }
    let x = inner.operands[0];
    let original = g.node(x).dtype;
    Ok((original == outer.dtype && holds_every_value(original, inner.dtype)).then_some(x))
}

fn same_shape_view(g: &Graph, id: NodeId, op: Op) -> Option<NodeId> {
    let node = g.node(id);
    (node.op == op && g.node(node.operands[0]).shape == node.shape).then(|| node.operands[0])
}

fn reshape_same(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    Ok(same_shape_view(g, id, Op::Reshape))
}

/// A reduction's kept unit dims dropped by a reshape: the reduction without keepdim (its only
/// user, so no second reduction is left; a kernel's epilogue then sees the per-column or per-row
/// value itself rather than a view of it).
fn reshape_keepdim(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    let node = g.node(id);
    if node.op != Op::Reshape {
        return Ok(None);
    }
    let source = node.operands[0];
    let Op::Reduce { op, axes, keepdim: true } = g.node(source).op.clone() else { return Ok(None) };
    if g.use_count(source) != 1 || g.is_output(source) {
        return Ok(None);
    }
    let x = g.node(source).operands[0];
    let dropped: Vec<usize> =
        g.node(x).shape.dims().iter().enumerate().filter(|(a, _)| !axes.contains(a)).map(|(_, &d)| d).collect();
    if dropped.as_slice() != node.shape.dims() {
        return Ok(None);
    }
    let loc = g.node(source).loc.clone();
    Ok(Some(g.add(Op::Reduce { op, axes, keepdim: false }, &[x], loc)?))
}

fn broadcast_same(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    Ok(same_shape_view(g, id, Op::BroadcastTo))
}

/// For `op(op(x))`, returns `x` and the outer node's shape.
fn view_of_same_view(g: &Graph, id: NodeId, op: Op) -> Option<(NodeId, braze_ir::Shape)> {
    let outer = g.node(id);
    if outer.op != op {
        return None;
    }
    let inner = g.node(outer.operands[0]);
    (inner.op == op).then(|| (inner.operands[0], outer.shape.clone()))
}

fn reshape_reshape(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    let Some((x, shape)) = view_of_same_view(g, id, Op::Reshape) else { return Ok(None) };
    let folded = g.reshape(x, shape)?;
    g.set_loc(folded, g.node(id).loc.clone());
    Ok(Some(folded))
}

fn broadcast_broadcast(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    let Some((x, shape)) = view_of_same_view(g, id, Op::BroadcastTo) else { return Ok(None) };
    let folded = g.broadcast_to(x, shape)?;
    g.set_loc(folded, g.node(id).loc.clone());
    Ok(Some(folded))
}

fn is_identity(perm: &[usize]) -> bool {
    perm.iter().enumerate().all(|(i, &p)| i == p)
}

fn permute_identity(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    let node = g.node(id);
    Ok(match &node.op {
        Op::Permute { perm } if is_identity(perm) => Some(node.operands[0]),
        _ => None,
    })
}

fn permute_permute(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    let outer = g.node(id);
    let Op::Permute { perm: q } = &outer.op else { return Ok(None) };
    let inner = g.node(outer.operands[0]);
    let Op::Permute { perm: p } = &inner.op else { return Ok(None) };
    // Output dim i of the outer permute is inner dim q[i], which is x's dim p[q[i]].
    let composed: Vec<usize> = q.iter().map(|&qi| p[qi]).collect();
    let x = inner.operands[0];
    if is_identity(&composed) {
        return Ok(Some(x));
    }
    let loc = outer.loc.clone();
    Ok(Some(g.add(Op::Permute { perm: composed }, &[x], loc)?))
}

/// Whether `perm` swaps the last two axes and keeps the others.
fn swaps_last_two(perm: &[usize]) -> bool {
    let n = perm.len();
    n >= 2 && perm[n - 2] == n - 1 && perm[n - 1] == n - 2 && perm[..n - 2].iter().enumerate().all(|(i, &p)| i == p)
}

/// The transpose of a matmul read only through that transpose (and a cast, which the transpose
/// passes through unchanged): the product of the transposed operands in the other order writes
/// its result in the layout its reader wants, so readers load it contiguously (the weight
/// gradient `dy^T x` of a linear layer, whose readers were reading `x^T dy` across its rows), and
/// the operands' transposes are layouts of the matmul, not copies. Every element is the same dot
/// product as before.
fn transpose_matmul(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    let node = g.node(id);
    let Op::Permute { perm } = &node.op else { return Ok(None) };
    if !swaps_last_two(perm) {
        return Ok(None);
    }
    let only_read_by =
        |g: &Graph, x: NodeId, user: NodeId| g.use_count(x) == 1 && !g.is_output(x) && g.users(x) == [user];
    let mut m = node.operands[0];
    let cast = (g.node(m).op == Op::Cast && only_read_by(g, m, id)).then(|| (m, g.node(m).dtype));
    if let Some((c, _)) = cast {
        m = g.node(c).operands[0];
    }
    let reader = cast.map_or(id, |(c, _)| c);
    let product = g.node(m);
    if product.op != Op::MatMul || !only_read_by(g, m, reader) {
        return Ok(None);
    }
    let (a, b) = (product.operands[0], product.operands[1]);
    let (a_rank, b_rank) = (g.node(a).shape.rank(), g.node(b).shape.rank());
    if a_rank < 2 || b_rank < 2 {
        return Ok(None);
    }
    let (loc, product_loc) = (node.loc.clone(), product.loc.clone());
    let swap = |rank: usize| -> Vec<usize> {
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(rank - 2, rank - 1);
        perm
    };
    let b_t = g.add(Op::Permute { perm: swap(b_rank) }, &[b], loc.clone())?;
    let a_t = g.add(Op::Permute { perm: swap(a_rank) }, &[a], loc.clone())?;
    let transposed = g.add(Op::MatMul, &[b_t, a_t], product_loc)?;
    let Some((c, dtype)) = cast else { return Ok(Some(transposed)) };
    let cast_loc = g.node(c).loc.clone();
    let widened = g.cast(transposed, dtype)?;
    g.set_loc(widened, cast_loc);
    Ok(Some(widened))
}

/// A cast of a transposed matrix that only matmuls read (directly or transposed back): cast in
/// the matrix's own layout, so the
/// cast reads and writes contiguously (an autocast region casting a linear layer's `[out, in]`
/// weight, which its matmul reads transposed), and the transpose stays a layout of the matmuls.
fn cast_transpose(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    let node = g.node(id);
    if node.op != Op::Cast || g.is_output(id) {
        return Ok(None);
    }
    let view = node.operands[0];
    let Op::Permute { perm } = &g.node(view).op else { return Ok(None) };
    let is_matmul = |u: NodeId| g.node(u).op == Op::MatMul;
    // A backward's transpose of the cast, read by matmuls too, folds into the other layout.
    let only_matmuls = g.users(id).iter().all(|&u| {
        is_matmul(u)
            || matches!(&g.node(u).op, Op::Permute { perm } if swaps_last_two(perm) && g.users(u).into_iter().all(is_matmul))
    });
    if !swaps_last_two(perm) || !only_matmuls {
        return Ok(None);
    }
    let (perm, x, dtype, loc) = (perm.clone(), g.node(view).operands[0], node.dtype, node.loc.clone());
    let cast = g.cast(x, dtype)?;
    g.set_loc(cast, loc.clone());
    Ok(Some(g.add(Op::Permute { perm }, &[cast], loc)?))
}

fn slice_full(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    let node = g.node(id);
    let Op::Slice { axis, start, end, step } = node.op else { return Ok(None) };
    let x = node.operands[0];
    let size = g.node(x).shape.dims()[axis];
    Ok((start == 0 && end == size && (step == 1 || size <= 1)).then_some(x))
}

/// Each element reduces to itself, except that a float sum starts from +0.0 (`-0.0` sums to
/// +0.0) and an integer or bool sum is an i64.
fn reduce_no_axes(g: &mut Graph, id: NodeId) -> Result<Option<NodeId>> {
    let node = g.node(id);
    let Op::Reduce { op, axes, .. } = &node.op else { return Ok(None) };
    if !axes.is_empty() {
        return Ok(None);
    }
    let (x, dtype, loc) = (node.operands[0], node.dtype, node.loc.clone());
    if dtype.is_float() && matches!(op, ReduceOp::Sum | ReduceOp::Mean) {
        let zero = g.constant(0.0, dtype);
        return Ok(Some(g.add(Op::Binary { op: BinaryOp::Add }, &[x, zero], loc)?));
    }
    if g.node(x).dtype != dtype {
        let cast = g.cast(x, dtype)?;
        g.set_loc(cast, loc);
        return Ok(Some(cast));
    }
    Ok(Some(x))
}
