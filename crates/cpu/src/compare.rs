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

/// Compares element by element with the given tolerances. `Err` when dtype or shape differ.
pub fn compare(
    actual: &HostTensor,
    expected: &HostTensor,
    rtol: f64,
    atol: f64,
) -> std::result::Result<CompareReport, String> {
    if actual.dtype() != expected.dtype() || actual.shape() != expected.shape() {
        return Err(format!(
            "expected {}{}, got {}{}",
            expected.dtype(),
            expected.shape(),
            actual.dtype(),
            actual.shape()
        ));
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

fn unravel(mut index: usize, dims: &[usize]) -> Vec<usize> {
    let mut coord = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        coord[d] = index % dims[d];
        index /= dims[d];
    }
    coord
}
