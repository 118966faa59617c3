//! Generated CUDA C run on the CPU by the emulator (`tests/emulator`) against the reference:
//! the kernels whose arithmetic the CPU plan executor only models (the tensor-core attention
//! forward and backward: mma.sync fragments, ldmatrix, cp.async staging). Needs a C++20
//! compiler; says it skipped without one.

mod common;
mod emulator;

use braze_codegen::{default_config, KernelConfig, Target};
use braze_cpu::eval_graph;
use braze_ir::{DType, Graph, NodeId, Op};
use braze_passes::{compile_to_plan, FusionOptions};
use common::{compare_outputs, random_inputs, wide_graph, Builder};

fn enabled() -> bool {
    if emulator::available() {
        return true;
    }
    println!("skipped: no C++ compiler (c++ or $CXX)");
    false
}

/// Attention of `[B, H, T, D]` operands and, with `backward`, the gradients of q, k and v for
/// an incoming gradient.
fn attention(dtype: DType, shape: [usize; 4], causal: bool, backward: bool) -> Graph {
    let mut b = Builder::new();
    let qkv: Vec<NodeId> = (0..3).map(|_| b.input(dtype, shape)).collect();
    let y = b.op(Op::Attention { causal, scale: 1.0 / (shape[3] as f64).sqrt() }, &qkv);
    if !backward {
        return b.finish(vec![y]);
    }
    let dout = b.input(dtype, shape);
    let grads = braze_autodiff::backward(&mut b.g, &[(y, dout)], &qkv).expect("float inputs");
    b.finish(grads.into_iter().map(|g| g.expect("every input gets a gradient")).collect())
}

/// How many of `configs` run attention on tensor cores.
fn tensor_core_count(configs: &[KernelConfig]) -> usize {
    configs
        .iter()
        .filter(|c| {
            matches!(
                c,
                KernelConfig::Attention { tensor_cores: true, .. }
                    | KernelConfig::AttentionBackward { tensor_cores: true, .. }
            )
        })
        .count()
}

