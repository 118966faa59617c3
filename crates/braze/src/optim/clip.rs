//! Global gradient-norm clipping, as `torch.nn.utils.clip_grad_norm_`: every gradient scaled by
//! `min(1, max_norm / (norm + 1e-6))`, computed on the device (no host read).

use crate::{DType, Result, Tensor};

/// Scales the gradients of `params` so their joint L2 norm is at most `max_norm`; returns that
/// norm before clipping (an f32 device scalar).
pub fn clip_grad_norm(params: &[Tensor], max_norm: f64) -> Result<Option<Tensor>> {
    Ok(clip(params, max_norm, false)?.map(|(norm, _)| norm))
}

/// [`clip_grad_norm`], also returning whether any gradient held a NaN or an infinity (a bool
/// device scalar), reduced in the same launch as the norm, over the same gradients.
///
/// The clipped gradients are non-finite exactly when these were: for finite gradients the scale
/// is finite and at most 1 (0 when their norm overflows), so every clipped element is finite; an
/// infinite element makes the norm infinite and the scale 0, and `inf * 0` is NaN; a NaN makes
/// the norm NaN. So an optimizer given this flag ([`super::Optimizer::step_skipping`]) skips
/// exactly the steps it would skip checking the clipped gradients itself, without a pass of its
/// own over them, and its update need not wait for one.
pub fn clip_grad_norm_checked(params: &[Tensor], max_norm: f64) -> Result<Option<(Tensor, Tensor)>> {
    Ok(clip(params, max_norm, true)?.map(|(norm, non_finite)| (norm, non_finite.expect("checked"))))
}

fn clip(params: &[Tensor], max_norm: f64, check: bool) -> Result<Option<(Tensor, Option<Tensor>)>> {
    let grads: Vec<(Tensor, Tensor)> = params.iter().filter_map(|p| p.grad().map(|g| (p.clone(), g))).collect();
    // Checked before clipping replaces the gradients; it reduces in the norm's launch.
    let non_finite = if check { super::any_non_finite(params)? } else { None };
    let mut total: Option<Tensor> = None;
    for (_, g) in &grads {
        let g32 = g.cast(DType::F32)?;
        let squares = g32.mul(&g32)?.sum_all()?;
        total = Some(match total {
            Some(t) => t.add(&squares)?,
            None => squares,
        });
    }
    let Some(total) = total else { return Ok(None) };
    let norm = total.sqrt()?;
    let scale = norm.add_scalar(1e-6)?.reciprocal()?.mul_scalar(max_norm)?.minimum_scalar(1.0)?;
    for (p, g) in &grads {
        let clipped = g.cast(DType::F32)?.mul(&scale)?.cast(g.dtype())?;
        p.set_grad(Some(&clipped))?;
    }
    Ok(Some((norm, non_finite)))
}
