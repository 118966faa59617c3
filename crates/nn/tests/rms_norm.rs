//! `RmsNorm` on the CPU backend: its parameter, its forward against `x / sqrt(mean(x²) + eps) *
//! weight` computed by hand (eager and compiled) and the gradient reaching its weight.

use braze::{compile, DType, Device, Tensor};
use braze_nn::{Error, Init, Module, RmsNorm};

const DIM: usize = 16;
const ROWS: usize = 6; // a [2, 3, DIM] input: the norm is over the last dim only
const EPS: f64 = 1e-3; // large enough beside mean(x²) of the inputs below to matter

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// A norm with a random weight (the new one's is all ones) and a random input of std 0.1, so
/// mean(x²) is about 0.01 and eps changes the result by about 5%.
fn norm_and_input() -> (RmsNorm, Tensor) {
    let norm = RmsNorm::new(&mut Init::new(DType::F32, Device::Cpu, 0), DIM, EPS).unwrap();
    norm.weight.assign(&Tensor::randn([DIM], DType::F32, 7).unwrap()).unwrap();
    (norm, Tensor::randn_std([2, 3, DIM], DType::F32, 0.1, 8).unwrap())
}

/// `x / sqrt(mean(x²) + eps)` row by row, in f64: the normalized input before the weight.
fn normalized(x: &[f32]) -> Vec<f64> {
    x.chunks(DIM)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / DIM as f64;
            let inv = 1.0 / (ms + EPS).sqrt();
            row.iter().map(move |&v| v as f64 * inv)
        })
        .collect()
}

fn nn_error(e: Error) -> braze::Error {
    match e {
        Error::Tensor(e) => e,
        other => braze::Error::InvalidArgument { op: "nn".into(), loc: None, detail: other.to_string() },
    }
}

fn assert_close(actual: &[f32], expected: &[f64], tol: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(((*a as f64) - e).abs() <= tol * (1.0 + e.abs()), "{what}[{i}]: {a} vs {e}");
    }
}

#[test]
fn rms_norm_has_one_weight_of_ones_under_pytorchs_name() {
    let norm = RmsNorm::new(&mut Init::new(DType::F32, Device::Cpu, 0), DIM, 1e-6).unwrap();
    let named = norm.named_parameters();
    assert_eq!(named.len(), 1);
    assert_eq!(named[0].0, "weight");
    assert_eq!(named[0].1.shape().dims(), &[DIM]);
    assert_eq!(named[0].1.dtype(), DType::F32);
    assert!(named[0].1.requires_grad(), "a parameter requires grad");
    assert_eq!(values(&named[0].1), vec![1.0; DIM]);
    assert_eq!(norm.num_parameters(), DIM);
    assert_eq!(norm.eps, 1e-6);
    let mut prefixed = Vec::new();
    norm.visit_parameters("model.norm.", &mut |name, t| prefixed.push((name, t.shape().dims().to_vec())));
    assert_eq!(prefixed, [("model.norm.weight".to_string(), vec![DIM])]);
}

#[test]
fn rms_norm_forward_matches_a_hand_computation_eager_and_compiled() {
    let (norm, x) = norm_and_input();
    let w = values(&norm.weight);
    let expected: Vec<f64> = normalized(&values(&x)).iter().enumerate().map(|(i, v)| v * w[i % DIM] as f64).collect();
    // Without eps the values differ by far more than the tolerance: eps is applied.
    let without_eps: Vec<f64> = values(&x)
        .chunks(DIM)
        .flat_map(|row| {
            let rms = (row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / DIM as f64).sqrt();
            row.iter().map(move |&v| v as f64 / rms).collect::<Vec<_>>()
        })
        .enumerate()
        .map(|(i, v)| v * w[i % DIM] as f64)
        .collect();
    assert!(expected.iter().zip(&without_eps).any(|(a, b)| (a - b).abs() > 1e-2 * (1.0 + b.abs())));

    let eager = norm.forward(&x).unwrap();
    assert_eq!(eager.shape().dims(), &[2, 3, DIM]);
    assert_eq!(eager.dtype(), DType::F32);
    assert_close(&values(&eager), &expected, 1e-5, "eager rms_norm");

    let compiled = compile(|a: &[Tensor]| Ok(vec![norm.forward(&a[0]).map_err(nn_error)?])).fullgraph(true);
    let out = compiled.call(std::slice::from_ref(&x)).unwrap();
    assert_close(&values(&out[0]), &expected, 1e-5, "compiled rms_norm");
}

#[test]
fn the_gradient_reaches_the_weight() {
    let (norm, x) = norm_and_input();
    // loss = sum(rms_norm(x) * g): d loss / d weight[j] = sum over rows of g[r, j] * x̂[r, j].
    let g = Tensor::randn([2, 3, DIM], DType::F32, 9).unwrap();
    let loss = norm.forward(&x).unwrap().mul(&g).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    let grad = norm.weight.grad().expect("the weight has a gradient");
    assert_eq!(grad.shape().dims(), &[DIM]);
    let (xhat, gv) = (normalized(&values(&x)), values(&g));
    let expected: Vec<f64> =
        (0..DIM).map(|j| (0..ROWS).map(|r| gv[r * DIM + j] as f64 * xhat[r * DIM + j]).sum()).collect();
    assert_close(&values(&grad), &expected, 1e-5, "weight grad");
    assert!(x.grad().is_none(), "an input that does not require grad gets none");

    norm.zero_grad();
    assert!(norm.weight.grad().is_none(), "zero_grad drops it");
}
