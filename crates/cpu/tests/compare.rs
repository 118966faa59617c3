//! The correctness helpers: tolerant comparison, reproducible random data and special values.

mod common;

use braze_cpu::{assert_close, assert_close_bounded, compare, inject_specials, random_tensor, tolerance, ulp, Bounds};
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

// ---- the bounded comparator of the GPU suites -----------------------------------------------------

/// A bf16 result of 64 rows of 256 (a matmul's shape), its reference, and the bounds of a
/// computation that rounds to bf16.
fn bf16_rows() -> (HostTensor, Bounds) {
    let expected = random_tensor(DType::BF16, [64, 256], 11);
    let bounds = Bounds::for_rounding(DType::BF16, [DType::BF16, DType::F32], expected.numel());
    (expected, bounds)
}

/// `expected` with `change` applied to its values.
fn changed(expected: &HostTensor, change: impl FnOnce(&mut Vec<f64>)) -> HostTensor {
    let mut values = expected.to_f64_vec();
    change(&mut values);
    HostTensor::from_f64(expected.dtype(), expected.shape().clone(), &values).unwrap()
}

/// `x` moved `ulps` bf16 ulps beyond the bf16 tolerance, away from zero.
fn beyond(x: f64, ulps: f64) -> f64 {
    let (rtol, atol) = tolerance(DType::BF16);
    x + x.signum() * (atol + rtol * x.abs() + ulps * ulp(DType::BF16, x))
}

#[test]
fn bounds_follow_the_narrowest_rounding_dtype() {
    let b = Bounds::for_rounding(DType::F32, [DType::F32, DType::BF16, DType::I32], 10_000);
    assert_eq!((b.rtol, b.atol, b.rounding, b.outliers, b.outlier_ulps), (1.6e-2, 1e-2, DType::BF16, 10, 4.0));
    let b = Bounds::for_rounding(DType::F32, [DType::F32], 100);
    assert_eq!((b.rtol, b.atol, b.outliers), (1e-5, 1e-5, 4));
    let b = Bounds::for_rounding(DType::I32, [DType::BF16], 100);
    assert_eq!((b.rtol, b.atol, b.outliers), (0.0, 0.0, 0));
    assert_eq!(ulp(DType::BF16, 1.5), 2f64.powi(-7));
    assert_eq!(ulp(DType::F16, -3.0), 2f64.powi(-9));
    assert_eq!(ulp(DType::F16, 0.0), 2f64.powi(-24));
}

#[test]
fn a_few_elements_a_few_ulps_beyond_the_tolerance_pass() {
    let (expected, bounds) = bf16_rows();
    assert_eq!(bounds.outliers, 16);
    let actual = changed(&expected, |v| (0..16).for_each(|i| v[i * 1000] = beyond(v[i * 1000], 2.0)));
    assert_close_bounded(&actual, &expected, None, &bounds).unwrap();
    // One more is too many.
    let actual = changed(&expected, |v| (0..17).for_each(|i| v[i * 900] = beyond(v[i * 900], 2.0)));
    let err = assert_close_bounded(&actual, &expected, None, &bounds).unwrap_err();
    assert!(err.starts_with("17 of 16384 elements beyond rtol"), "{err}");
    // One element too far is enough: 8 ulps at a value above the tensor's RMS (ulps are taken
    // at the element or the RMS, whichever is larger).
    let values = expected.to_f64_vec();
    let big = (0..values.len()).max_by(|&i, &j| values[i].abs().total_cmp(&values[j].abs())).unwrap();
    let actual = changed(&expected, |v| v[big] = beyond(v[big], 8.0));
    let err = assert_close_bounded(&actual, &expected, None, &bounds).unwrap_err();
    assert!(err.contains("1 by more; worst") && err.contains(&format!("at index {big} [")), "{err}");
    // The same excess on an element far below the RMS is a rounding carried into a cancellation:
    // measured in ulps at the RMS, it stays within the allowance.
    let small = (0..values.len()).min_by(|&i, &j| values[i].abs().total_cmp(&values[j].abs())).unwrap();
    let rms = (values.iter().map(|v| v * v).sum::<f64>() / values.len() as f64).sqrt();
    let (rtol, atol) = tolerance(DType::BF16);
    let off = atol + rtol * values[small].abs() + 2.0 * ulp(DType::BF16, rms);
    assert!(off / ulp(DType::BF16, values[small]) > 8.0, "many ulps at the element itself");
    let actual = changed(&expected, |v| v[small] += off);
    assert_close_bounded(&actual, &expected, None, &bounds).unwrap();
}

#[test]
fn the_bounded_comparator_catches_a_wrong_row() {
    let (expected, bounds) = bf16_rows();
    // Row 9 a little off: each element only 3 ulps beyond, but 256 of them.
    let actual = changed(&expected, |v| v[9 * 256..10 * 256].iter_mut().for_each(|x| *x = beyond(*x, 3.0)));
    let err = assert_close_bounded(&actual, &expected, None, &bounds).unwrap_err();
    assert!(err.starts_with("256 of 16384 elements beyond"), "{err}");
    // Row 9 another row's values.
    let actual = changed(&expected, |v| {
        let row: Vec<f64> = v[256..512].to_vec();
        v[9 * 256..10 * 256].copy_from_slice(&row);
    });
    assert!(assert_close_bounded(&actual, &expected, None, &bounds).is_err());
}

#[test]
fn the_bounded_comparator_catches_a_wrong_vector_tail() {
    let (expected, bounds) = bf16_rows();
    // The last 3 elements (past the last full vector of 4 or 8) left at zero, or garbage.
    for tail in [0.0, 1e3] {
        let actual = changed(&expected, |v| {
            let n = v.len();
            v[n - 3..].iter_mut().for_each(|x| *x = tail);
        });
        let err = assert_close_bounded(&actual, &expected, None, &bounds).unwrap_err();
        assert!(err.contains("first at index 16381 [63,253]"), "{err}");
    }
}

#[test]
fn the_bounded_comparator_catches_a_nan_where_the_reference_is_finite() {
    let (expected, bounds) = bf16_rows();
    for bad in [NAN, INF] {
        let actual = changed(&expected, |v| v[100] = bad);
        let wide = changed(&expected, |v| v[100] = bad);
        // Not even when the wide reference has it: NaN and Inf sit where the reference has them.
        for wide in [None, Some(&wide)] {
            let err = assert_close_bounded(&actual, &expected, wide, &bounds).unwrap_err();
            assert!(err.contains("worst inf ulps at index 100"), "{err}");
        }
    }
    let nan_reference = changed(&expected, |v| v[100] = NAN);
    assert!(assert_close_bounded(&expected, &nan_reference, None, &bounds).is_err());
    assert!(assert_close_bounded(&nan_reference, &nan_reference, None, &bounds).is_ok());
}

#[test]
fn elements_near_the_wide_reference_pass() {
    let (expected, bounds) = bf16_rows();
    // Every element 10 ulps off the reference, on the wide reference: a compiled graph that kept
    // bf16 intermediates in f32.
    let actual = changed(&expected, |v| v.iter_mut().for_each(|x| *x = beyond(*x, 10.0)));
    assert!(assert_close_bounded(&actual, &expected, None, &bounds).is_err());
    assert_close_bounded(&actual, &expected, Some(&actual), &bounds).unwrap();
}
