//! Plans built by hand for each kernel family, run by `eval_plan` and compared with `eval_graph`
//! on the equivalent graph: this checks the plan's strides, per-row values, stores and f32
//! reductions against the reference semantics.

mod common;

use braze_cpu::{assert_close, eval_graph, eval_plan, inject_specials, random_tensor};
use braze_ir::{BinaryOp, DType, Graph, HostTensor, Literal, NodeId, Op, ReduceOp, Shape, UnaryOp};
use braze_plan::{
    Body, Buffer, BufferId, BufferRole, Concat, ElementStore, Expr, ItemReduction, Kernel, KernelKind, MatMul,
    MultiReduce, Plan, PlanOutput, Pointwise, ReduceItem, RowKernel, Store, ValueId,
};

/// Runs `plan` and `graph` on `inputs` and requires every output to agree within the dtype's
/// tolerance.
fn check(plan: &Plan, graph: &Graph, inputs: &[HostTensor]) {
    let from_plan = eval_plan(plan, inputs).expect("plan runs");
    let from_graph = eval_graph(graph, inputs).expect("graph runs");
    assert_eq!(from_plan.len(), from_graph.len());
    for (j, (actual, expected)) in from_plan.iter().zip(&from_graph).enumerate() {
        if let Err(e) = assert_close(actual, expected) {
            panic!("output {j}: {e}");
        }
    }
}

fn buffer(dtype: DType, numel: usize, role: BufferRole) -> Buffer {
    Buffer { dtype, numel, role }
}

fn kernel(name: &str, kind: KernelKind, inputs: &[usize], outputs: &[usize]) -> Kernel {
    Kernel {
        name: name.into(),
        kind,
        inputs: inputs.iter().map(|&b| BufferId(b)).collect(),
        outputs: outputs.iter().map(|&b| BufferId(b)).collect(),
        sources: vec![],
    }
}

fn output(buffer: usize, shape: &[usize]) -> PlanOutput {
    PlanOutput { buffer: BufferId(buffer), shape: Shape::new(shape.to_vec()) }
}

/// A graph with inputs of the given types whose outputs `build` returns.
fn graph(inputs: &[(DType, &[usize])], build: impl FnOnce(&mut Graph, &[NodeId]) -> Vec<NodeId>) -> Graph {
    let mut g = Graph::new();
    let ids: Vec<NodeId> = inputs.iter().map(|(d, s)| g.input(*d, s.to_vec())).collect();
    let outs = build(&mut g, &ids);
    g.set_outputs(outs);
    g
}

fn load(body: &mut Body, input: usize, offset: usize, strides: &[usize], dtype: DType) -> ValueId {
    body.push(Expr::Load { input, offset, strides: strides.to_vec() }, dtype)
}

fn bin(body: &mut Body, op: BinaryOp, a: ValueId, b: ValueId, dtype: DType) -> ValueId {
    body.push(Expr::Binary { op, a, b }, dtype)
}

