//! Column kernels: reductions over leading axes (the grads of a bias or of a norm's weight,
//! `sum(dy * xhat, axes=[0])`). A row kernel would read such a reduction down strided columns
//! with one thread group per output; a column kernel reads the rows coalesced and splits them
//! over blocks instead.
//!
//! A column group holds its reductions (several over the same rows share one launch), the
//! elementwise prologue that only they read, and per-column epilogue values (a cast, a scale).
//! Element values never leave a column kernel: it stores one element per column.

use super::access::Access;
use super::cycles::Side;
use super::row::RowGeometry;
use super::{Fuser, GroupKind, Space};
use braze_ir::{NodeId, Op, Shape};
use std::collections::HashSet;

impl RowGeometry {
    /// Whether a column kernel computes this reduction: every reduced dim of extent > 1 comes
    /// before every kept dim of extent > 1, and there are some of each (so element (row, col)
    /// sits at `row * cols + col` of the input, and the result is not a full reduction).
    pub(super) fn reduces_leading_axes(&self) -> bool {
        let dims = self.input.dims();
        let last_reduced = self.axes.iter().copied().filter(|&a| dims[a] != 1).max();
        let first_kept = self.kept().into_iter().filter(|&d| dims[d] != 1).min();
        matches!((last_reduced, first_kept), (Some(r), Some(k)) if r < k)
    }
}

