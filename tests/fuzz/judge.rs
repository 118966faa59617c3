//! Judging a plan's outputs against the references.
//!
//! Three references, all from the f64 oracle `eval_graph`:
//! - the reference: the graph as written, every op rounded to its dtype (eager semantics);
//! - the wide reference: the same graph with every computed bf16/f16 value kept in f32 (rounded
//!   only by explicit casts and at the outputs), as one fused kernel computes it. A plan rounds
//!   narrow values where it stores them, a subset of the reference's rounding points, so both
//!   are results it may legitimately come near;
//! - perturbed references: the reference run again with every operand and result of the ops
//!   that can round differently in fused kernels multiplied by `1 + e`, `|e|` a unit or two in
//!   the last place, to measure how far last-bit differences move each element, through the
//!   decisions of discontinuous ops too (a near-tie at a max's backward may flip; exact ties
//!   hold, since the values those ops read get equal noise where they are equal).
//!
//! An element passes within its output's tolerance of the reference or of the wide reference;
//! else within [`SPREAD_FACTOR`] times the perturbed references' spread of any reference. Where
//! the perturbed references agree with the reference within the tolerance (the reference is
//! stable there), at most [`max_widened`] elements per output may need that; where one of them
//! does not (the reference is unstable: a sum that cancels, a norm of a constant row, where
//! `x - mean(x)` is 0 in f64 and a few ulps in f32, times `1/sqrt(eps)`), the spread is the
//! reference's own uncertainty, and those elements are counted apart. A NaN or an infinity on
//! either side must match the reference exactly (or the wide reference, where the reference is
//! non-finite: a bf16 value past bf16's largest stays finite in a fused kernel's f32, so
//! `finite - inf` is `-inf` where the reference has `inf - inf`, or what follows stays finite),
//! unless every perturbed
//! reference leaves the reference's value there and the plan is like one of them: non-finite
//! too, or within the tolerance of a finite one (an unstable element: that inexact zero times an
//! infinite weight, whose sign the rounding decides).
//! Integer and bool outputs must match exactly.

use crate::common::{random_inputs, wide_graph, Builder};
use crate::exactness::{exact_result, is_discontinuous};
use crate::rng::Rng;
use crate::run::run_graph_on;
use braze_cpu::{assert_close_with, eval_graph, eval_plan, tolerance};
use braze_ir::{BinaryOp, DType, Graph, HostTensor, NodeId, Op, ReduceOp, Shape, UnaryOp};
use braze_passes::{compile_to_plan, FusionOptions};
use std::collections::{HashMap, HashSet};

/// Reference runs with perturbed rounding per graph. Four, not two: an element whose value
/// cancels at a cast (a bf16 sum of a term about 2.4 and -2.5) moves by a whole ulp of the
/// terms when a last-bit difference upstream flips that rounding, and two runs flipped it too
/// rarely to show the spread (gradient fuzz seed 64,000,485).
const PERTURBED_RUNS: u64 = 4;
/// How many times the perturbed references' spread an element may be off, on top of its
/// output's tolerance.
const SPREAD_FACTOR: f64 = 4.0;

/// The most elements of an output of `numel` that may pass only within the perturbed
/// references' spread where the reference is stable: 1 in 16, at least 2. An output with more
/// such elements is more likely wrong than unlucky.
pub fn max_widened(numel: usize) -> usize {
    (numel / 16).max(2)
}

/// Everything an output of a graph is judged against.
#[derive(Clone, Debug)]
pub struct References {
    /// Every op rounded to its dtype.
    pub expected: Vec<HostTensor>,
    /// Computed bf16/f16 values kept in f32.
    pub wide: Vec<HostTensor>,
    /// One set of outputs per perturbed run.
    pub perturbed: Vec<Vec<HostTensor>>,
    /// `(rtol, atol)` per output ([`output_tolerances`]).
    pub tolerances: Vec<(f64, f64)>,
}

