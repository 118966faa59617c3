//! Result dtypes of reductions, as PyTorch's: an integer or bool sum is i64, a mean is for floats
//! only, max and min keep the dtype.

use braze_ir::infer::infer;
use braze_ir::{DType, IrError, Op, ReduceOp, Shape};

/// The dtype and shape `infer` gives `op` over axis 1 of a `[2, 3]` operand of `dtype`.
fn typed(op: ReduceOp, dtype: DType, keepdim: bool) -> Result<(DType, Shape), IrError> {
    let shape = Shape::new(vec![2, 3]);
    infer(&Op::Reduce { op, axes: vec![1], keepdim }, &[(dtype, &shape)], None)
}

/// `expected[i]` is the result dtype of sum, mean, max and min over `dtype` (`None`: an error).
fn check(dtype: DType, expected: [Option<DType>; 4]) {
    let ops = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min];
    for (op, want) in ops.into_iter().zip(expected) {
        for keepdim in [false, true] {
            let got = typed(op, dtype, keepdim);
            match want {
                Some(want) => {
                    let shape = if keepdim { vec![2, 1] } else { vec![2] };
                    assert_eq!(got, Ok((want, Shape::new(shape))), "{} of {dtype}", op.name());
                }
                None => assert_eq!(
                    got,
                    Err(IrError::UnsupportedDType { op: op.name().into(), dtype }),
                    "{} of {dtype}",
                    op.name()
                ),
            }
        }
    }
}

#[test]
fn integer_and_bool_sums_are_i64_and_their_means_are_errors() {
    use DType::*;
    check(I32, [Some(I64), None, Some(I32), Some(I32)]);
    check(I64, [Some(I64), None, Some(I64), Some(I64)]);
    check(Bool, [Some(I64), None, Some(Bool), Some(Bool)]);
}

#[test]
fn float_reductions_keep_the_dtype() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        check(dtype, [Some(dtype); 4]);
    }
}

#[test]
fn an_integer_mean_says_which_op_and_dtype() {
    let err = typed(ReduceOp::Mean, DType::I32, false).unwrap_err();
    assert_eq!(err.to_string(), "mean: not defined for dtype i32");
}
