//! Fusion decisions, by kernel count and by plan text snapshots (in `snapshots/plans` at the
//! workspace root; bless with `INSTA_UPDATE=always` or `cargo insta review`). Every plan is also
//! checked for the fusion invariants: each kernel reads each buffer once per distinct view, no
//! graph value is computed twice, and float reductions accumulate in f32.

mod support;

use braze_ir::{AttentionInput, BinaryOp, DType, Graph, NodeId, Op, ReduceOp, UnaryOp};
use braze_passes::{compile_to_plan, optimize, FusionOptions};
use braze_plan::{Body, BufferId, Expr, Kernel, KernelKind, Plan};
use braze_workloads::{graph, multisum_sizes};
use std::collections::HashSet;
use support::*;

fn check(name: &str, graph: Graph, options: FusionOptions, kernels: usize) -> Plan {
    let plan = compile_to_plan(&graph, &options).unwrap_or_else(|e| panic!("{name}: {e}"));
    plan.validate().unwrap_or_else(|e| panic!("{name}: {e}\n{plan}"));
    check_invariants(name, &graph, &plan);
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../../snapshots/plans"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!(name, plan.to_string()));
    assert_eq!(plan.kernel_count(), kernels, "{name}: kernel count\n{plan}");
    plan
}

fn check_invariants(name: &str, graph: &Graph, plan: &Plan) {
    for k in &plan.kernels {
        // A multi-reduce prologue's loads are the current elements of the leaves of whichever item
        // runs it.
        let (bodies, loads_name_slots): (Vec<&Body>, bool) = match &k.kind {
            KernelKind::Pointwise(pw) => (vec![&pw.body], true),
            KernelKind::Row(row) => (vec![&row.body], true),
            KernelKind::MultiReduce(mr) => (mr.reductions.iter().map(|r| &r.prologue).collect(), false),
            KernelKind::Column(col) => (vec![&col.body], true),
            KernelKind::MultiPointwise(multi) => (multi.members.iter().map(|m| &m.body).collect(), true),
            KernelKind::MatMul(_)
            | KernelKind::Concat(_)
            | KernelKind::Attention(_)
            | KernelKind::AttentionBackward(_)
            | KernelKind::IndexAdd(_) => continue,
        };
        for body in bodies {
            let mut views = HashSet::new();
            for v in &body.values {
                if let Expr::Load { input, offset, strides } = &v.expr {
                    // A prologue's slot is the item's leaf.
                    let buffer = if loads_name_slots { Ok(k.inputs[*input]) } else { Err(*input) };
                    let view = (buffer, *offset, strides.clone());
                    assert!(views.insert(view), "{name}: {} reads a view twice", k.name);
                }
                if let Expr::Reduce { x, .. } = &v.expr {
                    let dt = body.values[x.0].dtype;
                    assert!(!dt.is_float() || dt == DType::F32, "{name}: {} reduces {dt} values", k.name);
                }
            }
        }
        if !matches!(k.kind, KernelKind::MultiReduce(_)) {
            let distinct: HashSet<_> = k.inputs.iter().collect();
            assert_eq!(distinct.len(), k.inputs.len(), "{name}: {} binds a buffer to two slots", k.name);
        }
    }
    // Each computing op of the optimized graph is in exactly one kernel's sources.
    let optimized = optimize(graph).unwrap();
    let computes = |op: &str| !matches!(op, "input" | "const" | "reshape" | "broadcast_to" | "permute" | "slice");
    let in_graph = optimized.node_ids().into_iter().filter(|&id| computes(optimized.node(id).op.name())).count();
    let in_plan: usize = plan
        .kernels
        .iter()
        .flat_map(|k| &k.sources)
        .filter(|s| computes(s.op.rsplit('/').next().unwrap_or(&s.op)))
        .count();
    assert_eq!(in_plan, in_graph, "{name}: ops in kernels vs ops in the graph\n{plan}");
}

fn defaults() -> FusionOptions {
    FusionOptions::default()
}

#[test]
fn ln_relu_res_is_one_kernel() {
    check("ln_relu_res_f32_16384x4096", graph::ln_relu_res(DType::F32, 16384, 4096).unwrap(), defaults(), 1);
    check("ln_relu_res_bf16_16384x4096", graph::ln_relu_res(DType::BF16, 16384, 4096).unwrap(), defaults(), 1);
    check("ln_relu_res_f32_65536x1024", graph::ln_relu_res(DType::F32, 65536, 1024).unwrap(), defaults(), 1);
}

#[test]
fn ew_chain_is_one_kernel() {
    check("ew_chain", graph::ew_chain(DType::F32, &[1 << 26]).unwrap(), defaults(), 1);
}

#[test]
fn multisum_is_one_kernel() {
    check(
        "multisum_k2000",
        graph::multisum(DType::F32, &multisum_sizes(2000, 1000, 300_000, 0)).unwrap(),
        defaults(),
        1,
    );
    check("multisum_k5", graph::multisum(DType::F32, &[1000, 2000, 300000, 45, 7]).unwrap(), defaults(), 1);
}

#[test]
fn tiny_block_is_one_kernel_while_rows_fit() {
    check("tiny_block_16x64x256", graph::tiny_block(DType::F32, 16, 64, 256).unwrap(), defaults(), 1);
    check("tiny_block_16x64x65536", graph::tiny_block(DType::F32, 16, 64, 65536).unwrap(), defaults(), 16);
}

#[test]
fn mlp_block_is_matmul_pointwise_matmul_row() {
    check("mlp_block_bf16", graph::mlp_block(DType::BF16, 8192, 1024, 4096).unwrap(), defaults(), 4);
}

#[test]
fn softmax_is_one_kernel() {
    check("softmax", softmax(4096, 1024, 1), defaults(), 1);
}

#[test]
fn log_softmax_is_one_row_kernel_with_or_without_its_backward() {
    let mut g = Graph::new();
    let x = g.input(DType::BF16, [512, 50_257]);
    let y = op(&mut g, Op::LogSoftmax { axis: 1 }, &[x]);
    g.set_outputs(vec![y]);
    check("log_softmax_bf16", g.clone(), defaults(), 1);
    let seed = g.input(DType::BF16, [512, 50_257]);
    let grads = braze_autodiff::backward(&mut g, &[(y, seed)], &[x]).unwrap();
    g.set_outputs(vec![y, grads[0].unwrap()]);
    // The backward's sum of the incoming gradient and exp(y) join the forward's row kernel.
    check("log_softmax_bf16_backward", g, defaults(), 1);
}

