//! Every differentiable op's gradient against central finite differences of the f64 reference:
//! `loss = sum(f(inputs) * r)` for fixed random weights `r`, its gradient built by `backward`
//! and run by the reference, each input element nudged both ways.

use braze_autodiff::{backward, AutodiffError};
use braze_cpu::eval_graph;
use braze_ir::{BinaryOp, DType, Graph, HostTensor, NodeId, Op, ReduceOp, Shape, UnaryOp};

/// Where an input's values lie: away from the kinks at 0, or positive (for log, sqrt, ...).
#[derive(Clone, Copy, PartialEq)]
enum Range {
    AwayFromZero,
    Positive,
}

/// Builds the function under test on the graph's inputs.
type Build = Box<dyn Fn(&mut Graph, &[NodeId]) -> NodeId>;

struct Case {
    name: String,
    inputs: Vec<(Shape, Range)>,
    build: Build,
}

fn case(
    name: impl Into<String>,
    inputs: &[(&[usize], Range)],
    build: impl Fn(&mut Graph, &[NodeId]) -> NodeId + 'static,
) -> Case {
    Case {
        name: name.into(),
        inputs: inputs.iter().map(|(s, r)| (Shape::new(s.to_vec()), *r)).collect(),
        build: Box::new(build),
    }
}

/// splitmix64 values in [-2, -0.15] u [0.15, 2], or (0.3, 2.3) for positive inputs.
fn values(n: usize, range: Range, seed: u64) -> Vec<f64> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xDEAD_BEEF;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            let u = ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64;
            match range {
                Range::Positive => 0.3 + 2.0 * u,
                Range::AwayFromZero => {
                    let magnitude = 0.15 + 1.85 * (2.0 * u % 1.0);
                    if u < 0.5 {
                        -magnitude
                    } else {
                        magnitude
                    }
                }
            }
        })
        .collect()
}

fn tensor(shape: &Shape, data: &[f64]) -> HostTensor {
    HostTensor::from_f64(DType::F32, shape.clone(), data).unwrap()
}

fn loss_of(graph: &Graph, inputs: &[HostTensor]) -> f64 {
    eval_graph(graph, inputs).unwrap()[0].get_f64(0)
}

/// Builds the case's loss and gradients, then compares every gradient element (at most 24 per
/// input) with central differences.
fn check(case: &Case) {
    let mut g = Graph::new();
    let ids: Vec<NodeId> = case.inputs.iter().map(|(s, _)| g.input(DType::F32, s.clone())).collect();
    let out = (case.build)(&mut g, &ids);
    let out_shape = g.node(out).shape.clone();
    let weights = g.input(DType::F32, out_shape.clone());
    let weighted = g.add(Op::Binary { op: BinaryOp::Mul }, &[out, weights], None).unwrap();
    let axes: Vec<usize> = (0..out_shape.rank()).collect();
    let loss = g.add(Op::Reduce { op: ReduceOp::Sum, axes, keepdim: false }, &[weighted], None).unwrap();
    let one = g.constant(1.0, DType::F32);
    let grads = backward(&mut g, &[(loss, one)], &ids).unwrap();
    let mut outputs = vec![loss];
    for (i, grad) in grads.iter().enumerate() {
        outputs.push(grad.unwrap_or_else(|| panic!("{}: input {i} got no gradient", case.name)));
    }
    g.set_outputs(outputs);
    g.verify().unwrap();

    let mut inputs: Vec<HostTensor> = case
        .inputs
        .iter()
        .enumerate()
        .map(|(i, (shape, range))| tensor(shape, &values(shape.numel(), *range, 7 + i as u64)))
        .collect();
    inputs.push(tensor(&out_shape, &values(out_shape.numel(), Range::AwayFromZero, 99)));
    let results = eval_graph(&g, &inputs).unwrap();
    for (i, (shape, _)) in case.inputs.iter().enumerate() {
        let analytic = &results[1 + i];
        assert_eq!(analytic.shape(), shape, "{}: gradient of input {i} has the wrong shape", case.name);
        let base = inputs[i].to_f64_vec();
        let stride = (shape.numel() / 24).max(1);
        for k in (0..shape.numel()).step_by(stride) {
            let h = 1e-2 * base[k].abs().max(0.5);
            let nudged = |delta: f64| {
                let mut data = base.clone();
                data[k] += delta;
                let mut args = inputs.clone();
                args[i] = tensor(shape, &data);
                loss_of(&g, &args)
            };
            let numeric = (nudged(h) - nudged(-h)) / (2.0 * h);
            let got = analytic.get_f64(k);
            assert!(
                (got - numeric).abs() <= 2e-3 + 2e-2 * numeric.abs(),
                "{}: d loss / d input{i}[{k}] is {got}, finite differences give {numeric}",
                case.name
            );
        }
    }
}

