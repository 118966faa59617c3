//! The text form: ids renumbered in topological order, one op a line.
//!
//! ```text
//! graph(%0: f32[64,256], %1: f32[256], %2: f32[256]) {
//!   %3 = layer_norm %0, %1, %2, eps=1e-5 : f32[64,256]
//!   return %3
//! }
//! ```

use crate::{Graph, NodeId, Op};
use std::collections::HashMap;
use std::fmt::Write;

impl Graph {
    /// Renumbering used by the text and JSON forms: position in `topo_order()`.
    pub fn canonical_numbering(&self) -> HashMap<NodeId, usize> {
        self.topo_order().into_iter().enumerate().map(|(i, n)| (n, i)).collect()
    }

    /// Deterministic text form without source locations (stable across edits of the caller).
    pub fn to_text(&self) -> String {
        self.render(false)
    }

    /// Text form with each op's source location as a trailing `@ file:line:col`.
    pub fn to_text_with_locations(&self) -> String {
        self.render(true)
    }

    fn render(&self, locations: bool) -> String {
        let num = self.canonical_numbering();
        let name = |id: &NodeId| format!("%{}", num[id]);
        let mut out = String::new();
        let params: Vec<String> = self
            .inputs()
            .iter()
            .map(|i| format!("{}: {}{}", name(i), self.node(*i).dtype, self.node(*i).shape))
            .collect();
        let _ = writeln!(out, "graph({}) {{", params.join(", "));
        for id in self.topo_order() {
            let node = self.node(id);
            if matches!(node.op, Op::Input { .. }) {
                continue;
            }
            let mut args: Vec<String> = node.operands.iter().map(name).collect();
            let attrs = node.op.attributes();
            if !attrs.is_empty() {
                args.push(attrs);
            }
            let _ = write!(out, "  {} = {}", name(&id), node.op.name());
            if !args.is_empty() {
                let _ = write!(out, " {}", args.join(", "));
            }
            let _ = write!(out, " : {}{}", node.dtype, node.shape);
            if locations {
                if let Some(loc) = &node.loc {
                    let _ = write!(out, "  @ {loc}");
                }
            }
            out.push('\n');
        }
        let outs: Vec<String> = self.outputs().iter().map(name).collect();
        let _ = writeln!(out, "  return {}", outs.join(", "));
        out.push_str("}\n");
        out
    }
}

impl std::fmt::Display for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_text())
    }
}
