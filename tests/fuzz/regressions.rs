//! Graphs the fuzzer failed on, named for the bug, each run through the same checks.

use crate::common::{compile_for_sm90, nvrtc_enabled, random_inputs, Builder};
use crate::gpu::{gpu, run_everywhere};
use crate::judge::References;
use crate::run::run_graph_on;
use braze_codegen::{candidate_configs, default_config, generate, KernelCode, KernelConfig, Target};
use braze_cpu::{assert_close_with, eval_graph, eval_plan, random_tensor, tolerance};
use braze_ir::{BinaryOp, DType, Graph, HostTensor, NodeId, Op, ReduceOp, UnaryOp};
use braze_passes::{compile_to_plan, FusionOptions};

/// Runs a fixed graph through the same checks: on `inputs`, or on the inputs of a few seeds with
/// and without NaN and Inf; and, where there is a GPU, through the GPU fuzz's checks too.
fn check_fixed(graph: &Graph, inputs: Option<Vec<HostTensor>>) {
    let nvrtc = nvrtc_enabled();
    let gpu_target = gpu().map(|device| device.target().clone());
    let runs: Vec<Vec<HostTensor>> = match inputs {
        Some(inputs) => vec![inputs],
        None => (0..4).map(|seed| random_inputs(graph, seed, |_| seed % 2 == 1)).collect(),
    };
    for inputs in runs {
        if let Err(failure) = run_graph_on(graph, &inputs, nvrtc) {
            panic!("fails at {}: {}\n{}", failure.stage, failure.message, graph.to_text());
        }
        if let Some(target) = &gpu_target {
            if let Err(failure) = run_everywhere(graph, &inputs, 0, target) {
                panic!("fails on the GPU at {}: {}\n{}", failure.stage, failure.message, graph.to_text());
            }
        }
    }
}

/// Fusion stored a row kernel's element value that only reads broadcast views once per row, also
/// when the rows have no columns (a buffer of 0 elements got 1).
#[test]
fn regression_softmax_over_an_empty_slice_of_a_broadcast() {
    let mut b = Builder::new();
    let x = b.input(DType::F32, []);
    let wide = b.broadcast_to(x, [7]);
    let empty = b.op(Op::Slice { axis: 0, start: 7, end: 7, step: 3 }, &[wide]);
    let y = b.op(Op::Softmax { axis: 0 }, &[empty]);
    check_fixed(&b.finish(vec![y]), None);
}

/// Simplify rewrote a float sum over no axes to its operand, but a sum starts from +0.0, so
/// `-0.0` sums to +0.0 (and its reciprocal is +inf, not -inf).
#[test]
fn regression_float_sum_over_no_axes_of_negative_zero() {
    for dtype in [DType::F32, DType::BF16] {
        for op in [ReduceOp::Sum, ReduceOp::Mean] {
            let mut b = Builder::new();
            let zero = b.constant(-0.0, dtype);
            let x = b.input(dtype, [3]);
            let sum = b.reduce(op, zero, &[], true);
            let r = b.un(UnaryOp::Reciprocal, sum);
            let xs = b.reduce(op, x, &[], false);
            let rx = b.un(UnaryOp::Reciprocal, xs);
            let graph = b.finish(vec![r, rx]);
            let inputs = vec![HostTensor::from_f64(dtype, [3], &[-0.0, 0.0, -2.0]).unwrap()];
            check_fixed(&graph, Some(inputs));
        }
    }
}

/// Integers above 2^24 converted to bf16 went through a rounded f32 first: two roundings, where
/// the reference rounds once (2^24 + 2^16 + 1 is nearer 2^24 + 2^17 than 2^24).
#[test]
fn regression_integer_to_bf16_rounds_once() {
    for dtype in [DType::I32, DType::I64] {
        let mut b = Builder::new();
        let x = b.input(dtype, [6]);
        let y = b.cast(x, DType::BF16);
        let h = b.cast(x, DType::F16);
        let graph = b.finish(vec![y, h]);
        let big = (1 << 24) + (1 << 16) + 1;
        let values = [big as f64, -big as f64, 16_777_217.0, 2_147_483_647.0, -2_147_483_648.0, 65_521.0];
        let inputs = vec![HostTensor::from_f64(dtype, [6], &values).unwrap()];
        check_fixed(&graph, Some(inputs.clone()));
        // One bf16 ulp is inside the bf16 tolerance: a lone cast of integers must be exact.
        let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
        let expected = eval_graph(&graph, &inputs).unwrap();
        let actual = eval_plan(&plan, &inputs).unwrap();
        for (a, e) in actual.iter().zip(&expected) {
            assert_close_with(a, e, 0.0, 0.0).unwrap_or_else(|m| panic!("{dtype}: {m}"));
        }
        assert_eq!(expected[0].get_f64(0), ((1 << 24) + (1 << 17)) as f64);
        let KernelCode::Cuda(kernel) =
            generate(&plan, 0, &default_config(&plan, 0, &Target::h200()), &Target::h200()).unwrap()
        else {
            panic!()
        };
        assert!(kernel.source.contains("round_to_bf16(int_to_f32_odd("), "{}", kernel.source);
    }
}

