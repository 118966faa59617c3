//! Shrinking a failing graph: outputs dropped, ops cut into inputs holding the values they had,
//! or bypassed, while the same stage still fails.

use crate::common::{random_inputs, Builder};
use crate::run::{Failure, Stage};
use braze_cpu::eval_graph;
use braze_ir::{DType, Graph, HostTensor, NodeId, Op, ReduceOp, UnaryOp};
use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// Where an input of a rebuilt graph gets its data: an input of the graph it came from, or the
/// value a node of it had.
#[derive(Clone, Copy, Debug)]
enum Source {
    Input(usize),
    Node(NodeId),
}

/// `graph` rebuilt from `outputs`, with `cut` turned into a new input and every use of
/// `bypass.0` reading `bypass.1`; nodes no output needs are left out. `None` when an op no longer
/// type-checks.
fn rebuild(
    graph: &Graph,
    outputs: &[NodeId],
    cut: Option<NodeId>,
    bypass: Option<(NodeId, NodeId)>,
) -> Option<(Graph, Vec<Source>)> {
    let resolve = |id: NodeId| match bypass {
        Some((from, to)) if from == id => to,
        _ => id,
    };
    let mut needed = HashSet::new();
    let mut stack: Vec<NodeId> = outputs.iter().map(|&o| resolve(o)).collect();
    while let Some(n) = stack.pop() {
        if needed.insert(n) && Some(n) != cut {
            stack.extend(graph.node(n).operands.iter().map(|&o| resolve(o)));
        }
    }
    let mut g = Graph::new();
    let mut sources = Vec::new();
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    for id in graph.topo_order() {
        if !needed.contains(&id) {
            continue;
        }
        let node = graph.node(id);
        let new = match node.op {
            _ if Some(id) == cut => {
                sources.push(Source::Node(id));
                g.input(node.dtype, node.shape.clone())
            }
            Op::Input { index } => {
                sources.push(Source::Input(index));
                g.input(node.dtype, node.shape.clone())
            }
            Op::Constant { value } => g.literal(value, node.dtype),
            _ => {
                let operands: Vec<NodeId> = node.operands.iter().map(|&o| map[&resolve(o)]).collect();
                g.add_declared(node.op.clone(), &operands, node.dtype, node.shape.clone(), None).ok()?
            }
        };
        map.insert(id, new);
    }
    g.set_outputs(outputs.iter().map(|&o| map[&resolve(o)]).collect());
    Some((g, sources))
}

/// A graph and the inputs it runs on.
#[derive(Clone)]
pub struct Repro {
    pub graph: Graph,
    pub inputs: Vec<HostTensor>,
}

impl Repro {
    /// The reference value of `node`, for an input that replaces it.
    fn value_of(&self, node: NodeId) -> Option<HostTensor> {
        let (g, sources) = rebuild(&self.graph, &[node], None, None)?;
        let inputs = self.inputs_for(&sources)?;
        eval_graph(&g, &inputs).ok()?.pop()
    }

    fn inputs_for(&self, sources: &[Source]) -> Option<Vec<HostTensor>> {
        sources
            .iter()
            .map(|s| match *s {
                Source::Input(i) => Some(self.inputs[i].clone()),
                Source::Node(n) => self.value_of(n),
            })
            .collect()
    }

    /// A smaller repro from `rebuild`'s result: cut nodes keep the values they had.
    fn step(&self, rebuilt: Option<(Graph, Vec<Source>)>) -> Option<Repro> {
        let (graph, sources) = rebuilt?;
        Some(Repro { inputs: self.inputs_for(&sources)?, graph })
    }

    /// Inputs small enough to read, as text.
    pub fn small_inputs(&self) -> String {
        let mut text = String::new();
        for (i, t) in self.inputs.iter().enumerate() {
            if (1..=16).contains(&t.numel()) {
                let _ = writeln!(text, "input {i} = {:?}", t.to_f64_vec());
            }
        }
        text
    }
}

