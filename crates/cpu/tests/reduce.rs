//! Reductions: every op over several axis sets, with and without kept dims, special values,
//! integers, bools and empty axes. Expectations are worked out by hand.

mod common;

use braze_ir::{DType, HostTensor, Op, ReduceOp};
use common::*;

/// Reduces `x` with `op` over `axes` and compares exactly with `expected`.
fn check(x: &HostTensor, op: ReduceOp, axes: &[usize], keepdim: bool, expected: HostTensor) {
    let what = format!("{} over {axes:?} (keepdim {keepdim}) of {}{}", op.name(), x.dtype(), x.shape());
    let reduce = Op::Reduce { op, axes: axes.to_vec(), keepdim };
    let actual = run(|g, ids| g.add(reduce, ids, None).expect("reduce type-checks"), std::slice::from_ref(x));
    assert_identical(&actual, &expected, &what);
}

/// op, axes, keepdim, result shape, result values.
type Case = (ReduceOp, &'static [usize], bool, &'static [usize], Vec<f64>);

#[test]
fn float_reductions_over_axis_sets() {
    // x[a, b, c] = 12a + 4b + c.
    let x = arange(&[2, 3, 4]);
    use ReduceOp::*;
    let cases: Vec<Case> = vec![
        (Sum, &[0], false, &[3, 4], (0..12).map(|i| (2 * i + 12) as f64).collect()),
        (Sum, &[1], true, &[2, 1, 4], vec![12.0, 15.0, 18.0, 21.0, 48.0, 51.0, 54.0, 57.0]),
        (Sum, &[2], false, &[2, 3], vec![6.0, 22.0, 38.0, 54.0, 70.0, 86.0]),
        (Sum, &[0, 2], false, &[3], vec![60.0, 92.0, 124.0]),
        (Sum, &[0, 1, 2], false, &[], vec![276.0]),
        (Sum, &[0, 1, 2], true, &[1, 1, 1], vec![276.0]),
        (Mean, &[1], false, &[2, 4], vec![4.0, 5.0, 6.0, 7.0, 16.0, 17.0, 18.0, 19.0]),
        (Mean, &[0, 2], true, &[1, 3, 1], vec![7.5, 11.5, 15.5]),
        (Max, &[1], true, &[2, 1, 4], vec![8.0, 9.0, 10.0, 11.0, 20.0, 21.0, 22.0, 23.0]),
        (Max, &[0, 2], false, &[3], vec![15.0, 19.0, 23.0]),
        (Min, &[0, 1], false, &[4], vec![0.0, 1.0, 2.0, 3.0]),
        (Min, &[2], true, &[2, 3, 1], vec![0.0, 4.0, 8.0, 12.0, 16.0, 20.0]),
    ];
    for (op, axes, keepdim, shape, values) in cases {
        check(&x, op, axes, keepdim, f32s(shape, &values));
    }
}

#[test]
fn float_reductions_propagate_nan_and_infinities() {
    let x = f32s(&[3, 2], &[1.0, NAN, 3.0, 4.0, INF, -INF]);
    check(&x, ReduceOp::Max, &[1], false, f32s(&[3], &[NAN, 4.0, INF]));
    check(&x, ReduceOp::Min, &[1], false, f32s(&[3], &[NAN, 3.0, -INF]));
    check(&x, ReduceOp::Sum, &[1], false, f32s(&[3], &[NAN, 7.0, NAN]));
    check(&x, ReduceOp::Mean, &[1], false, f32s(&[3], &[NAN, 3.5, NAN]));
    check(&x, ReduceOp::Max, &[0], false, f32s(&[2], &[INF, NAN]));
}

#[test]
fn float_sums_accumulate_in_f64() {
    // In f32, 2^24 + 1 + 1 would stay 2^24; in f64 the sum is exact and rounds to 2^24 + 2.
    let x = f32s(&[3], &[16_777_216.0, 1.0, 1.0]);
    check(&x, ReduceOp::Sum, &[0], false, f32s(&[], &[16_777_218.0]));
    let x = t(DType::BF16, &[4], &[1.0; 4]);
    check(&x, ReduceOp::Mean, &[0], false, t(DType::BF16, &[], &[1.0]));
}

#[test]
fn integer_and_bool_reductions() {
    // Sums are i64, as PyTorch's: i32::MAX + 1 does not wrap.
    let big = i32::MAX as i64;
    let x = i32s(&[2, 3], &[1, -5, 3, i32::MAX, 1, 0]);
    check(&x, ReduceOp::Sum, &[1], false, i64s(&[2], &[-1, big + 1]));
    check(&x, ReduceOp::Max, &[1], true, i32s(&[2, 1], &[3, i32::MAX]));
    check(&x, ReduceOp::Min, &[0, 1], false, i32s(&[], &[-5]));
    check(&x, ReduceOp::Sum, &[0], false, i64s(&[3], &[big + 1, -4, 3]));
    // i64 sums wrap in i64.
    let longs = i64s(&[2], &[i64::MAX, 1]);
    check(&longs, ReduceOp::Sum, &[0], false, i64s(&[], &[i64::MIN]));
    let b = bools(&[2, 2], &[true, false, false, false]);
    check(&b, ReduceOp::Sum, &[1], false, i64s(&[2], &[1, 0]));
    check(&b, ReduceOp::Sum, &[0, 1], true, i64s(&[1, 1], &[1]));
    check(&b, ReduceOp::Max, &[1], false, bools(&[2], &[true, false]));
    check(&b, ReduceOp::Min, &[1], false, bools(&[2], &[false, false]));
    check(&b, ReduceOp::Max, &[0, 1], false, bools(&[], &[true]));
    check(&bools(&[2], &[true, true]), ReduceOp::Min, &[0], false, bools(&[], &[true]));
}

#[test]
fn empty_reductions_give_the_identity() {
    let x = f32s(&[0, 4], &[]);
    check(&x, ReduceOp::Sum, &[0], false, f32s(&[4], &[0.0; 4]));
    check(&x, ReduceOp::Mean, &[0], true, f32s(&[1, 4], &[NAN; 4]));
    check(&x, ReduceOp::Max, &[0], false, f32s(&[4], &[-INF; 4]));
    check(&x, ReduceOp::Min, &[0], false, f32s(&[4], &[INF; 4]));
    check(&x, ReduceOp::Sum, &[0, 1], false, f32s(&[], &[0.0]));
    check(&x, ReduceOp::Sum, &[1], false, f32s(&[0], &[]));
    check(&x, ReduceOp::Max, &[1], true, f32s(&[0, 1], &[]));
    let ints = i32s(&[0, 3], &[]);
    check(&ints, ReduceOp::Max, &[0], false, i32s(&[3], &[i32::MIN; 3]));
    check(&ints, ReduceOp::Min, &[0], false, i32s(&[3], &[i32::MAX; 3]));
    check(&ints, ReduceOp::Sum, &[0], false, i64s(&[3], &[0; 3]));
    let longs = t(DType::I64, &[0], &[]);
    check(&longs, ReduceOp::Max, &[0], false, HostTensor::full(DType::I64, [], i64::MIN as f64));
    let flags = bools(&[2, 0], &[]);
    check(&flags, ReduceOp::Max, &[1], false, bools(&[2], &[false, false]));
    check(&flags, ReduceOp::Min, &[1], false, bools(&[2], &[true, true]));
    check(&flags, ReduceOp::Sum, &[1], false, i64s(&[2], &[0, 0]));
}
