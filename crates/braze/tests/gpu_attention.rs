//! `scaled_dot_product_attention` on a CUDA device, forward and backward, against the CPU
//! reference (eager on the CPU: the f64 oracle rounded once per op), with outputs poisoned
//! (NaN-filled before every run) so an element no kernel wrote cannot pass.
//!
//! Sizes: sequence lengths 1, 17 and 1000 (no multiple of any tile), head dims 64 and 128,
//! causal and not, f32/bf16/f16; every compile mode, so max-autotune times (and so runs) every
//! candidate config of each kernel. Skips without a GPU (fails instead when
//! `BRAZE_REQUIRE_CUDA=1`). Run on the GPU machine with
//! `BRAZE_REQUIRE_CUDA=1 cargo test --release -p braze --test gpu_attention -- --nocapture`.

mod common;

use braze::{compile, value_and_grad, DType, Mode, Result, Tensor};
use braze_cpu::compare::{assert_close_bounded, Bounds};
use common::gpu;

type F = fn(&[Tensor]) -> Result<Vec<Tensor>>;

/// Runs `f` eagerly on the CPU (the reference) and on inputs widened to f32 (the wide
/// reference: kernels keep bf16/f16 intermediates in f32), then compiled on the GPU in every
/// mode (three calls each) and eagerly on the GPU, each output judged against both.
fn check(name: &str, f: F, inputs: &[Tensor], dtype: DType) {
    let Some(gpu) = gpu() else { return };
    let want: Vec<_> = f(inputs).unwrap().iter().map(|t| t.to_host().unwrap()).collect();
    let wide_inputs: Vec<Tensor> = inputs.iter().map(|t| t.cast(DType::F32).unwrap()).collect();
    let wide: Vec<_> = f(&wide_inputs)
        .unwrap()
        .iter()
        .zip(&want)
        .map(|(t, w)| t.cast(w.dtype()).unwrap().to_host().unwrap())
        .collect();
    let on_gpu: Vec<Tensor> = inputs.iter().map(|t| t.to_device(gpu).unwrap()).collect();
    let compare = |label: &str, got: Vec<Tensor>| {
        assert_eq!(got.len(), want.len(), "{name} {label}");
        for (j, ((g, w), wide)) in got.iter().zip(&want).zip(&wide).enumerate() {
            assert_eq!(g.device(), gpu, "{name} {label}: result left the GPU");
            let bounds = Bounds::for_rounding(w.dtype(), [dtype], w.numel());
            assert_close_bounded(&g.to_host().unwrap(), w, Some(wide), &bounds)
                .unwrap_or_else(|e| panic!("{name} {label} output {j}: {e}"));
        }
    };
    for mode in [Mode::Default, Mode::ReduceOverhead, Mode::MaxAutotune] {
        let compiled = compile(f).fullgraph(true).mode(mode);
        for call in 0..3 {
            compare(&format!("{mode:?} call {call}"), compiled.call(&on_gpu).unwrap());
        }
    }
    compare("eager", f(&on_gpu).unwrap());
}

fn forward(a: &[Tensor], causal: bool) -> Result<Vec<Tensor>> {
    Ok(vec![a[0].scaled_dot_product_attention(&a[1], &a[2], causal, None)?])
}

/// The output, and the gradients of `sum(out * dout)` with respect to q, k and v.
fn forward_backward(a: &[Tensor], causal: bool) -> Result<Vec<Tensor>> {
    let dout = a[3].clone();
    let mut out = None;
    let (_, grads) = value_and_grad(
        |x| {
            let y = x[0].scaled_dot_product_attention(&x[1], &x[2], causal, None)?;
            out = Some(y.clone());
            y.mul(&dout)?.sum_all()
        },
        &a[..3],
    )?;
    Ok([vec![out.expect("the loss ran")], grads].concat())
}

fn inputs(shape: [usize; 4], dtype: DType, count: usize, seed: u64) -> Vec<Tensor> {
    (0..count as u64).map(|i| Tensor::randn(shape.to_vec(), dtype, seed + i).unwrap()).collect()
}

/// `[B, H, T, D]` shapes: T = 1 and 17 at several heads, T = 1000 at one (the reference is
/// quadratic in T).
const SHAPES: [[usize; 4]; 6] =
    [[2, 3, 1, 64], [2, 3, 17, 64], [1, 1, 1000, 64], [1, 2, 1, 128], [2, 2, 17, 128], [1, 1, 1000, 128]];

#[test]
fn gpu_attention_forward() {
    let causal: F = |a| forward(a, true);
    let full: F = |a| forward(a, false);
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        for shape in SHAPES {
            check(&format!("attention causal {dtype} {shape:?}"), causal, &inputs(shape, dtype, 3, 1), dtype);
            check(&format!("attention {dtype} {shape:?}"), full, &inputs(shape, dtype, 3, 5), dtype);
        }
    }
}

#[test]
fn gpu_attention_forward_and_backward() {
    let causal: F = |a| forward_backward(a, true);
    let full: F = |a| forward_backward(a, false);
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        for shape in SHAPES {
            check(&format!("attention backward causal {dtype} {shape:?}"), causal, &inputs(shape, dtype, 4, 9), dtype);
            check(&format!("attention backward {dtype} {shape:?}"), full, &inputs(shape, dtype, 4, 13), dtype);
        }
    }
}
