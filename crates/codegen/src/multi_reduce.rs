//! Multi-reduce kernels: K independent full reductions in one launch, then their epilogue.
//!
//! Items are cut into segments of at most `chunk` elements. A block either reduces one segment of
//! a large item with all its threads, or several whole small items of one reduction, one warp
//! each, so that thousands of tiny items do not each waste a block; each block runs the code of
//! its task's reduction (a `switch` when the kernel has several). Item base pointers come from an
//! [`TableSpec::InputPointers`] table (K can be far more than kernel parameters allow), the work
//! list from two static tables; where an item reads several leaves side by side (`sum(p * q)`),
//! a third static table gives each item's first input slot. Items cut into several segments are finished by whichever block
//! completes the item's last segment (an integer arrival counter in zeroed scratch, reset by that
//! block): it combines the segment partials in a fixed order, so results never vary between runs.
//! What a finished item's result feeds is `multi_reduce_epilogue.rs`'s.

use crate::body::{check_body, emit_values, live_values, value_name, BodyRules};
use crate::cuda::{storage_type, value_type, widen, Helpers};
use crate::error::{invalid_config, malformed, unsupported, Result};
use crate::index::IndexWidth;
use crate::multi_reduce_epilogue::Finish;
use crate::reduce::{accumulate, accumulator_dtype, butterfly, combine, declare_accumulator, finalize};
use crate::vector::emit_vector_load;
use crate::writer::CodeWriter;
use crate::{Emitted, Launch, Param, ScratchSpec, TableSpec, Unit};
use braze_ir::DType;
use braze_plan::{Body, Expr, ItemReduction, MultiReduce, ReduceItem};

/// Bytes of one `Segment` record in the static table (see the struct in the source).
const SEGMENT_BYTES: usize = 32;
/// Bytes of one `BlockTask` record.
const TASK_BYTES: usize = 16;
/// Bytes of one scratch slot for a partial or a parked result (any accumulator fits).
const SLOT_BYTES: usize = 8;

/// `len` elements from `start` of `item`, which is cut into `chunk_count` segments, the first of
/// which has index `first_chunk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) start: u64,
    pub(crate) item_len: u64,
    pub(crate) len: u32,
    pub(crate) item: u32,
    pub(crate) first_chunk: u32,
    pub(crate) chunk_count: u32,
}

/// What one block does: segment `first_segment` with all its threads (`whole_block`), or
/// segments `first_segment..first_segment + segment_count`, one warp each; all of items of
/// `reduction`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockTask {
    pub(crate) first_segment: u32,
    pub(crate) segment_count: u32,
    pub(crate) whole_block: bool,
    pub(crate) reduction: u32,
}

/// The work list: large items' segments (one block each) first, so the longest work starts
/// first, then packs of small items of one reduction each.
pub(crate) fn work_list(items: &[ReduceItem], block: usize, chunk: usize) -> (Vec<Segment>, Vec<BlockTask>) {
    let warps = block / 32;
    // An item a warp finishes in about the time a block takes for a full chunk.
    let small_limit = chunk / warps;
    let mut segments = Vec::new();
    let mut tasks = Vec::new();
    for (item, it) in items.iter().enumerate() {
        let n = it.len;
        if n <= small_limit {
            continue;
        }
        let chunks = n.div_ceil(chunk);
        let first = segments.len() as u32;
        for c in 0..chunks {
            let start = c * chunk;
            tasks.push(BlockTask {
                first_segment: segments.len() as u32,
                segment_count: 1,
                whole_block: true,
                reduction: it.reduction as u32,
            });
            segments.push(Segment {
                start: start as u64,
                item_len: n as u64,
                len: chunk.min(n - start) as u32,
                item: item as u32,
                first_chunk: first,
                chunk_count: chunks as u32,
            });
        }
    }
    // Small items: packs of whole items of one reduction, at most `chunk` elements and four per warp.
    let reductions = items.iter().map(|it| it.reduction + 1).max().unwrap_or(0);
    for reduction in 0..reductions {
        let mut pack: Option<(BlockTask, usize)> = None;
        for (item, it) in items.iter().enumerate() {
            let n = it.len;
            if n > small_limit || it.reduction != reduction {
                continue;
            }
            let index = segments.len() as u32;
            segments.push(Segment {
                start: 0,
                item_len: n as u64,
                len: n as u32,
                item: item as u32,
                first_chunk: index,
                chunk_count: 1,
            });
            match &mut pack {
                Some((task, elements)) if (task.segment_count as usize) < 4 * warps && *elements + n <= chunk => {
                    task.segment_count += 1;
                    *elements += n;
                }
                _ => {
                    if let Some((task, _)) = pack.take() {
                        tasks.push(task);
                    }
                    let task = BlockTask {
                        first_segment: index,
                        segment_count: 1,
                        whole_block: false,
                        reduction: reduction as u32,
                    };
                    pack = Some((task, n));
                }
            }
        }
        if let Some((task, _)) = pack {
            tasks.push(task);
        }
    }
    (segments, tasks)
}

