//! Attention ops into attention kernels: an `attention` and the `attention_lse` of the same
//! q, k, mask and scale share one forward kernel (the lse is the forward's own row statistic),
//! and the `attention_grad`s of one backward share a kernel per side: dq alone (over query
//! tiles), dk with dv (over key tiles).

use super::lower::BodyBuilder;
use super::{lowering_error, Fuser, GroupKind, Space};
use crate::Result;
use braze_ir::{AttentionInput, NodeId, Op};
use braze_plan::{Attention, AttentionBackward, AttentionResult, AttentionShape, KernelKind};
use std::collections::HashSet;

/// Which of the two backward kernels an `attention_grad` belongs to.
fn backward_side(wrt: AttentionInput) -> bool {
    wrt == AttentionInput::Query
}

impl Fuser<'_> {
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
        let shape = AttentionShape { batch: q[0] * q[1], seq: q[2], head_dim: q[3], dtype, causal, scale };
        let mut operands = first.operands.clone();
        if operands.len() == 2 {
            operands.push(operands[1]);
        }
        bb.inputs = operands.iter().map(|&x| self.buffer_base(x, bb)).collect::<Result<Vec<_>>>()?;
        Ok(match self.group(gid).kind {
            GroupKind::Attention => KernelKind::Attention(Attention {
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
            }),
            _ => KernelKind::AttentionBackward(AttentionBackward {
                shape,
                grads: results
                    .iter()
                    .filter_map(|&r| match self.node(r).op {
                        Op::AttentionGrad { wrt, .. } => Some(wrt),
                        _ => None,
                    })
                    .collect(),
            }),
        })
    }
}
