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
    /// outputs never share memory with its inputs, except the in-place pairs of
    /// [`in_place_slots`], which share one placement).
    pub fn for_plan(plan: &Plan) -> MemoryPlan {
        let mut offsets = vec![None; plan.buffers.len()];
        let lives = slot_lives(plan);
        // (first buffer of the slot, bytes, lifetime of all its buffers together)
        let mut items: Vec<(usize, usize, (usize, usize))> =
            lives.iter().map(|(slot, life)| (slot.buffers[0].0, slot.bytes, *life)).collect();
        let unshared_bytes = plan
            .buffers
            .iter()
            .enumerate()
            .filter(|(i, b)| b.role == BufferRole::Intermediate && lifetime(plan, BufferId(*i)).is_some())
            .map(|(_, b)| aligned(b.bytes()))
            .sum();
        let peak_live_bytes = (0..plan.kernels.len())
            .map(|k| lives.iter().filter(|(_, life)| life.0 <= k && k <= life.1).map(|(s, _)| s.bytes).sum())
            .max()
            .unwrap_or(0);
        // Largest first; ties by buffer index keep the result deterministic.
        items.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut placed: Vec<(usize, usize, (usize, usize))> = Vec::new(); // (offset, bytes, life)
        let mut arena_bytes = 0;
        let mut slot_offsets = vec![None; plan.buffers.len()];
        for (first, bytes, life) in items {
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
            slot_offsets[first] = Some(offset);
            arena_bytes = arena_bytes.max(offset + bytes);
        }
        for (slot, _) in &lives {
            for b in &slot.buffers {
                offsets[b.0] = slot_offsets[slot.buffers[0].0];
            }
        }
        MemoryPlan { arena_bytes, offsets, unshared_bytes, peak_live_bytes }
    }
}

/// One placement alive during a kernel: the intermediates sharing it (an in-place chain) and its
/// aligned size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveSlot {
    pub buffers: Vec<BufferId>,
    pub bytes: usize,
}

/// For each kernel in order, the placements alive while it runs (from the first kernel touching
/// one of its buffers to the last): what a step holds at each point, the peak being the arena's
/// lower bound.
pub fn live_during_kernels(plan: &Plan) -> Vec<Vec<LiveSlot>> {
    let lives = slot_lives(plan);
    (0..plan.kernels.len())
        .map(|k| lives.iter().filter(|(_, life)| life.0 <= k && k <= life.1).map(|(s, _)| s.clone()).collect())
        .collect()
}

/// Each placement of [`in_place_slots`] that some kernel touches, with the first and last kernel
/// touching any of its buffers.
fn slot_lives(plan: &Plan) -> Vec<(LiveSlot, (usize, usize))> {
    in_place_slots(plan)
        .into_iter()
        .filter_map(|slot| {
            let lives: Vec<(usize, usize)> = slot.iter().filter_map(|&b| lifetime(plan, BufferId(b))).collect();
            let first = lives.iter().map(|l| l.0).min()?;
            let last = lives.iter().map(|l| l.1).max()?;
            let bytes = aligned(plan.buffers[slot[0]].bytes());
            Some((LiveSlot { buffers: slot.into_iter().map(BufferId).collect(), bytes }, (first, last)))
        })
        .collect()
}

/// The intermediates grouped into slots that share one placement, each in kernel order: an
/// intermediate that a kernel writes joins the slot of an intermediate input of the same dtype
/// and size that the kernel reads only at the element it stores and that no later kernel reads
/// (each thread reads the old value before writing the new one at the same address, as the
/// write-backs of [`crate::Rule::InPlace`] do), so a chain of elementwise steps over large
/// tensors needs one buffer instead of two.
fn in_place_slots(plan: &Plan) -> Vec<Vec<usize>> {
    let n = plan.buffers.len();
    let mut slot_of: Vec<Option<usize>> = vec![None; n];
    let mut slots: Vec<Vec<usize>> = Vec::new();
    let intermediate = |b: BufferId| plan.buffers[b.0].role == BufferRole::Intermediate;
    let mut last_read = vec![None; n];
    for (k, kernel) in plan.kernels.iter().enumerate() {
        for b in &kernel.inputs {
            last_read[b.0] = Some(k);
        }
    }
    for (k, kernel) in plan.kernels.iter().enumerate() {
        let mut taken: Vec<BufferId> = Vec::new();
        for (out_slot, &out) in kernel.outputs.iter().enumerate() {
            if !intermediate(out) || slot_of[out.0].is_some() {
                continue;
            }
            let source = kernel.inputs.iter().copied().find(|&input| {
                intermediate(input)
                    && !taken.contains(&input)
                    && !kernel.outputs.contains(&input)
                    && last_read[input.0] == Some(k)
                    && plan.buffers[input.0].dtype == plan.buffers[out.0].dtype
                    && plan.buffers[input.0].numel == plan.buffers[out.0].numel
                    && kernel
                        .inputs
                        .iter()
                        .enumerate()
                        .filter(|(_, &b)| b == input)
                        .all(|(in_slot, _)| kernel.reads_only_stored_element(in_slot, out_slot))
            });
            match source {
                Some(input) => {
                    taken.push(input);
                    let slot = *slot_of[input.0].get_or_insert_with(|| {
                        slots.push(vec![input.0]);
                        slots.len() - 1
                    });
                    slots[slot].push(out.0);
                    slot_of[out.0] = Some(slot);
                }
                None => {
                    slots.push(vec![out.0]);
                    slot_of[out.0] = Some(slots.len() - 1);
                }
            }
        }
    }
    // Intermediates no kernel writes (never read either, or the plan is invalid) get a slot
    // of their own so every one has an offset.
    for (b, slot) in slot_of.iter().enumerate() {
        if intermediate(BufferId(b)) && slot.is_none() {
            slots.push(vec![b]);
        }
    }
    slots
}

