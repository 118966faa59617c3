//! Which ops give the same bits in fused f32 kernels as in the reference, and which turn a
//! last-bit difference into a different answer: the tables the generator and the judge share.

use braze_ir::{BinaryOp, DType, Op, ReduceOp, UnaryOp};

/// Whether `op` turns a last-bit difference of its float operand into a different answer.
pub fn is_discontinuous(op: &Op, operand: DType, result: DType) -> bool {
    if !operand.is_float() {
        return false;
    }
    match op {
        Op::Unary { op } => matches!(op, UnaryOp::IsNan | UnaryOp::IsFinite | UnaryOp::Not),
        Op::Binary { op } => op.is_comparison(),
        Op::Cast => !result.is_float(),
        _ => false,
    }
}

/// Whether `op` gives the same bits in fused f32 kernels as in the reference, given operands
/// that do: one correctly rounded f32 operation, or no rounding at all.
pub fn exact_result(op: &Op, dtype: DType) -> bool {
    let narrow = matches!(dtype, DType::BF16 | DType::F16);
    match op {
        Op::Unary { op } => match op {
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu | UnaryOp::IsNan | UnaryOp::IsFinite | UnaryOp::Not => true,
            UnaryOp::Sqrt | UnaryOp::Reciprocal => !narrow,
            _ => false,
        },
        Op::Binary { op } => match op {
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div => !narrow,
            BinaryOp::Pow => false,
            _ => true,
        },
        Op::Reduce { op: ReduceOp::Sum | ReduceOp::Mean, .. } => !dtype.is_float(),
        Op::Softmax { .. } | Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::MatMul => false,
        _ => true,
    }
}