fn encode_segments(segments: &[Segment]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(segments.len() * SEGMENT_BYTES);
    for s in segments {
        bytes.extend_from_slice(&s.start.to_le_bytes());
        bytes.extend_from_slice(&s.item_len.to_le_bytes());
        for field in [s.len, s.item, s.first_chunk, s.chunk_count] {
            bytes.extend_from_slice(&field.to_le_bytes());
        }
    }
    bytes
}

fn encode_tasks(tasks: &[BlockTask]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(tasks.len() * TASK_BYTES);
    for t in tasks {
        for field in [t.first_segment, t.segment_count, t.whole_block as u32, t.reduction] {
            bytes.extend_from_slice(&field.to_le_bytes());
        }
    }
    bytes
}

/// Elements per vector load of an item.
pub(crate) fn vector_width(dtype: DType) -> usize {
    (16 / dtype.size_bytes()).min(8)
}

fn check(unit: &Unit<'_>, multi: &MultiReduce, block: u32, chunk: u32) -> Result<()> {
    let name = unit.name();
    if !(32..=1024).contains(&block) || !block.is_multiple_of(32) {
        return Err(invalid_config(name, format!("block {block} is not a multiple of 32 in 32..=1024")));
    }
    // Segment-relative indices are 32-bit.
    if chunk == 0 || chunk > 1 << 30 {
        return Err(invalid_config(name, format!("chunk {chunk} is not in 1..=2^30")));
    }
    let kernel = unit.kernel;
    let Some((firsts, slots)) = multi.first_inputs() else {
        return Err(malformed(name, "an item runs a reduction that does not exist"));
    };
    if kernel.inputs.len() != slots {
        return Err(malformed(
            name,
            format!(
                "{} items read {slots} leaves but the kernel has {} input slots",
                multi.items.len(),
                kernel.inputs.len()
            ),
        ));
    }
    for (i, item) in multi.items.iter().enumerate() {
        let reduction = &multi.reductions[item.reduction];
        for slot in firsts[i]..firsts[i] + reduction.leaves {
            let buffer = unit.plan.buffer(kernel.inputs[slot]);
            if buffer.dtype != reduction.dtype || buffer.numel < item.len {
                return Err(malformed(
                    name,
                    format!(
                        "item {i} needs {} x {} in slot {slot}, its buffer holds {} x {}",
                        item.len, reduction.dtype, buffer.numel, buffer.dtype
                    ),
                ));
            }
        }
    }
    for (r, reduction) in multi.reductions.iter().enumerate() {
        let rules = BodyRules { inputs: reduction.leaves, outputs: 0, rank: 1, reductions: false };
        check_body(name, &reduction.prologue, &rules)?;
        if reduction.leaves == 0 || reduction.prologue.values.is_empty() || !reduction.prologue.stores.is_empty() {
            return Err(malformed(
                name,
                format!("reduction {r}: the prologue must end in the reduced value and store nothing"),
            ));
        }
        if reduction
            .prologue
            .values
            .iter()
            .any(|v| matches!(v.expr, Expr::Load { input, .. } if v.expr != MultiReduce::leaf_load(input)))
        {
            return Err(unsupported(name, "a prologue load other than the current element of a leaf"));
        }
    }
    let rules = BodyRules { inputs: multi.items.len(), outputs: 0, rank: 0, reductions: false };
    check_body(name, &multi.epilogue, &rules)?;
    let computes = multi
        .stores
        .iter()
        .any(|s| multi.epilogue.values.get(s.value.0).is_some_and(|v| v.expr != MultiReduce::result_load(s.index)));
    if computes && multi.items.is_empty() {
        return Err(malformed(name, "the epilogue computes a value but no item finishes to run it"));
    }
    for s in &multi.stores {
        let Some(&out) = kernel.outputs.get(s.output) else {
            return Err(malformed(
                name,
                format!("a store writes output slot {} of {}", s.output, kernel.outputs.len()),
            ));
        };
        let buffer = unit.plan.buffer(out);
        let value = multi.epilogue.values.get(s.value.0);
        if s.index >= buffer.numel || value.is_none_or(|v| v.dtype != buffer.dtype) {
            return Err(malformed(
                name,
                format!("the store of {} to out{}[{}] does not fit", s.value, s.output, s.index),
            ));
        }
    }
    Ok(())
}