/// Row kernels caching long rows in 1024-thread blocks spilled: without a minimum of one block per
/// SM, ptxas held them to 32 registers a thread. (The bf16 row has 16,375 columns, 16 held a
/// thread: past 16, a row whose pass folds two values is re-read instead.)
#[test]
fn regression_cached_rows_in_1024_thread_blocks_do_not_spill() {
    for (dtype, cols) in [(DType::F32, 16_418), (DType::BF16, 16_375)] {
        let mut b = Builder::new();
        let x = b.input(dtype, [1, cols]);
        let w = b.input(dtype, [cols]);
        let s = b.op(Op::Softmax { axis: 1 }, &[x]);
        let r = b.op(Op::RmsNorm { eps: 1e-6 }, &[x, w]);
        let graph = b.finish(vec![s, r]);
        let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
        for i in 0..plan.kernels.len() {
            // The default may take fewer threads; the autotuner's 1024-thread candidates must
            // still claim a whole SM's registers.
            let wide: Vec<_> = candidate_configs(&plan, i, &Target::h200())
                .into_iter()
                .filter(|c| matches!(c, KernelConfig::Row { threads_per_row: 1024, cached: true, .. }))
                .collect();
            assert!(!wide.is_empty(), "no cached 1024-thread candidate for {dtype} x {cols}");
            for config in wide {
                let KernelCode::Cuda(kernel) = generate(&plan, i, &config, &Target::h200()).unwrap() else { panic!() };
                assert!(kernel.source.contains("__launch_bounds__(1024, 1)"), "{}", kernel.source);
                if nvrtc_enabled() {
                    compile_for_sm90(&kernel).unwrap_or_else(|e| panic!("{config}: {e}"));
                }
            }
        }
        check_fixed(&graph, None);
    }
}

/// A cached row of 512 threads, 36 elements held by each, spilled: ptxas held it to 64 registers
/// (fuzz seed 81,002,660: an rms_norm of 18,431 bf16 columns and the sum of the result).
#[test]
fn regression_cached_rows_in_512_thread_blocks_do_not_spill() {
    let mut b = Builder::new();
    let x = b.input(DType::BF16, [1, 18_431]);
    let w = b.input(DType::BF16, [18_431]);
    let r = b.op(Op::RmsNorm { eps: 1e-6 }, &[x, w]);
    let s = b.op(Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keepdim: false }, &[r]);
    let graph = b.finish(vec![s]);
    let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
    let config = default_config(&plan, 0, &Target::h200());
    assert_eq!(config, KernelConfig::Row { threads_per_row: 512, rows_per_block: 1, cached: true });
    let KernelCode::Cuda(kernel) = generate(&plan, 0, &config, &Target::h200()).unwrap() else { panic!() };
    assert!(kernel.source.contains("__launch_bounds__(512, 1)"), "{}", kernel.source);
    if nvrtc_enabled() {
        compile_for_sm90(&kernel).unwrap_or_else(|e| panic!("{config}: {e}"));
    }
    check_fixed(&graph, None);
}

/// A multi-reduce item that is an empty tensor of rank 2 or more (its zero dims have stride 0)
/// was not taken for a plain buffer, and fusion asked for a copy of a graph input.
#[test]
fn regression_stack_of_full_reductions_with_empty_items() {
    for dtype in [DType::F32, DType::I32, DType::Bool] {
        let op = if dtype == DType::Bool { ReduceOp::Max } else { ReduceOp::Sum };
        let mut b = Builder::new();
        let items: Vec<NodeId> = [vec![16, 0], vec![3], vec![2, 0, 7, 2], vec![5, 1]]
            .into_iter()
            .map(|shape| {
                let t = b.input(dtype, shape.clone());
                let axes: Vec<usize> = (0..shape.len()).collect();
                b.reduce(op, t, &axes, false)
            })
            .collect();
        let y = b.op(Op::Stack { axis: 0 }, &items);
        check_fixed(&b.finish(vec![y]), None);
    }
}

/// Fusion merged the kernel computing a value into the kernel copying a broadcast view of it
/// (a graph output), whose copy then read the value's buffer, which no kernel wrote.
#[test]
fn regression_copied_view_of_a_value_in_the_same_kernel() {
    let mut b = Builder::new();
    let c = b.input(DType::Bool, []);
    let w = b.op(Op::Where, &[c, c, c]);
    let wide = b.broadcast_to(w, [5]);
    let y = b.op(Op::Where, &[w, wide, wide]);
    check_fixed(&b.finish(vec![y, wide]), None);

    let mut b = Builder::new();
    let x = b.input(DType::F32, []);
    let m = b.un(UnaryOp::Neg, x);
    let wide = b.broadcast_to(m, [2, 5]);
    let y = b.add(m, wide);
    check_fixed(&b.finish(vec![y, wide]), None);
}
/// The f32 kernels computed gelu as `0.5 x (1 + erf(x / sqrt 2))` and `0.5 x (1 + tanh(u))`,
/// which cancel for negative `x`: gelu_erf(-5) was 10% off and gelu_tanh(-6.1) was -0, so its
/// reciprocal or log (-inf where the reference has NaN) went wrong.
#[test]
fn regression_gelu_of_negative_inputs_keeps_its_relative_accuracy() {
    for op in [UnaryOp::GeluErf, UnaryOp::GeluTanh] {
        let mut b = Builder::new();
        let x = b.input(DType::F32, [8]);
        let y = b.un(op, x);
        let r = b.un(UnaryOp::Reciprocal, y);
        let l = b.un(UnaryOp::Log, y);
        let graph = b.finish(vec![r, l]);
        let values = [-3.0, -5.0, -6.145473480224609, -7.5, -9.0, -10.5, -12.0, -0.5];
        let inputs = vec![HostTensor::from_f64(DType::F32, [8], &values).unwrap()];
        check_fixed(&graph, Some(inputs.clone()));
        let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
        let (actual, expected) = (eval_plan(&plan, &inputs).unwrap(), eval_graph(&graph, &inputs).unwrap());
        assert_close_with(&actual[0], &expected[0], 1e-5, 0.0).unwrap_or_else(|m| panic!("{op:?}: {m}"));
    }
}

