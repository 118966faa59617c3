//! Puts a graph into the forms the fusion rules match, on a copy: dead code removed, composites
//! and means decomposed, stack written as a concat of reshapes (a reshape is free), and matmul
//! operands whose batch dims broadcast only partly made explicit with broadcast_to (one batch
//! stride cannot express them, so that view gets materialized).

use crate::decompose::{self, Origins};
use crate::{DeadCode, Pass, Result};
use braze_ir::{Graph, NodeId, Op, Shape};

pub(crate) fn legalize(graph: &Graph, origins: &Origins) -> Result<(Graph, Origins)> {
    let mut g = graph.clone();
    let mut origins = origins.clone();
    DeadCode.run(&mut g)?;
    if decompose::needs_decomposition(&g) {
        decompose::decompose(&mut g, &mut origins)?;
    }
    for id in g.topo_order() {
        match g.node(id).op {
            Op::Stack { axis } => stack_as_concat(&mut g, &mut origins, id, axis)?,
            Op::MatMul => broadcast_matmul_batches(&mut g, &mut origins, id)?,
            _ => {}
        }
    }
    if cfg!(debug_assertions) {
        g.verify()?;
    }
    Ok((g, origins))
}

fn stack_as_concat(g: &mut Graph, origins: &mut Origins, id: NodeId, axis: usize) -> Result<()> {
    let node = g.node(id).clone();
    let mut parts = Vec::with_capacity(node.operands.len());
    for &x in &node.operands {
        let mut dims = g.node(x).shape.dims().to_vec();
        dims.insert(axis, 1);
        let part = g.reshape(x, dims)?;
        g.set_loc(part, node.loc.clone());
        origins.insert(part, "stack");
        parts.push(part);
    }
    let concat = g.add(Op::Concat { axis }, &parts, node.loc.clone())?;
    origins.insert(concat, "stack");
    g.replace_all_uses(id, concat);
    g.remove(id)?;
    Ok(())
}

fn broadcast_matmul_batches(g: &mut Graph, origins: &mut Origins, id: NodeId) -> Result<()> {
    let node = g.node(id).clone();
    let out = node.shape.dims();
    let batch = &out[..out.len() - 2];
    let mut operands = node.operands.clone();
    let mut changed = false;
    for x in operands.iter_mut() {
        let dims = g.node(*x).shape.dims().to_vec();
        let own_batch = &dims[..dims.len() - 2];
        // Padded with leading 1s to the output's batch rank, as broadcasting reads it.
        let mut padded = vec![1; batch.len().saturating_sub(own_batch.len())];
        padded.extend_from_slice(own_batch);
        let partial = padded != batch && padded.iter().any(|&d| d != 1);
        if partial {
            let mut full = batch.to_vec();
            full.extend_from_slice(&dims[dims.len() - 2..]);
            let widened = g.broadcast_to(*x, Shape(full))?;
            g.set_loc(widened, node.loc.clone());
            if let Some(origin) = origins.get(&id).copied() {
                origins.insert(widened, origin);
            }
            *x = widened;
            changed = true;
        }
    }
    if changed {
        let rebuilt = g.add(Op::MatMul, &operands, node.loc.clone())?;
        if let Some(origin) = origins.get(&id).copied() {
            origins.insert(rebuilt, origin);
        }
        g.replace_all_uses(id, rebuilt);
        g.remove(id)?;
    }
    Ok(())
}
