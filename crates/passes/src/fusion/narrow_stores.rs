//! Widening casts stay in registers: an intermediate that a kernel stores as the f32 cast of an
//! f16/bf16 value holds exactly that narrow value, so the kernel stores the narrow value and its
//! readers widen it as they load it (a load may widen, [`braze_plan::Rule::Loads`]). Half the
//! bytes written and read for the same bits: a layer norm's backward stores its incoming bf16
//! gradient widened for the column kernel that sums it.

use braze_ir::DType;
use braze_plan::{BufferId, BufferRole, Expr, Kernel, KernelKind, Plan};

/// Narrows every such intermediate whose readers all load it through a body (pointwise, row and
/// column kernels); matmuls and concats read their buffers' dtype as it is.
pub(super) fn narrow_widened_stores(plan: &mut Plan) {
    for k in 0..plan.kernels.len() {
        let kernel = &plan.kernels[k];
        let Some(body) = body_of(kernel) else { continue };
        let mut narrowed = Vec::new();
        for (s, store) in body.stores.iter().enumerate() {
            let b = kernel.outputs[store.output];
            let buffer = plan.buffer(b);
            if buffer.role != BufferRole::Intermediate || buffer.dtype != DType::F32 {
                continue;
            }
            let Expr::Cast { x } = body.values[store.value.0].expr else { continue };
            let narrow = body.values[x.0].dtype;
            if narrow.is_narrow_float() && readers_widen(plan, b) {
                narrowed.push((s, x, b, narrow));
            }
        }
        for (s, x, b, narrow) in narrowed {
            plan.buffers[b.0].dtype = narrow;
            if let Some(body) = body_of_mut(&mut plan.kernels[k]) {
                body.stores[s].value = x;
            }
        }
    }
}

fn readers_widen(plan: &Plan, b: BufferId) -> bool {
    plan.kernels
        .iter()
        .filter(|kernel| kernel.inputs.contains(&b))
        .all(|kernel| matches!(kernel.kind, KernelKind::Pointwise(_) | KernelKind::Row(_) | KernelKind::Column(_)))
}

fn body_of(kernel: &Kernel) -> Option<&braze_plan::Body> {
    match &kernel.kind {
        KernelKind::Pointwise(pw) => Some(&pw.body),
        KernelKind::Row(row) => Some(&row.body),
        KernelKind::Column(col) => Some(&col.body),
        _ => None,
    }
}

fn body_of_mut(kernel: &mut Kernel) -> Option<&mut braze_plan::Body> {
    match &mut kernel.kind {
        KernelKind::Pointwise(pw) => Some(&mut pw.body),
        KernelKind::Row(row) => Some(&mut row.body),
        KernelKind::Column(col) => Some(&mut col.body),
        _ => None,
    }
}
