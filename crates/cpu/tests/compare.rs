//! The correctness helpers: tolerant comparison, reproducible random data and special values.

mod common;

use braze_cpu::{assert_close, compare, inject_specials, random_tensor, tolerance};
use braze_ir::{DType, HostTensor};
use common::*;

/// `assert_close(actual, expected)` passes exactly when `pass` says.
fn check(actual: HostTensor, expected: HostTensor, pass: bool) {
    let result = assert_close(&actual, &expected);
    assert_eq!(result.is_ok(), pass, "{:?} vs {:?}: {result:?}", actual.data(), expected.data());
}

#[test]
fn close_floats_pass_and_far_ones_fail() {
    let e = [1.0, -2.0, 100.0, 0.0];
    check(f32s(&[4], &[1.0 + 5e-6, -2.0, 100.0 + 9e-4, 5e-6]), f32s(&[4], &e), true);
    check(f32s(&[4], &[1.0 + 3e-5, -2.0, 100.0, 0.0]), f32s(&[4], &e), false);
    check(f32s(&[4], &[1.0, -2.0, 100.0, 2e-5]), f32s(&[4], &e), false);
    check(t(DType::BF16, &[1], &[1.0078125]), t(DType::BF16, &[1], &[1.0]), true);
    check(t(DType::BF16, &[1], &[1.03125]), t(DType::BF16, &[1], &[1.0]), false);
    check(t(DType::F16, &[1], &[1.0009765625]), t(DType::F16, &[1], &[1.0]), true);
    check(t(DType::F16, &[1], &[1.00390625]), t(DType::F16, &[1], &[1.0]), false);
}

#[test]
fn specials_must_sit_in_the_same_places() {
    check(f32s(&[3], &[NAN, INF, -INF]), f32s(&[3], &[NAN, INF, -INF]), true);
    check(f32s(&[2], &[NAN, 1.0]), f32s(&[2], &[1.0, NAN]), false);
    check(f32s(&[1], &[1.0]), f32s(&[1], &[NAN]), false);
    check(f32s(&[1], &[INF]), f32s(&[1], &[-INF]), false);
    check(f32s(&[1], &[3e38]), f32s(&[1], &[INF]), false);
    check(f32s(&[1], &[-0.0]), f32s(&[1], &[0.0]), true);
}

#[test]
fn integers_bools_dtypes_and_shapes_are_exact() {
    check(i32s(&[2], &[1, 2]), i32s(&[2], &[1, 2]), true);
    check(i32s(&[2], &[1, 3]), i32s(&[2], &[1, 2]), false);
    let big = |v: i64| HostTensor::new([1], braze_ir::HostData::I64(vec![v])).unwrap();
    check(big(i64::MAX), big(i64::MAX - 1), false);
    check(bools(&[2], &[true, false]), bools(&[2], &[true, true]), false);
    check(f32s(&[2], &[1.0, 2.0]), f32s(&[1, 2], &[1.0, 2.0]), false);
    check(f32s(&[1], &[1.0]), t(DType::F16, &[1], &[1.0]), false);
    check(f32s(&[0, 3], &[]), f32s(&[0, 3], &[]), true);
    assert_eq!(tolerance(DType::I64), (0.0, 0.0));
    assert_eq!(tolerance(DType::F32), (1e-5, 1e-5));
}

#[test]
fn reports_name_the_first_mismatch() {
    let e = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let a = f32s(&[2, 2], &[1.0, 2.5, 3.0, 4.5]);
    let report = compare(&a, &e, 1e-5, 1e-5).unwrap();
    assert_eq!(report.mismatches, 2);
    let first = report.first_mismatch.clone().unwrap();
    assert_eq!((first.index, first.coord, first.actual, first.expected), (1, vec![0, 1], 2.5, 2.0));
    assert_eq!(report.max_abs_error, 0.5);
    assert_eq!(report.max_rel_error, 0.25);
    let message = assert_close(&a, &e).unwrap_err();
    assert!(message.starts_with("2 of 4 elements differ; first at index 1 [0,1]: actual 2.5, expected 2"), "{message}");
    assert_eq!(assert_close(&a, &f32s(&[4], &[0.0; 4])).unwrap_err(), "expected f32[4], got f32[2,2]");
}

#[test]
fn random_tensors_are_reproducible_and_plausible() {
    let a = random_tensor(DType::F32, [64, 64], 7);
    assert_eq!(a, random_tensor(DType::F32, [64, 64], 7));
    assert_ne!(a, random_tensor(DType::F32, [64, 64], 8));
    let v = a.to_f64_vec();
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
    assert!(mean.abs() < 0.1 && (var - 1.0).abs() < 0.1, "mean {mean}, var {var}");
    // Pinned values: the generator must not change, or stored expectations elsewhere break.
    let first = random_tensor(DType::F32, [3], 0).to_f64_vec();
    assert_eq!(first, [-1.8839083909988403, 0.8645068407058716, 0.22760793566703796]);
    assert_eq!(random_tensor(DType::I32, [4], 0).to_f64_vec(), [4.0, 4.0, 1.0, -6.0]);

    let ints = random_tensor(DType::I32, [1000], 3).to_f64_vec();
    assert!(ints.iter().all(|&x| (-8.0..=8.0).contains(&x)));
    assert!(ints.contains(&-8.0) && ints.contains(&8.0) && ints.contains(&0.0));
    let flags = random_tensor(DType::Bool, [1000], 3).to_f64_vec();
    let trues = flags.iter().filter(|&&x| x == 1.0).count();
    assert!((400..600).contains(&trues), "{trues} of 1000 true");
    assert_eq!(random_tensor(DType::BF16, [3, 0], 1).numel(), 0);
}

#[test]
fn random_tensors_are_never_all_zero() {
    for seed in 0..200 {
        for dtype in [DType::I32, DType::I64, DType::Bool] {
            let x = random_tensor(dtype, [1], seed);
            assert_ne!(x.get_f64(0), 0.0, "{dtype} seed {seed}");
        }
    }
}

#[test]
fn specials_are_injected_at_about_the_stated_rates() {
    let mut x = random_tensor(DType::F32, [10000], 1);
    inject_specials(&mut x, 2);
    let v = x.to_f64_vec();
    let count = |f: &dyn Fn(f64) -> bool| v.iter().filter(|&&x| f(x)).count();
    let nans = count(&|x| x.is_nan());
    let pos_inf = count(&|x| x == INF);
    let neg_inf = count(&|x| x == -INF);
    let zeros = count(&|x| x == 0.0);
    let neg_zeros = count(&|x| x == 0.0 && x.is_sign_negative());
    assert!((400..600).contains(&nans), "{nans} NaN");
    assert!((130..270).contains(&pos_inf), "{pos_inf} +inf");
    assert!((130..270).contains(&neg_inf), "{neg_inf} -inf");
    assert!((400..600).contains(&zeros) && neg_zeros > 100, "{zeros} zeros, {neg_zeros} negative");
    let mut again = random_tensor(DType::F32, [10000], 1);
    inject_specials(&mut again, 2);
    assert!(assert_close(&again, &x).is_ok());
    let mut ints = random_tensor(DType::I32, [100], 1);
    let before = ints.clone();
    inject_specials(&mut ints, 2);
    assert_eq!(ints, before);
}