fn un(op: UnaryOp) -> impl Fn(&mut Graph, &[NodeId]) -> NodeId {
    move |g, x| g.add(Op::Unary { op }, &[x[0]], None).unwrap()
}

fn op(o: Op) -> impl Fn(&mut Graph, &[NodeId]) -> NodeId {
    move |g, x| g.add(o.clone(), x, None).unwrap()
}

const A: Range = Range::AwayFromZero;
const P: Range = Range::Positive;

#[test]
fn unary_ops() {
    let positive = [UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Rsqrt, UnaryOp::Log1p];
    for &u in UnaryOp::ALL {
        if u.def().yields != braze_ir::elementwise::Yields::Same {
            continue;
        }
        let range = if positive.contains(&u) { P } else { A };
        check(&case(u.name(), &[(&[3, 4], range)], un(u)));
    }
}

#[test]
fn binary_ops_with_broadcasting() {
    for &b in BinaryOp::ALL {
        // Predicates and integer-only ops (philox) take no float operands.
        if b.def().yields != braze_ir::elementwise::Yields::Same || !b.def().accepts.allows(DType::F32) {
            continue;
        }
        let range = if b == BinaryOp::Pow { P } else { A };
        check(&case(b.name(), &[(&[3, 1], range), (&[1, 4], A)], op(Op::Binary { op: b })));
        check(&case(format!("{} with a scalar", b.name()), &[(&[2, 3], range), (&[], A)], op(Op::Binary { op: b })));
    }
}

#[test]
fn where_routes_the_gradient_to_the_chosen_side() {
    // The condition gives no gradient; each side gets it where it was chosen.
    check(&case("where", &[(&[3, 4], A), (&[4], A)], |g, x| {
        let zero = g.constant(0.0, DType::F32);
        let cond = g.add(Op::Binary { op: BinaryOp::Gt }, &[x[0], zero], None).unwrap();
        g.add(Op::Where, &[cond, x[0], x[1]], None).unwrap()
    }));
}

#[test]
fn reductions_with_and_without_keepdim() {
    for reduce in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        for (axes, keepdim) in [(vec![1], true), (vec![1], false), (vec![0, 2], false), (vec![0, 1, 2], false)] {
            let name = format!("{} over {axes:?} keepdim={keepdim}", reduce.name());
            check(&case(name, &[(&[2, 3, 4], A)], op(Op::Reduce { op: reduce, axes, keepdim })));
        }
    }
}

#[test]
fn views() {
    check(&case("reshape", &[(&[2, 6], A)], |g, x| g.reshape(x[0], [3, 4]).unwrap()));
    check(&case("broadcast_to", &[(&[1, 4], A)], |g, x| g.broadcast_to(x[0], [2, 3, 4]).unwrap()));
    check(&case("permute", &[(&[2, 3, 4], A)], op(Op::Permute { perm: vec![2, 0, 1] })));
    for (start, end, step) in [(0, 5, 1), (1, 4, 1), (1, 6, 2), (0, 6, 3), (5, 6, 1)] {
        let name = format!("slice {start}:{end}:{step}");
        check(&case(name, &[(&[3, 6], A)], op(Op::Slice { axis: 1, start, end, step })));
    }
    check(&case("concat", &[(&[2, 3], A), (&[2, 1], A), (&[2, 2], A)], op(Op::Concat { axis: 1 })));
    check(&case("stack", &[(&[2, 3], A), (&[2, 3], A)], op(Op::Stack { axis: 1 })));
    check(&case("cast to itself", &[(&[5], A)], |g, x| g.cast(x[0], DType::F32).unwrap()));
}

