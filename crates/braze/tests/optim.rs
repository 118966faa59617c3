//! Optimizers against PyTorch's update rules written out in f64, eagerly and inside a compiled
//! training step; a learning-rate schedule that never retraces; non-finite gradients skipping
//! the update on the device; global gradient-norm clipping.

use braze::optim::{clip_grad_norm, clip_grad_norm_checked, AdamW, Optimizer, Sgd, StateDType};
use braze::{compile, DType, Result, Tensor};

fn values(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F32).unwrap().to_vec::<f64>().unwrap()
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 2e-5 + 2e-5 * w.abs(), "{what}[{i}]: {g} vs {w}");
    }
}

fn weight(seed: u64) -> Tensor {
    let w = Tensor::randn([6], DType::F32, seed).unwrap();
    w.set_requires_grad(true).unwrap();
    w
}

/// `loss = sum((w * x - y)^2)`: its gradient is `2 x (w x - y)`.
fn loss(w: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let r = w.mul(x)?.sub(y)?;
    r.mul(&r)?.sum_all()
}

fn grad_ref(w: &[f64], x: &[f64], y: &[f64]) -> Vec<f64> {
    w.iter().zip(x).zip(y).map(|((w, x), y)| 2.0 * x * (w * x - y)).collect()
}

/// `torch.optim.AdamW`'s step, in f64.
fn adamw_ref(w: &mut [f64], m: &mut [f64], v: &mut [f64], g: &[f64], t: i32, lr: f64) {
    let (b1, b2, eps, wd) = (0.9, 0.999, 1e-8, 0.01);
    for i in 0..w.len() {
        w[i] *= 1.0 - lr * wd;
        m[i] = b1 * m[i] + (1.0 - b1) * g[i];
        v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
        let denom = v[i].sqrt() / (1.0 - b2.powi(t)).sqrt() + eps;
        w[i] -= lr / (1.0 - b1.powi(t)) * m[i] / denom;
    }
}

#[test]
fn adamw_follows_pytorch_eagerly_and_compiled() -> Result<()> {
    let (x, y) = (Tensor::randn([6], DType::F32, 1)?, Tensor::randn([6], DType::F32, 2)?);
    let (xs, ys) = (values(&x), values(&y));
    let (eager_w, compiled_w) = (weight(3), weight(3));
    let mut want = values(&eager_w);
    let (mut m, mut v) = (vec![0.0; 6], vec![0.0; 6]);

    let eager_opt = AdamW::new(std::slice::from_ref(&eager_w), 1e-2)?;
    let opt = AdamW::new(std::slice::from_ref(&compiled_w), 1e-2)?;
    let wc = compiled_w.clone();
    let step = compile(move |a: &[Tensor]| {
        opt.zero_grad();
        let l = loss(&wc, &a[0], &a[1])?;
        l.backward()?;
        opt.step()?;
        Ok(vec![l])
    })
    .fullgraph(true);
    for t in 1..=5 {
        let g = grad_ref(&want, &xs, &ys);
        adamw_ref(&mut want, &mut m, &mut v, &g, t, 1e-2);
        eager_opt.zero_grad();
        loss(&eager_w, &x, &y)?.backward()?;
        eager_opt.step()?;
        step.call(&[x.clone(), y.clone()])?;
        assert_close(&values(&eager_w), &want, &format!("eager step {t}"));
        assert_close(&values(&compiled_w), &want, &format!("compiled step {t}"));
    }
    assert_eq!(step.stats().recompiles, 0);
    Ok(())
}

/// `x` rounded to the nearest bf16 (ties to even), as f64.
fn bf16(x: f64) -> f64 {
    let bits = (x as f32).to_bits();
    let rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000;
    f64::from(f32::from_bits(rounded))
}

/// Within one bf16 step of `want` (relative), or of zero for tiny values.
fn assert_bf16_close(got: &[f64], want: &[f64], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= w.abs() / 128.0 + 1e-12, "{what}[{i}]: {g} vs {w}");
    }
}

