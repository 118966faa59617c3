//! Eager tensors: constructors, reads, and ops run one at a time on the CPU reference.

use braze::{DType, Device, Result, Tensor};
use half::{bf16, f16};

/// `result` must hold an f32 tensor of `shape` with `values`.
fn check(result: Result<Tensor>, shape: &[usize], values: &[f32]) {
    let t = result.expect("op failed");
    assert_eq!(t.shape().dims(), shape);
    let got = t.cast(DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(got.len(), values.len());
    for (g, w) in got.iter().zip(values) {
        assert!(
            g == w || (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-6 * w.abs().max(1.0),
            "{got:?} vs {values:?}"
        );
    }
}

fn v(values: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(values, shape.to_vec()).unwrap()
}

#[test]
fn constructors() {
    check(Tensor::zeros([2, 2], DType::F32, Device::Cpu), &[2, 2], &[0.0; 4]);
    check(Tensor::ones([3], DType::BF16, Device::Cpu), &[3], &[1.0; 3]);
    check(Tensor::full([2], 2.5, DType::F16, Device::Cpu), &[2], &[2.5, 2.5]);
    check(Ok(Tensor::scalar(4.0f32)), &[], &[4.0]);
    check(Tensor::from_vec(vec![1.5f64, -2.0], [2]), &[2], &[1.5, -2.0]);
    check(Tensor::from_vec(vec![f16::from_f32(0.5)], [1]), &[1], &[0.5]);
    check(Tensor::from_vec(vec![bf16::from_f32(-1.0)], [1]), &[1], &[-1.0]);
    check(Tensor::from_vec(vec![3i32, -4], [2]), &[2], &[3.0, -4.0]);
    check(Tensor::from_vec(vec![7i64], [1, 1]), &[1, 1], &[7.0]);
    check(Tensor::from_vec(vec![true, false], [2]), &[2], &[1.0, 0.0]);
}

#[test]
fn reads() {
    let x = v(&[1.0, 2.0, 3.0], &[3]);
    assert_eq!(x.to_vec::<f64>().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(x.sum_all().unwrap().item::<f32>().unwrap(), 6.0);
    assert!(x.gt_scalar(2.5).unwrap().max_all().unwrap().to_bool().unwrap());
    assert!(!x.any_nan().unwrap().to_bool().unwrap());
    assert!(v(&[f32::NAN], &[1]).to_bool().unwrap(), "NaN is true, as in C and PyTorch");
    assert_eq!((x.numel(), x.rank(), x.dtype(), x.device()), (3, 1, DType::F32, Device::Cpu));
    assert_eq!(x.to_host().unwrap().to_f64_vec(), vec![1.0, 2.0, 3.0]);
}

#[test]
fn seeded_random() {
    let a = Tensor::randn([1000], DType::F32, 5).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(a, Tensor::randn([1000], DType::F32, 5).unwrap().to_vec::<f32>().unwrap());
    assert_ne!(a, Tensor::randn([1000], DType::F32, 6).unwrap().to_vec::<f32>().unwrap());
    let mean = a.iter().sum::<f32>() / 1000.0;
    let var = a.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / 1000.0;
    assert!(mean.abs() < 0.15 && (var - 1.0).abs() < 0.15, "mean {mean}, var {var}");
    let u = Tensor::rand_uniform([1000], DType::F32, -2.0, 3.0, 1).unwrap().to_vec::<f32>().unwrap();
    assert!(u.iter().all(|&x| (-2.0..3.0).contains(&x)));
    assert!(Tensor::rand_uniform([2], DType::F32, 1.0, 1.0, 1).is_err());
}

/// `randn_std` gives the bits of the eager ops it stands for, in every float dtype, at scales
/// whose f32 rounding matters (0.02 is not an f32) and at the ones models use.
#[test]
fn randn_std_is_randn_times_std_in_f32_rounded_to_the_dtype() {
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for (std, seed) in [(0.02, 3), (0.02 / (24f64).sqrt(), 4), (1.0, 5), (3.7e-3, 6)] {
            let fast = Tensor::randn_std([4099], dtype, std, seed).unwrap();
            let eager = Tensor::randn([4099], DType::F32, seed).unwrap().mul_scalar(std).unwrap().cast(dtype).unwrap();
            assert_eq!(fast.dtype(), dtype);
            assert_eq!(fast.to_host().unwrap(), eager.to_host().unwrap(), "{dtype} std {std} seed {seed}");
        }
    }
    assert!(Tensor::randn_std([2], DType::I32, 1.0, 0).is_err());
    assert_eq!(Tensor::randn_std([0, 3], DType::F32, 1.0, 0).unwrap().shape().dims(), [0, 3]);
}

#[test]
fn elementwise_and_operators() {
    let a = v(&[1.0, -2.0, 4.0], &[3]);
    let b = v(&[2.0, 2.0, 2.0], &[3]);
    check(&a + &b, &[3], &[3.0, 0.0, 6.0]);
    check(&a - &b, &[3], &[-1.0, -4.0, 2.0]);
    check(&a * 3.0, &[3], &[3.0, -6.0, 12.0]);
    check(&a / &b, &[3], &[0.5, -1.0, 2.0]);
    check(-&a, &[3], &[-1.0, 2.0, -4.0]);
    check(a.relu(), &[3], &[1.0, 0.0, 4.0]);
    check(a.abs().and_then(|x| x.sqrt()), &[3], &[1.0, 2f32.sqrt(), 2.0]);
    check(a.maximum_scalar(0.5), &[3], &[1.0, 0.5, 4.0]);
    check(a.pow(&b), &[3], &[1.0, 4.0, 16.0]);
    check(a.lt(&b).and_then(|m| m.cast(DType::F32)), &[3], &[1.0, 1.0, 0.0]);
    check(Tensor::where_(&a.gt_scalar(0.0).unwrap(), &a, &b), &[3], &[1.0, 2.0, 4.0]);
    check(v(&[0.0], &[1]).gelu(), &[1], &[0.0]);
    check(v(&[0.0], &[1]).sigmoid(), &[1], &[0.5]);
}

#[test]
fn shapes_and_reductions() {
    let x = v(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    check(x.sum(&[-1], false), &[2], &[6.0, 15.0]);
    check(x.mean(&[0], true), &[1, 3], &[2.5, 3.5, 4.5]);
    check(x.max_all(), &[], &[6.0]);
    check(x.transpose(0, 1), &[3, 2], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    check(x.slice(1, 0, 3, 2), &[2, 2], &[1.0, 3.0, 4.0, 6.0]);
    check(
        Tensor::concat(&[x.clone(), x.clone()], 0),
        &[4, 3],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
    );
    check(Tensor::stack(&[v(&[1.0], &[1]), v(&[2.0], &[1])], 1), &[1, 2], &[1.0, 2.0]);
    check(x.reshape([3, 2]).and_then(|y| y.matmul(&v(&[1.0, 1.0], &[2, 1]))), &[3, 1], &[3.0, 7.0, 11.0]);
    check(v(&[0.0, 0.0], &[1, 2]).softmax(-1), &[1, 2], &[0.5, 0.5]);
    check(v(&[1.0, 3.0], &[1, 2]).layer_norm(&v(&[1.0, 1.0], &[2]), &v(&[0.0, 0.0], &[2]), 0.0), &[1, 2], &[-1.0, 1.0]);
}

#[test]
fn nonzero_gives_indices() {
    let x = v(&[0.0, 2.0, 0.0, f32::NAN], &[2, 2]);
    let indices = x.nonzero().unwrap();
    assert_eq!(indices.shape().dims(), &[2, 2]);
    assert_eq!(indices.to_vec::<i64>().unwrap(), vec![0, 1, 1, 1]);
}

#[test]
fn assign_replaces_data_for_every_clone() {
    let w = v(&[1.0, 2.0], &[2]);
    let alias = w.clone();
    w.assign(&v(&[5.0, 6.0, 7.0], &[3])).unwrap();
    assert!(alias.same_tensor(&w));
    assert_eq!(alias.to_vec::<f32>().unwrap(), vec![5.0, 6.0, 7.0]);
    w.assign(&w.clone()).unwrap();
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![5.0, 6.0, 7.0]);
}
