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
        let out = f.call(&[x.clone()]).unwrap();
        assert_eq!(out[0].dtype(), dtype);
        close(&values(&out[0]), &want, tol, "compiled");
    }
}

#[test]
fn log_softmax_gradient_matches_finite_differences() {
    let x = Tensor::randn([3, 7], DType::F32, 5).unwrap();
    let w = Tensor::randn([3, 7], DType::F32, 6).unwrap();
    let loss = |x: &Tensor| x.log_softmax(1)?.mul(&w)?.sum_all();
    let (_, grads) = value_and_grad(|a| loss(&a[0]), &[x.clone()]).unwrap();
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