impl References {
    /// The references of `graph` on `inputs`.
    pub fn of(graph: &Graph, inputs: &[HostTensor]) -> Result<References, String> {
        let expected = eval_graph(graph, inputs).map_err(|e| format!("eval_graph: {e}"))?;
        let wide = wide_graph(graph)
            .and_then(|wide| eval_graph(&wide, inputs))
            .map_err(|e| format!("eval_graph of the wide graph: {e}"))?;
        let (noisy, noise) = perturbed_graph(graph);
        let keyed: Vec<NodeId> = noise.iter().filter_map(|n| n.keyed_by).collect::<HashSet<_>>().into_iter().collect();
        let mut by_key = graph.clone();
        by_key.set_outputs(keyed.clone());
        let key_values: HashMap<NodeId, HostTensor> = keyed
            .into_iter()
            .zip(eval_graph(&by_key, inputs).map_err(|e| format!("eval_graph of the keys of the noise: {e}"))?)
            .collect();
        let perturbed = (0..PERTURBED_RUNS)
            .map(|run| {
                let mut all = inputs.to_vec();
                all.extend(noise.iter().map(|n| noise_tensor(n, run, n.keyed_by.map(|k| &key_values[&k]))));
                eval_graph(&noisy, &all).map_err(|e| format!("eval_graph of the perturbed graph: {e}"))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(References { expected, wide, perturbed, tolerances: output_tolerances(graph) })
    }
}

/// How many elements of each output needed more than the tolerance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Within the tolerance of the wide reference only.
    pub wide: usize,
    /// Within the perturbed references' spread only, where the reference is stable.
    pub widened: usize,
    /// The largest number of widened elements in one output.
    pub most_widened: usize,
    /// Within the perturbed references' spread, where the reference is unstable.
    pub unstable: usize,
}

// ---- tolerances ---------------------------------------------------------------------------------

/// The values of `graph` whose bits agree between fused kernels and the reference: inputs,
/// constants, and ops with an exact result on exact operands.
pub fn exact_values(graph: &Graph) -> HashSet<NodeId> {
    let mut exact = HashSet::new();
    for id in graph.topo_order() {
        let node = graph.node(id);
        let is_exact = match node.op {
            Op::Input { .. } | Op::Constant { .. } => true,
            _ => {
                let operand = node.operands.first().map_or(node.dtype, |&o| graph.node(o).dtype);
                node.operands.iter().all(|o| exact.contains(o)) && exact_result(&node.op, operand)
            }
        };
        if is_exact {
            exact.insert(id);
        }
    }
    exact
}

/// Float dtypes from the narrowest significand up.
const FLOATS_BY_PRECISION: [DType; 3] = [DType::BF16, DType::F16, DType::F32];

/// `(rtol, atol)` per output: the tolerance of the output's dtype, or of the narrowest float
/// dtype among the rounding points on its path (the values it depends on that may differ in
/// their last bits), whichever is looser; exact for integer and bool outputs.
pub fn output_tolerances(graph: &Graph) -> Vec<(f64, f64)> {
    let exact = exact_values(graph);
    graph
        .outputs()
        .iter()
        .map(|&out| {
            let dtype = graph.node(out).dtype;
            if !dtype.is_float() {
                return (0.0, 0.0);
            }
            let mut rounding = HashSet::from([dtype]);
            let mut seen = HashSet::new();
            let mut stack = vec![out];
            while let Some(id) = stack.pop() {
                if !seen.insert(id) {
                    continue;
                }
                let node = graph.node(id);
                if node.dtype.is_float() && !exact.contains(&id) {
                    rounding.insert(node.dtype);
                }
                stack.extend(node.operands.iter().copied());
            }
            let narrowest = FLOATS_BY_PRECISION.into_iter().find(|d| rounding.contains(d)).unwrap_or(DType::F32);
            tolerance(narrowest)
        })
        .collect()
}

// ---- the perturbed references -------------------------------------------------------------------

/// Relative size of the perturbation of a value of `dtype`: a unit or two in its last place.
fn perturbation(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2f64.powi(-7),
        DType::F16 => 2f64.powi(-10),
        _ => 2f64.powi(-22),
    }
}

/// Ops that can round differently in fused kernels than in the reference (the sources of
/// last-bit differences; see the module docs).
fn rounds_differently(graph: &Graph, id: NodeId) -> bool {
    let node = graph.node(id);
    if matches!(node.op, Op::Input { .. } | Op::Constant { .. }) {
        return false;
    }
    let operand = node.operands.first().map_or(node.dtype, |&o| graph.node(o).dtype);
    !exact_result(&node.op, operand)
}

/// How many elements an op combines into each element of its result: the rounding error of a
/// sum in f32 grows with their number (as its square root for random signs).
fn combined(graph: &Graph, id: NodeId) -> usize {
    let node = graph.node(id);
    let Some(&first) = node.operands.first() else { return 1 };
    let input = graph.node(first).shape.dims();
    match &node.op {
        Op::Reduce { axes, .. } => axes.iter().map(|&a| input[a]).product(),
        Op::Softmax { axis } | Op::LogSoftmax { axis } => input[*axis],
        // A row's log-sum-exp, then the mean over the rows.
        Op::CrossEntropy { .. } => input.iter().product(),
        Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::MatMul => input.last().copied().unwrap_or(1),
        _ => 1,
    }
}

/// A noise input of the perturbed graph: its type, the relative size of its perturbation, its
/// index among the noise inputs of its kind, and for keyed noise the node whose reference value
/// keys it (see [`perturbed_graph`]).
#[derive(Clone, Debug)]
struct Noise {
    dtype: DType,
    shape: Shape,
    size: f64,
    index: usize,
    keyed_by: Option<NodeId>,
}