/// Half of the gap between neighbouring values relative to the value, at worst: what one
/// rounding to `dtype` may cost.
fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-24),
    }
}

/// A cast's gradient is the incoming gradient cast back to the operand's dtype, across dtypes:
/// `loss = sum(y * y * r)` for `y` the input (of dtype `chain[0]`) cast through the rest of
/// `chain` (ending at f32), so `d loss / d x = 2 x r`, rounded back through each cast.
///
/// Finite differences stay honest although a cast down to bf16 or f16 is a step function: the
/// input values and the nudge are multiples of 1/8 in [-2.125, 2.125] (at most 5 significant
/// bits, exact in every float dtype), so each cast of `x + h` is `x + h` itself, and the central
/// difference of the square is exact. What is left: the f32 loss's rounding, and the analytic
/// gradient's rounding on its way back (one rounding per cast, each at most the unit roundoff of
/// its narrower dtype). A rule that dropped the cast back would give the gradient the wrong dtype;
/// one that dropped or scaled the gradient would miss `2 x r` by far more than that.
fn check_cast_chain(chain: &[DType]) {
    let name = format!("cast {chain:?}");
    assert_eq!(chain.last(), Some(&DType::F32), "{name}: the chain ends at f32 (the weights' dtype)");
    let shape = Shape::new(vec![3, 4]);
    let mut g = Graph::new();
    let x = g.input(chain[0], shape.clone());
    let mut y = x;
    for &to in &chain[1..] {
        y = g.cast(y, to).unwrap();
    }
    let square = g.add(Op::Binary { op: BinaryOp::Mul }, &[y, y], None).unwrap();
    let weights = g.input(DType::F32, shape.clone());
    let weighted = g.add(Op::Binary { op: BinaryOp::Mul }, &[square, weights], None).unwrap();
    let loss = g.add(Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1], keepdim: false }, &[weighted], None).unwrap();
    let one = g.constant(1.0, DType::F32);
    let grad = backward(&mut g, &[(loss, one)], &[x]).unwrap()[0]
        .unwrap_or_else(|| panic!("{name}: the input got no gradient"));
    assert_eq!(g.node(grad).dtype, chain[0], "{name}: the gradient has the input's dtype");
    g.set_outputs(vec![loss, grad]);
    g.verify().unwrap();

    let grid: Vec<f64> = values(shape.numel(), A, 5).iter().map(|v| (v * 8.0).round() / 8.0).collect();
    let r = values(shape.numel(), A, 6);
    let on_grid = |data: &[f64]| HostTensor::from_f64(chain[0], shape.clone(), data).unwrap();
    let inputs = vec![on_grid(&grid), tensor(&shape, &r)];
    let results = eval_graph(&g, &inputs).unwrap();
    let analytic = &results[1];
    assert_eq!(analytic.dtype(), chain[0], "{name}: the gradient's values have the input's dtype");
    let rounding: f64 = chain.iter().map(|&d| unit_roundoff(d)).sum();
    let h = 0.125;
    for k in 0..shape.numel() {
        let nudged = |delta: f64| {
            let mut data = grid.clone();
            data[k] += delta;
            let args = vec![on_grid(&data), inputs[1].clone()];
            assert_eq!(args[0].get_f64(k), data[k], "{name}: the nudged input is exact");
            loss_of(&g, &args)
        };
        let numeric = (nudged(h) - nudged(-h)) / (2.0 * h);
        let got = analytic.get_f64(k);
        // The closed form, where the finite differences should be.
        let exact = 2.0 * grid[k] * r[k] as f32 as f64;
        assert!((numeric - exact).abs() <= 1e-4, "{name}: finite differences give {numeric} for {exact} at {k}");
        assert!(
            (got - numeric).abs() <= 1e-4 + rounding * numeric.abs(),
            "{name}: d loss / d x[{k}] is {got}, finite differences give {numeric}"
        );
    }
}

