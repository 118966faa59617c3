//! From groups to the plan: kernel bodies, kernel order, buffers, names and sources.

use super::access::{self, Access};
use super::row::RowGeometry;
use super::{is_view, lowering_error, Fuser, GroupKind, Space};
use crate::Result;
use braze_ir::{DType, Literal, NodeId, Op, Shape};
use braze_plan::{
    Body, Buffer, BufferId, BufferRole, ColumnKernel, Concat, Expr, Kernel, KernelKind, MatMul, Plan, PlanOutput,
    Pointwise, RowKernel, SourceOp, Store, ValueId,
};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};

/// Kernel name parts taken from the ops it fuses, at most.
const MAX_NAME_PARTS: usize = 4;

/// The iteration domain loads are expressed over.
pub(super) enum Domain<'g> {
    /// Pointwise: the kernel's shape.
    Flat(&'g Shape),
    /// Row kernel: `outer ++ inner` of the geometry.
    Rows(&'g RowGeometry),
    /// Column kernel: `inner ++ outer` of the geometry (the reduced dims first).
    Columns(&'g RowGeometry),
    /// A multi-reduce prologue: only the item's element can be read.
    Item,
}

impl Domain<'_> {
    /// Strides over the domain for a value indexed by `frame` (in `space`) with `strides`.
    fn map(&self, frame: &Shape, space: Space, strides: &[usize]) -> Option<Vec<usize>> {
        match self {
            Domain::Flat(shape) => Some(access::broadcast_strides(strides, frame.dims(), shape.dims())),
            Domain::Rows(geo) => {
                let mut out: Vec<usize> = match space {
                    Space::Element => {
                        let s = access::broadcast_strides(strides, frame.dims(), geo.input.dims());
                        geo.kept().iter().chain(&geo.axes).map(|&d| s[d]).collect()
                    }
                    Space::Row => {
                        let mut s = access::broadcast_strides(strides, frame.dims(), geo.row_shape().dims());
                        s.resize(s.len() + geo.axes.len(), 0);
                        s
                    }
                };
                let dims: Vec<usize> = geo.outer().into_iter().chain(geo.inner()).collect();
                access::zero_unit_dims(&dims, &mut out);
                Some(out)
            }
            Domain::Columns(geo) => {
                let mut out: Vec<usize> = match space {
                    Space::Element => {
                        let s = access::broadcast_strides(strides, frame.dims(), geo.input.dims());
                        geo.axes.iter().chain(&geo.kept()).map(|&d| s[d]).collect()
                    }
                    Space::Row => {
                        let s = access::broadcast_strides(strides, frame.dims(), geo.row_shape().dims());
                        vec![0; geo.axes.len()].into_iter().chain(s).collect()
                    }
                };
                let dims: Vec<usize> = geo.inner().into_iter().chain(geo.outer()).collect();
                access::zero_unit_dims(&dims, &mut out);
                Some(out)
            }
            Domain::Item => None,
        }
    }
}

/// Builds one kernel body, reading each buffer through one input slot and each distinct view once.
#[derive(Default)]
pub(super) struct BodyBuilder {
    pub(super) body: Body,
    /// The node whose buffer each input slot reads.
    pub(super) inputs: Vec<NodeId>,
    slots: HashMap<NodeId, usize>,
    loads: HashMap<(usize, usize, Vec<usize>), ValueId>,
    consts: HashMap<((u8, u64), DType), ValueId>,
    pub(super) values: HashMap<NodeId, ValueId>,
    /// Views folded into this kernel's loads (for its sources).
    pub(super) folded: BTreeSet<(usize, NodeId)>,
}

impl BodyBuilder {
    fn slot(&mut self, base: NodeId) -> usize {
        *self.slots.entry(base).or_insert_with(|| {
            self.inputs.push(base);
            self.inputs.len() - 1
        })
    }

    fn load(&mut self, base: NodeId, offset: usize, strides: Vec<usize>, dtype: DType) -> ValueId {
        let input = self.slot(base);
        let key = (input, offset, strides.clone());
        if let Some(&v) = self.loads.get(&key) {
            return v;
        }
        let v = self.body.push(Expr::Load { input, offset, strides }, dtype);
        self.loads.insert(key, v);
        v
    }

    pub(super) fn constant(&mut self, value: Literal, dtype: DType) -> ValueId {
        let value = value.to_dtype(dtype);
        *self.consts.entry((value.bit_key(), dtype)).or_insert_with(|| {
            self.body.values.push(braze_plan::Value { expr: Expr::Const { value }, dtype });
            ValueId(self.body.values.len() - 1)
        })
    }
}

/// A kernel before buffers are numbered.
struct Draft {
    kind: KernelKind,
    /// The node whose buffer each input slot reads.
    inputs: Vec<NodeId>,
    /// The node each output slot stores.
    stored: Vec<NodeId>,
    sources: Vec<SourceOp>,
    /// The name without its index, e.g. `row_layer_norm_relu_add_f32`.
    stem: String,
    first_pos: usize,
}

impl Fuser<'_> {
    pub(super) fn lower(&self) -> Result<Plan> {
        let mut drafts = Vec::new();
        for gid in 0..self.groups.len() {
            if self.groups[gid].is_some() {
                drafts.push(self.draft(gid)?);
            }
        }
        let order = self.kernel_order(&drafts)?;

        let output_bases: Vec<NodeId> = self.g.outputs().iter().map(|&o| self.output_base(o)).collect::<Result<_>>()?;
        let mut plan = Plan::default();
        let mut buffer_of: HashMap<NodeId, BufferId> = HashMap::new();
        let mut new_buffer = |plan: &mut Plan, node: NodeId, role: BufferRole| {
            let n = self.node(node);
            plan.buffers.push(Buffer { dtype: n.dtype, numel: n.shape.numel(), role });
            let id = BufferId(plan.buffers.len() - 1);
            buffer_of.insert(node, id);
            id
        };
        for (i, &input) in self.g.inputs().iter().enumerate() {
            let id = new_buffer(&mut plan, input, BufferRole::Input(i));
            plan.inputs.push(id);
        }
        let mut kernels = Vec::new();
        for (index, d) in order.into_iter().enumerate() {
            let draft = &drafts[d];
            let mut outputs = Vec::new();
            for &s in &draft.stored {
                let role = if output_bases.contains(&s) { BufferRole::Output } else { BufferRole::Intermediate };
                outputs.push(new_buffer(&mut plan, s, role));
            }
            kernels.push((index, d, outputs));
        }
        for (index, d, outputs) in kernels {
            let draft = &drafts[d];
            let inputs = draft
                .inputs
                .iter()
                .map(|b| {
                    buffer_of.get(b).copied().ok_or_else(|| lowering_error(self.g, *b, "read before it is written"))
                })
                .collect::<Result<Vec<_>>>()?;
            plan.kernels.push(Kernel {
                name: format!("{}_{index}", draft.stem),
                kind: draft.kind.clone(),
                inputs,
                outputs,
                sources: draft.sources.clone(),
            });
        }
        plan.checks = self
            .gathers()
            .map(|n| braze_plan::Check {
                op: self.node(n).op.name().to_string(),
                loc: self.node(n).loc.clone(),
                bound: self.shape(self.node(n).operands[0]).dims()[match self.node(n).op {
                    Op::IndexSelect { axis } => axis,
                    _ => 0,
                }],
            })
            .collect();
        for (&o, base) in self.g.outputs().iter().zip(output_bases) {
            let buffer =
                buffer_of.get(&base).copied().ok_or_else(|| lowering_error(self.g, o, "output has no buffer"))?;
            plan.outputs.push(PlanOutput { buffer, shape: self.shape(o).clone() });
        }
        Ok(plan)
    }

    /// The node whose buffer holds graph output `o` (itself, or the base of a contiguous view).
    fn output_base(&self, o: NodeId) -> Result<NodeId> {
        if matches!(self.node(o).op, Op::Input { .. }) || self.group_of.contains_key(&o) {
            return Ok(o);
        }
        match self.buffer_access(o) {
            Access::Strided { base, .. } => Ok(base),
            Access::Const { .. } => Err(lowering_error(self.g, o, "constant output without a kernel")),
        }
    }

    /// Kernels in an order where each runs after the kernels writing what it reads; among ready
    /// kernels, the one whose first op comes first in the graph.
    fn kernel_order(&self, drafts: &[Draft]) -> Result<Vec<usize>> {
        let mut writer: HashMap<NodeId, usize> = HashMap::new();
        for (d, draft) in drafts.iter().enumerate() {
            for &s in &draft.stored {
                writer.insert(s, d);
            }
        }
        let mut waiting = vec![0usize; drafts.len()];
        let mut readers: Vec<Vec<usize>> = vec![Vec::new(); drafts.len()];
        for (d, draft) in drafts.iter().enumerate() {
            let mut deps: Vec<usize> = draft.inputs.iter().filter_map(|b| writer.get(b).copied()).collect();
            deps.sort();
            deps.dedup();
            for w in deps {
                if w != d {
                    waiting[d] += 1;
                    readers[w].push(d);
                }
            }
        }
        let mut ready: BinaryHeap<Reverse<(usize, usize)>> =
            (0..drafts.len()).filter(|&d| waiting[d] == 0).map(|d| Reverse((drafts[d].first_pos, d))).collect();
        let mut order = Vec::with_capacity(drafts.len());
        while let Some(Reverse((_, d))) = ready.pop() {
            order.push(d);
            for &r in &readers[d] {
                waiting[r] -= 1;
                if waiting[r] == 0 {
                    ready.push(Reverse((drafts[r].first_pos, r)));
                }
            }
        }
        if order.len() != drafts.len() {
            let stuck = drafts.iter().enumerate().find(|(d, _)| !order.contains(d)).map(|(_, dr)| dr.stored[0]);
            return Err(lowering_error(
                self.g,
                stuck.unwrap_or(self.order[0]),
                "kernels depend on each other in a cycle",
            ));
        }
        Ok(order)
    }

    fn sorted_members(&self, gid: usize) -> Vec<NodeId> {
        let mut members = self.group(gid).members.clone();
        members.sort_by_key(|&m| self.pos(m));
        members
    }

    /// Members whose values are needed outside the kernel.
    fn stored_members(&self, gid: usize) -> Vec<NodeId> {
        match &self.group(gid).kind {
            GroupKind::MatMul(mm) => vec![mm.result],
            GroupKind::Concat { node } => vec![*node],
            GroupKind::MultiReduce(_) => self.stored_multi_reduce_values(gid),
            GroupKind::Attention | GroupKind::AttentionBackward => self.attention_results(gid),
            GroupKind::IndexAdd { node } => vec![*node],
            GroupKind::Pointwise { .. } | GroupKind::Row(_) | GroupKind::Column(_) => self
                .sorted_members(gid)
                .into_iter()
                .filter(|&m| self.g.is_output(m) || self.users(m).iter().any(|&u| !self.in_group(u, gid)))
                .collect(),
        }
    }

    fn draft(&self, gid: usize) -> Result<Draft> {
        let group = self.group(gid);
        let stored = self.stored_members(gid);
        let members = self.sorted_members(gid);
        let mut bb = BodyBuilder::default();
        let kind = match &group.kind {
            GroupKind::Pointwise { domain } => {
                self.lower_members(&mut bb, gid, &Domain::Flat(domain), &members)?;
                self.add_stores(&mut bb, &stored);
                KernelKind::Pointwise(Pointwise { shape: domain.clone(), body: bb.body.clone() })
            }
            GroupKind::Row(geo) => {
                self.lower_members(&mut bb, gid, &Domain::Rows(geo), &members)?;
                self.add_stores(&mut bb, &stored);
                KernelKind::Row(RowKernel::new(geo.outer(), geo.inner(), bb.body.clone()))
            }
            GroupKind::Column(geo) => {
                self.lower_members(&mut bb, gid, &Domain::Columns(geo), &members)?;
                self.add_stores(&mut bb, &stored);
                KernelKind::Column(ColumnKernel { reduced: geo.inner(), kept: geo.outer(), body: bb.body.clone() })
            }
            GroupKind::MultiReduce(mr) => KernelKind::MultiReduce(self.lower_multi_reduce(gid, mr, &stored, &mut bb)?),
            GroupKind::MatMul(mm) => {
                let node = self.node(mm.node);
                let dims = node.shape.dims();
                let rank = dims.len();
                let (m, n) = (dims[rank - 2], dims[rank - 1]);
                let k = self.shape(node.operands[0]).dims().last().copied().unwrap_or(1);
                let layout = |x: NodeId| {
                    self.matmul_operand(mm.node, x).ok_or_else(|| lowering_error(self.g, x, "matmul operand layout"))
                };
                let (a, a_transposed, a_batch_stride) = layout(node.operands[0])?;
                let (b, b_transposed, b_batch_stride) = layout(node.operands[1])?;
                for x in [node.operands[0], node.operands[1]] {
                    self.note_folded(&mut bb, x);
                }
                bb.inputs = vec![a, b];
                if let Some(bias) = mm.bias {
                    let base = self.buffer_base(bias, &mut bb)?;
                    bb.inputs.push(base);
                }
                KernelKind::MatMul(MatMul {
                    batch: dims[..rank - 2].to_vec(),
                    m,
                    n,
                    k,
                    dtype: node.dtype,
                    a_batch_stride,
                    b_batch_stride,
                    a_transposed,
                    b_transposed,
                    bias: mm.bias.is_some(),
                    activation: mm.activation,
                })
            }
            GroupKind::Attention | GroupKind::AttentionBackward => self.lower_attention(gid, &mut bb)?,
            GroupKind::IndexAdd { node } => {
                let n = self.node(*node);
                let Op::IndexAdd { axis, size } = n.op else {
                    return Err(lowering_error(self.g, *node, "not an index_add"));
                };
                let (src, indices) = (n.operands[0], n.operands[1]);
                bb.inputs = vec![self.buffer_base(src, &mut bb)?, self.buffer_base(indices, &mut bb)?];
                let dims = self.shape(src).dims();
                let index_rank = self.shape(indices).rank();
                KernelKind::IndexAdd(braze_plan::IndexAdd {
                    outer: dims[..axis].iter().product(),
                    indices: self.shape(indices).numel(),
                    inner: dims[axis + index_rank..].iter().product(),
                    size,
                    dtype: n.dtype,
                    index_dtype: self.node(indices).dtype,
                })
            }
            GroupKind::Concat { node } => {
                let n = self.node(*node);
                let Op::Concat { axis } = n.op else { return Err(lowering_error(self.g, *node, "not a concat")) };
                let mut inputs = Vec::new();
                for &x in &n.operands {
                    inputs.push(self.buffer_base(x, &mut bb)?);
                }
                bb.inputs = inputs;
                KernelKind::Concat(Concat {
                    shape: n.shape.clone(),
                    axis,
                    extents: n.operands.iter().map(|&x| self.shape(x).dims()[axis]).collect(),
                    dtype: n.dtype,
                })
            }
        };
        let sources = self.sources(&members, &bb);
        let stem = self.stem(&group.kind, &members, &stored);
        Ok(Draft { kind, inputs: bb.inputs, stored, sources, stem, first_pos: group.min_pos })
    }

    /// The buffer behind `x`, which an earlier decision made readable as a whole.
    pub(super) fn buffer_base(&self, x: NodeId, bb: &mut BodyBuilder) -> Result<NodeId> {
        self.note_folded(bb, x);
        match self.buffer_access(x) {
            Access::Strided { base, .. } => Ok(base),
            Access::Const { .. } => Err(lowering_error(self.g, x, "a constant where a buffer is needed")),
        }
    }

    fn add_stores(&self, bb: &mut BodyBuilder, stored: &[NodeId]) {
        for (output, s) in stored.iter().enumerate() {
            let value = bb.values[s];
            bb.body.stores.push(Store { value, output });
        }
    }

    pub(super) fn lower_members(
        &self,
        bb: &mut BodyBuilder,
        gid: usize,
        domain: &Domain,
        members: &[NodeId],
    ) -> Result<()> {
        for &m in members {
            let v = self.lower_member(bb, gid, domain, m)?;
            bb.values.insert(m, v);
        }
        Ok(())
    }

    fn lower_member(&self, bb: &mut BodyBuilder, gid: usize, domain: &Domain, m: NodeId) -> Result<ValueId> {
        let node = self.node(m);
        let space = self.space_of(m);
        let operand = |bb: &mut BodyBuilder, i: usize, frame: &Shape, space: Space| {
            self.operand_value(bb, gid, domain, node.operands[i], frame, space)
                .ok_or_else(|| lowering_error(self.g, m, "operand cannot be read in this kernel"))
        };
        let dtype = node.dtype;
        Ok(match &node.op {
            Op::Constant { value } => bb.constant(*value, dtype),
            // The group's domain is the arange's own shape (it stays in a pointwise kernel of it).
            Op::Arange => bb.body.push(Expr::Index, dtype),
            op if is_view(op) => {
                // A materialized view: its kernel reads the folded view.
                let access = self.view_access[&m].clone();
                self.read(bb, domain, access, &node.shape, &node.shape, space, dtype)
                    .ok_or_else(|| lowering_error(self.g, m, "view cannot be read in this kernel"))?
            }
            Op::Cast => {
                let x = operand(bb, 0, &node.shape, space)?;
                bb.body.push(Expr::Cast { x }, dtype)
            }
            Op::Unary { op } => {
                let x = operand(bb, 0, &node.shape, space)?;
                bb.body.push(Expr::Unary { op: *op, x }, dtype)
            }
            Op::Binary { op } => {
                let a = operand(bb, 0, &node.shape, space)?;
                let b = operand(bb, 1, &node.shape, space)?;
                bb.body.push(Expr::Binary { op: *op, a, b }, dtype)
            }
            Op::Where => {
                let cond = operand(bb, 0, &node.shape, space)?;
                let a = operand(bb, 1, &node.shape, space)?;
                let b = operand(bb, 2, &node.shape, space)?;
                bb.body.push(Expr::Where { cond, a, b }, dtype)
            }
            Op::IndexSelect { axis } => self.lower_gather(bb, gid, domain, m, *axis)?,
            Op::Reduce { op, .. } => {
                let input = self.shape(node.operands[0]).clone();
                let x = operand(bb, 0, &input, Space::Element)?;
                // Float reductions accumulate in f32, and an f16/bf16 result stays unrounded like
                // the values it reduces: rounded, a max would no longer equal the element it is
                // (`x == max(x)` of a max's backward found no element).
                bb.body.push(Expr::Reduce { op: *op, x }, dtype)
            }
            _ => return Err(lowering_error(self.g, m, "not an elementwise op or reduction")),
        })
    }

    /// Index_select `m` as a gather: its indices loaded at the output's index dims, its table
    /// read around the indexed axis; both come from buffers outside the kernel.
    fn lower_gather(
        &self,
        bb: &mut BodyBuilder,
        gid: usize,
        domain: &Domain,
        m: NodeId,
        axis: usize,
    ) -> Result<ValueId> {
        let node = self.node(m);
        let (x, indices) = (node.operands[0], node.operands[1]);
        if self.in_group(x, gid) || self.in_group(indices, gid) {
            return Err(lowering_error(self.g, m, "a gather reads its table and indices from buffers"));
        }
        let frame = &node.shape;
        let space = self.space_of(m);
        let x_rank = self.shape(x).rank();
        let index_rank = self.shape(indices).rank();
        let unreadable = || lowering_error(self.g, m, "gather cannot be read in this kernel");
        self.note_folded(bb, indices);
        let index = match self.read_access(indices) {
            Access::Const { value } => bb.constant(value, self.node(indices).dtype),
            Access::Strided { base, offset, strides } => {
                let mut in_frame = vec![0; axis];
                in_frame.extend(&strides);
                in_frame.resize(axis + index_rank + x_rank - axis - 1, 0);
                let mapped = domain.map(frame, space, &in_frame).ok_or_else(unreadable)?;
                bb.load(base, offset, mapped, self.node(indices).dtype)
            }
        };
        self.note_folded(bb, x);
        let Access::Strided { base, offset, strides } = self.buffer_access(x) else {
            return Err(lowering_error(self.g, m, "a gather's table is a constant without a buffer"));
        };
        let mut in_frame = strides[..axis].to_vec();
        in_frame.extend(std::iter::repeat_n(0, index_rank));
        in_frame.extend(&strides[axis + 1..]);
        let mapped = domain.map(frame, space, &in_frame).ok_or_else(unreadable)?;
        let input = bb.slot(base);
        let gather = Expr::Gather {
            input,
            offset,
            strides: mapped,
            index,
            index_stride: strides[axis],
            bound: self.shape(x).dims()[axis],
            check: self.check_of(m),
        };
        Ok(bb.body.push(gather, node.dtype))
    }

    /// The value of operand `o` inside kernel `gid`: computed there, or read from outside.
    fn operand_value(
        &self,
        bb: &mut BodyBuilder,
        gid: usize,
        domain: &Domain,
        o: NodeId,
        frame: &Shape,
        space: Space,
    ) -> Option<ValueId> {
        if let Some(&v) = bb.values.get(&o) {
            return Some(v);
        }
        if self.in_group(o, gid) && !matches!(self.node(o).op, Op::Constant { .. }) {
            return None;
        }
        self.note_folded(bb, o);
        self.read(bb, domain, self.read_access(o), self.shape(o), frame, space, self.node(o).dtype)
    }

    /// Loads `access` (over `shape`) broadcast to `frame`, or its constant.
    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        bb: &mut BodyBuilder,
        domain: &Domain,
        access: Access,
        shape: &Shape,
        frame: &Shape,
        space: Space,
        dtype: DType,
    ) -> Option<ValueId> {
        match access {
            Access::Const { value } => Some(bb.constant(value, dtype)),
            Access::Strided { base, offset, strides } => {
                let in_frame = access::broadcast_strides(&strides, shape.dims(), frame.dims());
                let strides = domain.map(frame, space, &in_frame)?;
                Some(bb.load(base, offset, strides, dtype))
            }
        }
    }

    /// Records the views between `x` and the buffer it is read from.
    pub(super) fn note_folded(&self, bb: &mut BodyBuilder, mut x: NodeId) {
        while is_view(&self.node(x).op) && !self.materialized.contains(&x) {
            bb.folded.insert((self.pos(x), x));
            x = self.node(x).operands[0];
        }
    }

    /// How matmul `mm` reads operand `x`: the buffer, whether it holds the transpose, and the
    /// batch stride; `None` when one batch stride and a plain or transposed matrix cannot say it.
    pub(super) fn matmul_operand(&self, mm: NodeId, x: NodeId) -> Option<(NodeId, bool, usize)> {
        let Access::Strided { base, offset, strides } = self.buffer_access(x) else { return None };
        if offset != 0 {
            return None;
        }
        let out = self.shape(mm).dims();
        let own = self.shape(x).dims();
        let (rows, cols) = (own[own.len() - 2], own[own.len() - 1]);
        let mut full = out[..out.len() - 2].to_vec();
        full.extend([rows, cols]);
        let s = access::broadcast_strides(&strides, own, &full);
        let nb = full.len() - 2;
        let fits = |stride: usize, dim: usize, expected: usize| dim == 1 || stride == expected;
        let transposed = if fits(s[nb], rows, cols) && fits(s[nb + 1], cols, 1) {
            false
        } else if fits(s[nb], rows, 1) && fits(s[nb + 1], cols, rows) {
            true
        } else {
            return None;
        };
        // Batch dims flatten into one index: each stride must be one batch stride times the
        // number of batches after it.
        if full[..nb].contains(&0) {
            return Some((base, transposed, 0));
        }
        let mut batch_stride: Option<usize> = None;
        let mut after = 1;
        for d in (0..nb).rev() {
            if full[d] != 1 {
                let per_batch = s[d] / after;
                match batch_stride {
                    None if per_batch * after == s[d] => batch_stride = Some(per_batch),
                    Some(b) if s[d] == b * after => {}
                    _ => return None,
                }
            }
            after *= full[d];
        }
        Some((base, transposed, batch_stride.unwrap_or(0)))
    }

    fn label(&self, m: NodeId) -> String {
        let op = self.node(m).op.name();
        match self.origins.get(&m) {
            Some(origin) => format!("{origin}/{op}"),
            None => op.to_string(),
        }
    }

    fn sources(&self, members: &[NodeId], bb: &BodyBuilder) -> Vec<SourceOp> {
        let mut all: Vec<(usize, NodeId)> = members.iter().map(|&m| (self.pos(m), m)).collect();
        all.extend(bb.folded.iter().copied());
        all.sort();
        all.dedup();
        all.into_iter()
            .filter(|(_, m)| !matches!(self.node(*m).op, Op::Constant { .. }) || members.len() == 1)
            .map(|(_, m)| SourceOp { op: self.label(m), loc: self.node(m).loc.clone() })
            .collect()
    }

    /// `family_parts_dtype`, the parts being the composites or ops fused in, in order of first
    /// appearance; casts, constants and views only when there is nothing else.
    fn stem(&self, kind: &GroupKind, members: &[NodeId], stored: &[NodeId]) -> String {
        let dtype = stored.first().map(|&s| self.node(s).dtype).unwrap_or(DType::F32);
        let part = |m: NodeId| -> String {
            match self.origins.get(&m) {
                Some(origin) => origin.to_string(),
                None => self.node(m).op.name().to_string(),
            }
        };
        let minor = |m: NodeId| {
            let op = &self.node(m).op;
            !self.origins.contains_key(&m) && (matches!(op, Op::Cast | Op::Constant { .. }) || is_view(op))
        };
        let mut parts: Vec<String> = Vec::new();
        let (family, nodes): (&str, Vec<NodeId>) = match kind {
            GroupKind::Pointwise { .. } => ("pointwise", members.to_vec()),
            GroupKind::Row(_) => ("row", members.to_vec()),
            GroupKind::Column(_) => ("column", members.to_vec()),
            GroupKind::MultiReduce(mr) => {
                let (_, firsts) = mr.programs();
                let prologues = firsts.iter().flat_map(|&f| mr.items[f].prologue.iter().copied());
                let ops = firsts.iter().map(|&f| mr.items[f].op.name().to_string());
                for p in prologues.filter(|&m| !minor(m)).map(part).chain(ops) {
                    if !parts.contains(&p) {
                        parts.push(p);
                    }
                }
                ("multi_reduce", Vec::new())
            }
            GroupKind::MatMul(mm) => {
                if mm.bias.is_some() {
                    parts.push("bias".into());
                }
                if let Some(op) = mm.activation {
                    parts.push(op.name().into());
                }
                ("matmul", Vec::new())
            }
            GroupKind::Concat { node } => {
                (if self.origins.get(node) == Some(&"stack") { "stack" } else { "concat" }, Vec::new())
            }
            GroupKind::Attention => {
                let causal = members.iter().any(|&m| {
                    matches!(
                        self.node(m).op,
                        Op::Attention { causal: true, .. } | Op::AttentionLse { causal: true, .. }
                    )
                });
                if causal {
                    parts.push("causal".into());
                }
                ("attention", Vec::new())
            }
            GroupKind::IndexAdd { .. } => ("index_add", Vec::new()),
            GroupKind::AttentionBackward => {
                for &m in stored {
                    if let Op::AttentionGrad { wrt, .. } = self.node(m).op {
                        parts.push(format!("d{}", &wrt.name()[..1]));
                    }
                }
                ("attention_backward", Vec::new())
            }
        };
        let major: Vec<NodeId> = nodes.iter().copied().filter(|&m| !minor(m)).collect();
        let chosen = if major.is_empty() { nodes } else { major };
        for m in chosen {
            let p = part(m);
            if !parts.contains(&p) {
                parts.push(p);
            }
        }
        parts.truncate(MAX_NAME_PARTS);
        let mut stem = family.to_string();
        for p in parts {
            stem.push('_');
            stem.push_str(&p);
        }
        stem.push('_');
        stem.push_str(dtype.name());
        stem
    }
}
