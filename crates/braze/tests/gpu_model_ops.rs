//! The model ops on a CUDA device against the CPU reference: type promotion, log_softmax,
//! arange, cross_entropy at GPT-2's vocabularies and dropout (the GPU's Philox bits against the
//! reference's), compiled in every mode and eagerly, with their gradients. Outputs are poisoned
//! (NaN-filled before every run) so an element no kernel wrote cannot pass. Skips without a GPU
//! (fails instead when `BRAZE_REQUIRE_CUDA=1`).

mod common;

use braze::timeline::{self, Track};
use braze::{compile, cuda_device, sync_count, value_and_grad, DType, Mode, Tensor};
use common::{check, gpu, F};

const MODES: [Mode; 3] = [Mode::Default, Mode::ReduceOverhead, Mode::MaxAutotune];

fn randn(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    Tensor::randn(shape.to_vec(), dtype, seed).unwrap()
}

fn indices(values: &[i64], dtype: DType) -> Tensor {
    Tensor::from_slice(values, [values.len()]).unwrap().cast(dtype).unwrap()
}

#[test]
fn gpu_type_promotion() {
    let f: F = |a| Ok(vec![a[0].add(&a[1])?, a[2].add(&a[3])?, a[2].mul_scalar(0.5)?, a[1].mul(&a[3])?]);
    let inputs = [
        randn(&[33, 65], DType::F32, 1),
        randn(&[65], DType::BF16, 2),
        indices(&[1, -2, 3], DType::I32),
        indices(&[1 << 40, 5, -7], DType::I64).reshape([3, 1]).unwrap(),
    ];
    let Some(gpu) = gpu() else { return };
    let out = compile(f).fullgraph(true).call(&inputs.iter().map(|t| t.to_device(gpu).unwrap()).collect::<Vec<_>>());
    let dtypes: Vec<DType> = out.unwrap().iter().map(|t| t.dtype()).collect();
    assert_eq!(dtypes, [DType::F32, DType::I64, DType::F32, DType::BF16]);
    check("promotion", f, &inputs, DType::BF16);
}

#[test]
fn gpu_log_softmax_and_its_gradient_at_gpt2_vocabulary() {
    let f: F = |a| {
        let (loss, grads) = value_and_grad(|b| b[0].log_softmax(-1)?.mul(&a[1])?.sum_all(), &[a[0].clone()])?;
        Ok(vec![a[0].log_softmax(1)?, loss, grads[0].clone()])
    };
    for dtype in [DType::F32, DType::BF16] {
        let inputs = [randn(&[6, 50_257], dtype, 10).mul_scalar(3.0).unwrap(), randn(&[6, 50_257], dtype, 11)];
        check(&format!("log_softmax {dtype}"), f, &inputs, dtype);
    }
}

#[test]
fn gpu_arange_and_printing() {
    let Some(gpu) = gpu() else { return };
    let t = Tensor::arange(5, DType::I64, gpu).unwrap();
    assert_eq!(t.device(), gpu);
    assert_eq!(t.to_string(), "tensor([0, 1, 2, 3, 4], device='cuda:0')");
    let f = compile(|a: &[Tensor]| Ok(vec![a[0].mul(&Tensor::arange(4, DType::F32, a[0].device())?)?])).fullgraph(true);
    let x = Tensor::ones([4], DType::F32, gpu).unwrap();
    assert_eq!(f.call(&[x]).unwrap()[0].to_vec::<f32>().unwrap(), [0.0, 1.0, 2.0, 3.0]);
    // Computed in the kernel, vectorized, past bf16's integers, and as i64 position ids: the
    // same bits as the CPU backend's.
    let f = compile(|a: &[Tensor]| {
        let n = a[0].shape().dims()[0];
        let ids = Tensor::arange(n, DType::BF16, a[0].device())?;
        Ok(vec![a[0].mul(&ids)?, Tensor::arange(n, DType::I64, a[0].device())?])
    })
    .fullgraph(true);
    let x = randn(&[1_000_003], DType::BF16, 5);
    let on_cpu = f.call(std::slice::from_ref(&x)).unwrap();
    let on_gpu = f.call(&[x.to_device(gpu).unwrap()]).unwrap();
    for (g, c) in on_gpu.iter().zip(&on_cpu) {
        assert_eq!(g.to_host().unwrap().to_f64_vec(), c.to_host().unwrap().to_f64_vec());
    }
}