/// Whether `id` turns a last-bit difference of its float operand into a different answer.
fn discontinuous(graph: &Graph, id: NodeId) -> bool {
    let node = graph.node(id);
    node.operands.first().is_some_and(|&o| is_discontinuous(&node.op, graph.node(o).dtype, node.dtype))
}

/// The values that discontinuous ops read, and everything they are computed from.
fn read_by_discontinuous_ops(graph: &Graph) -> HashSet<NodeId> {
    let mut read = HashSet::new();
    let mut stack: Vec<NodeId> = Vec::new();
    for id in graph.topo_order() {
        if discontinuous(graph, id) {
            stack.extend(graph.node(id).operands.iter().copied());
        }
    }
    while let Some(id) = stack.pop() {
        if read.insert(id) {
            stack.extend(graph.node(id).operands.iter().copied());
        }
    }
    read
}

/// `graph` with every float operand and the result of each op that [`rounds_differently`]
/// multiplied by a new input, which [`noise_tensor`] fills with `1 + e` for small random `e`: one
/// to a few units in the last place of the value's dtype, and for the operands of an op that sums `n`
/// elements in f32 at least `sqrt(n)` f32 units. The noise inputs follow the graph's own.
///
/// Discontinuous ops (comparisons, casts of floats to integers) read a chain of their own, with
/// noise keyed by the reference value (`keyed_by`): elements equal in the reference get the same
/// noise and stay equal, as a kernel computing every element by one formula keeps them, so the
/// ties `x == max(x)` finds hold (noise on each element broke them and measured the other branch
/// instead of the rounding: gradient fuzz seed 597), while distinct elements move apart and a
/// near-tie can flip as a plan's rounding may flip it (gradient fuzz seed 70,003,704: two bf16
/// matmul outputs 1 ulp apart in the reference, equal in the plan, split a max's gradient; the
/// ops had read unperturbed values). The other ops read noise on each element, which moves
/// equal elements apart as different roundings of them do (a constant row's `x - mean(x)`).
fn perturbed_graph(graph: &Graph) -> (Graph, Vec<Noise>) {
    let mut g = Graph::new();
    let mut noise = Vec::new();
    let mut counts = [0, 0];
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    let mut keyed: HashMap<NodeId, NodeId> = HashMap::new();
    let deciding = read_by_discontinuous_ops(graph);
    let mut perturb = |g: &mut Graph, x: NodeId, keyed_by: Option<NodeId>, combined: usize| {
        let (dtype, shape) = (g.node(x).dtype, g.node(x).shape.clone());
        if !dtype.is_float() {
            return x;
        }
        let size = perturbation(dtype).max(perturbation(DType::F32) * (combined as f64).sqrt());
        let count = &mut counts[usize::from(keyed_by.is_some())];
        noise.push(Noise { dtype, shape: shape.clone(), size, index: *count, keyed_by });
        *count += 1;
        let n = g.input(dtype, shape);
        g.add(Op::Binary { op: BinaryOp::Mul }, &[x, n], None).expect("x * noise of x's type")
    };
    // `id`'s op on its operands' values in `chain`, with noise where it rounds differently: keyed
    // in the chain that discontinuous ops read.
    let mut same_op = |g: &mut Graph, id: NodeId, chain: &HashMap<NodeId, NodeId>, keys: bool| {
        let node = graph.node(id);
        let source = rounds_differently(graph, id);
        let n = combined(graph, id);
        let operands: Vec<NodeId> = node
            .operands
            .iter()
            .map(|&o| if source { perturb(g, chain[&o], keys.then_some(o), n) } else { chain[&o] })
            .collect();
        let y = g
            .add_declared(node.op.clone(), &operands, node.dtype, node.shape.clone(), None)
            .expect("the same op on operands of the same types");
        if source {
            perturb(g, y, keys.then_some(id), 1)
        } else {
            y
        }
    };
    // Inputs come first in topological order, so they keep their indices.
    for id in graph.topo_order() {
        let node = graph.node(id);
        let new = match node.op {
            Op::Input { .. } => g.input(node.dtype, node.shape.clone()),
            Op::Constant { value } => g.literal(value, node.dtype),
            _ if discontinuous(graph, id) => same_op(&mut g, id, &keyed, true),
            _ => same_op(&mut g, id, &map, false),
        };
        if deciding.contains(&id) {
            let own = match node.op {
                Op::Input { .. } | Op::Constant { .. } => new,
                _ if discontinuous(graph, id) => new,
                _ => same_op(&mut g, id, &keyed, true),
            };
            keyed.insert(id, own);
        }
        map.insert(id, new);
    }
    g.set_outputs(graph.outputs().iter().map(|o| map[o]).collect());
    (g, noise)
}