/// bf16 parameters with their state in bf16 (what `torch.optim.AdamW` keeps for them): the
/// moments are bf16 tensors and follow PyTorch's update rounded to bf16 at every step, eagerly
/// and compiled. `loss = sum(w * c)` has the exact gradient `c`, so the reference rounds only
/// where the optimizer does.
#[test]
fn adamw_with_state_in_the_params_dtype_rounds_like_pytorch() -> Result<()> {
    let c: Vec<f32> = vec![0.5, -1.25, 2.0, -0.0625, 3.0, -0.75];
    let g: Vec<f64> = c.iter().map(|&v| f64::from(v)).collect();
    let cs = Tensor::from_vec(c, [6])?.cast(DType::BF16)?;
    let start = Tensor::randn([6], DType::BF16, 11)?;
    let param = || -> Result<Tensor> {
        let w = start.mul_scalar(1.0)?;
        w.set_requires_grad(true)?;
        Ok(w)
    };
    let (eager_w, compiled_w) = (param()?, param()?);
    let mut want = values(&eager_w);
    let (mut m, mut v) = (vec![0.0; 6], vec![0.0; 6]);
    let eager_opt = AdamW::new(std::slice::from_ref(&eager_w), 1e-2)?.state_dtype(StateDType::OfParams)?;
    let opt =
        std::sync::Arc::new(AdamW::new(std::slice::from_ref(&compiled_w), 1e-2)?.state_dtype(StateDType::OfParams)?);
    let (inner, wc) = (opt.clone(), compiled_w.clone());
    let step = compile(move |a: &[Tensor]| {
        inner.zero_grad();
        wc.mul(&a[0])?.sum_all()?.backward()?;
        inner.step()?;
        Ok(vec![])
    })
    .fullgraph(true);
    let (b1, b2, eps, wd, lr) = (0.9, 0.999, 1e-8, 0.01, 1e-2);
    for t in 1..=5 {
        for i in 0..6 {
            let decayed = want[i] * (1.0 - lr * wd);
            let (m_new, v_new) = (b1 * m[i] + (1.0 - b1) * g[i], b2 * v[i] + (1.0 - b2) * g[i] * g[i]);
            let denom = v_new.sqrt() / (1.0 - b2.powi(t)).sqrt() + eps;
            want[i] = bf16(decayed - lr / (1.0 - b1.powi(t)) * m_new / denom);
            (m[i], v[i]) = (bf16(m_new), bf16(v_new));
        }
        eager_opt.zero_grad();
        eager_w.mul(&cs)?.sum_all()?.backward()?;
        eager_opt.step()?;
        step.call(std::slice::from_ref(&cs))?;
        for (what, w, moments) in [("eager", &eager_w, eager_opt.moments()), ("compiled", &compiled_w, opt.moments())] {
            assert_eq!(
                (w.dtype(), moments.0[0].dtype(), moments.1[0].dtype()),
                (DType::BF16, DType::BF16, DType::BF16)
            );
            assert_bf16_close(&values(w), &want, &format!("{what} weight, step {t}"));
            assert_bf16_close(&values(&moments.0[0]), &m, &format!("{what} first moment, step {t}"));
            assert_bf16_close(&values(&moments.1[0]), &v, &format!("{what} second moment, step {t}"));
        }
    }
    assert_eq!(step.stats().recompiles, 0);
    Ok(())
}

#[test]
fn sgd_with_nesterov_momentum_and_weight_decay_follows_pytorch() -> Result<()> {
    let (x, y) = (Tensor::randn([6], DType::F32, 4)?, Tensor::randn([6], DType::F32, 5)?);
    let (xs, ys) = (values(&x), values(&y));
    let w = weight(6);
    let mut want = values(&w);
    let mut buf = [0.0; 6];
    let opt = Sgd::new(std::slice::from_ref(&w), 0.05)?.momentum(0.9, true)?.weight_decay(0.1);
    let wc = w.clone();
    let step = compile(move |a: &[Tensor]| {
        opt.zero_grad();
        loss(&wc, &a[0], &a[1])?.backward()?;
        opt.step()?;
        Ok(vec![])
    })
    .fullgraph(true);
    for t in 0..4 {
        let g: Vec<f64> = grad_ref(&want, &xs, &ys).iter().zip(&want).map(|(g, w)| g + 0.1 * w).collect();
        for i in 0..6 {
            buf[i] = 0.9 * buf[i] + g[i];
            want[i] -= 0.05 * (g[i] + 0.9 * buf[i]);
        }
        step.call(&[x.clone(), y.clone()])?;
        assert_close(&values(&w), &want, &format!("step {t}"));
    }
    Ok(())
}

