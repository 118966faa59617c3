//! Gradients: eager (the tape) and compiled (backward appended to the trace) give the same
//! values, `backward()` twice accumulates, `no_grad` records nothing, `detach` stops the flow,
//! and only float tensors have gradients.

use braze::{compile, no_grad, DType, Device, Result, Tensor};

fn values(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-4 + 1e-4 * w.abs(), "{what}[{i}]: {g} vs {w}");
    }
}

fn leaf(shape: &[usize], seed: u64) -> Tensor {
    let t = Tensor::randn(shape.to_vec(), DType::F32, seed).unwrap();
    t.set_requires_grad(true).unwrap();
    t
}

#[test]
fn eager_square_sum_gives_twice_the_input() -> Result<()> {
    let x = leaf(&[3, 4], 1);
    let loss = x.mul(&x)?.sum_all()?;
    loss.backward()?;
    let want: Vec<f64> = values(&x).iter().map(|v| 2.0 * v).collect();
    assert_close(&values(&x.grad().expect("x has a gradient")), &want, "d sum(x^2)");
    Ok(())
}

#[test]
fn backward_twice_accumulates_and_zero_grad_drops() -> Result<()> {
    let x = leaf(&[5], 2);
    let loss = x.exp()?.sum_all()?;
    loss.backward()?;
    loss.backward()?;
    let want: Vec<f64> = values(&x).iter().map(|v| 2.0 * (*v as f32).exp() as f64).collect();
    assert_close(&values(&x.grad().unwrap()), &want, "two backward calls");
    x.zero_grad();
    assert!(x.grad().is_none());
    Ok(())
}

#[test]
fn no_grad_records_nothing_and_detach_stops_the_flow() -> Result<()> {
    let x = leaf(&[4], 3);
    let y = no_grad(|| x.mul(&x))?;
    let err = y.sum_all()?.backward().unwrap_err();
    assert!(err.to_string().contains("does not need a gradient"), "{err}");
    // d/dx sum(detach(x) * x) = detach(x) = x.
    let loss = x.detach()?.mul(&x)?.sum_all()?;
    loss.backward()?;
    assert_close(&values(&x.grad().unwrap()), &values(&x), "through detach");
    Ok(())
}

#[test]
fn integer_tensors_have_no_gradient() {
    let i = Tensor::from_vec(vec![1i32, 2, 3], [3]).unwrap();
    let err = i.set_requires_grad(true).unwrap_err();
    assert!(err.to_string().contains("only float tensors have gradients"), "{err}");
}

#[test]
fn a_non_scalar_root_needs_a_seed() -> Result<()> {
    let x = leaf(&[2, 2], 4);
    let y = x.mul_scalar(3.0)?;
    let err = y.backward().unwrap_err();
    assert!(err.to_string().contains("backward_with"), "{err}");
    let seed = Tensor::ones([2, 2], DType::F32, Device::Cpu)?;
    y.backward_with(&seed)?;
    assert_close(&values(&x.grad().unwrap()), &[3.0; 4], "seeded");
    Ok(())
}

/// A small training loss over captured weights: layer norm, gelu, a matmul, a residual.
fn loss_of(x: &Tensor, w: &Tensor, b: &Tensor, m: &Tensor) -> Result<Tensor> {
    let h = x.layer_norm(w, b, 1e-5)?.gelu()?;
    let y = h.matmul(m)?.add(x)?;
    y.mul(&y)?.mean_all()
}