#[test]
fn gpu_cross_entropy_at_gpt2_vocabularies() {
    let f: F = |a| {
        let (loss, grads) = value_and_grad(|b| b[0].cross_entropy(&a[1], -100), &[a[0].clone()])?;
        Ok(vec![loss, grads[0].clone()])
    };
    for vocab in [50_257usize, 50_304] {
        for (dtype, index) in [(DType::F32, DType::I64), (DType::BF16, DType::I32)] {
            let rows = 8;
            let targets: Vec<i64> =
                (0..rows as i64).map(|n| if n == 3 { -100 } else { (n * 7919) % vocab as i64 }).collect();
            let inputs = [randn(&[rows, vocab], dtype, 20).mul_scalar(2.0).unwrap(), indices(&targets, index)];
            check(&format!("cross_entropy vocab {vocab} {dtype} {index}"), f, &inputs, dtype);
            // The ignored row's gradients are exact zeros.
            let Some(gpu) = gpu() else { return };
            let on_gpu: Vec<Tensor> = inputs.iter().map(|t| t.to_device(gpu).unwrap()).collect();
            let grad = compile(f).fullgraph(true).call(&on_gpu).unwrap()[1].to_host().unwrap().to_f64_vec();
            assert!(grad[3 * vocab..4 * vocab].iter().all(|&g| g == 0.0), "vocab {vocab} {dtype}");
        }
    }
}

#[test]
fn gpu_cross_entropy_out_of_range_target_is_nan() {
    let Some(gpu) = gpu() else { return };
    let logits = randn(&[2, 50_257], DType::BF16, 3).to_device(gpu).unwrap();
    let targets = indices(&[5, 50_257], DType::I64).to_device(gpu).unwrap();
    let f = compile(|a: &[Tensor]| Ok(vec![a[0].cross_entropy(&a[1], -100)?])).fullgraph(true);
    assert!(f.call(&[logits.clone(), targets.clone()]).unwrap()[0]
        .cast(DType::F32)
        .unwrap()
        .item::<f32>()
        .unwrap()
        .is_nan());
    assert!(logits.cross_entropy(&targets, -100).is_err(), "eager reads the targets and refuses");
}

#[test]
fn gpu_dropout_draws_the_reference_bits() {
    let Some(gpu) = gpu() else { return };
    let step = |a: &[Tensor]| {
        let (loss, grads) =
            value_and_grad(|b| b[0].dropout(0.1, &a[1], &a[2], true)?.mul(&b[0])?.sum_all(), &[a[0].clone()])?;
        Ok(vec![a[0].dropout(0.1, &a[1], &a[2], true)?, loss, grads[0].clone()])
    };
    let x = randn(&[2, 512, 768], DType::BF16, 7);
    let seed = Tensor::scalar(20_260_101i64);
    let offsets = [0i64, 786_432, 1 << 33];
    let wants: Vec<Vec<Tensor>> =
        offsets.iter().map(|&o| step(&[x.clone(), seed.clone(), Tensor::scalar(o)]).unwrap()).collect();
    let on_gpu = x.to_device(gpu).unwrap();
    for mode in MODES {
        let compiled = compile(step).fullgraph(true).mode(mode);
        // A replayed graph draws a new mask when the offset advances.
        for (call, (&offset, want)) in offsets.iter().zip(&wants).enumerate() {
            let args = [on_gpu.clone(), seed.to_device(gpu).unwrap(), Tensor::scalar(offset).to_device(gpu).unwrap()];
            let got = compiled.call(&args).unwrap();
            // The mask and the kept values are exact: the same bits, and x * (1 / 0.9) rounded once.
            assert_eq!(got[0].to_host().unwrap(), want[0].to_host().unwrap(), "{mode:?} call {call}: dropout");
            let (g, w) = (got[2].to_host().unwrap().to_f64_vec(), want[2].to_host().unwrap().to_f64_vec());
            for (i, (g, w)) in g.iter().zip(&w).enumerate() {
                assert_eq!(*g == 0.0, *w == 0.0, "{mode:?} call {call}: gradient mask at {i}");
                assert!((g - w).abs() <= 2f64.powi(-7) * w.abs(), "{mode:?} call {call}: gradient {i}: {g} vs {w}");
            }
        }
    }
    let eval = x.to_device(gpu).unwrap();
    assert!(eval.dropout(0.1, &seed, &seed, false).unwrap().same_tensor(&eval));
}