#[test]
fn cast_across_float_dtypes() {
    for chain in [
        // A half-precision value read into f32 (autocast's upcast): its gradient rounds to it.
        [DType::BF16, DType::F32].as_slice(),
        &[DType::F16, DType::F32],
        // Down and back up: the identity on values that survive the rounding.
        &[DType::F32, DType::BF16, DType::F32],
        &[DType::F32, DType::F16, DType::F32],
        // Between the two half precisions.
        &[DType::BF16, DType::F16, DType::F32],
        &[DType::F32, DType::F16, DType::BF16, DType::F32],
    ] {
        check_cast_chain(chain);
    }
}

#[test]
fn matmul_with_broadcast_batch_dims() {
    check(&case("matmul", &[(&[3, 4], A), (&[4, 5], A)], op(Op::MatMul)));
    check(&case("batched matmul", &[(&[2, 3, 4], A), (&[4, 2], A)], op(Op::MatMul)));
    check(&case("broadcast batches", &[(&[1, 3, 4], A), (&[2, 4, 5], A)], op(Op::MatMul)));
    check(&case("shared matrix with unit batch dims", &[(&[2, 2, 3, 4], A), (&[1, 4, 2], A)], op(Op::MatMul)));
}

/// The gradient of a matrix that every batch multiplies (a linear layer's weight) is one matmul
/// contracting over batches and rows at once, not a product per batch summed afterwards.
#[test]
fn shared_matrix_gradient_is_one_matmul_over_all_rows() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [4, 6, 3]);
    let w = g.input(DType::F32, [3, 5]);
    let y = g.add(Op::MatMul, &[x, w], None).unwrap();
    let loss = g.add(Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1, 2], keepdim: false }, &[y], None).unwrap();
    let seed = g.constant(1.0, DType::F32);
    let grads = backward(&mut g, &[(loss, seed)], &[w]).unwrap();
    let gw = grads[0].unwrap();
    assert_eq!(g.node(gw).shape.dims(), &[3, 5]);
    // Behind views: the matmul of x^T [3, 24] and the output gradient [24, 5].
    let mut product = gw;
    while matches!(g.node(product).op, Op::Reshape | Op::Permute { .. }) {
        product = g.node(product).operands[0];
    }
    assert_eq!(g.node(product).op, Op::MatMul, "{}", g.to_text());
    let a = g.node(product).operands[0];
    assert_eq!(g.node(a).shape.dims(), &[3, 24], "{}", g.to_text());
}

#[test]
fn norms_and_softmax() {
    check(&case("layer_norm", &[(&[3, 8], A), (&[8], A), (&[8], A)], op(Op::LayerNorm { eps: 1e-5 })));
    check(&case("rms_norm", &[(&[2, 3, 5], A), (&[5], A)], op(Op::RmsNorm { eps: 1e-6 })));
    check(&case("softmax last", &[(&[3, 5], A)], op(Op::Softmax { axis: 1 })));
    check(&case("softmax first", &[(&[3, 5], A)], op(Op::Softmax { axis: 0 })));
    check(&case("log_softmax last", &[(&[3, 5], A)], op(Op::LogSoftmax { axis: 1 })));
    check(&case("log_softmax first", &[(&[4, 3], A)], op(Op::LogSoftmax { axis: 0 })));
}

/// A rank-1 i64 tensor of `values` built from constants (the case's inputs are f32).
fn indices(g: &mut Graph, values: &[i64]) -> NodeId {
    let scalars: Vec<NodeId> = values.iter().map(|&v| g.constant(v as f64, DType::I64)).collect();
    g.add(Op::Stack { axis: 0 }, &scalars, None).unwrap()
}

