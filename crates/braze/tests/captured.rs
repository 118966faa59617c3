//! Tensors a compiled function captures are graph inputs bound by identity: an assigned value is
//! seen without a retrace; a new shape retraces; `export` hands out the graph and its bindings.

use braze::{compile, DType, Result, Tensor};
use braze_workloads::{self as workloads, Sizes};

fn vector(values: &[f32]) -> Tensor {
    Tensor::from_slice(values, [values.len()]).unwrap()
}

/// Calls `f` on `x` after assigning each value to `weight` in turn, checking the output values
/// and the number of traces after each step.
fn check(weight: &Tensor, f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>, x: &Tensor, steps: &[(&[f32], &[f32], usize)]) {
    let compiled = compile(f).fullgraph(true);
    for (i, (new_weight, want, want_traces)) in steps.iter().enumerate() {
        weight.assign(&vector(new_weight)).unwrap();
        let got = compiled.call(std::slice::from_ref(x)).unwrap();
        assert_eq!(got[0].to_vec::<f32>().unwrap(), *want, "step {i}");
        assert_eq!(compiled.stats().traces, *want_traces, "step {i}");
    }
}

#[test]
fn assigned_weight_is_seen_without_a_retrace() {
    let weight = vector(&[0.0; 4]);
    let captured = weight.clone();
    check(
        &weight,
        move |a| Ok(vec![a[0].mul(&captured)?]),
        &vector(&[1.0, 2.0, 3.0, 4.0]),
        &[(&[1.0, 1.0, 1.0, 1.0], &[1.0, 2.0, 3.0, 4.0], 1), (&[10.0, 0.0, -1.0, 0.5], &[10.0, 0.0, -3.0, 2.0], 1)],
    );
}

#[test]
fn captured_weight_with_a_new_shape_retraces() {
    let weight = vector(&[0.0; 4]);
    let captured = weight.clone();
    check(
        &weight,
        move |a| Ok(vec![a[0].mul(&captured)?]),
        &vector(&[1.0, 2.0, 3.0, 4.0]),
        &[
            (&[1.0, 1.0, 1.0, 1.0], &[1.0, 2.0, 3.0, 4.0], 1),
            (&[3.0], &[3.0, 6.0, 9.0, 12.0], 2),
            (&[2.0], &[2.0, 4.0, 6.0, 8.0], 2),
        ],
    );
}

#[test]
fn recompile_reason_names_the_captured_tensor() {
    let weight = vector(&[1.0, 2.0]);
    let captured = weight.clone();
    let line = line!() + 1;
    let compiled = compile(move |a: &[Tensor]| Ok(vec![a[0].add(&captured)?]));
    let x = vector(&[5.0, 5.0]);
    compiled.call(std::slice::from_ref(&x)).unwrap();
    weight.assign(&vector(&[1.0])).unwrap();
    let explanation = compiled.explain(&[x]).unwrap();
    let reason = &explanation.recompile_reasons[0];
    let place = format!("crates/braze/tests/captured.rs:{line}:");
    assert!(reason.starts_with(&format!("captured tensor (first used at {place}")), "{reason}");
    assert!(reason.ends_with("shape changed from [2] to [1]"), "{reason}");
}

#[test]
fn tiny_block_weights_update_in_place() {
    let sizes = Sizes { rows: 4, hidden: 8, layers: 3, ..Sizes::default() };
    let weights: Vec<(Tensor, Tensor)> = (0..3)
        .map(|i| (Tensor::randn([8], DType::F32, i).unwrap(), Tensor::randn([8], DType::F32, 10 + i).unwrap()))
        .collect();
    let block = workloads::tiny_block(weights.clone());
    let x = workloads::build("tiny_block", &sizes).unwrap().inputs;
    let eager_before = block(&x).unwrap()[0].to_vec::<f32>().unwrap();
    let compiled = compile(workloads::tiny_block(weights.clone())).fullgraph(true);
    assert_close(&compiled.call(&x).unwrap()[0].to_vec::<f32>().unwrap(), &eager_before);
    // An optimizer step on every weight.
    for (w, b) in &weights {
        w.assign(&w.mul_scalar(0.5).unwrap()).unwrap();
        b.assign(&b.add_scalar(1.0).unwrap()).unwrap();
    }
    let eager_after = block(&x).unwrap()[0].to_vec::<f32>().unwrap();
    assert_ne!(eager_before, eager_after);
    assert_close(&compiled.call(&x).unwrap()[0].to_vec::<f32>().unwrap(), &eager_after);
    assert_eq!(compiled.stats().traces, 1);
    let graph = &compiled.explain(&x).unwrap().graphs[0];
    assert_eq!(graph.inputs().len(), 1 + 2 * 3, "x and one input per captured tensor");
}

#[test]
fn a_tensor_captured_twice_is_one_input() {
    let weight = vector(&[1.0, 2.0, 3.0]);
    let captured = weight.clone();
    let compiled = compile(move |a: &[Tensor]| Ok(vec![a[0].mul(&captured)?.add(&captured)?])).fullgraph(true);
    let explanation = compiled.explain(&[vector(&[1.0, 1.0, 1.0])]).unwrap();
    assert_eq!(explanation.graphs[0].inputs().len(), 2);
}

/// Compiled code runs the fused plan in f32; eager runs the f64-accurate reference.
fn assert_close(got: &[f32], want: &[f32]) {
    let host = |v: &[f32]| braze::HostTensor::new([v.len()], braze::HostData::F32(v.to_vec())).unwrap();
    braze_cpu::compare::assert_close(&host(got), &host(want)).unwrap();
}

/// `export` hands out the traced graph and what its inputs are bound to: the arguments and the
/// captured weight, in input order; the graph run on them gives the call's result. A function
/// with a graph break has no one graph: an error.
#[test]
fn export_gives_the_graph_and_its_bound_inputs() {
    let weight = vector(&[1.0, 2.0, 3.0]);
    let captured = weight.clone();
    let compiled = compile(move |a: &[Tensor]| Ok(vec![a[0].mul(&captured)?.sum_all()?])).fullgraph(true);
    let x = vector(&[4.0, 5.0, 6.0]);
    let (graph, bound) = compiled.export(std::slice::from_ref(&x)).unwrap();
    assert_eq!(graph.inputs().len(), 2);
    assert!(bound[0].same_tensor(&x) && bound[1].same_tensor(&weight));
    let hosts: Vec<braze::HostTensor> = bound.iter().map(|t| t.to_host().unwrap()).collect();
    let out = braze_cpu::eval_graph(&graph, &hosts).unwrap();
    assert_eq!(out[0].to_f64_vec(), [32.0]);
    assert_eq!(compiled.stats().traces, 1, "export traced once; a call now hits the cache");
    let breaking = compile(|a: &[Tensor]| {
        let n: f32 = a[0].sum_all()?.item()?;
        Ok(vec![a[0].mul_scalar(n as f64)?])
    });
    let err = breaking.export(std::slice::from_ref(&x)).unwrap_err();
    assert!(err.to_string().contains("graph breaks"), "{err}");
}