/// `n` indices in `0..bound` from a fixed LCG, with repeats.
fn token_ids(n: usize, bound: usize, seed: u64) -> Vec<i64> {
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((state >> 33) % bound as u64) as i64
        })
        .collect()
}

#[test]
fn gpu_embedding_and_its_gradient_at_gpt2_vocabulary() {
    // GPT-2's padded vocabulary; token rows plus positions cast to the weight's dtype, and the
    // weight's gradient (a scatter-add of 4,096 rows, many repeated).
    let f: F = |a| {
        let (loss, grads) = value_and_grad(
            |b| b[0].embedding(&a[1])?.add(&a[2])?.cast(DType::F32)?.mul(&a[3])?.sum_all(),
            &[a[0].clone()],
        )?;
        Ok(vec![a[0].embedding(&a[1])?.add(&a[2])?, loss, grads[0].clone()])
    };
    for (dtype, index) in [(DType::F32, DType::I64), (DType::BF16, DType::I32)] {
        let ids = token_ids(4096, 50_304, 7);
        let inputs = [
            randn(&[50_304, 64], dtype, 1),
            Tensor::from_slice(&ids, [4, 1024]).unwrap().cast(index).unwrap(),
            randn(&[1024, 64], dtype, 2),
            randn(&[4, 1024, 64], DType::F32, 3),
        ];
        check(&format!("embedding {dtype} {index}"), f, &inputs, dtype);
    }
}

#[test]
fn gpu_embedding_gradient_has_the_same_bits_on_every_run() {
    let Some(gpu) = gpu() else { return };
    // The training size: V = 50,304, C = 768, 16k tokens.
    let ids = token_ids(16_384, 50_304, 9);
    let w = randn(&[50_304, 768], DType::BF16, 4).to_device(gpu).unwrap();
    let idx = Tensor::from_slice(&ids, [16, 1024]).unwrap().to_device(gpu).unwrap();
    let g = randn(&[16, 1024, 768], DType::BF16, 5).to_device(gpu).unwrap();
    let step = compile(|a: &[Tensor]| {
        let (_, grads) = value_and_grad(|b| b[0].embedding(&a[1])?.mul(&a[2])?.sum_all(), &[a[0].clone()])?;
        Ok(grads)
    })
    .fullgraph(true);
    let first = step.call(&[w.clone(), idx.clone(), g.clone()]).unwrap()[0].to_vec::<half::bf16>().unwrap();
    for _ in 0..3 {
        let again = step.call(&[w.clone(), idx.clone(), g.clone()]).unwrap()[0].to_vec::<half::bf16>().unwrap();
        assert!(first.iter().zip(&again).all(|(a, b)| a.to_bits() == b.to_bits()), "bits differ between runs");
    }
}

#[test]
fn gpu_index_select_gradients_of_repeats_no_indices_and_ragged_rows() {
    // The scatter-add kernel: every index on one row, no indices (a gradient of zeros), inner
    // extents that are no multiple of a vector, several outer slices, bf16 summed in f32.
    let f: F = |a| {
        let (_, grads) = value_and_grad(|b| b[0].index_select(1, &a[1])?.mul(&a[2])?.sum_all(), &[a[0].clone()])?;
        Ok(grads)
    };
    let cases = [
        (DType::F32, 1, 50, 7, vec![3i64; 16_384]),
        (DType::BF16, 3, 41, 100, token_ids(2000, 41, 5)),
        (DType::F32, 2, 300, 33, token_ids(999, 300, 6)),
        (DType::F32, 2, 9, 16, Vec::new()),
    ];
    for (dtype, outer, size, inner, ids) in cases {
        let inputs = [
            randn(&[outer, size, inner], dtype, 1),
            indices(&ids, DType::I64),
            randn(&[outer, ids.len(), inner], dtype, 2),
        ];
        check(
            &format!("index_select grad {dtype} [{outer}, {size}, {inner}] of {} indices", ids.len()),
            f,
            &inputs,
            dtype,
        );
    }
}

