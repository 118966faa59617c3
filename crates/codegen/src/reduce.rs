//! Reduction arithmetic shared by row and multi-reduce kernels: accumulator types, identities,
//! combine steps and the warp-level butterfly.

use crate::body::render_binary;
use crate::cuda::{cast, identity_literal, value_type, Helpers};
use crate::writer::CodeWriter;
use braze_ir::{BinaryOp, DType, ReduceOp};

/// Float reductions accumulate in f32, integer (and bool) sums in 64 bits, integer max/min in
/// their own width.
pub(crate) fn accumulator_dtype(op: ReduceOp, operand: DType) -> DType {
    match (op, operand) {
        (_, DType::F32 | DType::F16 | DType::BF16) => DType::F32,
        (ReduceOp::Sum | ReduceOp::Mean, _) => DType::I64,
        (_, DType::I64) => DType::I64,
        _ => DType::I32,
    }
}

/// The identity of `op` over `operand` values, in the accumulator type. Bools accumulate as
/// 0/1 in an int, so their max (any) starts at 0 and their min (all) at 1: the int's extremes
/// would read as `true` where an empty row has no element.
pub(crate) fn identity(op: ReduceOp, operand: DType, acc: DType) -> String {
    match (op, operand) {
        (ReduceOp::Max, DType::Bool) => "0".to_string(),
        (ReduceOp::Min, DType::Bool) => "1".to_string(),
        _ => identity_literal(op, acc),
    }
}

/// `a (op) b` in the accumulator type: the binary op that folds the reduction.
pub(crate) fn combine(helpers: &mut Helpers, op: ReduceOp, acc: DType, a: &str, b: &str) -> String {
    let fold = match op {
        ReduceOp::Sum | ReduceOp::Mean => BinaryOp::Add,
        ReduceOp::Max => BinaryOp::Max,
        ReduceOp::Min => BinaryOp::Min,
    };
    render_binary("reduction", helpers, fold, acc, a, b)
        .unwrap_or_else(|_| unreachable!("{} of {acc} accumulators is in the op table", fold.name()))
}

/// `acc = acc (op) element;` with the element converted to the accumulator type.
pub(crate) fn accumulate(
    helpers: &mut Helpers,
    op: ReduceOp,
    acc: DType,
    acc_name: &str,
    element: &str,
    element_dtype: DType,
) -> String {
    let element = cast(helpers, element_dtype, acc, element);
    let element = if element.contains(' ') { format!("({element})") } else { element };
    format!("{acc_name} = {};", combine(helpers, op, acc, acc_name, &element))
}

/// The reduced value of dtype `result` from a finished accumulator over `count` elements
/// (`count` is a C expression; only a mean uses it). A float result stays unrounded in f32, as
/// every computed f16/bf16 value does until a cast or a store.
pub(crate) fn finalize(
    helpers: &mut Helpers,
    op: ReduceOp,
    acc: DType,
    acc_name: &str,
    count: &str,
    result: DType,
) -> String {
    let (value, from) = if op == ReduceOp::Mean {
        let sum = cast(helpers, acc, DType::F32, acc_name);
        // An empty mean is 0 / 0 = NaN, as in the reference.
        (format!("({sum} / (float)({count}))"), DType::F32)
    } else {
        (acc_name.to_string(), acc)
    };
    if from.is_float() && result.is_float() {
        value
    } else {
        cast(helpers, from, result, &value)
    }
}

/// Declares an accumulator of a reduction of `operand` values, initialised to the identity.
pub(crate) fn declare_accumulator(op: ReduceOp, operand: DType, acc: DType, name: &str) -> String {
    format!("{} {name} = {};", value_type(acc), identity(op, operand, acc))
}

/// Butterfly steps over `width` lanes (a power of two up to 32): afterwards every lane of each
/// `width`-lane group holds the same combined value, bit for bit, because every step combines
/// the same two partial values on both lanes (commutative) in a fixed order.
pub(crate) fn butterfly(
    w: &mut CodeWriter,
    helpers: &mut Helpers,
    accumulators: &[(String, ReduceOp, DType)],
    width: u32,
    mask: &str,
) {
    if width <= 1 || accumulators.is_empty() {
        return;
    }
    w.line("#pragma unroll");
    w.open(format!("for (unsigned offset = {}u; offset > 0u; offset >>= 1)", width / 2));
    for (name, op, acc) in accumulators {
        let other = format!("{name}_other");
        w.line(format!("const {} {other} = __shfl_xor_sync({mask}, {name}, offset);", value_type(*acc)));
        w.line(format!("{name} = {};", combine(helpers, *op, *acc, name, &other)));
    }
    w.close();
}
