//! Write-backs in place: a graph output that the caller will store into one of the graph's
//! inputs (a captured weight updated by an optimizer step) is written straight into that input's
//! memory when the plan's rules allow it ([`braze_plan::Rule::InPlace`]), else computed into a
//! temporary and copied in by a last kernel, else left an ordinary output.

use braze_ir::Shape;
use braze_plan::{
    Body, Buffer, BufferId, BufferRole, Expr, Kernel, KernelKind, Plan, Pointwise, SourceOp, Store, WRITE_BACK_COPY,
};

/// Makes plan output `output` live in the memory of plan input `input` for each requested
/// `(output, input)` pair it can.
pub(super) fn place(plan: &mut Plan, requests: &[(usize, usize)]) {
    for &(output, input) in requests {
        if output >= plan.outputs.len() || input >= plan.inputs.len() {
            continue;
        }
        if let Some(placed) = [direct(plan, output, input), copied(plan, output, input)]
            .into_iter()
            .flatten()
            .find(|candidate| candidate.validate().is_ok())
        {
            *plan = placed;
        }
    }
}

/// The plan with output `output` written in place by the kernel computing it.
fn direct(plan: &Plan, output: usize, input: usize) -> Option<Plan> {
    let b = plan.outputs[output].buffer;
    let shared = plan.outputs.iter().enumerate().any(|(j, o)| j != output && o.buffer == b);
    if shared || plan.buffer(b).role != BufferRole::Output {
        return None;
    }
    let mut placed = plan.clone();
    placed.buffers[b.0].role = BufferRole::InPlace(input);
    Some(placed)
}

/// The plan with output `output` copied into the input's memory by a kernel after all others.
fn copied(plan: &Plan, output: usize, input: usize) -> Option<Plan> {
    let source = plan.outputs[output].buffer;
    let Buffer { dtype, numel, role } = plan.buffer(source).clone();
    let mut placed = plan.clone();
    placed.buffers.push(Buffer { dtype, numel, role: BufferRole::InPlace(input) });
    let target = BufferId(placed.buffers.len() - 1);
    placed.outputs[output].buffer = target;
    let still_returned = placed.outputs.iter().any(|o| o.buffer == source);
    if role == BufferRole::Output && !still_returned {
        placed.buffers[source.0].role = BufferRole::Intermediate;
    }
    let mut body = Body::default();
    let value = body.push(Expr::Load { input: 0, offset: 0, strides: vec![1] }, dtype);
    body.stores.push(Store { value, output: 0 });
    placed.kernels.push(Kernel {
        name: format!("{WRITE_BACK_COPY}_{dtype}_{}", placed.kernels.len()),
        kind: KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![numel]), body }),
        inputs: vec![source],
        outputs: vec![target],
        sources: vec![SourceOp { op: WRITE_BACK_COPY.into(), loc: None }],
    });
    Some(placed)
}