/// Noise input `noise` of perturbed run `run`: `1 + e` with `size / 2 <= |e| <= size`. Never
/// smaller: a noise that rounds to 1 in its dtype (a uniform `|e| <= size` did for about one
/// element in five) leaves its value where it was, and an element that the rounding moves far
/// got no spread. Keyed noise draws each element's `e` from its key's reference value (`keys`,
/// the values of `noise.keyed_by`), so equal values get equal noise.
fn noise_tensor(noise: &Noise, run: u64, keys: Option<&HostTensor>) -> HostTensor {
    let stream = run.wrapping_mul(0x1000_0001).wrapping_add(noise.index as u64);
    let mut rng = Rng::new(stream);
    // Keyed noise mixes its stream with each key: a salt keeps it apart from the other kind's.
    let keyed_stream = Rng::new(stream ^ 0x6b65_7965_6400_0000).next_u64();
    let values: Vec<f64> = (0..noise.shape.numel())
        .map(|i| {
            if let Some(keys) = keys {
                rng = Rng::new(keyed_stream ^ keys.get_f64(i).to_bits());
            }
            let sign = if rng.chance(0.5) { 1.0 } else { -1.0 };
            1.0 + sign * noise.size * (0.5 + 0.5 * rng.next_unit())
        })
        .collect();
    HostTensor::from_f64(noise.dtype, noise.shape.clone(), &values).expect("one value per element")
}

/// Whether `a` is within `rtol`, `atol` and `widen` of `r`; a NaN or an infinity on either side
/// only matches the same.
pub fn close(a: f64, r: f64, (rtol, atol): (f64, f64), widen: f64) -> bool {
    if !a.is_finite() || !r.is_finite() {
        return a == r || (a.is_nan() && r.is_nan());
    }
    (a - r).abs() <= atol + rtol * r.abs() + widen
}

/// Judges a plan's outputs against `refs` (see the module docs); `Err` names the first element
/// that fails, or the output that needed the spread too often.
pub fn judge(actual: &[HostTensor], refs: &References) -> Result<Verdict, String> {
    let expected = &refs.expected;
    if actual.len() != expected.len() {
        return Err(format!("{} outputs, expected {}", actual.len(), expected.len()));
    }
    let mut verdict = Verdict::default();
    for (j, (a, e)) in actual.iter().zip(expected).enumerate() {
        let here = |msg: String| format!("output {j} ({}{}): {msg}", e.dtype(), e.shape());
        if !e.dtype().is_float() || a.dtype() != e.dtype() || a.shape() != e.shape() {
            assert_close_with(a, e, 0.0, 0.0).map_err(here)?;
            continue;
        }
        let tol = refs.tolerances[j];
        let cap = max_widened(e.numel());
        let mut widened = 0;
        for i in 0..e.numel() {
            let (x, r, w) = (a.get_f64(i), e.get_f64(i), refs.wide[j].get_f64(i));
            if close(x, r, tol, 0.0) {
                continue;
            }
            let others: Vec<f64> = refs.perturbed.iter().map(|p| p[j].get_f64(i)).collect();
            let fail = |why: &str| {
                here(format!(
                    "element {i}: actual {x}, expected {r} ({why}; wide reference {w}, perturbed references \
                     {others:?}; rtol {:e}, atol {:e})",
                    tol.0, tol.1
                ))
            };
            if !x.is_finite() && !r.is_finite() && close(x, w, tol, 0.0) {
                // Non-finite as a fused kernel computes it: a bf16 value past bf16's largest but
                // within f32's stays finite there, and `finite - inf` is not `inf - inf`.
                verdict.wide += 1;
                continue;
            }
            if x.is_finite() && !r.is_finite() && w.is_finite() && close(x, w, tol, 0.0) {
                // The mirror case: an f16/bf16 intermediate the reference overflowed (rounded
                // after its op) stays finite in a fused kernel's f32, and what follows is finite
                // as in the wide reference (gradient fuzz seed 217: an f16 grad NaN in the
                // reference, -0 in the plan and the wide reference).
                verdict.wide += 1;
                continue;
            }
            if !x.is_finite() && r.is_finite() && close(x, w, tol, 0.0) && others.iter().any(|p| !p.is_finite()) {
                // Non-finite as a fused kernel computes it (the wide reference), where a perturbed
                // reference leaves the finite value for a non-finite one too: the reference is
                // unstable here (GPU fuzz seed 24360: a bf16 -0 that is NaN in f32).
                verdict.unstable += 1;
                continue;
            }
            if !x.is_finite() || !r.is_finite() {
                // The reference is discontinuous here (an inexact zero times an infinity) only
                // when every perturbed reference left its value; the plan must then be like one
                // of them: non-finite too (the sign of that zero is the rounding's choice), or
                // within the tolerance of a finite one.
                let all_left = !others.is_empty() && others.iter().all(|&p| !close(p, r, tol, 0.0));
                let like = |p: f64| if x.is_finite() { close(x, p, tol, 0.0) } else { !p.is_finite() };
                if !all_left || !others.iter().any(|&p| like(p)) {
                    return Err(fail("a NaN or an infinity must match the reference"));
                }
            } else if close(x, w, tol, 0.0) {
                verdict.wide += 1;
                continue;
            } else {
                let spread = others.iter().filter(|p| p.is_finite()).map(|p| (p - r).abs()).fold(0.0, f64::max);
                let widen = SPREAD_FACTOR * spread;
                let candidates = [r, w].into_iter().chain(others.iter().copied());
                if !candidates.filter(|c| c.is_finite()).any(|c| close(x, c, tol, widen)) {
                    return Err(fail("outside the spread"));
                }
            }
            if others.iter().any(|&p| !close(p, r, tol, 0.0)) {
                verdict.unstable += 1;
                continue;
            }
            widened += 1;
            if widened > cap {
                return Err(fail(&format!("more than {cap} elements needed the spread where the reference is stable")));
            }
        }
        verdict.widened += widened;
        verdict.most_widened = verdict.most_widened.max(widened);
    }
    Ok(verdict)
}