/// The name of leaf `leaf`'s pointer or element (`base`), numbered only when there are several.
fn leaf_name(base: &str, leaf: usize, leaves: usize) -> String {
    if leaves == 1 {
        base.to_string()
    } else {
        format!("{base}{leaf}")
    }
}

/// Emits the loop of `threads` threads (this one is `thread`) over `seg.len` elements of each
/// leaf (pointers `items`, or `items0`, `items1`, ...), applying the prologue and accumulating
/// into `acc`.
#[allow(clippy::too_many_arguments)]
fn emit_range(
    w: &mut CodeWriter,
    helpers: &mut Helpers,
    kernel: &str,
    reduction: &ItemReduction,
    acc: DType,
    thread: &str,
    threads: usize,
    vec: usize,
) -> Result<()> {
    let body: &Body = &reduction.prologue;
    let reduced = body.values.len() - 1;
    let live = live_values(body, [braze_plan::ValueId(reduced)]);
    let ids: Vec<usize> = (0..body.values.len()).filter(|&id| live[id]).collect();
    let dtype = reduction.dtype;
    let leaves = reduction.leaves;
    let reduced_dtype = body.values[reduced].dtype;
    let element = |w: &mut CodeWriter, helpers: &mut Helpers, sources: &[String]| -> Result<()> {
        let mut names: Vec<String> = (0..body.values.len()).map(value_name).collect();
        emit_values(w, kernel, helpers, body, ids.iter().copied(), &mut names, |id, helpers| {
            match body.values[id].expr {
                Expr::Load { input, .. } => {
                    Some(crate::cuda::cast(helpers, dtype, body.values[id].dtype, &sources[input]))
                }
                _ => None,
            }
        })?;
        w.line(accumulate(helpers, reduction.op, acc, "acc", &names[reduced], reduced_dtype));
        Ok(())
    };
    if vec > 1 {
        w.line(format!("const unsigned vectors = seg.len / {vec}u;"));
        w.line("#pragma unroll 4");
        w.open(format!("for (unsigned j = {thread}; j < vectors; j += {threads}u)"));
        for l in 0..leaves {
            let x = leaf_name("x", l, leaves);
            w.line(format!("{} {x}[{vec}];", value_type(dtype)));
            let items = leaf_name("items", l, leaves);
            emit_vector_load(w, helpers, dtype, &items, &format!("j * {vec}u"), &x, "", vec, IndexWidth::U32);
        }
        w.line("#pragma unroll");
        w.open(format!("for (unsigned u = 0u; u < {vec}u; ++u)"));
        let sources: Vec<String> = (0..leaves).map(|l| format!("{}[u]", leaf_name("x", l, leaves))).collect();
        element(w, helpers, &sources)?;
        w.close();
        w.close();
        w.open(format!("for (unsigned j = vectors * {vec}u + {thread}; j < seg.len; j += {threads}u)"));
    } else {
        w.open(format!("for (unsigned j = {thread}; j < seg.len; j += {threads}u)"));
    }
    let sources: Vec<String> = (0..leaves).map(|l| leaf_name("x", l, leaves)).collect();
    for (l, x) in sources.iter().enumerate() {
        let items = leaf_name("items", l, leaves);
        w.line(format!("const {} {x} = {};", value_type(dtype), widen(dtype, &format!("{items}[j]"))));
    }
    element(w, helpers, &sources)?;
    w.close();
    Ok(())
}