impl Fuser<'_> {
    /// The geometry of reduction `r` when a column kernel computes it.
    pub(super) fn column_geometry(&self, r: NodeId) -> Option<RowGeometry> {
        let node = self.node(r);
        let Op::Reduce { axes, .. } = &node.op else { return None };
        let geo = RowGeometry { input: self.shape(node.operands[0]).clone(), axes: axes.clone() };
        (self.options.fuse && geo.reduces_leading_axes()).then_some(geo)
    }

    /// Elementwise nodes whose values only column reductions need (directly or through other such
    /// nodes of the same shape): they are kept out of row kernels, so that the reduction takes
    /// them as its prologue instead of reading them from a buffer a row kernel wrote.
    pub(super) fn find_column_prologues(&mut self) {
        let mut found: HashSet<NodeId> = HashSet::new();
        for &n in self.order.iter().rev() {
            let node = self.node(n);
            if !node.op.is_elementwise() || self.g.is_output(n) || self.users(n).is_empty() {
                continue;
            }
            let feeds_column = |u: NodeId| {
                let user = self.node(u);
                let reduced_here = self.column_geometry(u).is_some_and(|_| user.operands[0] == n);
                reduced_here || (found.contains(&u) && user.shape == node.shape)
            };
            if self.users(n).iter().all(|&u| feeds_column(u)) {
                found.insert(n);
            }
        }
        self.column_prologue = found;
    }

    /// Whether group `gid` is elementwise work that only column reductions read.
    pub(super) fn is_column_prologue_group(&self, gid: usize) -> bool {
        let group = self.group(gid);
        matches!(group.kind, GroupKind::Pointwise { .. })
            && group.members.iter().all(|m| self.column_prologue.contains(m))
    }

    /// Places reduction `r` of column geometry `geo`: into the column kernel computing its
    /// operand, else into a new one that takes the operand's elementwise group as its prologue
    /// and joins an earlier column kernel over the same rows that reads the same buffers.
    pub(super) fn place_column_reduce(&mut self, r: NodeId, geo: RowGeometry, space: Space) {
        let o = self.node(r).operands[0];
        let source = self.group_of.get(&o).copied();
        if let Some(gid) = source {
            if matches!(&self.group(gid).kind, GroupKind::Column(existing) if *existing == geo)
                && self.space_of(o) == Space::Element
            {
                self.add_member(gid, r, space);
                return;
            }
        }
        let home = self.new_group(GroupKind::Column(geo.clone()), r, space);
        if let Some(src) = source {
            if matches!(&self.group(src).kind, GroupKind::Pointwise { domain } if *domain == geo.input) {
                if self.holds_gather(src) {
                    self.refused(r, src, "a gather or an arange stays in a pointwise kernel of its own shape");
                } else if self.prologue_closed(src, home, &geo) {
                    self.absorb(src, home, Some(Space::Element));
                } else {
                    self.refused(r, src, "the prologue's values are also needed outside the column kernel");
                }
            }
        }
        self.join_column_sibling(home, &geo);
    }

    /// Whether every value of group `src` is read only inside it, by column group `home`, or by
    /// reductions of geometry `geo` not placed yet (they join the column kernel it becomes part
    /// of; one placed elsewhere already reads a buffer, which a column kernel does not write for
    /// element values).
    fn prologue_closed(&self, src: usize, home: usize, geo: &RowGeometry) -> bool {
        self.group(src).members.iter().all(|&m| {
            !self.g.is_output(m)
                && self.users(m).iter().all(|&u| {
                    self.in_group(u, src)
                        || self.in_group(u, home)
                        || (!self.group_of.contains_key(&u)
                            && self.column_geometry(u).as_ref() == Some(geo)
                            && self.node(u).operands[0] == m)
                })
        })
    }

    /// Merges column group `home` into an earlier column group over the same rows that reads a
    /// buffer `home` reads too (a norm's weight and bias grads both read `dy`), when no path
    /// through another kernel connects them.
    fn join_column_sibling(&mut self, home: usize, geo: &RowGeometry) {
        let reads = self.external_reads(home);
        let siblings: Vec<usize> = (0..self.groups.len())
            .filter(|&g| g != home)
            .filter(|&g| matches!(&self.groups[g], Some(group) if matches!(&group.kind, GroupKind::Column(other) if other == geo)))
            .collect();
        for sibling in siblings {
            if self.external_reads(sibling).is_disjoint(&reads) {
                continue;
            }
            if self.reads_group(home, sibling) || self.reads_group(sibling, home) {
                self.refused(self.group(home).members[0], sibling, "one reduces what the other computes");
                continue;
            }
            if self.outside_path(&Side { groups: &[sibling], extra: &[] }, &Side { groups: &[home], extra: &[] }) {
                self.refused(self.group(home).members[0], sibling, "a path through another kernel would form a cycle");
                continue;
            }
            tracing::trace!(target: "braze::plan", group = sibling, absorbed = home, "column kernels merged");
            self.absorb(home, sibling, None);
            return;
        }
    }

    /// Whether a member of group `reader` reads a value of group `writer`.
    fn reads_group(&self, reader: usize, writer: usize) -> bool {
        self.group(reader).members.iter().any(|&m| self.node(m).operands.iter().any(|&o| self.in_group(o, writer)))
    }

    /// The buffers group `gid` reads from outside (the bases of the views it loads).
    fn external_reads(&self, gid: usize) -> HashSet<NodeId> {
        let mut reads = HashSet::new();
        for &m in &self.group(gid).members {
            for &o in &self.node(m).operands {
                if self.in_group(o, gid) {
                    continue;
                }
                if let Access::Strided { base, .. } = self.read_access(o) {
                    reads.insert(base);
                }
            }
        }
        reads
    }

    /// How elementwise `n` would be indexed in column group `gid`: per-column values only (a
    /// result's shape, with or without the reduced dims), never element values.
    pub(super) fn column_join_space(&self, n: NodeId, gid: usize, geo: &RowGeometry) -> Option<Space> {
        let shape: &Shape = self.shape(n);
        let spaces: Vec<Space> =
            self.node(n).operands.iter().filter(|&&o| self.in_group(o, gid)).map(|&o| self.space_of(o)).collect();
        if spaces.contains(&Space::Row) {
            (spaces.iter().all(|&s| s == Space::Row) && *shape == geo.row_shape()).then_some(Space::Row)
        } else {
            (*shape == geo.keepdim_shape()).then_some(Space::Element)
        }
    }

    /// Whether a pointwise group of `domain` may join column group `home` next to its member
    /// `n` (in `space_n`): per-column values of the same frame may; smaller ones only as
    /// broadcast side values nothing else reads.
    pub(super) fn column_absorbs_pointwise(
        &self,
        src: usize,
        home: usize,
        domain: &Shape,
        geo: &RowGeometry,
        space_n: Space,
    ) -> std::result::Result<Space, &'static str> {
        let frame = if space_n == Space::Row { geo.row_shape() } else { geo.keepdim_shape() };
        if *domain != frame {
            self.side_values_ok(src, home, domain, &frame)?;
        }
        Ok(space_n)
    }
}