/// Ops count most, then inputs and outputs.
fn size(graph: &Graph) -> usize {
    4 * graph.op_count() + graph.inputs().len() + graph.outputs().len()
}

/// Smaller repros made from `repro` by one step each: an output dropped or replaced by an
/// operand, an op cut into an input holding its value, or an op bypassed.
fn shrink_steps(repro: &Repro) -> Vec<Repro> {
    let graph = &repro.graph;
    let outputs = graph.outputs().to_vec();
    let mut steps = Vec::new();
    for j in 0..outputs.len() {
        if outputs.len() > 1 {
            let mut fewer = outputs.clone();
            fewer.remove(j);
            steps.extend(repro.step(rebuild(graph, &fewer, None, None)));
        }
        for &operand in &graph.node(outputs[j]).operands {
            let mut earlier = outputs.clone();
            earlier[j] = operand;
            steps.extend(repro.step(rebuild(graph, &earlier, None, None)));
        }
    }
    for id in graph.topo_order() {
        let node = graph.node(id);
        if matches!(node.op, Op::Input { .. } | Op::Constant { .. }) {
            continue;
        }
        steps.extend(repro.step(rebuild(graph, &outputs, Some(id), None)));
        for &o in &node.operands {
            let same_type = graph.node(o).dtype == node.dtype && graph.node(o).shape == node.shape;
            if same_type {
                steps.extend(repro.step(rebuild(graph, &outputs, None, Some((id, o)))));
            }
        }
    }
    steps
}

/// Shrinks `repro` while `run` still fails it at `failure.stage`; returns the smallest repro and
/// its failure.
pub fn shrink(mut repro: Repro, mut failure: Failure, run: impl Fn(&Repro) -> Option<Failure>) -> (Repro, Failure) {
    'outer: loop {
        for candidate in shrink_steps(&repro) {
            if size(&candidate.graph) >= size(&repro.graph) {
                continue;
            }
            if let Some(f) = run(&candidate) {
                if f.stage == failure.stage {
                    repro = candidate;
                    failure = f;
                    continue 'outer;
                }
            }
        }
        return (repro, failure);
    }
}

#[test]
fn shrinking_finds_the_one_op_that_fails() {
    // A stand-in failure: any graph holding an `exp` fails to compare. Shrinking must drop the
    // other output, cut the ops before the exp into inputs and bypass the ops after it.
    let mut b = Builder::new();
    let x = b.input(DType::F32, [4, 3]);
    let y = b.input(DType::F32, [3]);
    let xy = b.add(x, y);
    let e = b.un(UnaryOp::Exp, xy);
    let n = b.un(UnaryOp::Neg, e);
    let s = b.reduce(ReduceOp::Sum, n, &[1], false);
    let r = b.un(UnaryOp::Relu, x);
    let graph = b.finish(vec![s, r]);
    let has_exp = |g: &Graph| g.node_ids().iter().any(|&id| g.node(id).op == Op::Unary { op: UnaryOp::Exp });
    let fails = |r: &Repro| has_exp(&r.graph).then(|| Failure { stage: Stage::Compare, message: "exp".into() });
    let inputs = random_inputs(&graph, 0, |_| false);
    let repro = Repro { graph, inputs };
    let first = fails(&repro).unwrap();
    let (small, failure) = shrink(repro.clone(), first, fails);
    assert_eq!(failure.stage, Stage::Compare);
    assert_eq!(small.graph.to_text(), "graph(%0: f32[4,3]) {\n  %1 = exp %0 : f32[4,3]\n  return %1\n}\n");
    // The cut input holds what it replaced: x + y.
    let xy: Vec<f64> = (0..12).map(|i| repro.inputs[0].get_f64(i) + repro.inputs[1].get_f64(i % 3)).collect();
    assert_eq!(small.inputs[0].to_f64_vec(), xy.iter().map(|&v| v as f32 as f64).collect::<Vec<_>>());
}
