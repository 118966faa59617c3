//! One tensor of braze's training step against PyTorch's: within the bf16 tolerance at the
//! tensor's scale, or, failing that, no less accurate than PyTorch's own bf16 result.
//!
//! Gradients of a mean over millions of elements are around 1e-6, where an absolute tolerance
//! of 1e-2 would pass anything: values are divided by the RMS of PyTorch's tensor first, so
//! `atol` is a fraction of the tensor's typical magnitude. Two judgements, in order:
//! 1. elementwise ([`braze_cpu::assert_close_bounded`]): every element within the dtype's
//!    tolerance of PyTorch's value or of the f32 reference (the same step computed in f32 from
//!    the same parameters), a few in a thousand a few ulps further;
//! 2. where that fails and there is an f32 reference, the error RMS and the largest error of
//!    braze's tensor against the f32 reference are each at most 3 times PyTorch's own (its bf16
//!    tensor against the same reference), plus a tenth of `atol`: the rule of
//!    `torch._dynamo.utils.same` with an fp64 reference. Two bf16 computations of a reduction
//!    over 8192 rows differ by their rounding, which this bounds by PyTorch's own.

use anyhow::{bail, Result};
use braze::{DType, HostTensor};
use braze_cpu::Bounds;
use serde_json::{json, Value};

/// How many times PyTorch's own error (against the f32 reference) braze's may be.
const ERROR_MULTIPLIER: f64 = 3.0;

/// How far braze's optimizer update of an element may be from PyTorch's beyond one unit in the
/// last place of the parameter, as a fraction of the learning rate: braze keeps AdamW's moments
/// in f32 where PyTorch keeps them in the parameters' bf16, and a moment that is a small
/// difference of two steps' gradients (a gradient that changed sign) moves by more than its
/// rounding.
const UPDATE_ATOL_LR: f64 = 0.1;

/// The elements allowed beyond that (1% of them, and at least one), each by at most this many
/// learning rates (an update of the opposite sign): Adam normalises each element's update to
/// about the learning rate, so a gradient element within its rounding of zero, whose sign the two
/// bf16 computations may disagree on, flips its whole update.
const UPDATE_OUTLIERS_PER: usize = 100;
const UPDATE_OUTLIER_LR: f64 = 3.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// An updated parameter within one ulp plus [`UPDATE_ATOL_LR`] learning rates of PyTorch's
    /// (a few elements up to an update of the opposite sign).
    PassUpdate,
    /// Elementwise within the tolerance of the dtype at the tensor's scale.
    Pass,
    /// Error RMS and largest error against the f32 reference at most 3x PyTorch's own.
    PassAsAccurate,
    Fail,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::PassUpdate => "pass (update within 1 ulp)",
            Verdict::PassAsAccurate => "pass (as accurate as torch vs f32)",
            Verdict::Fail => "FAIL",
        }
    }
}

/// Errors measured against the f32 reference.
#[derive(Clone, Copy, Debug)]
pub struct AgainstF32 {
    /// Error RMS over the tensor's RMS: braze's and PyTorch's.
    pub braze_rel_rms: f64,
    pub torch_rel_rms: f64,
    /// Largest absolute error over the tensor's RMS: braze's and PyTorch's.
    pub braze_max: f64,
    pub torch_max: f64,
}

/// One compared tensor of one step.
#[derive(Clone, Debug)]
pub struct TensorCheck {
    pub step: usize,
    pub name: String,
    pub numel: usize,
    /// Largest `|braze - torch|`, in the tensor's units and over PyTorch's tensor RMS.
    pub max_abs_error: f64,
    pub max_error_over_rms: f64,
    /// `||braze - torch|| / ||torch||`.
    pub rel_l2: f64,
    pub f32: Option<AgainstF32>,
    pub verdict: Verdict,
    /// Why the elementwise judgement failed, where it did.
    pub detail: Option<String>,
}

