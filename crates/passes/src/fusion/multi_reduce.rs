//! Multi-tensor reductions: independent full reductions of distinct tensors, each after its own
//! per-element prologue, become one multi-reduce kernel whatever reads their results. The scalar
//! ops that read only those results and constants (a chain of adds, a scale per result, a
//! logical or, a stack) become the kernel's epilogue, run once when the last item is done.
//!
//! Which reductions share a launch: every full reduction is an item candidate when it has a
//! prologue (over one tensor, or a few of its shape read as contiguous buffers: `sum((p - q)^2)`,
//! a dot product), when it reads, without one, a tensor that is stored anyway (so claiming it
//! adds no kernel), when it reduces more than `row_cache_limit` elements, or when a stack reads
//! it. A candidate's level is one more than the highest level of the candidates it depends on
//! (0 for none); candidates of one level cannot depend on each other, so each level becomes one
//! kernel (a few when they hold more than [`MAX_REDUCTIONS`] distinct prologues). A level of one
//! small unstacked reduction is left to the row kernels, which can also fuse its producers. A
//! `sum * (1/n)` over an item's `n` elements is folded in as a mean.

use super::{is_view, Fuser, GroupKind, Space};
use braze_ir::{BinaryOp, Literal, NodeId, Op, ReduceOp};
use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// Distinct item programs one kernel runs (each is a `case` of its code).
const MAX_REDUCTIONS: usize = 8;
/// Tensors one item's prologue reads element by element (each is a pointer and a vector load
/// per step of the item's loop).
const MAX_LEAVES: usize = 4;
/// Epilogue ops one kernel runs (one thread runs them all).
const MAX_EPILOGUE: usize = 1024;
/// Values one kernel stores (each output is a kernel parameter).
const MAX_OUTPUTS: usize = 128;

#[derive(Clone, Debug)]
pub(super) struct MultiReduceGroup {
    pub(super) items: Vec<ReduceItem>,
    /// Scalar ops over the items' results and constants, and concats of one-element ones, in
    /// topological order.
    pub(super) epilogue: Vec<NodeId>,
}

/// One full reduction, matched.
#[derive(Clone, Debug)]
pub(super) struct ReduceItem {
    /// The node holding the result: the reduction, or the mean's multiply.
    pub(super) top: NodeId,
    /// The top, the reduction and the prologue.
    members: Vec<NodeId>,
    pub(super) op: ReduceOp,
    /// The tensors of the reduced shape whose elements the prologue reads (one, without a
    /// prologue), all of one dtype; several only when each reads as its contiguous buffer, so
    /// that element `j` of every leaf is element `j` of its buffer.
    pub(super) leaves: Vec<NodeId>,
    /// Per-element ops between the leaves and the reduction, in topological order.
    pub(super) prologue: Vec<NodeId>,
    /// Equal for items that run the same program: op, prologue and dtypes.
    pub(super) signature: String,
}

impl MultiReduceGroup {
    /// Index of each item's program, and the first item of each program.
    pub(super) fn programs(&self) -> (Vec<usize>, Vec<usize>) {
        let mut firsts: Vec<usize> = Vec::new();
        let program = self
            .items
            .iter()
            .enumerate()
            .map(|(i, it)| match firsts.iter().position(|&f| self.items[f].signature == it.signature) {
                Some(p) => p,
                None => {
                    firsts.push(i);
                    firsts.len() - 1
                }
            })
            .collect();
        (program, firsts)
    }
}

