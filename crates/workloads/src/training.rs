//! Training workloads: a whole step (forward, loss, backward, optimizer update) as one function
//! over captured parameters, to compile with `fullgraph(true)`.

use crate::definition::{fan_in_scale, mlp_block};
use crate::workload::{Sizes, Workload};
use braze::optim::{AdamW, Optimizer};
use braze::{Device, Result, Tensor};
use std::sync::Arc;

/// Layers of `mlp_step`.
pub const MLP_STEP_LAYERS: usize = 4;

/// `mlp_step`: [`MLP_STEP_LAYERS`] layers of `x = layer_norm(x + gelu(x @ W1 + b1) @ W2 + b2)`
/// (hidden `4 * sizes.hidden`), the mean squared error against a target, `backward()`, and an
/// AdamW step (lr 1e-3) over every parameter; parameters in `sizes.dtype`, optimizer state in
/// f32. Inputs: `x` and `target`, `[rows, hidden]`; the parameters (seeded, the same for the
/// same `sizes` on every device) and the optimizer live on `device` and are captured, so each
/// call trains one step.
pub fn mlp_step(sizes: &Sizes, device: Device) -> Result<Workload> {
    let Sizes { rows, hidden, dtype, seed, .. } = *sizes;
    let inner = 4 * hidden;
    let param = |t: Tensor| -> Result<Tensor> {
        let t = t.to_device(device)?;
        t.set_requires_grad(true)?;
        Ok(t)
    };
    let mut next_seed = seed;
    let mut random = |shape: &[usize], scale: f64| -> Result<Tensor> {
        next_seed += 1;
        param(Tensor::randn(shape.to_vec(), dtype, next_seed)?.mul_scalar(scale)?)
    };
    let mut layers = Vec::with_capacity(MLP_STEP_LAYERS);
    for _ in 0..MLP_STEP_LAYERS {
        layers.push([
            random(&[hidden, inner], fan_in_scale(hidden))?,
            param(Tensor::zeros([inner], dtype, Device::Cpu)?)?,
            random(&[inner, hidden], fan_in_scale(inner))?,
            param(Tensor::zeros([hidden], dtype, Device::Cpu)?)?,
            param(Tensor::ones([hidden], dtype, Device::Cpu)?)?,
            param(Tensor::zeros([hidden], dtype, Device::Cpu)?)?,
        ]);
    }
    let params: Vec<Tensor> = layers.iter().flatten().cloned().collect();
    let optimizer = AdamW::new(&params, 1e-3)?;
    let function = move |a: &[Tensor]| -> Result<Vec<Tensor>> {
        optimizer.zero_grad();
        let mut x = a[0].clone();
        for [w1, b1, w2, b2, g, beta] in &layers {
            x = mlp_block(&x, w1, b1, w2, b2, g, beta)?;
        }
        let error = x.sub(&a[1])?;
        let loss = error.mul(&error)?.mean_all()?;
        loss.backward()?;
        optimizer.step()?;
        Ok(vec![loss])
    };
    let x = Tensor::randn([rows, hidden], dtype, seed + 1000)?.to_device(device)?;
    let target = Tensor::randn([rows, hidden], dtype, seed + 1001)?.to_device(device)?;
    Ok(Workload {
        name: "mlp_step",
        input_names: vec!["x".into(), "target".into()],
        inputs: vec![x, target],
        function: Arc::new(function),
    })
}
