//! Unary, binary, where and cast, with special values, broadcasting, zero-size tensors and the
//! rounding of f16/bf16 results.

mod common;

use braze_ir::{BinaryOp, DType, HostTensor, Op, UnaryOp};
use common::*;

/// Evaluates `op` on `inputs` and compares the result exactly with `expected`.
fn check(op: Op, inputs: &[HostTensor], expected: HostTensor) {
    let what = format!("{op:?} on {:?}", inputs.iter().map(|x| x.data()).collect::<Vec<_>>());
    let actual = run(|g, ids| g.add(op, ids, None).expect("op type-checks"), inputs);
    assert_identical(&actual, &expected, &what);
}

fn unary(op: UnaryOp) -> Op {
    Op::Unary { op }
}

fn binary(op: BinaryOp) -> Op {
    Op::Binary { op }
}

/// Inputs with every kind of special value; the expectations below are per element.
const X: [f64; 7] = [1.5, -2.0, -0.0, 0.0, NAN, INF, -INF];

/// Standard normal CDF at 1.5 and -2 (from tables), so `gelu_erf(x) = x * Phi(x)` is checked
/// against values computed without an erf.
const PHI_1_5: f64 = 0.933_192_798_731_141_9;
const PHI_MINUS_2: f64 = 0.022_750_131_948_179_21;

#[test]
fn float_unary_ops_on_special_values() {
    let e15 = 1.5f64.exp();
    let gelu_tanh = |x: f64| {
        let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3));
        0.5 * x * (1.0 + inner.tanh())
    };
    let cases: Vec<(UnaryOp, [f64; 7])> = vec![
        (UnaryOp::Neg, [-1.5, 2.0, 0.0, -0.0, NAN, -INF, INF]),
        (UnaryOp::Abs, [1.5, 2.0, 0.0, 0.0, NAN, INF, INF]),
        (UnaryOp::Exp, [e15, (-2.0f64).exp(), 1.0, 1.0, NAN, INF, 0.0]),
        (UnaryOp::Log, [1.5f64.ln(), NAN, -INF, -INF, NAN, INF, NAN]),
        (UnaryOp::Sqrt, [1.5f64.sqrt(), NAN, -0.0, 0.0, NAN, INF, NAN]),
        (UnaryOp::Rsqrt, [1.0 / 1.5f64.sqrt(), NAN, -INF, INF, NAN, 0.0, NAN]),
        (UnaryOp::Reciprocal, [2.0 / 3.0, -0.5, -INF, INF, NAN, 0.0, -0.0]),
        (UnaryOp::Relu, [1.5, 0.0, 0.0, 0.0, NAN, INF, 0.0]),
        (UnaryOp::GeluErf, [1.5 * PHI_1_5, -2.0 * PHI_MINUS_2, -0.0, 0.0, NAN, INF, NAN]),
        (UnaryOp::GeluTanh, [gelu_tanh(1.5), gelu_tanh(-2.0), -0.0, 0.0, NAN, INF, NAN]),
        (UnaryOp::Silu, [1.5 / (1.0 + 1.0 / e15), -2.0 / (1.0 + 2f64.exp()), -0.0, 0.0, NAN, INF, NAN]),
        (UnaryOp::Sigmoid, [1.0 / (1.0 + 1.0 / e15), 1.0 / (1.0 + 2f64.exp()), 0.5, 0.5, NAN, 1.0, 0.0]),
        (UnaryOp::Tanh, [1.5f64.tanh(), (-2.0f64).tanh(), -0.0, 0.0, NAN, 1.0, -1.0]),
    ];
    for (op, expected) in cases {
        check(unary(op), &[f32s(&[7], &X)], f32s(&[7], &expected));
    }
    let predicates = [
        (UnaryOp::IsNan, [false, false, false, false, true, false, false]),
        (UnaryOp::IsFinite, [true, true, true, true, false, false, false]),
        (UnaryOp::Not, [false, false, true, true, false, false, false]),
    ];
    for (op, expected) in predicates {
        check(unary(op), &[f32s(&[7], &X)], bools(&[7], &expected));
    }
}