#[test]
fn cross_entropy_is_a_row_kernel_and_a_mean_and_its_backward_one_pass() {
    let mut g = Graph::new();
    let logits = g.input(DType::BF16, [64, 50_304]);
    let targets = g.input(DType::I64, [64]);
    let classes = g.input(DType::I64, [50_304]);
    let loss = op(&mut g, Op::CrossEntropy { ignore_index: -100 }, &[logits, targets, classes]);
    g.set_outputs(vec![loss]);
    check("cross_entropy_bf16", g.clone(), defaults(), 2);
    let one = g.constant(1.0, DType::BF16);
    let grads = braze_autodiff::backward(&mut g, &[(loss, one)], &[logits]).unwrap();
    g.set_outputs(vec![loss, grads[0].unwrap()]);
    check("cross_entropy_bf16_backward", g, defaults(), 3);
}

/// i32 classes beside i64 targets (what the frontend passes): the targets are narrowed once per
/// row in a kernel over the targets, and the row kernels read 4-byte classes beside the logits.
#[test]
fn cross_entropy_with_i32_classes_narrows_the_targets_per_row() {
    let mut g = Graph::new();
    let logits = g.input(DType::BF16, [64, 50_304]);
    let targets = g.input(DType::I64, [64]);
    let classes = g.input(DType::I32, [50_304]);
    let loss = op(&mut g, Op::CrossEntropy { ignore_index: -100 }, &[logits, targets, classes]);
    let one = g.constant(1.0, DType::BF16);
    let grads = braze_autodiff::backward(&mut g, &[(loss, one)], &[logits]).unwrap();
    g.set_outputs(vec![loss, grads[0].unwrap()]);
    let plan = check("cross_entropy_i32_classes_backward", g, defaults(), 4);
    let wide_rows: Vec<_> = plan.kernels.iter().filter(|k| k.name.starts_with("row_")).collect();
    assert!(!wide_rows.is_empty());
    for kernel in wide_rows {
        for &b in &kernel.inputs {
            let buffer = plan.buffer(b);
            assert!(buffer.dtype != DType::I64 || buffer.numel == 64, "{}: reads {buffer:?}", kernel.name);
        }
    }
}

#[test]
fn broadcast_chain_is_one_pointwise_kernel() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [64, 32, 256]);
    let a = g.input(DType::F32, [256]);
    let b = g.input(DType::F32, [32, 1]);
    let s = g.input(DType::F32, []);
    let half = g.constant(0.5, DType::F32);
    let xa = mul(&mut g, x, a);
    let bs = mul(&mut g, b, s);
    let y = add(&mut g, xa, bs);
    let y = mul(&mut g, y, half);
    g.set_outputs(vec![y]);
    check("broadcast_chain", g, defaults(), 1);
}

#[test]
fn two_results_used_outside_are_two_stores_of_one_kernel() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [1024, 1024]);
    let y = g.input(DType::F32, [1024, 1024]);
    let a = add(&mut g, x, y);
    let b = mul(&mut g, a, a);
    let r = un(&mut g, UnaryOp::Tanh, b);
    g.set_outputs(vec![a, r]);
    check("multi_output_pointwise", g, defaults(), 1);
}

#[test]
fn reduction_over_axis_0_is_a_column_kernel() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [4096, 512]);
    let s = op(&mut g, Op::Reduce { op: ReduceOp::Max, axes: vec![0], keepdim: true }, &[x]);
    g.set_outputs(vec![s]);
    check("reduce_axis_0", g.clone(), defaults(), 1);
    let plan = compile_to_plan(&g, &defaults()).unwrap();
    assert_eq!(plan.kernels[0].kind.family(), "column");
}

/// The family of each kernel of `graph`'s plan.
fn families(graph: &Graph) -> Vec<&'static str> {
    let plan = compile_to_plan(graph, &defaults()).unwrap();
    plan.validate().unwrap();
    check_invariants("families", graph, &plan);
    plan.kernels.iter().map(|k| k.kind.family()).collect()
}

#[test]
fn only_leading_axes_with_contiguous_kept_axes_make_column_kernels() {
    let reduce = |shape: &[usize], axes: &[usize]| {
        let mut g = Graph::new();
        let x = g.input(DType::F32, shape.to_vec());
        let s = sum(&mut g, x, axes, false);
        g.set_outputs(vec![s]);
        families(&g)
    };
    assert_eq!(reduce(&[64, 32], &[0]), ["column"]);
    assert_eq!(reduce(&[8, 16, 32], &[0, 1]), ["column"]);
    // Unit dims do not count: [1, 64, 32] over axis 1 still reads rows of 32 contiguous columns.
    assert_eq!(reduce(&[1, 64, 32], &[1]), ["column"]);
    // Trailing, middle and all axes stay with the row family.
    assert_eq!(reduce(&[64, 32], &[1]), ["row"]);
    assert_eq!(reduce(&[8, 16, 32], &[1]), ["row"]);
    assert_eq!(reduce(&[8, 16, 32], &[0, 2]), ["row"]);
    assert_eq!(reduce(&[64, 32], &[0, 1]), ["row"]);
    // Reducing only unit dims, or keeping only unit dims, is no column reduction.
    assert_eq!(reduce(&[1, 32], &[0]), ["row"]);
    assert_eq!(reduce(&[64, 1], &[0]), ["row"]);
}