#[test]
fn gpu_embedding_out_of_range_is_an_error_eagerly_and_compiled() {
    let Some(gpu) = gpu() else { return };
    let w = randn(&[10, 8], DType::F32, 1).to_device(gpu).unwrap();
    let bad = indices(&[1, 10, 2], DType::I64).to_device(gpu).unwrap();
    let good = indices(&[1, 9, 2], DType::I64).to_device(gpu).unwrap();
    // Eagerly the indices are read on the host before anything runs.
    let err = w.embedding(&bad).unwrap_err().to_string();
    assert!(err.contains("index 10") && err.contains("0..10"), "{err}");
    let want = w.embedding(&good).unwrap().mul_scalar(2.0).unwrap().to_vec::<f32>().unwrap();
    for mode in MODES {
        let f = compile(|a: &[Tensor]| Ok(vec![a[0].embedding(&a[1])?.mul_scalar(2.0)?])).fullgraph(true).mode(mode);
        // Compiled, the device-side check is read without a host wait: the bad call may return
        // its (clamped) outputs, and the error comes no later than the next host read.
        let err = match f.call(&[w.clone(), bad.clone()]) {
            Err(err) => err,
            Ok(out) => out[0].to_vec::<f32>().expect_err("the host read reports the bad index"),
        };
        let err = err.to_string();
        assert!(err.contains("index_select") && err.contains("index 10") && err.contains("size 10"), "{mode:?}: {err}");
        assert!(err.contains("gpu_model_ops.rs"), "the error names the op's source location: {err}");
        // Reported once, and the words were zeroed: good indices run and read again.
        let out = f.call(&[w.clone(), good.clone()]).unwrap();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), want, "{mode:?}");
        // A steady loop of good calls waits for nothing: no host sync per call.
        let before = sync_count();
        let mut last = Vec::new();
        for _ in 0..100 {
            last = f.call(&[w.clone(), good.clone()]).unwrap();
        }
        assert_eq!(sync_count() - before, 0, "{mode:?}: host syncs in 100 calls");
        assert_eq!(last[0].to_vec::<f32>().unwrap(), want, "{mode:?}");
        // Several bad calls before any read: reported (by a later call or the synchronization),
        // and afterwards nothing is left over.
        let mut errors = 0;
        for _ in 0..3 {
            errors += usize::from(f.call(&[w.clone(), bad.clone()]).is_err());
        }
        let device = cuda_device(0).unwrap();
        errors += usize::from(device.synchronize().is_err());
        assert!(errors >= 1, "{mode:?}: three bad calls and a synchronization raised nothing");
        device.synchronize().expect("every raised check was reported");
        assert_eq!(f.call(&[w.clone(), good.clone()]).unwrap()[0].to_vec::<f32>().unwrap(), want, "{mode:?}");
    }
}

#[test]
fn gpu_check_copy_is_a_span_on_the_compute_stream() {
    let Some(gpu) = gpu() else { return };
    let w = randn(&[10, 8], DType::F32, 1).to_device(gpu).unwrap();
    let good = indices(&[1, 9, 2], DType::I64).to_device(gpu).unwrap();
    for mode in [Mode::Default, Mode::ReduceOverhead] {
        let f = compile(|a: &[Tensor]| Ok(vec![a[0].embedding(&a[1])?.mul_scalar(2.0)?])).fullgraph(true).mode(mode);
        for _ in 0..3 {
            f.call(&[w.clone(), good.clone()]).unwrap();
        }
        timeline::start();
        f.call(&[w.clone(), good.clone()]).unwrap();
        let trace = timeline::stop().unwrap();
        let copies = trace.spans.iter().filter(|s| s.track == Track::Compute && s.name.starts_with("check words"));
        assert!(
            copies.clone().count() >= 1 && copies.clone().all(|s| s.category == "copy"),
            "{mode:?}: {:?}",
            trace.spans
        );
    }
}

#[test]
fn gpu_tied_embedding_and_output_weights() {
    let f: F = |a| {
        let (loss, grads) = value_and_grad(
            |b| b[0].embedding(&a[1])?.matmul(&b[0].transpose(0, 1)?)?.mul(&a[2])?.sum_all(),
            &[a[0].clone()],
        )?;
        Ok(vec![loss, grads[0].clone()])
    };
    let ids = token_ids(64, 500, 3);
    let inputs =
        [randn(&[500, 32], DType::F32, 1), Tensor::from_slice(&ids, [64]).unwrap(), randn(&[64, 500], DType::F32, 2)];
    check("tied embedding", f, &inputs, DType::F32);
}