/// erf at 1.5 and -2 (from tables).
const ERF_1_5: f64 = 0.966_105_146_475_310_7;
const ERF_MINUS_2: f64 = -0.995_322_265_018_952_7;
/// erfc(2.5) (from tables).
const ERFC_2_5: f64 = 4.069_520_174_449_59e-4;

#[test]
fn model_unary_ops_on_special_values() {
    let softplus = |x: f64| x.exp().ln_1p();
    let cases: Vec<(UnaryOp, [f64; 7])> = vec![
        (UnaryOp::Erf, [ERF_1_5, ERF_MINUS_2, -0.0, 0.0, NAN, 1.0, -1.0]),
        (UnaryOp::Erfc, [1.0 - ERF_1_5, 1.0 - ERF_MINUS_2, 1.0, 1.0, NAN, 0.0, 2.0]),
        (UnaryOp::Log1p, [2.5f64.ln(), NAN, -0.0, 0.0, NAN, INF, NAN]),
        (UnaryOp::Expm1, [1.5f64.exp() - 1.0, (-2.0f64).exp() - 1.0, -0.0, 0.0, NAN, INF, -1.0]),
        (UnaryOp::Sin, [1.5f64.sin(), (-2.0f64).sin(), -0.0, 0.0, NAN, NAN, NAN]),
        (UnaryOp::Cos, [1.5f64.cos(), (-2.0f64).cos(), 1.0, 1.0, NAN, NAN, NAN]),
        (UnaryOp::Floor, [1.0, -2.0, -0.0, 0.0, NAN, INF, -INF]),
        (UnaryOp::Ceil, [2.0, -2.0, -0.0, 0.0, NAN, INF, -INF]),
        (UnaryOp::Round, [2.0, -2.0, -0.0, 0.0, NAN, INF, -INF]),
        (UnaryOp::Sign, [1.0, -1.0, -0.0, 0.0, NAN, 1.0, -1.0]),
        (UnaryOp::Softplus, [softplus(1.5), softplus(-2.0), 2f64.ln(), 2f64.ln(), NAN, INF, 0.0]),
        (UnaryOp::Square, [2.25, 4.0, 0.0, 0.0, NAN, INF, INF]),
    ];
    for (op, expected) in cases {
        check(unary(op), &[f32s(&[7], &X)], f32s(&[7], &expected));
    }
}

/// Subnormal, huge and half-way inputs.
const EDGES: [f64; 7] = [1e-40, -1e-40, 3e38, -3e38, 2.5, -2.5, 0.5];

