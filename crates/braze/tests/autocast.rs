//! Autocast regions (mixed precision as `torch.autocast`): which ops cast their float operands
//! to the region's dtype or to f32, the values they give, gradients through the casts, nesting,
//! and a compiled function traced again when called in another region.

use braze::{autocast, autocast_dtype, compile, value_and_grad, without_autocast, DType, Error, Result, Tensor};

fn randn(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    Tensor::randn(shape.to_vec(), dtype, seed).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_host().unwrap().to_f64_vec()
}

#[test]
fn each_op_takes_its_operands_as_the_op_table_says() {
    let (a, b) = (randn(&[4, 8], DType::F32, 1), randn(&[8, 3], DType::F32, 2));
    let x16 = randn(&[4, 8], DType::BF16, 3);
    let (w, bias) = (randn(&[8], DType::F32, 4), randn(&[8], DType::F32, 5));
    let dtypes = autocast(DType::BF16, || -> Result<Vec<DType>> {
        assert_eq!(autocast_dtype(), Some(DType::BF16));
        let q = randn(&[1, 2, 5, 8], DType::F32, 6);
        Ok(vec![
            a.matmul(&b)?.dtype(),                                       // lower
            q.scaled_dot_product_attention(&q, &q, true, None)?.dtype(), // lower
            x16.layer_norm(&w, &bias, 1e-5)?.dtype(),                    // f32
            x16.softmax(-1)?.dtype(),                                    // f32
            x16.sum(&[1], false)?.dtype(),                               // f32
            x16.exp()?.dtype(),                                          // f32
            x16.relu()?.dtype(),                                         // as it is
            a.add(&a)?.dtype(),                                          // as it is
            x16.max(&[1], false)?.dtype(),                               // as it is
        ])
    })
    .unwrap();
    use DType::{BF16, F32};
    assert_eq!(dtypes, [BF16, BF16, F32, F32, F32, F32, BF16, F32, BF16]);
    // Outside the region nothing is cast.
    assert_eq!(autocast_dtype(), None);
    assert_eq!(a.matmul(&b).unwrap().dtype(), F32);
    assert_eq!(x16.softmax(-1).unwrap().dtype(), BF16);
}

#[test]
fn a_region_computes_what_the_casts_written_out_compute() {
    let (a, b) = (randn(&[5, 16], DType::F32, 7), randn(&[16, 6], DType::F32, 8));
    let in_region = autocast(DType::F16, || a.matmul(&b)).unwrap();
    let by_hand = a.cast(DType::F16).unwrap().matmul(&b.cast(DType::F16).unwrap()).unwrap();
    assert_eq!(in_region.dtype(), DType::F16);
    assert_eq!(values(&in_region), values(&by_hand));
    // And it differs from the f32 product by about f16's rounding, not more.
    let exact = values(&a.matmul(&b).unwrap());
    for (got, want) in values(&in_region).iter().zip(&exact) {
        assert!((got - want).abs() <= 2e-2 * want.abs().max(1.0), "{got} vs {want}");
    }
}

#[test]
fn regions_nest_and_restore_also_after_an_error() {
    let a = randn(&[2, 2], DType::F32, 9);
    autocast(DType::BF16, || -> Result<()> {
        assert_eq!(a.matmul(&a)?.dtype(), DType::BF16);
        autocast(DType::F16, || -> Result<()> {
            assert_eq!(a.matmul(&a)?.dtype(), DType::F16);
            Ok(())
        })?;
        assert_eq!(autocast_dtype(), Some(DType::BF16));
        without_autocast(|| assert_eq!(a.matmul(&a).unwrap().dtype(), DType::F32));
        assert_eq!(autocast_dtype(), Some(DType::BF16));
        Ok(())
    })
    .unwrap();
    let failed: Result<()> =
        autocast(DType::BF16, || Err(Error::InvalidArgument { op: "x".into(), loc: None, detail: "y".into() }));
    assert!(failed.is_err());
    assert_eq!(autocast_dtype(), None, "the region ends with its closure's error");
    let refused = autocast(DType::F32, || -> Result<()> { panic!("does not run") }).unwrap_err();
    assert!(refused.to_string().contains("bf16 or f16"), "{refused}");
}

/// f32 parameters through a bf16 region get f32 gradients, close to the f32 ones, and equal to
/// the gradients of the computation with its casts written out.
#[test]
fn gradients_flow_back_through_the_casts_to_f32_parameters() {
    let x = randn(&[6, 8], DType::F32, 10);
    let w = randn(&[8, 4], DType::F32, 11);
    let loss = |p: &[Tensor]| x.matmul(&p[0])?.tanh()?.sum_all();
    let (value, grads) = autocast(DType::BF16, || value_and_grad(loss, std::slice::from_ref(&w))).unwrap();
    assert_eq!(value.dtype(), DType::F32, "sum is an f32 op");
    assert_eq!(grads[0].dtype(), DType::F32);
    let by_hand =
        |p: &[Tensor]| x.cast(DType::BF16)?.matmul(&p[0].cast(DType::BF16)?)?.tanh()?.cast(DType::F32)?.sum_all();
    let (_, hand_grads) = value_and_grad(by_hand, std::slice::from_ref(&w)).unwrap();
    assert_eq!(values(&grads[0]), values(&hand_grads[0]));
    let (_, f32_grads) = value_and_grad(loss, std::slice::from_ref(&w)).unwrap();
    for (got, want) in values(&grads[0]).iter().zip(values(&f32_grads[0])) {
        assert!((got - want).abs() <= 5e-2 * want.abs().max(1.0), "{got} vs {want}");
    }
}

/// A compiled function remembers the region it was traced in: called in another it is traced
/// again (and says why), called back in the first it hits the cache.
#[test]
fn a_compiled_function_is_traced_again_in_another_region() {
    let (a, b) = (randn(&[4, 8], DType::F32, 12), randn(&[8, 8], DType::F32, 13));
    let w = randn(&[8], DType::F32, 14);
    let f = move |x: &[Tensor]| -> Result<Vec<Tensor>> {
        let h = x[0].matmul(&x[1])?;
        Ok(vec![h.clone(), h.layer_norm(&w, &w, 1e-5)?])
    };
    let compiled = compile(f.clone()).fullgraph(true);
    let args = [a.clone(), b.clone()];
    let plain = compiled.call(&args).unwrap();
    assert_eq!(plain[0].dtype(), DType::F32);
    let mixed = autocast(DType::BF16, || compiled.call(&args)).unwrap();
    assert_eq!((mixed[0].dtype(), mixed[1].dtype()), (DType::BF16, DType::F32));
    let eager = autocast(DType::BF16, || f(&args)).unwrap();
    assert_eq!(values(&mixed[0]), values(&eager[0]));
    for (got, want) in values(&mixed[1]).iter().zip(values(&eager[1])) {
        assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "{got} vs {want}");
    }
    compiled.call(&args).unwrap();
    autocast(DType::BF16, || compiled.call(&args)).unwrap();
    let stats = compiled.stats();
    assert_eq!((stats.traces, stats.cache_hits), (2, 2), "{stats:?}");
    let explained = compiled.explain(&args).unwrap();
    assert!(
        explained.recompile_reasons.iter().any(|r| r.contains("autocast changed from off to bf16")),
        "{:?}",
        explained.recompile_reasons
    );
}