#[test]
fn cross_entropy_with_ignored_rows() {
    // Row 1 is ignored: its logits get no gradient, and it is not counted in the mean.
    check(&case("cross_entropy", &[(&[4, 5], A)], |g, x| {
        let targets = indices(g, &[1, -100, 4, 0]);
        let classes = indices(g, &[0, 1, 2, 3, 4]);
        op(Op::CrossEntropy { ignore_index: -100 })(g, &[x[0], targets, classes])
    }));
}

#[test]
fn attention_causal_and_not() {
    for causal in [false, true] {
        for (shape, scale) in [([1, 1, 1, 3], 0.5), ([2, 1, 5, 3], 0.7), ([1, 2, 17, 4], 0.5), ([1, 1, 6, 1], 1.3)] {
            let name = format!("attention {shape:?} causal={causal}");
            let attention = Op::Attention { causal, scale };
            check(&case(name, &[(&shape, A), (&shape, A), (&shape, A)], op(attention)));
        }
    }
}

#[test]
fn attention_with_a_shared_operand() {
    // Self-attention of one tensor: its gradient sums the query, key and value paths.
    check(&case("attention(x, x, x)", &[(&[1, 2, 7, 3], A)], |g, x| {
        g.add(Op::Attention { causal: true, scale: 0.6 }, &[x[0], x[0], x[0]], None).unwrap()
    }));
}

#[test]
fn size_one_dims_and_reuse() {
    // x used three times: its gradient is the sum of all three paths.
    check(&case("x * x + exp(x)", &[(&[1, 3, 1], A)], |g, x| {
        let sq = g.add(Op::Binary { op: BinaryOp::Mul }, &[x[0], x[0]], None).unwrap();
        let e = g.add(Op::Unary { op: UnaryOp::Exp }, &[x[0]], None).unwrap();
        g.add(Op::Binary { op: BinaryOp::Add }, &[sq, e], None).unwrap()
    }));
}

#[test]
fn zero_size_inputs_get_empty_gradients() {
    check(&case("sum of an empty tensor", &[(&[0, 3], A), (&[3], A)], |g, x| {
        let s = g.add(Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdim: false }, &[x[0]], None).unwrap();
        g.add(Op::Binary { op: BinaryOp::Mul }, &[s, x[1]], None).unwrap()
    }));
}

#[test]
fn integer_inputs_have_no_gradient() {
    let mut g = Graph::new();
    let x = g.input(DType::I32, [3]);
    let s = g.add(Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdim: false }, &[x], None).unwrap();
    let f = g.cast(s, DType::F32).unwrap();
    let one = g.constant(1.0, DType::F32);
    let err = backward(&mut g, &[(f, one)], &[x]).unwrap_err();
    assert!(matches!(err, AutodiffError::NotFloat { .. }), "{err}");
    assert!(err.to_string().contains("i32"), "{err}");
}

#[test]
fn unconnected_inputs_get_none_and_steps_get_zeros() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [3]);
    let unused = g.input(DType::F32, [3]);
    let floor = g.add(Op::Unary { op: UnaryOp::Floor }, &[x], None).unwrap();
    let s = g.add(Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdim: false }, &[floor], None).unwrap();
    let one = g.constant(1.0, DType::F32);
    let grads = backward(&mut g, &[(s, one)], &[x, unused]).unwrap();
    assert!(grads[1].is_none());
    g.set_outputs(vec![grads[0].unwrap()]);
    let x_values = HostTensor::from_f64(DType::F32, [3], &[0.5, -1.5, 2.0]).unwrap();
    let out = eval_graph(&g, &[x_values.clone(), x_values]).unwrap();
    assert_eq!(out[0].to_f64_vec(), vec![0.0; 3]);
}

