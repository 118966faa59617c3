//! Removes nodes that no graph output depends on. Inputs stay: they are part of the signature.

use crate::{Pass, Result};
use braze_ir::{Graph, NodeId, Op};
use std::collections::HashSet;

#[derive(Clone, Copy, Debug, Default)]
pub struct DeadCode;

impl Pass for DeadCode {
    fn name(&self) -> &'static str {
        "dead_code"
    }

    fn run(&self, g: &mut Graph) -> Result<bool> {
        let mut live: HashSet<NodeId> = HashSet::new();
        let mut stack: Vec<NodeId> = g.outputs().to_vec();
        while let Some(id) = stack.pop() {
            if live.insert(id) {
                stack.extend(g.node(id).operands.iter().copied());
            }
        }
        // Users before operands, so every node is unused when its turn comes.
        let dead: Vec<NodeId> = g
            .topo_order()
            .into_iter()
            .rev()
            .filter(|id| !live.contains(id) && !matches!(g.node(*id).op, Op::Input { .. }))
            .collect();
        for &id in &dead {
            g.remove(id)?;
        }
        Ok(!dead.is_empty())
    }
}
