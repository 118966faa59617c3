//! Gradients of random graphs: each graph's float outputs are folded into a loss
//! (`sum(out * w)` for random weights `w`, summed in f32), its backward is appended by
//! `braze_autodiff`, and the joint graph (loss and the gradient of every float input) goes
//! through the same pipeline and judge as any graph: fused and run by the plan executor against
//! the reference's gradients. `BRAZE_FUZZ_GRAD_GRAPHS` (default 1,000) graphs from
//! `BRAZE_FUZZ_GRAD_SEED` (default 0).

use crate::generator::{random_graph, Counts};
use crate::run::{install_quiet_panic_hook, run_graph, Stage};
use braze_autodiff::backward;
use braze_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp};
use std::collections::BTreeMap;

/// The joint graph of `g`'s loss and its gradients, or `None` when `g` has no float input or
/// no float output.
pub fn gradient_graph(g: &Graph) -> Option<Graph> {
    let mut joint = g.clone();
    let wrt: Vec<NodeId> = joint.inputs().iter().copied().filter(|&i| joint.node(i).dtype.is_float()).collect();
    let outputs: Vec<NodeId> = joint.outputs().iter().copied().filter(|&o| joint.node(o).dtype.is_float()).collect();
    if wrt.is_empty() || outputs.is_empty() {
        return None;
    }
    let mut loss: Option<NodeId> = None;
    for out in outputs {
        let (dtype, shape) = (joint.node(out).dtype, joint.node(out).shape.clone());
        let weights = joint.input(dtype, shape.clone());
        let weighted = joint.add(Op::Binary { op: BinaryOp::Mul }, &[out, weights], None).ok()?;
        let axes: Vec<usize> = (0..shape.rank()).collect();
        let sum = joint.add(Op::Reduce { op: ReduceOp::Sum, axes, keepdim: false }, &[weighted], None).ok()?;
        let sum = joint.cast(sum, DType::F32).ok()?;
        loss = Some(match loss {
            Some(total) => joint.add(Op::Binary { op: BinaryOp::Add }, &[total, sum], None).ok()?,
            None => sum,
        });
    }
    let loss = loss?;
    let seed = joint.constant(1.0, DType::F32);
    let grads = backward(&mut joint, &[(loss, seed)], &wrt).expect("float inputs of a well-typed graph");
    let mut new_outputs = vec![loss];
    new_outputs.extend(grads.into_iter().flatten());
    joint.set_outputs(new_outputs);
    joint.verify().expect("the joint graph is well formed");
    Some(joint)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn random_gradients_match_the_reference() {
    install_quiet_panic_hook();
    let first = env_u64("BRAZE_FUZZ_GRAD_SEED").unwrap_or(0);
    let graphs = env_u64("BRAZE_FUZZ_GRAD_GRAPHS").unwrap_or(1000);
    let mut counts = Counts::default();
    let (mut joint_graphs, mut gradient_ops) = (0, 0);
    let mut kernels: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut failures: Vec<(u64, Stage, String)> = Vec::new();
    for seed in first..first + graphs {
        let graph = random_graph(seed, &mut counts);
        let Some(joint) = gradient_graph(&graph) else { continue };
        joint_graphs += 1;
        gradient_ops += joint.op_count() - graph.op_count();
        match run_graph(&joint, seed, seed % 3 != 0, false) {
            Ok(produced) => {
                for (family, n) in produced.kernels {
                    *kernels.entry(family).or_default() += n;
                }
            }
            Err(failure) => {
                if failures.len() < 3 {
                    failures.push((seed, failure.stage, format!("{}\n{}", joint.to_text(), failure.message)));
                } else {
                    failures.push((seed, failure.stage, String::new()));
                }
            }
        }
    }
    let families: Vec<String> = kernels.iter().map(|(f, n)| format!("{f} {n}")).collect();
    println!(
        "gradient fuzz: {graphs} graphs from seed {first}, {joint_graphs} with float inputs and outputs, \
         {gradient_ops} backward ops; kernels: {}",
        families.join(", ")
    );
    for (seed, stage, report) in failures.iter().filter(|f| !f.2.is_empty()) {
        println!("seed {seed} fails at {stage}:\n{report}\n");
    }
    let seeds: Vec<u64> = failures.iter().map(|f| f.0).collect();
    assert!(failures.is_empty(), "{} joint graphs failed: seeds {seeds:?}", failures.len());
    // Broadcast operands' gradients are sums over leading axes: column kernels.
    assert!(graphs < 200 || kernels.get("column").is_some_and(|&n| n > 0), "no column kernels: {families:?}");
}

/// Seeds of fresh ranges that once failed, each with what fixed it.
/// - 5,101,752: the grad of `max(cos(x), b)` in bf16, whose ties split it in halves: one kernel
///   compared the f32 cosine kept in registers, another its stored bf16 rounding. Casts and
///   comparisons now observe computed f16/bf16 values rounded.
/// - 64,000,485: a layer norm's input gradient that cancels at a bf16 add (about 2.36 - 2.5):
///   the fused kernel keeps `erf(x)` in f32 before `* s`, which flips that add's rounding by one
///   ulp (11% of the small result); the judge's two perturbed references had not flipped it.
///   Four do.
/// - 70,003,704: the backward of a bf16 max over a matmul's columns, where two outputs are 1 ulp
///   apart in the reference (3.703125 and 3.6875) and equal in the plan (its `cos(x) * y` keeps
///   the cosine in f32, which moves the larger product from 3.69635 to 3.69358, below the bf16
///   midpoint): the plan splits the gradient over both. The perturbed references' comparisons
///   read unperturbed values and never flipped a near-tie; they now read values with noise that
///   keeps exact ties and moves near-ties apart.
const REGRESSION_SEEDS: [u64; 3] = [5_101_752, 64_000_485, 70_003_704];

#[test]
fn gradient_fuzz_regression_seeds_pass() {
    install_quiet_panic_hook();
    let mut counts = Counts::default();
    for seed in REGRESSION_SEEDS {
        let joint =
            gradient_graph(&random_graph(seed, &mut counts)).expect("the seed's graph has float inputs and outputs");
        if let Err(failure) = run_graph(&joint, seed, seed % 3 != 0, false) {
            panic!("seed {seed} fails at {}:\n{}", failure.stage, failure.message);
        }
    }
}