#[test]
fn model_unary_ops_on_subnormal_huge_and_halfway_values() {
    let (big, small) = (3e38f32 as f64, 1e-40f32 as f64);
    let softplus = |x: f64| x.exp().ln_1p();
    let cases: Vec<(UnaryOp, [f64; 7])> = vec![
        // erf(x) = 2x / sqrt(pi) near 0: a subnormal result.
        (
            UnaryOp::Erf,
            [
                small * std::f64::consts::FRAC_2_SQRT_PI,
                -small * std::f64::consts::FRAC_2_SQRT_PI,
                1.0,
                -1.0,
                0.999_593_047_982_555,
                -0.999_593_047_982_555,
                0.520_499_877_813_046_5,
            ],
        ),
        // erfc keeps its relative accuracy far out, where 1 - erf is 0.
        (UnaryOp::Erfc, [1.0, 1.0, 0.0, 2.0, ERFC_2_5, 2.0 - ERFC_2_5, 0.479_500_122_186_953_5]),
        // log1p and expm1 keep tiny inputs instead of losing them to 1 + x.
        (UnaryOp::Log1p, [small, -small, big.ln(), NAN, 3.5f64.ln(), NAN, 1.5f64.ln()]),
        (UnaryOp::Expm1, [small, -small, INF, -1.0, 2.5f64.exp() - 1.0, (-2.5f64).exp() - 1.0, 0.5f64.exp() - 1.0]),
        (UnaryOp::Floor, [0.0, -1.0, big, -big, 2.0, -3.0, 0.0]),
        (UnaryOp::Ceil, [1.0, -0.0, big, -big, 3.0, -2.0, 1.0]),
        // Halves go to the even neighbour.
        (UnaryOp::Round, [0.0, -0.0, big, -big, 2.0, -2.0, 0.0]),
        (UnaryOp::Sign, [1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0]),
        (UnaryOp::Softplus, [2f64.ln(), 2f64.ln(), big, 0.0, softplus(2.5), softplus(-2.5), softplus(0.5)]),
        (UnaryOp::Square, [0.0, 0.0, INF, INF, 6.25, 6.25, 0.25]),
        (UnaryOp::Sin, [small, -small, big.sin(), -big.sin(), 2.5f64.sin(), -2.5f64.sin(), 0.5f64.sin()]),
        (UnaryOp::Cos, [1.0, 1.0, big.cos(), big.cos(), 2.5f64.cos(), 2.5f64.cos(), 0.5f64.cos()]),
    ];
    for (op, expected) in cases {
        check(unary(op), &[f32s(&[7], &EDGES)], f32s(&[7], &expected));
    }
}

#[test]
fn integer_and_bool_unary_ops() {
    let x = i32s(&[4], &[5, -3, 0, i32::MIN]);
    let cases = [
        (UnaryOp::Neg, i32s(&[4], &[-5, 3, 0, i32::MIN])),
        (UnaryOp::Abs, i32s(&[4], &[5, 3, 0, i32::MIN])),
        (UnaryOp::Relu, i32s(&[4], &[5, 0, 0, 0])),
        (UnaryOp::IsNan, bools(&[4], &[false; 4])),
        (UnaryOp::IsFinite, bools(&[4], &[true; 4])),
        (UnaryOp::Not, bools(&[4], &[false, false, true, false])),
        (UnaryOp::Floor, x.clone()),
        (UnaryOp::Ceil, x.clone()),
        (UnaryOp::Round, x.clone()),
        (UnaryOp::Sign, i32s(&[4], &[1, -1, 0, -1])),
        // 25, 9, 0, and i32::MIN squared wraps to 0.
        (UnaryOp::Square, i32s(&[4], &[25, 9, 0, 0])),
    ];
    for (op, expected) in cases {
        check(unary(op), std::slice::from_ref(&x), expected);
    }
    check(unary(UnaryOp::Not), &[bools(&[2], &[true, false])], bools(&[2], &[false, true]));
}

/// A binary op written out in f64.
type Reference = fn(f64, f64) -> f64;

#[test]
fn float_binary_ops_broadcast_column_with_row() {
    let a = f32s(&[3, 1], &[1.0, 2.0, 3.0]);
    let b = f32s(&[1, 4], &[10.0, 20.0, 30.0, 40.0]);
    let table = |f: fn(f64, f64) -> f64| -> Vec<f64> {
        (0..3).flat_map(|i| (0..4).map(move |j| f((i + 1) as f64, (10 * (j + 1)) as f64))).collect()
    };
    let cases: Vec<(BinaryOp, Reference)> = vec![
        (BinaryOp::Add, |x, y| x + y),
        (BinaryOp::Sub, |x, y| x - y),
        (BinaryOp::Mul, |x, y| x * y),
        (BinaryOp::Div, |x, y| x / y),
        (BinaryOp::Max, |x, y| if x > y { x } else { y }),
        (BinaryOp::Min, |x, y| if x < y { x } else { y }),
        (BinaryOp::Pow, |x, y| x.powf(y)),
    ];
    for (op, f) in cases {
        check(binary(op), &[a.clone(), b.clone()], f32s(&[3, 4], &table(f)));
    }
    let lt: Vec<bool> = (0..12).map(|_| true).collect();
    check(binary(BinaryOp::Lt), &[a, b], bools(&[3, 4], &lt));
}