impl Fuser<'_> {
    /// Claims the multi-reduce kernels before the other rules run.
    pub(super) fn claim_multi_reductions(&mut self) {
        if !self.options.fuse {
            self.claim_large_reductions_unfused();
            return;
        }
        let candidates = self.item_candidates();
        let tops: HashSet<NodeId> = candidates.iter().map(|it| it.top).collect();
        // after[n]: one more than the highest level of a candidate `n` depends on; a
        // candidate's level is `after` of its top's operands.
        let mut after: HashMap<NodeId, usize> = HashMap::new();
        let mut level: HashMap<NodeId, usize> = HashMap::new();
        for &n in &self.order {
            let mut a = self.node(n).operands.iter().map(|o| after[o]).max().unwrap_or(0);
            if tops.contains(&n) {
                level.insert(n, a);
                a += 1;
            }
            after.insert(n, a);
        }
        // ((level, after the backward began), items, distinct signatures), in order of first
        // item. A forward reduction (a training step's loss) is not grouped with the backward's
        // (the gradients' checks): its input would be held through the whole backward.
        type Level = (usize, bool);
        let mut groups: Vec<(Level, Vec<ReduceItem>, Vec<String>)> = Vec::new();
        for item in &candidates {
            let level = (level[&item.top], self.after_backward.get(&item.top) == Some(&true));

            let fits = |(l, _, sigs): &&mut (Level, Vec<ReduceItem>, Vec<String>)| {
                *l == level && (sigs.contains(&item.signature) || sigs.len() < MAX_REDUCTIONS)
            };
            match groups.iter_mut().find(|g| fits(g)) {
                Some((_, items, sigs)) => {
                    if !sigs.contains(&item.signature) {
                        sigs.push(item.signature.clone());
                    }
                    items.push(item.clone());
                }
                None => groups.push((level, vec![item.clone()], vec![item.signature.clone()])),
            }
        }
        let in_items: HashSet<NodeId> = candidates.iter().flat_map(|it| it.members.iter().copied()).collect();
        for (_, items, _) in groups {
            self.claim_items(items, &in_items);
        }
    }

    /// Every op its own kernel: a full reduction of a large tensor still gets the chunked
    /// kernel, alone and without prologue.
    fn claim_large_reductions_unfused(&mut self) {
        for i in 0..self.order.len() {
            let r = self.order[i];
            let large = |o: NodeId| self.shape(o).numel() > self.options.row_cache_limit;
            if self.full_reduction(r).is_some_and(|o| large(o) && self.node(o).dtype == self.node(r).dtype) {
                if let Some(item) = self.reduce_item(r, false) {
                    self.claim(MultiReduceGroup { items: vec![item], epilogue: Vec::new() });
                }
            }
        }
    }

    /// Claims `items` with their epilogue when they are worth a kernel, splitting them when
    /// the kernel would store too many values.
    /// `in_items`: the nodes of every candidate item, which no epilogue may take.
    fn claim_items(&mut self, items: Vec<ReduceItem>, in_items: &HashSet<NodeId>) {
        let epilogue = self.epilogue_of(&items, in_items);
        let group = MultiReduceGroup { items, epilogue };
        let large = |it: &ReduceItem| self.shape(it.leaves[0]).numel() > self.options.row_cache_limit;
        let stacks = group.epilogue.iter().any(|&e| matches!(self.node(e).op, Op::Concat { .. }));
        if group.items.len() == 1 && !large(&group.items[0]) && !stacks && !self.options.full_reductions_in_multi_reduce
        {
            return;
        }
        let stored = self.stored_count(&group);
        if stored > MAX_OUTPUTS {
            let mut items = group.items;
            if items.len() == 1 {
                tracing::trace!(target: "braze::plan", stored, "multi-reduce epilogue left out: too many values to store");
                self.claim(MultiReduceGroup { items, epilogue: Vec::new() });
            } else {
                let second = items.split_off(items.len() / 2);
                self.claim_items(items, in_items);
                self.claim_items(second, in_items);
            }
            return;
        }
        self.claim(group);
    }

    fn claim(&mut self, mut group: MultiReduceGroup) {
        self.order_items_as_stacked(&mut group);
        tracing::trace!(target: "braze::plan", items = group.items.len(), epilogue = group.epilogue.len(), "multi-reduce");
        let mut members: Vec<NodeId> = group.items.iter().flat_map(|it| it.members.iter().copied()).collect();
        members.extend(&group.epilogue);
        let first = members[0];
        let gid = self.new_group(GroupKind::MultiReduce(group), first, Space::Element);
        let mut seen: HashSet<NodeId> = HashSet::from([first]);
        for m in members {
            if seen.insert(m) {
                self.add_member(gid, m, Space::Element);
            }
        }
    }

    /// Puts the items in the order of a stack that reads all of them, if there is one, so the
    /// kernel writes that stack as the items finish.
    fn order_items_as_stacked(&self, group: &mut MultiReduceGroup) {
        for &e in &group.epilogue {
            if !matches!(self.node(e).op, Op::Concat { .. }) {
                continue;
            }
            let operands: Vec<NodeId> = self.node(e).operands.iter().map(|&x| self.through_scalar_views(x)).collect();
            let order: Option<Vec<usize>> =
                operands.iter().map(|&x| group.items.iter().position(|it| it.top == x)).collect();
            if let Some(order) = order {
                let distinct: HashSet<usize> = order.iter().copied().collect();
                if order.len() == group.items.len() && distinct.len() == order.len() {
                    group.items = order.into_iter().map(|i| group.items[i].clone()).collect();
                    return;
                }
            }
        }
    }

    /// The full reductions worth an item, in topological order, no two sharing a node.
    fn item_candidates(&self) -> Vec<ReduceItem> {
        let stacked = self.stacked_values();
        let mut used: HashSet<NodeId> = HashSet::new();
        let mut candidates = Vec::new();
        for &r in &self.order {
            let Some(o) = self.full_reduction(r) else { continue };
            // A reduction that changes the dtype (a sum of bools) is not an item.
            if self.group_of.contains_key(&r) || self.node(r).dtype != self.node(o).dtype {
                continue;
            }
            let top = match self.users(r) {
                [m] if self.mean_reduction(*m) == Some(r) => *m,
                _ => r,
            };
            let Some(item) = self.reduce_item(top, true) else { continue };
            let eligible = !item.prologue.is_empty()
                || self.stored_anyway(item.leaves[0], r)
                || self.shape(item.leaves[0]).numel() > self.options.row_cache_limit
                || stacked.contains(&top);
            if eligible && item.members.iter().all(|m| !used.contains(m)) {
                used.extend(&item.members);
                candidates.push(item);
            }
        }
        candidates
    }

    /// The operand of `r` when it is a full reduction.
    fn full_reduction(&self, r: NodeId) -> Option<NodeId> {
        let Op::Reduce { axes, op, .. } = &self.node(r).op else { return None };
        let o = self.node(r).operands[0];
        (axes.len() == self.shape(o).rank() && *op != ReduceOp::Mean).then_some(o)
    }

    /// Whether `leaf`, which reduction `r` reads, gets a buffer whatever `r` becomes: it is not
    /// an elementwise op that only `r` reads.
    fn stored_anyway(&self, mut leaf: NodeId, r: NodeId) -> bool {
        let mut user = r;
        while is_view(&self.node(leaf).op) {
            (user, leaf) = (leaf, self.node(leaf).operands[0]);
        }
        let op = &self.node(leaf).op;
        !matches!(op, Op::Constant { .. }) && (!op.is_elementwise() || !self.only_feeds(leaf, user))
    }

    /// Values that a concat of one-element values reads (through one-element views).
    fn stacked_values(&self) -> HashSet<NodeId> {
        let mut stacked = HashSet::new();
        for &c in &self.order {
            let node = self.node(c);
            if matches!(node.op, Op::Concat { .. }) && node.shape.numel() == node.operands.len() {
                stacked.extend(node.operands.iter().map(|&x| self.through_scalar_views(x)));
            }
        }
        stacked
    }

    /// `x` with the views of one-element values above it looked through.
    pub(super) fn through_scalar_views(&self, mut x: NodeId) -> NodeId {
        while is_view(&self.node(x).op) && self.shape(x).numel() == 1 {
            x = self.node(x).operands[0];
        }
        x
    }

    /// The ops after `items` that read only their results, each other and constants: scalar
    /// elementwise ops and concats of one-element values, in topological order.
    fn epilogue_of(&self, items: &[ReduceItem], in_items: &HashSet<NodeId>) -> Vec<NodeId> {
        let mut values: HashSet<NodeId> = items.iter().map(|it| it.top).collect();
        let first = items.iter().map(|it| self.pos(it.top)).min().unwrap_or(0);
        let mut epilogue = Vec::new();
        for &n in &self.order[first..] {
            if epilogue.len() >= MAX_EPILOGUE {
                break;
            }
            if self.group_of.contains_key(&n) || in_items.contains(&n) {
                continue;
            }
            let node = self.node(n);
            let scalar_op =
                node.op.is_elementwise() && !matches!(node.op, Op::Constant { .. }) && node.shape.numel() == 1;
            let stack = matches!(node.op, Op::Concat { .. }) && node.shape.numel() == node.operands.len();
            if !scalar_op && !stack {
                continue;
            }
            let mut reads_value = false;
            let readable = node.operands.iter().all(|&o| {
                let x = self.through_scalar_views(o);
                if values.contains(&x) {
                    reads_value = true;
                    true
                } else {
                    matches!(self.read_access(o), super::Access::Const { .. })
                }
            });
            if readable && reads_value {
                // A stack has no scalar value: the ops after it read its buffer.
                if scalar_op {
                    values.insert(n);
                }
                epilogue.push(n);
            }
        }
        epilogue
    }

    /// How many values `group` would store.
    fn stored_count(&self, group: &MultiReduceGroup) -> usize {
        let inside: HashSet<NodeId> = group
            .items
            .iter()
            .flat_map(|it| it.members.iter().copied())
            .chain(group.epilogue.iter().copied())
            .collect();
        let tops = group.items.iter().map(|it| it.top);
        tops.chain(group.epilogue.iter().copied()).filter(|&v| self.read_outside(v, &|u| inside.contains(&u))).count()
    }

    /// Whether a result or epilogue value `v` is read outside its kernel (`inside` tells its
    /// members) or is a graph output, looking through one-element views (a stack reads reshapes).
    pub(super) fn read_outside(&self, v: NodeId, inside: &dyn Fn(NodeId) -> bool) -> bool {
        self.g.is_output(v)
            || self.users(v).iter().any(|&u| {
                let view = is_view(&self.node(u).op) && self.shape(u).numel() == 1;
                if view {
                    self.read_outside(u, inside)
                } else {
                    !inside(u)
                }
            })
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
        let mut members = vec![top];
        let (r, mean) = match self.mean_reduction(top) {
            Some(r) => {
                members.push(r);
                (r, true)
            }
            None => (top, false),
        };
        let Op::Reduce { op, axes, .. } = &self.node(r).op else { return None };
        let o = self.node(r).operands[0];
        if axes.len() != self.shape(o).rank() || *op == ReduceOp::Mean {
            return None;
        }
        let (prologue, leaves) = if with_prologue { self.leaf_prologue(r, o) } else { (Vec::new(), vec![o]) };
        let op = if mean { ReduceOp::Mean } else { *op };
        let signature = self.prologue_signature(op, &prologue, &leaves);
        members.extend(&prologue);
        Some(ReduceItem { top, members, op, leaves, prologue, signature })
    }

    /// The elementwise ops between the reduction's operand `o` and the tensor leaves they read,
    /// which nothing else reads, in topological order, and those leaves (at most [`MAX_LEAVES`]
    /// of `o`'s shape and dtype, several only where each reads as its contiguous buffer);
    /// `(vec![], [o])` when there are none.
    fn leaf_prologue(&self, r: NodeId, o: NodeId) -> (Vec<NodeId>, Vec<NodeId>) {
        let none = (Vec::new(), vec![o]);
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
        let mut prologue: Vec<NodeId> = inside.into_iter().collect();
        prologue.sort_by_key(|&x| self.pos(x));
        // Leaves in the order the prologue first reads them, so equal prologues over other
        // tensors get equal signatures.
        let mut leaves: Vec<NodeId> = Vec::new();
        for &x in &prologue {
            for &p in &self.node(x).operands {
                let constant = matches!(self.read_access(p), super::Access::Const { .. });
                if !prologue.contains(&p) && !constant && !leaves.contains(&p) {
                    leaves.push(p);
                }
            }
        }
        let dtype = leaves.first().map(|&l| self.node(l).dtype);
        let fits = |&l: &NodeId| self.shape(l) == self.shape(o) && Some(self.node(l).dtype) == dtype;
        let aligned = leaves.len() == 1 || leaves.iter().all(|&l| self.reads_contiguously(l));
        if leaves.is_empty() || leaves.len() > MAX_LEAVES || !leaves.iter().all(fits) || !aligned {
            return none;
        }
        (prologue, leaves)
    }

    fn prologue_signature(&self, op: ReduceOp, prologue: &[NodeId], leaves: &[NodeId]) -> String {
        let mut sig = format!("{}:{}x{}", op.name(), self.node(leaves[0]).dtype, leaves.len());
        for (i, &x) in prologue.iter().enumerate() {
            let node = self.node(x);
            let _ = write!(sig, "|p{i}={:?}:{}(", node.op, node.dtype);
            for &p in &node.operands {
                if let Some(l) = leaves.iter().position(|&q| q == p) {
                    let _ = write!(sig, "t{l},");
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
}
