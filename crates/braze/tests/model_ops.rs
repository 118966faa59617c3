//! The model ops of a language model through the `Tensor` API: eagerly on the CPU reference and
//! compiled through the whole pipeline on the CPU backend, judged against the f64 reference.

use braze::{compile, value_and_grad, DType, Device, Tensor};

/// Values of `t` as f64.
fn values(t: &Tensor) -> Vec<f64> {
    t.to_host().unwrap().to_f64_vec()
}

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * w.abs().max(1.0), "{what}[{i}]: {g} vs {w}");
    }
}

/// `log_softmax` of each row of `x` in f64.
fn log_softmax_rows(x: &[f64], cols: usize) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
            row.iter().map(move |v| v - lse).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn log_softmax_eager_and_compiled_match_the_reference() {
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 1e-2)] {
        let x = Tensor::randn([6, 300], DType::F32, 11).unwrap().mul_scalar(4.0).unwrap().cast(dtype).unwrap();
        let want = log_softmax_rows(&values(&x), 300);
        close(&values(&x.log_softmax(-1).unwrap()), &want, tol, "eager");
        let f = compile(|a: &[Tensor]| Ok(vec![a[0].log_softmax(1)?])).fullgraph(true);
        let out = f.call(std::slice::from_ref(&x)).unwrap();
        assert_eq!(out[0].dtype(), dtype);
        close(&values(&out[0]), &want, tol, "compiled");
    }
}

#[test]
fn log_softmax_gradient_matches_finite_differences() {
    let x = Tensor::randn([3, 7], DType::F32, 5).unwrap();
    let w = Tensor::randn([3, 7], DType::F32, 6).unwrap();
    let loss = |x: &Tensor| x.log_softmax(1)?.mul(&w)?.sum_all();
    let (_, grads) = value_and_grad(|a| loss(&a[0]), std::slice::from_ref(&x)).unwrap();
    // Central differences of the f64 formula.
    let (xv, wv) = (values(&x), values(&w));
    let f = |xs: &[f64]| log_softmax_rows(xs, 7).iter().zip(&wv).map(|(y, w)| y * w).sum::<f64>();
    let h = 1e-5;
    let numeric: Vec<f64> = (0..xv.len())
        .map(|i| {
            let (mut up, mut down) = (xv.clone(), xv.clone());
            up[i] += h;
            down[i] -= h;
            (f(&up) - f(&down)) / (2.0 * h)
        })
        .collect();
    close(&values(&grads[0]), &numeric, 1e-4, "eager gradient");
    let compiled = compile(|a: &[Tensor]| {
        let (_, g) = value_and_grad(|b| loss(&b[0]), &[a[0].clone()])?;
        Ok(g)
    });
    close(&values(&compiled.call(&[x]).unwrap()[0]), &numeric, 1e-4, "compiled gradient");
}

#[test]
fn arange_counts_from_zero_eagerly_and_inside_a_compiled_function() {
    assert_eq!(values(&Tensor::arange(5, DType::I64, Device::Cpu).unwrap()), [0.0, 1.0, 2.0, 3.0, 4.0]);
    assert_eq!(Tensor::arange(3, DType::I32, Device::Cpu).unwrap().to_vec::<i32>().unwrap(), [0, 1, 2]);
    assert_eq!(Tensor::arange(0, DType::F32, Device::Cpu).unwrap().shape().dims(), [0]);
    let f = compile(|a: &[Tensor]| Ok(vec![a[0].mul(&Tensor::arange(4, DType::F32, Device::Cpu)?)?])).fullgraph(true);
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], [4]).unwrap();
    assert_eq!(values(&f.call(&[x]).unwrap()[0]), [0.0, 2.0, 6.0, 12.0]);
    let err = Tensor::arange(3, DType::Bool, Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("arange") && err.contains("got bool"), "{err}");
}