#[test]
fn pointwise_with_broadcast_and_permuted_loads() {
    // relu(x + bias) + y^T over [4,3]: x [4,3], bias [3] broadcast, y [3,4] read transposed.
    let f = DType::F32;
    let mut body = Body::default();
    let x = load(&mut body, 0, 0, &[3, 1], f);
    let bias = load(&mut body, 1, 0, &[0, 1], f);
    let y = load(&mut body, 2, 0, &[1, 4], f);
    let sum = bin(&mut body, BinaryOp::Add, x, bias, f);
    let relu = body.push(Expr::Unary { op: UnaryOp::Relu, x: sum }, f);
    let out = bin(&mut body, BinaryOp::Add, relu, y, f);
    body.stores.push(Store { value: out, output: 0 });
    let plan = Plan {
        checks: Vec::new(),
        buffers: vec![
            buffer(f, 12, BufferRole::Input(0)),
            buffer(f, 3, BufferRole::Input(1)),
            buffer(f, 12, BufferRole::Input(2)),
            buffer(f, 12, BufferRole::Output),
        ],
        inputs: vec![BufferId(0), BufferId(1), BufferId(2)],
        outputs: vec![output(3, &[4, 3])],
        kernels: vec![kernel(
            "pointwise_add_relu_add",
            KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![4, 3]), body }),
            &[0, 1, 2],
            &[3],
        )],
    };
    let g = graph(&[(f, &[4, 3]), (f, &[3]), (f, &[3, 4])], |g, i| {
        let s = g.add(Op::Binary { op: BinaryOp::Add }, &[i[0], i[1]], None).unwrap();
        let r = g.add(Op::Unary { op: UnaryOp::Relu }, &[s], None).unwrap();
        let t = g.add(Op::Permute { perm: vec![1, 0] }, &[i[2]], None).unwrap();
        vec![g.add(Op::Binary { op: BinaryOp::Add }, &[r, t], None).unwrap()]
    });
    let mut x = random_tensor(f, [4, 3], 1);
    inject_specials(&mut x, 9);
    check(&plan, &g, &[x, random_tensor(f, [3], 2), random_tensor(f, [3, 4], 3)]);
}

#[test]
fn pointwise_slice_offset_and_mixed_dtypes() {
    // cast(x[1:5:2, :], bf16) * 2 where x is f32 [6,2]: rows 1 and 3, via offset 2 and stride 4.
    let mut body = Body::default();
    let x = load(&mut body, 0, 2, &[4, 1], DType::F32);
    let narrowed = body.push(Expr::Cast { x }, DType::BF16);
    let two = body.push(Expr::Const { value: Literal::Float(2.0) }, DType::BF16);
    let out = bin(&mut body, BinaryOp::Mul, narrowed, two, DType::BF16);
    let positive = body.push(Expr::Const { value: Literal::Float(0.0) }, DType::BF16);
    let flag = bin(&mut body, BinaryOp::Gt, out, positive, DType::Bool);
    body.stores.push(Store { value: out, output: 0 });
    body.stores.push(Store { value: flag, output: 1 });
    let plan = Plan {
        checks: Vec::new(),
        buffers: vec![
            buffer(DType::F32, 12, BufferRole::Input(0)),
            buffer(DType::BF16, 4, BufferRole::Output),
            buffer(DType::Bool, 4, BufferRole::Output),
        ],
        inputs: vec![BufferId(0)],
        outputs: vec![output(1, &[2, 2]), output(2, &[2, 2])],
        kernels: vec![kernel(
            "pointwise_slice_cast_mul_gt",
            KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![2, 2]), body }),
            &[0],
            &[1, 2],
        )],
    };
    let g = graph(&[(DType::F32, &[6, 2])], |g, i| {
        let s = g.add(Op::Slice { axis: 0, start: 1, end: 5, step: 2 }, &[i[0]], None).unwrap();
        let c = g.cast(s, DType::BF16).unwrap();
        let two = g.constant(2.0, DType::BF16);
        let m = g.add(Op::Binary { op: BinaryOp::Mul }, &[c, two], None).unwrap();
        let zero = g.constant(0.0, DType::BF16);
        vec![m, g.add(Op::Binary { op: BinaryOp::Gt }, &[m, zero], None).unwrap()]
    });
    check(&plan, &g, &[random_tensor(DType::F32, [6, 2], 4)]);
}

