//! Compiled and eager execution on a CUDA device against the CPU reference, for a few functions
//! of every kernel family, with outputs poisoned (`BRAZE_POISON_OUTPUTS=1`: NaN-filled before
//! every run) so an element no kernel wrote cannot pass. Skips without a GPU (fails instead when
//! `BRAZE_REQUIRE_CUDA=1`).

mod common;

use braze::{compile, DType, Mode, Result, Tensor};
use common::{check, gpu, F};

/// As [`check`] for functions returning sums over many rows, which differ from the wide
/// reference (float inputs widened to f32, each output rounded once to its dtype) in the order
/// they add: each element within f32's epsilon times its sum of magnitudes (`f` on
/// the inputs' absolute values; the error of a sum formed in f32 in chunks and trees stays well
/// inside it, while a lost or repeated row is off by that row's whole term), plus the two
/// roundings to the output's dtype (the reference's and the kernel's).
fn check_sums(name: &str, f: F, inputs: &[Tensor]) {
    let Some(gpu) = gpu() else { return };
    // The wide reference: compiled kernels keep a bf16 product in f32 before summing it, where
    // eager rounds each product to bf16 first (4,096 such roundings moved a small column's sum
    // by a third of itself).
    let wide_inputs: Vec<Tensor> = inputs.iter().map(|t| t.cast(DType::F32).unwrap()).collect();
    let want: Vec<_> = f(&wide_inputs)
        .unwrap()
        .iter()
        .zip(f(inputs).unwrap())
        .map(|(t, narrow)| t.cast(narrow.dtype()).unwrap().to_host().unwrap())
        .collect();
    let magnitudes: Vec<Tensor> = wide_inputs.iter().map(|t| t.abs().unwrap()).collect();
    let mass: Vec<_> = f(&magnitudes).unwrap().iter().map(|t| t.to_host().unwrap()).collect();
    let on_gpu: Vec<Tensor> = inputs.iter().map(|t| t.to_device(gpu).unwrap()).collect();
    for mode in [Mode::Default, Mode::ReduceOverhead, Mode::MaxAutotune] {
        let got = compile(f).fullgraph(true).mode(mode).call(&on_gpu).unwrap();
        for (j, ((g, w), m)) in got.iter().zip(&want).zip(&mass).enumerate() {
            let g = g.to_host().unwrap();
            // Both sides round to the output's dtype once: together at most one ulp apart,
            // at most 2^-7 of the value in bf16.
            let unit = if w.dtype() == DType::F32 { f32::EPSILON as f64 } else { 2f64.powi(-7) };
            for i in 0..w.numel() {
                let (x, r) = (g.get_f64(i), w.get_f64(i));
                let bound = f32::EPSILON as f64 * m.get_f64(i) + unit * r.abs();
                assert!((x - r).abs() <= bound, "{name} {mode:?} output {j} element {i}: {x} vs {r} (bound {bound:e})");
            }
        }
    }
}

fn randn(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    Tensor::randn(shape.to_vec(), dtype, seed).unwrap()
}

#[test]
fn gpu_layer_norm_relu_residual() {
    let f: F = |a| Ok(vec![a[0].layer_norm(&a[1], &a[2], 1e-5)?.relu()?.add(&a[3])?]);
    for (rows, hidden, dtype) in
        [(33, 1000, DType::F32), (64, 4096, DType::BF16), (5, 4097, DType::F32), (3, 256, DType::F32)]
    {
        let inputs = [
            randn(&[rows, hidden], dtype, 1),
            randn(&[hidden], dtype, 2),
            randn(&[hidden], dtype, 3),
            randn(&[rows, hidden], dtype, 4),
        ];
        check(&format!("ln_relu_res {rows}x{hidden} {dtype}"), f, &inputs, dtype);
    }
}

#[test]
fn gpu_elementwise_chain_with_broadcast() {
    let f: F = |a| Ok(vec![a[0].mul(&a[1])?.add(&a[2])?.gelu()?.mul(&a[3])?.add_scalar(0.5)?]);
    let inputs = [
        randn(&[1000, 3], DType::F32, 5),
        randn(&[1000, 3], DType::F32, 6),
        randn(&[3], DType::F32, 7),
        randn(&[1000, 1], DType::F32, 8),
    ];
    check("ew_chain broadcast", f, &inputs, DType::F32);
    let g: F = |a| Ok(vec![a[0].mul(&a[1])?.add(&a[2])?.gelu()?.mul(&a[3])?]);
    let n = 1_000_003;
    let inputs: Vec<Tensor> = (0..4).map(|i| randn(&[n], DType::BF16, 10 + i)).collect();
    check("ew_chain bf16", g, &inputs, DType::BF16);
}