#[test]
fn a_learning_rate_schedule_over_1000_steps_never_retraces() -> Result<()> {
    let (x, y) = (Tensor::randn([6], DType::F32, 7)?, Tensor::randn([6], DType::F32, 8)?);
    let w = weight(9);
    let opt = std::sync::Arc::new(Sgd::new(std::slice::from_ref(&w), 0.0)?);
    let (wc, inner) = (w.clone(), opt.clone());
    let step = compile(move |a: &[Tensor]| {
        inner.zero_grad();
        loss(&wc, &a[0], &a[1])?.backward()?;
        inner.step()?;
        Ok(vec![])
    })
    .fullgraph(true);
    // Cosine decay from 2e-4: small enough that w is far from its optimum after 1000 steps, so
    // a step that used a stale learning rate would end elsewhere.
    let schedule = |i: usize| 2e-4 * 0.5 * (1.0 + (std::f64::consts::PI * i as f64 / 1000.0).cos());
    let (xs, ys, mut want) = (values(&x), values(&y), values(&w));
    for i in 0..1000 {
        opt.set_lr(schedule(i))?;
        step.call(&[x.clone(), y.clone()])?;
        for j in 0..want.len() {
            want[j] -= schedule(i) * 2.0 * xs[j] * (want[j] * xs[j] - ys[j]);
        }
    }
    for (j, (got, want)) in values(&w).iter().zip(&want).enumerate() {
        assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "w[{j}]: {got} vs {want} (the schedule's)");
    }
    // The learning rate first set, kept for every step, ends measurably elsewhere.
    let mut stale = values(&weight(9));
    for _ in 0..1000 {
        for j in 0..stale.len() {
            stale[j] -= schedule(0) * 2.0 * xs[j] * (stale[j] * xs[j] - ys[j]);
        }
    }
    assert!(stale.iter().zip(&want).any(|(s, w)| (s - w).abs() > 1e-2 * w.abs().max(1.0)), "{stale:?} vs {want:?}");
    assert_eq!(step.stats().recompiles, 0, "the learning rate is a device scalar");
    Ok(())
}

#[test]
fn non_finite_gradients_skip_the_update_on_the_device() -> Result<()> {
    let w = weight(10);
    let before = values(&w);
    let opt = AdamW::new(std::slice::from_ref(&w), 1e-2)?;
    let wc = w.clone();
    let inner = std::sync::Arc::new(opt);
    let opt2 = inner.clone();
    let step = compile(move |a: &[Tensor]| {
        opt2.zero_grad();
        wc.mul(&a[0])?.sum_all()?.backward()?;
        opt2.step()?;
        Ok(vec![])
    })
    .fullgraph(true);
    let poisoned = Tensor::from_vec(vec![1.0f32, f32::NAN, 0.0, 1.0, 2.0, 3.0], [6])?;
    step.call(&[poisoned])?;
    assert_eq!(values(&w), before, "the whole update is skipped");
    assert_eq!(inner.skipped_steps().item::<f64>()?, 1.0);
    assert_eq!(inner.steps().item::<f64>()?, 0.0, "the step count is not advanced");
    step.call(&[Tensor::ones([6], DType::F32, braze::Device::Cpu)?])?;
    assert_ne!(values(&w), before);
    assert_eq!(inner.skipped_steps().item::<f64>()?, 1.0);
    // Read as a metric: a value the host receives without waiting for the device.
    let mut skipped = braze::DeviceMetric::new("skipped steps", braze::Device::Cpu);
    skipped.set(inner.skipped_steps())?;
    skipped.request()?;
    step.call(&[poisoned_again()?])?;
    // A read already requested keeps the value it was requested at.
    assert_eq!(skipped.poll()?.map(|r| (r.sum, r.count)), Some((1.0, 1)));
    skipped.set(inner.skipped_steps())?;
    skipped.request()?;
    assert_eq!(skipped.poll()?.map(|r| (r.sum, r.count)), Some((2.0, 1)), "a set value is one value");
    Ok(())
}

fn poisoned_again() -> Result<Tensor> {
    Tensor::from_vec(vec![f32::INFINITY, 0.0, 0.0, 1.0, 2.0, 3.0], [6])
}