/// Seed 7,002,429: `exp(gelu_erf(x))` in bf16, then a matmul. The fused kernel keeps the gelu in
/// f32 where the reference rounds it to bf16 first; through `exp` and a sum of 16 products that
/// cancel, the reference's extra rounding moved element (3, 1) from -1.843 (no intermediate
/// rounding) to -1.742, while the plan gave -1.828, and two perturbed references happened to
/// spread only one bf16 ulp. The plan was right: it is judged against the wide reference too.
#[test]
fn regression_bf16_intermediates_kept_in_f32_before_a_cancelling_matmul() {
    let mut b = Builder::new();
    let x = b.input(DType::BF16, [16, 16]);
    let a = b.input(DType::BF16, [7, 16]);
    let g = b.un(UnaryOp::GeluErf, x);
    let e = b.un(UnaryOp::Exp, g);
    let y = b.op(Op::MatMul, &[a, e]);
    let graph = b.finish(vec![y]);
    // The fuzzer's inputs 0 and 2 of that seed.
    let input_seed = |i: u64| 7_002_429u64.wrapping_mul(1_000_003).wrapping_add(i);
    let inputs =
        vec![random_tensor(DType::BF16, [16, 16], input_seed(0)), random_tensor(DType::BF16, [7, 16], input_seed(2))];
    check_fixed(&graph, Some(inputs.clone()));
    // The element is outside the bf16 tolerance of the reference and inside that of the wide one.
    let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
    let actual = eval_plan(&plan, &inputs).unwrap()[0].get_f64(3 * 16 + 1);
    let refs = References::of(&graph, &inputs).unwrap();
    let (expected, wide) = (refs.expected[0].get_f64(3 * 16 + 1), refs.wide[0].get_f64(3 * 16 + 1));
    let (rtol, atol) = tolerance(DType::BF16);
    assert_eq!((actual, expected, wide), (-1.828125, -1.7421875, -1.84375));
    assert!((actual - expected).abs() > atol + rtol * expected.abs());
    assert!((actual - wide).abs() <= atol + rtol * wide.abs());
}

/// Seen in the PTX of a fused kernel: NVRTC contracts `x * y + x` into one fused multiply-add
/// (`fma.rn.f32`, one rounding) where the reference and the CPU plan executor round the product
/// first. The exactness tables call mul and add exact, so the GPU fuzz requires the GPU and the
/// CPU plan executor to agree exactly on this output (and a comparison of such a value would
/// flip on the GPU).
#[test]
fn regression_a_product_then_a_sum_rounds_twice_on_the_gpu() {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [64]);
    let y = b.input(DType::F32, [64]);
    let xy = b.mul(x, y);
    let z = b.add(xy, x);
    check_fixed(&b.finish(vec![z]), None);
}

/// Gradient seeds 166 and 821 (and 68): the cycle check followed paths between nodes, but a
/// kernel is one unit. In the first graph the row kernel of `sum(where(c, 0, x))` also holds
/// `where(c, -1, p)`, which reads `p`, so the `mul` by `p` of the sum could not join `p`'s
/// kernel, though no node path leads from `p` to the sum. The second cycle runs through three
/// kernels: the sum of `a / b` with `(a / b) as f32 + e`, where `e` reads the min kernel that
/// also adds the sum.
#[test]
fn regression_cycle_through_an_unrelated_member_of_another_kernel() {
    let mut b = Builder::new();
    let x0 = b.input(DType::F32, []);
    let x1 = b.input(DType::F32, [8]);
    let x2 = b.input(DType::F32, []);
    let x3 = b.input(DType::F32, [8]);
    let c = b.bin(BinaryOp::Ge, x0, x1);
    let p = b.bin(BinaryOp::Pow, x0, x2);
    let minus_one = b.constant(-1.0, DType::F32);
    let y = b.op(Op::Where, &[c, minus_one, p]);
    let zero = b.constant(0.0, DType::F32);
    let masked = b.op(Op::Where, &[c, zero, x3]);
    let sum = b.reduce(ReduceOp::Sum, masked, &[0], true);
    let sum = b.reshape(sum, []);
    let z = b.mul(sum, p);
    check_fixed(&b.finish(vec![y, z]), None);

    let mut b = Builder::new();
    let a = b.input(DType::F16, [8]);
    let x = b.input(DType::F32, [18, 8]);
    let d = b.input(DType::F16, [8]);
    let min = b.reduce(ReduceOp::Min, x, &[0, 1], false);
    let q = b.bin(BinaryOp::Div, a, d);
    let sum = b.reduce(ReduceOp::Sum, q, &[0], false);
    let sum = b.cast(sum, DType::F32);
    let total = b.add(min, sum);
    let q32 = b.cast(q, DType::F32);
    let m = b.reshape(min, [1, 1]);
    let m = b.broadcast_to(m, [18, 8]);
    let e = b.bin(BinaryOp::Eq, x, m);
    let e = b.cast(e, DType::F32);
    let e = b.op(Op::Slice { axis: 0, start: 0, end: 1, step: 1 }, &[e]);
    let e = b.reshape(e, [8]);
    let y = b.add(q32, e);
    check_fixed(&b.finish(vec![total, y]), None);
}