#[test]
fn weight_and_bias_grads_share_one_column_kernel_with_their_prologue() {
    // d_weight = sum(dy * xhat, 0) and d_bias = sum(dy, 0), with dy = a + b computed elsewhere.
    let mut g = Graph::new();
    let a = g.input(DType::F32, [256, 48]);
    let b = g.input(DType::F32, [256, 48]);
    let xhat = g.input(DType::F32, [256, 48]);
    let dy = add(&mut g, a, b);
    let t = un(&mut g, UnaryOp::Tanh, dy);
    let prod = mul(&mut g, dy, xhat);
    let dw = sum(&mut g, prod, &[0], false);
    let db = sum(&mut g, dy, &[0], false);
    let scaled = mul(&mut g, db, db);
    g.set_outputs(vec![t, dw, scaled]);
    let plan = compile_to_plan(&g, &defaults()).unwrap();
    let kinds: Vec<&str> = plan.kernels.iter().map(|k| k.kind.family()).collect();
    assert_eq!(kinds, ["pointwise", "column"], "{plan}");
    let column = &plan.kernels[1];
    // Reads dy (the pointwise kernel's output) and xhat; the product is its prologue, the
    // square of d_bias its epilogue; two stores.
    assert_eq!(column.inputs.len(), 2, "{plan}");
    assert_eq!(column.outputs.len(), 2, "{plan}");
    let KernelKind::Column(body) = &column.kind else { unreachable!() };
    let reductions = body.body.values.iter().filter(|v| matches!(v.expr, Expr::Reduce { .. })).count();
    assert_eq!(reductions, 2, "{plan}");
    check_invariants("weight_and_bias_grads", &g, &plan);
}

#[test]
fn a_value_also_needed_elsewhere_is_read_from_its_kernel_not_recomputed() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [300, 20]);
    let e = un(&mut g, UnaryOp::Exp, x);
    let s = sum(&mut g, e, &[0], true);
    g.set_outputs(vec![e, s]);
    // The kernel storing `e` folds its column sums too (as a row kernel without reductions), and
    // the column kernel reduces those partials.
    assert_eq!(families(&g), ["row", "column"]);
}

#[test]
fn permute_and_slice_fold_into_loads() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [32, 64, 128]);
    let y = g.input(DType::F32, [128, 32, 256]);
    let p = op(&mut g, Op::Permute { perm: vec![2, 0, 1] }, &[x]);
    let r = un(&mut g, UnaryOp::Relu, p);
    let s = op(&mut g, Op::Slice { axis: 2, start: 1, end: 129, step: 2 }, &[y]);
    let z = add(&mut g, r, s);
    g.set_outputs(vec![z]);
    check("permute_slice_loads", g, defaults(), 1);
}

#[test]
fn concat_is_its_own_kernel() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [256, 64]);
    let y = g.input(DType::F32, [128, 64]);
    let r = un(&mut g, UnaryOp::Relu, x);
    let c = op(&mut g, Op::Concat { axis: 0 }, &[r, y]);
    g.set_outputs(vec![c]);
    check("concat", g, defaults(), 2);
}

#[test]
fn reshaped_input_as_output_needs_no_kernel() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [64, 256]);
    let r = g.reshape(x, [16, 4, 256]).unwrap();
    g.set_outputs(vec![r]);
    check("output_reshape_of_input", g, defaults(), 0);
}

/// An arange is computed in a pointwise kernel over its own shape: with the elementwise ops of
/// that shape it is one kernel (its values never stored), broadcast into a larger one or into a
/// reduction it is stored once and read like a buffer (a second kernel).
#[test]
fn aranges_compute_in_pointwise_kernels_of_their_own_shape() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [256]);
    let ids = g.arange(256, DType::F32).unwrap();
    let scaled = mul(&mut g, ids, x);
    let y = un(&mut g, UnaryOp::Exp, scaled);
    g.set_outputs(vec![y]);
    let plan = check("arange_fused", g, defaults(), 1);
    let KernelKind::Pointwise(pw) = &plan.kernels[0].kind else { panic!("a pointwise kernel\n{plan}") };
    assert!(pw.body.values.iter().any(|v| v.expr == Expr::Index), "{plan}");
    assert_eq!(plan.kernels[0].inputs.len(), 1, "only x is read\n{plan}");

    let mut g = Graph::new();
    let x = g.input(DType::F32, [64, 256]);
    let ids = g.arange(256, DType::F32).unwrap();
    let grid = g.broadcast_to(ids, [64, 256]).unwrap();
    let y = add(&mut g, x, grid);
    let weighted = mul(&mut g, ids, ids);
    let total = sum(&mut g, weighted, &[0], false);
    g.set_outputs(vec![y, total]);
    check("arange_broadcast_and_reduced", g, defaults(), 3);
}

#[test]
fn unfused_plans_have_one_kernel_per_op() {
    let options = FusionOptions { fuse: false, ..defaults() };
    check("ln_relu_res_unfused", graph::ln_relu_res(DType::F32, 64, 256).unwrap(), options, 20);
}

#[test]
fn full_reduction_of_a_large_tensor_is_one_multi_reduce_item() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [4096, 4096]);
    let sq = mul(&mut g, x, x);
    let s = sum(&mut g, sq, &[0, 1], false);
    g.set_outputs(vec![s]);
    check("full_reduction_squared", g, defaults(), 1);
}

#[test]
fn squared_norms_as_concat_of_reshaped_scalars_are_one_kernel() {
    let mut g = Graph::new();
    let parts: Vec<_> = [4096usize, 100, 70000]
        .iter()
        .map(|&n| {
            let t = g.input(DType::BF16, [n]);
            let sq = mul(&mut g, t, t);
            let s = sum(&mut g, sq, &[0], false);
            g.reshape(s, [1]).unwrap()
        })
        .collect();
    let y = op(&mut g, Op::Concat { axis: 0 }, &parts);
    g.set_outputs(vec![y]);
    check("multi_reduce_squared_norms_bf16", g, defaults(), 1);
}

#[test]
fn matmul_reads_transposes_in_place_and_folds_bias_and_relu() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [512, 256]);
    let w = g.input(DType::F32, [1024, 256]);
    let b = g.input(DType::F32, [1024]);
    let wt = op(&mut g, Op::Permute { perm: vec![1, 0] }, &[w]);
    let mm = op(&mut g, Op::MatMul, &[x, wt]);
    let biased = add(&mut g, b, mm);
    let y = un(&mut g, UnaryOp::Relu, biased);
    g.set_outputs(vec![y]);
    check("matmul_transposed_bias_relu", g, defaults(), 1);
}

#[test]
fn no_fusion_across_a_cycle_through_a_view() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [256, 256]);
    let y = un(&mut g, UnaryOp::Exp, x);
    let t = op(&mut g, Op::Permute { perm: vec![1, 0] }, &[y]);
    let z = add(&mut g, y, t);
    g.set_outputs(vec![z]);
    check("cycle_through_view", g, defaults(), 2);
}

