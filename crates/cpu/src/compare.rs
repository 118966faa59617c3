//! Correctness checks of computed tensors against the reference.
//!
//! Floats pass when NaNs sit in exactly the same places, infinities are equal, and every other
//! element satisfies `|actual - expected| <= atol + rtol * |expected|`. The tolerances per dtype
//! ([`tolerance`]):
//!
//! | dtype | rtol   | atol  | why |
//! |-------|--------|-------|-----|
//! | f32   | 1e-5   | 1e-5  | fused kernels compute in f32 and reduce in another order; this admits f32 sums over ~16K elements and transcendental approximations of a few ulp |
//! | f16   | 1e-3   | 1e-3  | about two ulp of f16's 11-bit significand, for a different rounding of the f32 value |
//! | bf16  | 1.6e-2 | 1e-2  | about two ulp of bf16's 8-bit significand |
//! | ints, bool | 0 | 0    | exact |
//!
//! [`assert_close_bounded`] judges outputs of computations that round to bf16/f16 on the way,
//! where a compiled graph (narrow intermediates kept in f32) and the op-by-op reference (every
//! op rounded) legitimately differ: the tolerance of the narrowest dtype the computation rounds
//! to, against the reference or a wide reference, and at most [`Bounds::outliers`] elements a few
//! units in the last place beyond it. A wrong row or a wrong vector tail cannot hide in it.

use crate::scalar::{Scalar, ScalarExt};
use braze_ir::{DType, HostTensor};
use std::fmt;

/// `(rtol, atol)` for comparing tensors of `dtype`; both 0 (exact) for integers and bools.
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (1e-5, 1e-5),
        DType::F16 => (1e-3, 1e-3),
        DType::BF16 => (1.6e-2, 1e-2),
        DType::I32 | DType::I64 | DType::Bool => (0.0, 0.0),
    }
}

/// The first element that differs.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// Row-major flat index.
    pub index: usize,
    /// The same position as a coordinate.
    pub coord: Vec<usize>,
    pub actual: f64,
    pub expected: f64,
}

/// What a comparison found. Errors are measured over the elements where both sides are finite.
#[derive(Clone, Debug, PartialEq)]
pub struct CompareReport {
    pub numel: usize,
    pub rtol: f64,
    pub atol: f64,
    pub max_abs_error: f64,
    /// `|a - e| / |e|` over the elements with `e != 0`.
    pub max_rel_error: f64,
    /// How many elements are out of tolerance (or differ in NaN/Inf).
    pub mismatches: usize,
    pub first_mismatch: Option<Mismatch>,
}

impl CompareReport {
    pub fn passed(&self) -> bool {
        self.mismatches == 0
    }
}

impl fmt::Display for CompareReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(m) = &self.first_mismatch {
            let coord: Vec<String> = m.coord.iter().map(|c| c.to_string()).collect();
            write!(
                f,
                "{} of {} elements differ; first at index {} [{}]: actual {}, expected {}; ",
                self.mismatches,
                self.numel,
                m.index,
                coord.join(","),
                m.actual,
                m.expected
            )?;
        } else {
            write!(f, "all {} elements match; ", self.numel)?;
        }
        write!(
            f,
            "max abs error {:e}, max rel error {:e} (rtol {:e}, atol {:e})",
            self.max_abs_error, self.max_rel_error, self.rtol, self.atol
        )
    }
}

/// `Err` naming both when the dtypes or shapes differ.
fn same_type(actual: &HostTensor, expected: &HostTensor) -> std::result::Result<(), String> {
    if actual.dtype() != expected.dtype() || actual.shape() != expected.shape() {
        return Err(format!(
            "expected {}{}, got {}{}",
            expected.dtype(),
            expected.shape(),
            actual.dtype(),
            actual.shape()
        ));
    }
    Ok(())
}

/// Compares element by element with the given tolerances. `Err` when dtype or shape differ.
pub fn compare(
    actual: &HostTensor,
    expected: &HostTensor,
    rtol: f64,
    atol: f64,
) -> std::result::Result<CompareReport, String> {
    compare_either(actual, expected, None, rtol, atol)
}

