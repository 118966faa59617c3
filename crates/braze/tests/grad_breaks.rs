//! Gradients through functions split at graph breaks (lenient mode): each compiled piece records
//! a node on the autograd tape whose backward is a compiled graph, so `loss.backward()` after the
//! call, or inside the function after a break, gives the eager gradients. Checked against eager
//! autograd and against central differences of the reference.

use braze::{compile, no_grad, CustomOp, DType, HostTensor, Result, Tensor};

type LossFn = fn(&[Tensor], &[Tensor]) -> Result<Tensor>;

fn values(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol + tol * w.abs(), "{what}[{i}]: {g} vs {w}");
    }
}

fn param(shape: &[usize], seed: u64) -> Tensor {
    let t = Tensor::randn(shape.to_vec(), DType::F32, seed).unwrap().mul_scalar(0.5).unwrap();
    t.set_requires_grad(true).unwrap();
    t
}

fn grads(params: &[Tensor]) -> Vec<Vec<f64>> {
    params.iter().map(|p| values(&p.grad().expect("the parameter has a gradient"))).collect()
}

fn zero_grads(params: &[Tensor]) {
    params.iter().for_each(Tensor::zero_grad);
}

/// `params` with element `i` of parameter `p` moved by `delta`.
fn nudged(params: &[Tensor], p: usize, i: usize, delta: f64) -> Vec<Tensor> {
    let mut data = values(&params[p]);
    data[i] += delta;
    let mut out = params.to_vec();
    out[p] = Tensor::from_vec(data, params[p].shape()).unwrap();
    out
}

/// The eager gradients of `loss` with respect to `params`, checked against central differences
/// of the loss (evaluated eagerly, on the f64-accurate reference) on a few elements each.
fn eager_grads(loss: LossFn, args: &[Tensor], params: &[Tensor]) -> Vec<Vec<f64>> {
    let eager = eager_grads_unchecked(loss, args, params);
    let h = 1e-2;
    for (p, grad) in eager.iter().enumerate() {
        for (i, &analytic) in grad.iter().enumerate().take(5) {
            let plus = loss(args, &nudged(params, p, i, h)).unwrap().item::<f32>().unwrap() as f64;
            let minus = loss(args, &nudged(params, p, i, -h)).unwrap().item::<f32>().unwrap() as f64;
            let numeric = (plus - minus) / (2.0 * h);
            assert!(
                (analytic - numeric).abs() <= 2e-2 + 2e-2 * numeric.abs(),
                "param {p}[{i}]: {analytic} vs {numeric}"
            );
        }
    }
    eager
}

/// The eager gradients of `loss` (for losses whose gradient is not the loss's derivative, e.g.
/// with `no_grad` inside).
fn eager_grads_unchecked(loss: LossFn, args: &[Tensor], params: &[Tensor]) -> Vec<Vec<f64>> {
    zero_grads(params);
    loss(args, params).unwrap().backward().unwrap();
    let eager = grads(params);
    zero_grads(params);
    eager
}

/// Compiles `loss` over captured parameters (lenient), calls it, and runs `backward()` on the
/// returned loss after the call; the gradients equal the eager ones. Returns the breaks seen.
fn check_after_call(loss: LossFn, args: &[Tensor], params: &[Tensor]) -> usize {
    let eager = eager_grads(loss, args, params);
    let captured = params.to_vec();
    let f = compile(move |a: &[Tensor]| Ok(vec![loss(a, &captured)?]));
    for call in 0..2 {
        zero_grads(params);
        let out = f.call(args).unwrap();
        out[0].backward().unwrap();
        for (got, want) in grads(params).iter().zip(&eager) {
            assert_close(got, want, 1e-4, &format!("call {call}"));
        }
    }
    zero_grads(params);
    f.explain(args).unwrap().breaks.len()
}

/// `tanh(x @ w + b)` squared and averaged, with a host read of the hidden values in the middle.
fn loss_with_item(a: &[Tensor], p: &[Tensor]) -> Result<Tensor> {
    let h = a[0].matmul(&p[0])?.add(&p[1])?.tanh()?;
    let _logged = h.abs()?.max_all()?.item::<f32>()?;
    let y = h.matmul(&p[2])?;
    y.mul(&y)?.mean_all()
}