#[test]
fn independent_chains_are_one_multi_pointwise_launch() {
    check("independent_chains", independent_chains(), defaults(), 1);
    // Each member is the pointwise kernel the chain was: grouping off, five kernels (the first
    // and last chains read `a` and share one).
    let ungrouped = FusionOptions { multi_pointwise_limit: 0, ..defaults() };
    check("independent_chains_ungrouped", independent_chains(), ungrouped, 5);
    // Above the limit a kernel keeps its own launch (the two chains reading `a` share one); the
    // rest are still grouped.
    let limited = FusionOptions { multi_pointwise_limit: 34, ..defaults() };
    check("independent_chains_limited", independent_chains(), limited, 2);
}

#[test]
fn grouping_never_merges_kernels_with_a_path_between_them() {
    // exp(x) feeds a matmul whose result scales y: the two pointwise kernels (exp's and the
    // scaling) have a path between them through the matmul, so they stay apart; an independent
    // third chain joins the scaling, whose height it shares.
    let mut g = Graph::new();
    let x = g.input(DType::F32, [4, 8]);
    let w = g.input(DType::F32, [8, 8]);
    let y = g.input(DType::F32, [4, 8]);
    let z = g.input(DType::F32, [9]);
    let e = un(&mut g, UnaryOp::Exp, x);
    let n = un(&mut g, UnaryOp::Neg, e);
    let m = op(&mut g, Op::MatMul, &[e, w]);
    let scaled = mul(&mut g, y, m);
    let root = un(&mut g, UnaryOp::Sqrt, z);
    g.set_outputs(vec![n, scaled, root]);
    let plan = compile_to_plan(&g, &defaults()).unwrap();
    check("grouping_respects_paths", g, defaults(), 3);
    let families: Vec<&str> = plan.kernels.iter().map(|k| k.kind.family()).collect();
    assert_eq!(families, ["pointwise", "matmul", "multi_pointwise"], "{plan}");
}

#[test]
fn plans_round_trip_through_json() {
    let plan = compile_to_plan(&graph::mlp_block(DType::BF16, 64, 32, 128).unwrap(), &defaults()).unwrap();
    let back = Plan::from_json(&plan.to_json()).unwrap();
    assert_eq!(back, plan);
}

#[test]
fn column_kernels_never_reduce_their_own_results_or_store_element_values() {
    // softmax over axis 0, then a reduction of it over the same axis: the second reduction reads
    // the first's result, so the two column kernels stay apart (found by the fuzzer).
    for (dtype, rows, cols) in [(DType::BF16, 5, 33), (DType::F32, 3, 0)] {
        let mut g = Graph::new();
        let x = g.input(dtype, [rows, cols]);
        let y = op(&mut g, Op::Softmax { axis: 0 }, &[x]);
        let m = op(&mut g, Op::Reduce { op: ReduceOp::Mean, axes: vec![0], keepdim: true }, &[y]);
        g.set_outputs(vec![m]);
        assert!(families(&g).iter().filter(|&&f| f == "column").count() >= 2);
    }
    // A value one column reduction reads directly is placed before the product another reduces:
    // the product cannot become a prologue that would have to store the value for the first.
    let mut g = Graph::new();
    let x = g.input(DType::F32, [40, 8]);
    let y = g.input(DType::F32, [40, 8]);
    let c = un(&mut g, UnaryOp::Exp, x);
    let first = sum(&mut g, c, &[0], false);
    let prod = mul(&mut g, c, y);
    let second = sum(&mut g, prod, &[0], false);
    g.set_outputs(vec![first, second]);
    assert!(families(&g).contains(&"column"));
}

// ---- independent full reductions, whatever reads their results --------------------------------

/// Gradient-like inputs of twelve sizes: some a warp reduces whole, some chunked across blocks.
fn grads(g: &mut Graph, dtype: DType) -> Vec<NodeId> {
    GRAD_SIZES.iter().map(|&n| g.input(dtype, [n])).collect()
}

const GRAD_SIZES: [usize; 12] = [300, 40_000, 7, 1_024, 20_000, 1, 513, 64, 5_000, 128, 33, 90_000];

fn sum_of_squares(g: &mut Graph, x: NodeId) -> NodeId {
    let sq = mul(g, x, x);
    sum(g, sq, &[0], false)
}

fn reduce_all(g: &mut Graph, op: ReduceOp, x: NodeId) -> NodeId {
    let rank = g.node(x).shape.rank();
    braze_ir::Graph::add(g, Op::Reduce { op, axes: (0..rank).collect(), keepdim: false }, &[x], None).unwrap()
}

/// `stack(xs)` as traced: each scalar reshaped to `[1]`, then concatenated.
fn stack(g: &mut Graph, xs: &[NodeId]) -> NodeId {
    let parts: Vec<NodeId> = xs.iter().map(|&x| g.reshape(x, [1]).unwrap()).collect();
    op(g, Op::Concat { axis: 0 }, &parts)
}

/// The one multi-reduce kernel of `plan`, with its item and reduction counts checked.
fn the_multi_reduce(plan: &Plan, items: usize, reductions: usize) -> &braze_plan::MultiReduce {
    let found: Vec<&braze_plan::MultiReduce> = plan
        .kernels
        .iter()
        .filter_map(|k| match &k.kind {
            KernelKind::MultiReduce(mr) => Some(mr),
            _ => None,
        })
        .collect();
    assert_eq!(found.len(), 1, "one multi-reduce\n{plan}");
    assert_eq!(found[0].items.len(), items, "items\n{plan}");
    assert_eq!(found[0].reductions.len(), reductions, "distinct item programs\n{plan}");
    found[0]
}

fn plan_of(g: &Graph) -> Plan {
    compile_to_plan(g, &defaults()).unwrap()
}

#[test]
fn stacked_sums_and_maxes_with_different_prologues_are_one_kernel() {
    let mut g = Graph::new();
    let xs = grads(&mut g, DType::F32);
    let results: Vec<NodeId> = xs
        .iter()
        .enumerate()
        .map(|(i, &x)| match i % 3 {
            0 => sum_of_squares(&mut g, x),
            1 => {
                let a = un(&mut g, UnaryOp::Abs, x);
                reduce_all(&mut g, ReduceOp::Max, a)
            }
            _ => reduce_all(&mut g, ReduceOp::Sum, x),
        })
        .collect();
    let y = stack(&mut g, &results);
    g.set_outputs(vec![y]);
    let plan = plan_of(&g);
    let mr = the_multi_reduce(&plan, 12, 3);
    assert!(mr.epilogue.values.iter().all(|v| matches!(v.expr, Expr::Load { .. })), "a stack computes nothing");
    check("multi_reduce_stack_sum_max", g, defaults(), 1);
}