fn aligned(bytes: usize) -> usize {
    bytes.div_ceil(ARENA_ALIGNMENT) * ARENA_ALIGNMENT
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::*;
    use braze_ir::{DType, Shape};

    /// Copies `input` to `output`, or broadcasts its first element when `broadcast` (then it
    /// reads another element than it stores, so it may not write in place).
    fn copy_kernel(input: BufferId, output: BufferId, broadcast: bool) -> Kernel {
        let mut body = Body::default();
        let load = Expr::Load { input: 0, offset: 0, strides: vec![if broadcast { 0 } else { 1 }] };
        let v = body.push(load, DType::F32);
        body.stores.push(Store { value: v, output: 0 });
        Kernel {
            name: format!("copy_{}", output.0),
            kind: KernelKind::Pointwise(Pointwise { shape: Shape(vec![1000]), body }),
            inputs: vec![input],
            outputs: vec![output],
            sources: vec![],
        }
    }

    fn buffers(intermediates: usize) -> Vec<Buffer> {
        let buf = |role| Buffer { dtype: DType::F32, numel: 1000, role };
        let mut buffers = vec![buf(BufferRole::Input(0))];
        buffers.extend((0..intermediates).map(|_| buf(BufferRole::Intermediate)));
        buffers.push(buf(BufferRole::Output));
        buffers
    }

    /// b0 (input) -> b1 -> ... -> b(n+1) (output), kernel `k` broadcasting when `broadcast(k)`.
    fn chain(intermediates: usize, broadcast: impl Fn(usize) -> bool) -> Plan {
        let last = intermediates + 1;
        Plan {
            checks: Vec::new(),
            buffers: buffers(intermediates),
            inputs: vec![BufferId(0)],
            outputs: vec![PlanOutput { buffer: BufferId(last), shape: Shape(vec![1000]) }],
            kernels: (0..last).map(|k| copy_kernel(BufferId(k), BufferId(k + 1), broadcast(k))).collect(),
        }
    }

    #[test]
    fn chain_reuses_dead_intermediates() {
        // Every kernel reads other elements than it stores: b1 and b3 share storage, b2 does not.
        let mem = MemoryPlan::for_plan(&chain(3, |_| true));
        assert_eq!(mem.offsets[0], None);
        assert_eq!(mem.offsets[4], None);
        assert_eq!(mem.offsets[1], mem.offsets[3]);
        assert_ne!(mem.offsets[1], mem.offsets[2]);
        assert_eq!(mem.arena_bytes, 2 * 4096);
        assert_eq!(mem.unshared_bytes, 3 * 4096);
        assert_eq!(mem.peak_live_bytes, 2 * 4096);
    }

    #[test]
    fn elementwise_steps_write_over_their_dead_inputs() {
        // Kernels 1 and 2 read only the element they store: b1, b2 and b3 are one buffer.
        let mem = MemoryPlan::for_plan(&chain(3, |_| false));
        assert_eq!(mem.offsets[1], mem.offsets[2]);
        assert_eq!(mem.offsets[2], mem.offsets[3]);
        assert_eq!(mem.arena_bytes, 4096);
        assert_eq!(mem.unshared_bytes, 3 * 4096);
        assert_eq!(mem.peak_live_bytes, 4096);
        // Kernel 2 broadcasts b2's first element: b3 may not overwrite b2 while it is read.
        let mem = MemoryPlan::for_plan(&chain(3, |k| k == 2));
        assert_eq!(mem.offsets[1], mem.offsets[2]);
        assert_ne!(mem.offsets[2], mem.offsets[3]);
        assert_eq!(mem.arena_bytes, 2 * 4096);
    }

    #[test]
    fn an_input_read_later_is_not_overwritten() {
        // b1 -> b2 in kernel 1, but kernel 2 reads b1 again: b2 needs its own storage.
        let mut plan = chain(2, |_| false);
        plan.kernels[2].inputs = vec![BufferId(1)];
        plan.kernels.push(copy_kernel(BufferId(2), BufferId(3), false));
        plan.kernels[2].outputs = vec![BufferId(3)];
        plan.buffers.push(Buffer { dtype: DType::F32, numel: 1000, role: BufferRole::Output });
        plan.kernels[3].outputs = vec![BufferId(4)];
        let mem = MemoryPlan::for_plan(&plan);
        assert_ne!(mem.offsets[1], mem.offsets[2]);
        assert_eq!(mem.arena_bytes, 2 * 4096);
    }
}