/// Two different pieces after a data-dependent branch.
fn loss_with_branch(a: &[Tensor], p: &[Tensor]) -> Result<Tensor> {
    let h = a[0].matmul(&p[0])?.add(&p[1])?;
    let y = if h.sum_all()?.gt_scalar(0.0)?.to_bool()? { h.tanh()?.mul(&h)? } else { h.exp()?.mul_scalar(0.5)? };
    y.matmul(&p[2])?.sum_all()
}

fn double_on_host() -> CustomOp {
    CustomOp::host("double_on_host", |inputs: &[HostTensor]| {
        let v: Vec<f64> = (0..inputs[0].numel()).map(|i| 2.0 * inputs[0].get_f64(i)).collect();
        Ok(vec![HostTensor::from_f64(inputs[0].dtype(), inputs[0].shape().clone(), &v).unwrap()])
    })
}

/// A host custom op on the (gradient-free) input, then parameters used on both sides of it.
fn loss_with_host_op(a: &[Tensor], p: &[Tensor]) -> Result<Tensor> {
    let pre = a[0].matmul(&p[0])?.sigmoid()?;
    let doubled = double_on_host().call(std::slice::from_ref(&a[0]))?.remove(0);
    let h = doubled.matmul(&p[0])?.add(&pre)?.add(&p[1])?;
    h.matmul(&p[2])?.tanh()?.sum_all()
}

/// Three breaks, each parameter used in several pieces.
fn loss_with_three_breaks(a: &[Tensor], p: &[Tensor]) -> Result<Tensor> {
    let mut h = a[0].clone();
    for _ in 0..3 {
        h = h.matmul(&p[0])?.add(&p[1])?.tanh()?;
        let _ = h.sum_all()?.item::<f32>()?;
    }
    h.matmul(&p[2])?.mul(&p[2].sum_all()?)?.mean_all()
}

fn setup(seed: u64) -> (Vec<Tensor>, Vec<Tensor>) {
    let x = Tensor::randn([4, 6], DType::F32, seed).unwrap();
    let params = vec![param(&[6, 6], seed + 1), param(&[6], seed + 2), param(&[6, 3], seed + 3)];
    (vec![x], params)
}

#[test]
fn backward_after_the_call_crosses_a_host_read() {
    let (args, params) = setup(10);
    assert_eq!(check_after_call(loss_with_item, &args, &params), 1);
}

#[test]
fn backward_after_the_call_crosses_a_data_dependent_branch() {
    for seed in [20, 30, 40] {
        let (args, params) = setup(seed);
        assert_eq!(check_after_call(loss_with_branch, &args, &params), 1);
    }
}

#[test]
fn backward_after_the_call_crosses_a_host_custom_op() {
    let (args, params) = setup(50);
    assert_eq!(check_after_call(loss_with_host_op, &args, &params), 1);
}

#[test]
fn backward_after_the_call_crosses_three_breaks() {
    let (args, params) = setup(60);
    assert_eq!(check_after_call(loss_with_three_breaks, &args, &params), 3);
}

#[test]
fn parameters_passed_as_arguments_get_their_gradients() {
    let (args, params) = setup(70);
    let eager = eager_grads(loss_with_item, &args, &params);
    let f = compile(|a: &[Tensor]| Ok(vec![loss_with_item(&a[..1], &a[1..])?]));
    let all: Vec<Tensor> = args.iter().chain(&params).cloned().collect();
    f.call(&all).unwrap()[0].backward().unwrap();
    for (got, want) in grads(&params).iter().zip(&eager) {
        assert_close(got, want, 1e-4, "parameters as arguments");
    }
}

#[test]
fn backward_inside_the_function_after_a_break_and_accumulation_over_calls() {
    let (args, params) = setup(80);
    let eager = eager_grads(loss_with_three_breaks, &args, &params);
    let captured = params.clone();
    let step = compile(move |a: &[Tensor]| {
        let loss = loss_with_three_breaks(a, &captured)?;
        loss.backward()?;
        Ok(vec![loss])
    });
    zero_grads(&params);
    for calls in 1..=2 {
        let explanation = step.explain(&args).unwrap();
        assert!(explanation.breaks.iter().any(|b| b.kind == braze::BreakKind::BackwardAcrossBreak));
        let doubled: Vec<Vec<f64>> = eager.iter().map(|g| g.iter().map(|v| v * calls as f64).collect()).collect();
        for (got, want) in grads(&params).iter().zip(&doubled) {
            assert_close(got, want, 1e-4, &format!("after {calls} calls"));
        }
    }
}