/// A row kernel computing layer norm over rows of `cols` for `dtype`; output 0 is the
/// normalized tensor, output 1 the per-row mean.
fn layer_norm_row_kernel(dtype: DType, outer: &[usize], cols: usize, eps: f64) -> RowKernel {
    let f = DType::F32;
    let mut body = Body::default();
    let mut row_strides: Vec<usize> = Vec::new();
    let mut stride = cols;
    for &d in outer.iter().rev() {
        row_strides.insert(0, stride);
        stride *= d;
    }
    let element_strides: Vec<usize> = row_strides.iter().copied().chain([1]).collect();
    let affine_strides: Vec<usize> = outer.iter().map(|_| 0).chain([1]).collect();
    let loaded = load(&mut body, 0, 0, &element_strides, dtype);
    let x = body.push(Expr::Cast { x: loaded }, f);
    let sum = body.push(Expr::Reduce { op: ReduceOp::Sum, x }, f);
    let inv_n = body.push(Expr::Const { value: Literal::Float(1.0 / cols as f64) }, f);
    let mean = bin(&mut body, BinaryOp::Mul, sum, inv_n, f);
    let centered = bin(&mut body, BinaryOp::Sub, x, mean, f);
    let squared = bin(&mut body, BinaryOp::Mul, centered, centered, f);
    let sum_sq = body.push(Expr::Reduce { op: ReduceOp::Sum, x: squared }, f);
    let var = bin(&mut body, BinaryOp::Mul, sum_sq, inv_n, f);
    let eps = body.push(Expr::Const { value: Literal::Float(eps) }, f);
    let var_eps = bin(&mut body, BinaryOp::Add, var, eps, f);
    let rstd = body.push(Expr::Unary { op: UnaryOp::Rsqrt, x: var_eps }, f);
    let normalized = bin(&mut body, BinaryOp::Mul, centered, rstd, f);
    let w = load(&mut body, 1, 0, &affine_strides, dtype);
    let w = body.push(Expr::Cast { x: w }, f);
    let b = load(&mut body, 2, 0, &affine_strides, dtype);
    let b = body.push(Expr::Cast { x: b }, f);
    let scaled = bin(&mut body, BinaryOp::Mul, normalized, w, f);
    let shifted = bin(&mut body, BinaryOp::Add, scaled, b, f);
    let y = body.push(Expr::Cast { x: shifted }, dtype);
    let mean_out = body.push(Expr::Cast { x: mean }, dtype);
    body.stores.push(Store { value: y, output: 0 });
    body.stores.push(Store { value: mean_out, output: 1 });
    RowKernel::new(outer.to_vec(), vec![cols], body)
}

fn layer_norm_plan(dtype: DType, outer: &[usize], cols: usize) -> Plan {
    let rows: usize = outer.iter().product();
    let shape: Vec<usize> = outer.iter().copied().chain([cols]).collect();
    Plan {
        checks: Vec::new(),
        buffers: vec![
            buffer(dtype, rows * cols, BufferRole::Input(0)),
            buffer(dtype, cols, BufferRole::Input(1)),
            buffer(dtype, cols, BufferRole::Input(2)),
            buffer(dtype, rows * cols, BufferRole::Output),
            buffer(dtype, rows, BufferRole::Output),
        ],
        inputs: vec![BufferId(0), BufferId(1), BufferId(2)],
        outputs: vec![output(3, &shape), output(4, outer)],
        kernels: vec![kernel(
            "row_layer_norm",
            KernelKind::Row(layer_norm_row_kernel(dtype, outer, cols, 1e-5)),
            &[0, 1, 2],
            &[3, 4],
        )],
    }
}

fn layer_norm_graph(dtype: DType, outer: &[usize], cols: usize) -> Graph {
    let shape: Vec<usize> = outer.iter().copied().chain([cols]).collect();
    graph(&[(dtype, &shape), (dtype, &[cols]), (dtype, &[cols])], |g, i| {
        let ln = g.add(Op::LayerNorm { eps: 1e-5 }, i, None).unwrap();
        let mean = g.add(Op::Reduce { op: ReduceOp::Mean, axes: vec![outer.len()], keepdim: false }, &[i[0]], None);
        vec![ln, mean.unwrap()]
    })
}

