//! Attention ops into attention kernels: an `attention` and the `attention_lse` of the same
//! q, k, mask and scale share one forward kernel (the lse is the forward's own row statistic),
//! and the `attention_grad`s of one backward share a kernel per side: dq alone (over query
//! tiles), dk with dv (over key tiles).

use super::access::{self, Access};
use super::lower::BodyBuilder;
use super::{lowering_error, Fuser, GroupKind, Space};
use crate::Result;
use braze_ir::{AttentionInput, NodeId, Op};
use braze_plan::{Attention, AttentionBackward, AttentionResult, AttentionShape, KernelKind, OperandLayout};
use std::collections::HashSet;

/// Elements every folded (not dense) operand layout's offset and strides are multiples of: 16
/// bytes of bf16, so that the tensor-core kernels' 16-byte copies stay aligned.
const LAYOUT_ALIGNMENT: usize = 8;

/// The permute that turns `[B, H, T, D]` attention results into the `[B, T, H, D]` order of the
/// projection after them.
const HEADS_LAST: [usize; 4] = [0, 2, 1, 3];

/// Which of the two backward kernels an `attention_grad` belongs to.
fn backward_side(wrt: AttentionInput) -> bool {
    wrt == AttentionInput::Query
}

impl Fuser<'_> {
    /// Stores an attention output or gradient as `[B, T, H, D]` where it is read through
    /// `permute(0, 2, 1, 3)` (the heads merged back into one projection's input): the permute
    /// then reads its buffer as it lies and needs no copy. Only where every other reader reads
    /// through strided loads (elementwise ops, reductions) and the value is no graph output.
    pub(super) fn store_attention_results_permuted(&mut self) {
        for &n in &self.order {
            let node = self.node(n);
            if !matches!(node.op, Op::Attention { .. } | Op::AttentionGrad { .. }) || self.g.is_output(n) {
                continue;
            }
            let heads_last = |u: NodeId| matches!(&self.node(u).op, Op::Permute { perm } if perm[..] == HEADS_LAST);
            let strided_reader = |u: NodeId| {
                matches!(
                    self.node(u).op,
                    Op::Cast | Op::Unary { .. } | Op::Binary { .. } | Op::Where | Op::Reduce { .. }
                )
            };
            let users = self.users(n);
            if !users.iter().any(|&u| heads_last(u)) || !users.iter().all(|&u| heads_last(u) || strided_reader(u)) {
                continue;
            }
            let d = node.shape.dims();
            let l = OperandLayout::heads_merged(d[1], d[2], d[3]);
            let mut strides = vec![l.batch_stride, l.head_stride, l.row_stride, 1];
            access::zero_unit_dims(d, &mut strides);
            self.stored_strides.insert(n, strides);
        }
    }

    /// How an attention kernel reads `[B, H, T, D]` operand `x` (q, k, v or dout) where it lies,
    /// or `None` when it needs a buffer of its own: rows must be contiguous, and a layout other
    /// than the dense one aligned (see [`LAYOUT_ALIGNMENT`]).
    pub(super) fn attention_operand_layout(&self, x: NodeId) -> Option<OperandLayout> {
        let Access::Strided { offset, strides, .. } = self.buffer_access(x) else { return None };
        let d = self.shape(x).dims();
        if d.len() != 4 || (d[3] > 1 && strides[3] != 1) {
            return None;
        }
        let layout =
            OperandLayout { offset, batch_stride: strides[0], head_stride: strides[1], row_stride: strides[2] };
        let dense = OperandLayout::dense_of(d[1], d[2], d[3]);
        // Strides of size-1 dims are 0 in an access; the dense layout's are not, and neither
        // is ever multiplied by a nonzero index there.
        let same_as_dense = |a: usize, b: usize, n: usize| a == b || n == 1;
        if offset == 0
            && same_as_dense(layout.batch_stride, dense.batch_stride, d[0])
            && same_as_dense(layout.head_stride, dense.head_stride, d[1])
            && same_as_dense(layout.row_stride, dense.row_stride, d[2])
        {
            return Some(dense);
        }
        layout.is_aligned_to(LAYOUT_ALIGNMENT).then_some(layout)
    }

    /// The layout attention result `r` is stored with (see [`Self::store_attention_results_permuted`]).
    fn attention_result_layout(&self, r: NodeId, s: &AttentionShape) -> OperandLayout {
        if self.stored_strides.contains_key(&r) {
            OperandLayout::heads_merged(s.heads, s.seq, s.head_dim)
        } else {
            OperandLayout::dense(s)
        }
    }

    /// The mask, scale and operands two attention ops must share to be one kernel's results:
    /// q and k for the forward (v too where both have it), all six for a backward side.
    fn attention_key(&self, n: NodeId) -> Option<(bool, u64, Vec<NodeId>, Option<bool>)> {
        let node = self.node(n);
        match node.op {
            Op::Attention { causal, scale } | Op::AttentionLse { causal, scale } => {
                Some((causal, scale.to_bits(), node.operands[..2].to_vec(), None))
            }
            Op::AttentionGrad { causal, scale, wrt } => {
                Some((causal, scale.to_bits(), node.operands.clone(), Some(backward_side(wrt))))
            }
            _ => None,
        }
    }

    /// Whether `a` is computed from `b` (through any path of operands).
    fn depends_on(&self, a: NodeId, b: NodeId) -> bool {
        let mut seen = HashSet::new();
        let mut stack = vec![a];
        while let Some(x) = stack.pop() {
            if x == b {
                return true;
            }
            if self.pos(x) > self.pos(b) && seen.insert(x) {
                stack.extend(self.node(x).operands.iter().copied());
            }
        }
        false
    }

    /// Places an attention, attention_lse or attention_grad node: into the kernel of a node it
    /// shares its key with (and no result of which it depends on, or the reverse), else a new one.
    pub(super) fn place_attention(&mut self, n: NodeId) {
        let key = self.attention_key(n);
        let forward = key.as_ref().is_some_and(|k| k.3.is_none());
        let home = (0..self.groups.len()).find(|&gid| {
            let Some(group) = &self.groups[gid] else { return false };
            let kind_fits = match group.kind {
                GroupKind::Attention => forward,
                GroupKind::AttentionBackward => !forward,
                _ => false,
            };
            kind_fits
                && self.options.fuse
                && group.members.iter().all(|&m| {
                    // One result of each kind: two attentions of one q and k (another v) stay apart.
                    self.attention_key(m) == key
                        && self.node(m).op != self.node(n).op
                        && !self.depends_on(n, m)
                        && !self.depends_on(m, n)
                })
        });
        match home {
            Some(gid) => self.add_member(gid, n, Space::Element),
            None => {
                let kind = if forward { GroupKind::Attention } else { GroupKind::AttentionBackward };
                self.new_group(kind, n, Space::Element);
            }
        }
    }

    /// The members of an attention group in output slot order: the output before the lse, the
    /// gradients in q, k, v order.
    pub(super) fn attention_results(&self, gid: usize) -> Vec<NodeId> {
        let mut members = self.group(gid).members.clone();
        members.sort_by_key(|&m| match self.node(m).op {
            Op::Attention { .. } => 0,
            Op::AttentionLse { .. } => 1,
            Op::AttentionGrad { wrt, .. } => 2 + wrt.operand(),
            _ => 9,
        });
        members
    }

    /// The kernel of an attention group; its inputs are the buffers of the first result's
    /// operands (an lse-only kernel reads k in v's slot, which it never reads).
    pub(super) fn lower_attention(&self, gid: usize, bb: &mut BodyBuilder) -> Result<KernelKind> {
        let results = self.attention_results(gid);
        let first = self.node(results[0]);
        let q = self.shape(first.operands[0]).dims();
        let (causal, scale) = match first.op {
            Op::Attention { causal, scale }
            | Op::AttentionLse { causal, scale }
            | Op::AttentionGrad { causal, scale, .. } => (causal, scale),
            _ => return Err(lowering_error(self.g, results[0], "not an attention op")),
        };
        let dtype = self.node(first.operands[0]).dtype;
        let shape = AttentionShape { batch: q[0] * q[1], heads: q[1], seq: q[2], head_dim: q[3], dtype, causal, scale };
        let mut operands = first.operands.clone();
        if operands.len() == 2 {
            operands.push(operands[1]);
        }
        bb.inputs = operands.iter().map(|&x| self.buffer_base(x, bb)).collect::<Result<Vec<_>>>()?;
        let layout_of = |x: NodeId| {
            self.attention_operand_layout(x).ok_or_else(|| {
                lowering_error(self.g, x, "an attention operand no layout places (it was not materialized)")
            })
        };
        Ok(match self.group(gid).kind {
            GroupKind::Attention => {
                let out = results.iter().find(|&&r| matches!(self.node(r).op, Op::Attention { .. }));
                KernelKind::Attention(Attention {
                    shape,
                    results: results
                        .iter()
                        .map(|&r| {
                            if matches!(self.node(r).op, Op::Attention { .. }) {
                                AttentionResult::Out
                            } else {
                                AttentionResult::Lse
                            }
                        })
                        .collect(),
                    input_layouts: [layout_of(operands[0])?, layout_of(operands[1])?, layout_of(operands[2])?],
                    out_layout: out.map_or(OperandLayout::dense(&shape), |&r| self.attention_result_layout(r, &shape)),
                })
            }
            _ => KernelKind::AttentionBackward(AttentionBackward {
                shape,
                grads: results
                    .iter()
                    .filter_map(|&r| match self.node(r).op {
                        Op::AttentionGrad { wrt, .. } => Some(wrt),
                        _ => None,
                    })
                    .collect(),
                input_layouts: [
                    layout_of(operands[0])?,
                    layout_of(operands[1])?,
                    layout_of(operands[2])?,
                    layout_of(operands[5])?,
                ],
                grad_layouts: results.iter().map(|&r| self.attention_result_layout(r, &shape)).collect(),
            }),
        })
    }
}
