//! Row kernels: a reduction's geometry, and how much one row kernel may hold.

use super::access::{self, Access};
use super::cycles::Side;
use super::{is_view, Fuser, Space};
use braze_ir::infer::reduced_shape;
use braze_ir::{NodeId, Op, Shape};
use std::collections::{HashMap, HashSet};

/// Over rows longer than the cache, the longest chain of dependent reductions one kernel holds
/// (layer norm: mean, then variance).
const MAX_UNCACHED_REDUCTION_CHAIN: usize = 2;

/// A reduction's iteration domain: `input` with the kept dims as rows and `axes` as columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct RowGeometry {
    pub(super) input: Shape,
    pub(super) axes: Vec<usize>,
}

impl RowGeometry {
    pub(super) fn kept(&self) -> Vec<usize> {
        (0..self.input.rank()).filter(|d| !self.axes.contains(d)).collect()
    }

    pub(super) fn outer(&self) -> Vec<usize> {
        self.kept().into_iter().map(|d| self.input.dims()[d]).collect()
    }

    pub(super) fn inner(&self) -> Vec<usize> {
        self.axes.iter().map(|&a| self.input.dims()[a]).collect()
    }

    pub(super) fn cols(&self) -> usize {
        self.inner().iter().product()
    }

    pub(super) fn keepdim_shape(&self) -> Shape {
        reduced_shape(&self.input, &self.axes, true)
    }

    pub(super) fn row_shape(&self) -> Shape {
        reduced_shape(&self.input, &self.axes, false)
    }

    /// Whether element (row, col) of the domain sits at `row * cols + col` of the input's
    /// row-major layout, so element values can be stored: no reduced dim of size > 1 comes before
    /// a kept dim of size > 1.
    pub(super) fn preserves_layout(&self) -> bool {
        let dims = self.input.dims();
        let last_kept = self.kept().into_iter().filter(|&d| dims[d] != 1).max();
        let first_reduced = self.axes.iter().copied().filter(|&a| dims[a] != 1).min();
        match (last_kept, first_reduced) {
            (Some(k), Some(r)) => k < r,
            _ => true,
        }
    }
}

impl Fuser<'_> {
    /// Over rows longer than the cache, whether the union holds no chain of more than
    /// [`MAX_UNCACHED_REDUCTION_CHAIN`] dependent reductions.
    pub(super) fn reduction_chain_fits(&self, geo: &RowGeometry, groups: &[usize], extra: &[NodeId]) -> bool {
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
    pub(super) fn stored_elements_vary(&self, geo: &RowGeometry, groups: &[usize], candidates: &[NodeId]) -> bool {
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
    pub(super) fn varying_members(&self, geo: &RowGeometry, side: &Side) -> HashSet<NodeId> {
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
    pub(super) fn value_varies(
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