#[test]
fn compiled_gradients_equal_eager_ones() -> Result<()> {
    let x = Tensor::randn([6, 8], DType::F32, 10)?;
    let (w, b, m) = (leaf(&[8], 11), leaf(&[8], 12), leaf(&[8, 8], 13));
    loss_of(&x, &w, &b, &m)?.backward()?;
    let eager: Vec<Vec<f64>> = [&w, &b, &m].iter().map(|p| values(&p.grad().unwrap())).collect();
    for p in [&w, &b, &m] {
        p.zero_grad();
    }

    let (wc, bc, mc) = (w.clone(), b.clone(), m.clone());
    let step = compile(move |a: &[Tensor]| {
        for p in [&wc, &bc, &mc] {
            p.zero_grad();
        }
        let loss = loss_of(&a[0], &wc, &bc, &mc)?;
        loss.backward()?;
        Ok(vec![loss])
    })
    .fullgraph(true);
    for call in 0..3 {
        step.call(std::slice::from_ref(&x))?;
        for (p, want) in [&w, &b, &m].iter().zip(&eager) {
            assert_close(&values(&p.grad().unwrap()), want, &format!("call {call}"));
        }
    }
    assert_eq!(step.stats().recompiles, 0, "zero_grad inside the step: one trace serves every call");
    Ok(())
}

#[test]
fn compiled_backward_accumulates_across_calls_without_zero_grad() -> Result<()> {
    let x = Tensor::randn([3, 8], DType::F32, 20)?;
    let (w, b, m) = (leaf(&[8], 21), leaf(&[8], 22), leaf(&[8, 8], 23));
    loss_of(&x, &w, &b, &m)?.backward()?;
    let once = values(&m.grad().unwrap());
    m.zero_grad();
    w.zero_grad();
    b.zero_grad();

    let (wc, bc, mc) = (w.clone(), b.clone(), m.clone());
    let step = compile(move |a: &[Tensor]| {
        let loss = loss_of(&a[0], &wc, &bc, &mc)?;
        loss.backward()?;
        Ok(vec![loss])
    })
    .fullgraph(true);
    for calls in 1..=3 {
        step.call(std::slice::from_ref(&x))?;
        let want: Vec<f64> = once.iter().map(|g| g * calls as f64).collect();
        assert_close(&values(&m.grad().unwrap()), &want, &format!("after {calls} calls"));
    }
    // The first trace assumed no gradient; the second accumulates into the one it finds.
    assert_eq!(step.stats().recompiles, 1);
    Ok(())
}

#[test]
fn grad_inside_a_compiled_function_is_the_traced_gradient() -> Result<()> {
    let x = Tensor::randn([4], DType::F32, 30)?;
    let w = leaf(&[4], 31);
    let wc = w.clone();
    let f = compile(move |a: &[Tensor]| {
        wc.zero_grad();
        let loss = a[0].mul(&wc)?.sum_all()?;
        loss.backward()?;
        let g = wc.grad().expect("backward set it");
        // An SGD-like use of the gradient inside the same graph.
        Ok(vec![wc.sub(&g.mul_scalar(0.1)?)?])
    })
    .fullgraph(true);
    let out = f.call(std::slice::from_ref(&x))?;
    let want: Vec<f64> = values(&w).iter().zip(values(&x)).map(|(w, x)| w - 0.1 * x).collect();
    assert_close(&values(&out[0]), &want, "w - 0.1 dL/dw");
    assert_close(&values(&w.grad().unwrap()), &values(&x), "written back");
    Ok(())
}

#[test]
fn an_sgd_step_written_as_ordinary_code_updates_the_weights_in_one_graph() -> Result<()> {
    let x = Tensor::randn([4], DType::F32, 40)?;
    let w = leaf(&[4], 41);
    let w0 = values(&w);
    let wc = w.clone();
    let step = compile(move |a: &[Tensor]| {
        wc.zero_grad();
        let loss = a[0].mul(&wc)?.sum_all()?;
        loss.backward()?;
        let g = wc.grad().expect("backward set it");
        wc.assign(&wc.sub(&g.mul_scalar(0.1)?)?)?;
        Ok(vec![loss])
    })
    .fullgraph(true);
    let xs = values(&x);
    for k in 0..3 {
        let loss = step.call(std::slice::from_ref(&x))?[0].item::<f64>()?;
        // The loss of call k reads the weights after k updates.
        let want: f64 = w0.iter().zip(&xs).map(|(w, x)| x * (w - 0.1 * k as f64 * x)).sum();
        assert!((loss - want).abs() < 1e-4, "call {k}: loss {loss}, want {want}");
    }
    let want: Vec<f64> = w0.iter().zip(&xs).map(|(w, x)| w - 0.3 * x).collect();
    assert_close(&values(&w), &want, "after three steps");
    assert_eq!(step.stats().recompiles, 0);
    Ok(())
}

