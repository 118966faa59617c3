//! The reductions of a compiled training step over every parameter share one launch each: the
//! non-finite check of the optimizer's skip and the global gradient norm of `clip_grad_norm`,
//! each folded on the device, whatever the number of parameters.

use braze::optim::{clip_grad_norm, AdamW, Optimizer};
use braze::{compile, DType, Result, Tensor};
use braze_passes::{compile_to_plan, FusionOptions};
use braze_plan::{Expr, KernelKind, Plan};
use braze_workloads::Sizes;

/// The plan the step's one graph fuses into.
fn plan_of(explanation: &braze::Explanation) -> Plan {
    assert_eq!(explanation.graphs.len(), 1, "one graph");
    compile_to_plan(&explanation.graphs[0], &FusionOptions::default()).unwrap()
}

/// Indices of the kernels whose sources hold an op named `op`.
fn kernels_with(plan: &Plan, op: &str) -> Vec<usize> {
    (0..plan.kernels.len())
        .filter(|&k| plan.kernels[k].sources.iter().any(|s| s.op.rsplit('/').next() == Some(op)))
        .collect()
}

fn multi_reduce_items(plan: &Plan, k: usize) -> usize {
    match &plan.kernels[k].kind {
        KernelKind::MultiReduce(mr) => mr.items.len(),
        other => panic!("kernel {k} is a {} kernel\n{plan}", other.family()),
    }
}

#[test]
fn mlp_step_checks_every_gradient_for_non_finite_values_in_one_launch() {
    let sizes = Sizes { rows: 8, hidden: 16, ..Sizes::default() };
    let step = braze_workloads::mlp_step(&sizes, braze::Device::Cpu).unwrap();
    let compiled = step.compile().fullgraph(true);
    let plan = plan_of(&compiled.explain(&step.inputs).unwrap());
    let checks = kernels_with(&plan, "isfinite");
    assert_eq!(checks.len(), 1, "one kernel checks every gradient\n{plan}");
    // One item per parameter.
    let params = 6 * braze_workloads::MLP_STEP_LAYERS;
    assert_eq!(multi_reduce_items(&plan, checks[0]), params, "{plan}");
    // The loss's mean is reduced apart, before the backward's kernels: in the checks' launch,
    // its input would be held through the whole backward.
    let loss_buffer = plan.outputs[0].buffer;
    let loss = (0..plan.kernels.len()).find(|&k| plan.kernels[k].outputs.contains(&loss_buffer)).expect("the loss");
    assert!(!braze_plan::saved::is_backward(&plan.kernels[loss]), "{plan}");
    let backward_matmul = (0..plan.kernels.len())
        .find(|&k| {
            braze_plan::saved::is_backward(&plan.kernels[k]) && matches!(plan.kernels[k].kind, KernelKind::MatMul(_))
        })
        .expect("the backward's matmuls");
    assert!(loss < backward_matmul, "{plan}");
}

#[test]
fn clipped_training_step_takes_the_global_norm_in_one_launch() -> Result<()> {
    let shapes: [&[usize]; 5] = [&[16, 8], &[8], &[8, 3], &[3], &[40_000]];
    let params: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, shape)| {
            let p = Tensor::randn(shape.to_vec(), DType::F32, 50 + i as u64)?;
            p.set_requires_grad(true)?;
            Ok(p)
        })
        .collect::<Result<_>>()?;
    let optimizer = AdamW::new(&params, 1e-3)?;
    let captured = params.clone();
    let step = compile(move |a: &[Tensor]| {
        optimizer.zero_grad();
        let [w1, b1, w2, b2, big] = &captured[..] else { unreachable!() };
        let h = a[0].matmul(w1)?.add(b1)?.relu()?.matmul(w2)?.add(b2)?;
        let loss = h.mul(&h)?.mean_all()?.add(&big.mul(big)?.mean_all()?)?;
        loss.backward()?;
        let norm = clip_grad_norm(&captured, 1.0)?.expect("gradients");
        optimizer.step()?;
        Ok(vec![loss, norm])
    })
    .fullgraph(true);
    let x = Tensor::randn([4, 16], DType::F32, 7)?;
    let plan = plan_of(&step.explain(std::slice::from_ref(&x))?);
    // The norm's square root is in the epilogue of the kernel that sums every gradient's squares.
    let norm_kernels: Vec<usize> = kernels_with(&plan, "sqrt")
        .into_iter()
        .filter(|&k| match &plan.kernels[k].kind {
            KernelKind::MultiReduce(mr) => mr.epilogue.values.iter().any(|v| matches!(v.expr, Expr::Unary { .. })),
            _ => false,
        })
        .collect();
    assert_eq!(norm_kernels.len(), 1, "{plan}");
    assert!(multi_reduce_items(&plan, norm_kernels[0]) >= shapes.len(), "{plan}");
    // The skip check reads the clipped gradients, so it is a launch of its own after the norm.
    let checks = kernels_with(&plan, "isfinite");
    assert_eq!(checks.len(), 1, "{plan}");
    assert_eq!(multi_reduce_items(&plan, checks[0]), shapes.len(), "{plan}");
    assert!(checks[0] > norm_kernels[0]);
    // And it runs: the returned norm is the norm of the gradients.
    let out = step.call(&[x])?;
    assert!(out[1].item::<f64>()? > 0.0);
    Ok(())
}