/// Gradient seed 597: a layer norm over rows of one element gives every row its bias, so the
/// backward of a max over them (`x == max(x)`) splits the gradient over all rows, and then
/// `(y - mean(y)) * rsqrt(eps)` over rows of one is 0 in the reference and `(y - bf16(y)) * 316`
/// in a fused kernel, which keeps `y` in f32 and rounds the mean. The reference is unstable
/// there, but each perturbed reference broke the tie (noise on each element of the norm), sent
/// the whole gradient to one row and gave exactly 0 on the others, so the plan was judged
/// outside the spread. The values discontinuous ops read now get equal noise where they are
/// equal.
#[test]
fn regression_perturbed_references_keep_the_ties_of_a_max_backward() {
    let mut b = Builder::new();
    let x = b.input(DType::BF16, [4, 1]);
    let w = b.input(DType::BF16, [1]);
    let bias = b.input(DType::BF16, [1]);
    let a = b.input(DType::BF16, [4, 1]);
    let scale = b.input(DType::BF16, [4, 1]);
    let norm = b.op(Op::LayerNorm { eps: 1e-5 }, &[x, w, bias]);
    let max = b.reduce(ReduceOp::Max, norm, &[0, 1], true);
    let max = b.broadcast_to(max, [4, 1]);
    let tie = b.bin(BinaryOp::Eq, norm, max);
    let mask = b.cast(tie, DType::BF16);
    let aa = b.mul(a, a);
    let y = b.mul(mask, aa);
    let m = b.reduce(ReduceOp::Mean, y, &[1], true);
    let centred = b.bin(BinaryOp::Sub, y, m);
    let out = b.mul(centred, scale);
    let graph = b.finish(vec![out]);
    let tensor = |shape: &[usize], value: f64| {
        let n = shape.iter().product();
        HostTensor::from_f64(DType::BF16, shape.to_vec(), &vec![value; n]).unwrap()
    };
    // 1.0078125^2 = 1 + 2^-6 + 2^-14, which bf16 rounds to 1 + 2^-6.
    let inputs = vec![
        HostTensor::from_f64(DType::BF16, [4, 1], &[0.5, -1.25, 3.0, 0.75]).unwrap(),
        tensor(&[1], 1.5),
        tensor(&[1], -0.25),
        tensor(&[4, 1], 1.0078125),
        tensor(&[4, 1], 1024.0),
    ];
    check_fixed(&graph, Some(inputs.clone()));
    let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
    let actual = eval_plan(&plan, &inputs).unwrap()[0].to_f64_vec();
    let refs = References::of(&graph, &inputs).unwrap();
    assert_eq!(refs.expected[0].to_f64_vec(), [0.0; 4]);
    assert_eq!(actual, [0.0625; 4]);
    // The perturbed references keep the four-way tie: every row gets a spread.
    for i in 0..4 {
        let spread: Vec<f64> = refs.perturbed.iter().map(|p| p[0].get_f64(i)).collect();
        assert!(spread.iter().any(|&v| v != 0.0), "row {i}: {spread:?}");
    }
}

/// Gradient seed 1576: the backward of a bf16 max, `(x == max(x)) / count`, with `x = sqrt(a)`
/// in the same row kernel. The kernel kept `x` unrounded in f32 but rounded the max to bf16, so
/// no element equalled the max: a count of 0 and a NaN gradient. A row kernel's narrow
/// reductions now keep their results unrounded, like every value it computes.
#[test]
fn regression_bf16_max_equals_the_element_it_came_from() {
    for (dtype, op) in [(DType::BF16, ReduceOp::Max), (DType::BF16, ReduceOp::Min), (DType::F16, ReduceOp::Max)] {
        let mut b = Builder::new();
        let a = b.input(dtype, [3, 4]);
        let x = b.un(UnaryOp::Sqrt, a);
        let m = b.reduce(op, x, &[1], true);
        let tie = b.bin(BinaryOp::Eq, x, m);
        let mask = b.cast(tie, dtype);
        let count = b.reduce(ReduceOp::Sum, mask, &[1], true);
        let share = b.bin(BinaryOp::Div, mask, count);
        let graph = b.finish(vec![share]);
        // sqrt(2), sqrt(3), ... are not bf16 or f16 values.
        let values: Vec<f64> = (0..12).map(|i| 2.0 + i as f64).collect();
        let inputs = vec![HostTensor::from_f64(dtype, [3, 4], &values).unwrap()];
        check_fixed(&graph, Some(inputs.clone()));
        let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
        assert_eq!(plan.kernels.len(), 1, "{plan}");
        let actual = eval_plan(&plan, &inputs).unwrap()[0].to_f64_vec();
        let row = if op == ReduceOp::Max { [0.0, 0.0, 0.0, 1.0] } else { [1.0, 0.0, 0.0, 0.0] };
        assert_eq!(actual, row.repeat(3), "{dtype} {op:?}");
    }
}