#[test]
fn gpu_many_sums_in_one_kernel() {
    let f: F = |a| {
        let sums = a.iter().map(|t| t.sum_all()).collect::<Result<Vec<_>>>()?;
        Ok(vec![Tensor::stack(&sums, 0)?])
    };
    let sizes = [0usize, 1, 7, 100, 4096, 16385, 50_000, 3, 2, 300_001];
    let inputs: Vec<Tensor> = sizes.iter().enumerate().map(|(i, &s)| randn(&[s], DType::F32, 20 + i as u64)).collect();
    check("multisum", f, &inputs, DType::F32);
}

/// Sums over leading axes (column kernels: row chunks combined in a fixed order by the last
/// block of each column tile), and the layer norm backward whose weight and bias grads are such
/// sums; the same compiled call gives the same bits every time.
#[test]
fn gpu_column_reductions_and_layer_norm_backward() {
    let sums: F = |a| Ok(vec![a[0].mul(&a[1])?.sum(&[0], false)?, a[0].sum(&[0, 1], true)?]);
    for (rows, cols, dtype) in
        [(50_000, 300, DType::F32), (4096, 1024, DType::BF16), (7, 3, DType::F32), (0, 5, DType::F32)]
    {
        let inputs = [randn(&[rows, 2, cols], dtype, 70), randn(&[cols], dtype, 71)];
        check_sums(&format!("column sums {rows}x2x{cols} {dtype}"), sums, &inputs);
    }
    let backward: F = |a| {
        let loss = |p: &[Tensor]| p[0].layer_norm(&p[1], &p[2], 1e-5)?.mul(&p[3])?.sum_all();
        let (value, grads) = braze::value_and_grad(loss, a)?;
        Ok(vec![value, grads[0].clone(), grads[1].clone(), grads[2].clone()])
    };
    for (rows, hidden) in [(1024, 768), (33, 1000)] {
        let inputs = [
            randn(&[rows, hidden], DType::F32, 72),
            randn(&[hidden], DType::F32, 73),
            randn(&[hidden], DType::F32, 74),
            randn(&[rows, hidden], DType::F32, 75),
        ];
        check(&format!("layer norm backward {rows}x{hidden}"), backward, &inputs, DType::F32);
    }
    let Some(gpu) = gpu() else { return };
    let x = [randn(&[65_536, 7], DType::F32, 76).to_device(gpu).unwrap()];
    let compiled = compile(|a: &[Tensor]| Ok(vec![a[0].sum(&[0], false)?])).fullgraph(true);
    let first = compiled.call(&x).unwrap()[0].to_host().unwrap().to_bytes();
    for call in 1..5 {
        let again = compiled.call(&x).unwrap()[0].to_host().unwrap().to_bytes();
        assert!(again == first, "call {call} of a column sum gave other bits");
    }
}

#[test]
fn gpu_softmax_reductions_and_views() {
    let f: F = |a| {
        Ok(vec![
            a[0].softmax(-1)?,
            a[0].sum(&[0], true)?,
            a[0].max(&[1], false)?,
            a[0].transpose(0, 1)?.slice(0, 1, 9, 2)?.exp()?,
        ])
    };
    check("softmax/reductions/views", f, &[randn(&[37, 65], DType::F32, 30)], DType::F32);
}

#[test]
fn gpu_matmul_epilogue_and_mlp() {
    let f: F = |a| Ok(vec![a[0].matmul(&a[1])?.add(&a[2])?.relu()?]);
    check(
        "matmul+bias+relu f32",
        f,
        &[randn(&[64, 128], DType::F32, 40), randn(&[128, 96], DType::F32, 41), randn(&[96], DType::F32, 42)],
        DType::F32,
    );
    let mlp: F = |a| {
        let h = a[0].matmul(&a[1])?.add(&a[2])?.gelu()?.matmul(&a[3])?.add(&a[4])?;
        Ok(vec![a[0].add(&h)?.layer_norm(&a[5], &a[6], 1e-5)?])
    };
    let d = 256;
    let inputs = [
        randn(&[128, d], DType::BF16, 50),
        randn(&[d, 4 * d], DType::BF16, 51).mul_scalar(1.0 / 16.0).unwrap(),
        randn(&[4 * d], DType::BF16, 52),
        randn(&[4 * d, d], DType::BF16, 53).mul_scalar(1.0 / 32.0).unwrap(),
        randn(&[d], DType::BF16, 54),
        randn(&[d], DType::BF16, 55),
        randn(&[d], DType::BF16, 56),
    ];
    check("mlp_block bf16", mlp, &inputs, DType::BF16);
}

