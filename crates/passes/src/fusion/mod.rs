//! Fusion: groups the ops of an optimized, decomposed graph into kernels and writes the [`Plan`].
//!
//! Nodes are visited in topological order; each joins a kernel by the first rule that applies:
//!
//! | rule | kernel |
//! | --- | --- |
//! | stack/concat of full reductions of K tensors, same op and same per-element prologue | multi-reduce, K items |
//! | full reduction of a tensor longer than `row_cache_limit` | multi-reduce, one item |
//! | matmul | matmul |
//! | `+ bias[n]`, then `relu` or `gelu_tanh`, on a matmul result with no other user | matmul epilogue |
//! | reduction over some axes, with the elementwise group of its input's shape | row (prologue) |
//! | reduction of a row group's element values over the same axes | row (dependent reductions) |
//! | elementwise op on a row group's per-row or element values | row (epilogue) |
//! | elementwise op of the shape of an operand's pointwise group | pointwise |
//! | a smaller elementwise group that only this kernel reads | broadcast side values |
//! | concat | concat |
//!
//! Views (reshape, permute, slice, broadcast_to) get no kernels: they fold into strided loads. A
//! merge is refused when it would close a cycle through a node outside the merged groups, when a
//! row kernel over rows longer than the cache would hold more than one chain of dependent
//! reductions, or when a value the kernel must store could not be stored in its family's layout.

mod access;
mod legalize;
mod lower;
mod multi_reduce;

use crate::decompose::Origins;
use crate::{PassError, Result};
use access::Access;
use braze_ir::infer::reduced_shape;
use braze_ir::{BinaryOp, Graph, Node, NodeId, Op, Shape, UnaryOp};
use braze_plan::{Activation, Plan};
use multi_reduce::MultiReduceGroup;
use std::collections::{HashMap, HashSet};

/// Knobs of the fusion rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FusionOptions {
    /// Longest row (in elements) that row kernels keep in registers. Longer rows are re-read from
    /// memory for every dependent reduction, so a kernel over them holds at most one chain of two
    /// dependent reductions (one layer norm or softmax); further layers get kernels of their own.
    /// Also the size above which a full reduction becomes a chunked multi-reduce instead of a
    /// one-row kernel.
    pub row_cache_limit: usize,
    /// `false`: every op becomes a kernel of its own (views still fold into loads), for debugging
    /// and for testing the fusion against unfused plans.
    pub fuse: bool,
}

impl Default for FusionOptions {
    fn default() -> FusionOptions {
        FusionOptions { row_cache_limit: 16384, fuse: true }
    }
}

/// Fuses an optimized, decomposed graph (see [`crate::optimize`]) into a plan. Composites that are
/// still present are decomposed first.
pub fn fuse(graph: &Graph, options: &FusionOptions) -> Result<Plan> {
    fuse_with_origins(graph, options, &Origins::new())
}

/// [`crate::optimize`], then [`fuse`].
pub fn compile_to_plan(graph: &Graph, options: &FusionOptions) -> Result<Plan> {
    let (optimized, origins) = crate::pass::optimize_with_origins(graph)?;
    fuse_with_origins(&optimized, options, &origins)
}

fn fuse_with_origins(graph: &Graph, options: &FusionOptions, origins: &Origins) -> Result<Plan> {
    // Graphs are type-checked as they are built; verifying again is for catching our own bugs.
    if cfg!(debug_assertions) {
        graph.verify()?;
    }
    let (g, origins) = legalize::legalize(graph, origins)?;
    let mut fuser = Fuser::new(&g, options, &origins);
    fuser.fold_views();
    fuser.claim_multi_reductions();
    fuser.plan_materializations()?;
    fuser.group_nodes()?;
    let plan = fuser.lower()?;
    if cfg!(debug_assertions) {
        plan.validate()?;
    }
    tracing::debug!(target: "braze::plan", "\n{plan}");
    Ok(plan)
}

/// Over rows longer than the cache, the longest chain of dependent reductions one kernel holds
/// (layer norm: mean, then variance).
const MAX_UNCACHED_REDUCTION_CHAIN: usize = 2;

/// Which coordinates a value of a row group is indexed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Space {
    /// The reduction's input shape (element values, and keepdim per-row values broadcast over it).
    Element,
    /// The shape with the reduced axes dropped (results of a reduction without keepdim).
    Row,
}

