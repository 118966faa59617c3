//! Mixed dtypes promote as PyTorch's do, eagerly and compiled (casts inserted before the op, so
//! the traced graph stays strictly typed), and gradients flow back through the casts to each
//! operand's own dtype.

use braze::{compile, value_and_grad, DType, Result, Tensor};

fn ints(values: &[i64], dtype: DType) -> Tensor {
    Tensor::from_slice(values, [values.len()]).unwrap().cast(dtype).unwrap()
}

fn floats(values: &[f32], dtype: DType) -> Tensor {
    Tensor::from_slice(values, [values.len()]).unwrap().cast(dtype).unwrap()
}

/// `result` has `dtype` and, read as f64, `values`.
fn check(result: Result<Tensor>, dtype: DType, values: &[f64]) {
    let t = result.expect("op failed");
    assert_eq!(t.dtype(), dtype);
    let got: Vec<f64> = t.to_host().unwrap().to_f64_vec();
    assert_eq!(got, values);
}

#[test]
fn tensor_pairs_promote() {
    let f = floats(&[1.5, -2.0], DType::F32);
    let h = floats(&[0.5, 4.0], DType::BF16);
    let half = floats(&[0.25, 1.0], DType::F16);
    let (i32s, i64s) = (ints(&[3, -4], DType::I32), ints(&[1 << 40, 2], DType::I64));
    let bools = ints(&[1, 0], DType::Bool);
    check(f.add(&h), DType::F32, &[2.0, 2.0]);
    check(h.mul(&half), DType::F32, &[0.125, 4.0]);
    check(i32s.add(&i64s), DType::I64, &[(1i64 << 40) as f64 + 3.0, -2.0]);
    check(bools.add(&i32s), DType::I32, &[4.0, -4.0]);
    check(i32s.mul(&h), DType::BF16, &[1.5, -16.0]);
    check(i64s.lt(&f), DType::Bool, &[0.0, 0.0]);
    check(Tensor::where_(&bools, &i32s, &f), DType::F32, &[3.0, -2.0]);
    // A rank-0 tensor of the same category does not widen a dimensioned one.
    check(h.add(&Tensor::scalar(1.0f32)), DType::BF16, &[1.5, 5.0]);
    check(i32s.add(&Tensor::scalar(2.0f32)), DType::F32, &[5.0, -2.0]);
}

#[test]
fn scalars_promote_as_python_scalars() {
    let i32s = ints(&[3, -4], DType::I32);
    check(i32s.add_scalar(2.0), DType::I32, &[5.0, -2.0]);
    check(i32s.mul_scalar(0.5), DType::F32, &[1.5, -2.0]);
    check(i32s.gt_scalar(2.5), DType::Bool, &[1.0, 0.0]);
    check(ints(&[1, 0], DType::Bool).add_scalar(1.0), DType::I64, &[2.0, 1.0]);
    check(floats(&[1.0, 2.0], DType::F16).mul_scalar(0.5), DType::F16, &[0.5, 1.0]);
}

#[test]
fn compiled_calls_promote_as_eager_ones() {
    let f = compile(|a: &[Tensor]| Ok(vec![a[0].add(&a[1])?.mul(&a[2])?, a[2].mul_scalar(0.5)?]));
    let x = Tensor::randn([4, 3], DType::F32, 1).unwrap();
    let w = Tensor::randn([3], DType::BF16, 2).unwrap();
    let n = ints(&[1, 2, 3], DType::I64);
    let out = f.call(&[x.clone(), w.clone(), n.clone()]).unwrap();
    let eager = x.add(&w).unwrap().mul(&n).unwrap();
    assert_eq!(out[0].dtype(), DType::F32);
    assert_eq!(out[0].to_vec::<f32>().unwrap(), eager.to_vec::<f32>().unwrap());
    check(Ok(out[1].clone()), DType::F32, &[0.5, 1.0, 1.5]);
}

#[test]
fn gradients_reach_each_operand_in_its_own_dtype() {
    let x = Tensor::randn([5], DType::F32, 3).unwrap();
    let w = Tensor::randn([5], DType::BF16, 4).unwrap();
    let (loss, grads) = value_and_grad(|a| a[0].mul(&a[1])?.sum_all(), &[x.clone(), w.clone()]).unwrap();
    assert_eq!(loss.dtype(), DType::F32);
    assert_eq!(grads[0].dtype(), DType::F32);
    assert_eq!(grads[1].dtype(), DType::BF16);
    // d(sum x*w)/dx = w (exact in f32), d/dw = x rounded to bf16.
    assert_eq!(grads[0].to_host().unwrap().to_f64_vec(), w.to_host().unwrap().to_f64_vec());
    assert_eq!(grads[1].to_host().unwrap().to_f64_vec(), x.cast(DType::BF16).unwrap().to_host().unwrap().to_f64_vec());
}

#[test]
fn display_prints_values_as_pytorch() {
    assert_eq!(floats(&[1.0, 0.5], DType::F32).to_string(), "tensor([1.0000, 0.5000])");
    assert_eq!(ints(&[1, 2], DType::I32).to_string(), "tensor([1, 2], dtype=torch.int32)");
    let big = Tensor::zeros([1001], DType::F32, braze::Device::Cpu).unwrap();
    assert_eq!(big.to_string(), "tensor([0., 0., 0.,  ..., 0., 0., 0.])");
    // A traced tensor has no value to print, and printing it is no graph break.
    let f = compile(|a: &[Tensor]| {
        assert_eq!(a[0].to_string(), "tensor(<traced f32[2]>)");
        Ok(vec![a[0].clone()])
    })
    .fullgraph(true);
    f.call(&[floats(&[1.0, 2.0], DType::F32)]).unwrap();
}
