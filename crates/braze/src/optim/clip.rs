//! Global gradient-norm clipping, as `torch.nn.utils.clip_grad_norm_`: every gradient scaled by
//! `min(1, max_norm / (norm + 1e-6))`, computed on the device (no host read).

use crate::{DType, Result, Tensor};

/// Scales the gradients of `params` so their joint L2 norm is at most `max_norm`; returns that
/// norm before clipping (an f32 device scalar).
pub fn clip_grad_norm(params: &[Tensor], max_norm: f64) -> Result<Option<Tensor>> {
    let grads: Vec<(Tensor, Tensor)> = params.iter().filter_map(|p| p.grad().map(|g| (p.clone(), g))).collect();
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
    Ok(Some(norm))
}
