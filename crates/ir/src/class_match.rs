//! How cross entropy's targets pick their columns, built the same way by its decomposition and
//! by its gradient.

use crate::{BinaryOp, DType, Graph, NodeId, Op, Result, Shape, SourceLoc};

/// `[rows, cols]` bools: whether column `j`'s class (`classes[j]`, `[cols]`) is row `i`'s
/// target (`targets[i]`, `[rows]`). With i32 classes beside i64 targets the targets are
/// narrowed once per row (clamped into i32, with a flag for those outside it, which match no
/// class), so the compare per element reads a 4-byte class beside each logit, not 8 bytes.
/// Returns the nodes added, the match last (a caller tags them as parts of its composite).
pub fn class_onehot(g: &mut Graph, targets: NodeId, classes: NodeId, loc: Option<SourceLoc>) -> Result<Vec<NodeId>> {
    let (target_dtype, class_dtype) = (g.node(targets).dtype, g.node(classes).dtype);
    let (rows, cols) = (g.node(targets).shape.numel(), g.node(classes).shape.numel());
    let mut added = Vec::new();
    let mut note = |id: NodeId| {
        added.push(id);
        id
    };
    let class_row = note(g.reshape(classes, Shape(vec![1, cols]))?);
    let binary = |g: &mut Graph, op: BinaryOp, a: NodeId, b: NodeId| g.add(Op::Binary { op }, &[a, b], loc.clone());
    if target_dtype == class_dtype {
        let column = note(g.reshape(targets, Shape(vec![rows, 1]))?);
        note(binary(g, BinaryOp::Eq, column, class_row)?);
        return Ok(added);
    }
    debug_assert_eq!((target_dtype, class_dtype), (DType::I64, DType::I32), "as infer allows");
    let low = note(g.constant(i32::MIN as f64, target_dtype));
    let high = note(g.constant(i32::MAX as f64, target_dtype));
    let raised = note(binary(g, BinaryOp::Max, targets, low)?);
    let clamped = note(binary(g, BinaryOp::Min, raised, high)?);
    let in_range = note(binary(g, BinaryOp::Eq, clamped, targets)?);
    let narrow = note(g.cast(clamped, class_dtype)?);
    let narrow_column = note(g.reshape(narrow, Shape(vec![rows, 1]))?);
    let in_range_column = note(g.reshape(in_range, Shape(vec![rows, 1]))?);
    let equal = note(binary(g, BinaryOp::Eq, narrow_column, class_row)?);
    note(binary(g, BinaryOp::And, in_range_column, equal)?);
    Ok(added)
}