// ---- tests of the judge -------------------------------------------------------------------------

/// An f32 sum that cancels (1000, then 16781 values near 1e-3, then -1000) loses the small
/// values' low bits while its partial sum is large: accumulated in order in f32 it is off by far
/// more than the f32 tolerance of its small result, and the perturbed references spread as far.
#[test]
fn long_f32_sums_pass_within_the_spread_of_the_reference() {
    let n = 16_783;
    let mut b = Builder::new();
    let x = b.input(DType::F32, [1, n]);
    let s = b.reduce(ReduceOp::Sum, x, &[1], true);
    let graph = b.finish(vec![s]);
    let mut values: Vec<f64> =
        random_inputs(&graph, 9351, |_| false)[0].to_f64_vec().iter().map(|v| v * 1e-3).collect();
    values[0] = 1000.0;
    values[n - 1] = -1000.0;
    let inputs = vec![HostTensor::from_f64(DType::F32, [1, n], &values).unwrap()];
    let produced = run_graph_on(&graph, &inputs, false).unwrap_or_else(|f| panic!("{}: {}", f.stage, f.message));
    assert!(produced.verdict.unstable > 0, "the f32 tolerance alone was enough; the case no longer tests the spread");
}

/// A graph of one softmax over rows of `dtype`, its inputs and its references.
fn softmax_rows(dtype: DType) -> (Graph, References) {
    let mut b = Builder::new();
    let x = b.input(dtype, [8, 33]);
    let y = b.op(Op::Softmax { axis: 1 }, &[x]);
    let graph = b.finish(vec![y]);
    let inputs = random_inputs(&graph, 3, |_| false);
    let refs = References::of(&graph, &inputs).unwrap();
    (graph, refs)
}

/// `refs`' reference with `change` applied to output 0's values.
fn altered(refs: &References, change: impl FnOnce(&mut Vec<f64>)) -> Vec<HostTensor> {
    let e = &refs.expected[0];
    let mut values = e.to_f64_vec();
    change(&mut values);
    vec![HostTensor::from_f64(e.dtype(), e.shape().clone(), &values).unwrap()]
}

/// The spread widens nothing where the reference is stable: an error of 1e-3 in a relu output
/// fails.
#[test]
fn the_spread_does_not_hide_errors_where_the_reference_is_stable() {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [64]);
    let e = b.un(UnaryOp::Exp, x);
    let y = b.un(UnaryOp::Relu, e);
    let graph = b.finish(vec![y]);
    let refs = References::of(&graph, &random_inputs(&graph, 1, |_| false)).unwrap();
    assert_eq!(judge(&refs.expected, &refs), Ok(Verdict::default()));
    let actual = altered(&refs, |v| v[7] += 1e-3);
    let err = judge(&actual, &refs).unwrap_err();
    assert!(err.starts_with("output 0 (f32[64]): element 7:"), "{err}");
}