/// Declares the pointers to the current segment's elements of each leaf of the item: kernel
/// input `seg.item` when every item has one leaf, else the item's leaves from `item_inputs`.
fn declare_leaf_pointers(w: &mut CodeWriter, shared: &Shared, reduction: &ItemReduction, start: &str) {
    let storage = storage_type(reduction.dtype);
    for l in 0..reduction.leaves {
        let slot = if shared.leaf_table { format!("item_inputs[seg.item] + {l}u") } else { "seg.item".to_string() };
        w.line(format!(
            "const {storage}* __restrict__ {} = static_cast<const {storage}*>(item_ptrs[{slot}]){start};",
            leaf_name("items", l, reduction.leaves)
        ));
    }
}

/// What every reduction's code shares.
struct Shared<'a> {
    kernel: &'a str,
    multi: &'a MultiReduce,
    finish: &'a Finish,
    block: u32,
    multi_chunk: bool,
    /// Whether an item has several leaves, so items find their input slots in `item_inputs`.
    leaf_table: bool,
}

/// The code of the blocks whose task runs reduction `r`.
fn emit_reduction(w: &mut CodeWriter, helpers: &mut Helpers, shared: &Shared, r: usize) -> Result<()> {
    let Shared { kernel, multi, finish, block, multi_chunk, .. } = *shared;
    let reduction = &multi.reductions[r];
    let items = multi.items.len();
    let warps = block / 32;
    let reduced_dtype = reduction.result_dtype();
    let acc = accumulator_dtype(reduction.op, reduced_dtype);
    let acc_type = value_type(acc);
    let op = reduction.op;
    let vec = vector_width(reduction.dtype);
    helpers.need_storage(reduction.dtype);
    let result =
        |helpers: &mut Helpers, acc_name: &str| finalize(helpers, op, acc, acc_name, "seg.item_len", reduced_dtype);
    let done = |w: &mut CodeWriter, value: &str| finish.emit_item_done(w, items, "seg.item", value, reduced_dtype);
    let accumulators = [("acc".to_string(), op, acc)];

    w.line(format!("{acc_type}* const warp_partials = reinterpret_cast<{acc_type}*>(warp_slots);"));
    w.open("if (task.whole_block)");
    w.line("const unsigned s = task.first_segment;");
    w.line("const Segment seg = segments[s];");
    declare_leaf_pointers(w, shared, reduction, " + seg.start");
    w.line(declare_accumulator(op, reduced_dtype, acc, "acc"));
    emit_range(w, helpers, kernel, reduction, acc, "threadIdx.x", block as usize, vec)?;
    butterfly(w, helpers, &accumulators, 32, "0xffffffffu");
    w.line("if (lane == 0u) warp_partials[warp] = acc;");
    w.line("__syncthreads();");
    w.open("if (threadIdx.x == 0u)");
    w.line("acc = warp_partials[0];");
    w.line(format!(
        "for (unsigned w = 1u; w < {warps}u; ++w) acc = {};",
        combine(helpers, op, acc, "acc", "warp_partials[w]")
    ));
    if multi_chunk {
        w.open("if (seg.chunk_count == 1u)");
        let value = result(helpers, "acc");
        done(w, &value);
        w.reopen("else");
        w.line(format!("*reinterpret_cast<{acc_type}*>(&partials[s]) = acc;"));
        w.line("__threadfence();  // publish the partial before counting this segment as arrived");
        w.line("last_arrival = atomicAdd(&arrivals[seg.item], 1u) == seg.chunk_count - 1u;");
        w.close();
    } else {
        let value = result(helpers, "acc");
        done(w, &value);
    }
    w.close();
    if multi_chunk {
        w.line("__syncthreads();");
        w.line("// The block that finishes an item's last segment combines the item's partials in a fixed order.");
        w.open("if (seg.chunk_count > 1u && last_arrival && warp == 0u)");
        w.line("__threadfence();");
        w.line(declare_accumulator(op, reduced_dtype, acc, "total"));
        w.open("for (unsigned c = lane; c < seg.chunk_count; c += 32u)");
        w.line(format!(
            "const {acc_type} partial = *reinterpret_cast<const volatile {acc_type}*>(&partials[seg.first_chunk + c]);"
        ));
        w.line(format!("total = {};", combine(helpers, op, acc, "total", "partial")));
        w.close();
        butterfly(w, helpers, &[("total".to_string(), op, acc)], 32, "0xffffffffu");
        w.open("if (lane == 0u)");
        let value = result(helpers, "total");
        done(w, &value);
        w.line("arrivals[seg.item] = 0u;  // leave the scratch zeroed for the next run");
        w.close();
        w.close();
    }
    w.reopen("else");
    w.line("// whole small items, one warp each");
    w.open(format!(
        "for (unsigned s = task.first_segment + warp; s < task.first_segment + task.segment_count; s += {warps}u)"
    ));
    w.line("const Segment seg = segments[s];");
    declare_leaf_pointers(w, shared, reduction, "");
    w.line(declare_accumulator(op, reduced_dtype, acc, "acc"));
    emit_range(w, helpers, kernel, reduction, acc, "lane", 32, vec)?;
    butterfly(w, helpers, &accumulators, 32, "0xffffffffu");
    w.open("if (lane == 0u)");
    let value = result(helpers, "acc");
    done(w, &value);
    w.close();
    w.close();
    w.close();
    Ok(())
}