/// Twelve gradients of assorted sizes, two of them longer than a row kernel caches.
fn gradients() -> Vec<Tensor> {
    let shapes: [&[usize]; 12] =
        [&[64, 32], &[32], &[40_000], &[7], &[3, 5, 11], &[1], &[128, 9], &[0], &[20_001], &[250], &[16, 16], &[2]];
    shapes.iter().enumerate().map(|(i, s)| Tensor::randn(s.to_vec(), DType::F32, 300 + i as u64).unwrap()).collect()
}

fn sum_of_squares(x: &Tensor) -> Result<Tensor> {
    x.mul(x)?.sum_all()
}

/// Traces `f` on `inputs` through `compile()` (fullgraph, the CPU backend), checks its kernel
/// count and its results against the f64 oracle on the traced graph, snapshots the plan under
/// `snapshots/plans/` as `name` and returns it.
fn check_compiled(
    name: &str,
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    inputs: &[Tensor],
    kernels: usize,
) -> Plan {
    let compiled = compile(f).fullgraph(true);
    let explanation = compiled.explain(inputs).unwrap();
    let plan = plan_of(&explanation);
    assert_eq!(explanation.kernels, Some(kernels), "{name}: kernels\n{plan}");
    let hosts: Vec<braze_ir::HostTensor> = inputs.iter().map(|t| t.to_host().unwrap()).collect();
    let want = braze_cpu::eval_graph(&explanation.graphs[0], &hosts).unwrap();
    let got = compiled.call(inputs).unwrap();
    assert_eq!(got.len(), want.len(), "{name}: outputs");
    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
        braze_cpu::compare::assert_close(&got.to_host().unwrap(), want)
            .unwrap_or_else(|e| panic!("{name}: output {i}: {e}"));
    }
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../../snapshots/plans"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.bind(|| insta::assert_snapshot!(name, plan.to_string()));
    plan
}

/// The multi-reduce kernels of `plan`, in order: (kernel index, items, values stored).
fn multi_reduces(plan: &Plan) -> Vec<(usize, usize, usize)> {
    (0..plan.kernels.len())
        .filter_map(|k| match &plan.kernels[k].kind {
            KernelKind::MultiReduce(mr) => Some((k, mr.items.len(), mr.stores.len())),
            _ => None,
        })
        .collect()
}

#[test]
fn compiled_stacked_sums_of_squares_are_one_launch() {
    let plan = check_compiled(
        "compiled_multi_reduce_stack",
        |a| {
            let sums: Vec<Tensor> = a.iter().map(sum_of_squares).collect::<Result<_>>()?;
            Ok(vec![Tensor::stack(&sums, 0)?])
        },
        &gradients(),
        1,
    );
    assert_eq!(multi_reduces(&plan), vec![(0, 12, 12)], "one item per gradient, each written into the stack");
}

#[test]
fn compiled_global_norm_folded_with_adds_is_one_launch() {
    // `sqrt(sum(g1^2) + sum(g2^2) + ...)`, as a global gradient norm is usually written.
    let plan = check_compiled(
        "compiled_multi_reduce_add_chain",
        |a| {
            let mut total = sum_of_squares(&a[0])?;
            for g in &a[1..] {
                total = total.add(&sum_of_squares(g)?)?;
            }
            Ok(vec![total.sqrt()?])
        },
        &gradients(),
        1,
    );
    assert_eq!(multi_reduces(&plan), vec![(0, 12, 1)], "the adds and the root in the epilogue: one value stored");
}

#[test]
fn compiled_sums_returned_separately_are_one_launch() {
    let plan = check_compiled(
        "compiled_multi_reduce_separate_outputs",
        |a| a.iter().map(sum_of_squares).collect(),
        &gradients(),
        1,
    );
    assert_eq!(multi_reduces(&plan), vec![(0, 12, 12)]);
    assert_eq!(plan.outputs.len(), 12);
}

#[test]
fn compiled_sums_each_with_its_own_epilogue_are_one_launch() {
    // Per result: a scale, a mean, a root of a shifted value, a max of |g| compared with a bound.
    let plan = check_compiled(
        "compiled_multi_reduce_per_result_epilogues",
        |a| {
            a.iter()
                .enumerate()
                .map(|(i, g)| match i % 4 {
                    0 => sum_of_squares(g)?.mul_scalar(0.5 + i as f64),
                    1 => g.mul(g)?.mean_all(),
                    2 => sum_of_squares(g)?.add_scalar(1e-6)?.sqrt(),
                    _ => g.abs()?.max_all()?.mul_scalar(2.0)?.sub_scalar(1.0),
                })
                .collect()
        },
        &gradients(),
        1,
    );
    assert_eq!(multi_reduces(&plan), vec![(0, 12, 12)], "every epilogue runs in the finishing step");
}