#[test]
fn row_kernel_layer_norm_matches_the_graph() {
    for (dtype, outer, cols) in [(DType::F32, &[6][..], 32), (DType::F32, &[2, 3], 7), (DType::BF16, &[5], 64)] {
        let shape: Vec<usize> = outer.iter().copied().chain([cols]).collect();
        let inputs =
            [random_tensor(dtype, shape, 10), random_tensor(dtype, [cols], 11), random_tensor(dtype, [cols], 12)];
        check(&layer_norm_plan(dtype, outer, cols), &layer_norm_graph(dtype, outer, cols), &inputs);
    }
}

#[test]
fn row_kernel_over_a_middle_axis_writes_the_domain_order() {
    // softmax over axis 1 of x [2,3,4]: domain outer [2,4] (a, c), inner [3] (b), so the load
    // strides are [12, 1, 4] and the output is laid out as [2,4,3] = permute(softmax, [0,2,1]).
    let f = DType::F32;
    let mut body = Body::default();
    let x = load(&mut body, 0, 0, &[12, 1, 4], f);
    let max = body.push(Expr::Reduce { op: ReduceOp::Max, x }, f);
    let shifted = bin(&mut body, BinaryOp::Sub, x, max, f);
    let e = body.push(Expr::Unary { op: UnaryOp::Exp, x: shifted }, f);
    let sum = body.push(Expr::Reduce { op: ReduceOp::Sum, x: e }, f);
    let y = bin(&mut body, BinaryOp::Div, e, sum, f);
    body.stores.push(Store { value: y, output: 0 });
    let plan = Plan {
        checks: Vec::new(),
        buffers: vec![buffer(f, 24, BufferRole::Input(0)), buffer(f, 24, BufferRole::Output)],
        inputs: vec![BufferId(0)],
        outputs: vec![output(1, &[2, 4, 3])],
        kernels: vec![kernel("row_softmax", KernelKind::Row(RowKernel::new(vec![2, 4], vec![3], body)), &[0], &[1])],
    };
    let g = graph(&[(f, &[2, 3, 4])], |g, i| {
        let s = g.add(Op::Softmax { axis: 1 }, &[i[0]], None).unwrap();
        vec![g.add(Op::Permute { perm: vec![0, 2, 1] }, &[s], None).unwrap()]
    });
    let mut x = random_tensor(f, [2, 3, 4], 5);
    inject_specials(&mut x, 6);
    check(&plan, &g, &[x]);
}

#[test]
fn row_kernel_with_empty_rows_stores_identities() {
    // max over the last axis of [3, 0]: every row is empty, so the per-row result is -inf.
    let f = DType::F32;
    let mut body = Body::default();
    let x = load(&mut body, 0, 0, &[0, 1], f);
    let max = body.push(Expr::Reduce { op: ReduceOp::Max, x }, f);
    body.stores.push(Store { value: max, output: 0 });
    let plan = Plan {
        checks: Vec::new(),
        buffers: vec![buffer(f, 0, BufferRole::Input(0)), buffer(f, 3, BufferRole::Output)],
        inputs: vec![BufferId(0)],
        outputs: vec![output(1, &[3])],
        kernels: vec![kernel("row_max", KernelKind::Row(RowKernel::new(vec![3], vec![0], body)), &[0], &[1])],
    };
    let g = graph(&[(f, &[3, 0])], |g, i| {
        vec![g.add(Op::Reduce { op: ReduceOp::Max, axes: vec![1], keepdim: false }, &[i[0]], None).unwrap()]
    });
    check(&plan, &g, &[HostTensor::full(f, [3, 0], 0.0)]);
}

