//! Where an attention block's rows lie: every attention kernel (CUDA-core and tensor-core,
//! forward and backward) addresses row `t` of its (batch, head) pair of an operand as
//! `{param}[{param}_at + t * {param}_row + d]`, with the two declared here from the operand's
//! [`OperandLayout`]: q, k and v read straight out of a fused projection, results written in the
//! order the next projection reads, the same code as for dense `[B, H, T, D]` operands.

use crate::writer::CodeWriter;
use braze_plan::{Attention, AttentionBackward, AttentionResult, AttentionShape, OperandLayout};

/// The forward's row-addressed parameters: q, k, v (`in0..in2`) and the output, if any.
pub(crate) fn forward_operands(att: &Attention) -> Vec<(String, OperandLayout)> {
    let mut operands: Vec<_> = (0..3).map(|slot| format!("in{slot}")).zip(att.input_layouts).collect();
    if let Some(slot) = att.results.iter().position(|r| *r == AttentionResult::Out) {
        operands.push((format!("out{slot}"), att.out_layout));
    }
    operands
}

/// The backward's: q, k, v, dout (`in0..in2`, `in5`) and each gradient.
pub(crate) fn backward_operands(back: &AttentionBackward) -> Vec<(String, OperandLayout)> {
    let inputs = [0, 1, 2, 5].map(|slot| format!("in{slot}"));
    let mut operands: Vec<_> = inputs.into_iter().zip(back.input_layouts).collect();
    operands.extend((0..back.grads.len()).map(|slot| format!("out{slot}")).zip(back.grad_layouts.iter().copied()));
    operands
}

/// Declares `{param}_at` (the first element of pair `bh`'s rows) and `{param}_row` (elements
/// from one row to the next) for each `(param, layout)`; `bh` must be declared before.
pub(crate) fn declare_rows(w: &mut CodeWriter, s: &AttentionShape, operands: &[(String, OperandLayout)]) {
    let heads = s.heads.max(1);
    // Where batch and head strides merge (dense layouts among them), the pair index is one
    // index: `bh * head_stride`, with no division, the code (and registers) of contiguous
    // operands. Otherwise the pair splits into its batch and head.
    let merged = |l: &OperandLayout| heads == 1 || l.batch_stride == heads * l.head_stride;
    if operands.iter().any(|(_, l)| !merged(l)) {
        w.line(format!("const idx_t pair_batch = bh / {heads}, pair_head = bh - pair_batch * {heads};"));
    }
    for (param, l) in operands {
        let mut terms = Vec::new();
        if l.offset != 0 {
            terms.push(format!("(idx_t){}", l.offset));
        }
        if merged(l) {
            let stride = if heads == 1 { l.batch_stride } else { l.head_stride };
            terms.push(format!("bh * (idx_t){stride}"));
        } else {
            terms.push(format!("pair_batch * (idx_t){}", l.batch_stride));
            terms.push(format!("pair_head * (idx_t){}", l.head_stride));
        }
        w.line(format!("const idx_t {param}_at = {}, {param}_row = {};", terms.join(" + "), l.row_stride));
    }
}
