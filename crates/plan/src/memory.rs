//! Memory planning: where each intermediate buffer of a plan lives inside one arena, so that
//! buffers whose lifetimes do not overlap share storage and a plan needs one allocation per
//! input signature.

use crate::plan::{BufferId, BufferRole, Plan};

/// Offsets are multiples of this (enough for 16-byte vector loads and cuBLASLt's preferences).
pub const ARENA_ALIGNMENT: usize = 256;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Bytes of the arena holding every intermediate.
    pub arena_bytes: usize,
    /// Arena offset of each intermediate buffer (`None` for inputs and outputs).
    pub offsets: Vec<Option<usize>>,
    /// Sum of the intermediates' sizes without reuse, to report what reuse saved.
    pub unshared_bytes: usize,
    /// The most intermediate bytes alive during one kernel: no placement of this kernel order
    /// needs less, so `arena_bytes` above it is what placement lost to fragmentation.
    pub peak_live_bytes: usize,
}

/// First and last kernel index touching `buffer`, or `None` when no kernel does.
fn lifetime(plan: &Plan, buffer: BufferId) -> Option<(usize, usize)> {
    let mut span: Option<(usize, usize)> = None;
    for (k, kernel) in plan.kernels.iter().enumerate() {
        if kernel.inputs.contains(&buffer) || kernel.outputs.contains(&buffer) {
            span = Some(match span {
                None => (k, k),
                Some((first, _)) => (first, k),
            });
        }
    }
    span
}

impl MemoryPlan {
    /// Places intermediates largest first at the lowest offset that does not overlap any
    /// already placed buffer alive at the same time (lifetimes are inclusive, so a kernel's
    /// outputs never share memory with its inputs).
    pub fn for_plan(plan: &Plan) -> MemoryPlan {
        let mut offsets = vec![None; plan.buffers.len()];
        let mut items: Vec<(usize, usize, (usize, usize))> = plan
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.role == BufferRole::Intermediate)
            .filter_map(|(i, b)| lifetime(plan, BufferId(i)).map(|life| (i, aligned(b.bytes()), life)))
            .collect();
        let unshared_bytes = items.iter().map(|it| it.1).sum();
        let peak_live_bytes = (0..plan.kernels.len())
            .map(|k| items.iter().filter(|(_, _, life)| life.0 <= k && k <= life.1).map(|it| it.1).sum())
            .max()
            .unwrap_or(0);
        // Largest first; ties by buffer index keep the result deterministic.
        items.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut placed: Vec<(usize, usize, (usize, usize))> = Vec::new(); // (offset, bytes, life)
        let mut arena_bytes = 0;
        for (buffer, bytes, life) in items {
            let mut conflicts: Vec<(usize, usize)> = placed
                .iter()
                .filter(|(_, _, other)| life.0 <= other.1 && other.0 <= life.1)
                .map(|(off, len, _)| (*off, *len))
                .collect();
            conflicts.sort();
            let mut offset = 0;
            for (off, len) in conflicts {
                if offset + bytes <= off {
                    break;
                }
                offset = offset.max(off + len);
            }
            placed.push((offset, bytes, life));
            offsets[buffer] = Some(offset);
            arena_bytes = arena_bytes.max(offset + bytes);
        }
        MemoryPlan { arena_bytes, offsets, unshared_bytes, peak_live_bytes }
    }
}

fn aligned(bytes: usize) -> usize {
    bytes.div_ceil(ARENA_ALIGNMENT) * ARENA_ALIGNMENT
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::*;
    use braze_ir::{DType, Shape};

    fn copy_kernel(input: BufferId, output: BufferId) -> Kernel {
        let mut body = Body::default();
        let v = body.push(Expr::Load { input: 0, offset: 0, strides: vec![1] }, DType::F32);
        body.stores.push(Store { value: v, output: 0 });
        Kernel {
            name: format!("copy_{}", output.0),
            kind: KernelKind::Pointwise(Pointwise { shape: Shape(vec![1000]), body }),
            inputs: vec![input],
            outputs: vec![output],
            sources: vec![],
        }
    }

    #[test]
    fn chain_reuses_dead_intermediates() {
        // b0 (input) -> b1 -> b2 -> b3 -> b4 (output): b1 and b3 can share storage.
        let buf = |role| Buffer { dtype: DType::F32, numel: 1000, role };
        let plan = Plan {
            buffers: vec![
                buf(BufferRole::Input(0)),
                buf(BufferRole::Intermediate),
                buf(BufferRole::Intermediate),
                buf(BufferRole::Intermediate),
                buf(BufferRole::Output),
            ],
            inputs: vec![BufferId(0)],
            outputs: vec![PlanOutput { buffer: BufferId(4), shape: Shape(vec![1000]) }],
            kernels: (0..4).map(|k| copy_kernel(BufferId(k), BufferId(k + 1))).collect(),
        };
        let mem = MemoryPlan::for_plan(&plan);
        assert_eq!(mem.offsets[0], None);
        assert_eq!(mem.offsets[4], None);
        assert_eq!(mem.offsets[1], mem.offsets[3]);
        assert_ne!(mem.offsets[1], mem.offsets[2]);
        assert_eq!(mem.arena_bytes, 2 * 4096);
        assert_eq!(mem.unshared_bytes, 3 * 4096);
        assert_eq!(mem.peak_live_bytes, 2 * 4096);
    }
}
