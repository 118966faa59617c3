//! A bias add and an activation after a matmul fold into the matmul kernel as its epilogue.

use super::{Fuser, GroupKind, Space};
use braze_ir::{BinaryOp, NodeId, Op, UnaryOp};
use braze_plan::MatMul;

/// A matmul and the epilogue ops folded into it.
#[derive(Clone, Debug)]
pub(super) struct MatMulGroup {
    pub(super) node: NodeId,
    /// The `[n]` bias operand of the folded add.
    pub(super) bias: Option<NodeId>,
    pub(super) activation: Option<UnaryOp>,
    /// The last node of the group: what the kernel stores.
    pub(super) result: NodeId,
}

impl Fuser<'_> {
    /// Folds `n` into a matmul kernel as its bias add or activation, when it applies.
    pub(super) fn try_matmul_epilogue(&mut self, n: NodeId) -> bool {
        let node = self.node(n);
        // A matmul over k = 0 is a fill with zeros, not a library call: what follows it runs in
        // a kernel of its own (cuBLASLt has no call for an epilogue without a product).
        let contracts = |mm: &MatMulGroup| {
            let a = self.node(mm.node).operands[0];
            self.shape(a).dims().last().is_some_and(|&k| k > 0)
        };
        let sole = |o: NodeId| self.g.use_count(o) == 1 && !self.g.is_output(o);
        let matmul_result = |o: NodeId| match self.group_of.get(&o).map(|&gid| (gid, &self.group(gid).kind)) {
            Some((gid, GroupKind::MatMul(mm))) if mm.result == o => Some((gid, mm.clone())),
            _ => None,
        };
        match node.op {
            Op::Binary { op: BinaryOp::Add } => {
                for (i, &o) in node.operands.iter().enumerate() {
                    let Some((gid, mm)) = matmul_result(o) else { continue };
                    let bias = node.operands[1 - i];
                    if mm.bias.is_none()
                        && mm.activation.is_none()
                        && contracts(&mm)
                        && sole(o)
                        && node.shape == *self.shape(o)
                        && self.is_bias_for(bias, *self.shape(o).dims().last().unwrap_or(&1))
                    {
                        self.add_member(gid, n, Space::Element);
                        if let GroupKind::MatMul(mm) = &mut self.group_mut(gid).kind {
                            mm.bias = Some(bias);
                            mm.result = n;
                        }
                        return true;
                    }
                }
                false
            }
            Op::Unary { op } if MatMul::EPILOGUE_ACTIVATIONS.contains(&op) => {
                let o = node.operands[0];
                let Some((gid, mm)) = matmul_result(o) else { return false };
                if mm.activation.is_some() || !sole(o) || !contracts(&mm) {
                    return false;
                }
                self.add_member(gid, n, Space::Element);
                if let GroupKind::MatMul(mm) = &mut self.group_mut(gid).kind {
                    mm.activation = Some(op);
                    mm.result = n;
                }
                true
            }
            _ => false,
        }
    }

    /// A `[n]` vector broadcast over the rows of a matmul result, readable as a whole buffer.
    fn is_bias_for(&self, bias: NodeId, cols: usize) -> bool {
        let dims = self.shape(bias).dims();
        let row_vector = dims.last() == Some(&cols) && dims[..dims.len() - 1].iter().all(|&d| d == 1);
        row_vector && self.reads_contiguously(bias)
    }
}
