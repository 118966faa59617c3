//! Placing nodes into kernels: the merge rules of the table in the module docs, in visiting order.

use super::access::Access;
use super::cycles::Side;
use super::matmul_epilogue::MatMulGroup;
use super::row::RowGeometry;
use super::{is_view, lowering_error, Fuser, Group, GroupKind, Space};
use crate::Result;
use braze_ir::{NodeId, Op, Shape};
use std::collections::HashSet;

impl Fuser<'_> {
    pub(super) fn new_group(&mut self, kind: GroupKind, first: NodeId, space: Space) -> usize {
        let gid = self.groups.len();
        let pos = self.pos(first);
        self.groups.push(Some(Group {
            kind,
            members: Vec::new(),
            row_space: HashSet::new(),
            varies: HashSet::new(),
            min_pos: pos,
            max_pos: pos,
            forward: false,
            recomputed: false,
        }));
        self.add_member(gid, first, space);
        gid
    }

    pub(super) fn add_member(&mut self, gid: usize, id: NodeId, space: Space) {
        let pos = self.pos(id);
        let varies = match &self.group(gid).kind {
            GroupKind::Row(geo) => {
                space == Space::Element
                    && self.value_varies(geo, id, &|o| self.group(gid).varies.contains(&o), &|o| self.in_group(o, gid))
            }
            _ => false,
        };
        self.group_of.insert(id, gid);
        let (forward, recomputed) = self.side_of(id);
        let group = self.group_mut(gid);
        group.forward |= forward;
        group.recomputed |= recomputed;
        group.members.push(id);
        if space == Space::Row {
            group.row_space.insert(id);
        }
        if varies {
            group.varies.insert(id);
        }
        group.min_pos = group.min_pos.min(pos);
        group.max_pos = group.max_pos.max(pos);
    }

    /// Moves every member of `src` into `dst`; `space` overrides the members' spaces.
    pub(super) fn absorb(&mut self, src: usize, dst: usize, space: Option<Space>) {
        let Some(moved) = self.groups[src].take() else { return };
        for &m in &moved.members {
            self.group_of.insert(m, dst);
        }
        let group = self.group_mut(dst);
        group.forward |= moved.forward;
        group.recomputed |= moved.recomputed;
        group.min_pos = group.min_pos.min(moved.min_pos);
        group.max_pos = group.max_pos.max(moved.max_pos);
        match space {
            Some(Space::Row) => group.row_space.extend(moved.members.iter().copied()),
            Some(Space::Element) => {}
            None => group.row_space.extend(moved.row_space),
        }
        group.members.extend(moved.members);
        if let GroupKind::Row(geo) = &self.group(dst).kind {
            let varies = self.varying_members(geo, &Side { groups: &[dst], extra: &[] });
            self.group_mut(dst).varies = varies;
        }
    }

    pub(super) fn group_nodes(&mut self) -> Result<()> {
        self.find_column_prologues();
        for i in 0..self.order.len() {
            let n = self.order[i];
            if self.group_of.contains_key(&n) {
                continue;
            }
            let node = self.node(n);
            match &node.op {
                Op::Input { .. } => {}
                op if is_view(op) || matches!(op, Op::Constant { .. }) => {
                    if self.materialized.contains(&n) {
                        self.new_group(GroupKind::Pointwise { domain: node.shape.clone() }, n, Space::Element);
                    }
                }
                Op::MatMul => {
                    let mm = MatMulGroup { node: n, bias: None, activation: None, result: n };
                    self.new_group(GroupKind::MatMul(mm), n, Space::Element);
                }
                Op::Concat { .. } => {
                    self.new_group(GroupKind::Concat { node: n }, n, Space::Element);
                }
                Op::Reduce { .. } => self.place_reduce(n),
                Op::IndexSelect { .. } | Op::Arange => {
                    self.new_group(GroupKind::Pointwise { domain: node.shape.clone() }, n, Space::Element);
                }
                Op::IndexAdd { .. } => {
                    self.new_group(GroupKind::IndexAdd { node: n }, n, Space::Element);
                }
                Op::Attention { .. } | Op::AttentionLse { .. } | Op::AttentionGrad { .. } => self.place_attention(n),
                op if op.is_elementwise() => self.place_elementwise(n),
                _ => return Err(lowering_error(self.g, n, "composite ops must be decomposed before fusion")),
            }
        }
        Ok(())
    }

    pub(super) fn refused(&self, n: NodeId, gid: usize, reason: &str) {
        tracing::trace!(target: "braze::plan", node = %n, op = self.node(n).op.name(), group = gid, reason, "merge refused");
    }

    /// Pointwise and row groups computing an operand of `n`, in operand order.
    fn operand_groups(&self, n: NodeId) -> Vec<usize> {
        let mut found = Vec::new();
        for &o in &self.node(n).operands {
            if matches!(self.node(o).op, Op::Constant { .. }) {
                continue;
            }
            if let Some(&gid) = self.group_of.get(&o) {
                if matches!(
                    self.group(gid).kind,
                    GroupKind::Pointwise { .. } | GroupKind::Row(_) | GroupKind::Column(_)
                ) && !found.contains(&gid)
                {
                    found.push(gid);
                }
            }
        }
        found
    }

    fn place_elementwise(&mut self, n: NodeId) {
        if self.options.fuse && self.try_matmul_epilogue(n) {
            return;
        }
        let mut candidates = self.operand_groups(n);
        if self.column_prologue.contains(&n) {
            // Only column reductions read it: it joins their prologue, not a kernel that would
            // store it for them.
            candidates.retain(|&gid| self.is_column_prologue_group(gid));
        }
        let mut home = None;
        if self.options.fuse {
            // Joining a reduction's kernel (as its epilogue) saves more than joining a pointwise one.
            let is_row = |gid: &usize| matches!(self.group(*gid).kind, GroupKind::Row(_) | GroupKind::Column(_));
            let ordered: Vec<usize> = candidates
                .iter()
                .copied()
                .filter(is_row)
                .chain(candidates.iter().copied().filter(|g| !is_row(g)))
                .collect();
            for gid in ordered {
                let Some(space) = self.join_space(n, gid) else { continue };
                match self.can_join(n, gid, space) {
                    Ok(()) => {
                        tracing::trace!(target: "braze::plan", node = %n, op = self.node(n).op.name(), group = gid, ?space, "joins kernel");
                        self.add_member(gid, n, space);
                        home = Some(gid);
                        break;
                    }
                    Err(reason) => self.refused(n, gid, reason),
                }
            }
        }
        if home.is_none() && self.options.fuse && !self.column_prologue.contains(&n) {
            for gid in self.sibling_groups(n) {
                match self.can_join(n, gid, Space::Element) {
                    Ok(()) => {
                        tracing::trace!(target: "braze::plan", node = %n, op = self.node(n).op.name(), group = gid, "joins a kernel reading the same operand");
                        self.add_member(gid, n, Space::Element);
                        home = Some(gid);
                        break;
                    }
                    Err(reason) => self.refused(n, gid, reason),
                }
            }
        }
        let home = match home {
            Some(gid) => gid,
            None => self.new_group(GroupKind::Pointwise { domain: self.shape(n).clone() }, n, Space::Element),
        };
        if !self.options.fuse {
            return;
        }
        for gid in candidates {
            if gid != home && self.groups[gid].is_some() {
                if let Err(reason) = self.try_absorb(gid, home, n) {
                    self.refused(n, gid, reason);
                }
            }
        }
    }

    /// Pointwise kernels of `n`'s shape that read one of its operands of that shape computed
    /// elsewhere: `n` joining one reads that operand once for both (the backward's copy of an
    /// activation beside the activation's gradient, both from the matmul result).
    /// Only kernels of the same side of a joint graph: a backward value computed in a forward
    /// kernel would be held until the backward (a gradient formula's f32 terms, twice the bytes
    /// of their bf16 operand).
    /// Nor a value only read after the backward began (an optimizer's decayed weight) in a kernel
    /// before it (the forward's cast of that weight): it would be stored and held until then
    /// instead of joining the update that reads it.
    fn sibling_groups(&self, n: NodeId) -> Vec<usize> {
        let shape = self.shape(n).clone();
        let backward = |id: NodeId| self.node(id).loc.as_ref().is_some_and(|loc| loc.backward);
        let late = |id: NodeId| self.after_backward.get(&id) == Some(&true);
        let read_late = !self.users(n).is_empty() && self.users(n).iter().all(|&u| late(u));
        let mut found = Vec::new();
        for &o in &self.node(n).operands {
            let operand = self.node(o);
            if operand.shape != shape || matches!(operand.op, Op::Constant { .. }) || is_view(&operand.op) {
                continue;
            }
            for &u in self.users(o) {
                let Some(&gid) = self.group_of.get(&u) else { continue };
                if u == n
                    || backward(u) != backward(n)
                    || (read_late && !late(u))
                    || found.contains(&gid)
                    || self.groups[gid].is_none()
                    || self.is_column_prologue_group(gid)
                {
                    continue;
                }
                if matches!(&self.group(gid).kind, GroupKind::Pointwise { domain } if *domain == shape) {
                    found.push(gid);
                }
            }
        }
        found
    }

    /// How `n` would be indexed as a member of `gid`, if its shape fits the group.
    fn join_space(&self, n: NodeId, gid: usize) -> Option<Space> {
        let shape = self.shape(n);
        match &self.group(gid).kind {
            GroupKind::Pointwise { domain } => (shape == domain).then_some(Space::Element),
            GroupKind::Row(geo) => {
                let spaces: Vec<Space> = self
                    .node(n)
                    .operands
                    .iter()
                    .filter(|&&o| self.in_group(o, gid))
                    .map(|&o| self.space_of(o))
                    .collect();
                if spaces.contains(&Space::Row) {
                    let all_row = spaces.iter().all(|&s| s == Space::Row);
                    (all_row && *shape == geo.row_shape()).then_some(Space::Row)
                } else if *shape == geo.keepdim_shape() || (*shape == geo.input && geo.preserves_layout()) {
                    Some(Space::Element)
                } else {
                    None
                }
            }
            GroupKind::Column(geo) => self.column_join_space(n, gid, geo),
            _ => None,
        }
    }

    /// Whether `id` is forward work, and whether it recomputes a forward value for the backward.
    fn side_of(&self, id: NodeId) -> (bool, bool) {
        let loc = self.node(id).loc.as_ref();
        (loc.is_none_or(|l| !l.backward), loc.is_some_and(|l| l.recomputed))
    }

    fn can_join(&self, n: NodeId, gid: usize, space: Space) -> std::result::Result<(), &'static str> {
        let group = self.group(gid);
        if mixes_recomputed_with_forward(self.side_of(n), (group.forward, group.recomputed)) {
            return Err("a value recomputed for the backward stays out of forward kernels");
        }
        if self.outside_path(&Side { groups: &[gid], extra: &[] }, &Side { groups: &[], extra: &[n] }) {
            return Err("a path through a node outside the kernel would form a cycle");
        }
        if let GroupKind::Row(geo) = &self.group(gid).kind {
            let per_element =
                space == Space::Element && *self.shape(n) == geo.input && *self.shape(n) != geo.keepdim_shape();
            let in_group = |o: NodeId| self.in_group(o, gid);
            if per_element && !self.value_varies(geo, n, &|o| self.group(gid).varies.contains(&o), &in_group) {
                return Err("an element value that does not vary along the row could not be stored");
            }
            if !self.reduction_chain_fits(geo, &[gid], &[n]) {
                return Err("rows longer than the cache: one chain of dependent reductions per kernel");
            }
        }
        Ok(())
    }

    /// Merges group `src` (computing an operand of `n`) into `home` (which holds `n`).
    fn try_absorb(&mut self, src: usize, home: usize, n: NodeId) -> std::result::Result<(), &'static str> {
        let (a, b) = (self.group(src), self.group(home));
        if mixes_recomputed_with_forward((a.forward, a.recomputed), (b.forward, b.recomputed)) {
            return Err("a value recomputed for the backward stays out of forward kernels");
        }
        let space_n = self.space_of(n);
        if self.holds_gather(src) || self.holds_gather(home) {
            let same_pointwise = matches!(
                (&self.group(src).kind, &self.group(home).kind),
                (GroupKind::Pointwise { domain: a }, GroupKind::Pointwise { domain: b }) if a == b
            );
            if !same_pointwise {
                return Err("a gather or an arange stays in a pointwise kernel of its own shape");
            }
            // Its table and indices are read from buffers: what computes them stays outside.
            let feeds_gather = |from: usize, into: usize| {
                self.group(into).members.iter().any(|&m| {
                    matches!(self.node(m).op, Op::IndexSelect { .. })
                        && self.node(m).operands.iter().any(|&o| self.in_group(o, from))
                })
            };
            if feeds_gather(src, home) || feeds_gather(home, src) {
                return Err("a gather reads its table and indices from buffers outside its kernel");
            }
        }
        let member_space = match (&self.group(src).kind, &self.group(home).kind) {
            (GroupKind::Pointwise { domain }, GroupKind::Pointwise { domain: home_domain }) => {
                if domain != home_domain {
                    self.side_values_ok(src, home, domain, home_domain)?;
                }
                Some(Space::Element)
            }
            (GroupKind::Pointwise { domain }, GroupKind::Row(geo)) => {
                let frame = if space_n == Space::Row { geo.row_shape() } else { geo.input.clone() };
                if space_n == Space::Element && *domain == geo.keepdim_shape() || *domain == frame {
                    let element_values = space_n == Space::Element && *domain == geo.input;
                    if element_values && *domain != geo.keepdim_shape() && !geo.preserves_layout() {
                        return Err("element values of a reduction over leading axes cannot be stored");
                    }
                } else {
                    self.side_values_ok(src, home, domain, &frame)?;
                }
                Some(space_n)
            }
            (GroupKind::Pointwise { domain }, GroupKind::Column(geo)) => {
                Some(self.column_absorbs_pointwise(src, home, domain, geo, space_n)?)
            }
            (GroupKind::Row(a), GroupKind::Row(b)) | (GroupKind::Column(a), GroupKind::Column(b)) if a == b => {
                let consistent =
                    self.node(n).operands.iter().all(|&o| !self.in_group(o, src) || self.space_of(o) == space_n);
                if !consistent {
                    return Err("the operand is indexed differently from its user");
                }
                None
            }
            _ => return Err("the groups are of different families or geometries"),
        };
        if self.outside_path(&Side { groups: &[home], extra: &[] }, &Side { groups: &[src], extra: &[] }) {
            return Err("a path through a node outside the kernel would form a cycle");
        }
        if self.copies_own_value(&Side { groups: &[home, src], extra: &[] }) {
            return Err("a copied view would read a value computed in the same kernel");
        }
        if let GroupKind::Row(geo) = &self.group(home).kind {
            if !self.reduction_chain_fits(geo, &[home, src], &[]) {
                return Err("rows longer than the cache: one chain of dependent reductions per kernel");
            }
            // Values read from outside may vary where the same values computed inside do not,
            // so every stored element value of the union is checked again.
            let union = self.side_members(&Side { groups: &[home, src], extra: &[] });
            if !self.stored_elements_vary(geo, &[home, src], &union) {
                return Err("an element value that does not vary along the row could not be stored");
            }
        }
        tracing::trace!(target: "braze::plan", node = %n, group = home, absorbed = src, "kernels merged");
        self.absorb(src, home, member_space);
        Ok(())
    }

    /// Whether a materialized view of `side` is a view of a value `side` computes: the copy reads
    /// its base from a buffer, which a value computed in the same kernel does not get.
    fn copies_own_value(&self, side: &Side) -> bool {
        self.side_members(side).into_iter().any(|m| {
            is_view(&self.node(m).op)
                && matches!(&self.view_access[&m], Access::Strided { base, .. } if self.side_contains(side, *base))
        })
    }

    /// A group of a smaller shape may be computed inside a kernel over a larger one (its values are
    /// broadcast, re-evaluated per element: cheap elementwise work) only when nothing outside the
    /// kernel reads it, since a broadcast value cannot be stored.
    pub(super) fn side_values_ok(
        &self,
        src: usize,
        home: usize,
        domain: &Shape,
        frame: &Shape,
    ) -> std::result::Result<(), &'static str> {
        if !domain.broadcasts_to(frame) {
            return Err("the shapes do not broadcast");
        }
        let members = &self.group(src).members;
        let closed = members.iter().all(|&m| {
            !self.g.is_output(m) && self.users(m).iter().all(|&u| self.in_group(u, src) || self.in_group(u, home))
        });
        if !closed {
            return Err("a broadcast value is also needed outside the kernel");
        }
        Ok(())
    }

    fn place_reduce(&mut self, r: NodeId) {
        let node = self.node(r);
        let Op::Reduce { axes, keepdim, .. } = &node.op else { return };
        let o = node.operands[0];
        let geo = RowGeometry { input: self.shape(o).clone(), axes: axes.clone() };
        let space = if *keepdim { Space::Element } else { Space::Row };
        if self.column_geometry(r).is_some() {
            self.place_column_reduce(r, geo, space);
            return;
        }
        let source = self.group_of.get(&o).copied().filter(|_| self.options.fuse);
        if let Some(gid) = source {
            if let GroupKind::Row(existing) = &self.group(gid).kind {
                if *existing == geo && self.space_of(o) == Space::Element {
                    if self.reduction_chain_fits(&geo, &[gid], &[r]) {
                        self.add_member(gid, r, space);
                        return;
                    }
                    self.refused(r, gid, "rows longer than the cache: one chain of dependent reductions per kernel");
                }
            }
        }
        let home = self.new_group(GroupKind::Row(geo.clone()), r, space);
        let Some(src) = source else { return };
        let GroupKind::Pointwise { domain } = &self.group(src).kind else { return };
        if *domain != geo.input {
            return;
        }
        if self.holds_gather(src) {
            self.refused(r, src, "a gather or an arange stays in a pointwise kernel of its own shape");
            return;
        }
        // The elementwise group producing the reduction's input becomes its prologue.
        let members = self.group(src).members.clone();
        if !geo.preserves_layout() {
            let closed = members
                .iter()
                .all(|&m| !self.g.is_output(m) && self.users(m).iter().all(|&u| u == r || self.in_group(u, src)));
            if !closed {
                self.refused(r, src, "element values of a reduction over leading axes cannot be stored");
                return;
            }
        } else if *domain != geo.keepdim_shape() && !self.stored_elements_vary(&geo, &[home, src], &members) {
            self.refused(r, src, "an element value that does not vary along the row could not be stored");
            return;
        }
        self.absorb(src, home, Some(Space::Element));
    }
}

/// Whether a kernel holding both sides (each `(forward work, recomputed for the backward)`) would
/// compute a recomputed value in the forward, where it would be stored and held until the
/// backward: what recomputing it was to avoid.
fn mixes_recomputed_with_forward(a: (bool, bool), b: (bool, bool)) -> bool {
    (a.0 && b.1) || (a.1 && b.0)
}