/// Gradient seed 1713: `sigmoid(x) * (1 - sigmoid(x))`, a sigmoid's derivative, at x = 11.18,
/// where f32 sigmoid is 1 - 1.4e-5: the plan's sigmoid is one ulp above the correctly rounded
/// one, and `1 - s` (here times 1e4) moves by 0.4%. A perturbed reference moves it as much, but the noise was
/// uniform in `1 +- 2^-22` and rounded to exactly 1 for about one element in five, in both
/// runs for this one: no spread. The noise is now at least half its size.
#[test]
fn regression_perturbed_references_always_move_the_value() {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [64]);
    let s = b.un(UnaryOp::Sigmoid, x);
    let one = b.constant(1.0, DType::F32);
    let rest = b.bin(BinaryOp::Sub, one, s);
    let w = b.input(DType::F32, [64]);
    let scaled = b.mul(rest, w);
    let graph = b.finish(vec![scaled]);
    let inputs = vec![
        HostTensor::from_f64(DType::F32, [64], &[11.177083015441895; 64]).unwrap(),
        HostTensor::from_f64(DType::F32, [64], &[1e4; 64]).unwrap(),
    ];
    check_fixed(&graph, Some(inputs.clone()));
    let refs = References::of(&graph, &inputs).unwrap();
    let expected = refs.expected[0].get_f64(0);
    for perturbed in &refs.perturbed {
        assert!(perturbed[0].to_f64_vec().iter().all(|&p| p != expected), "{:?}", perturbed[0].to_f64_vec());
    }
}

/// Fresh gradient seed 5,384,828,156: the backward of a bf16 layer norm over rows of one
/// element, of `x = p * q`. Computed in bf16, it subtracts the rounded `mean(x)` from `x`, which
/// the fused kernel keeps in f32, and scales by `rsqrt(eps)`: `(x - bf16(x)) * 316` where the
/// gradient is 0. A norm's backward now computes in f32 and rounds once, as its forward does.
#[test]
fn regression_bf16_layer_norm_backward_computes_in_f32() {
    let mut b = Builder::new();
    let p = b.input(DType::BF16, [3, 1]);
    let q = b.input(DType::BF16, [3, 1]);
    let w = b.input(DType::BF16, [1]);
    let bias = b.input(DType::BF16, [1]);
    let upstream = b.input(DType::BF16, [3, 1]);
    let x = b.mul(p, q);
    let y = b.op(Op::LayerNorm { eps: 1e-5 }, &[x, w, bias]);
    let weighted = b.mul(y, upstream);
    let loss = b.reduce(ReduceOp::Sum, weighted, &[0, 1], false);
    let loss = b.cast(loss, DType::F32);
    let seed = b.constant(1.0, DType::F32);
    let mut graph = b.finish(vec![]);
    let grads = braze_autodiff::backward(&mut graph, &[(loss, seed)], &[p, w]).unwrap();
    graph.set_outputs(grads.into_iter().flatten().collect());
    let tensor = |shape: &[usize], values: &[f64]| HostTensor::from_f64(DType::BF16, shape.to_vec(), values).unwrap();
    // 1.0078125 * 1.0078125 = 1 + 2^-6 + 2^-14, which bf16 rounds to 1 + 2^-6.
    let inputs = vec![
        tensor(&[3, 1], &[1.0078125, 1.0078125, -1.0078125]),
        tensor(&[3, 1], &[1.0078125, 1.0078125, 1.0078125]),
        tensor(&[1], &[1.5]),
        tensor(&[1], &[0.25]),
        tensor(&[3, 1], &[1.0, -2.0, 3.0]),
    ];
    check_fixed(&graph, Some(inputs.clone()));
    let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
    let actual = eval_plan(&plan, &inputs).unwrap();
    assert_eq!(actual[0].to_f64_vec(), [0.0; 3]);
}

/// Fresh gradient seed 5,384,828,570: a bf16 product of 1.996 * 2^127, past bf16's largest
/// (it rounds to inf) but within f32's, plus -inf. The fused kernel keeps the product finite in
/// f32 and gives -inf, as the wide reference does; the reference gives inf - inf = NaN, and the
/// judge asked non-finite values to match the reference only.
#[test]
fn regression_bf16_overflow_kept_finite_in_f32_matches_the_wide_reference() {
    let mut b = Builder::new();
    let x = b.input(DType::BF16, [8]);
    let y = b.input(DType::BF16, [8]);
    let z = b.input(DType::BF16, [8]);
    let big = b.mul(x, y);
    let sum = b.add(big, z);
    let graph = b.finish(vec![sum]);
    let tensor = |value: f64| HostTensor::from_f64(DType::BF16, [8], &[value; 8]).unwrap();
    let inputs = vec![tensor(1.75 * 2f64.powi(127)), tensor(1.140625), tensor(f64::NEG_INFINITY)];
    check_fixed(&graph, Some(inputs.clone()));
    let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
    let actual = eval_plan(&plan, &inputs).unwrap()[0].to_f64_vec();
    let refs = References::of(&graph, &inputs).unwrap();
    assert!(refs.expected[0].to_f64_vec().iter().all(|v| v.is_nan()));
    assert_eq!(actual, [f64::NEG_INFINITY; 8]);
    assert_eq!(refs.wide[0].to_f64_vec(), actual);
}