impl TensorCheck {
    pub fn to_json(&self) -> Value {
        json!({
            "step": self.step, "tensor": self.name, "numel": self.numel,
            "max_abs_err": self.max_abs_error, "max_err_over_rms": self.max_error_over_rms, "rel_l2": self.rel_l2,
            "f32_rel_rms_braze": self.f32.map(|f| f.braze_rel_rms), "f32_rel_rms_torch": self.f32.map(|f| f.torch_rel_rms),
            "f32_max_braze": self.f32.map(|f| f.braze_max), "f32_max_torch": self.f32.map(|f| f.torch_max),
            "check": self.verdict.as_str(), "detail": self.detail,
        })
    }
}

/// Root mean square of the finite values (0 for none).
fn rms(values: &[f64]) -> f64 {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return 0.0;
    }
    (finite.iter().map(|v| v * v).sum::<f64>() / finite.len() as f64).sqrt()
}

/// `(error RMS, largest error)` of `a` against `b` (NaN when either holds a non-finite value
/// where the other does not hold the same).
fn errors(a: &[f64], b: &[f64]) -> (f64, f64) {
    let (mut sum, mut max) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let same_special = !x.is_finite() && (x == y || (x.is_nan() && y.is_nan()));
        let d = if same_special { 0.0 } else { (x - y).abs() };
        if d.is_nan() || d.is_infinite() {
            return (f64::NAN, f64::NAN);
        }
        sum += d * d;
        max = max.max(d);
    }
    ((sum / a.len().max(1) as f64).sqrt(), max)
}

fn scaled(values: &[f64], shape: &braze::Shape, scale: f64) -> Result<HostTensor> {
    let values: Vec<f64> = values.iter().map(|v| v / scale).collect();
    Ok(HostTensor::from_f64(DType::F32, shape.clone(), &values)?)
}

/// Compares braze's `got` with PyTorch's `torch` (same dtype and shape) and, where given, the f32
/// reference `wide` (same shape).
pub fn compare_tensor(
    step: usize,
    name: &str,
    got: &HostTensor,
    torch: &HostTensor,
    wide: Option<&HostTensor>,
) -> Result<TensorCheck> {
    if got.dtype() != torch.dtype() || got.shape() != torch.shape() {
        bail!(
            "step {step} {name}: braze has {}{}, PyTorch {}{}",
            got.dtype(),
            got.shape(),
            torch.dtype(),
            torch.shape()
        );
    }
    if let Some(w) = wide.filter(|w| w.shape() != torch.shape()) {
        bail!("step {step} {name}: the f32 reference is {}{}, PyTorch's {}", w.dtype(), w.shape(), torch.shape());
    }
    let (g, t) = (got.to_f64_vec(), torch.to_f64_vec());
    let w = wide.map(HostTensor::to_f64_vec);
    let scale = match rms(&t) {
        s if s > 0.0 => s,
        _ => 1.0,
    };
    let (diff_rms, max_abs_error) = errors(&g, &t);
    let rel_l2 = diff_rms / scale;
    let shape = torch.shape();
    let bounds = Bounds::for_rounding(torch.dtype(), [], torch.numel());
    let wide_scaled = w.as_ref().map(|w| scaled(w, shape, scale)).transpose()?;
    let elementwise = braze_cpu::assert_close_bounded(
        &scaled(&g, shape, scale)?,
        &scaled(&t, shape, scale)?,
        wide_scaled.as_ref(),
        &bounds,
    );
    let f32 = w.as_ref().map(|w| {
        let ((braze_rms, braze_max), (torch_rms, torch_max)) = (errors(&g, w), errors(&t, w));
        AgainstF32 {
            braze_rel_rms: braze_rms / scale,
            torch_rel_rms: torch_rms / scale,
            braze_max: braze_max / scale,
            torch_max: torch_max / scale,
        }
    });
    let floor = bounds.atol / 10.0;
    let as_accurate = f32.is_some_and(|f| {
        f.braze_rel_rms <= ERROR_MULTIPLIER * f.torch_rel_rms + floor
            && f.braze_max <= ERROR_MULTIPLIER * f.torch_max + floor
    });
    let verdict = match (&elementwise, as_accurate) {
        (Ok(()), _) => Verdict::Pass,
        (Err(_), true) => Verdict::PassAsAccurate,
        (Err(_), false) => Verdict::Fail,
    };
    Ok(TensorCheck {
        step,
        name: name.to_string(),
        numel: torch.numel(),
        max_abs_error,
        max_error_over_rms: max_abs_error / scale,
        rel_l2,
        f32,
        verdict,
        detail: elementwise.err().map(|e| format!("at the tensor's scale (RMS {scale:.3e}): {e}")),
    })
}