#[test]
fn multi_reduce_sums_squares_of_each_item() {
    let f = DType::F32;
    let mut prologue = Body::default();
    let x = load(&mut prologue, 0, 0, &[1], f);
    let _square = bin(&mut prologue, BinaryOp::Mul, x, x, f);
    let items = vec![5, 7, 0];
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
        let plan = Plan {
            checks: Vec::new(),
            buffers: vec![
                buffer(f, 5, BufferRole::Input(0)),
                buffer(f, 7, BufferRole::Input(1)),
                buffer(f, 0, BufferRole::Input(2)),
                buffer(f, 3, BufferRole::Output),
            ],
            inputs: vec![BufferId(0), BufferId(1), BufferId(2)],
            outputs: vec![output(3, &[3])],
            kernels: vec![kernel(
                "multi_reduce_square",
                KernelKind::MultiReduce(stacked(op, f, &prologue, &items)),
                &[0, 1, 2],
                &[3],
            )],
        };
        let g = graph(&[(f, &[5]), (f, &[7]), (f, &[0])], |g, i| {
            let reduced: Vec<NodeId> = i
                .iter()
                .map(|&x| {
                    let sq = g.add(Op::Binary { op: BinaryOp::Mul }, &[x, x], None).unwrap();
                    g.add(Op::Reduce { op, axes: vec![0], keepdim: false }, &[sq], None).unwrap()
                })
                .collect();
            vec![g.add(Op::Stack { axis: 0 }, &reduced, None).unwrap()]
        });
        let inputs = [random_tensor(f, [5], 20), random_tensor(f, [7], 21), random_tensor(f, [0], 22)];
        check(&plan, &g, &inputs);
    }
}

/// One reduction over every item, the results stacked in item order into output 0.
fn stacked(op: ReduceOp, dtype: DType, prologue: &Body, lens: &[usize]) -> MultiReduce {
    let mut epilogue = Body::default();
    let mut stores = Vec::new();
    for index in 0..lens.len() {
        let value = epilogue.push(MultiReduce::result_load(index), dtype);
        stores.push(ElementStore { value, output: 0, index });
    }
    MultiReduce {
        reductions: vec![ItemReduction { op, dtype, leaves: 1, prologue: prologue.clone() }],
        items: lens.iter().map(|&len| ReduceItem { reduction: 0, len }).collect(),
        epilogue,
        stores,
    }
}