/// A reduction's iteration domain: `input` with the kept dims as rows and `axes` as columns.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RowGeometry {
    input: Shape,
    axes: Vec<usize>,
}

impl RowGeometry {
    fn kept(&self) -> Vec<usize> {
        (0..self.input.rank()).filter(|d| !self.axes.contains(d)).collect()
    }

    fn outer(&self) -> Vec<usize> {
        self.kept().into_iter().map(|d| self.input.dims()[d]).collect()
    }

    fn inner(&self) -> Vec<usize> {
        self.axes.iter().map(|&a| self.input.dims()[a]).collect()
    }

    fn cols(&self) -> usize {
        self.inner().iter().product()
    }

    fn keepdim_shape(&self) -> Shape {
        reduced_shape(&self.input, &self.axes, true)
    }

    fn row_shape(&self) -> Shape {
        reduced_shape(&self.input, &self.axes, false)
    }

    /// Whether element (row, col) of the domain sits at `row * cols + col` of the input's
    /// row-major layout, so element values can be stored: no reduced dim of size > 1 comes before
    /// a kept dim of size > 1.
    fn preserves_layout(&self) -> bool {
        let dims = self.input.dims();
        let last_kept = self.kept().into_iter().filter(|&d| dims[d] != 1).max();
        let first_reduced = self.axes.iter().copied().filter(|&a| dims[a] != 1).min();
        match (last_kept, first_reduced) {
            (Some(k), Some(r)) => k < r,
            _ => true,
        }
    }
}

/// A matmul and the epilogue ops folded into it.
#[derive(Clone, Debug)]
struct MatMulGroup {
    node: NodeId,
    /// The `[n]` bias operand of the folded add.
    bias: Option<NodeId>,
    activation: Option<Activation>,
    /// The last node of the group: what the kernel stores.
    result: NodeId,
}

#[derive(Clone, Debug)]
enum GroupKind {
    Pointwise { domain: Shape },
    Row(RowGeometry),
    MultiReduce(MultiReduceGroup),
    MatMul(MatMulGroup),
    Concat { node: NodeId },
}

#[derive(Clone, Debug)]
struct Group {
    kind: GroupKind,
    members: Vec<NodeId>,
    /// Members of a row group indexed by [`Space::Row`]; all others use [`Space::Element`].
    row_space: HashSet<NodeId>,
    /// Members of a row group whose value changes along the row (the others are per-row).
    varies: HashSet<NodeId>,
    min_pos: usize,
    max_pos: usize,
}

/// One side of a merge: whole groups plus nodes not placed yet.
struct Side<'s> {
    groups: &'s [usize],
    extra: &'s [NodeId],
}

struct Fuser<'a> {
    g: &'a Graph,
    options: &'a FusionOptions,
    origins: &'a Origins,
    order: Vec<NodeId>,
    pos: HashMap<NodeId, usize>,
    users: HashMap<NodeId, Vec<NodeId>>,
    /// The folded access of every view node, over its own shape.
    view_access: HashMap<NodeId, Access>,
    /// View and constant nodes that get a buffer of their own (a copy kernel writes them).
    materialized: HashSet<NodeId>,
    groups: Vec<Option<Group>>,
    group_of: HashMap<NodeId, usize>,
}

fn is_view(op: &Op) -> bool {
    matches!(op, Op::Reshape | Op::BroadcastTo | Op::Permute { .. } | Op::Slice { .. })
}

fn lowering_error(g: &Graph, id: NodeId, detail: impl Into<String>) -> PassError {
    PassError::Lowering { node: id.to_string(), op: g.node(id).op.name().into(), detail: detail.into() }
}

impl<'a> Fuser<'a> {
    fn new(g: &'a Graph, options: &'a FusionOptions, origins: &'a Origins) -> Fuser<'a> {
        let order = crate::topo::topo_order(g);
        let pos = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
        let users = order.iter().map(|&n| (n, g.users(n))).collect();
        Fuser {
            g,
            options,
            origins,
            order,
            pos,
            users,
            view_access: HashMap::new(),
            materialized: HashSet::new(),
            groups: Vec::new(),
            group_of: HashMap::new(),
        }
    }

    fn node(&self, id: NodeId) -> &'a Node {
        self.g.node(id)
    }