#[test]
fn scalar_operands_broadcast() {
    let s = f32s(&[], &[2.0]);
    let m = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    check(binary(BinaryOp::Sub), &[s.clone(), m.clone()], f32s(&[2, 3], &[1.0, 0.0, -1.0, -2.0, -3.0, -4.0]));
    check(binary(BinaryOp::Pow), &[m, s.clone()], f32s(&[2, 3], &[1.0, 4.0, 9.0, 16.0, 25.0, 36.0]));
    check(binary(BinaryOp::Mul), &[s.clone(), f32s(&[], &[-3.5])], f32s(&[], &[-7.0]));
    check(binary(BinaryOp::Ge), &[s.clone(), s], bools(&[], &[true]));
}

#[test]
fn integer_binary_ops_wrap_and_divide_by_zero_to_zero() {
    let a = i32s(&[6], &[7, -7, 7, -7, 0, i32::MIN]);
    let b = i32s(&[6], &[2, 2, -2, 0, 0, -1]);
    check(binary(BinaryOp::Div), &[a.clone(), b.clone()], i32s(&[6], &[3, -3, -3, 0, 0, i32::MIN]));
    check(binary(BinaryOp::Mul), &[a.clone(), b.clone()], i32s(&[6], &[14, -14, -14, 0, 0, i32::MIN]));
    check(binary(BinaryOp::Max), &[a.clone(), b.clone()], i32s(&[6], &[7, 2, 7, 0, 0, -1]));
    check(binary(BinaryOp::Min), &[a, b], i32s(&[6], &[2, -7, -2, -7, 0, i32::MIN]));
    let max = i32s(&[2], &[i32::MAX, i32::MIN]);
    let one = i32s(&[], &[1]);
    check(binary(BinaryOp::Add), &[max.clone(), one.clone()], i32s(&[2], &[i32::MIN, i32::MIN + 1]));
    check(binary(BinaryOp::Sub), &[max, one], i32s(&[2], &[i32::MAX - 1, i32::MAX]));
    let big = t(DType::I64, &[1], &[(1i64 << 40) as f64]);
    check(binary(BinaryOp::Mul), &[big.clone(), big], t(DType::I64, &[1], &[0.0])); // 2^80 wraps to 0
    let lt = [false, true, false, true, false, true];
    check(binary(BinaryOp::Lt), &[i32s(&[6], &[7, -7, 7, -7, 0, i32::MIN]), i32s(&[], &[0])], bools(&[6], &lt));
}

#[test]
fn max_min_propagate_nan_and_order_signed_zeros() {
    let a = f32s(&[4], &[NAN, 1.0, 2.0, -0.0]);
    let b = f32s(&[4], &[1.0, NAN, 3.0, 0.0]);
    check(binary(BinaryOp::Max), &[a.clone(), b.clone()], f32s(&[4], &[NAN, NAN, 3.0, 0.0]));
    check(binary(BinaryOp::Min), &[a.clone(), b.clone()], f32s(&[4], &[NAN, NAN, 2.0, -0.0]));
    check(binary(BinaryOp::Max), &[b.clone(), a.clone()], f32s(&[4], &[NAN, NAN, 3.0, 0.0]));
    check(binary(BinaryOp::Min), &[b, a], f32s(&[4], &[NAN, NAN, 2.0, -0.0]));
}