/// Compiles `graph` with each kernel's default config for the H200 (the tensor-core attention
/// kernels with `(warps, rows_per_warp, stages)` where given), checks that `tensor_core_kernels` kernels run
/// on tensor cores, runs every kernel in the emulator and compares with the reference.
fn check(what: &str, graph: &Graph, tensor_core_kernels: usize, shape: Option<(u32, u32, u32)>, seed: u64) {
    let plan = compile_to_plan(graph, &FusionOptions::default()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let target = Target::h200();
    let configs: Vec<KernelConfig> = (0..plan.kernels.len())
        .map(|k| match (default_config(&plan, k, &target), shape) {
            (KernelConfig::AttentionBackward { tensor_cores: true, .. }, Some((warps, rows_per_warp, stages))) => {
                KernelConfig::AttentionBackward { warps, rows_per_warp, tensor_cores: true, stages }
            }
            (KernelConfig::Attention { tensor_cores: true, .. }, Some((warps, rows_per_warp, stages))) => {
                KernelConfig::Attention { warps, rows_per_warp, tensor_cores: true, stages }
            }
            (config, _) => config,
        })
        .collect();
    let on_tensor_cores = tensor_core_count(&configs);
    assert_eq!(on_tensor_cores, tensor_core_kernels, "{what}: {configs:?}");
    let inputs = random_inputs(graph, seed, |_| false);
    let expected = eval_graph(graph, &inputs).unwrap();
    let wide = eval_graph(&wide_graph(graph).unwrap(), &inputs).unwrap();
    let actual = emulator::run_plan(&plan, &configs, &target, &inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
    let dtype = graph.node(graph.inputs()[0]).dtype;
    compare_outputs(&actual, &expected, Some(&wide), dtype).unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// The forward on tensor cores (the kernel also checked on the H200), which shows the emulator
/// right: tails of the query and key tiles and sequences the tiles divide (copies without
/// clamps), both 16-bit dtypes, head dims 64 and 128, and 48 (whose rows split unevenly over
/// the block's copies).
#[test]
fn tensor_core_attention_forward_in_the_emulator() {
    if !enabled() {
        return;
    }
    for (dtype, shape, causal, config) in [
        (DType::BF16, [1, 2, 100, 64], true, None),
        (DType::F16, [2, 1, 17, 128], false, None),
        (DType::BF16, [1, 1, 200, 64], true, Some((4, 16, 2))),
        (DType::F16, [1, 2, 70, 128], false, Some((8, 16, 2))),
        (DType::BF16, [1, 1, 300, 64], true, Some((4, 32, 1))),
        (DType::F16, [1, 1, 150, 64], false, Some((2, 32, 2))),
        (DType::BF16, [1, 1, 256, 64], true, None),
        (DType::F16, [1, 1, 96, 48], false, Some((4, 16, 2))),
    ] {
        let what = format!("attention {dtype} {shape:?} causal={causal} (warps, rows_per_warp, stages) {config:?}");
        check(&what, &attention(dtype, shape, causal, false), 1, config, 11);
    }
}

/// The backward on tensor cores: dq and dk/dv beside the forward and the delta row kernel, at
/// sequences of one, of a partial tile, of several tiles and of whole tiles only, with and
/// without the mask, blocks of 2 and 8 warps (rows a block below and above the walked tile),
/// one and two row blocks a warp, one tile in shared memory at a time or two (the next one's
/// copies in flight), head dims 64, 128 and 48 (rows split unevenly over the block's copies).
#[test]
fn tensor_core_attention_backward_in_the_emulator() {
    if !enabled() {
        return;
    }
    for (dtype, shape, causal, warps) in [
        (DType::BF16, [1, 2, 100, 64], true, None),
        (DType::BF16, [2, 1, 17, 64], false, None),
        (DType::F16, [1, 1, 70, 128], true, None),
        (DType::BF16, [1, 2, 1, 128], true, None),
        (DType::F16, [1, 1, 100, 64], false, None),
        (DType::BF16, [1, 1, 200, 64], true, Some((8, 16, 1))),
        (DType::F16, [1, 1, 90, 128], true, Some((2, 16, 1))),
        (DType::BF16, [1, 2, 200, 64], true, Some((4, 16, 2))),
        (DType::F16, [1, 1, 130, 128], false, Some((2, 16, 2))),
        (DType::BF16, [2, 1, 17, 64], true, Some((4, 16, 2))),
        (DType::BF16, [1, 1, 300, 64], true, Some((4, 32, 1))),
        (DType::F16, [1, 1, 150, 64], false, Some((2, 32, 2))),
        (DType::BF16, [1, 1, 128, 64], true, None),
        (DType::F16, [1, 1, 64, 48], true, Some((4, 16, 2))),
    ] {
        let what =
            format!("attention backward {dtype} {shape:?} causal={causal} (warps, rows_per_warp, stages) {warps:?}");
        check(&what, &attention(dtype, shape, causal, true), 3, warps, 23);
    }
}

/// q, k and v read straight out of a fused projection's `[B, T, 3 H D]` output and the results
/// written as `[B, T, H D]` (operand layouts of batch, head and row strides), forward and
/// backward, on tensor cores.
#[test]
fn tensor_core_attention_of_a_fused_projection_in_the_emulator() {
    if !enabled() {
        return;
    }
    for (dtype, shape, backward) in [
        (DType::BF16, [2, 70, 3, 64], false),
        (DType::F16, [1, 33, 2, 128], false),
        (DType::BF16, [2, 70, 3, 64], true),
    ] {
        let what = format!("attention of a fused projection {dtype} [B, T, H, D] {shape:?} backward={backward}");
        let tensor_core_kernels = if backward { 3 } else { 1 };
        check(&what, &common::projected_attention(dtype, shape, backward), tensor_core_kernels, None, 31);
    }
}

/// `index_add` over `[outer, indices, inner]` sources into `size` rows at `at`.
fn index_add(dtype: DType, index: DType, outer: usize, inner: usize, size: usize, at: &[i64]) -> Graph {
    let mut b = Builder::new();
    let src = b.input(dtype, [outer, at.len(), inner]);
    let indices = b.input(index, [at.len()]);
    let out = b.op(Op::IndexAdd { axis: 1, size }, &[src, indices]);
    b.finish(vec![out])
}

/// The index_add kernel (an embedding's gradient): every default and candidate config in the
/// emulator gives the CPU plan executor's bits (the same f32 sums in index order, rounded
/// once) and the reference's values, with every index on one row, indices out of range, none at
/// all, ragged inner extents and several outer slices.
#[test]
fn index_add_in_the_emulator_matches_the_plan_executor_bit_for_bit() {
    use braze_codegen::candidate_configs;
    use braze_ir::HostTensor;
    if !enabled() {
        return;
    }
    struct Case {
        what: &'static str,
        dtype: DType,
        index: DType,
        outer: usize,
        inner: usize,
        size: usize,
        at: Vec<i64>,
    }
    let spread: Vec<i64> = (0..300).map(|i| (i * 7919 % 61) as i64).collect();
    let case = |what, dtype, index, outer, inner, size, at| Case { what, dtype, index, outer, inner, size, at };
    let cases = [
        case("one row hit 200 times, bf16", DType::BF16, DType::I64, 1, 64, 5, vec![3; 200]),
        case("spread, f32, i32 indices, ragged inner", DType::F32, DType::I32, 1, 37, 61, spread.clone()),
        case(
            "out of range and negative indices skipped",
            DType::F32,
            DType::I64,
            2,
            8,
            4,
            vec![0, 9, -1, 3, 3, 4, 1, -7],
        ),
        case("no indices", DType::F16, DType::I64, 2, 16, 3, vec![]),
        case("several outer slices, f16", DType::F16, DType::I32, 3, 40, 33, spread[..90].to_vec()),
    ];
    let target = Target::h200();
    for Case { what, dtype, index, outer, inner, size, at } in cases {
        let graph = index_add(dtype, index, outer, inner, size, &at);
        let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
        let at_f64: Vec<f64> = at.iter().map(|&i| i as f64).collect();
        let mut inputs = random_inputs(&graph, 31, |_| false);
        inputs[1] = HostTensor::from_f64(index, [at.len()], &at_f64).unwrap();
        let expected = eval_graph(&graph, &inputs).unwrap();
        let modelled = braze_cpu::eval_plan(&plan, &inputs).unwrap();
        let candidates = candidate_configs(&plan, 0, &target);
        assert!(candidates.len() > 1, "{what}: {candidates:?}");
        for config in candidates {
            let actual = emulator::run_plan(&plan, &[config], &target, &inputs)
                .unwrap_or_else(|e| panic!("{what} with {config}: {e}"));
            assert_eq!(
                actual[0].to_bytes(),
                modelled[0].to_bytes(),
                "{what} with {config}: not the plan executor's bits"
            );
            compare_outputs(&actual, &expected, None, dtype).unwrap_or_else(|e| panic!("{what} with {config}: {e}"));
        }
    }
}

/// A compiled training step exported and run with every kernel emulated (matmuls on the plan
/// executor's model): every output (the loss, updated parameters, optimizer state) as the plan
/// executor gives it. `tensor_cores`: how many kernels must run on tensor cores.
fn check_training_step(what: &str, workload: &braze_workloads::Workload, dtype: DType, tensor_cores: usize) {
    use braze_ir::HostTensor;
    let (graph, bound) = workload.compile().fullgraph(true).export(&workload.inputs).unwrap();
    let inputs: Vec<HostTensor> = bound.iter().map(|t| t.to_host().unwrap()).collect();
    let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
    let target = Target::h200();
    let configs: Vec<KernelConfig> = (0..plan.kernels.len()).map(|k| default_config(&plan, k, &target)).collect();
    let on_tensor_cores = tensor_core_count(&configs);
    assert_eq!(on_tensor_cores, tensor_cores, "{what}: {configs:?}");
    let modelled = braze_cpu::eval_plan(&plan, &inputs).unwrap();
    let actual = emulator::run_plan(&plan, &configs, &target, &inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
    // AdamW's first update is about lr * sign(g): an element whose gradient is at rounding
    // level may move the other way, 2 lr apart (lr 3e-4 and 1e-3 here); everything else agrees
    // to rounding.
    let (rtol, atol) = if dtype == DType::F32 { (1e-4, 2.5e-3) } else { (2e-2, 2.5e-3) };
    for (j, (a, m)) in actual.iter().zip(&modelled).enumerate() {
        for i in 0..a.numel() {
            let (x, y) = (a.get_f64(i), m.get_f64(i));
            assert!(
                (x - y).abs() <= atol + rtol * y.abs() || (x.is_nan() && y.is_nan()),
                "{what}: output {j} ({}{}) element {i}: emulated {x}, plan executor {y}",
                a.dtype(),
                a.shape()
            );
        }
    }
}

/// Whole training steps in the emulator: GPT-2 (braze-nn's model at a small size: embedding
/// gathers, layer norms, attention, GELU, cross-entropy, backward, gradient clipping, AdamW) in
/// f32 and under bf16 autocast (attention on tensor cores), and mlp_step with bf16 parameters
/// (row, column and multi-tensor kernels of the backward and the optimizer).
#[test]
fn training_steps_in_the_emulator_match_the_plan_executor() {
    use braze::Device;
    use braze_workloads::gpt2::gpt2_training_step;
    use braze_workloads::{mlp_step, Gpt2Sizes, Sizes};
    if !enabled() {
        return;
    }
    for dtype in [DType::F32, DType::BF16] {
        let sizes = Gpt2Sizes { dtype, ..Gpt2Sizes::small() };
        let (workload, _) = gpt2_training_step(&sizes, Device::Cpu).unwrap();
        let tensor_cores = if dtype == DType::BF16 { 3 * sizes.n_layer } else { 0 };
        check_training_step(&format!("gpt2_step {dtype}"), &workload, dtype, tensor_cores);
    }
    let sizes = Sizes { rows: 48, hidden: 64, dtype: DType::BF16, ..Sizes::default() };
    check_training_step("mlp_step bf16", &mlp_step(&sizes, Device::Cpu).unwrap(), DType::BF16, 0);
}

/// A bf16 value computed in a kernel and then compared (directly, and through a cast to f32)
/// is compared rounded, as the reference holds it: `cos(x) == b`, `b` the bf16 rounding of the
/// cosine, holds everywhere in the generated CUDA C too (gradient fuzz seed 5,101,752).
#[test]
fn generated_comparisons_observe_computed_bf16_values_rounded() {
    use braze_ir::{BinaryOp, HostTensor, UnaryOp};
    if !enabled() {
        return;
    }
    let mut b = Builder::new();
    let x = b.input(DType::BF16, [256]);
    let y = b.input(DType::BF16, [256]);
    let c = b.un(UnaryOp::Cos, x);
    let direct = b.bin(BinaryOp::Eq, c, y);
    let (c32, y32) = (b.cast(c, DType::F32), b.cast(y, DType::F32));
    let widened = b.bin(BinaryOp::Eq, c32, y32);
    let graph = b.finish(vec![direct, widened]);
    let mut inputs = random_inputs(&graph, 5, |_| false);
    let cosines: Vec<f64> = inputs[0].to_f64_vec().iter().map(|v| v.cos()).collect();
    inputs[1] = HostTensor::from_f64(DType::BF16, [256], &cosines).unwrap();
    let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
    let target = Target::h200();
    let configs: Vec<KernelConfig> = (0..plan.kernels.len()).map(|k| default_config(&plan, k, &target)).collect();
    let actual = emulator::run_plan(&plan, &configs, &target, &inputs).unwrap();
    for (j, out) in actual.iter().enumerate() {
        let ties = out.to_f64_vec().iter().filter(|&&v| v == 1.0).count();
        assert_eq!(ties, 256, "output {j}: every cosine ties with its rounding");
    }
}

/// An eager op's pointwise kernel reading its element count at run time (the same code at every
/// size): the plan executor's bits at counts that leave no tail and tails of every length, over
/// one block and several, with a one-element operand loaded once; both 16-bit dtypes and f32.
#[test]
fn pointwise_kernels_reading_their_element_count_at_run_time() {
    if !enabled() {
        return;
    }
    let target = Target::h200();
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        for n in [2usize, 7, 8, 9, 31, 1000, 4099] {
            let mut b = Builder::new();
            let x = b.input(dtype, [n]);
            let s = b.input(dtype, [1]);
            let y = b.input(dtype, [n]);
            let scaled = b.op(Op::Binary { op: braze_ir::BinaryOp::Mul }, &[x, s]);
            let sum = b.op(Op::Binary { op: braze_ir::BinaryOp::Add }, &[scaled, y]);
            let out = b.op(Op::Unary { op: braze_ir::UnaryOp::Tanh }, &[sum]);
            let graph = b.finish(vec![out]);
            let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
            let what = format!("{dtype} [{n}]");
            let config = braze_codegen::any_extent_config(&plan, 0, &target).unwrap_or_else(|| panic!("{what}"));
            let inputs = random_inputs(&graph, 41, |_| false);
            let actual =
                emulator::run_plan(&plan, &[config], &target, &inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
            let modelled = braze_cpu::eval_plan(&plan, &inputs).unwrap();
            assert_eq!(actual[0].to_bytes(), modelled[0].to_bytes(), "{what}: not the plan executor's bits");
            let expected = eval_graph(&graph, &inputs).unwrap();
            compare_outputs(&actual, &expected, None, dtype).unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }
}

/// Eager full reductions, multi-reduce items however short (so one unit serves every size): the
/// reference's values for sums of i32 and bool (as i64), a min of f16, a mean of f32 and a sum of
/// bf16, from one element to more than one segment, and the plan executor's bits where the result
/// is exact (a float sum's order is the kernel's own).
#[test]
fn eager_full_reductions_as_multi_reduce_items() {
    if !enabled() {
        return;
    }
    let target = Target::h200();
    let options = FusionOptions { full_reductions_in_multi_reduce: true, ..FusionOptions::default() };
    let cases = [
        (DType::I32, braze_ir::ReduceOp::Sum),
        (DType::Bool, braze_ir::ReduceOp::Sum),
        (DType::F16, braze_ir::ReduceOp::Min),
        (DType::F32, braze_ir::ReduceOp::Mean),
        (DType::BF16, braze_ir::ReduceOp::Sum),
    ];
    for (dtype, op) in cases {
        for shape in [vec![1], vec![7, 5], vec![1000], vec![20_000]] {
            let mut b = Builder::new();
            let x = b.input(dtype, shape.clone());
            let axes: Vec<usize> = (0..shape.len()).collect();
            let r = b.op(Op::Reduce { op, axes, keepdim: false }, &[x]);
            let graph = b.finish(vec![r]);
            let plan = compile_to_plan(&graph, &options).unwrap();
            let what = format!("{op:?} of {dtype} {shape:?}");
            assert!(plan.kernels.iter().any(|k| k.kind.family() == "multi_reduce"), "{what}:\n{plan}");
            let configs: Vec<KernelConfig> =
                (0..plan.kernels.len()).map(|k| default_config(&plan, k, &target)).collect();
            let inputs = random_inputs(&graph, 43, |_| false);
            let actual =
                emulator::run_plan(&plan, &configs, &target, &inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
            let exact = !dtype.is_float() || matches!(op, braze_ir::ReduceOp::Min | braze_ir::ReduceOp::Max);
            if exact {
                let modelled = braze_cpu::eval_plan(&plan, &inputs).unwrap();
                assert_eq!(actual[0].to_bytes(), modelled[0].to_bytes(), "{what}: not the plan executor's bits");
            }
            let expected = eval_graph(&graph, &inputs).unwrap();
            compare_outputs(&actual, &expected, None, dtype).unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }
}

/// GELU and its derivative on 16-bit values take the narrow helpers (cheaper arithmetic than
/// f32's accuracy needs): over every representable value of a dense grid, out to the tails,
/// each result is the reference's rounded value or its neighbour (or zero below the smallest
/// normal), and nearly all are exact.
#[test]
fn gelu_of_16_bit_values_within_a_unit_of_the_last_place() {
    if !enabled() {
        return;
    }
    let target = Target::h200();
    let xs: Vec<f64> = (-1100..=1100).map(|i| i as f64 / 64.0).chain([-40.0, -16.0, 16.0, 40.0]).collect();
    for dtype in [DType::BF16, DType::F16] {
        let mut b = Builder::new();
        let x = b.input(dtype, [xs.len()]);
        let gelu = b.op(Op::Unary { op: braze_ir::UnaryOp::GeluErf }, &[x]);
        let grad = b.op(Op::Unary { op: braze_ir::UnaryOp::GeluErfGrad }, &[x]);
        let graph = b.finish(vec![gelu, grad]);
        let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
        for (k, kernel) in plan.kernels.iter().enumerate() {
            let source = match braze_codegen::generate(&plan, k, &default_config(&plan, k, &target), &target).unwrap() {
                braze_codegen::KernelCode::Cuda(g) => g.source,
                other => panic!("{}: {other:?}", kernel.name),
            };
            assert!(source.contains("normal_cdf_narrow_f32"), "{dtype}: the narrow helper\n{source}");
        }
        let configs: Vec<KernelConfig> = (0..plan.kernels.len()).map(|k| default_config(&plan, k, &target)).collect();
        let inputs = vec![braze_ir::HostTensor::from_f64(dtype, [xs.len()], &xs).unwrap()];
        let actual = emulator::run_plan(&plan, &configs, &target, &inputs).unwrap_or_else(|e| panic!("{dtype}: {e}"));
        let expected = eval_graph(&graph, &inputs).unwrap();
        // One unit in the last place. Values near the smallest normal may come out as zero: for
        // bf16 (f32's range) where the Gaussian exp(-x^2 / 2) is below f32's normals (|x| past
        // 13.2, results under 1e-36), which `__expf` flushes; for f16 below its smallest normal.
        let (ulp, least_normal) = if dtype == DType::BF16 { (2f64.powi(-7), 1e-36) } else { (2f64.powi(-10), 6.2e-5) };
        for (name, got, want) in [("gelu", &actual[0], &expected[0]), ("gelu_grad", &actual[1], &expected[1])] {
            let (got, want) = (got.to_f64_vec(), want.to_f64_vec());
            let (mut exact, mut judged) = (0, 0);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let tolerance = (ulp * w.abs()).max(least_normal);
                assert!((g - w).abs() <= tolerance, "{dtype} {name}({}): {g} vs {w}", inputs[0].get_f64(i));
                if w.abs() > least_normal {
                    judged += 1;
                    exact += usize::from(g == w);
                }
            }
            assert!(exact * 100 >= judged * 99, "{dtype} {name}: {exact} of {judged} exact");
        }
    }
}

/// Runs `plan` in the emulator with `config` for kernel `row_kernel` (the other kernels at their
/// defaults for the H200) and compares its outputs with `expected`.
fn check_with_row_config(
    what: &str,
    plan: &braze_plan::Plan,
    row_kernel: usize,
    config: KernelConfig,
    inputs: &[braze_ir::HostTensor],
    expected: &[braze_ir::HostTensor],
    dtype: DType,
) {
    let target = Target::h200();
    let configs: Vec<KernelConfig> = (0..plan.kernels.len())
        .map(|k| if k == row_kernel { config } else { default_config(plan, k, &target) })
        .collect();
    let actual = emulator::run_plan(plan, &configs, &target, inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
    compare_outputs(&actual, expected, None, dtype).unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// A row kernel folding column reductions into partials (a centred row stored, column sums of
/// it and of its product with the input, a column max), in every row layout the row family has:
/// a thread a row, a few threads a row with several rows a block (their groups folded through
/// shared memory), a warp, several warps, cached and re-read; rows that the groups of partials
/// divide and rows that they do not; against the reference.
#[test]
fn row_kernel_partials_in_every_row_layout() {
    use braze_ir::{BinaryOp, ReduceOp};
    if !enabled() {
        return;
    }
    // (dtype, rows, cols, [(threads_per_row, rows_per_block, cached)]): narrow rows for the
    // layouts whose threads hold many columns of each partial. The emulator's shuffles wait for
    // every lane of the warp, so where several rows share a warp its groups get as many rows
    // each (100 rows: a last group of 4 rows over 4 row groups of 8 lanes).
    // Rows of several warps several a block (each row's warps at a named barrier of their
    // own): 3 slots over groups of 8 rows walk 3, 3 and 2 rows.
    let few = [(1, 32, false), (4, 8, true), (4, 16, false), (8, 4, true), (64, 4, true), (64, 2, false)];
    let many = [(8, 4, false), (32, 1, true), (64, 1, true), (64, 1, false), (64, 3, true), (128, 2, false)];
    for (dtype, rows, cols, layouts) in
        [(DType::F32, 96, 8, few), (DType::F32, 100, 64, many), (DType::BF16, 72, 48, many), (DType::BF16, 64, 8, few)]
    {
        let mut b = Builder::new();
        let x = b.input(dtype, [rows, cols]);
        let xf = b.cast(x, DType::F32);
        let mean = b.reduce(ReduceOp::Mean, xf, &[1], true);
        let centred = b.bin(BinaryOp::Sub, xf, mean);
        let y = b.cast(centred, dtype);
        let yf = b.cast(y, DType::F32);
        let product = b.mul(xf, yf);
        let sum_y = b.reduce(ReduceOp::Sum, yf, &[0], false);
        let sum_xy = b.reduce(ReduceOp::Sum, product, &[0], false);
        let max_y = b.reduce(ReduceOp::Max, yf, &[0], false);
        let graph = b.finish(vec![y, sum_y, sum_xy, max_y]);
        let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
        let row_kernel = plan
            .kernels
            .iter()
            .position(|k| matches!(&k.kind, braze_plan::KernelKind::Row(row) if !row.partials.is_empty()))
            .unwrap_or_else(|| panic!("{dtype}: no row kernel with partials\n{plan}"));
        let inputs = random_inputs(&graph, 17, |_| false);
        let expected = eval_graph(&graph, &inputs).unwrap();
        for (threads_per_row, rows_per_block, cached) in layouts {
            let what = format!("{dtype} [{rows}, {cols}] tpr={threads_per_row} rpb={rows_per_block} cached={cached}");
            let config = KernelConfig::Row { threads_per_row, rows_per_block, cached };
            check_with_row_config(&what, &plan, row_kernel, config, &inputs, &expected, dtype);
        }
    }
}

/// `(x - mean(x)) / std(x)` over the last axis of `[rows, cols]` `x`, in f32: two dependent
/// reductions, so a row kernel of three passes.
fn normalized_rows(b: &mut Builder, x: NodeId) -> NodeId {
    use braze_ir::{BinaryOp, ReduceOp, UnaryOp};
    let xf = b.cast(x, DType::F32);
    let mean = b.reduce(ReduceOp::Mean, xf, &[1], true);
    let centred = b.bin(BinaryOp::Sub, xf, mean);
    let square = b.mul(centred, centred);
    let var = b.reduce(ReduceOp::Mean, square, &[1], true);
    let std = b.un(UnaryOp::Sqrt, var);
    b.bin(BinaryOp::Div, centred, std)
}

/// The index of `plan`'s first row kernel.
fn first_row_kernel(plan: &braze_plan::Plan, dtype: DType) -> usize {
    plan.kernels
        .iter()
        .position(|k| matches!(&k.kind, braze_plan::KernelKind::Row(_)))
        .unwrap_or_else(|| panic!("{dtype}: no row kernel\n{plan}"))
}

/// Row kernels of several warps a row, several rows a block, without partials: each row's
/// warps combine their reductions at their slot's named barrier, and the block's last rows
/// (7 rows over blocks of 2 and 3) leave slots idle.
#[test]
fn multi_warp_rows_several_a_block() {
    if !enabled() {
        return;
    }
    for dtype in [DType::F32, DType::BF16] {
        let (rows, cols) = (7, 200);
        let mut b = Builder::new();
        let x = b.input(dtype, [rows, cols]);
        let y = normalized_rows(&mut b, x);
        let y = b.cast(y, dtype);
        let graph = b.finish(vec![y]);
        let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
        let row_kernel = first_row_kernel(&plan, dtype);
        let inputs = random_inputs(&graph, 23, |_| false);
        let expected = eval_graph(&graph, &inputs).unwrap();
        for (threads_per_row, rows_per_block, cached) in [(64, 3, true), (64, 2, false), (128, 2, true), (64, 8, true)]
        {
            let what = format!("{dtype} tpr={threads_per_row} rpb={rows_per_block} cached={cached}");
            let config = KernelConfig::Row { threads_per_row, rows_per_block, cached };
            check_with_row_config(&what, &plan, row_kernel, config, &inputs, &expected, dtype);
        }
    }
}

/// A residual added after a layer norm, read only by the last pass, is loaded in the first
/// (raw vectors widened later): rows of 200 bf16 and f32 columns, a warp or half a warp a row,
/// so the last chunk runs past the row for some lanes; against the reference.
#[test]
fn a_residual_loaded_in_the_first_pass_in_the_emulator() {
    use braze_ir::BinaryOp;
    if !enabled() {
        return;
    }
    for dtype in [DType::BF16, DType::F32] {
        let (rows, cols) = (9, 200);
        let mut b = Builder::new();
        let x = b.input(dtype, [rows, cols]);
        let res = b.input(dtype, [rows, cols]);
        let normed = normalized_rows(&mut b, x);
        let resf = b.cast(res, DType::F32);
        let y = b.bin(BinaryOp::Add, normed, resf);
        let y = b.cast(y, dtype);
        let graph = b.finish(vec![y]);
        let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
        let row_kernel = first_row_kernel(&plan, dtype);
        let inputs = random_inputs(&graph, 29, |_| false);
        let expected = eval_graph(&graph, &inputs).unwrap();
        for (threads_per_row, rows_per_block) in [(32, 2), (16, 4)] {
            let what = format!("{dtype} tpr={threads_per_row} rpb={rows_per_block}");
            let config = KernelConfig::Row { threads_per_row, rows_per_block, cached: true };
            let source = match braze_codegen::generate(&plan, row_kernel, &config, &Target::h200()).unwrap() {
                braze_codegen::KernelCode::Cuda(kernel) => kernel.source,
                braze_codegen::KernelCode::CuBlasLt(_) => panic!("{what}: not CUDA C"),
            };
            assert!(source.contains("// loaded now, widened in pass 3"), "{what}: no prefetch\n{source}");
            check_with_row_config(&what, &plan, row_kernel, config, &inputs, &expected, dtype);
        }
    }
}

/// `gelu_tanh` as PyTorch computes it, `0.5 x (1 + tanh(u))`, over a dense grid out to the
/// tails: within a few f32 rounding steps of the reference where it is not tiny (the negative
/// tail, where `1 + tanh(u)` cancels, within 3e-7 absolute, as in PyTorch), and in bf16 the
/// reference's rounded value or its neighbour.
#[test]
fn gelu_tanh_over_a_grid_in_the_emulator() {
    if !enabled() {
        return;
    }
    let target = Target::h200();
    let xs: Vec<f64> = (-1100..=1100).map(|i| i as f64 / 64.0).chain([-40.0, -16.0, 16.0, 40.0, 1e30, -1e30]).collect();
    for dtype in [DType::F32, DType::BF16] {
        let mut b = Builder::new();
        let x = b.input(dtype, [xs.len()]);
        let gelu = b.op(Op::Unary { op: braze_ir::UnaryOp::GeluTanh }, &[x]);
        let graph = b.finish(vec![gelu]);
        let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
        let configs: Vec<KernelConfig> = (0..plan.kernels.len()).map(|k| default_config(&plan, k, &target)).collect();
        let inputs = vec![braze_ir::HostTensor::from_f64(dtype, [xs.len()], &xs).unwrap()];
        let actual = emulator::run_plan(&plan, &configs, &target, &inputs).unwrap_or_else(|e| panic!("{dtype}: {e}"));
        let expected = eval_graph(&graph, &inputs).unwrap();
        let relative = if dtype == DType::BF16 { 2f64.powi(-7) } else { 4.0 * 2f64.powi(-24) };
        let absolute = 3e-7;
        let (got, want) = (actual[0].to_f64_vec(), expected[0].to_f64_vec());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let tolerance = (relative * w.abs()).max(absolute);
            assert!((g - w).abs() <= tolerance, "{dtype} gelu_tanh({}): {g} vs {w}", inputs[0].get_f64(i));
        }
    }
}