/// braze's parameter after the step's optimizer update (`got`) against PyTorch's (`torch`), both
/// updated from `before` with learning rate `lr`: every element within one unit in the last place
/// of the dtype plus [`UPDATE_ATOL_LR`] learning rates, but for 1 in [`UPDATE_OUTLIERS_PER`]
/// within [`UPDATE_OUTLIER_LR`] learning rates. A wrong learning rate, bias correction or sign
/// moves most elements by a sizeable fraction of the learning rate and fails. `rel_l2` measures
/// the updates (`got - before` against `torch - before`).
pub fn compare_update(
    step: usize,
    name: &str,
    got: &HostTensor,
    torch: &HostTensor,
    before: &HostTensor,
    lr: f64,
) -> Result<TensorCheck> {
    for (what, t) in [("braze's updated parameter", got), ("the parameter before the update", before)] {
        if t.dtype() != torch.dtype() || t.shape() != torch.shape() {
            bail!(
                "step {step} {name}: {what} is {}{}, PyTorch's {}{}",
                t.dtype(),
                t.shape(),
                torch.dtype(),
                torch.shape()
            );
        }
    }
    let (g, t, b) = (got.to_f64_vec(), torch.to_f64_vec(), before.to_f64_vec());
    let dtype = torch.dtype();
    let (mut beyond, mut far) = (Vec::new(), Vec::new());
    let (mut diff_sq, mut update_sq, mut max_abs_error) = (0.0f64, 0.0f64, 0.0f64);
    for i in 0..t.len() {
        let d = (g[i] - t[i]).abs();
        let ulp = braze_cpu::compare::ulp(dtype, g[i].abs().max(t[i].abs()));
        // A NaN difference is beyond every bound.
        if d.is_nan() || d > ulp + UPDATE_ATOL_LR * lr {
            beyond.push(i);
        }
        if d.is_nan() || d > ulp + UPDATE_OUTLIER_LR * lr {
            far.push(i);
        }
        let update = t[i] - b[i];
        diff_sq += ((g[i] - b[i]) - update).powi(2);
        update_sq += update * update;
        max_abs_error = if d.is_nan() { f64::NAN } else { max_abs_error.max(d) };
    }
    let allowed = (t.len() / UPDATE_OUTLIERS_PER).max(1);
    let pass = beyond.len() <= allowed && far.is_empty();
    let scale = rms(&t).max(f64::MIN_POSITIVE);
    let detail = (!pass).then(|| {
        let i = far.first().or(beyond.first()).copied().unwrap_or(0);
        format!(
            "{} of {} elements beyond 1 ulp + {UPDATE_ATOL_LR} lr (at most {allowed} may be), {} beyond \
             {UPDATE_OUTLIER_LR} lr; {} at index {i}: braze {}, PyTorch {}, before {}",
            beyond.len(),
            t.len(),
            far.len(),
            if far.is_empty() { "first" } else { "first far" },
            g[i],
            t[i],
            b[i]
        )
    });
    Ok(TensorCheck {
        step,
        name: name.to_string(),
        numel: t.len(),
        max_abs_error,
        max_error_over_rms: max_abs_error / scale,
        rel_l2: if update_sq > 0.0 { (diff_sq / update_sq).sqrt() } else { diff_sq.sqrt() },
        f32: None,
        verdict: if pass { Verdict::PassUpdate } else { Verdict::Fail },
        detail,
    })
}
