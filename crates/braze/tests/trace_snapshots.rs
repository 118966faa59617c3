//! The IR text of traced functions, snapshotted under `snapshots/trace/`.

use braze::{compile, CustomOp, DType, Device, Result, Tensor};
use braze_workloads::{self as workloads, Sizes};

/// Traces `f` on `inputs` in fullgraph mode, checks the compiled result against eager execution,
/// and snapshots the graph text as `name`.
fn check(name: &str, f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>, inputs: &[Tensor]) {
    let eager = f(inputs).expect("eager run");
    let compiled = compile(f).fullgraph(true);
    let explanation = compiled.explain(inputs).expect("trace");
    assert_eq!(explanation.graphs.len(), 1, "{name}: expected one graph");
    let outputs = compiled.call(inputs).expect("compiled run");
    // Fused kernels keep f16/bf16 intermediates in f32 (as torch.compile does), so a graph that
    // computes in a narrow dtype is compared at that dtype's tolerance whatever its output dtype.
    let graph = &explanation.graphs[0];
    let narrowest = graph
        .node_ids()
        .iter()
        .map(|&n| graph.node(n).dtype)
        .filter(|d| d.is_float())
        .max_by(|a, b| braze_cpu::compare::tolerance(*a).0.total_cmp(&braze_cpu::compare::tolerance(*b).0));
    for (got, want) in outputs.iter().zip(&eager) {
        let (got, want) = (got.to_host().unwrap(), want.to_host().unwrap());
        let (rtol, atol) = braze_cpu::compare::tolerance(narrowest.unwrap_or(want.dtype()));
        let (own_rtol, own_atol) = braze_cpu::compare::tolerance(want.dtype());
        braze_cpu::compare::assert_close_with(&got, &want, rtol.max(own_rtol), atol.max(own_atol))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../../snapshots/trace"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.bind(|| insta::assert_snapshot!(name, explanation.graphs[0].to_text()));
}

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape.to_vec(), DType::F32, seed).unwrap()
}

fn small() -> Sizes {
    Sizes { rows: 4, hidden: 8, n: 16, k: 4, lo: 2, hi: 32, layers: 2, ..Sizes::default() }
}

fn workload(name: &str) {
    let w = workloads::build(name, &small()).unwrap();
    let function = w.function.clone();
    check(name, move |a| function(a), &w.inputs);
}

#[test]
fn ln_relu_res() {
    workload("ln_relu_res");
}

#[test]
fn ew_chain() {
    workload("ew_chain");
}

#[test]
fn multisum_k4() {
    workload("multisum");
}

#[test]
fn tiny_block_2_layers() {
    workload("tiny_block");
}

#[test]
fn mlp_block() {
    workload("mlp_block");
}

#[test]
fn broadcast_chain() {
    check(
        "broadcast_chain",
        |a| {
            let column = a[0].broadcast_to([4, 3])?;
            let y = (&(&column + &a[1])? * &a[2])?;
            Ok(vec![y.reshape([3, 4])?.sub_scalar(1.5)?])
        },
        &[randn(&[4, 1], 1), randn(&[3], 2), randn(&[], 3)],
    );
}

#[test]
fn reductions_keepdim() {
    check(
        "reductions_keepdim",
        |a| {
            let x = &a[0];
            let centered = x.sub(&x.mean(&[-1], true)?)?;
            Ok(vec![centered.sum(&[0, 2], false)?, x.max(&[1], true)?, x.min_all()?])
        },
        &[randn(&[2, 3, 4], 4)],
    );
}

#[test]
fn softmax() {
    check("softmax", |a| Ok(vec![a[0].mul_scalar(0.125)?.softmax(-1)?]), &[randn(&[2, 5], 5)]);
}

#[test]
fn matmul_bias() {
    check(
        "matmul_bias",
        |a| Ok(vec![a[0].matmul(&a[1])?.add(&a[2])?.gelu_tanh()?]),
        &[randn(&[3, 4], 6), randn(&[4, 5], 7), randn(&[5], 8)],
    );
}

#[test]
fn where_isnan() {
    let mut values = randn(&[6], 9).to_vec::<f32>().unwrap();
    values[2] = f32::NAN;
    check(
        "where_isnan",
        |a| {
            let zeros = Tensor::zeros([6], DType::F32, Device::Cpu)?;
            let cleaned = Tensor::where_(&a[0].isnan()?, &zeros, &a[0])?;
            Ok(vec![cleaned, a[0].any_nan()?, a[0].isfinite()?.logical_not()?])
        },
        &[Tensor::from_vec(values, [6]).unwrap()],
    );
}

#[test]
fn concat_stack_slice_permute() {
    check(
        "concat_stack_slice_permute",
        |a| {
            let joined = Tensor::concat(&[a[0].clone(), a[1].clone()], -1)?;
            let every_other = joined.slice(1, 0, 5, 2)?;
            let stacked = Tensor::stack(&[every_other.clone(), every_other.neg()?], 0)?;
            Ok(vec![stacked.permute(&[2, 0, 1])?, joined.transpose(0, 1)?])
        },
        &[randn(&[2, 3], 10), randn(&[2, 2], 11)],
    );
}

#[test]
fn rms_norm_silu_cast() {
    check(
        "rms_norm_silu_cast",
        |a| {
            let y = a[0].cast(DType::BF16)?.rms_norm(&a[1].cast(DType::BF16)?, 1e-6)?.silu()?;
            Ok(vec![y.cast(DType::F32)?])
        },
        &[randn(&[2, 8], 12), randn(&[8], 13)],
    );
}

#[test]
fn traceable_custom_op_and_captured_weight() {
    let weight = randn(&[4], 14);
    let swish = CustomOp::traceable("swish", |a| Ok(vec![a[0].mul(&a[0].sigmoid()?)?]));
    check(
        "traceable_custom_op_and_captured_weight",
        move |a| {
            let scaled = a[0].mul(&weight)?;
            swish.call(&[scaled])
        },
        &[randn(&[2, 4], 15)],
    );
}