#[test]
fn sums_folded_with_adds_are_one_kernel_with_the_adds_in_its_epilogue() {
    // The global gradient norm as usually written: sum of squares per gradient, folded with add.
    let mut g = Graph::new();
    let xs = grads(&mut g, DType::F32);
    let mut total = sum_of_squares(&mut g, xs[0]);
    for &x in &xs[1..] {
        let s = sum_of_squares(&mut g, x);
        total = add(&mut g, total, s);
    }
    let norm = un(&mut g, UnaryOp::Sqrt, total);
    g.set_outputs(vec![norm]);
    let plan = plan_of(&g);
    let mr = the_multi_reduce(&plan, 12, 1);
    assert_eq!(mr.stores.len(), 1, "only the norm leaves the kernel\n{plan}");
    check("multi_reduce_add_chain_sqrt", g, defaults(), 1);
}

#[test]
fn sums_returned_as_separate_outputs_are_one_kernel() {
    let mut g = Graph::new();
    let xs = grads(&mut g, DType::F32);
    let sums: Vec<NodeId> = xs.iter().map(|&x| sum_of_squares(&mut g, x)).collect();
    g.set_outputs(sums);
    let plan = plan_of(&g);
    assert_eq!(plan.outputs.len(), 12);
    the_multi_reduce(&plan, 12, 1);
    check("multi_reduce_separate_outputs", g, defaults(), 1);
}

#[test]
fn sums_each_scaled_are_one_kernel() {
    let mut g = Graph::new();
    let xs = grads(&mut g, DType::F32);
    let scaled: Vec<NodeId> = xs
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let s = sum_of_squares(&mut g, x);
            let c = g.constant(0.5 + i as f64, DType::F32);
            mul(&mut g, s, c)
        })
        .collect();
    g.set_outputs(scaled);
    let plan = plan_of(&g);
    let mr = the_multi_reduce(&plan, 12, 1);
    assert_eq!(mr.stores.len(), 12);
    check("multi_reduce_scaled_outputs", g, defaults(), 1);
}

#[test]
fn non_finite_checks_folded_with_or_are_one_kernel() {
    // `any_non_finite` of an optimizer step: per gradient `isfinite().logical_not().max_all()`.
    let mut g = Graph::new();
    let mut xs = grads(&mut g, DType::F32);
    xs.extend((0..3).map(|i| g.input(DType::BF16, [17 + 1000 * i])));
    let mut found: Option<NodeId> = None;
    for &x in &xs {
        let finite = un(&mut g, UnaryOp::IsFinite, x);
        let bad = un(&mut g, UnaryOp::Not, finite);
        let any = reduce_all(&mut g, ReduceOp::Max, bad);
        found = Some(match found {
            Some(f) => bin(&mut g, BinaryOp::Or, f, any),
            None => any,
        });
    }
    g.set_outputs(vec![found.unwrap()]);
    let plan = plan_of(&g);
    // One program per input dtype: the prologue loads the element as its dtype.
    the_multi_reduce(&plan, 15, 2);
    check("multi_reduce_any_non_finite", g, defaults(), 1);
}

#[test]
fn sums_and_maxes_of_mixed_dtypes_feed_one_epilogue() {
    // sum(cast(g)^2) of bf16 and f32 gradients and the largest |g|, combined into scalars.
    let mut g = Graph::new();
    let a = g.input(DType::BF16, [3000]);
    let b = g.input(DType::F32, [50_000]);
    let c = g.input(DType::F32, [77]);
    let a32 = g.cast(a, DType::F32).unwrap();
    let sa = sum_of_squares(&mut g, a32);
    let sb = sum_of_squares(&mut g, b);
    let abs_c = un(&mut g, UnaryOp::Abs, c);
    let mc = reduce_all(&mut g, ReduceOp::Max, abs_c);
    let total = add(&mut g, sa, sb);
    let ratio = bin(&mut g, BinaryOp::Div, mc, total);
    g.set_outputs(vec![total, ratio, mc]);
    let plan = plan_of(&g);
    let mr = the_multi_reduce(&plan, 3, 3);
    assert_eq!(mr.stores.len(), 3);
    check("multi_reduce_mixed_sum_max", g, defaults(), 1);
}

#[test]
fn reductions_with_prologues_over_several_tensors_are_one_kernel() {
    // A loss-like sum((p - q)^2) per pair, a dot product per pair, folded with adds; each item
    // reads its two leaves element by element.
    let mut g = Graph::new();
    let ps = grads(&mut g, DType::F32);
    let qs = grads(&mut g, DType::F32);
    let mut total: Option<NodeId> = None;
    for (i, (&p, &q)) in ps.iter().zip(&qs).enumerate() {
        let r = if i % 2 == 0 {
            let d = bin(&mut g, BinaryOp::Sub, p, q);
            sum_of_squares(&mut g, d)
        } else {
            let pq = mul(&mut g, p, q);
            reduce_all(&mut g, ReduceOp::Sum, pq)
        };
        total = Some(match total {
            Some(t) => add(&mut g, t, r),
            None => r,
        });
    }
    g.set_outputs(vec![total.unwrap()]);
    let plan = plan_of(&g);
    let mr = the_multi_reduce(&plan, 12, 2);
    assert!(mr.reductions.iter().all(|r| r.leaves == 2), "{plan}");
    assert_eq!(plan.kernels[0].inputs.len(), 24, "two leaves per item\n{plan}");
    check("multi_reduce_two_leaf_prologues", g, defaults(), 1);
}