/// [`compare`], where an element also passes within the tolerances of `wide` (the computation
/// with narrow intermediates kept in f32, [`crate::wide_graph`]), a result a fused kernel may
/// legitimately come near instead. NaN and Inf are judged against `expected` alone; the errors
/// reported are against `expected`.
pub fn compare_either(
    actual: &HostTensor,
    expected: &HostTensor,
    wide: Option<&HostTensor>,
    rtol: f64,
    atol: f64,
) -> std::result::Result<CompareReport, String> {
    same_type(actual, expected)?;
    if let Some(w) = wide {
        same_type(w, expected).map_err(|e| format!("the wide reference: {e}"))?;
    }
    let mut report = CompareReport {
        numel: actual.numel(),
        rtol,
        atol,
        max_abs_error: 0.0,
        max_rel_error: 0.0,
        mismatches: 0,
        first_mismatch: None,
    };
    for i in 0..actual.numel() {
        let (a, e) = (Scalar::read(actual.data(), i), Scalar::read(expected.data(), i));
        let close = match (a, e) {
            (Scalar::Float(a), Scalar::Float(e)) => {
                if a.is_finite() && e.is_finite() {
                    let abs = (a - e).abs();
                    report.max_abs_error = report.max_abs_error.max(abs);
                    if e != 0.0 {
                        report.max_rel_error = report.max_rel_error.max(abs / e.abs());
                    }
                    abs <= atol + rtol * e.abs()
                        || wide.is_some_and(|w| {
                            let w = w.get_f64(i);
                            w.is_finite() && (a - w).abs() <= atol + rtol * w.abs()
                        })
                } else {
                    (a.is_nan() && e.is_nan()) || a == e
                }
            }
            // Integers compare exactly in i64 (no f64 rounding above 2^53).
            (a, e) => a == e,
        };
        if !close {
            report.mismatches += 1;
            if report.first_mismatch.is_none() {
                report.first_mismatch = Some(Mismatch {
                    index: i,
                    coord: unravel(i, actual.shape().dims()),
                    actual: a.to_f64(),
                    expected: e.to_f64(),
                });
            }
        }
    }
    Ok(report)
}

/// `Ok` when `actual` matches `expected` within [`tolerance`] of their dtype; otherwise a message
/// naming the first mismatch and the error statistics.
pub fn assert_close(actual: &HostTensor, expected: &HostTensor) -> std::result::Result<(), String> {
    let (rtol, atol) = tolerance(expected.dtype());
    assert_close_with(actual, expected, rtol, atol)
}

/// [`assert_close`] with explicit tolerances.
pub fn assert_close_with(
    actual: &HostTensor,
    expected: &HostTensor,
    rtol: f64,
    atol: f64,
) -> std::result::Result<(), String> {
    let report = compare(actual, expected, rtol, atol)?;
    if report.passed() {
        Ok(())
    } else {
        Err(report.to_string())
    }
}

/// An elementwise tolerance and a bounded allowance beyond it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds {
    pub rtol: f64,
    pub atol: f64,
    /// How many elements of a tensor may exceed `rtol` and `atol` ...
    pub outliers: usize,
    /// ... each by at most this many units in the last place of `rounding` at the expected value
    /// or at the tensor's root-mean-square value, whichever is larger: an element that cancels
    /// to near zero (a normalized value near the mean) carries the rounding of the values that
    /// cancelled, whose size the tensor's RMS tells, not its own.
    pub outlier_ulps: f64,
    /// The narrowest float dtype the computation rounds to.
    pub rounding: DType,
}

/// Elements allowed beyond the tolerance: one in this many ([`Bounds::for_rounding`]) ...
const OUTLIER_EVERY: usize = 1000;
/// ... and at least this many ...
const MIN_OUTLIERS: usize = 4;
/// ... each at most this many units in the last place beyond it.
const OUTLIER_ULPS: f64 = 4.0;

impl Bounds {
    /// The bounds for a tensor of `numel` elements computed by rounding to `dtypes` on the way
    /// (its inputs', its outputs' and its intermediates' float dtypes): the [`tolerance`] of the
    /// narrowest, and at most one element in 1,000 (at least 4) up to 4 of its ulps beyond that.
    /// Integer and bool tensors compare exactly.
    pub fn for_rounding(expected: DType, dtypes: impl IntoIterator<Item = DType>, numel: usize) -> Bounds {
        if !expected.is_float() {
            return Bounds { rtol: 0.0, atol: 0.0, outliers: 0, outlier_ulps: 0.0, rounding: expected };
        }
        let rounding = dtypes
            .into_iter()
            .chain([expected])
            .filter(|d| d.is_float())
            .min_by_key(|d| significand_bits(*d))
            .unwrap_or(expected);
        let (rtol, atol) = tolerance(rounding);
        Bounds { rtol, atol, outliers: (numel / OUTLIER_EVERY).max(MIN_OUTLIERS), outlier_ulps: OUTLIER_ULPS, rounding }
    }
}