#[test]
fn multi_reduce_with_its_own_prologue_per_item_and_an_epilogue_over_the_results() {
    // norm = sqrt(sum(a*a) + sum(f32(b)^2)), bad = any(!isfinite(a)) | any(!isfinite(b)),
    // half = max(c) * 0.5; b is bf16, one item is empty.
    let (f, h) = (DType::F32, DType::BF16);
    let mut squares = Body::default();
    let x = load(&mut squares, 0, 0, &[1], f);
    bin(&mut squares, BinaryOp::Mul, x, x, f);
    let mut squares16 = Body::default();
    let x = load(&mut squares16, 0, 0, &[1], h);
    let x = squares16.push(Expr::Cast { x }, f);
    bin(&mut squares16, BinaryOp::Mul, x, x, f);
    let non_finite = |dtype: DType| {
        let mut body = Body::default();
        let x = load(&mut body, 0, 0, &[1], dtype);
        let finite = body.push(Expr::Unary { op: UnaryOp::IsFinite, x }, DType::Bool);
        body.push(Expr::Unary { op: UnaryOp::Not, x: finite }, DType::Bool);
        body
    };
    let mut plain = Body::default();
    load(&mut plain, 0, 0, &[1], f);
    let reductions = vec![
        ItemReduction { op: ReduceOp::Sum, dtype: f, leaves: 1, prologue: squares },
        ItemReduction { op: ReduceOp::Sum, dtype: h, leaves: 1, prologue: squares16 },
        ItemReduction { op: ReduceOp::Max, dtype: f, leaves: 1, prologue: non_finite(f) },
        ItemReduction { op: ReduceOp::Max, dtype: h, leaves: 1, prologue: non_finite(h) },
        ItemReduction { op: ReduceOp::Max, dtype: f, leaves: 1, prologue: plain },
    ];
    let lens = [40, 33, 40, 33, 0];
    let items = (0..5).map(|i| ReduceItem { reduction: i, len: lens[i] }).collect();
    let mut epilogue = Body::default();
    let r: Vec<ValueId> = (0..5)
        .map(|i| epilogue.push(MultiReduce::result_load(i), if (2..4).contains(&i) { DType::Bool } else { f }))
        .collect();
    let total = bin(&mut epilogue, BinaryOp::Add, r[0], r[1], f);
    let norm = epilogue.push(Expr::Unary { op: UnaryOp::Sqrt, x: total }, f);
    let bad = bin(&mut epilogue, BinaryOp::Or, r[2], r[3], DType::Bool);
    let half_value = epilogue.push(Expr::Const { value: Literal::Float(0.5) }, f);
    let half = bin(&mut epilogue, BinaryOp::Mul, r[4], half_value, f);
    let stores = vec![
        ElementStore { value: norm, output: 0, index: 0 },
        ElementStore { value: bad, output: 1, index: 0 },
        ElementStore { value: half, output: 2, index: 0 },
    ];
    let mr = MultiReduce { reductions, items, epilogue, stores };
    let plan = Plan {
        checks: Vec::new(),
        buffers: vec![
            buffer(f, 40, BufferRole::Input(0)),
            buffer(h, 33, BufferRole::Input(1)),
            buffer(f, 0, BufferRole::Input(2)),
            buffer(f, 1, BufferRole::Output),
            buffer(DType::Bool, 1, BufferRole::Output),
            buffer(f, 1, BufferRole::Output),
        ],
        inputs: vec![BufferId(0), BufferId(1), BufferId(2)],
        outputs: vec![output(3, &[]), output(4, &[]), output(5, &[])],
        kernels: vec![kernel("multi_reduce_epilogue", KernelKind::MultiReduce(mr), &[0, 1, 0, 1, 2], &[3, 4, 5])],
    };
    let g = graph(&[(f, &[40]), (h, &[33]), (f, &[0])], |g, i| {
        let reduce =
            |g: &mut Graph, op, x| g.add(Op::Reduce { op, axes: vec![0], keepdim: false }, &[x], None).unwrap();
        let binary = |g: &mut Graph, op, a, b| g.add(Op::Binary { op }, &[a, b], None).unwrap();
        let unary = |g: &mut Graph, op, x| g.add(Op::Unary { op }, &[x], None).unwrap();
        let sa = binary(g, BinaryOp::Mul, i[0], i[0]);
        let sa = reduce(g, ReduceOp::Sum, sa);
        let b32 = g.cast(i[1], f).unwrap();
        let sb = binary(g, BinaryOp::Mul, b32, b32);
        let sb = reduce(g, ReduceOp::Sum, sb);
        let total = binary(g, BinaryOp::Add, sa, sb);
        let norm = unary(g, UnaryOp::Sqrt, total);
        let mut bad = Vec::new();
        for &x in &i[..2] {
            let finite = unary(g, UnaryOp::IsFinite, x);
            let not = unary(g, UnaryOp::Not, finite);
            bad.push(reduce(g, ReduceOp::Max, not));
        }
        let any = binary(g, BinaryOp::Or, bad[0], bad[1]);
        let m = reduce(g, ReduceOp::Max, i[2]);
        let c = g.constant(0.5, f);
        vec![norm, any, binary(g, BinaryOp::Mul, m, c)]
    });
    let mut inputs = [random_tensor(f, [40], 30), random_tensor(h, [33], 31), random_tensor(f, [0], 32)];
    check(&plan, &g, &inputs);
    let got = eval_plan(&plan, &inputs).unwrap();
    assert_eq!(got[1].get_f64(0), 0.0, "random normals are finite");
    // NaN and infinities: the check flips, the norm goes NaN.
    for (seed, t) in inputs.iter_mut().enumerate() {
        inject_specials(t, 40 + seed as u64);
    }
    check(&plan, &g, &inputs);
    let got = eval_plan(&plan, &inputs).unwrap();
    assert_eq!(got[1].get_f64(0), 1.0);
    assert!(got[0].get_f64(0).is_nan());
}