#[test]
fn a_transposed_leaf_is_not_read_side_by_side_with_another() {
    // sum(t(a) * b): a's buffer holds its elements in another order than b's, so the two cannot
    // be read element by element side by side: the product is stored and reduced as a plain
    // item, beside sum(b * c), whose leaves are.
    let mut g = Graph::new();
    let a = g.input(DType::F32, [300, 200]);
    let b = g.input(DType::F32, [200, 300]);
    let c = g.input(DType::F32, [200, 300]);
    let at = op(&mut g, Op::Permute { perm: vec![1, 0] }, &[a]);
    let atb = mul(&mut g, at, b);
    let s1 = reduce_all(&mut g, ReduceOp::Sum, atb);
    let bc = mul(&mut g, b, c);
    let s2 = reduce_all(&mut g, ReduceOp::Sum, bc);
    g.set_outputs(vec![s1, s2]);
    let plan = plan_of(&g);
    let mr = the_multi_reduce(&plan, 2, 2);
    let leaves: Vec<usize> = mr.reductions.iter().map(|r| r.leaves).collect();
    assert_eq!(leaves, vec![1, 2], "t(a) * b stored, b * c read side by side\n{plan}");
    assert_eq!(plan.kernels[0].kind.family(), "pointwise", "{plan}");
    check("multi_reduce_transposed_leaf_apart", g, defaults(), 2);
}

#[test]
fn a_reduction_of_another_reductions_result_gets_a_kernel_after_it() {
    // sum(x * sum(y)) depends on sum(y): the two cannot share a launch. (Prologues and
    // epilogues read no other kernel's values: `x * s` gets a pointwise kernel, and so does the
    // add of results from two launches.)
    let mut g = Graph::new();
    let x = g.input(DType::F32, [40_000]);
    let y = g.input(DType::F32, [30_000]);
    let z = g.input(DType::F32, [20_000]);
    let sy = sum_of_squares(&mut g, y);
    let sz = sum_of_squares(&mut g, z);
    let xs = mul(&mut g, x, sy);
    let sx = reduce_all(&mut g, ReduceOp::Sum, xs);
    let out = add(&mut g, sx, sz);
    g.set_outputs(vec![out]);
    let plan = plan_of(&g);
    let items: Vec<usize> = plan
        .kernels
        .iter()
        .filter_map(|k| match &k.kind {
            KernelKind::MultiReduce(mr) => Some(mr.items.len()),
            _ => None,
        })
        .collect();
    assert_eq!(items, vec![2, 1], "sum(y^2) and sum(z^2) together, then sum(x * s)\n{plan}");
    check("multi_reduce_dependent_levels", g, defaults(), 4);
}

#[test]
fn a_widened_bf16_intermediate_is_stored_narrow() {
    // `c = f32(x + y)` feeds a row kernel and a column sum: the row kernel stores the bf16 sum,
    // not its f32 widening, and the column kernel widens it as it loads it.
    let mut g = Graph::new();
    let x = g.input(DType::BF16, [256, 64]);
    let y = g.input(DType::BF16, [256, 64]);
    let s = add(&mut g, x, y);
    let c = g.cast(s, DType::F32).unwrap();
    let rows = sum(&mut g, c, &[1], true);
    let centred = bin(&mut g, BinaryOp::Sub, c, rows);
    let squares = mul(&mut g, centred, centred);
    let spread = sum(&mut g, squares, &[1], false);
    let columns = sum(&mut g, c, &[0], false);
    g.set_outputs(vec![spread, columns]);
    // Column partials would fold the column sum into the row kernel, which then stores no sum.
    let options = FusionOptions { column_partials: false, ..defaults() };
    let plan = compile_to_plan(&g, &options).unwrap();
    let column = plan.kernels.iter().find(|k| matches!(k.kind, KernelKind::Column(_))).expect("a column kernel");
    let read = plan.buffer(column.inputs[0]);
    assert_eq!(read.dtype, DType::BF16, "{plan}");
    check("widened_intermediate_stored_narrow", g, options, 2);
}

#[test]
fn column_sums_of_a_row_kernels_values_fold_into_its_partials() {
    // A row kernel centres each row (`y = x - mean(x)`); the column sums of `y` (which it
    // stores) and of `x * y` (which it could compute) read rows it reads or writes, so it folds
    // them over groups of 8 rows, and the column kernel reduces its 32 x 64 partials.
    let mut g = Graph::new();
    let x = g.input(DType::F32, [256, 64]);
    let mean = op(&mut g, Op::Reduce { op: ReduceOp::Mean, axes: vec![1], keepdim: true }, &[x]);
    let y = bin(&mut g, BinaryOp::Sub, x, mean);
    let xy = mul(&mut g, x, y);
    let sum_y = sum(&mut g, y, &[0], false);
    let sum_xy = sum(&mut g, xy, &[0], false);
    g.set_outputs(vec![y, sum_y, sum_xy]);
    let plan = check("column_partials_of_a_row_kernel", g.clone(), defaults(), 2);
    let KernelKind::Row(row) = &plan.kernels[0].kind else { panic!("a row kernel first\n{plan}") };
    assert_eq!((row.partials.len(), row.partial_rows, row.partial_groups()), (2, 8, 32), "{plan}");
    let KernelKind::Column(col) = &plan.kernels[1].kind else { panic!("a column kernel second\n{plan}") };
    assert_eq!((col.rows(), col.cols()), (32, 64), "{plan}");
    // The column kernel reads the partials alone: the rows cross memory once.
    assert!(plan.kernels[1].inputs.iter().all(|&b| plan.buffer(b).numel == 32 * 64), "{plan}");
    let unfolded = compile_to_plan(&g, &FusionOptions { column_partials: false, ..defaults() }).unwrap();
    let KernelKind::Column(col) = &unfolded.kernels[1].kind else { panic!("{unfolded}") };
    assert_eq!(col.rows(), 256, "{unfolded}");
    assert!(unfolded.bytes_moved() > plan.bytes_moved() + 256 * 64 * 4, "{unfolded}\n{plan}");
}

#[test]
fn a_value_stored_only_for_a_folded_column_kernel_is_no_longer_stored() {
    // The row kernel stored `y` only for the column sum; folded, it stores only the row spread.
    let mut g = Graph::new();
    let x = g.input(DType::F32, [128, 32]);
    let mean = op(&mut g, Op::Reduce { op: ReduceOp::Mean, axes: vec![1], keepdim: true }, &[x]);
    let y = bin(&mut g, BinaryOp::Sub, x, mean);
    let squares = mul(&mut g, y, y);
    let spread = sum(&mut g, squares, &[1], false);
    let sum_y = sum(&mut g, y, &[0], false);
    g.set_outputs(vec![spread, sum_y]);
    let plan = check("column_partials_drop_an_unread_store", g, defaults(), 2);
    let row = &plan.kernels[0];
    assert_eq!(row.outputs.len(), 2, "the spread and one partial\n{plan}");
    assert!(row.outputs.iter().all(|&b| plan.buffer(b).numel == 128 || plan.buffer(b).numel == 16 * 32), "{plan}");
}