/// Inside a compiled function an arange is an op of the graph, not data captured at trace time:
/// the graph's only input is the caller's, the values come from the kernel that reads them (one
/// kernel with the elementwise ops over its shape), and every dtype rounds as a cast would (bf16
/// past 256, f32 past 2^24), broadcast, as position ids of an embedding, and with no elements.
#[test]
fn compiled_aranges_are_graph_ops_computed_in_their_kernels() {
    for (dtype, n) in [(DType::F32, 4099), (DType::BF16, 1000), (DType::F16, 3000), (DType::I32, 70), (DType::I64, 5)] {
        let f = compile(move |a: &[Tensor]| {
            let ids = Tensor::arange(n, dtype, Device::Cpu)?;
            Ok(vec![ids.clone(), ids.cast(DType::F32)?.mul_scalar(0.5)?.add(&a[0])?])
        })
        .fullgraph(true);
        let x = Tensor::randn(vec![n], DType::F32, 7).unwrap();
        let explained = f.explain(std::slice::from_ref(&x)).unwrap();
        assert_eq!(explained.graphs[0].inputs().len(), 1, "{dtype}: the arange is no graph input\n{explained}");
        assert_eq!(explained.kernels, Some(1), "{dtype}: one pointwise kernel\n{explained}");
        let out = f.call(std::slice::from_ref(&x)).unwrap();
        let eager = Tensor::arange(n, dtype, Device::Cpu).unwrap();
        assert_eq!(out[0].dtype(), dtype);
        assert_eq!(values(&out[0]), values(&eager), "{dtype}: the values of an eager arange");
        let want: Vec<f64> = values(&eager).iter().zip(values(&x)).map(|(i, x)| (i * 0.5) as f32 as f64 + x).collect();
        close(&values(&out[1]), &want, 1e-6, &format!("{dtype}: arange * 0.5 + x"));
    }
    // Position embeddings: rows of a table picked by a broadcast arange, beside token rows.
    let f = compile(|a: &[Tensor]| {
        let (t, d) = (a[0].shape().dims()[0], a[0].shape().dims()[1]);
        let positions = a[0].index_select(0, &Tensor::arange(t, DType::I64, Device::Cpu)?)?;
        let grid = Tensor::arange(d, DType::F32, Device::Cpu)?.reshape([1, d])?;
        Ok(vec![positions.add(&grid)?, Tensor::arange(0, DType::I32, Device::Cpu)?])
    })
    .fullgraph(true);
    let table = Tensor::randn(vec![6, 3], DType::F32, 9).unwrap();
    let out = f.call(std::slice::from_ref(&table)).unwrap();
    let want: Vec<f64> = values(&table).iter().enumerate().map(|(k, v)| v + (k % 3) as f64).collect();
    close(&values(&out[0]), &want, 1e-6, "table rows plus a broadcast arange");
    assert_eq!(out[1].shape().dims(), [0]);
}

/// PyTorch's mean cross entropy and its logit gradient, in f64: `(loss, dlogits)`.
fn cross_entropy_reference(logits: &[f64], targets: &[i64], classes: usize, ignore: i64) -> (f64, Vec<f64>) {
    let counted = targets.iter().filter(|&&t| t != ignore).count() as f64;
    let (mut total, mut grad) = (0.0, vec![0.0; logits.len()]);
    for (n, &t) in targets.iter().enumerate() {
        if t == ignore {
            continue;
        }
        let row = &logits[n * classes..(n + 1) * classes];
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
        total += max + sum.ln() - row[t as usize];
        for (j, v) in row.iter().enumerate() {
            let onehot = if j == t as usize { 1.0 } else { 0.0 };
            grad[n * classes + j] = ((v - max).exp() / sum - onehot) / counted;
        }
    }
    (total / counted, grad)
}

#[test]
fn cross_entropy_at_gpt2_vocabularies_matches_the_reference() {
    for vocab in [50_257, 50_304] {
        for (dtype, index, tol) in [(DType::F32, DType::I64, 1e-5), (DType::BF16, DType::I32, 1e-2)] {
            let what = format!("vocab {vocab} {dtype} logits, {index} targets");
            let logits =
                Tensor::randn([4, vocab], DType::F32, 21).unwrap().mul_scalar(3.0).unwrap().cast(dtype).unwrap();
            let targets_v = [7, -100, vocab as i64 - 1, 0];
            let targets = Tensor::from_slice(&targets_v, [4]).unwrap().cast(index).unwrap();
            let (want_loss, want_grad) = cross_entropy_reference(&values(&logits), &targets_v, vocab, -100);
            let eager = logits.cross_entropy(&targets, -100).unwrap();
            assert_eq!(eager.dtype(), dtype, "{what}");
            close(&values(&eager), &[want_loss], tol, &format!("{what}: eager loss"));
            let step = compile(|a: &[Tensor]| {
                let (loss, grads) = value_and_grad(|b| b[0].cross_entropy(&a[1], -100), &[a[0].clone()])?;
                Ok(vec![loss, grads[0].clone()])
            })
            .fullgraph(true);
            let out = step.call(&[logits.clone(), targets.clone()]).unwrap();
            close(&values(&out[0]), &[want_loss], tol, &format!("{what}: compiled loss"));
            assert_eq!(out[1].dtype(), dtype, "{what}");
            let grad = values(&out[1]);
            // Each gradient relative to itself (they are far below 1), f32 to 1e-4, bf16 to 1e-2.
            let grad_tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
            for (j, (g, w)) in grad.iter().zip(&want_grad).enumerate() {
                assert!((g - w).abs() <= grad_tol * (w.abs() + 1e-9), "{what}: gradient [{j}] {g} vs {w}");
            }
            assert!(grad[vocab..2 * vocab].iter().all(|&g| g == 0.0), "{what}: the ignored row has zero gradients");
        }
    }
}

