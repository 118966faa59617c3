//! Multi-tensor reductions: `stack([reduce(f(t_i)) for i])` (K full reductions of distinct
//! tensors, the same op after the same per-element prologue `f`, also written as a concat of
//! reshaped scalars) becomes one multi-reduce kernel writing the `[K]` result directly; a lone full
//! reduction of a large tensor becomes a multi-reduce with one item, chunked across the device.
//! A `sum * (1/n)` over an item's `n` elements is folded in as a mean.

use super::{is_view, Fuser, GroupKind, Space};
use braze_ir::{BinaryOp, Literal, NodeId, Op, ReduceOp};
use braze_plan::Expr;
use std::collections::HashSet;
use std::fmt::Write;

#[derive(Clone, Debug)]
pub(super) struct MultiReduceGroup {
    /// The node holding the `[K]` result (the concat) or the single item's result.
    pub(super) output: NodeId,
    pub(super) op: ReduceOp,
    /// Item `i` reduces all elements of `leaves[i]`.
    pub(super) leaves: Vec<NodeId>,
    /// Item 0's per-element ops in topological order (the same for every item).
    pub(super) prologue: Vec<NodeId>,
    /// The leaf item 0's prologue reads.
    pub(super) prologue_leaf: NodeId,
}

/// One full reduction, matched.
struct ReduceItem {
    /// The reduction, the mean's multiply, the prologue.
    members: Vec<NodeId>,
    op: ReduceOp,
    leaf: NodeId,
    prologue: Vec<NodeId>,
    /// Equal for items that one kernel can run: op, prologue and dtypes.
    signature: String,
}