    fn shape(&self, id: NodeId) -> &'a Shape {
        &self.g.node(id).shape
    }

    fn pos(&self, id: NodeId) -> usize {
        self.pos[&id]
    }

    fn users(&self, id: NodeId) -> &[NodeId] {
        &self.users[&id]
    }

    /// Whether `id`'s value is read only by `user` (once or several times) and is no graph output.
    fn only_feeds(&self, id: NodeId, user: NodeId) -> bool {
        !self.g.is_output(id) && self.users(id) == [user]
    }

    fn group(&self, gid: usize) -> &Group {
        self.groups[gid].as_ref().expect("group ids in group_of refer to live groups")
    }

    fn group_mut(&mut self, gid: usize) -> &mut Group {
        self.groups[gid].as_mut().expect("group ids in group_of refer to live groups")
    }

    fn in_group(&self, id: NodeId, gid: usize) -> bool {
        self.group_of.get(&id) == Some(&gid)
    }

    fn space_of(&self, id: NodeId) -> Space {
        match self.group_of.get(&id) {
            Some(&gid) if self.group(gid).row_space.contains(&id) => Space::Row,
            _ => Space::Element,
        }
    }

    // ---- views -------------------------------------------------------------------------------

    fn fold_views(&mut self) {
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
    fn read_access(&self, x: NodeId) -> Access {
        let node = self.node(x);
        match &node.op {
            Op::Constant { value } => Access::Const { value: *value },
            op if is_view(op) => match &self.view_access[&x] {
                Access::Const { value } => Access::Const { value: *value },
                _ if self.materialized.contains(&x) => Access::whole(x, &node.shape),
                folded => folded.clone(),
            },
            _ => Access::whole(x, &node.shape),
        }
    }

    /// [`Fuser::read_access`], except that a materialized constant is read from its buffer.
    fn buffer_access(&self, x: NodeId) -> Access {
        if self.materialized.contains(&x) {
            Access::whole(x, self.shape(x))
        } else {
            self.read_access(x)
        }
    }

    /// Whether `x` can be read as a whole contiguous buffer (what concat inputs, matmul biases and
    /// plan outputs need).
    fn reads_contiguously(&self, x: NodeId) -> bool {
        match self.buffer_access(x) {
            Access::Strided { base, offset, strides } => {
                access::is_contiguous(self.shape(x).dims(), offset, &strides, self.shape(base).numel())
            }
            Access::Const { .. } => false,
        }
    }

    /// Gives buffers to the views and constants that concat, matmul, multi-reduce and the graph
    /// outputs cannot read as they are.
    fn plan_materializations(&mut self) -> Result<()> {
        let mut needed = Vec::new();
        for group in self.groups.iter().flatten() {
            if let GroupKind::MultiReduce(mr) = &group.kind {
                needed.extend(mr.leaves.iter().copied().filter(|&leaf| !self.reads_densely(leaf)));
            }
        }
        for &n in &self.order {
            match self.node(n).op {
                Op::MatMul => {
                    let operands = &self.node(n).operands;
                    needed.extend(operands.iter().copied().filter(|&x| self.matmul_operand(n, x).is_none()));
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

    // ---- groups ------------------------------------------------------------------------------

    fn new_group(&mut self, kind: GroupKind, first: NodeId, space: Space) -> usize {
        let gid = self.groups.len();
        let pos = self.pos(first);
        self.groups.push(Some(Group {
            kind,
            members: Vec::new(),
            row_space: HashSet::new(),
            varies: HashSet::new(),
            min_pos: pos,
            max_pos: pos,
        }));
        self.add_member(gid, first, space);
        gid
    }

    fn add_member(&mut self, gid: usize, id: NodeId, space: Space) {
        let pos = self.pos(id);
        let varies = match &self.group(gid).kind {
            GroupKind::Row(geo) => {
                space == Space::Element
                    && self.value_varies(geo, id, &|o| self.group(gid).varies.contains(&o), &|o| self.in_group(o, gid))
            }
            _ => false,
        };
        self.group_of.insert(id, gid);
        let group = self.group_mut(gid);
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
    fn absorb(&mut self, src: usize, dst: usize, space: Option<Space>) {
        let Some(moved) = self.groups[src].take() else { return };
        for &m in &moved.members {
            self.group_of.insert(m, dst);
        }
        let group = self.group_mut(dst);
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

    fn group_nodes(&mut self) -> Result<()> {
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
                op if op.is_elementwise() => self.place_elementwise(n),
                _ => return Err(lowering_error(self.g, n, "composite ops must be decomposed before fusion")),
            }
        }
        Ok(())
    }

    fn refused(&self, n: NodeId, gid: usize, reason: &str) {
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
                if matches!(self.group(gid).kind, GroupKind::Pointwise { .. } | GroupKind::Row(_))
                    && !found.contains(&gid)
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
        let candidates = self.operand_groups(n);
        let mut home = None;
        if self.options.fuse {
            // Joining a reduction's kernel (as its epilogue) saves more than joining a pointwise one.
            let is_row = |gid: &usize| matches!(self.group(*gid).kind, GroupKind::Row(_));
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
            _ => None,
        }
    }

    fn can_join(&self, n: NodeId, gid: usize, space: Space) -> std::result::Result<(), &'static str> {
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
        let space_n = self.space_of(n);
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
            (GroupKind::Row(a), GroupKind::Row(b)) if a == b => {
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
    fn side_values_ok(
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

    /// Folds `n` into a matmul kernel as its bias add or activation, when it applies.
    fn try_matmul_epilogue(&mut self, n: NodeId) -> bool {
        let node = self.node(n);
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
            Op::Unary { op: op @ (UnaryOp::Relu | UnaryOp::GeluTanh) } => {
                let o = node.operands[0];
                let Some((gid, mm)) = matmul_result(o) else { return false };
                if mm.activation.is_some() || !sole(o) {
                    return false;
                }
                self.add_member(gid, n, Space::Element);
                if let GroupKind::MatMul(mm) = &mut self.group_mut(gid).kind {
                    mm.activation = Some(if op == UnaryOp::Relu { Activation::Relu } else { Activation::GeluTanh });
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

    /// Whether there is a path from one side to the other that leaves both (a merge would make
    /// the kernel both write a value and read something computed from it).
    fn outside_path(&self, a: &Side, b: &Side) -> bool {
        self.path_via_outside(a, b) || self.path_via_outside(b, a)
    }

    fn side_contains(&self, side: &Side, id: NodeId) -> bool {
        side.extra.contains(&id) || self.group_of.get(&id).is_some_and(|g| side.groups.contains(g))
    }

    fn side_members(&self, side: &Side) -> Vec<NodeId> {
        let mut members: Vec<NodeId> = side.extra.to_vec();
        for &gid in side.groups {
            members.extend(&self.group(gid).members);
        }
        members
    }

    fn side_len(&self, side: &Side) -> usize {
        side.extra.len() + side.groups.iter().map(|&g| self.group(g).members.len()).sum::<usize>()
    }

    /// Smallest and largest topological position of the side's members.
    fn side_span(&self, side: &Side) -> (usize, usize) {
        let groups = side.groups.iter().map(|&g| (self.group(g).min_pos, self.group(g).max_pos));
        let extra = side.extra.iter().map(|&m| (self.pos(m), self.pos(m)));
        groups.chain(extra).fold((usize::MAX, 0), |(lo, hi), (a, b)| (lo.min(a), hi.max(b)))
    }

    /// Searches from the smaller side only, bounded by the other side's topological span.
    fn path_via_outside(&self, from: &Side, to: &Side) -> bool {
        let outside = |id: NodeId| !self.side_contains(from, id) && !self.side_contains(to, id);
        let mut seen = HashSet::new();
        let mut stack = Vec::new();
        if self.side_len(to) <= self.side_len(from) {
            // Backward from `to`: only nodes after the first member of `from` can lie between.
            let lowest = self.side_span(from).0;
            let push = |x: NodeId, stack: &mut Vec<NodeId>, seen: &mut HashSet<NodeId>| {
                if outside(x) && self.pos(x) > lowest && seen.insert(x) {
                    stack.push(x);
                }
            };
            for m in self.side_members(to) {
                for &o in &self.node(m).operands {
                    push(o, &mut stack, &mut seen);
                }
            }
            while let Some(x) = stack.pop() {
                for &o in &self.node(x).operands {
                    if self.side_contains(from, o) {
                        return true;
                    }
                    push(o, &mut stack, &mut seen);
                }
            }
        } else {
            // Forward from `from`: only nodes before the last member of `to` can lie between.
            let highest = self.side_span(to).1;
            let push = |x: NodeId, stack: &mut Vec<NodeId>, seen: &mut HashSet<NodeId>| {
                if outside(x) && self.pos(x) < highest && seen.insert(x) {
                    stack.push(x);
                }
            };
            for m in self.side_members(from) {
                for &u in self.users(m) {
                    push(u, &mut stack, &mut seen);
                }
            }
            while let Some(x) = stack.pop() {
                for &u in self.users(x) {
                    if self.side_contains(to, u) {
                        return true;
                    }
                    push(u, &mut stack, &mut seen);
                }
            }
        }
        false
    }

    /// Over rows longer than the cache, whether the union holds no chain of more than
    /// [`MAX_UNCACHED_REDUCTION_CHAIN`] dependent reductions.
    fn reduction_chain_fits(&self, geo: &RowGeometry, groups: &[usize], extra: &[NodeId]) -> bool {
        if geo.cols() <= self.options.row_cache_limit {
            return true;
        }
        let side = Side { groups, extra };
        let mut members = self.side_members(&side);
        members.sort_by_key(|&m| self.pos(m));
        let mut depth: HashMap<NodeId, usize> = HashMap::new();
        for m in members {
            let node = self.node(m);
            let deepest = node.operands.iter().filter_map(|o| depth.get(o)).copied().max().unwrap_or(0);
            let d = if matches!(node.op, Op::Reduce { .. }) { deepest + 1 } else { deepest };
            if d > MAX_UNCACHED_REDUCTION_CHAIN {
                return false;
            }
            depth.insert(m, d);
        }
        true
    }

    /// Whether each of `candidates` that has the full element shape and may be stored (it is an
    /// output or read outside the union) varies along the row. A row kernel stores values that
    /// are the same for every column once per row, so an element value that happens not to vary
    /// (it reads only broadcast views) would be stored in the wrong layout: one element per row
    /// where the buffer holds `rows * cols` (the same only for one column; none for zero).
    fn stored_elements_vary(&self, geo: &RowGeometry, groups: &[usize], candidates: &[NodeId]) -> bool {
        if geo.cols() == 1 {
            return true;
        }
        let side = Side { groups, extra: &[] };
        let may_be_stored = |m: NodeId| {
            *self.shape(m) == geo.input
                && self.space_of(m) == Space::Element
                && (self.g.is_output(m) || self.users(m).iter().any(|&u| !self.side_contains(&side, u)))
        };
        let checked: Vec<NodeId> = candidates.iter().copied().filter(|&m| may_be_stored(m)).collect();
        if checked.is_empty() {
            return true;
        }
        let varies = self.varying_members(geo, &side);
        checked.iter().all(|m| varies.contains(m))
    }

    /// The members of `side` whose values change along the row, were they one row kernel.
    fn varying_members(&self, geo: &RowGeometry, side: &Side) -> HashSet<NodeId> {
        let mut members = self.side_members(side);
        members.sort_by_key(|&m| self.pos(m));
        let mut varies: HashSet<NodeId> = HashSet::new();
        for m in members {
            let inside = |o: NodeId| self.side_contains(side, o);
            if self.space_of(m) == Space::Element && self.value_varies(geo, m, &|o| varies.contains(&o), &inside) {
                varies.insert(m);
            }
        }
        varies
    }

    /// Whether element-space value `m` changes along the row: some operand computed in the kernel
    /// does (`varies`), or some operand read from outside (`inside` is false) is read with a
    /// nonzero stride along a reduced axis. Mirrors [`braze_plan::Body::row_values`].
    fn value_varies(
        &self,
        geo: &RowGeometry,
        m: NodeId,
        varies: &dyn Fn(NodeId) -> bool,
        inside: &dyn Fn(NodeId) -> bool,
    ) -> bool {
        let node = self.node(m);
        match &node.op {
            Op::Reduce { .. } | Op::Constant { .. } => false,
            op if is_view(op) => self.access_varies(self.view_access[&m].clone(), &node.shape, &node.shape, geo),
            _ => node.operands.iter().any(|&o| {
                if inside(o) {
                    varies(o)
                } else {
                    self.access_varies(self.read_access(o), self.shape(o), &node.shape, geo)
                }
            }),
        }
    }

    /// Whether reading `access` (over `shape`) broadcast to `frame` (an element frame) changes
    /// along the reduced axes.
    fn access_varies(&self, access: Access, shape: &Shape, frame: &Shape, geo: &RowGeometry) -> bool {
        let Access::Strided { strides, .. } = access else { return false };
        let in_frame = access::broadcast_strides(&strides, shape.dims(), frame.dims());
        let in_input = access::broadcast_strides(&in_frame, frame.dims(), geo.input.dims());
        geo.axes.iter().any(|&a| in_input[a] != 0)
    }
}