#[test]
fn gpu_chained_layers_in_one_kernel() {
    let f: F = |a| {
        let mut x = a[0].clone();
        for layer in 0..4 {
            x = x.layer_norm(&a[1 + 2 * layer], &a[2 + 2 * layer], 1e-5)?.relu()?.add(&x)?;
        }
        Ok(vec![x])
    };
    let mut inputs = vec![randn(&[64, 256], DType::F32, 60)];
    for i in 0..8 {
        inputs.push(randn(&[256], DType::F32, 61 + i));
    }
    check("tiny_block 4 layers", f, &inputs, DType::F32);
}

#[test]
fn gpu_zero_size_and_masks() {
    let f: F = |a| Ok(vec![a[0].exp()?, a[0].sum(&[1], false)?]);
    check("zero-size", f, &[randn(&[0, 5], DType::F32, 70)], DType::F32);
    let g: F = |a| Ok(vec![Tensor::where_(&a[0].isnan()?, &a[1], &a[0])?, a[0].isfinite()?]);
    let x = Tensor::from_vec(vec![1.0f32, f32::NAN, f32::INFINITY, -2.0, f32::NEG_INFINITY, 0.0], [2, 3]).unwrap();
    check("where/isnan", g, &[x, randn(&[2, 3], DType::F32, 71)], DType::F32);
}

/// An SGD step and a transposed assign compiled with CUDA graphs: the parameters keep their
/// device buffers (in-place write-backs, replayed into the same memory), one written directly and
/// one through a copy, and match eager execution on the GPU over several replays, also when the
/// first call autotunes.
#[test]
fn gpu_in_place_write_backs_under_cuda_graph_replay() {
    let Some(gpu) = gpu() else { return };
    let make = || -> Vec<Tensor> {
        vec![
            randn(&[64, 64], DType::F32, 1).to_device(gpu).unwrap(),
            randn(&[64, 64], DType::F32, 2).to_device(gpu).unwrap(),
        ]
    };
    let step = |p: &[Tensor], x: &Tensor| -> braze::Result<()> {
        let grad = p[0].mul(x)?.tanh()?;
        p[0].assign(&p[0].sub(&grad.mul_scalar(0.1)?)?)?;
        p[1].assign(&p[1].permute(&[1, 0])?.add(&grad)?)?;
        Ok(())
    };
    // Max-autotune times every kernel many times on the first call, the in-place update too:
    // the written inputs are restored around the tuning, so that call updates them once.
    for mode in [Mode::ReduceOverhead, Mode::MaxAutotune] {
        let (eager, compiled) = (make(), make());
        let x = randn(&[64, 64], DType::F32, 3).to_device(gpu).unwrap();
        let ptrs: Vec<usize> = compiled.iter().map(Tensor::data_ptr).collect();
        let captured = compiled.clone();
        let f = compile(move |a: &[Tensor]| {
            step(&captured, &a[0])?;
            Ok(vec![])
        })
        .fullgraph(true)
        .mode(mode);
        for call in 0..4 {
            step(&eager, &x).unwrap();
            f.call(std::slice::from_ref(&x)).unwrap();
            assert_eq!(
                compiled.iter().map(Tensor::data_ptr).collect::<Vec<_>>(),
                ptrs,
                "{mode:?} call {call}: swapped"
            );
            for (e, c) in eager.iter().zip(&compiled) {
                braze_cpu::compare::assert_close(&c.to_host().unwrap(), &e.to_host().unwrap())
                    .unwrap_or_else(|err| panic!("{mode:?} call {call}: {err}"));
            }
        }
        let explanation = f.explain(std::slice::from_ref(&x)).unwrap();
        assert_eq!((explanation.write_backs_in_place, explanation.write_backs_copied), (1, 1), "{explanation}");
    }
}