/// Each output is judged with the tolerance of its own path: a bf16 branch elsewhere in the graph
/// leaves an f32 output at the f32 tolerance, a bf16 value that rounds on the path loosens it,
/// and a bf16 value that holds an exact copy does not.
#[test]
fn a_bf16_value_loosens_only_the_outputs_that_depend_on_it() {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [64]);
    let f32_path = b.un(UnaryOp::Exp, x);
    let narrow = b.cast(x, DType::BF16);
    let narrow_exp = b.un(UnaryOp::Exp, narrow);
    let widened_after = b.cast(narrow_exp, DType::F32);
    let exact_copy = b.cast(narrow, DType::F32);
    let exp_of_copy = b.un(UnaryOp::Exp, exact_copy);
    let graph = b.finish(vec![f32_path, narrow_exp, widened_after, exp_of_copy]);
    let (f32_tol, bf16_tol) = (tolerance(DType::F32), tolerance(DType::BF16));
    assert_eq!(output_tolerances(&graph), vec![f32_tol, bf16_tol, bf16_tol, f32_tol]);

    let refs = References::of(&graph, &random_inputs(&graph, 2, |_| false)).unwrap();
    assert!(judge(&refs.expected, &refs).is_ok());
    // 1e-4 relative is far inside bf16's tolerance and ten times f32's.
    let mut actual = refs.expected.clone();
    let values: Vec<f64> = actual[0].to_f64_vec().iter().map(|v| v * (1.0 + 1e-4)).collect();
    actual[0] = HostTensor::from_f64(DType::F32, [64], &values).unwrap();
    let err = judge(&actual, &refs).unwrap_err();
    assert!(err.starts_with("output 0 (f32[64]): element 0:"), "{err}");
}

/// A wrong row fails, in f32 and in bf16, even where the row is only a few tolerances off.
#[test]
fn the_judge_catches_a_wrong_row() {
    for dtype in [DType::F32, DType::BF16] {
        let (_, refs) = softmax_rows(dtype);
        let (rtol, atol) = refs.tolerances[0];
        let actual = altered(&refs, |v| v[3 * 33..4 * 33].iter_mut().for_each(|x| *x += 3.0 * (atol + rtol * x.abs())));
        let err = judge(&actual, &refs).unwrap_err();
        assert!(err.starts_with(&format!("output 0 ({dtype}[8,33]): element 99:")), "{err}");
    }
}

/// A wrong vector tail (the last elements, past the last full vector) fails.
#[test]
fn the_judge_catches_a_wrong_vector_tail() {
    for dtype in [DType::F32, DType::BF16] {
        let (_, refs) = softmax_rows(dtype);
        let numel = refs.expected[0].numel();
        let actual = altered(&refs, |v| v[numel - 3..].iter_mut().for_each(|x| *x = 0.0));
        let err = judge(&actual, &refs).unwrap_err();
        assert!(err.starts_with(&format!("output 0 ({dtype}[8,33]): element {}:", numel - 3)), "{err}");
    }
}

/// A NaN or an infinity where the reference is finite fails, also when the wide reference or a
/// perturbed reference alone holds one there; and a finite value where the reference and the
/// perturbed references are NaN fails.
#[test]
fn the_judge_catches_a_nan_where_the_reference_is_finite() {
    for bad in [f64::NAN, f64::INFINITY] {
        let (_, mut refs) = softmax_rows(DType::F32);
        let actual = altered(&refs, |v| v[5] = bad);
        let err = judge(&actual, &refs).unwrap_err();
        assert!(err.starts_with("output 0 (f32[8,33]): element 5:"), "{err}");
        refs.wide = altered(&refs, |v| v[5] = bad);
        assert!(judge(&actual, &refs).is_err(), "{bad} matched a non-finite wide reference alone");
        refs.wide = refs.expected.clone();
        refs.perturbed[0] = altered(&refs, |v| v[5] = bad);
        assert!(judge(&actual, &refs).is_err(), "{bad} matched one non-finite perturbed reference alone");
        // Only where every perturbed reference leaves the reference is the element unstable.
        for run in 1..refs.perturbed.len() {
            refs.perturbed[run] = altered(&refs, |v| v[5] = f64::NEG_INFINITY);
        }
        assert_eq!(judge(&actual, &refs).map(|v| v.unstable), Ok(1));
        // Or where the plan is the wide reference's non-finite value and a perturbed reference
        // leaves for a non-finite value too (GPU fuzz seed 24360).
        let (_, mut refs) = softmax_rows(DType::F32);
        refs.wide = altered(&refs, |v| v[5] = bad);
        refs.perturbed[0] = altered(&refs, |v| v[5] = bad);
        assert_eq!(judge(&actual, &refs).map(|v| v.unstable), Ok(1));
    }
    let (_, mut refs) = softmax_rows(DType::F32);
    let finite = refs.expected.clone();
    refs.expected = altered(&refs, |v| v[5] = f64::NAN);
    for run in 0..refs.perturbed.len() {
        refs.perturbed[run] = refs.expected.clone();
    }
    // An f32 graph: the wide reference is the reference.
    refs.wide = refs.expected.clone();
    assert!(judge(&finite, &refs).is_err(), "a finite value matched a NaN reference");
    // Where the wide reference (narrow intermediates kept in f32, as kernels keep them) is the
    // finite value, the reference overflowed an intermediate the plan did not.
    refs.wide = finite.clone();
    assert_eq!(judge(&finite, &refs).map(|v| v.wide), Ok(1));
}

