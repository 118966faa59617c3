//! `scaled_dot_product_attention` on a CUDA device, forward and backward, against the CPU
//! reference (eager on the CPU: the f64 oracle rounded once per op), with outputs poisoned
//! (NaN-filled before every run) so an element no kernel wrote cannot pass.
//!
//! Sizes: sequence lengths 1, 17 and 1000 (no multiple of any tile), head dims 64 and 128,
//! causal and not, f32/bf16/f16, in every compile mode (max-autotune runs each kernel's fastest
//! candidate); and every candidate config of every attention kernel forced in turn
//! (`gpu_attention_every_candidate_config`: the tensor-core forward among them, which no CPU
//! test can run). Skips without a GPU (fails instead when
//! `BRAZE_REQUIRE_CUDA=1`). Run on the GPU machine with
//! `BRAZE_REQUIRE_CUDA=1 cargo test --release -p braze --test gpu_attention -- --nocapture`.

mod common;

use braze::{value_and_grad, DType, Result, Tensor};
use braze_cpu::compare::{assert_close_bounded, Bounds};
use common::{check, gpu, F};

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

/// Every candidate config of every attention kernel (the FMA kernels and, for bf16/f16, the
/// tensor-core forward), each forced in turn with the others at their defaults, on the joint
/// forward-backward plan: the outputs (out, dq, dk, dv) against the reference, and against the
/// plan executor's model of the kernels as the wide reference. Max-autotune above runs only
/// each kernel's winner; this runs them all.
#[test]
fn gpu_attention_every_candidate_config() {
    use braze_cuda::{CudaDevice, ExecOptions, KernelCache, PlanExecutable};
    use braze_ir::{Graph, HostTensor, Op};
    if gpu().is_none() {
        return;
    }
    let device = CudaDevice::new(0).unwrap();
    let cache = KernelCache::in_memory();
    let target = braze_codegen::Target::h200();
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        for (shape, causal) in [([2, 3, 17, 64], true), ([1, 2, 1000, 64], true), ([1, 2, 70, 128], false)] {
            let mut g = Graph::new();
            let qkv: Vec<_> = (0..3).map(|_| g.input(dtype, shape)).collect();
            let dout = g.input(dtype, shape);
            let scale = 1.0 / (shape[3] as f64).sqrt();
            let out = g.add(Op::Attention { causal, scale }, &qkv, None).unwrap();
            let grads = braze_autodiff::backward(&mut g, &[(out, dout)], &qkv).unwrap();
            g.set_outputs([vec![out], grads.into_iter().map(Option::unwrap).collect()].concat());
            let plan = braze_passes::compile_to_plan(&g, &braze_passes::FusionOptions::default()).unwrap();
            let inputs: Vec<HostTensor> =
                (0..4).map(|i| braze_cpu::random_tensor(dtype, shape.to_vec(), 21 + i)).collect();
            let want = braze_cpu::eval_graph(&g, &inputs).unwrap();
            let model = braze_cpu::eval_plan(&plan, &inputs).unwrap();
            let uploaded: Vec<_> = inputs.iter().map(|t| device.upload(&t.to_bytes()).unwrap()).collect();
            for (k, kernel) in plan.kernels.iter().enumerate() {
                if !kernel.kind.family().starts_with("attention") {
                    continue;
                }
                for config in braze_codegen::candidate_configs(&plan, k, &target) {
                    let what = format!("{} {config} {dtype} {shape:?} causal={causal}", kernel.name);
                    let options = ExecOptions {
                        poison_outputs: true,
                        configs: [(k, config)].into_iter().collect(),
                        ..ExecOptions::default()
                    };
                    let mut exe = PlanExecutable::new(&device, plan.clone(), &cache, options).unwrap();
                    let got = exe.run(&uploaded).unwrap_or_else(|e| panic!("{what}: {e}"));
                    for (j, ((buffer, w), m)) in got.iter().zip(&want).zip(&model).enumerate() {
                        let host =
                            HostTensor::from_bytes(w.dtype(), w.shape().clone(), &device.download(buffer).unwrap())
                                .unwrap();
                        let bounds = Bounds::for_rounding(w.dtype(), [dtype], w.numel());
                        assert_close_bounded(&host, w, Some(m), &bounds)
                            .unwrap_or_else(|e| panic!("{what} output {j}: {e}"));
                    }
                }
            }
        }
    }
}
