//! The verifier: run after building and after every pass (in debug builds and tests) so a pass
//! that breaks an invariant is caught where it happens.

use crate::infer::{infer, Declared};
use crate::{DType, Graph, IrError, Op, Result, Shape};

impl Graph {
    pub fn verify(&self) -> Result<()> {
        let fail = |node: String, detail: String| Err(IrError::Verify { node, detail });
        for (i, &id) in self.inputs().iter().enumerate() {
            if !self.contains(id) {
                return fail(id.to_string(), "graph input was removed".into());
            }
            match self.node(id).op {
                Op::Input { index } if index == i => {}
                _ => return fail(id.to_string(), format!("input list entry {i} is not input #{i}")),
            }
        }
        for &o in self.outputs() {
            if !self.contains(o) {
                return fail(o.to_string(), "graph output is not in the graph".into());
            }
        }
        let order = self.topo_order();
        let inputs: std::collections::HashSet<_> = self.inputs().iter().copied().collect();
        if order.len() != self.len() {
            return fail("graph".into(), "the graph has a cycle".into());
        }
        for id in order {
            let node = self.node(id);
            if let Op::Input { .. } = node.op {
                if !inputs.contains(&id) {
                    return fail(id.to_string(), "input node missing from the input list".into());
                }
                continue;
            }
            for &o in &node.operands {
                if !self.contains(o) {
                    return fail(id.to_string(), format!("operand {o} is not in the graph"));
                }
            }
            let types: Vec<(DType, Shape)> =
                node.operands.iter().map(|&o| (self.node(o).dtype, self.node(o).shape.clone())).collect();
            let refs: Vec<(DType, &Shape)> = types.iter().map(|(d, s)| (*d, s)).collect();
            let (dtype, shape) = infer(&node.op, &refs, Some(Declared { dtype: node.dtype, shape: &node.shape }))
                .map_err(|e| IrError::Verify { node: id.to_string(), detail: e.to_string() })?;
            if dtype != node.dtype || shape != node.shape {
                return fail(
                    id.to_string(),
                    format!(
                        "{} records {}{} but its operands give {}{}",
                        node.op.name(),
                        node.dtype,
                        node.shape,
                        dtype,
                        shape
                    ),
                );
            }
        }
        Ok(())
    }
}