pub(crate) fn generate(unit: &mut Unit<'_>, multi: &MultiReduce, block: u32, chunk: u32) -> Result<Emitted> {
    check(unit, multi, block, chunk)?;
    let kernel = unit.kernel;
    let name = kernel.name.clone();
    // Segment starts stay multiples of every item's vector width, so vector loads stay aligned.
    let vec = multi.reductions.iter().map(|r| vector_width(r.dtype)).max().unwrap_or(1);
    let chunk = (chunk as usize).div_ceil(vec) * vec;
    let warps = block as usize / 32;
    let (segments, tasks) = work_list(&multi.items, block as usize, chunk);
    let multi_chunk = segments.iter().any(|s| s.chunk_count > 1);
    let outputs: Vec<DType> = (0..kernel.outputs.len()).map(|o| unit.output_dtype(o)).collect();
    let numels: Vec<usize> = kernel.outputs.iter().map(|&b| unit.plan.buffer(b).numel).collect();
    let finish = Finish::plan(multi, outputs, &numels);
    let helpers = &mut unit.helpers;

    let mut w = CodeWriter::new();
    w.line("// `len` elements from `start` of `item`, which is cut into `chunk_count` segments from index `first_chunk` on.");
    w.open("struct Segment");
    for field in [
        "unsigned long long start;",
        "unsigned long long item_len;",
        "unsigned len;",
        "unsigned item;",
        "unsigned first_chunk;",
        "unsigned chunk_count;",
    ] {
        w.line(field);
    }
    w.close_with(";");
    w.line("// One block's work: one segment with every thread, or several small items, one warp each.");
    w.open("struct BlockTask");
    for field in ["unsigned first_segment;", "unsigned segment_count;", "unsigned whole_block;", "unsigned reduction;"]
    {
        w.line(field);
    }
    w.close_with(";");
    w.line("");
    let mut declared = finish.output_params(helpers);
    let mut params: Vec<Param> = (0..kernel.outputs.len()).map(Param::Output).collect();
    declared.push("const void* const* __restrict__ item_ptrs".to_string());
    declared.push("const Segment* __restrict__ segments".to_string());
    declared.push("const BlockTask* __restrict__ tasks".to_string());
    params.extend([Param::Table(0), Param::Table(1), Param::Table(2)]);
    let (first_inputs, _) = multi.first_inputs().expect("checked: every item runs a reduction");
    let leaf_table = multi.reductions.iter().any(|r| r.leaves > 1);
    if leaf_table {
        declared.push("const unsigned* __restrict__ item_inputs".to_string());
        params.push(Param::Table(3));
    }
    let mut scratch = Vec::new();
    let mut scratch_notes = Vec::new();
    if multi_chunk {
        declared.push("unsigned long long* __restrict__ partials".to_string());
        declared.push("unsigned* __restrict__ arrivals".to_string());
        params.extend([Param::Scratch(scratch.len()), Param::Scratch(scratch.len() + 1)]);
        scratch_notes.push(format!(
            "scratch{}: one partial per segment; scratch{}: per-item arrival counters",
            scratch.len(),
            scratch.len() + 1
        ));
        scratch.push(ScratchSpec { bytes: segments.len() * SLOT_BYTES, zero_init: false });
        scratch.push(ScratchSpec { bytes: multi.items.len() * 4, zero_init: true });
    }
    if finish.has_epilogue() {
        declared.push("unsigned long long* __restrict__ results".to_string());
        declared.push("unsigned* __restrict__ finished".to_string());
        params.extend([Param::Scratch(scratch.len()), Param::Scratch(scratch.len() + 1)]);
        scratch_notes.push(format!(
            "scratch{}: every item's result; scratch{}: the count of finished items",
            scratch.len(),
            scratch.len() + 1
        ));
        scratch.push(ScratchSpec { bytes: multi.items.len() * SLOT_BYTES, zero_init: false });
        scratch.push(ScratchSpec { bytes: 4, zero_init: true });
    }

    // ptxas aims for 32 registers at full occupancy, fewer than several programs, an epilogue or
    // even one division's slow-path call in the unrolled loop hold (4 B spilled); one block per
    // SM as the floor lets it keep them out of local memory.
    w.open(format!("extern \"C\" __global__ void __launch_bounds__({block}, 1) {name}({})", declared.join(", ")));
    w.line(format!("__shared__ unsigned long long warp_slots[{warps}];"));
    if multi_chunk {
        w.line("__shared__ bool last_arrival;");
    }
    w.line("const unsigned lane = threadIdx.x & 31u;");
    w.line("const unsigned warp = threadIdx.x >> 5;");
    w.line("const BlockTask task = tasks[blockIdx.x];");
    if finish.has_epilogue() {
        w.line("bool run_epilogue = false;");
    }
    let shared = Shared { kernel: &name, multi, finish: &finish, block, multi_chunk, leaf_table };
    if multi.reductions.len() == 1 {
        emit_reduction(&mut w, helpers, &shared, 0)?;
    } else {
        // Every thread of a block takes the same case, so the barriers inside stay uniform.
        w.open("switch (task.reduction)");
        for r in 0..multi.reductions.len() {
            w.open(format!("case {r}u:"));
            emit_reduction(&mut w, helpers, &shared, r)?;
            w.line("break;");
            w.close();
        }
        w.close();
    }
    if finish.has_epilogue() {
        finish.emit_epilogue(&mut w, helpers, &name, multi)?;
    }
    w.close();

    let launches = Launch::per_work_item(&name, tasks.len(), block, params);
    let mut tables = vec![
        TableSpec::InputPointers,
        TableSpec::Static(encode_segments(&segments)),
        TableSpec::Static(encode_tasks(&tasks)),
    ];
    if leaf_table {
        let bytes = first_inputs.iter().flat_map(|&f| (f as u32).to_le_bytes()).collect();
        tables.push(TableSpec::Static(bytes));
    }
    let whole = tasks.iter().filter(|t| t.whole_block).count();
    let mut notes = vec![
        format!(
            "{} segments of at most {chunk} elements; {whole} blocks reduce one segment each, {} blocks reduce packs of small items",
            segments.len(),
            tasks.len() - whole
        ),
        format!("table1: Segment[{}], table2: BlockTask[{}]", segments.len(), tasks.len()),
    ];
    if leaf_table {
        notes.push(format!("table3: each item's first input slot, unsigned[{}]", first_inputs.len()));
    }
    notes.extend(scratch_notes);
    let ops: Vec<&str> = multi.reductions.iter().map(|r| r.op.name()).collect();
    let mut summary =
        format!("{} of {} items ({} elements) in one launch", ops.join("/"), multi.items.len(), multi.elements());
    if let Some(slot) = finish.stack {
        summary.push_str(&format!(", stacked into out{slot}"));
    }
    if finish.has_epilogue() {
        summary.push_str(&format!(", then an epilogue writing {} elements", finish.epilogue_stores.len()));
    }
    Ok(Emitted { summary, notes, width: None, code: w.finish(), launches, scratch, tables })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_items_are_cut_and_small_ones_packed() {
        let (segments, tasks) = work_list(&items(&[40_000, 0, 100, 3_000, 16_384, 50], &[0; 6]), 256, 16_384);
        // 40,000 -> 3 segments; 16,384 -> 1; 3,000 > 2,048 -> 1 block of its own.
        let whole: Vec<_> = tasks.iter().filter(|t| t.whole_block).collect();
        assert_eq!(whole.len(), 5);
        assert_eq!(
            segments[0],
            Segment { start: 0, item_len: 40_000, len: 16_384, item: 0, first_chunk: 0, chunk_count: 3 }
        );
        assert_eq!(segments[2].len, 40_000 - 2 * 16_384);
        // The small items (0, 100, 50 elements) share one block.
        assert_eq!(
            tasks.last().unwrap(),
            &BlockTask { first_segment: 5, segment_count: 3, whole_block: false, reduction: 0 }
        );
        assert_eq!(segments.len(), 8);
        assert_eq!(encode_segments(&segments).len(), 8 * SEGMENT_BYTES);
    }

    #[test]
    fn every_task_runs_items_of_one_reduction() {
        let reductions = [1, 0, 1, 0, 2, 1];
        let (segments, tasks) = work_list(&items(&[20_000, 7, 9, 11, 0, 13], &reductions), 256, 16_384);
        // Item 0 is cut in two; the small ones are packed per reduction: {1, 3}, {2, 5}, {4}.
        assert_eq!(tasks.len(), 5);
        for task in &tasks {
            for s in task.first_segment..task.first_segment + task.segment_count {
                let item = segments[s as usize].item as usize;
                assert_eq!(reductions[item], task.reduction as usize, "segment {s} in {task:?}");
            }
        }
        let packed: Vec<(u32, u32)> =
            tasks.iter().filter(|t| !t.whole_block).map(|t| (t.reduction, t.segment_count)).collect();
        assert_eq!(packed, vec![(0, 2), (1, 2), (2, 1)]);
        assert_eq!(encode_tasks(&tasks)[12..16], 1u32.to_le_bytes());
    }

    fn items(lens: &[usize], reductions: &[usize]) -> Vec<ReduceItem> {
        lens.iter().zip(reductions).map(|(&len, &reduction)| ReduceItem { reduction, len }).collect()
    }
}