/// `attention(q, k, v)` of `[B, H, T, D]` f32 operands and, when `lse`, its logsumexp.
fn attention_graph(q_from_rows: bool, lse: bool) -> (Graph, Vec<NodeId>) {
    let mut g = Graph::new();
    let shape = [2, 3, 5, 8];
    let q = if q_from_rows {
        // q as a projection gives it: [B, T, H, D] seen as [B, H, T, D] (not contiguous).
        let rows = g.input(DType::F32, [2, 5, 3, 8]);
        op(&mut g, Op::Permute { perm: vec![0, 2, 1, 3] }, &[rows])
    } else {
        g.input(DType::F32, shape)
    };
    let k = g.input(DType::F32, shape);
    let v = g.input(DType::F32, shape);
    let out = op(&mut g, Op::Attention { causal: true, scale: 0.3 }, &[q, k, v]);
    let mut outputs = vec![out];
    if lse {
        outputs.push(op(&mut g, Op::AttentionLse { causal: true, scale: 0.3 }, &[q, k]));
    }
    (g, outputs)
}

#[test]
fn attention_and_its_lse_share_one_kernel() {
    let (mut g, outputs) = attention_graph(false, true);
    g.set_outputs(outputs);
    check("attention_with_lse", g.clone(), FusionOptions::default(), 1);
    // Unfused, each op is a kernel of its own.
    let unfused = compile_to_plan(&g, &FusionOptions { fuse: false, ..FusionOptions::default() }).unwrap();
    assert_eq!(unfused.kernel_count(), 2, "{unfused}");
}

/// A `[B, T, H, D]` query seen as `[B, H, T, D]` is read where it lies (rows at a stride of
/// H D); one whose rows do not start on 16 bytes (head dim 6) gets a copy of its own.
#[test]
fn a_permuted_attention_operand_is_read_in_place_where_its_rows_align() {
    let (mut g, outputs) = attention_graph(true, true);
    g.set_outputs(outputs);
    let plan = check("attention_permuted_query", g, FusionOptions::default(), 1);
    let KernelKind::Attention(att) = &plan.kernels[0].kind else { panic!("{plan}") };
    let strided = braze_plan::OperandLayout { offset: 0, batch_stride: 120, head_stride: 8, row_stride: 24 };
    assert_eq!(att.input_layouts[0], strided, "{plan}");

    let mut g = Graph::new();
    let rows = g.input(DType::F32, [2, 5, 3, 6]);
    let q = op(&mut g, Op::Permute { perm: vec![0, 2, 1, 3] }, &[rows]);
    let k = g.input(DType::F32, [2, 3, 5, 6]);
    let v = g.input(DType::F32, [2, 3, 5, 6]);
    let out = op(&mut g, Op::Attention { causal: true, scale: 0.3 }, &[q, k, v]);
    g.set_outputs(vec![out]);
    let plan = compile_to_plan(&g, &defaults()).unwrap();
    let families: Vec<&str> = plan.kernels.iter().map(|k| k.kind.family()).collect();
    assert_eq!(families, ["pointwise", "attention"], "{plan}");
}

/// GPT-2's attention: q, k and v sliced out of one projection and split into heads, the
/// output's heads merged back for the next projection. The attention reads the projection
/// where it lies and writes `[B, T, H, D]`, which the matmul after it reads as it is: no copy
/// kernels. In the backward, dq, dk and dv are written straight into their columns of the
/// projection's gradient: no concat either.
#[test]
fn attention_reads_a_fused_projection_and_writes_heads_merged() {
    let (batch, seq, heads, dim) = (2, 5, 3, 8);
    let width = heads * dim;
    let mut g = Graph::new();
    let qkv = g.input(DType::F32, [batch, seq, 3 * width]);
    let split: Vec<NodeId> = (0..3)
        .map(|i| {
            let part = op(&mut g, Op::Slice { axis: 2, start: i * width, end: (i + 1) * width, step: 1 }, &[qkv]);
            let apart = g.reshape(part, [batch, seq, heads, dim]).unwrap();
            op(&mut g, Op::Permute { perm: vec![0, 2, 1, 3] }, &[apart])
        })
        .collect();
    let out = op(&mut g, Op::Attention { causal: true, scale: 0.3 }, &split);
    let merged = op(&mut g, Op::Permute { perm: vec![0, 2, 1, 3] }, &[out]);
    let rows = g.reshape(merged, [batch, seq, width]).unwrap();
    let w = g.input(DType::F32, [width, width]);
    let y = op(&mut g, Op::MatMul, &[rows, w]);
    g.set_outputs(vec![y]);
    let forward = g.clone();
    let plan = check("attention_of_a_fused_projection", forward, FusionOptions::default(), 2);
    let KernelKind::Attention(att) = &plan.kernels[0].kind else { panic!("{plan}") };
    let row_stride = 3 * width;
    let offsets: Vec<usize> = att.input_layouts.iter().map(|l| l.offset).collect();
    assert_eq!(offsets, [0, width, 2 * width], "{plan}");
    assert!(att.input_layouts.iter().all(|l| l.row_stride == row_stride && l.head_stride == dim), "{plan}");
    assert_eq!(att.out_layout.row_stride, width, "heads merged: {plan}");
    assert_eq!(plan.kernels[1].inputs[0], plan.kernels[0].outputs[0], "the matmul reads the attention's output");

    let dy = g.input(DType::F32, [batch, seq, width]);
    let grads = braze_autodiff::backward(&mut g, &[(y, dy)], &[qkv, w]).unwrap();
    g.set_outputs(grads.into_iter().map(Option::unwrap).collect());
    let plan = compile_to_plan(&g, &defaults()).unwrap();
    // The concat's ops are still named, by a kernel that now does them.
    check_invariants("attention_backward_of_a_fused_projection", &g, &plan);
    let families: Vec<&str> = plan.kernels.iter().map(|k| k.kind.family()).collect();
    assert!(!families.iter().any(|f| f.contains("pointwise")), "no copy kernels: {families:?}\n{plan}");
    // dq, dk and dv are written straight into their columns of the projection's gradient.
    assert!(!families.contains(&"concat"), "{families:?}\n{plan}");
    let backward: Vec<&Kernel> =
        plan.kernels.iter().filter(|k| matches!(k.kind, KernelKind::AttentionBackward(_))).collect();
    let targets: Vec<BufferId> = backward.iter().flat_map(|k| k.outputs.iter().copied()).collect();
    assert_eq!(targets.len(), 3, "{plan}");
    assert!(targets.iter().all(|&b| b == targets[0] && plan.buffer(b).numel == batch * seq * row_stride), "{plan}");
    let columns: Vec<usize> = backward
        .iter()
        .flat_map(|k| (0..k.outputs.len()).map(|slot| plan.output_part(k, slot).unwrap().first))
        .collect();
    assert_eq!(columns, [0, width, 2 * width], "{plan}");
}

