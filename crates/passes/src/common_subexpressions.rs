//! Merges nodes that compute the same value: same op and attributes, same operands (in either
//! order for commutative ops), same dtype and shape. Constants are equal when their values have
//! the same bits (so NaN equals NaN, and 0.0 differs from -0.0).

use crate::{Pass, Result};
use braze_ir::{DType, Graph, Node, NodeId, Op, Shape};
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, Default)]
pub struct CommonSubexpressions;

/// Everything that decides a node's value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ValueKey {
    op: String,
    operands: Vec<NodeId>,
    dtype: DType,
    shape: Shape,
}

fn value_key(node: &Node) -> ValueKey {
    // Float attributes compare by bits; the other ops have no floats in their Debug form.
    let op = match &node.op {
        Op::Constant { value } => format!("const {:?}", value.bit_key()),
        Op::LayerNorm { eps } | Op::RmsNorm { eps } => format!("{} {:016x}", node.op.name(), eps.to_bits()),
        other => format!("{other:?}"),
    };
    let mut operands = node.operands.clone();
    if let Op::Binary { op } = node.op {
        if op.is_commutative() {
            operands.sort();
        }
    }
    ValueKey { op, operands, dtype: node.dtype, shape: node.shape.clone() }
}

impl Pass for CommonSubexpressions {
    fn name(&self) -> &'static str {
        "common_subexpressions"
    }

    fn run(&self, g: &mut Graph) -> Result<bool> {
        let mut first: HashMap<ValueKey, NodeId> = HashMap::new();
        let mut changed = false;
        // Topological order: a node's operands are already merged when its key is built.
        for id in g.topo_order() {
            if matches!(g.node(id).op, Op::Input { .. }) {
                continue;
            }
            let key = value_key(g.node(id));
            match first.get(&key) {
                Some(&kept) => {
                    // A value both passes compute is forward work: the forward needs it first
                    // (topological order may have met the backward's copy first, as for a
                    // constant or a cast of a weight both read).
                    let backward = |n: NodeId| g.node(n).loc.as_ref().is_some_and(|l| l.backward);
                    if backward(kept) && g.node(id).loc.is_some() && !backward(id) {
                        let loc = g.node(id).loc.clone();
                        g.set_loc(kept, loc);
                    }
                    g.replace_all_uses(id, kept);
                    g.remove(id)?;
                    changed = true;
                }
                None => {
                    first.insert(key, id);
                }
            }
        }
        Ok(changed)
    }
}