#[test]
fn a_whole_graph_loss_backpropagates_after_the_call() {
    let (args, params) = setup(90);
    let loss = |a: &[Tensor], p: &[Tensor]| -> Result<Tensor> {
        let h = a[0].matmul(&p[0])?.add(&p[1])?.gelu()?;
        h.matmul(&p[2])?.mul_scalar(3.0)?.mean_all()
    };
    let eager = eager_grads(loss, &args, &params);
    let captured = params.clone();
    let f = compile(move |a: &[Tensor]| Ok(vec![loss(a, &captured)?])).fullgraph(true);
    for _ in 0..2 {
        zero_grads(&params);
        f.call(&args).unwrap()[0].backward().unwrap();
        for (got, want) in grads(&params).iter().zip(&eager) {
            assert_close(got, want, 1e-4, "fullgraph, backward after the call");
        }
    }
}

#[test]
fn eager_history_before_the_call_is_followed() {
    let (args, params) = setup(100);
    let chained = |a: &[Tensor], p: &[Tensor]| -> Result<Tensor> {
        let scaled = a[0].mul(&p[1].reshape([1, 6])?)?;
        loss_with_item(&[scaled], p)
    };
    let eager = eager_grads(chained, &args, &params);
    let captured = params.clone();
    let f = compile(move |a: &[Tensor]| Ok(vec![loss_with_item(a, &captured)?]));
    zero_grads(&params);
    let scaled = args[0].mul(&params[1].reshape([1, 6]).unwrap()).unwrap();
    f.call(&[scaled]).unwrap()[0].backward().unwrap();
    for (got, want) in grads(&params).iter().zip(&eager) {
        assert_close(got, want, 1e-4, "eager op, then the compiled function");
    }
}

#[test]
fn no_grad_calls_and_integer_outputs_record_nothing() {
    let (args, params) = setup(110);
    let captured = params.clone();
    let f = compile(move |a: &[Tensor]| {
        let loss = loss_with_item(a, &captured)?;
        let index = a[0].matmul(&captured[0])?.sum(&[1], false)?.cast(DType::I32)?;
        Ok(vec![loss, index])
    });
    let out = no_grad(|| f.call(&args)).unwrap();
    let err = out[0].backward().unwrap_err();
    assert!(err.to_string().contains("does not need a gradient"), "{err}");
    let out = f.call(&args).unwrap();
    let err = out[1].backward_with(&out[1]).unwrap_err();
    assert!(err.to_string().contains("does not need a gradient"), "{err}");
    out[0].backward().unwrap();
    assert!(params.iter().all(|p| p.grad().is_some()));
}

#[test]
fn no_grad_inside_a_piece_stops_the_flow_as_eagerly() {
    let (args, params) = setup(120);
    let loss = |a: &[Tensor], p: &[Tensor]| -> Result<Tensor> {
        let frozen = no_grad(|| a[0].matmul(&p[0]))?;
        let _ = frozen.sum_all()?.item::<f32>()?;
        frozen.matmul(&p[2])?.add(&a[0].matmul(&p[0])?.add(&p[1])?.sum_all()?)?.mean_all()
    };
    let eager = eager_grads_unchecked(loss, &args, &params);
    let captured = params.clone();
    let f = compile(move |a: &[Tensor]| Ok(vec![loss(a, &captured)?]));
    zero_grads(&params);
    f.call(&args).unwrap()[0].backward().unwrap();
    for (got, want) in grads(&params).iter().zip(&eager) {
        assert_close(got, want, 1e-4, "no_grad inside");
    }
}

#[test]
fn a_gradient_through_a_host_custom_op_is_an_error_naming_it() {
    let (args, params) = setup(130);
    let line = line!() + 3;
    let through_host = |a: &[Tensor], p: &[Tensor]| -> Result<Tensor> {
        let h = a[0].matmul(&p[0])?;
        let doubled = double_on_host().call(&[h])?.remove(0);
        doubled.matmul(&p[2])?.sum_all()
    };
    let eager_err = through_host(&args, &params).unwrap().backward().unwrap_err().to_string();
    let captured = params.clone();
    let f = compile(move |a: &[Tensor]| Ok(vec![through_host(a, &captured)?]));
    let compiled_err = f.call(&args).unwrap()[0].backward().unwrap_err().to_string();
    for err in [eager_err, compiled_err] {
        assert!(err.contains("`double_on_host`"), "{err}");
        assert!(err.contains(&format!("grad_breaks.rs:{line}:")), "{err}");
    }
}