#[test]
fn clipping_scales_every_gradient_by_the_global_norm() -> Result<()> {
    let (a, b) = (weight(11), weight(12));
    a.mul_scalar(3.0)?.sum_all()?.backward()?; // grad 3 everywhere: norm sqrt(54)
    b.mul_scalar(4.0)?.sum_all()?.backward()?; // grad 4: norm sqrt(96); total sqrt(150)
    let norm = clip_grad_norm(&[a.clone(), b.clone()], 1.0)?.unwrap().item::<f64>()?;
    assert!((norm - 150f64.sqrt()).abs() < 1e-4, "{norm}");
    let scale = 1.0 / (150f64.sqrt() + 1e-6);
    assert_close(&values(&a.grad().unwrap()), &[3.0 * scale; 6], "a");
    assert_close(&values(&b.grad().unwrap()), &[4.0 * scale; 6], "b");
    Ok(())
}

/// The checked clip flags a NaN or an infinity in any gradient before clipping, and an optimizer
/// stepping on that flag skips exactly when its own check of the clipped gradients would: for
/// finite gradients (also ones whose norm overflows), one infinity, and one NaN, compiled, the
/// parameters after a clipped step on the flag equal those after a clipped plain step.
#[test]
fn a_checked_clip_flags_what_the_optimizer_would_skip() -> Result<()> {
    let run = |x: &[f32], checked: bool| -> Result<(Vec<f64>, f64, bool)> {
        let w = weight(13);
        let opt = std::sync::Arc::new(AdamW::new(std::slice::from_ref(&w), 1e-2)?);
        let (wc, inner) = (w.clone(), opt.clone());
        let step = compile(move |a: &[Tensor]| {
            inner.zero_grad();
            wc.mul(&a[0])?.sum_all()?.backward()?;
            if checked {
                let (norm, non_finite) = clip_grad_norm_checked(std::slice::from_ref(&wc), 1.0)?.unwrap();
                inner.step_skipping(&non_finite)?;
                Ok(vec![norm, non_finite])
            } else {
                let norm = clip_grad_norm(std::slice::from_ref(&wc), 1.0)?.unwrap();
                inner.step()?;
                Ok(vec![norm])
            }
        })
        .fullgraph(true);
        let out = step.call(&[Tensor::from_vec(x.to_vec(), [6])?])?;
        let flag = if checked { out[1].to_bool()? } else { false };
        Ok((values(&w), opt.skipped_steps().item::<f64>()?, flag))
    };
    let cases: [(&str, [f32; 6], bool); 4] = [
        ("finite", [1.0, -2.0, 0.5, 3.0, 0.0, 1.5], false),
        ("overflowing norm", [3e38, -3e38, 1.0, 2.0, 3.0, 4.0], false),
        ("an infinity", [1.0, f32::INFINITY, 0.5, 3.0, 0.0, 1.5], true),
        ("a NaN", [1.0, 2.0, f32::NAN, 3.0, 0.0, 1.5], true),
    ];
    for (what, x, bad) in cases {
        let (plain, plain_skipped, _) = run(&x, false)?;
        let (checked, checked_skipped, flag) = run(&x, true)?;
        assert_eq!(flag, bad, "{what}: the flag");
        assert_eq!(checked_skipped, plain_skipped, "{what}: skipped steps");
        assert_eq!(checked_skipped, if bad { 1.0 } else { 0.0 }, "{what}: skipped steps");
        assert_close(&checked, &plain, what);
    }
    Ok(())
}

type MakeOptimizer = fn(&[Tensor]) -> Result<Box<dyn Optimizer + Send + Sync>>;

/// Parameters of three shapes in `dtype`, the same for the same seed.
fn params(dtype: DType, seed: u64) -> Result<Vec<Tensor>> {
    let shapes: [&[usize]; 3] = [&[6], &[3, 5], &[4, 2, 3]];
    let mut params = Vec::new();
    for (i, shape) in shapes.into_iter().enumerate() {
        let p = Tensor::randn(shape.to_vec(), dtype, seed + i as u64)?;
        p.set_requires_grad(true)?;
        params.push(p);
    }
    Ok(params)
}