#[test]
fn a_wrong_gradient_is_caught() {
    // The checker itself: an "op" whose gradient graph is wrong on purpose must fail.
    let result = std::panic::catch_unwind(|| {
        let mut g = Graph::new();
        let x = g.input(DType::F32, [4]);
        let y = g.add(Op::Unary { op: UnaryOp::Sin }, &[x], None).unwrap();
        let s = g.add(Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdim: false }, &[y], None).unwrap();
        let one = g.constant(1.0, DType::F32);
        let grad = backward(&mut g, &[(s, one)], &[x]).unwrap()[0].unwrap();
        // Claim the gradient is sin(x) instead of cos(x).
        let wrong = g.add(Op::Unary { op: UnaryOp::Sin }, &[x], None).unwrap();
        let _ = grad;
        g.set_outputs(vec![s, wrong]);
        let x_values = HostTensor::from_f64(DType::F32, [4], &[0.3, 0.9, -1.1, 1.7]).unwrap();
        let out = eval_graph(&g, std::slice::from_ref(&x_values)).unwrap();
        for k in 0..4 {
            let h = 1e-3;
            let base = x_values.to_f64_vec();
            let at = |d: f64| {
                let mut v = base.clone();
                v[k] += d;
                eval_graph(&g, &[HostTensor::from_f64(DType::F32, [4], &v).unwrap()]).unwrap()[0].get_f64(0)
            };
            let numeric = (at(h) - at(-h)) / (2.0 * h);
            assert!((out[1].get_f64(k) - numeric).abs() < 1e-2);
        }
    });
    assert!(result.is_err());
}

/// `x^0` has gradient 0 for every base, as PyTorch's (`0 * x^-1` would be NaN at 0, at NaN and,
/// with an infinite incoming gradient, everywhere), also with the exponent broadcast; the
/// exponent's gradient is `g * where(x == 0, 0, ln x)`, summed over `x`.
#[test]
fn pow_with_a_zero_exponent_has_zero_base_gradient() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [5]);
    let e = g.input(DType::F32, []);
    let upstream = g.input(DType::F32, [5]);
    let y = g.add(Op::Binary { op: BinaryOp::Pow }, &[x, e], None).unwrap();
    let weighted = g.add(Op::Binary { op: BinaryOp::Mul }, &[y, upstream], None).unwrap();
    let loss = g.add(Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdim: false }, &[weighted], None).unwrap();
    let one = g.constant(1.0, DType::F32);
    let grads = backward(&mut g, &[(loss, one)], &[x, e]).unwrap();
    g.set_outputs(grads.into_iter().map(Option::unwrap).collect());
    let inputs = [
        tensor(&Shape::new(vec![5]), &[0.0, -0.0, 2.0, f64::NAN, 4.0]),
        tensor(&Shape::new(vec![]), &[0.0]),
        tensor(&Shape::new(vec![5]), &[3.0, 1.0, -1.5, 0.0, f64::INFINITY]),
    ];
    let out = eval_graph(&g, &inputs).unwrap();
    assert_eq!(out[0].to_f64_vec(), [0.0; 5]);
    // 3 * 0 + 1 * 0 - 1.5 ln 2 + 0 * ln(NaN) + inf ln 4: NaN from the NaN base.
    assert!(out[1].get_f64(0).is_nan(), "{:?}", out[1].to_f64_vec());
    let finite = [
        tensor(&Shape::new(vec![5]), &[0.0, -0.0, 2.0, 0.5, 4.0]),
        inputs[1].clone(),
        tensor(&Shape::new(vec![5]), &[3.0, 1.0, -1.5, 0.0, 2.0]),
    ];
    let out = eval_graph(&g, &finite).unwrap();
    assert_eq!(out[0].to_f64_vec(), [0.0; 5]);
    let want = (-1.5 * 2f32.ln() + 2.0 * 4f32.ln()) as f64;
    assert!((out[1].get_f64(0) - want).abs() < 1e-6, "{} vs {want}", out[1].get_f64(0));
}