/// Stored significand bits (without the implicit one).
fn significand_bits(dtype: DType) -> i32 {
    match dtype {
        DType::BF16 => 7,
        DType::F16 => 10,
        _ => 23,
    }
}

/// One unit in the last place of `dtype` at `x` (subnormal spacing below the normal range).
pub fn ulp(dtype: DType, x: f64) -> f64 {
    let min_exponent = match dtype {
        DType::F16 => -14,
        DType::BF16 | DType::F32 => -126,
        _ => return 0.0,
    };
    let exponent =
        if x == 0.0 || !x.is_finite() { min_exponent } else { (x.abs().log2().floor() as i32).max(min_exponent) };
    2f64.powi(exponent - significand_bits(dtype))
}

/// `Ok` when every element of `actual` is within `bounds.rtol`/`atol` of `expected` or of `wide`
/// (the computation with narrow intermediates kept in f32, if given), except at most
/// `bounds.outliers` elements that may be up to `bounds.outlier_ulps` ulps of `bounds.rounding`
/// further off. NaN and Inf must sit where the reference has them; integers and bools must be
/// equal. `Err` says how many elements failed, the worst, and the first.
pub fn assert_close_bounded(
    actual: &HostTensor,
    expected: &HostTensor,
    wide: Option<&HostTensor>,
    bounds: &Bounds,
) -> std::result::Result<(), String> {
    if !expected.dtype().is_float() {
        return assert_close_with(actual, expected, 0.0, 0.0);
    }
    same_type(actual, expected)?;
    if let Some(w) = wide.filter(|w| w.shape() != expected.shape()) {
        return Err(format!("the wide reference is {}{}, the reference {}", w.dtype(), w.shape(), expected.shape()));
    }
    let Bounds { rtol, atol, outliers, outlier_ulps, rounding } = *bounds;
    let finite: Vec<f64> = (0..expected.numel()).map(|i| expected.get_f64(i)).filter(|v| v.is_finite()).collect();
    let rms =
        if finite.is_empty() { 0.0 } else { (finite.iter().map(|v| v * v).sum::<f64>() / finite.len() as f64).sqrt() };
    // How far beyond the tolerance `a` is from `r`, in ulps of `rounding` at `r` or at the RMS,
    // whichever is larger; infinite for a NaN or an infinity that does not match.
    let beyond = |a: f64, r: f64| -> f64 {
        if !a.is_finite() || !r.is_finite() {
            return if a == r || (a.is_nan() && r.is_nan()) { 0.0 } else { f64::INFINITY };
        }
        let excess = (a - r).abs() - (atol + rtol * r.abs());
        if excess <= 0.0 {
            0.0
        } else {
            excess / ulp(rounding, r.abs().max(rms))
        }
    };
    let (mut over, mut failed) = (0usize, 0usize);
    let mut worst: Option<(usize, f64)> = None;
    let mut first: Option<usize> = None;
    for i in 0..expected.numel() {
        let (a, r) = (actual.get_f64(i), expected.get_f64(i));
        let mut ulps = beyond(a, r);
        // NaN and Inf are judged against the reference alone.
        if ulps > 0.0 && a.is_finite() && r.is_finite() {
            if let Some(w) = wide {
                ulps = ulps.min(beyond(a, w.get_f64(i)));
            }
        }
        if ulps == 0.0 {
            continue;
        }
        over += 1;
        if ulps > outlier_ulps {
            failed += 1;
        }
        if worst.is_none_or(|(_, u)| ulps > u) {
            worst = Some((i, ulps));
        }
        first.get_or_insert(i);
    }
    if over <= outliers && failed == 0 {
        return Ok(());
    }
    let at = |i: usize| {
        let coord: Vec<String> = unravel(i, expected.shape().dims()).iter().map(|c| c.to_string()).collect();
        let wide = wide.map_or(String::new(), |w| format!(", wide reference {}", w.get_f64(i)));
        format!("index {i} [{}]: actual {}, expected {}{wide}", coord.join(","), actual.get_f64(i), expected.get_f64(i))
    };
    let (worst, worst_ulps) = worst.expect("an element was over");
    Err(format!(
        "{over} of {} elements beyond rtol {rtol:e}, atol {atol:e} (at most {outliers} may be, by at most \
         {outlier_ulps} {rounding} ulps), {failed} by more; worst {worst_ulps:.1} ulps at {}; first at {}",
        expected.numel(),
        at(worst),
        at(first.expect("an element was over"))
    ))
}

fn unravel(mut index: usize, dims: &[usize]) -> Vec<usize> {
    let mut coord = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        coord[d] = index % dims[d];
        index /= dims[d];
    }
    coord
}