#[test]
fn comparisons_are_ieee_with_nan() {
    let a = f32s(&[5], &[NAN, 1.0, 1.0, NAN, -0.0]);
    let b = f32s(&[5], &[1.0, NAN, 1.0, NAN, 0.0]);
    let cases = [
        (BinaryOp::Eq, [false, false, true, false, true]),
        (BinaryOp::Ne, [true, true, false, true, false]),
        (BinaryOp::Lt, [false, false, false, false, false]),
        (BinaryOp::Le, [false, false, true, false, true]),
        (BinaryOp::Gt, [false, false, false, false, false]),
        (BinaryOp::Ge, [false, false, true, false, true]),
    ];
    for (op, expected) in cases {
        check(binary(op), &[a.clone(), b.clone()], bools(&[5], &expected));
    }
}

#[test]
fn logical_ops_and_bool_comparisons() {
    let a = bools(&[4], &[false, false, true, true]);
    let b = bools(&[4], &[false, true, false, true]);
    check(binary(BinaryOp::And), &[a.clone(), b.clone()], bools(&[4], &[false, false, false, true]));
    check(binary(BinaryOp::Or), &[a.clone(), b.clone()], bools(&[4], &[false, true, true, true]));
    check(binary(BinaryOp::Lt), &[a.clone(), b.clone()], bools(&[4], &[false, true, false, false]));
    check(binary(BinaryOp::Ne), &[a, b], bools(&[4], &[false, true, true, false]));
}

#[test]
fn where_broadcasts_condition_and_branches() {
    let cond = bools(&[3, 1], &[true, false, true]);
    let a = f32s(&[1, 4], &[1.0, 2.0, 3.0, 4.0]);
    let b = f32s(&[], &[-1.0]);
    let expected = f32s(&[3, 4], &[1.0, 2.0, 3.0, 4.0, -1.0, -1.0, -1.0, -1.0, 1.0, 2.0, 3.0, 4.0]);
    check(Op::Where, &[cond, a, b], expected);
    let cond = bools(&[], &[false]);
    check(Op::Where, &[cond, i32s(&[2], &[1, 2]), i32s(&[2], &[3, 4])], i32s(&[2], &[3, 4]));
}

/// Evaluates a cast of `x` to `dtype` and compares exactly.
fn check_cast(x: HostTensor, dtype: DType, expected: HostTensor) {
    let what = format!("cast {:?} to {dtype}", x.data());
    let actual = run(|g, ids| g.cast(ids[0], dtype).expect("cast type-checks"), &[x]);
    assert_identical(&actual, &expected, &what);
}

#[test]
fn casts_truncate_saturate_wrap_and_test_nonzero() {
    let x = f32s(&[7], &[2.7, -2.7, NAN, 1e10, -1e10, INF, -0.5]);
    check_cast(x.clone(), DType::I32, i32s(&[7], &[2, -2, 0, i32::MAX, i32::MIN, i32::MAX, 0]));
    check_cast(x, DType::I64, t(DType::I64, &[7], &[2.0, -2.0, 0.0, 1e10, -1e10, i64::MAX as f64, 0.0]));
    let x = f32s(&[4], &[0.0, -0.0, NAN, 2.0]);
    check_cast(x, DType::Bool, bools(&[4], &[false, false, true, true]));
    check_cast(bools(&[2], &[true, false]), DType::F32, f32s(&[2], &[1.0, 0.0]));
    check_cast(bools(&[2], &[true, false]), DType::I64, t(DType::I64, &[2], &[1.0, 0.0]));
    check_cast(i32s(&[3], &[0, -3, 2]), DType::Bool, bools(&[3], &[false, true, true]));
    let wide = t(DType::I64, &[2], &[((1i64 << 32) + 5) as f64, -((1i64 << 31) + 1) as f64]);
    check_cast(wide, DType::I32, i32s(&[2], &[5, i32::MAX]));
    check_cast(f32s(&[2], &[70000.0, -70000.0]), DType::F16, t(DType::F16, &[2], &[INF, -INF]));
    check_cast(f32s(&[1], &[1.0 + 3.0 / 512.0]), DType::BF16, t(DType::BF16, &[1], &[1.0 + 1.0 / 128.0]));
}