#[test]
fn index_select_with_repeated_size_one_and_empty_indices() {
    // Repeated indices sum their rows' gradients; unselected rows get zeros.
    for (axis, shape, picked) in [
        (0, vec![5, 3], vec![2, 0, 2, 2, 4]),
        (1, vec![2, 4, 3], vec![3, 3, 0]),
        (2, vec![2, 3, 4], vec![1]),
        (0, vec![1, 3], vec![0, 0]),
        (0, vec![4, 2], vec![]),
    ] {
        let name = format!("index_select axis {axis} of {shape:?} at {picked:?}");
        check(&case(name, &[(&shape, A)], move |g, x| {
            let at = if picked.is_empty() {
                // An empty i64 vector: a slice of nothing.
                let one = indices(g, &[0]);
                g.add(Op::Slice { axis: 0, start: 0, end: 0, step: 1 }, &[one], None).unwrap()
            } else {
                indices(g, &picked)
            };
            op(Op::IndexSelect { axis })(g, &[x[0], at])
        }));
    }
}

#[test]
fn embedding_with_two_dimensional_indices() {
    check(&case("embedding [2, 3] of [6, 4]", &[(&[6, 4], A)], |g, x| {
        let flat = indices(g, &[5, 1, 1, 0, 5, 5]);
        let at = g.reshape(flat, braze_ir::Shape::new(vec![2, 3])).unwrap();
        op(Op::IndexSelect { axis: 0 })(g, &[x[0], at])
    }));
}

#[test]
fn index_add_gradient_is_an_index_select() {
    check(&case("index_add", &[(&[4, 3], A)], |g, x| {
        let at = indices(g, &[2, 0, 2, 1]);
        op(Op::IndexAdd { axis: 0, size: 5 })(g, &[x[0], at])
    }));
}

/// `x` split along its last axis into `pieces` (start, end) and combined as `a * b + c + ...`.
fn split_and_combine(pieces: &'static [(usize, usize)]) -> impl Fn(&mut Graph, &[NodeId]) -> NodeId {
    move |g: &mut Graph, x: &[NodeId]| {
        let parts: Vec<NodeId> = pieces
            .iter()
            .map(|&(start, end)| g.add(Op::Slice { axis: 1, start, end, step: 1 }, &[x[0]], None).unwrap())
            .collect();
        let mut total = g.add(Op::Binary { op: BinaryOp::Mul }, &[parts[0], parts[1]], None).unwrap();
        for &p in &parts[2..] {
            total = g.add(Op::Binary { op: BinaryOp::Add }, &[total, p], None).unwrap();
        }
        total
    }
}

/// Slices of one tensor (a fused qkv projection split three ways): disjoint ones covering it,
/// disjoint ones with gaps, and overlapping ones; the gradient of disjoint slices is one concat
/// of theirs (zeros in the gaps), not a sum of zero-padded copies.
#[test]
fn gradients_of_slices_of_one_tensor() {
    check(&case("three disjoint slices", &[(&[2, 9], A)], split_and_combine(&[(0, 3), (3, 6), (6, 9)])));
    check(&case("slices with gaps", &[(&[2, 11], A)], split_and_combine(&[(1, 3), (5, 7), (9, 11)])));
    check(&case("overlapping slices", &[(&[2, 9], A)], split_and_combine(&[(0, 4), (3, 7), (5, 9)])));

    let mut g = Graph::new();
    let x = g.input(DType::F32, [2, 9]);
    let y = split_and_combine(&[(0, 3), (3, 6), (6, 9)])(&mut g, &[x]);
    let loss = g.add(Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1], keepdim: false }, &[y], None).unwrap();
    let seed = g.constant(1.0, DType::F32);
    let gx = backward(&mut g, &[(loss, seed)], &[x]).unwrap()[0].unwrap();
    assert_eq!(g.node(gx).op, Op::Concat { axis: 1 }, "{}", g.to_text());
    assert_eq!(g.node(gx).operands.len(), 3, "{}", g.to_text());
    let adds_of_full_width = g
        .node_ids()
        .into_iter()
        .filter(|&id| g.node(id).op == Op::Binary { op: BinaryOp::Add } && g.node(id).shape.dims() == [2, 9])
        .count();
    assert_eq!(adds_of_full_width, 0, "{}", g.to_text());
}