#[test]
fn matmul_with_bias_activation_broadcast_and_transposes() {
    // relu(a @ b + bias) for a [2,3,4] and b [4,5] shared by both batches (b_batch_stride 0).
    let f = DType::F32;
    let (m, k, n) = (3, 4, 5);
    let mm = |a_transposed, b_transposed| MatMul {
        batch: vec![2],
        m,
        n,
        k,
        dtype: f,
        a_batch_stride: m * k,
        b_batch_stride: 0,
        a_transposed,
        b_transposed,
        bias: true,
        activation: Some(UnaryOp::Relu),
    };
    let plan = |a_transposed, b_transposed| Plan {
        checks: Vec::new(),
        buffers: vec![
            buffer(f, 2 * m * k, BufferRole::Input(0)),
            buffer(f, k * n, BufferRole::Input(1)),
            buffer(f, n, BufferRole::Input(2)),
            buffer(f, 2 * m * n, BufferRole::Output),
        ],
        inputs: vec![BufferId(0), BufferId(1), BufferId(2)],
        outputs: vec![output(3, &[2, m, n])],
        kernels: vec![kernel("matmul_bias_relu", KernelKind::MatMul(mm(a_transposed, b_transposed)), &[0, 1, 2], &[3])],
    };
    // The graph sees A as stored ([2,k,m] when transposed) and permutes it.
    let g = |a_transposed: bool, b_transposed: bool| {
        let a_shape: [usize; 3] = if a_transposed { [2, k, m] } else { [2, m, k] };
        let b_shape: [usize; 2] = if b_transposed { [n, k] } else { [k, n] };
        graph(&[(f, &a_shape), (f, &b_shape), (f, &[n])], |g, i| {
            let a =
                if a_transposed { g.add(Op::Permute { perm: vec![0, 2, 1] }, &[i[0]], None).unwrap() } else { i[0] };
            let b = if b_transposed { g.add(Op::Permute { perm: vec![1, 0] }, &[i[1]], None).unwrap() } else { i[1] };
            let p = g.add(Op::MatMul, &[a, b], None).unwrap();
            let s = g.add(Op::Binary { op: BinaryOp::Add }, &[p, i[2]], None).unwrap();
            vec![g.add(Op::Unary { op: UnaryOp::Relu }, &[s], None).unwrap()]
        })
    };
    for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
        let a_shape: [usize; 3] = if a_t { [2, k, m] } else { [2, m, k] };
        let b_shape: [usize; 2] = if b_t { [n, k] } else { [k, n] };
        let inputs = [random_tensor(f, a_shape, 30), random_tensor(f, b_shape, 31), random_tensor(f, [n], 32)];
        check(&plan(a_t, b_t), &g(a_t, b_t), &inputs);
    }
}

#[test]
fn chained_kernels_pass_intermediates_and_concat() {
    // k0: t = exp(x) (pointwise, intermediate b2); k1: concat [t, y] along axis 1 into b3; the
    // output reads b3 as a flat [2*(2+3)] vector.
    let f = DType::F32;
    let mut body = Body::default();
    let x = load(&mut body, 0, 0, &[2, 1], f);
    let e = body.push(Expr::Unary { op: UnaryOp::Exp, x }, f);
    body.stores.push(Store { value: e, output: 0 });
    let plan = Plan {
        checks: Vec::new(),
        buffers: vec![
            buffer(f, 4, BufferRole::Input(0)),
            buffer(f, 6, BufferRole::Input(1)),
            buffer(f, 4, BufferRole::Intermediate),
            buffer(f, 10, BufferRole::Output),
        ],
        inputs: vec![BufferId(0), BufferId(1)],
        outputs: vec![output(3, &[10]), output(1, &[2, 3])],
        kernels: vec![
            kernel(
                "pointwise_exp",
                KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![2, 2]), body }),
                &[0],
                &[2],
            ),
            kernel(
                "concat_axis1",
                KernelKind::Concat(Concat { shape: Shape::new(vec![2, 5]), axis: 1, extents: vec![2, 3], dtype: f }),
                &[2, 1],
                &[3],
            ),
        ],
    };
    let g = graph(&[(f, &[2, 2]), (f, &[2, 3])], |g, i| {
        let e = g.add(Op::Unary { op: UnaryOp::Exp }, &[i[0]], None).unwrap();
        let c = g.add(Op::Concat { axis: 1 }, &[e, i[1]], None).unwrap();
        vec![g.reshape(c, [10]).unwrap(), i[1]]
    });
    check(&plan, &g, &[random_tensor(f, [2, 2], 40), random_tensor(f, [2, 3], 41)]);
}