#[test]
fn bf16_and_f16_results_round_to_nearest_even() {
    let bf = |values: &[f64]| t(DType::BF16, &[values.len()], values);
    let one = bf(&[1.0, 1.0, 1.0 + 1.0 / 128.0]);
    let small = bf(&[2f64.powi(-9), 2f64.powi(-8), 2f64.powi(-8)]);
    // 1 + 2^-9 is below half an ulp (2^-8); 1 + 2^-8 and 1 + 2^-7 + 2^-8 are ties to even.
    let expected = bf(&[1.0, 1.0, 1.0 + 2.0 / 128.0]);
    check(binary(BinaryOp::Add), &[one, small], expected);
    let f16 = |values: &[f64]| t(DType::F16, &[values.len()], values);
    check(binary(BinaryOp::Add), &[f16(&[1.0]), f16(&[2f64.powi(-11)])], f16(&[1.0]));
    check(binary(BinaryOp::Mul), &[f16(&[300.0]), f16(&[300.0])], f16(&[INF]));
}

#[test]
fn rounding_sees_bits_far_below_the_tie() {
    // Sums computed exactly in f64 that lie just above a tie: 1 + 2^-8 + 2^-40 rounds up to the
    // next bf16 (1 + 2^-7); dropping the low bits of the f64 first would round it down to 1.
    // For f16 the far bit is 2^-24, its smallest subnormal.
    let sum = |dtype: DType, tie: f64, far: f64| {
        let x = t(dtype, &[3], &[1.0, tie, far]);
        run(
            |g, ids| {
                let op = Op::Reduce { op: braze_ir::ReduceOp::Sum, axes: vec![0], keepdim: false };
                g.add(op, ids, None).expect("sum type-checks")
            },
            &[x],
        )
    };
    assert_identical(
        &sum(DType::BF16, 2f64.powi(-8), 2f64.powi(-40)),
        &t(DType::BF16, &[], &[1.0 + 2f64.powi(-7)]),
        "bf16",
    );
    assert_identical(
        &sum(DType::F16, 2f64.powi(-11), 2f64.powi(-24)),
        &t(DType::F16, &[], &[1.0 + 2f64.powi(-10)]),
        "f16",
    );
}

#[test]
fn zero_size_tensors_pass_through_elementwise_ops() {
    let empty_rows = f32s(&[0, 4], &[]);
    check(unary(UnaryOp::Exp), std::slice::from_ref(&empty_rows), f32s(&[0, 4], &[]));
    check(binary(BinaryOp::Add), &[empty_rows.clone(), f32s(&[4], &[1.0; 4])], f32s(&[0, 4], &[]));
    check(binary(BinaryOp::Mul), &[f32s(&[3, 0], &[]), f32s(&[3, 1], &[1.0; 3])], f32s(&[3, 0], &[]));
    check(binary(BinaryOp::Lt), &[empty_rows.clone(), f32s(&[], &[0.0])], bools(&[0, 4], &[]));
    check(Op::Where, &[bools(&[3, 0], &[]), f32s(&[], &[1.0]), f32s(&[3, 1], &[2.0; 3])], f32s(&[3, 0], &[]));
    check_cast(empty_rows, DType::I32, i32s(&[0, 4], &[]));
}

#[test]
fn constants_take_the_node_dtype() {
    let cases = [
        (DType::F32, 0.1, f32s(&[], &[0.1])),
        (DType::BF16, 1.0 + 2f64.powi(-9), t(DType::BF16, &[], &[1.0])),
        (DType::I32, -2.9, i32s(&[], &[-2])),
        (DType::Bool, 0.5, bools(&[], &[true])),
    ];
    for (dtype, value, expected) in cases {
        let actual = run(|g, _| g.constant(value, dtype), &[]);
        assert_identical(&actual, &expected, &format!("constant {value} as {dtype}"));
    }
}
