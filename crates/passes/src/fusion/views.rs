//! Views (reshape, permute, slice, broadcast_to) fold into strided loads; those a kernel cannot read
//! that way get buffers of their own.

use super::access::{self, Access};
use super::{is_view, lowering_error, Fuser, GroupKind};
use crate::Result;
use braze_ir::{NodeId, Op};

impl Fuser<'_> {
    pub(super) fn fold_views(&mut self) {
        for i in 0..self.order.len() {
            let v = self.order[i];
            if is_view(&self.node(v).op) {
                let access = self.fold_view(v);
                self.view_access.insert(v, access);
            }
        }
    }

    fn fold_view(&mut self, v: NodeId) -> Access {
        let node = self.node(v);
        let u = node.operands[0];
        let (from, to) = (self.shape(u).dims(), node.shape.dims());
        let Access::Strided { base, offset, strides } = self.read_access(u) else { return self.read_access(u) };
        match &node.op {
            Op::Permute { perm } => Access::Strided { base, offset, strides: access::permute_strides(&strides, perm) },
            Op::Slice { axis, start, step, .. } => {
                let mut strides = strides;
                let offset = offset + start * strides[*axis];
                strides[*axis] *= step;
                access::zero_unit_dims(to, &mut strides);
                Access::Strided { base, offset, strides }
            }
            Op::BroadcastTo => Access::Strided { base, offset, strides: access::broadcast_strides(&strides, from, to) },
            _ => match access::reshape_strides(from, &strides, to) {
                Some(strides) => Access::Strided { base, offset, strides },
                None => {
                    // Only a view can be non-contiguous: give it a buffer and reshape that.
                    tracing::trace!(target: "braze::plan", view = %u, "materialized: a reshape cannot fold it");
                    self.materialized.insert(u);
                    Access::whole(u, &node.shape)
                }
            },
        }
    }

    /// How a kernel reads `x` when it is not computed in the same kernel.
    pub(super) fn read_access(&self, x: NodeId) -> Access {
        let node = self.node(x);
        match &node.op {
            Op::Constant { value } => Access::Const { value: *value },
            op if is_view(op) => match &self.view_access[&x] {
                Access::Const { value } => Access::Const { value: *value },
                _ if self.materialized.contains(&x) => Access::whole(x, &node.shape),
                folded => folded.clone(),
            },
            _ => match self.stored_strides.get(&x) {
                Some(strides) => Access::Strided { base: x, offset: 0, strides: strides.clone() },
                None => Access::whole(x, &node.shape),
            },
        }
    }

    /// [`Fuser::read_access`], except that a materialized constant is read from its buffer.
    pub(super) fn buffer_access(&self, x: NodeId) -> Access {
        if self.materialized.contains(&x) {
            Access::whole(x, self.shape(x))
        } else {
            self.read_access(x)
        }
    }

    /// Whether `x` can be read as a whole contiguous buffer (what concat inputs, matmul biases and
    /// plan outputs need).
    pub(super) fn reads_contiguously(&self, x: NodeId) -> bool {
        match self.buffer_access(x) {
            Access::Strided { base, offset, strides } => {
                access::is_contiguous(self.shape(x).dims(), offset, &strides, self.shape(base).numel())
            }
            Access::Const { .. } => false,
        }
    }

    /// Gives buffers to the views and constants that concat, matmul, multi-reduce and the graph
    /// outputs cannot read as they are.
    pub(super) fn plan_materializations(&mut self) -> Result<()> {
        let mut needed = Vec::new();
        for group in self.groups.iter().flatten() {
            if let GroupKind::MultiReduce(mr) = &group.kind {
                let leaves = mr.items.iter().flat_map(|it| it.leaves.iter().copied());
                needed.extend(leaves.filter(|&leaf| !self.reads_densely(leaf)));
            }
        }
        for &n in &self.order {
            match self.node(n).op {
                Op::MatMul => {
                    let operands = &self.node(n).operands;
                    needed.extend(operands.iter().copied().filter(|&x| self.matmul_operand(n, x).is_none()));
                }
                // Attention kernels read q, k, v and dout by an operand layout (rows of
                // contiguous elements at batch, head and row strides), lse and delta densely.
                Op::Attention { .. } | Op::AttentionLse { .. } | Op::AttentionGrad { .. } => {
                    for (slot, &x) in self.node(n).operands.iter().enumerate() {
                        let readable = if matches!(slot, 3 | 4) {
                            self.reads_contiguously(x)
                        } else {
                            self.attention_operand_layout(x).is_some()
                        };
                        if !readable {
                            needed.push(x);
                        }
                    }
                }
                // The scatter-add reads its source and indices as contiguous buffers; a gather
                // reads its table from memory (a constant table gets a buffer).
                Op::IndexAdd { .. } => {
                    let operands = &self.node(n).operands;
                    needed.extend(operands.iter().copied().filter(|&x| !self.reads_contiguously(x)));
                }
                Op::IndexSelect { .. } => {
                    let x = self.node(n).operands[0];
                    if matches!(self.buffer_access(x), Access::Const { .. }) {
                        needed.push(x);
                    }
                }
                Op::Concat { .. } if !self.group_of.contains_key(&n) => {
                    let operands = &self.node(n).operands;
                    needed.extend(operands.iter().copied().filter(|&x| !self.reads_contiguously(x)));
                }
                _ => {}
            }
        }
        for &o in self.g.outputs() {
            let op = &self.node(o).op;
            if (is_view(op) || matches!(op, Op::Constant { .. })) && !self.reads_contiguously(o) {
                needed.push(o);
            }
        }
        for x in needed {
            let op = &self.node(x).op;
            if !is_view(op) && !matches!(op, Op::Constant { .. }) {
                return Err(lowering_error(self.g, x, "a computed value is not readable from its own buffer"));
            }
            tracing::trace!(target: "braze::plan", node = %x, op = op.name(), "materialized for a kernel that needs a dense buffer");
            self.materialized.insert(x);
        }
        Ok(())
    }

    /// Whether a full reduction can read `x` as the plain buffer behind it (any order will do).
    fn reads_densely(&self, x: NodeId) -> bool {
        match self.buffer_access(x) {
            Access::Strided { base, offset, strides } => {
                access::is_dense_permutation(self.shape(x).dims(), offset, &strides, self.shape(base).numel())
            }
            Access::Const { .. } => false,
        }
    }
}