#[test]
fn compiled_reduction_of_another_reductions_result_stays_a_launch_of_its_own() {
    // sum(g0 * max|g1|) reads a result of the others' launch, so it cannot share it; the norm of
    // the other gradients and the max share one.
    let plan = check_compiled(
        "compiled_multi_reduce_dependent",
        |a| {
            let largest = a[1].abs()?.max_all()?;
            let mut total = sum_of_squares(&a[2])?;
            for g in &a[3..] {
                total = total.add(&sum_of_squares(g)?)?;
            }
            let dependent = a[0].mul(&largest)?.sum_all()?;
            Ok(vec![total.sqrt()?, largest, dependent])
        },
        &gradients(),
        2,
    );
    let multi = multi_reduces(&plan);
    assert_eq!(multi[0], (0, 11, 2), "the max and ten sums of squares in one launch, storing the norm and the max");
    let (first, second) = (&plan.kernels[0], &plan.kernels[1]);
    assert!(
        second.inputs.iter().any(|b| first.outputs.contains(b)),
        "the dependent sum runs after the launch it reads\n{plan}"
    );
}

#[test]
fn compiled_reductions_over_two_tensors_each_are_one_launch() {
    // A squared distance per pair and a dot product per pair, returned and folded into a total.
    let shapes: [&[usize]; 6] = [&[64, 32], &[40_000], &[7], &[3, 5, 11], &[0], &[250]];
    let inputs: Vec<Tensor> =
        (0..12).map(|i| Tensor::randn(shapes[i / 2].to_vec(), DType::F32, 500 + i as u64).unwrap()).collect();
    let plan = check_compiled(
        "compiled_multi_reduce_two_leaves",
        |a| {
            let mut outs = Vec::new();
            for pair in a.chunks(2) {
                let (p, q) = (&pair[0], &pair[1]);
                let distance = sum_of_squares(&p.sub(q)?)?;
                let dot = p.mul(q)?.sum_all()?;
                outs.push(distance.add(&dot)?);
            }
            let mut total = outs[0].clone();
            for o in &outs[1..] {
                total = total.add(o)?;
            }
            outs.push(total);
            Ok(outs)
        },
        &inputs,
        1,
    );
    assert_eq!(multi_reduces(&plan), vec![(0, 12, 7)], "two items per pair, each reading both tensors");
    assert_eq!(plan.kernels[0].inputs.len(), 24, "{plan}");
}

/// What a bf16 mlp_step holds from its forward for its backward: each layer's `h` (the first
/// matmul's result, which the GELU gradient reads) and the layer norms' bf16 operands, nothing in
/// f32 and nothing recomputable: `gelu(h)` is computed again beside its gradient, and each layer
/// norm's f32 normalized input again from the bf16 `x + y` it normalizes.
#[test]
fn mlp_step_holds_only_bf16_values_it_cannot_recompute() {
    let sizes = Sizes { rows: 64, hidden: 32, dtype: DType::BF16, ..Sizes::default() };
    let step = braze_workloads::mlp_step(&sizes, braze::Device::Cpu).unwrap();
    let plan = plan_of(&step.compile().fullgraph(true).explain(&step.inputs).unwrap());
    let backward: Vec<bool> = plan.kernels.iter().map(braze_plan::saved::is_backward).collect();
    let mut saved = std::collections::BTreeSet::new();
    for (k, kernel) in plan.kernels.iter().enumerate().filter(|(k, _)| backward[*k]) {
        for &b in &kernel.inputs {
            let written_forward = (0..k).any(|w| !backward[w] && plan.kernels[w].outputs.contains(&b));
            if written_forward && plan.buffer(b).role == braze_plan::BufferRole::Intermediate {
                saved.insert(b);
            }
        }
    }
    let (rows, hidden) = (sizes.rows, sizes.hidden);
    let large: Vec<_> = saved.iter().map(|&b| plan.buffer(b)).filter(|b| b.numel >= rows * hidden).collect();
    assert!(large.iter().all(|b| b.dtype == DType::BF16), "{large:?}\n{plan}");
    let h = large.iter().filter(|b| b.numel == rows * 4 * hidden).count();
    assert_eq!(h, braze_workloads::MLP_STEP_LAYERS, "one h a layer, no gelu(h)\n{plan}");
    let saved_bytes: usize = saved.iter().map(|&b| plan.buffer(b).bytes()).sum();
    let summary = step.compile().fullgraph(true).explain(&step.inputs).unwrap().saved_for_backward.unwrap();
    assert_eq!(summary.bytes, saved_bytes, "explain reports the same bytes");
}
