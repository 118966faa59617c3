//! `scaled_dot_product_attention` through `compile()` on the CPU backend (fusion, then the plan
//! executor modelling the flash kernels), forward and gradients, against the eager reference;
//! and its argument errors. `gpu_attention.rs` runs the same functions on a GPU.

use braze::{compile, value_and_grad, DType, Result, Tensor};
use braze_cpu::compare::{assert_close_bounded, Bounds};

type F = fn(&[Tensor]) -> Result<Vec<Tensor>>;

fn forward_causal(a: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![a[0].scaled_dot_product_attention(&a[1], &a[2], true, None)?])
}

fn forward_scaled(a: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![a[0].scaled_dot_product_attention(&a[1], &a[2], false, Some(0.3))?])
}

/// `sum(attention(q, k, v) * dout)` and its gradients with respect to q, k and v.
fn gradients(a: &[Tensor], causal: bool) -> Result<Vec<Tensor>> {
    let dout = a[3].clone();
    let (loss, grads) = value_and_grad(
        |x| x[0].scaled_dot_product_attention(&x[1], &x[2], causal, None)?.mul(&dout)?.sum_all(),
        &a[..3],
    )?;
    Ok([vec![loss.cast(DType::F32)?], grads].concat())
}

fn gradients_causal(a: &[Tensor]) -> Result<Vec<Tensor>> {
    gradients(a, true)
}

fn gradients_full(a: &[Tensor]) -> Result<Vec<Tensor>> {
    gradients(a, false)
}

fn inputs(shape: [usize; 4], dtype: DType, count: usize, seed: u64) -> Vec<Tensor> {
    (0..count as u64).map(|i| Tensor::randn(shape.to_vec(), dtype, seed + i).unwrap()).collect()
}

/// `f` compiled against `f` run eagerly (the reference) and on inputs widened to f32 (the
/// wide reference: compiled kernels keep bf16/f16 intermediates in f32).
fn check(name: &str, f: F, inputs: &[Tensor], dtype: DType) {
    let want: Vec<_> = f(inputs).unwrap().iter().map(|t| t.to_host().unwrap()).collect();
    let wide_inputs: Vec<Tensor> = inputs.iter().map(|t| t.cast(DType::F32).unwrap()).collect();
    let wide: Vec<_> = f(&wide_inputs)
        .unwrap()
        .iter()
        .zip(&want)
        .map(|(t, w)| t.cast(w.dtype()).unwrap().to_host().unwrap())
        .collect();
    let got = compile(f).fullgraph(true).call(inputs).unwrap();
    for (j, ((g, w), wide)) in got.iter().zip(&want).zip(&wide).enumerate() {
        let bounds = Bounds::for_rounding(w.dtype(), [dtype], w.numel());
        assert_close_bounded(&g.to_host().unwrap(), w, Some(wide), &bounds)
            .unwrap_or_else(|e| panic!("{name} output {j}: {e}"));
    }
}

#[test]
fn compiled_attention_matches_eager() {
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for shape in [[2, 3, 17, 64], [1, 1, 1, 128], [1, 2, 40, 128]] {
            check(&format!("causal {dtype} {shape:?}"), forward_causal, &inputs(shape, dtype, 3, 1), dtype);
            check(&format!("scale 0.3 {dtype} {shape:?}"), forward_scaled, &inputs(shape, dtype, 3, 4), dtype);
        }
    }
}

#[test]
fn compiled_attention_gradients_match_eager() {
    for dtype in [DType::F32, DType::BF16] {
        for shape in [[1, 2, 17, 64], [2, 1, 1, 64], [1, 1, 33, 128]] {
            check(&format!("grads causal {dtype} {shape:?}"), gradients_causal, &inputs(shape, dtype, 4, 7), dtype);
            check(&format!("grads {dtype} {shape:?}"), gradients_full, &inputs(shape, dtype, 4, 11), dtype);
        }
    }
}

#[test]
fn attention_argument_errors_name_the_operand() {
    let q = Tensor::randn(vec![1, 2, 5, 8], DType::F32, 1).unwrap();
    let short = Tensor::randn(vec![1, 2, 4, 8], DType::F32, 2).unwrap();
    let err = q.scaled_dot_product_attention(&short, &q, false, None).unwrap_err().to_string();
    assert!(err.contains("operand 1 has shape [1,2,4,8], expected the query's shape [1,2,5,8]"), "{err}");
    let narrow = q.cast(DType::BF16).unwrap();
    let err = q.scaled_dot_product_attention(&q, &narrow, false, None).unwrap_err().to_string();
    assert!(err.contains("operand 2 has dtype bf16, expected f32"), "{err}");
    let flat = Tensor::randn(vec![5, 8], DType::F32, 3).unwrap();
    let err = flat.scaled_dot_product_attention(&flat, &flat, false, None).unwrap_err().to_string();
    assert!(err.contains("[batch, heads, sequence, head_dim]"), "{err}");
    let err = q.scaled_dot_product_attention(&q, &q, true, Some(-1.0)).unwrap_err().to_string();
    assert!(err.contains("scale must be finite and positive, got -1"), "{err}");
}