/// A layer norm that centres on the rounded f32 mean `sum(x) * (1/n)` (sums in order), as braze's
/// plans did until fuzz seed 412000123: on a row of one repeated value it leaves a residual of a
/// few ulps.
fn rounded_mean_layer_norm(x: &[f64], w: &[f64], b: &[f64], eps: f64) -> Vec<f64> {
    let inv_n = (1.0 / x.len() as f64) as f32;
    let x: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let mean = x.iter().fold(0.0f32, |s, &v| s + v) * inv_n;
    let centred: Vec<f32> = x.iter().map(|&v| v - mean).collect();
    let var = centred.iter().fold(0.0f32, |s, &c| s + c * c) * inv_n;
    let scale = 1.0 / (var + eps as f32).sqrt();
    centred.iter().zip(w).zip(b).map(|((&c, &w), &b)| f64::from(c * scale * w as f32 + b as f32)).collect()
}

/// Seed 7,000,198: a layer norm of a constant row. `x - mean` is 0 in f64 and, with a rounded f32
/// mean, a few ulps in f32, times `1/sqrt(eps)`: every element of the row moves by more than the
/// f32 tolerance, and where the weight is -inf the reference has NaN (`0 * -inf`) and that f32
/// result -inf. Every perturbed reference moves too, so the elements pass as unstable; with one
/// perturbed reference that keeps the NaN, the -inf fails. (braze's plans now centre such a row
/// to exactly 0 and give the reference's bits.)
#[test]
fn a_discontinuous_reference_is_unstable() {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [33]);
    let (w, bias) = (b.input(DType::F32, [33]), b.input(DType::F32, [33]));
    let y = b.op(Op::LayerNorm { eps: 1e-5 }, &[x, w, bias]);
    let graph = b.finish(vec![y]);
    let mut weight = vec![0.5; 33];
    weight[2] = f64::NEG_INFINITY;
    let inputs = vec![
        HostTensor::from_f64(DType::F32, [33], &[-0.15843041241168976; 33]).unwrap(),
        HostTensor::from_f64(DType::F32, [33], &weight).unwrap(),
        HostTensor::from_f64(DType::F32, [33], &[0.25; 33]).unwrap(),
    ];
    let mut refs = References::of(&graph, &inputs).unwrap();
    assert!(refs.expected[0].get_f64(2).is_nan(), "0 * -inf in the reference");
    let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
    let planned = eval_plan(&plan, &inputs).unwrap()[0].to_f64_vec();
    assert!(planned[2].is_nan(), "the plan centres the row to 0: 0 * -inf");
    assert!(planned.iter().enumerate().all(|(i, &v)| i == 2 || v == 0.25), "the plan gives the bias: {planned:?}");
    let rounded = rounded_mean_layer_norm(&inputs[0].to_f64_vec(), &weight, &[0.25; 33], 1e-5);
    let actual = vec![HostTensor::from_f64(DType::F32, [33], &rounded).unwrap()];
    assert_eq!(actual[0].get_f64(2), f64::NEG_INFINITY, "a few ulps times -inf");
    let verdict = judge(&actual, &refs).unwrap();
    assert_eq!((verdict.widened, verdict.unstable), (0, 1), "{verdict:?}");
    // Perturbed references that both went to +inf (the rounding's sign) leave it unstable too.
    let mut plus = refs.clone();
    for run in 0..plus.perturbed.len() {
        let mut values = plus.perturbed[run][0].to_f64_vec();
        values[2] = f64::INFINITY;
        plus.perturbed[run] = vec![HostTensor::from_f64(DType::F32, [33], &values).unwrap()];
    }
    assert_eq!(judge(&actual, &plus).map(|v| v.unstable), Ok(1));
    // With one perturbed reference not moved there, it fails.
    refs.perturbed[1] = refs.expected.clone();
    assert!(judge(&actual, &refs).is_err());
}

