//! What a plan of a joint forward and backward graph keeps from the forward for the backward:
//! the activations a training step holds in memory between the two.

use crate::plan::{BufferRole, Kernel, Plan};

/// Buffers written by forward kernels and read by backward ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SavedForBackward {
    pub buffers: usize,
    pub bytes: usize,
}

/// Whether `kernel` does backward work: any op fused into it was appended by autodiff.
pub fn is_backward(kernel: &Kernel) -> bool {
    kernel.sources.iter().any(|s| s.loc.as_ref().is_some_and(|loc| loc.backward))
}

/// The activations the backward kernels of `plan` read from its forward kernels, or `None` for a
/// plan with no backward kernel. A buffer counts once however many backward kernels read it; plan
/// inputs (parameters, the batch) are held anyway and do not count. What fusion recomputes in a
/// backward kernel from saved inputs, instead of reading a stored intermediate, saves nothing.
pub fn saved_for_backward(plan: &Plan) -> Option<SavedForBackward> {
    let backward: Vec<bool> = plan.kernels.iter().map(is_backward).collect();
    if !backward.contains(&true) {
        return None;
    }
    let mut written_by_forward = vec![false; plan.buffers.len()];
    for (kernel, &is_bwd) in plan.kernels.iter().zip(&backward) {
        if !is_bwd {
            kernel.outputs.iter().for_each(|b| written_by_forward[b.0] = true);
        }
    }
    let mut counted = vec![false; plan.buffers.len()];
    let mut saved = SavedForBackward::default();
    for (kernel, &is_bwd) in plan.kernels.iter().zip(&backward) {
        for b in kernel.inputs.iter().filter(|_| is_bwd) {
            let buffer = plan.buffer(*b);
            if written_by_forward[b.0] && !counted[b.0] && !matches!(buffer.role, BufferRole::Input(_)) {
                counted[b.0] = true;
                saved.buffers += 1;
                saved.bytes += buffer.bytes();
            }
        }
    }
    Some(saved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::*;
    use braze_ir::{DType, Shape, SourceLoc};

    fn kernel(name: &str, inputs: &[usize], outputs: &[usize], backward: bool) -> Kernel {
        let mut body = Body::default();
        let v = body.push(Expr::Load { input: 0, offset: 0, strides: vec![1] }, DType::F32);
        for output in 0..outputs.len() {
            body.stores.push(Store { value: v, output });
        }
        let loc = SourceLoc { file: "model.rs".into(), line: 3, col: 9, backward, recomputed: false };
        Kernel {
            name: name.into(),
            kind: KernelKind::Pointwise(Pointwise { shape: Shape(vec![100]), body }),
            inputs: inputs.iter().map(|&b| BufferId(b)).collect(),
            outputs: outputs.iter().map(|&b| BufferId(b)).collect(),
            sources: vec![SourceOp { op: "neg".into(), loc: Some(loc) }],
        }
    }

    fn plan(kernels: Vec<Kernel>) -> Plan {
        let buf = |role| Buffer { dtype: DType::F32, numel: 100, role };
        Plan {
            checks: Vec::new(),
            buffers: vec![
                buf(BufferRole::Input(0)),
                buf(BufferRole::Intermediate),
                buf(BufferRole::Intermediate),
                buf(BufferRole::Output),
                buf(BufferRole::Output),
            ],
            inputs: vec![BufferId(0)],
            outputs: vec![
                PlanOutput { buffer: BufferId(3), shape: Shape(vec![100]) },
                PlanOutput { buffer: BufferId(4), shape: Shape(vec![100]) },
            ],
            kernels,
        }
    }

    #[test]
    fn counts_forward_buffers_the_backward_reads_once() {
        // forward: b0 -> b1 -> b3 (the loss side); backward: (b1, b0) -> b2 -> b4, b1 read twice.
        let p = plan(vec![
            kernel("f0", &[0], &[1], false),
            kernel("f1", &[1], &[3], false),
            kernel("b0", &[1, 0], &[2], true),
            kernel("b1", &[2, 1], &[4], true),
        ]);
        assert_eq!(saved_for_backward(&p), Some(SavedForBackward { buffers: 1, bytes: 400 }));
    }

    #[test]
    fn a_forward_only_plan_has_nothing_saved() {
        let p = plan(vec![kernel("f0", &[0], &[1], false), kernel("f1", &[1], &[3, 4], false)]);
        assert_eq!(saved_for_backward(&p), None);
        // A backward kernel reading only plan inputs saves nothing either.
        let p = plan(vec![kernel("f0", &[0], &[3], false), kernel("b0", &[0], &[4], true)]);
        assert_eq!(saved_for_backward(&p), Some(SavedForBackward::default()));
    }
}