/// `sum(x * p^2)` over every parameter, in f32.
fn params_loss(params: &[Tensor], x: &Tensor) -> Result<Tensor> {
    let mut total: Option<Tensor> = None;
    for p in params {
        let p32 = p.cast(DType::F32)?;
        let term = p32.mul(&p32)?.mul(x)?.sum_all()?;
        total = Some(match total {
            Some(t) => t.add(&term)?,
            None => term,
        });
    }
    Ok(total.expect("parameters"))
}

/// Runs three steps of the optimizer `make` builds over parameters of three shapes, compiled and
/// eagerly, and checks that they agree and that the compiled step updates every parameter (and
/// its state) in one launch. The compiled graph's last outputs are the optimizer's write-backs in
/// the order it assigns them: `per_param` for each parameter, then `trailing` scalars.
fn check_one_update_launch(what: &str, dtype: DType, make: MakeOptimizer, per_param: usize, trailing: usize) {
    let (eager, compiled) = (params(dtype, 40).unwrap(), params(dtype, 40).unwrap());
    let eager_opt = make(&eager).unwrap();
    let opt = make(&compiled).unwrap();
    let inner = compiled.clone();
    let step = compile(move |a: &[Tensor]| {
        opt.zero_grad();
        params_loss(&inner, &a[0])?.backward()?;
        opt.step()?;
        Ok(vec![])
    })
    .fullgraph(true);
    let x = Tensor::full([], 0.7, DType::F32, braze::Device::Cpu).unwrap();
    for t in 0..3 {
        eager_opt.zero_grad();
        params_loss(&eager, &x).unwrap().backward().unwrap();
        eager_opt.step().unwrap();
        step.call(std::slice::from_ref(&x)).unwrap();
        let tolerance = if dtype == DType::F32 { 2e-5 } else { 2e-2 };
        for (i, (e, c)) in eager.iter().zip(&compiled).enumerate() {
            let as_f32 = |t: &Tensor| values(&t.cast(DType::F32).unwrap());
            for (j, (e, c)) in as_f32(e).iter().zip(as_f32(c)).enumerate() {
                assert!((e - c).abs() <= tolerance * (1.0 + e.abs()), "{what} {dtype} step {t}: p{i}[{j}]: {c} vs {e}");
            }
        }
    }

    let graph = step.explain(std::slice::from_ref(&x)).unwrap().graphs[0].clone();
    let plan = braze_passes::compile_to_plan(&graph, &braze_passes::FusionOptions::default()).unwrap();
    let outputs = plan.outputs.len();
    let updates = &plan.outputs[outputs - trailing - per_param * 3..outputs - trailing];
    let mut writers: Vec<usize> = updates
        .iter()
        .map(|o| plan.kernels.iter().position(|k| k.outputs.contains(&o.buffer)).expect("a computed write-back"))
        .collect();
    writers.sort();
    writers.dedup();
    assert_eq!(writers.len(), 1, "{what} {dtype}: one launch updates all 3 parameters\n{plan}");
    let kernel = &plan.kernels[writers[0]];
    assert_eq!(kernel.kind.family(), "multi_pointwise", "{what} {dtype}\n{plan}");
}

#[test]
fn every_optimizer_updates_all_parameters_in_one_launch() {
    let sgd: MakeOptimizer = |p| Ok(Box::new(Sgd::new(p, 0.05)?));
    let momentum: MakeOptimizer = |p| Ok(Box::new(Sgd::new(p, 0.05)?.momentum(0.9, false)?));
    let nesterov: MakeOptimizer = |p| Ok(Box::new(Sgd::new(p, 0.05)?.momentum(0.9, true)?.weight_decay(0.1)));
    let adamw: MakeOptimizer = |p| Ok(Box::new(AdamW::new(p, 1e-2)?.weight_decay(0.05)));
    for dtype in [DType::F32, DType::BF16] {
        // Write-backs: SGD the parameter (and the momentum buffer first), then the skip count;
        // AdamW m, v and the parameter, then the step count and the skip count.
        check_one_update_launch("sgd", dtype, sgd, 1, 1);
        check_one_update_launch("sgd momentum", dtype, momentum, 2, 1);
        check_one_update_launch("sgd nesterov weight decay", dtype, nesterov, 2, 1);
        check_one_update_launch("adamw", dtype, adamw, 3, 2);
    }
}
