//! Concats of attention gradients written in place: the backward of a fused q/k/v projection
//! concatenates dq, dk and dv along their last axis before its weight and input gradients read
//! them. Where every input of such a concat is an attention gradient that nothing else reads,
//! the attention backward kernels write each gradient straight into its columns of the concat's
//! rows (their layouts offset into them and step by the concat's row), and the concat kernel and
//! the gradients' own buffers go away: each gradient is written once and read once, not twice.
//! The plan's rules allow several kernels to write one buffer so ([`braze_plan::Rule::SingleWriter`]).

use braze_plan::{BufferId, BufferRole, KernelKind, OperandLayout, Plan, RowPart};

/// Rewrites every concat of `plan` that qualifies (see the module docs). The rules check the
/// plan with all of them rewritten once; should it fail them, each rewrite is checked alone and
/// one the rules reject is left undone.
pub(super) fn place(plan: &mut Plan) {
    let all = rewrite_all(plan.clone(), |_| true);
    if all.validate().is_ok() {
        *plan = all;
    } else {
        *plan = rewrite_all(plan.clone(), |candidate| candidate.validate().is_ok());
    }
}

/// `plan` with each qualifying concat rewritten where `keep` accepts the plan so rewritten.
fn rewrite_all(mut plan: Plan, keep: impl Fn(&Plan) -> bool) -> Plan {
    let mut k = 0;
    while k < plan.kernels.len() {
        match rewritten(&plan, k).filter(|candidate| keep(candidate)) {
            Some(new) => plan = new,
            None => k += 1,
        }
    }
    plan
}

/// `plan` with concat kernel `k` written in place by its inputs' writers, or `None` where it
/// does not qualify.
fn rewritten(plan: &Plan, k: usize) -> Option<Plan> {
    let KernelKind::Concat(concat) = &plan.kernels[k].kind else { return None };
    let dims = concat.shape.dims();
    if concat.axis + 1 != dims.len() || plan.kernels[k].inputs.is_empty() {
        return None;
    }
    let row_stride = dims[concat.axis];
    let rows: usize = dims[..concat.axis].iter().product();
    let target = *plan.kernels[k].outputs.first()?;
    let mut new = plan.clone();
    let mut first = 0;
    let mut dropped = Vec::new();
    let mut last_writer = 0;
    for (&source, &extent) in plan.kernels[k].inputs.iter().zip(&concat.extents) {
        let (writer, slot) = sole_attention_writer(plan, source, k)?;
        let KernelKind::AttentionBackward(back) = &mut new.kernels[writer].kind else { return None };
        let s = &back.shape;
        // The gradient lies as the concat reads it: rows of its extent, nothing between them.
        let dense_rows = RowPart { rows, row_stride: extent, first: 0, width: extent };
        if back.grad_layouts[slot].row_part(s) != Some(dense_rows) {
            return None;
        }
        back.grad_layouts[slot] =
            OperandLayout { offset: first, batch_stride: s.seq * row_stride, head_stride: s.head_dim, row_stride };
        new.kernels[writer].outputs[slot] = target;
        dropped.push(source);
        last_writer = last_writer.max(writer);
        first += extent;
    }
    // The concat's ops are now done by the gradients' writers: the last of them names them.
    let concat = new.kernels.remove(k);
    new.kernels[last_writer].sources.extend(concat.sources);
    drop_buffers(&mut new, &dropped);
    Some(new)
}

/// The attention backward kernel and output slot that alone write `buffer`, an intermediate
/// that kernel `reader` alone reads (once), if it is one.
fn sole_attention_writer(plan: &Plan, buffer: BufferId, reader: usize) -> Option<(usize, usize)> {
    if plan.buffer(buffer).role != BufferRole::Intermediate || plan.outputs.iter().any(|o| o.buffer == buffer) {
        return None;
    }
    let reads: usize = plan.kernels.iter().map(|kernel| kernel.inputs.iter().filter(|&&b| b == buffer).count()).sum();
    if reads != 1 || !plan.kernels[reader].inputs.contains(&buffer) {
        return None;
    }
    let mut writes = plan.kernels.iter().enumerate().flat_map(|(w, kernel)| {
        kernel.outputs.iter().enumerate().filter(move |(_, &b)| b == buffer).map(move |(slot, _)| (w, slot))
    });
    let (writer, slot) = writes.next()?;
    let is_attention = matches!(plan.kernels[writer].kind, KernelKind::AttentionBackward(_));
    (writes.next().is_none() && is_attention).then_some((writer, slot))
}

/// Removes buffers nothing uses any more, renumbering the others.
fn drop_buffers(plan: &mut Plan, dropped: &[BufferId]) {
    let mut renumbered = Vec::with_capacity(plan.buffers.len());
    let mut next = 0;
    for b in 0..plan.buffers.len() {
        renumbered.push(BufferId(next));
        if !dropped.contains(&BufferId(b)) {
            next += 1;
        }
    }
    let mut index = 0;
    plan.buffers.retain(|_| {
        index += 1;
        !dropped.contains(&BufferId(index - 1))
    });
    let map = |b: &mut BufferId| {
        debug_assert!(!dropped.contains(b), "{b} is dropped but still named");
        *b = renumbered[b.0];
    };
    plan.inputs.iter_mut().for_each(map);
    plan.outputs.iter_mut().for_each(|o| map(&mut o.buffer));
    for kernel in &mut plan.kernels {
        kernel.inputs.iter_mut().for_each(map);
        kernel.outputs.iter_mut().for_each(map);
    }
}