#[test]
fn cross_entropy_gradient_matches_finite_differences() {
    let logits = Tensor::randn([5, 9], DType::F32, 3).unwrap();
    let targets_v = [8i64, 0, 3, 3, 5];
    let targets = Tensor::from_slice(&targets_v, [5]).unwrap();
    let (_, grads) = value_and_grad(|a| a[0].cross_entropy(&targets, 3), std::slice::from_ref(&logits)).unwrap();
    let xv = values(&logits);
    let h = 1e-5;
    let numeric: Vec<f64> = (0..xv.len())
        .map(|i| {
            let (mut up, mut down) = (xv.clone(), xv.clone());
            up[i] += h;
            down[i] -= h;
            (cross_entropy_reference(&up, &targets_v, 9, 3).0 - cross_entropy_reference(&down, &targets_v, 9, 3).0)
                / (2.0 * h)
        })
        .collect();
    close(&values(&grads[0]), &numeric, 1e-4, "eager gradient");
}

#[test]
fn cross_entropy_targets_out_of_range_are_an_error_eagerly_and_nan_compiled() {
    let logits = Tensor::randn([2, 5], DType::F32, 1).unwrap();
    let targets = Tensor::from_slice(&[1i64, 5], [2]).unwrap();
    let err = logits.cross_entropy(&targets, -100).unwrap_err().to_string();
    assert!(err.contains("cross_entropy at crates/braze/tests/model_ops.rs:"), "{err}");
    assert!(err.ends_with("target 5 of row 1 is out of range: expected 0..5 or ignore_index -100"), "{err}");
    let f = compile(|a: &[Tensor]| Ok(vec![a[0].cross_entropy(&a[1], -100)?])).fullgraph(true);
    assert!(f.call(&[logits.clone(), targets]).unwrap()[0].item::<f32>().unwrap().is_nan());
    // A mean over no counted rows is NaN, as PyTorch's.
    let ignored = Tensor::from_slice(&[-100i64, -100], [2]).unwrap();
    assert!(logits.cross_entropy(&ignored, -100).unwrap().item::<f32>().unwrap().is_nan());
}

/// Whether element `i` survives dropout with `p` under `seed` from `offset` (the op's
/// definition, written out: Philox's first word against `round(p 2^32)`).
fn kept(i: usize, p: f64, seed: i64, offset: i64) -> bool {
    braze_ir::elementwise::philox_word(offset + i as i64, seed) >= (p * 4_294_967_296.0).round() as i64
}

fn i64_scalar(v: i64) -> Tensor {
    Tensor::scalar(v)
}

#[test]
fn dropout_draws_the_philox_stream_eagerly_and_compiled() {
    let (p, seed) = (0.25, 1234);
    let x = Tensor::randn([3, 50, 40], DType::F32, 8).unwrap();
    let xv = values(&x);
    let step = compile(|a: &[Tensor]| Ok(vec![a[0].dropout(0.25, &a[1], &a[2], true)?])).fullgraph(true);
    for offset in [0i64, 6000, 1 << 40] {
        let want: Vec<f64> = xv
            .iter()
            .enumerate()
            .map(|(i, v)| if kept(i, p, seed, offset) { (*v as f32 * (1.0f32 / 0.75)) as f64 } else { 0.0 })
            .collect();
        let eager = x.dropout(p, &i64_scalar(seed), &i64_scalar(offset), true).unwrap();
        assert_eq!(values(&eager), want, "eager at offset {offset}");
        let compiled = step.call(&[x.clone(), i64_scalar(seed), i64_scalar(offset)]).unwrap();
        assert_eq!(values(&compiled[0]), want, "compiled at offset {offset}");
    }
    // A new offset is a new mask from the same compiled graph: one trace for all three calls.
    assert_eq!(step.stats().traces, 1);
    let dropped = (0..6000).filter(|&i| !kept(i, p, seed, 0)).count() as f64 / 6000.0;
    assert!((dropped - p).abs() < 0.02, "dropped {dropped}");
}