#[test]
fn assigning_an_argument_or_another_type_inside_a_compiled_function_is_an_error() {
    let x = Tensor::randn([4], DType::F32, 50).unwrap();
    let f = compile(|a: &[Tensor]| {
        a[0].assign(&a[0].mul_scalar(2.0)?)?;
        Ok(vec![a[0].clone()])
    });
    let err = f.call(std::slice::from_ref(&x)).unwrap_err();
    assert!(err.to_string().contains("only tensors the function captures"), "{err}");
    let w = Tensor::randn([4], DType::F32, 51).unwrap();
    let wc = w.clone();
    let g = compile(move |a: &[Tensor]| {
        wc.assign(&a[0].sum_all()?)?;
        Ok(vec![])
    });
    let err = g.call(std::slice::from_ref(&x)).unwrap_err();
    assert!(err.to_string().contains("must keep the type f32[4]"), "{err}");
}

#[test]
fn value_and_grad_eagerly_and_compiled() -> Result<()> {
    let x = Tensor::randn([3, 5], DType::F32, 60)?;
    let w = Tensor::randn([5], DType::F32, 61)?;
    let loss = |a: &[Tensor]| a[0].rms_norm(&a[1], 1e-6)?.tanh()?.sum_all();
    let (value, grads) = braze::value_and_grad(loss, &[x.clone(), w.clone()])?;
    assert!(x.grad().is_none() && w.grad().is_none(), "the functional form leaves .grad alone");
    let f = compile(move |a: &[Tensor]| {
        let (v, g) = braze::value_and_grad(loss, a)?;
        Ok(vec![v, g[0].clone(), g[1].clone()])
    })
    .fullgraph(true);
    let compiled = f.call(&[x, w])?;
    assert_close(&values(&compiled[0]), &values(&value), "value");
    assert_close(&values(&compiled[1]), &values(&grads[0]), "d/dx");
    assert_close(&values(&compiled[2]), &values(&grads[1]), "d/dw");
    Ok(())
}

/// `grad` is `value_and_grad` without the value: eagerly, compiled, and for an argument the
/// value does not depend on (zeros of its shape).
#[test]
fn grad_of_a_function_eagerly_and_compiled() -> Result<()> {
    let x = Tensor::randn([4, 3], DType::F32, 62)?;
    let unused = Tensor::randn([2], DType::F32, 63)?;
    let loss = |a: &[Tensor]| a[0].mul(&a[0])?.sum_all();
    let grads = braze::grad(loss, &[x.clone(), unused.clone()])?;
    let doubled: Vec<f64> = values(&x).iter().map(|v| 2.0 * v).collect();
    assert_close(&values(&grads[0]), &doubled, "d/dx of sum(x * x)");
    assert_eq!(values(&grads[1]), vec![0.0; 2], "an argument the value does not use");
    let f = compile(move |a: &[Tensor]| braze::grad(loss, a)).fullgraph(true);
    let compiled = f.call(&[x, unused])?;
    assert_close(&values(&compiled[0]), &doubled, "compiled d/dx");
    assert_eq!(values(&compiled[1]), vec![0.0; 2], "compiled, the unused argument");
    let counts = Tensor::from_vec(vec![1i32, 2], [2])?;
    let err = braze::grad(|a: &[Tensor]| a[0].sum_all(), &[counts]).unwrap_err().to_string();
    assert!(err.starts_with("grad") && err.contains("only float arguments") && err.contains("autograd.rs"), "{err}");
    Ok(())
}
