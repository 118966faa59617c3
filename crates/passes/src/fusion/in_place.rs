//! Write-backs in place: a graph output that the caller will store into one of the graph's
//! inputs (a captured weight updated by an optimizer step) is written straight into that input's
//! memory when the plan's rules allow it ([`braze_plan::Rule::InPlace`]), else computed into a
//! temporary and copied in by a last kernel, else left an ordinary output.

use braze_ir::Shape;
use braze_plan::{
    Body, Buffer, BufferId, BufferRole, Expr, Kernel, KernelKind, Plan, Pointwise, SourceOp, Store, WRITE_BACK_COPY,
};

/// Makes plan output `output` live in the memory of plan input `input` for each requested
/// `(output, input)` pair it can. Each candidate is checked by the in-place rule alone: the plan
/// was valid before, and a candidate changes only the placed buffer (and adds a copy kernel).
pub(super) fn place(plan: &mut Plan, requests: &[(usize, usize)]) {
    for &(output, input) in requests {
        if output >= plan.outputs.len() || input >= plan.inputs.len() {
            continue;
        }
        if !direct(plan, output, input) {
            copied(plan, output, input);
        }
    }
}

/// Writes output `output` in place by the kernel computing it, if the rule allows; whether it did.
fn direct(plan: &mut Plan, output: usize, input: usize) -> bool {
    let b = plan.outputs[output].buffer;
    let shared = plan.outputs.iter().enumerate().any(|(j, o)| j != output && o.buffer == b);
    if shared || plan.buffer(b).role != BufferRole::Output {
        return false;
    }
    plan.buffers[b.0].role = BufferRole::InPlace(input);
    if plan.validate_in_place_of(b).is_ok() {
        return true;
    }
    plan.buffers[b.0].role = BufferRole::Output;
    false
}

/// Copies output `output` into the input's memory by a kernel after all others, if the rule
/// allows; otherwise the plan is left as it was.
fn copied(plan: &mut Plan, output: usize, input: usize) {
    let source = plan.outputs[output].buffer;
    let Buffer { dtype, numel, role } = plan.buffer(source).clone();
    plan.buffers.push(Buffer { dtype, numel, role: BufferRole::InPlace(input) });
    let target = BufferId(plan.buffers.len() - 1);
    let mut body = Body::default();
    let value = body.push(Expr::Load { input: 0, offset: 0, strides: vec![1] }, dtype);
    body.stores.push(Store { value, output: 0 });
    plan.kernels.push(Kernel {
        name: format!("{WRITE_BACK_COPY}_{dtype}_{}", plan.kernels.len()),
        kind: KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![numel]), body }),
        inputs: vec![source],
        outputs: vec![target],
        sources: vec![SourceOp { op: WRITE_BACK_COPY.into(), loc: None }],
    });
    if plan.validate_in_place_of(target).is_err() {
        plan.kernels.pop();
        plan.buffers.pop();
        return;
    }
    plan.outputs[output].buffer = target;
    let still_returned = plan.outputs.iter().any(|o| o.buffer == source);
    if role == BufferRole::Output && !still_returned {
        plan.buffers[source.0].role = BufferRole::Intermediate;
    }
}
