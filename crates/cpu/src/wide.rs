//! The wide reference: a graph's computation with its bf16/f16 intermediates kept in f32, as one
//! fused kernel computes it. A compiled plan rounds narrow values only where it stores them (a
//! subset of the op-by-op reference's rounding points), so its outputs may legitimately sit
//! nearer this reference than the op-by-op one: an element that cancels (`gelu(x) + res` near 0)
//! carries a whole ulp of the cancelled terms in the one and not in the other.

use crate::Result;
use braze_ir::{DType, Graph, NodeId, Op};
use std::collections::HashMap;

/// `graph` with every computed bf16/f16 value computed as f32 instead: inputs, constants and aranges keep
/// their (exact) narrow values and are widened where used, explicit casts to bf16/f16 still
/// round, and each narrow output is rounded to its dtype at the end. Its inputs are `graph`'s,
/// in the same order, so [`crate::eval_graph`] takes the same input tensors.
pub fn wide_graph(graph: &Graph) -> Result<Graph> {
    let mut g = Graph::new();
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    // Each narrow value's f32 copy, made once however many ops read it.
    let mut widened: HashMap<NodeId, NodeId> = HashMap::new();
    // Inputs come first in topological order, so they keep their indices.
    for id in graph.topo_order() {
        let node = graph.node(id);
        let new = match node.op {
            Op::Input { .. } => g.input(node.dtype, node.shape.clone()),
            Op::Constant { value } => g.literal(value, node.dtype),
            // A kernel rounds an arange's elements to its dtype, as a cast would.
            Op::Arange => g.arange(node.shape.numel(), node.dtype)?,
            Op::Cast if g.node(map[&node.operands[0]]).dtype == node.dtype => map[&node.operands[0]],
            Op::Cast => g.cast(map[&node.operands[0]], node.dtype)?,
            _ => {
                let mut operands = Vec::with_capacity(node.operands.len());
                for o in &node.operands {
                    let x = map[o];
                    operands.push(if g.node(x).dtype.is_narrow_float() {
                        match widened.get(&x) {
                            Some(&w) => w,
                            None => {
                                let w = g.cast(x, DType::F32)?;
                                widened.insert(x, w);
                                w
                            }
                        }
                    } else {
                        x
                    });
                }
                let dtype = if node.dtype.is_narrow_float() { DType::F32 } else { node.dtype };
                g.add_declared(node.op.clone(), &operands, dtype, node.shape.clone(), None)?
            }
        };
        map.insert(id, new);
    }
    let mut outputs = Vec::with_capacity(graph.outputs().len());
    for &o in graph.outputs() {
        let (new, dtype) = (map[&o], graph.node(o).dtype);
        outputs.push(if g.node(new).dtype == dtype { new } else { g.cast(new, dtype)? });
    }
    g.set_outputs(outputs);
    Ok(g)
}