/// GPU fuzz seeds 173 and 247: a max over an empty row of bools gave `true` on the GPU. Bools
/// accumulate as 0/1 in an int, and the accumulator started at the int's smallest value, which
/// reads as `true`; the CPU plan executor folds bools from `false` and agreed with the reference.
/// The identity of a bool max is 0 (and of a bool min 1).
#[test]
fn regression_bool_max_over_an_empty_row_is_false() {
    let mut b = Builder::new();
    let x = b.input(DType::Bool, [3, 0]);
    let any = b.reduce(ReduceOp::Max, x, &[1], false);
    let all = b.reduce(ReduceOp::Min, x, &[1], false);
    let graph = b.finish(vec![any, all]);
    check_fixed(&graph, None);
    let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
    let target = Target::h200();
    for k in 0..plan.kernels.len() {
        let KernelCode::Cuda(kernel) = generate(&plan, k, &default_config(&plan, k, &target), &target).unwrap() else {
            continue;
        };
        assert!(!kernel.source.contains("(-2147483647 - 1)"), "a bool max starts at INT_MIN:\n{}", kernel.source);
        assert!(!kernel.source.contains(" = 2147483647;"), "a bool min starts at INT_MAX:\n{}", kernel.source);
    }
}

/// GPU fuzz seed 23,515: a max over rows of negated i32 gave 8 where the reference gives 7, on
/// the GPU only. The PTX was right; ptxas (CUDA 13.0, sm_90) folded the unrolled
/// `max(max(acc, -x1), -x2)` into a three-input VIMNMX3 and dropped the negation of its middle
/// operand, so row `[6, 8, -7, 7, -6, -3, 7, 7]` reduced as if `8` were `-8`. Int max and min
/// now pass their operands through an identity permute that keeps each negation explicit. The
/// elementwise form (`max(max(x, -y), -z)`) was miscompiled the same way.
#[test]
fn regression_i32_max_of_negated_values() {
    let row5 = [6.0, 8.0, -7.0, 7.0, -6.0, -3.0, 7.0, 7.0];
    let mut values: Vec<f64> = (0..64).map(|i| ((i * 37 + 11) % 17) as f64 - 8.0).collect();
    values[40..48].copy_from_slice(&row5);
    for op in [ReduceOp::Max, ReduceOp::Min] {
        let mut b = Builder::new();
        let x = b.input(DType::I32, [8, 8]);
        let negated = b.un(UnaryOp::Neg, x);
        let reduced = b.reduce(op, negated, &[1], true);
        let graph = b.finish(vec![reduced]);
        check_fixed(&graph, Some(vec![HostTensor::from_f64(DType::I32, [8, 8], &values).unwrap()]));
        check_fixed(&graph, None);
    }
    for op in [BinaryOp::Max, BinaryOp::Min] {
        let mut b = Builder::new();
        let x = b.input(DType::I32, [64]);
        let y = b.input(DType::I32, [64]);
        let z = b.input(DType::I32, [64]);
        let (ny, nz) = (b.un(UnaryOp::Neg, y), b.un(UnaryOp::Neg, z));
        let first = b.bin(op, x, ny);
        let out = b.bin(op, first, nz);
        let graph = b.finish(vec![out]);
        let column = |seed: u64| {
            let v: Vec<f64> = (0..64).map(|i| ((i as u64 * 7919 + seed * 104_729) % 33) as f64 - 16.0).collect();
            HostTensor::from_f64(DType::I32, [64], &v).unwrap()
        };
        check_fixed(&graph, Some(vec![column(1), column(2), column(3)]));
    }
}

/// Fuzz seed 412000123: a layer_norm of rows holding one repeated value (a broadcast rms_norm
/// result). The f32 mean `sum(x) * (1/n)` missed the value by an ulp, and `(x - mean) *
/// rsqrt(var + eps)` magnified the residual by rsqrt(eps): -0.90056 where the reference gives the
/// bias, -0.90060. With the mean's rounding taken back out (`d - sum(d) / n` for `d = x - mean`),
/// such a row centres to exactly 0 and the output is exactly `b`.
#[test]
fn regression_layer_norm_of_rows_of_one_repeated_value() {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [3, 1]);
    let scale = b.input(DType::F32, [1]);
    let r = b.op(Op::RmsNorm { eps: 1e-6 }, &[x, scale]);
    let wide = b.broadcast_to(r, [33, 3, 3]);
    let w = b.input(DType::F32, [3]);
    let bias = b.input(DType::F32, [3]);
    let y = b.op(Op::LayerNorm { eps: 1e-5 }, &[wide, w, bias]);
    let graph = b.finish(vec![y, wide]);
    let f32s = |shape: &[usize], values: &[f64]| HostTensor::from_f64(DType::F32, shape.to_vec(), values).unwrap();
    let bias_values = [-0.9006019830703735, 0.405283123254776, 0.17942771315574646];
    let inputs = vec![
        f32s(&[3, 1], &[-0.9406211972236633, 0.24498385190963745, -0.23835770785808563]),
        f32s(&[1], &[-1.3226804733276367]),
        f32s(&[3], &[-1.2141145467758179, 1.8054287433624268, -0.3310430943965912]),
        f32s(&[3], &bias_values),
    ];
    check_fixed(&graph, Some(inputs.clone()));
    check_fixed(&graph, None);
    let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
    let actual = eval_plan(&plan, &inputs).unwrap()[0].to_f64_vec();
    let bias_f32: Vec<f64> = bias_values.iter().map(|&v| v as f32 as f64).collect();
    for (i, chunk) in actual.chunks(3).enumerate() {
        assert_eq!(chunk, bias_f32, "row {i}: a row of one value normalizes to exactly the bias");
    }
}