#[test]
fn attentions_of_one_query_and_key_but_other_values_stay_apart() {
    let (mut g, mut outputs) = attention_graph(false, false);
    let node = g.node(outputs[0]).clone();
    let other_v = g.input(DType::F32, [2, 3, 5, 8]);
    let second = op(&mut g, node.op.clone(), &[node.operands[0], node.operands[1], other_v]);
    outputs.push(second);
    let lse = op(&mut g, Op::AttentionLse { causal: true, scale: 0.3 }, &node.operands[..2]);
    outputs.push(lse);
    g.set_outputs(outputs);
    let plan = compile_to_plan(&g, &FusionOptions::default()).unwrap();
    let families: Vec<&str> = plan.kernels.iter().map(|k| k.kind.family()).collect();
    assert_eq!(families, ["attention", "attention"], "{plan}");
    let results: Vec<usize> = plan.kernels.iter().map(|k| k.outputs.len()).collect();
    assert_eq!(results.iter().sum::<usize>(), 3, "one lse for the two: {plan}");
}

#[test]
fn attention_gradients_fuse_into_a_dq_and_a_dk_dv_kernel() {
    let (mut g, outputs) = attention_graph(false, false);
    let node = g.node(outputs[0]).clone();
    let dout = g.input(DType::F32, [2, 3, 5, 8]);
    // What autodiff's rule appends: the lse, delta = rowsum(dout * out), one gradient per operand.
    let (q, k, v) = (node.operands[0], node.operands[1], node.operands[2]);
    let lse = op(&mut g, Op::AttentionLse { causal: true, scale: 0.3 }, &[q, k]);
    let products = mul(&mut g, dout, outputs[0]);
    let delta = sum(&mut g, products, &[3], false);
    let grads: Vec<NodeId> = [AttentionInput::Query, AttentionInput::Key, AttentionInput::Value]
        .into_iter()
        .map(|wrt| op(&mut g, Op::AttentionGrad { causal: true, scale: 0.3, wrt }, &[q, k, v, lse, delta, dout]))
        .collect();
    g.set_outputs(grads);
    // The forward with its lse, delta's row reduction, dq, and dk with dv.
    check("attention_backward", g, FusionOptions::default(), 4);
}

/// A value only read after the backward began (an optimizer's decayed weight `w * s`) does not
/// join the forward's kernel casting the same weight: it would be stored there and held until
/// the update. It joins the update instead, and the weight's cast stays a kernel of its own.
#[test]
fn a_late_value_joins_its_reader_not_an_early_sibling() {
    use braze_ir::SourceLoc;
    let at = |line: u32, backward: bool| {
        Some(SourceLoc { file: "step.rs".into(), line, col: 1, backward, recomputed: false })
    };
    let mut g = Graph::new();
    let x = g.input(DType::BF16, [16, 64]);
    let w = g.input(DType::F32, [64, 256]);
    let s = g.input(DType::F32, []);
    let dy = g.input(DType::F32, [64, 256]);
    let w16 = g.cast(w, DType::BF16).unwrap();
    g.set_loc(w16, at(1, false));
    let y = g.add(Op::MatMul, &[x, w16], at(2, false)).unwrap();
    let two = g.constant(2.0, DType::F32);
    let grad = g.add(Op::Binary { op: BinaryOp::Mul }, &[dy, two], at(3, true)).unwrap();
    let s_wide = g.broadcast_to(s, [64, 256]).unwrap();
    let decayed = g.add(Op::Binary { op: BinaryOp::Mul }, &[w, s_wide], at(4, false)).unwrap();
    let update = g.add(Op::Binary { op: BinaryOp::Sub }, &[decayed, grad], at(5, false)).unwrap();
    g.set_outputs(vec![y, update]);
    let plan = compile_to_plan(&g, &defaults()).unwrap();
    let lines = |k: &braze_plan::Kernel| -> Vec<u32> {
        k.sources.iter().filter_map(|s| s.loc.as_ref().map(|l| l.line)).collect()
    };
    let home = plan.kernels.iter().find(|k| lines(k).contains(&4)).expect("a kernel computes the decayed weight");
    assert!(lines(home).contains(&5) && !lines(home).contains(&1), "{plan}");
}

/// A matmul over k = 0 (a fill with zeros) keeps its bias add and activation out of its kernel:
/// cuBLASLt has no call for an epilogue without a product (GPU fuzz seed 30,002,712).
#[test]
fn a_matmul_over_no_columns_runs_its_epilogue_apart() {
    let mut g = Graph::new();
    let a = g.input(DType::F32, [1, 1, 1, 0]);
    let b = g.input(DType::F32, [0, 7]);
    let bias = g.input(DType::F32, [7]);
    let product = op(&mut g, Op::MatMul, &[a, b]);
    let biased = op(&mut g, Op::Binary { op: BinaryOp::Add }, &[product, bias]);
    let y = op(&mut g, Op::Unary { op: UnaryOp::Relu }, &[biased]);
    g.set_outputs(vec![y]);
    let plan = compile_to_plan(&g, &defaults()).unwrap();
    let fused: Vec<_> = plan
        .kernels
        .iter()
        .filter_map(|k| match &k.kind {
            KernelKind::MatMul(mm) => Some((mm.bias, mm.activation)),
            _ => None,
        })
        .collect();
    assert_eq!(fused, [(false, None)], "{plan}");
    assert_eq!(plan.kernel_count(), 2, "{plan}");
}
