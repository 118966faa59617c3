//! JSON form (serde): nodes in topological order with canonical ids. Reading it back rebuilds the
//! graph through the same typing rules and verifies it.

use crate::{DType, Graph, IrError, NodeId, Op, Result, Shape, SourceLoc};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct GraphJson {
    inputs: Vec<usize>,
    outputs: Vec<usize>,
    nodes: Vec<NodeJson>,
}

#[derive(Serialize, Deserialize)]
struct NodeJson {
    id: usize,
    #[serde(flatten)]
    op: Op,
    operands: Vec<usize>,
    dtype: DType,
    shape: Shape,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    loc: Option<SourceLoc>,
}

impl Graph {
    pub fn to_json(&self) -> String {
        let num = self.canonical_numbering();
        let nodes = self
            .topo_order()
            .into_iter()
            .map(|id| {
                let n = self.node(id);
                NodeJson {
                    id: num[&id],
                    op: n.op.clone(),
                    operands: n.operands.iter().map(|o| num[o]).collect(),
                    dtype: n.dtype,
                    shape: n.shape.clone(),
                    loc: n.loc.clone(),
                }
            })
            .collect();
        let g = GraphJson {
            inputs: self.inputs().iter().map(|i| num[i]).collect(),
            outputs: self.outputs().iter().map(|o| num[o]).collect(),
            nodes,
        };
        serde_json::to_string_pretty(&g).expect("graph JSON serialization cannot fail")
    }

    pub fn from_json(text: &str) -> Result<Graph> {
        let g: GraphJson = serde_json::from_str(text).map_err(|e| IrError::Json(e.to_string()))?;
        let mut graph = Graph::new();
        let mut ids: std::collections::HashMap<usize, NodeId> = Default::default();
        let lookup = |ids: &std::collections::HashMap<usize, NodeId>, i: usize| {
            ids.get(&i).copied().ok_or_else(|| IrError::Json(format!("node %{i} is used before it is defined")))
        };
        for n in g.nodes {
            let operands = n.operands.iter().map(|&o| lookup(&ids, o)).collect::<Result<Vec<_>>>()?;
            let id = match n.op {
                Op::Input { index } => {
                    if index != graph.inputs().len() {
                        return Err(IrError::Json(format!("input #{index} out of order")));
                    }
                    graph.input(n.dtype, n.shape)
                }
                Op::Constant { value } => graph.literal(value, n.dtype),
                op => graph.add_declared(op, &operands, n.dtype, n.shape, None)?,
            };
            graph.set_loc(id, n.loc);
            ids.insert(n.id, id);
        }
        let inputs = g.inputs.iter().map(|&i| lookup(&ids, i)).collect::<Result<Vec<_>>>()?;
        if inputs != graph.inputs() {
            return Err(IrError::Json("input list does not match the input nodes".into()));
        }
        let outputs = g.outputs.iter().map(|&o| lookup(&ids, o)).collect::<Result<Vec<_>>>()?;
        graph.set_outputs(outputs);
        graph.verify()?;
        Ok(graph)
    }
}