#[test]
fn dropout_backward_reuses_the_mask_and_eval_is_the_identity() {
    let (seed, offset) = (i64_scalar(99), i64_scalar(7));
    let x = Tensor::randn([64, 33], DType::BF16, 2).unwrap();
    let (_, grads) =
        value_and_grad(|a| a[0].dropout(0.5, &seed, &offset, true)?.sum_all(), std::slice::from_ref(&x)).unwrap();
    let want: Vec<f64> = (0..64 * 33).map(|i| if kept(i, 0.5, 99, 7) { 2.0 } else { 0.0 }).collect();
    assert_eq!(grads[0].dtype(), DType::BF16);
    assert_eq!(values(&grads[0]), want, "eager gradient");
    let step = compile(|a: &[Tensor]| {
        let (_, g) = value_and_grad(|b| b[0].dropout(0.5, &a[1], &a[2], true)?.sum_all(), &[a[0].clone()])?;
        Ok(g)
    });
    assert_eq!(values(&step.call(&[x.clone(), i64_scalar(99), i64_scalar(7)]).unwrap()[0]), want, "compiled gradient");
    assert!(x.dropout(0.5, &seed, &offset, false).unwrap().same_tensor(&x));
    assert!(values(&x.dropout(1.0, &seed, &offset, true).unwrap()).iter().all(|&v| v == 0.0));
    let err = x.dropout(1.5, &seed, &offset, true).unwrap_err().to_string();
    assert!(err.ends_with("p must be in [0, 1], got 1.5"), "{err}");
    let err = x.dropout(0.5, &Tensor::scalar(1i32), &offset, true).unwrap_err().to_string();
    assert!(err.ends_with("seed must be a rank-0 i64 tensor, got i32[]"), "{err}");
}

#[test]
fn dropout_backward_draws_the_mask_again_instead_of_saving_it() {
    // dropout(x) @ w, then tanh: the backward needs the mask past the matmul. Only tanh's f32
    // output [64, 16] is saved (4 KiB), not the bool mask [64, 32].
    let step = compile(|a: &[Tensor]| {
        let (loss, g) = value_and_grad(
            |b| b[0].dropout(0.5, &a[1], &a[2], true)?.matmul(&a[3])?.tanh()?.sum_all(),
            &[a[0].clone()],
        )?;
        Ok(vec![loss, g[0].clone()])
    });
    let (x, w) = (Tensor::randn([64, 32], DType::F32, 2).unwrap(), Tensor::randn([32, 16], DType::F32, 3).unwrap());
    let args = [x.clone(), i64_scalar(5), i64_scalar(0), w.clone()];
    let saved = step.explain(&args).unwrap().saved_for_backward.unwrap();
    assert_eq!((saved.buffers, saved.bytes), (1, 64 * 16 * 4));
    // And the gradient is still the eager one.
    let out = step.call(&args).unwrap();
    let (_, eager) = value_and_grad(
        |b| b[0].dropout(0.5, &i64_scalar(5), &i64_scalar(0), true)?.matmul(&w)?.tanh()?.sum_all(),
        &[x],
    )
    .unwrap();
    close(&values(&out[1]), &values(&eager[0]), 1e-5, "gradient");
}

#[test]
fn cross_entropy_keeps_its_digits_at_large_logits() {
    // max + log(sum) - x would round ln 2 away next to 2^31 (an f32 ulp there is 256): the
    // target logit is taken relative to the row's max (random-graph fuzzing, model mode seed 90).
    let logits = Tensor::from_slice(&[2_147_483_648.0f32, 2_147_483_648.0, 1.0, 2.0], [2, 2]).unwrap();
    let targets = Tensor::from_slice(&[0i64, 1], [2]).unwrap();
    let want = (2f64.ln() + (1.0 + (-1f64).exp()).ln()) / 2.0;
    let f = compile(|a: &[Tensor]| Ok(vec![a[0].cross_entropy(&a[1], -100)?])).fullgraph(true);
    close(&values(&f.call(&[logits.clone(), targets.clone()]).unwrap()[0]), &[want], 1e-6, "compiled");
    close(&values(&logits.cross_entropy(&targets, -100).unwrap()), &[want], 1e-6, "eager");
}