/// At most [`max_widened`] elements of an output may pass only within the spread where the
/// reference is stable; where it is unstable, the spread is not capped but counted.
#[test]
fn the_spread_is_allowed_for_a_bounded_number_of_elements() {
    let shape = [64];
    let at = |value: f64| vec![HostTensor::from_f64(DType::F32, shape, &[value; 64]).unwrap()];
    // 1 + 5e-6 is within the f32 tolerance of 1: the reference is stable, its spread 5e-6.
    let mut refs = References {
        expected: at(1.0),
        wide: at(1.0),
        perturbed: vec![at(1.0 + 5e-6), at(1.0)],
        tolerances: vec![tolerance(DType::F32)],
    };
    let cap = max_widened(64);
    assert_eq!(cap, 4);
    let off = |n: usize, by: f64| {
        let values: Vec<f64> = (0..64).map(|i| if i < n { 1.0 + by } else { 1.0 }).collect();
        vec![HostTensor::from_f64(DType::F32, shape, &values).unwrap()]
    };
    assert_eq!(judge(&off(cap, 3e-5), &refs).map(|v| v.widened), Ok(cap));
    let err = judge(&off(cap + 1, 3e-5), &refs).unwrap_err();
    assert!(err.contains("more than 4 elements needed the spread where the reference is stable"), "{err}");
    // Beyond 4 times the spread of every reference, a single element fails.
    let err = judge(&off(1, 8e-5), &refs).unwrap_err();
    assert!(err.contains("element 0:") && err.contains("outside the spread"), "{err}");
    // An unstable reference (a perturbed reference 1e-2 away) widens every element, counted.
    refs.perturbed[0] = at(1.01);
    let verdict = judge(&off(64, 3e-2), &refs).unwrap();
    assert_eq!((verdict.widened, verdict.unstable), (0, 64));
}

/// The backward of a bf16 max over two rows of `a * s`, as autodiff writes it: each column's
/// gradient share, `(y == max(y)) / count`, and the mask `y == max(y)`. Columns 0-3 hold
/// near-ties (the rows a bf16 ulp apart), columns 4-7 exact ties.
fn max_backward_of_ties() -> (Graph, References) {
    let mut b = Builder::new();
    let a = b.input(DType::BF16, [2, 8]);
    let s = b.input(DType::BF16, [2, 8]);
    let y = b.mul(a, s);
    let max = b.reduce(ReduceOp::Max, y, &[0], true);
    let max = b.broadcast_to(max, [2, 8]);
    let tie = b.bin(BinaryOp::Eq, y, max);
    let mask = b.cast(tie, DType::BF16);
    let count = b.reduce(ReduceOp::Sum, mask, &[0], true);
    let share = b.bin(BinaryOp::Div, mask, count);
    let graph = b.finish(vec![share, mask]);
    let ulp = 2f64.powi(-6);
    let top: Vec<f64> = (0..8).map(|c| 2.5 + c as f64 * 0.125).collect();
    let bottom: Vec<f64> = top.iter().enumerate().map(|(c, &v)| if c < 4 { v + ulp } else { v }).collect();
    let inputs = vec![
        HostTensor::from_f64(DType::BF16, [2, 8], &[top, bottom].concat()).unwrap(),
        HostTensor::from_f64(DType::BF16, [2, 8], &[1.0; 16]).unwrap(),
    ];
    let refs = References::of(&graph, &inputs).unwrap();
    (graph, refs)
}

/// Gradient fuzz seed 70,003,704: a plan's legitimate rounding made two bf16 matmul outputs 1 ulp
/// apart in the reference equal, and the max's backward split the gradient where the reference
/// sent it to one of them. The perturbed references flip such near-ties, so a split passes
/// within their spread; exact ties they keep, so a plan that breaks one still fails.
#[test]
fn perturbed_references_flip_near_ties_and_keep_exact_ties() {
    let (_, refs) = max_backward_of_ties();
    let at = |t: &HostTensor, col: usize| (t.get_f64(col), t.get_f64(8 + col));
    for c in 0..8 {
        let want = if c < 4 { ((0.0, 1.0), (0.0, 1.0)) } else { ((0.5, 0.5), (1.0, 1.0)) };
        assert_eq!((at(&refs.expected[0], c), at(&refs.expected[1], c)), want, "column {c}");
    }
    for (run, p) in refs.perturbed.iter().enumerate() {
        for c in 4..8 {
            assert_eq!(at(&p[1], c), (1.0, 1.0), "run {run} broke the tie of column {c}");
        }
    }
    let flipped = (0..4)
        .find(|&c| refs.perturbed.iter().any(|p| at(&p[1], c).0 == 1.0))
        .expect("no perturbed reference flipped a near-tie");
    let with_shares = |change: &dyn Fn(&mut Vec<f64>)| vec![altered(&refs, change).remove(0), refs.expected[1].clone()];
    // A plan that rounds the near-tie of column `flipped` to a tie splits its gradient: it passes.
    let split = with_shares(&|v| (v[flipped], v[8 + flipped]) = (0.5, 0.5));
    assert_eq!(judge(&split, &refs).map(|v| v.unstable), Ok(2));
    // One that sends the gradient of an exact tie to one row fails.
    let broken = with_shares(&|v| (v[4], v[12]) = (1.0, 0.0));
    let err = judge(&broken, &refs).unwrap_err();
    assert!(err.contains("element 4:") && err.contains("outside the spread"), "{err}");
}