/// A caller keeping a small result of every call (a loss) and dropping the large one gets the
/// large buffer back on the next call, not a whole new set of outputs beside it; the results it
/// keeps stay intact.
#[test]
fn gpu_kept_small_results_do_not_pin_the_large_ones() {
    let Some(gpu) = gpu() else { return };
    let f: F = |a| Ok(vec![a[0].mul_scalar(2.0)?, a[0].mean_all()?]);
    let compiled = compile(f).fullgraph(true).mode(Mode::Default);
    let mut kept = Vec::new();
    let mut large_ptrs = Vec::new();
    for call in 0..6u64 {
        let x = randn(&[512, 512], DType::F32, 10 + call);
        let want = x.mean_all().unwrap().to_host().unwrap().get_f64(0);
        let out = compiled.call(&[x.to_device(gpu).unwrap()]).unwrap();
        large_ptrs.push(out[0].data_ptr());
        kept.push((out[1].clone(), want));
    }
    assert!(large_ptrs[1..].iter().all(|&p| p == large_ptrs[0]), "large outputs moved: {large_ptrs:?}");
    for (call, (loss, want)) in kept.iter().enumerate() {
        let got = loss.to_host().unwrap().get_f64(0);
        assert!((got - want).abs() <= 1e-5 * want.abs().max(1e-3), "call {call}: kept {got}, want {want}");
    }
}

/// A compiled step that drops the gradients first (`zero_grad`) frees the old ones before it
/// runs: each call's gradient lands in the memory of the last one, while the caller keeps every
/// loss.
#[test]
fn gpu_a_step_that_zeroes_grads_reuses_their_memory() {
    let Some(gpu) = gpu() else { return };
    let p = randn(&[256, 256], DType::F32, 1).to_device(gpu).unwrap();
    p.set_requires_grad(true).unwrap();
    let x = randn(&[256, 256], DType::F32, 2);
    let captured = p.clone();
    let step = compile(move |a: &[Tensor]| {
        captured.zero_grad();
        let loss = captured.mul(&a[0])?.mean_all()?;
        loss.backward()?;
        Ok(vec![loss])
    })
    .fullgraph(true)
    .mode(Mode::Default);
    let on_gpu = x.to_device(gpu).unwrap();
    let mut losses = Vec::new();
    let mut grad_ptrs = Vec::new();
    for _ in 0..5 {
        losses.extend(step.call(std::slice::from_ref(&on_gpu)).unwrap());
        grad_ptrs.push(p.grad().expect("the step leaves a gradient").data_ptr());
    }
    assert!(grad_ptrs.iter().all(|&g| g == grad_ptrs[0]), "gradients moved: {grad_ptrs:?}");
    // d mean(p * x) / dp = x / numel.
    let want = x.mul_scalar(1.0 / (256.0 * 256.0)).unwrap().to_host().unwrap();
    braze_cpu::compare::assert_close(&p.grad().unwrap().to_host().unwrap(), &want).unwrap();
    let first = losses[0].to_host().unwrap().get_f64(0);
    assert!(losses.iter().all(|l| l.to_host().unwrap().get_f64(0) == first), "a kept loss was overwritten");
}

/// A profiled call times every kernel of the plan, in plan order, and computes what a plain call
/// does, in every mode.
#[test]
fn gpu_profiled_calls_time_every_kernel() {
    let Some(gpu) = gpu() else { return };
    let f: F = |a| {
        let h = a[0].matmul(&a[1])?.relu()?;
        Ok(vec![h.softmax(1)?, h.mean_all()?])
    };
    let inputs = [randn(&[64, 128], DType::F32, 1), randn(&[128, 96], DType::F32, 2)];
    let on_gpu: Vec<Tensor> = inputs.iter().map(|t| t.to_device(gpu).unwrap()).collect();
    for mode in [Mode::Default, Mode::ReduceOverhead] {
        let compiled = compile(f).fullgraph(true).mode(mode);
        let plain = compiled.call(&on_gpu).unwrap();
        let (profiled, times) = compiled.profile(&on_gpu).unwrap();
        let kernels = compiled.explain(&on_gpu).unwrap().kernels.unwrap();
        assert_eq!(times.len(), kernels, "{mode:?}: {times:?}");
        assert!(times.iter().all(|t| t.ms > 0.0 && !t.kernel.is_empty()), "{mode:?}: {times:?}");
        assert!(times.iter().any(|t| t.family == "matmul"), "{mode:?}: {times:?}");
        for (p, q) in profiled.iter().zip(&plain) {
            assert_eq!(p.to_host().unwrap(), q.to_host().unwrap(), "{mode:?}");
        }
    }
}