/// Seeds 437 and 438: a stack of one reduction is a one-element value, and an op after it was
/// taken into the multi-reduce epilogue, which has no value for a stack (its stores read the
/// stacked results): lowering failed. Ops after a stack read its buffer.
#[test]
fn regression_an_op_after_a_stack_of_one_reduction_reads_the_stack() {
    let mut b = Builder::new();
    let x = b.input(DType::Bool, [7, 8]);
    let all = b.reduce(ReduceOp::Min, x, &[0, 1], false);
    let stacked = b.op(Op::Stack { axis: 0 }, &[all]);
    let both = b.bin(BinaryOp::And, stacked, all);
    let graph = b.finish(vec![both]);
    check_fixed(&graph, None);
    let mut b = Builder::new();
    let x = b.input(DType::Bool, [2]);
    let any = b.reduce(ReduceOp::Max, x, &[0], false);
    let stacked = b.op(Op::Stack { axis: 0 }, &[any]);
    let halves = b.cast(stacked, DType::F16);
    check_fixed(&b.finish(vec![halves]), None);
}

/// GPU fuzz seed 7,700,020 (shrunk): a multi-pointwise kernel of a floor member and a divide
/// member spilled 12 B, held to 32 registers by ptxas's occupancy heuristic; such kernels now
/// state one block per SM as enough, and compile without spills.
#[test]
fn regression_multi_pointwise_of_small_members_does_not_spill() {
    let mut b = Builder::new();
    let x0 = b.input(DType::BF16, [1, 7]);
    let x1 = b.input(DType::BF16, [1, 7]);
    let x2 = b.input(DType::F32, [16, 1, 2]);
    let x3 = b.input(DType::F32, [1, 16, 1]);
    let x4 = b.input(DType::BF16, [2, 1, 7]);
    let smaller = b.bin(BinaryOp::Min, x0, x1);
    let sum = b.bin(BinaryOp::Add, smaller, x4);
    let floor = b.un(UnaryOp::Floor, x3);
    let softmax = b.op(Op::Softmax { axis: 0 }, &[sum]);
    check_fixed(&b.finish(vec![softmax, floor, x2]), None);
}

/// Fuzz seed 91,000,810 (a fresh range, shrunk): `pow(c, cos(x))` in bf16 spilled 4 B at 32
/// registers, where ptxas held a pointwise kernel calling `cosf` for occupancy; such kernels now
/// state one block per SM as enough.
#[test]
fn regression_pointwise_trigonometry_does_not_spill() {
    let mut b = Builder::new();
    let x = b.input(DType::BF16, [3, 33, 1, 1]);
    let c = b.input(DType::BF16, []);
    let cos = b.un(UnaryOp::Cos, x);
    let pow = b.bin(BinaryOp::Pow, c, cos);
    // A positive base: a negative one is NaN at every exponent but the integers, where the
    // reference's bf16 rounding of `cos` lands and the kernel's f32 does not.
    let xs: Vec<f64> = (0..99).map(|i| (i as f64 - 49.0) * 0.37).collect();
    let inputs = vec![
        HostTensor::from_f64(DType::BF16, [3, 33, 1, 1], &xs).unwrap(),
        HostTensor::from_f64(DType::BF16, [], &[1.75]).unwrap(),
    ];
    check_fixed(&b.finish(vec![pow]), Some(inputs));
}

/// Fuzz seed 98,000,080 (a fresh range, shrunk): a bf16 layer norm over 18,291 columns held 18
/// elements a thread in a 1024-thread block and spilled 8 B (two accumulators in the variance
/// pass); such rows are re-read instead, and 16,384 columns stay held.
#[test]
fn regression_long_bf16_layer_norm_rows_do_not_spill() {
    for cols in [18_291, 16_384] {
        let mut b = Builder::new();
        let x = b.input(DType::BF16, [1, cols]);
        let w = b.input(DType::BF16, [cols]);
        let bias = b.input(DType::BF16, [cols]);
        let y = b.op(Op::LayerNorm { eps: 1e-5 }, &[x, w, bias]);
        check_fixed(&b.finish(vec![y]), None);
    }
}

/// GPU fuzz seed 214 (shrunk): a multi-reduce min of `x / x` spilled 4 B at 32 registers, the
/// division's slow-path call live in the unrolled loop; multi-reduce kernels state one block per
/// SM as enough.
#[test]
fn regression_multi_reduce_of_a_division_does_not_spill() {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [3, 2, 3, 1]);
    let wide = b.broadcast_to(x, [3, 2, 3, 7]);
    let truth = b.cast(wide, DType::Bool);
    let ratio = b.bin(BinaryOp::Div, wide, wide);
    let least = b.reduce(ReduceOp::Min, ratio, &[0, 1, 2, 3], false);
    let stacked = b.op(Op::Stack { axis: 0 }, &[least]);
    check_fixed(&b.finish(vec![stacked, truth]), None);
}

