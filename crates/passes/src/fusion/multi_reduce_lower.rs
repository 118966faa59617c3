//! From a multi-reduce group to its plan kernel: one prologue per distinct item program (over
//! the item's leaves, kernel inputs in item order), the epilogue over the items' results, and an
//! element store per stored value (K of them for a stack).

use super::lower::{BodyBuilder, Domain};
use super::multi_reduce::MultiReduceGroup;
use super::{lowering_error, Fuser};
use crate::Result;
use braze_ir::{NodeId, Op};
use braze_plan::{ElementStore, Expr, ItemReduction, MultiReduce, ReduceItem, ValueId};

impl Fuser<'_> {
    /// The kernel of group `gid`; `stored` are the nodes its output slots hold, in slot order.
    /// `bb` gets the leaves' buffers as the kernel's inputs, item after item.
    pub(super) fn lower_multi_reduce(
        &self,
        gid: usize,
        mr: &MultiReduceGroup,
        stored: &[NodeId],
        bb: &mut BodyBuilder,
    ) -> Result<MultiReduce> {
        let (program, firsts) = mr.programs();
        let mut reductions = Vec::with_capacity(firsts.len());
        for &f in &firsts {
            let item = &mr.items[f];
            let dtype = self.node(item.leaves[0]).dtype;
            let mut prologue = BodyBuilder::default();
            for (l, &leaf) in item.leaves.iter().enumerate() {
                let element = prologue.body.push(MultiReduce::leaf_load(l), dtype);
                prologue.values.insert(leaf, element);
            }
            self.lower_members(&mut prologue, gid, &Domain::Item, &item.prologue)?;
            let leaves = item.leaves.len();
            reductions.push(ItemReduction { op: item.op, dtype, leaves, prologue: prologue.body });
        }
        let mut items = Vec::with_capacity(mr.items.len());
        for (i, item) in mr.items.iter().enumerate() {
            for &leaf in &item.leaves {
                let base = self.buffer_base(leaf, bb)?;
                bb.inputs.push(base);
            }
            items.push(ReduceItem { reduction: program[i], len: self.shape(item.leaves[0]).numel() });
        }

        let mut epilogue = BodyBuilder::default();
        for (i, item) in mr.items.iter().enumerate() {
            let v = epilogue.body.push(MultiReduce::result_load(i), self.node(item.top).dtype);
            epilogue.values.insert(item.top, v);
        }
        for &e in &mr.epilogue {
            if let Some(v) = self.lower_epilogue_op(&mut epilogue, e)? {
                epilogue.values.insert(e, v);
            }
        }
        let mut stores = Vec::new();
        for (output, &s) in stored.iter().enumerate() {
            let node = self.node(s);
            if matches!(node.op, Op::Concat { .. }) {
                for (index, &x) in node.operands.iter().enumerate() {
                    let value = self.epilogue_operand(&mut epilogue, s, x)?;
                    stores.push(ElementStore { value, output, index });
                }
            } else {
                let value =
                    epilogue.values.get(&s).copied().ok_or_else(|| lowering_error(self.g, s, "not computed"))?;
                stores.push(ElementStore { value, output, index: 0 });
            }
        }
        bb.folded.extend(epilogue.folded);
        Ok(MultiReduce { reductions, items, epilogue: epilogue.body, stores })
    }

    /// The results and epilogue values of group `gid` that are read outside it, in topological
    /// order (a stack reads its results through reshapes that need no buffer).
    pub(super) fn stored_multi_reduce_values(&self, gid: usize) -> Vec<NodeId> {
        let super::GroupKind::MultiReduce(mr) = &self.group(gid).kind else { return Vec::new() };
        let mut values: Vec<NodeId> = mr.items.iter().map(|it| it.top).chain(mr.epilogue.iter().copied()).collect();
        values.sort_by_key(|&v| self.pos(v));
        values.retain(|&v| self.read_outside(v, &|u| self.in_group(u, gid)));
        values
    }

    /// One scalar op of the epilogue; a concat has no value of its own (its stores read its
    /// operands).
    fn lower_epilogue_op(&self, bb: &mut BodyBuilder, e: NodeId) -> Result<Option<ValueId>> {
        let node = self.node(e);
        let mut operand = |i: usize| self.epilogue_operand(bb, e, node.operands[i]);
        let expr = match &node.op {
            Op::Concat { .. } => return Ok(None),
            Op::Cast => Expr::Cast { x: operand(0)? },
            Op::Unary { op } => Expr::Unary { op: *op, x: operand(0)? },
            Op::Binary { op } => Expr::Binary { op: *op, a: operand(0)?, b: operand(1)? },
            Op::Where => Expr::Where { cond: operand(0)?, a: operand(1)?, b: operand(2)? },
            _ => return Err(lowering_error(self.g, e, "not a scalar op of an epilogue")),
        };
        Ok(Some(bb.body.push(expr, node.dtype)))
    }

    /// The epilogue value of operand `x` of `user`: a result or epilogue value behind one-element
    /// views, or a constant.
    fn epilogue_operand(&self, bb: &mut BodyBuilder, user: NodeId, x: NodeId) -> Result<ValueId> {
        self.note_folded(bb, x);
        if let Some(&v) = bb.values.get(&self.through_scalar_views(x)) {
            return Ok(v);
        }
        match self.read_access(x) {
            super::Access::Const { value } => Ok(bb.constant(value, self.node(x).dtype)),
            _ => Err(lowering_error(self.g, user, "an epilogue operand is neither a result nor a constant")),
        }
    }
}
