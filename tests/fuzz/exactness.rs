//! Which ops give the same bits in fused f32 kernels as in the reference, and which turn a
//! last-bit difference into a different answer, from the op table's properties: what the
//! generator and the judge share.

use braze_ir::{DType, Op, ReduceOp};

/// Whether `op` turns a last-bit difference of its float operand into a different answer.
pub fn is_discontinuous(op: &Op, operand: DType, result: DType) -> bool {
    if !operand.is_float() {
        return false;
    }
    match op {
        Op::Unary { op } => !op.def().continuous,
        Op::Binary { op } => !op.def().continuous,
        Op::Cast => !result.is_float(),
        _ => false,
    }
}

/// Whether `op` gives the same bits in fused f32 kernels as in the reference, given operands
/// that do: one correctly rounded f32 operation, or no rounding at all.
pub fn exact_result(op: &Op, dtype: DType) -> bool {
    match op {
        Op::Unary { op } => op.def().exactness.exact_in(dtype),
        Op::Binary { op } => op.def().exactness.exact_in(dtype),
        Op::Reduce { op: ReduceOp::Sum | ReduceOp::Mean, .. } => !dtype.is_float(),
        Op::Softmax { .. } | Op::LogSoftmax { .. } | Op::CrossEntropy { .. } => false,
        Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::MatMul => false,
        _ => true,
    }
}