/// The Gaussian helpers (`erfc`, exact GELU and its derivative) on the GPU against the f64
/// reference over a dense grid of f32 values from -16 to 16, the special values and subnormals:
/// each within 10 ulp of the correctly rounded value (a C port of the helpers measured at most
/// 6.5 with a correctly rounded `expf`; CUDA's is within 2 ulp), the ulp taken at the larger of
/// the result, the terms it sums (GELU's derivative `Phi(x) + x phi(x)` cancels near x = -0.75,
/// where no f32 evaluation of the sum keeps its relative accuracy) and 1e-35 (below which `Phi`
/// of x < -12.5 is subnormal in f32); NaN and infinities in the same places.
#[test]
fn gpu_gaussian_helpers_within_10_ulp() {
    let Some(gpu) = gpu() else { return };
    let mut xs: Vec<f64> = (0..=1 << 20).map(|i| -16.0 + 32.0 * i as f64 / (1 << 20) as f64).collect();
    xs.extend([0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1e-40, -1e-40, 1e-30, -0.7517916]);
    let x = Tensor::from_host(braze_ir::HostTensor::from_f64(DType::F32, [xs.len()], &xs).unwrap());
    let xs = x.to_host().unwrap().to_f64_vec();
    type Op = fn(&Tensor) -> Result<Tensor>;
    // The magnitude the error is measured at, per x.
    type Scale<'a> = &'a dyn Fn(f64) -> f64;
    let normal = |x: f64| 0.5 * libm::erfc(-x / std::f64::consts::SQRT_2);
    let density = |x: f64| (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let cases: [(&str, Op, Scale); 3] = [
        ("erfc", |t| t.erfc(), &|x| libm::erfc(x).abs()),
        ("gelu", |t| t.gelu(), &|x| (x * normal(x)).abs()),
        ("gelu_grad", |t| t.gelu_grad(), &|x| normal(x).abs() + (x * density(x)).abs()),
    ];
    let on_gpu = x.to_device(gpu).unwrap();
    for (name, op, scale) in cases {
        let want = op(&x).unwrap().to_host().unwrap().to_f64_vec();
        let compiled = compile(move |a: &[Tensor]| Ok(vec![op(&a[0])?])).fullgraph(true);
        for (label, got) in [
            ("eager", op(&on_gpu).unwrap()),
            ("compiled", compiled.call(std::slice::from_ref(&on_gpu)).unwrap().remove(0)),
        ] {
            let got = got.to_host().unwrap().to_f64_vec();
            for i in 0..xs.len() {
                let (g, w) = (got[i], want[i]);
                if !w.is_finite() || !g.is_finite() {
                    assert!(g == w || (g.is_nan() && w.is_nan()), "{name} {label}({}): {g} vs {w}", xs[i]);
                    continue;
                }
                let at = scale(xs[i]).max(w.abs()).max(1e-35);
                let ulps = (g - w).abs() / braze_cpu::compare::ulp(DType::F32, at);
                assert!(ulps <= 10.0, "{name} {label}({}): {g} vs {w}, {ulps:.1} ulp", xs[i]);
            }
        }
    }
}

/// Eager `zeros`/`ones`/`full` on the GPU fill on the device (memsets, 8-byte elements with
/// unequal halves through strided ones), every dtype and value kind right, zero-size included.
#[test]
fn gpu_full_fills_on_the_device() -> Result<()> {
    let Some(device) = gpu() else { return Ok(()) };
    let cases: [(DType, f64); 12] = [
        (DType::F32, 0.0),
        (DType::F32, -2.5),
        (DType::F16, 1.5),
        (DType::BF16, -3.0),
        (DType::BF16, 0.0),
        (DType::I32, 7.0),
        (DType::I32, -1.0),
        (DType::I64, 1.0),
        (DType::I64, -1.0),
        (DType::I64, -4_294_967_297.0),
        (DType::Bool, 1.0),
        (DType::Bool, 0.0),
    ];
    for (dtype, value) in cases {
        for shape in [vec![1027, 3], vec![0, 5]] {
            let on_gpu = Tensor::full(shape.clone(), value, dtype, device)?.to_host()?;
            let on_cpu = Tensor::full(shape.clone(), value, dtype, braze::Device::Cpu)?.to_host()?;
            assert_eq!(on_gpu.to_bytes(), on_cpu.to_bytes(), "full({shape:?}, {value}, {dtype})");
        }
    }
    assert_eq!(Tensor::ones([5], DType::F32, device)?.to_vec::<f32>()?, vec![1.0; 5]);
    assert_eq!(Tensor::zeros([5], DType::I64, device)?.to_vec::<i64>()?, vec![0; 5]);
    Ok(())
}