impl Fuser<'_> {
    /// Claims the multi-reduce kernels before the other rules run.
    pub(super) fn claim_multi_reductions(&mut self) {
        for i in 0..self.order.len() {
            let c = self.order[i];
            if self.options.fuse && matches!(self.node(c).op, Op::Concat { .. }) {
                if let Some((group, members)) = self.match_reduction_stack(c) {
                    self.claim(group, members);
                }
            }
        }
        for i in 0..self.order.len() {
            let r = self.order[i];
            let Op::Reduce { axes, .. } = &self.node(r).op else { continue };
            let input = self.shape(self.node(r).operands[0]);
            let full = axes.len() == input.rank();
            if full && !self.group_of.contains_key(&r) && input.numel() > self.options.row_cache_limit {
                if let Some((group, members)) = self.match_full_reduction(r) {
                    self.claim(group, members);
                }
            }
        }
    }

    fn claim(&mut self, group: MultiReduceGroup, members: Vec<NodeId>) {
        tracing::trace!(target: "braze::plan", items = group.leaves.len(), op = group.op.name(), "multi-reduce");
        let output = group.output;
        let gid = self.new_group(GroupKind::MultiReduce(group), output, Space::Element);
        let mut seen: HashSet<NodeId> = HashSet::from([output]);
        for m in members {
            if seen.insert(m) {
                self.add_member(gid, m, Space::Element);
            }
        }
    }

    fn match_reduction_stack(&self, c: NodeId) -> Option<(MultiReduceGroup, Vec<NodeId>)> {
        let node = self.node(c);
        if node.shape.numel() != node.operands.len() {
            return None;
        }
        let mut members = vec![c];
        let mut tops = Vec::new();
        for &x in &node.operands {
            let (mut y, mut next) = (x, c);
            // Reshapes of one-element values between the reduction and the concat.
            while is_view(&self.node(y).op) {
                if self.shape(y).numel() != 1 || !self.only_feeds(y, next) {
                    return None;
                }
                members.push(y);
                (next, y) = (y, self.node(y).operands[0]);
            }
            if !self.only_feeds(y, next) {
                return None;
            }
            tops.push(y);
        }
        let uniform = |items: &[ReduceItem]| {
            items.iter().all(|it| it.signature == items[0].signature && self.node(it.leaf).dtype == node.dtype)
        };
        let mut items: Vec<ReduceItem> = tops.iter().map(|&t| self.reduce_item(t, true)).collect::<Option<_>>()?;
        if !uniform(&items) {
            tracing::trace!(target: "braze::plan", "stack of reductions: prologues differ, reducing materialized inputs");
            items = tops.iter().map(|&t| self.reduce_item(t, false)).collect::<Option<_>>()?;
            if !uniform(&items) {
                tracing::trace!(target: "braze::plan", "stack of reductions: ops or dtypes differ, not one kernel");
                return None;
            }
        }
        let first = &items[0];
        let group = MultiReduceGroup {
            output: c,
            op: first.op,
            leaves: items.iter().map(|it| it.leaf).collect(),
            prologue: first.prologue.clone(),
            prologue_leaf: first.leaf,
        };
        members.extend(items.iter().flat_map(|it| it.members.iter().copied()));
        Some((group, members))
    }

    fn match_full_reduction(&self, r: NodeId) -> Option<(MultiReduceGroup, Vec<NodeId>)> {
        let fuse = self.options.fuse;
        let top = match self.users(r) {
            [m] if fuse && self.mean_reduction(*m) == Some(r) => *m,
            _ => r,
        };
        let dtype = self.node(top).dtype;
        let mut item = self.reduce_item(top, fuse)?;
        if self.node(item.leaf).dtype != dtype {
            item = self.reduce_item(top, false)?;
        }
        let group = MultiReduceGroup {
            output: top,
            op: item.op,
            leaves: vec![item.leaf],
            prologue: item.prologue.clone(),
            prologue_leaf: item.leaf,
        };
        Some((group, item.members))
    }

    /// The sum that `top` multiplies by `1/n` (n: the sum's element count), making it a mean.
    fn mean_reduction(&self, top: NodeId) -> Option<NodeId> {
        let node = self.node(top);
        if node.op != (Op::Binary { op: BinaryOp::Mul }) {
            return None;
        }
        for (i, &r) in node.operands.iter().enumerate() {
            let Op::Reduce { op: ReduceOp::Sum, axes, .. } = &self.node(r).op else { continue };
            let input = self.shape(self.node(r).operands[0]);
            let scale = node.operands[1 - i];
            let is_inverse_count = matches!(self.node(scale).op, Op::Constant { value: Literal::Float(v) } if v == 1.0 / input.numel() as f64);
            if axes.len() == input.rank() && is_inverse_count && self.only_feeds(r, top) {
                return Some(r);
            }
        }
        None
    }

    /// Matches a full reduction (or a mean) ending at `top`; with `with_prologue`, also the
    /// elementwise ops of a single leaf that only the reduction reads.
    fn reduce_item(&self, top: NodeId, with_prologue: bool) -> Option<ReduceItem> {
        let mut members = Vec::new();
        let (r, mean) = match self.mean_reduction(top) {
            Some(r) => {
                members.push(top);
                (r, true)
            }
            None => (top, false),
        };
        let Op::Reduce { op, axes, .. } = &self.node(r).op else { return None };
        let o = self.node(r).operands[0];
        if axes.len() != self.shape(o).rank() || *op == ReduceOp::Mean {
            return None;
        }
        members.push(r);
        let (prologue, leaf) = if with_prologue { self.single_leaf_prologue(r, o) } else { (Vec::new(), o) };
        let op = if mean { ReduceOp::Mean } else { *op };
        let signature = self.prologue_signature(op, &prologue, leaf);
        members.extend(&prologue);
        Some(ReduceItem { members, op, leaf, prologue, signature })
    }

    /// The elementwise ops between the reduction's operand `o` and a single tensor leaf that
    /// nothing else reads, in topological order, and that leaf; `(vec![], o)` when there is none.
    fn single_leaf_prologue(&self, r: NodeId, o: NodeId) -> (Vec<NodeId>, NodeId) {
        let none = (Vec::new(), o);
        let per_element = |x: NodeId| {
            let op = &self.node(x).op;
            op.is_elementwise() && !matches!(op, Op::Constant { .. }) && self.shape(x) == self.shape(o)
        };
        if !per_element(o) || !self.only_feeds(o, r) || self.group_of.contains_key(&o) {
            return none;
        }
        let mut candidates = vec![o];
        let mut stack = vec![o];
        let mut seen = HashSet::from([o]);
        while let Some(x) = stack.pop() {
            for &p in &self.node(x).operands {
                if per_element(p) && !self.group_of.contains_key(&p) && seen.insert(p) {
                    candidates.push(p);
                    stack.push(p);
                }
            }
        }
        // Users come first, so a node is kept when everything reading it was kept.
        candidates.sort_by_key(|&x| std::cmp::Reverse(self.pos(x)));
        let mut inside: HashSet<NodeId> = HashSet::new();
        for &x in &candidates {
            if x == o || (!self.g.is_output(x) && self.users(x).iter().all(|u| inside.contains(u))) {
                inside.insert(x);
            }
        }
        let mut leaves: Vec<NodeId> = Vec::new();
        for &x in &inside {
            for &p in &self.node(x).operands {
                let constant = matches!(self.read_access(p), super::Access::Const { .. });
                if !inside.contains(&p) && !constant && !leaves.contains(&p) {
                    leaves.push(p);
                }
            }
        }
        match leaves[..] {
            [leaf] if self.shape(leaf) == self.shape(o) => {
                let mut prologue: Vec<NodeId> = inside.into_iter().collect();
                prologue.sort_by_key(|&x| self.pos(x));
                (prologue, leaf)
            }
            _ => none,
        }
    }

    fn prologue_signature(&self, op: ReduceOp, prologue: &[NodeId], leaf: NodeId) -> String {
        let mut sig = format!("{}:{}", op.name(), self.node(leaf).dtype);
        for (i, &x) in prologue.iter().enumerate() {
            let node = self.node(x);
            let _ = write!(sig, "|p{i}={:?}:{}(", node.op, node.dtype);
            for &p in &node.operands {
                if p == leaf {
                    sig.push_str("t,");
                } else if let Some(j) = prologue.iter().position(|&q| q == p) {
                    let _ = write!(sig, "p{j},");
                } else if let super::Access::Const { value } = self.read_access(p) {
                    let (kind, bits) = value.bit_key();
                    let _ = write!(sig, "c{kind}:{bits:016x}:{},", self.node(p).dtype);
                }
            }
            sig.push(')');
        }
        sig
    }

    /// The expression a multi-reduce item's prologue starts from: its element.
    pub(super) fn item_element() -> Expr {
        Expr::Load { input: 0, offset: 0, strides: vec![1] }
    }
}