#[test]
fn invalid_plans_and_inputs_are_reported() {
    let f = DType::F32;
    let pointwise = |strides: &[usize], offset: usize| {
        let mut body = Body::default();
        let x = load(&mut body, 0, offset, strides, f);
        body.stores.push(Store { value: x, output: 0 });
        Plan {
            checks: Vec::new(),
            buffers: vec![buffer(f, 6, BufferRole::Input(0)), buffer(f, 6, BufferRole::Output)],
            inputs: vec![BufferId(0)],
            outputs: vec![output(1, &[2, 3])],
            kernels: vec![kernel(
                "pointwise_copy",
                KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![2, 3]), body }),
                &[0],
                &[1],
            )],
        }
    };
    let x = random_tensor(f, [2, 3], 50);
    let copied = eval_plan(&pointwise(&[3, 1], 0), std::slice::from_ref(&x)).unwrap();
    assert_eq!(copied, vec![x.clone()]);
    let err = eval_plan(&pointwise(&[3, 1], 1), std::slice::from_ref(&x)).unwrap_err().to_string();
    assert_eq!(
        err,
        "invalid plan: kernel 0 (pointwise_copy): v0: load at offset 1 with strides [3, 1] over [2, 3] leaves the 6 elements of b0 [Loads]"
    );
    let err = eval_plan(&pointwise(&[3], 0), std::slice::from_ref(&x)).unwrap_err().to_string();
    assert_eq!(err, "invalid plan: kernel 0 (pointwise_copy): v0: has 1 strides for a rank-2 domain [Loads]");
    let err = eval_plan(&pointwise(&[3, 1], 0), &[]).unwrap_err().to_string();
    assert_eq!(err, "expected 1 inputs, got 0");
    let err = eval_plan(&pointwise(&[3, 1], 0), &[random_tensor(DType::F16, [2, 3], 1)]).unwrap_err().to_string();
    assert_eq!(err, "input 0: expected f32 with 6 elements, got f16[2,3]");

    let mut reads_unwritten = pointwise(&[3, 1], 0);
    reads_unwritten.buffers.push(buffer(f, 6, BufferRole::Intermediate));
    reads_unwritten.kernels[0].inputs = vec![BufferId(2)];
    let err = eval_plan(&reads_unwritten, std::slice::from_ref(&x)).unwrap_err().to_string();
    assert_eq!(err, "invalid plan: kernel 0 (pointwise_copy): reads b2 before any kernel writes it [ReadBeforeWrite]");

    let mut mistyped = pointwise(&[3, 1], 0);
    if let KernelKind::Pointwise(p) = &mut mistyped.kernels[0].kind {
        let bad = p.body.push(Expr::Binary { op: BinaryOp::Add, a: ValueId(0), b: ValueId(0) }, DType::Bool);
        p.body.stores.push(Store { value: bad, output: 0 });
    }
    let err = eval_plan(&mistyped, std::slice::from_ref(&x)).unwrap_err().to_string();
    assert_eq!(err, "invalid plan: kernel 0 (pointwise_copy): v1: add gives f32, but the value is bool [ValueTypes]");
}
