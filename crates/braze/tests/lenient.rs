//! Functions split at graph breaks whose host control flow depends on tensor values: every call
//! runs the function again, so each input takes its own branch and still matches eager
//! execution, while the compiled pieces are reused.

use braze::{compile, DType, Result, Tensor};
use braze_workloads::{self as workloads, Sizes};

/// Calls the lenient compiled `f` on each input set and compares with eager execution; returns
/// (traces, graphs compiled) at the end.
fn check(f: fn(&[Tensor]) -> Result<Vec<Tensor>>, input_sets: &[Vec<Tensor>]) -> (usize, usize) {
    let compiled = compile(f);
    for (i, inputs) in input_sets.iter().enumerate() {
        let want = f(inputs).expect("eager run");
        let got = compiled.call(inputs).expect("compiled run");
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            let (g, w) = (g.to_host().unwrap(), w.to_host().unwrap());
            // Compiled pieces run fused f32 kernels; eager runs the f64-accurate reference.
            braze_cpu::compare::assert_close(&g, &w).unwrap_or_else(|e| panic!("input set {i}: {e}"));
        }
    }
    let stats = compiled.stats();
    (stats.traces, stats.graphs_compiled)
}

/// Halves `x` until its largest magnitude is at most 1: the number of steps depends on the data.
fn halve_until_small(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let mut x = a[0].clone();
    let mut steps = 0;
    while x.abs()?.max_all()?.item::<f32>()? > 1.0 && steps < 30 {
        x = x.mul_scalar(0.5)?;
        steps += 1;
    }
    Ok(vec![x.add_scalar(steps as f64)?])
}

fn scaled(seed: u64, scale: f64) -> Vec<Tensor> {
    vec![Tensor::randn([5, 3], DType::F32, seed).unwrap().mul_scalar(scale).unwrap()]
}

#[test]
fn data_dependent_loop_matches_eager() {
    let sets = [scaled(1, 1.0), scaled(2, 10.0), scaled(3, 1000.0), scaled(4, 0.1), scaled(2, 10.0)];
    let (traces, graphs) = check(halve_until_small, &sets);
    assert_eq!(traces, 1, "one signature");
    // One piece per distinct step structure, not one per call.
    assert!(graphs <= 6, "{graphs} graphs compiled");
}

#[test]
fn sync_demo_takes_both_branches_and_matches_eager() {
    let sizes = Sizes { rows: 6, hidden: 8, ..Sizes::default() };
    let workload = workloads::build("sync_demo", &sizes).unwrap();
    let x = &workload.inputs[0];
    let w = &workload.inputs[1];
    let mut with_nan = x.to_vec::<f32>().unwrap();
    with_nan[3] = f32::NAN;
    let nan_x = Tensor::from_vec(with_nan, x.shape()).unwrap();
    let large_x = x.mul_scalar(50.0).unwrap();
    let sets =
        vec![vec![x.clone(), w.clone()], vec![nan_x, w.clone()], vec![large_x, w.clone()], vec![x.clone(), w.clone()]];
    let (traces, _) = check(workloads::sync_demo, &sets);
    assert_eq!(traces, 1);
}

#[test]
fn explain_counts_graphs_breaks_and_syncs_of_a_split_function() {
    let compiled = compile(halve_until_small);
    let explanation = compiled.explain(&scaled(3, 8.0)).unwrap();
    let steps = explanation.breaks.len() - 1;
    assert!(steps >= 1);
    assert_eq!(explanation.host_syncs, explanation.breaks.len());
    // A graph before each read, and the last one for the result.
    assert_eq!(explanation.graphs.len(), explanation.breaks.len() + 1);
    assert!(explanation.to_string().contains(&format!("breaks: {}\n", steps + 1)));
}