/// GPU fuzz seed 8,866 (shrunk): a column max of i64 folded the partials of its 256 row threads
/// fully unrolled and spilled 320 B at 255 registers; that fold now unrolls by 8.
#[test]
fn regression_column_fold_of_wide_partials_does_not_spill() {
    let mut b = Builder::new();
    let flags = b.input(DType::Bool, [2, 2, 3, 1]);
    let x = b.input(DType::I64, [2, 4]);
    let top = b.reduce(ReduceOp::Max, x, &[0], true);
    check_fixed(&b.finish(vec![top, flags]), None);
}

/// GPU fuzz seed 1,460 (shrunk): a pointwise kernel of a reciprocal, a product and a comparison
/// spilled 4 B, held to 32 registers by ptxas's occupancy heuristic around the division's
/// slow-path call.
#[test]
fn regression_pointwise_reciprocal_beside_a_comparison_does_not_spill() {
    let mut b = Builder::new();
    let x0 = b.input(DType::BF16, [5, 7, 0]);
    let x1 = b.input(DType::F32, [1, 3]);
    let x2 = b.input(DType::F32, [5, 3, 2, 16]);
    let x3 = b.input(DType::F32, []);
    let x4 = b.input(DType::F32, [5, 8, 16]);
    let x5 = b.input(DType::F32, [5, 1, 1, 16]);
    let x6 = b.input(DType::F32, [5, 3, 1, 16]);
    let expm1 = b.un(UnaryOp::Expm1, x0);
    let sin = b.un(UnaryOp::Sin, x1);
    let three = b.constant(3.0, DType::F32);
    let sin3 = b.bin(BinaryOp::Mul, sin, three);
    let recip = b.un(UnaryOp::Reciprocal, x2);
    let scaled = b.bin(BinaryOp::Mul, recip, x3);
    let log1p = b.un(UnaryOp::Log1p, x4);
    let product = b.bin(BinaryOp::Mul, log1p, x5);
    let le = b.bin(BinaryOp::Le, x2, x6);
    let empty = b.op(Op::Slice { axis: 2, start: 2, end: 2, step: 3 }, &[le]);
    check_fixed(&b.finish(vec![empty, expm1, sin3, scaled, product, sin3]), None);
}

/// GPU fuzz seed 5,003 (shrunk): a pointwise kernel holding a softmax over a 2-element axis and
/// a `where` spilled 8 B at 40 registers.
#[test]
fn regression_pointwise_small_softmax_and_where_does_not_spill() {
    let mut b = Builder::new();
    let x0 = b.input(DType::F32, [8, 2]);
    let x1 = b.input(DType::Bool, [2]);
    let x2 = b.input(DType::F32, [2, 1, 1, 2]);
    let wide = b.broadcast_to(x0, [8, 2]);
    let cube = b.reshape(wide, [2, 2, 2, 2]);
    let softmax = b.op(Op::Softmax { axis: 0 }, &[cube]);
    let chosen = b.op(Op::Where, &[x1, x2, softmax]);
    let empty = b.op(Op::Slice { axis: 2, start: 2, end: 2, step: 2 }, &[chosen]);
    let mean = b.reduce(ReduceOp::Mean, empty, &[0, 3], false);
    check_fixed(&b.finish(vec![mean]), None);
}

/// GPU fuzz seed 6,644 (shrunk): `abs(x) > -1` came out true on the GPU for the second of two
/// NaNs (same bits as the first, which came out false); run repeatedly, as it did not reproduce
/// on the CPU.
#[test]
fn regression_abs_of_nan_compared_with_a_negative_constant_is_false() {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [16, 2, 1]);
    let abs = b.un(UnaryOp::Abs, x);
    let minus_one = b.constant(-1.0, DType::F32);
    let gt = b.bin(BinaryOp::Gt, abs, minus_one);
    let graph = b.finish(vec![gt]);
    let inputs = random_inputs(&graph, 6644, |_| true);
    for _ in 0..16 {
        check_fixed(&graph, Some(inputs.clone()));
    }
}

/// Fusion put the op computing a gather's indices (`max(i, 0)`, same shape) into the gather's
/// pointwise kernel, which reads its indices from a buffer: lowering failed. (Model-graph seed
/// 71234501963.)
#[test]
fn regression_gather_indices_computed_in_the_same_shape() {
    let mut b = Builder::new();
    let table = b.input(DType::BF16, [16]);
    let other = b.input(DType::BF16, [5]);
    let at = b.input(DType::I32, [5]);
    let zero = b.constant(0.0, DType::I32);
    let clamped = b.bin(BinaryOp::Max, at, zero);
    let rows = b.op(Op::IndexSelect { axis: 0 }, &[table, clamped]);
    let finite = b.un(UnaryOp::IsFinite, at);
    let y = b.op(Op::Where, &[finite, other, rows]);
    let graph = b.finish(vec![y]);
    let inputs = vec![
        HostTensor::from_f64(DType::BF16, [16], &(0..16).map(|i| i as f64 * 0.5 - 3.0).collect::<Vec<_>>()).unwrap(),
        HostTensor::from_f64(DType::BF16, [5], &[-1.34375, 0.3515625, -0.1298828125, f64::INFINITY, 1.3203125])
            .unwrap(),
        HostTensor::from_f64(DType::I32, [5], &[2.0, -1.0, -7.0, 1.0, 6.0]).unwrap(),
    ];
    check_fixed(&graph, Some(inputs));
}
