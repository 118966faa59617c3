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
    // One item per parameter, and the loss's mean, which depends on no gradient, shares the launch.
    let params = 6 * braze_workloads::MLP_STEP_LAYERS;
    assert_eq!(multi_reduce_items(&plan, checks[0]), params + 1, "{plan}");
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
