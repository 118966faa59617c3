//! Row kernels: `threads_per_row` threads (part of a warp, a warp, or a whole block) cooperate on
//! one row. The body runs in passes: pass `p` evaluates the element values that the reductions
//! of depth `p` need and reduces them (warp butterfly, then the warps' partials in warp order
//! through shared memory: deterministic), a final pass computes and stores the element outputs.
//!
//! With `cached`, each thread keeps its elements of every value that a later pass needs in
//! fixed-size register arrays (indexed by compile-time constants in unrolled loops), so a chain
//! of dependent reductions (16 layer norms) reads its inputs once. Without it every pass re-reads
//! and recomputes what it needs, which suits rows too long for registers.

mod analysis;
mod pass;

pub(crate) use analysis::RowAnalysis;

use crate::body::{check_body, emit_values, value_name, BodyRules};
use crate::cuda::{cast, narrow, occupancy_bounds, value_type, Helpers};
use crate::error::{invalid_config, Result};
use crate::index::{classify, merge_view, offset_expr, IndexWidth, VectorAccess, ViewDim};
use crate::reduce::{accumulator_dtype, combine};
use crate::vector::load_rhs;
use crate::writer::CodeWriter;
use crate::{grid_for, Emitted, Launch, Unit};
use braze_ir::{DType, ReduceOp};
use braze_plan::{Body, Expr, RowKernel};
use pass::PassContext;

/// Threads the blocks of a row kernel of fewer than 512 threads should fill an SM with: on the
/// H100 (run E) mlp_step's GELU backward rows, 66 registers and 3 blocks of 256 an SM, took
/// 113.3 us; capped at 64 (4 blocks) 106.2 us, at 48 (5 blocks, grids of 2.6 waves) 112.2 us.
const ROW_RESIDENT_THREADS: u32 = 1024;

/// A compiler-only barrier: keeps a pass's loads from being hoisted out of the row loop into
/// registers held across every pass (which spills chained layers).
const HOIST_BARRIER: &str =
    "asm volatile(\"\" ::: \"memory\");  // keep later passes' loads out of registers until needed";

/// Most elements of one value a thread may keep in registers.
pub(crate) const MAX_CACHED_PER_THREAD: usize = 64;

/// Most rows a block works on at once when a row spans several warps: each such row slot
/// synchronizes its warps at a named barrier of its own (ids 1..=15; 0 is `__syncthreads`).
pub(crate) const MAX_MULTI_WARP_SLOTS: u32 = 15;

/// Most f32 partial accumulators (over every partial of the kernel) one thread may hold.
pub(crate) const MAX_PARTIAL_ACCUMULATORS: usize = 32;

/// Partial accumulators a thread holds: its elements of the row for each partial.
pub(crate) fn partial_accumulators(row: &RowKernel, tpr: usize, vec: usize) -> usize {
    row.cols().div_ceil(tpr * vec) * vec * row.partials.len()
}

/// The widest vector (elements per thread per chunk, at most 16 bytes of the narrowest element
/// the kernel streams and at most 8) that divides the row.
pub(crate) fn vector_width(unit: &Unit<'_>, row: &RowKernel) -> usize {
    let per_row = row.body.row_values(row.outer.len());
    let mut narrowest = 4;
    for (id, value) in row.body.values.iter().enumerate() {
        if let Expr::Load { input, .. } = value.expr {
            if !per_row[id] && input < unit.kernel.inputs.len() {
                narrowest = narrowest.min(unit.input_dtype(input).size_bytes());
            }
        }
    }
    for store in &row.body.stores {
        if store.value.0 < per_row.len() && !per_row[store.value.0] && store.output < unit.kernel.outputs.len() {
            narrowest = narrowest.min(unit.output_dtype(store.output).size_bytes());
        }
    }
    let cols = row.cols();
    let mut vec = (16 / narrowest).min(8);
    while vec > 1 && !cols.is_multiple_of(vec) {
        vec /= 2;
    }
    vec
}

enum ElementLoad {
    /// An aligned vector load per chunk.
    Vector,
    /// One element per chunk, the same for the whole vector.
    Uniform,
    /// Index math per element.
    Gather,
}

struct LoadInfo {
    slot: usize,
    /// The row's offset as a C expression, `None` when it is always 0.
    row_offset: Option<String>,
    /// For element loads: the variable holding `row_offset` (shared by loads with the same one).
    row_var: Option<String>,
    inner: Vec<ViewDim>,
    kind: ElementLoad,
}

struct Layout {
    threads_per_row: usize,
    vec: usize,
    cached: bool,
    /// Chunks of `vec` columns per thread in cached mode.
    chunks: usize,
    /// Whether the last chunk runs past the row for some threads.
    partial: bool,
    warps_per_row: usize,
    /// Rows the block works on at once (its groups of `threads_per_row` threads).
    slots: usize,
}

impl Layout {
    /// Whether the block's rows span several warps each and there are several of them: then a
    /// row's warps meet at their slot's named barrier, not the block's.
    fn slotted_warps(&self) -> bool {
        self.warps_per_row > 1 && self.slots > 1
    }

    /// The barrier of one row's threads.
    fn row_barrier(&self) -> String {
        if self.slotted_warps() {
            format!(
                "asm volatile(\"bar.sync %0, %1;\" :: \"r\"(group + 1u), \"r\"({}u) : \"memory\");",
                self.threads_per_row
            )
        } else {
            "__syncthreads();".to_string()
        }
    }

    /// The shared slot of warp `warp`'s partial of a reduction.
    fn warp_partial(&self, array: &str, warp: &str) -> String {
        if self.slotted_warps() {
            format!("{array}[group][{warp}]")
        } else {
            format!("{array}[{warp}]")
        }
    }
}

fn check_config(unit: &Unit<'_>, tpr: u32, rpb: u32) -> Result<()> {
    if !tpr.is_power_of_two() || tpr > 1024 {
        return Err(invalid_config(unit.name(), format!("threads_per_row {tpr} is not a power of two up to 1024")));
    }
    if rpb == 0 || (tpr > 32 && rpb > MAX_MULTI_WARP_SLOTS) {
        return Err(invalid_config(
            unit.name(),
            format!("rows_per_block {rpb}: must be 1..={MAX_MULTI_WARP_SLOTS} when a row spans several warps, else at least 1"),
        ));
    }
    let block = tpr as usize * rpb as usize;
    if !(32..=1024).contains(&block) || !block.is_multiple_of(32) {
        return Err(invalid_config(
            unit.name(),
            format!("a block of {block} threads is not a multiple of 32 in 32..=1024"),
        ));
    }
    Ok(())
}

pub(crate) fn generate(unit: &mut Unit<'_>, row: &RowKernel, tpr: u32, rpb: u32, cached: bool) -> Result<Emitted> {
    check_config(unit, tpr, rpb)?;
    let kernel = unit.kernel;
    let body = &row.body;
    let outer_rank = row.outer.len();
    let rules = BodyRules {
        inputs: kernel.inputs.len(),
        outputs: kernel.outputs.len(),
        rank: outer_rank + row.inner.len(),
        reductions: true,
    };
    check_body(&kernel.name, body, &rules)?;
    let (rows, cols) = (row.rows(), row.cols());
    let width = IndexWidth::for_largest((rows * cols).max(rows).max(unit.largest_buffer()));
    let lit = |n: usize| width.lit(n);
    let vec = vector_width(unit, row);
    let tpr_n = tpr as usize;
    let layout = Layout {
        threads_per_row: tpr_n,
        vec,
        cached,
        chunks: cols.div_ceil(tpr_n * vec),
        partial: cols % (tpr_n * vec) != 0,
        warps_per_row: tpr_n.div_ceil(32),
        slots: rpb as usize,
    };
    if cached && layout.chunks * vec > MAX_CACHED_PER_THREAD {
        return Err(invalid_config(
            unit.name(),
            format!(
                "caching {} elements per thread (cols {cols} over {tpr} threads) would spill; use more threads or cached = false",
                layout.chunks * vec
            ),
        ));
    }
    let has_partials = !row.partials.is_empty();
    if has_partials && partial_accumulators(row, tpr_n, vec) > MAX_PARTIAL_ACCUMULATORS {
        return Err(invalid_config(
            unit.name(),
            format!(
                "{} partial accumulators a thread (cols {cols} over {tpr} threads, {} partials): more than {MAX_PARTIAL_ACCUMULATORS}",
                partial_accumulators(row, tpr_n, vec),
                row.partials.len()
            ),
        ));
    }
    let groups = row.partial_groups();
    if groups > i32::MAX as usize {
        return Err(invalid_config(unit.name(), format!("{groups} groups of partials: more blocks than a grid has")));
    }
    let analysis = RowAnalysis::of(row, cached);
    let input_dtypes: Vec<DType> = (0..kernel.inputs.len()).map(|slot| unit.input_dtype(slot)).collect();
    let output_dtypes: Vec<DType> = (0..kernel.outputs.len()).map(|slot| unit.output_dtype(slot)).collect();
    let mut loads = plan_loads(row, &analysis, vec, width);
    let prefetched = plan_prefetches(row, &analysis, &loads, &layout, &input_dtypes);
    let (declared, params) = unit.buffer_params();
    let helpers = &mut unit.helpers;
    let block = tpr * rpb;
    // For 1024-thread blocks ptxas aims at two blocks per SM (32 registers a thread) unless told
    // that one will do, and for 512 at 64 registers; a cached row needs the registers one block
    // leaves it (64 and 128), or it spills (fuzz seed 81,002,660: 36 bf16 elements held by each
    // of 512 threads spilled 20 bytes at 64 registers). Smaller blocks ask for an SM of
    // ROW_RESIDENT_THREADS, which ptxas otherwise leaves to the registers it happens to use.
    let bounds = match (block >= 512, cached) {
        (true, true) => format!("{block}, 1"),
        (true, false) => block.to_string(),
        (false, _) => occupancy_bounds(helpers, block, ROW_RESIDENT_THREADS),
    };
    let mut w = CodeWriter::new();
    w.open(format!(
        "extern \"C\" __global__ void __launch_bounds__({bounds}) {}({})",
        kernel.name,
        declared.join(", ")
    ));
    w.line(format!("constexpr idx_t ROWS = {};", lit(rows)));
    w.line(format!("constexpr idx_t COLS = {};", lit(cols)));

    let reductions: Vec<usize> = (0..body.values.len())
        .filter(|&id| analysis.live[id] && matches!(body.values[id].expr, Expr::Reduce { .. }))
        .collect();
    if layout.warps_per_row > 1 {
        let slots = if layout.slotted_warps() { format!("[{}]", layout.slots) } else { String::new() };
        for &id in &reductions {
            let (_, _, acc) = reduce_info(body, id);
            w.line(format!(
                "__shared__ {} red_v{id}{slots}[{}];  // one partial per warp",
                value_type(acc),
                layout.warps_per_row
            ));
        }
    }
    let mask = emit_thread_indices(&mut w, tpr, rpb);
    // A grid covers every row unless there are more rows than a grid can have blocks: then each
    // group of threads loops over rows. With partials a block takes one group of
    // `partial_rows` rows.
    let (grid, rows_repeat) = if has_partials {
        emit_partial_accumulators(&mut w, row, &layout);
        (groups as u32, true)
    } else {
        let grid = grid_for(rows.div_ceil(rpb as usize), 1, i32::MAX as u32);
        (grid, (grid as usize) * (rpb as usize) < rows)
    };
    if has_partials {
        open_partial_row_loop(&mut w, row.partial_rows, rpb, width);
    } else {
        open_row_loop(&mut w, rpb, rows_repeat, width);
    }
    let mut names: Vec<String> = (0..body.values.len()).map(value_name).collect();
    // Per-row values that need no reduction, per-row loads among them.
    emit_values(&mut w, &kernel.name, helpers, body, per_row_at(body, &analysis, 0), &mut names, |id, helpers| {
        let info = loads[id].as_ref()?;
        let at = info.row_offset.clone().unwrap_or_else(|| lit(0));
        Some(load_rhs(helpers, input_dtypes[info.slot], body.values[id].dtype, &format!("in{}[{at}]", info.slot)))
    })?;
    emit_row_offsets(&mut w, &analysis, &mut loads);

    let pass_ctx = PassContext {
        kernel: &kernel.name,
        body,
        analysis: &analysis,
        loads: &loads,
        layout: &layout,
        input_dtypes: &input_dtypes,
        output_dtypes: &output_dtypes,
        partials: &row.partials,
        prefetched: &prefetched,
        width,
    };
    for round in 1..=analysis.rounds {
        let reduced: Vec<usize> = reductions.iter().copied().filter(|&id| analysis.depth[id] == round).collect();
        if rows_repeat && round > 1 {
            w.line(HOIST_BARRIER);
        }
        pass_ctx.emit_reduction_round(&mut w, helpers, round, &reduced, &mask)?;
        emit_values(&mut w, &kernel.name, helpers, body, per_row_at(body, &analysis, round), &mut names, |_, _| None)?;
    }
    if analysis.has_element_stores && cols > 0 {
        if rows_repeat && analysis.rounds > 0 {
            w.line(HOIST_BARRIER);
        }
        w.line(format!("// pass {} of {}: element outputs", analysis.rounds + 1, analysis.rounds + 1));
        pass_ctx.emit_pass(&mut w, helpers, analysis.rounds + 1, &[])?;
    }
    emit_row_stores(&mut w, helpers, body, &analysis, &output_dtypes, &names, tpr);
    if layout.warps_per_row > 1 && analysis.rounds == 1 && rows_repeat {
        w.line(format!("{}  // the next row reuses the shared partials", layout.row_barrier()));
    }
    w.close();
    if has_partials {
        emit_partial_stores(&mut w, &mut unit.helpers, row, &layout);
    }
    w.close();

    let mut launches = Vec::new();
    if rows > 0 && (!body.stores.is_empty() || has_partials) {
        launches.push(Launch {
            entry: kernel.name.clone(),
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_bytes: 0,
            params,
        });
    }
    Ok(Emitted {
        summary: format!(
            "row kernel over {} rows of {} columns (outer {:?}, inner {:?})",
            rows, cols, row.outer, row.inner
        ),
        notes: notes(&analysis, &layout),
        width: Some(width),
        code: w.finish(),
        launches,
        scratch: Vec::new(),
        tables: Vec::new(),
    })
}

/// Where each live load reads: its row offset, its view along the row and how it is loaded.
fn plan_loads(row: &RowKernel, analysis: &RowAnalysis, vec: usize, width: IndexWidth) -> Vec<Option<LoadInfo>> {
    let outer_rank = row.outer.len();
    let lit = |n: usize| width.lit(n);
    let mut loads: Vec<Option<LoadInfo>> = Vec::new();
    for (id, value) in row.body.values.iter().enumerate() {
        let info = match &value.expr {
            Expr::Load { input, offset, strides } if analysis.live[id] => {
                let outer = merge_view(&row.outer, &strides[..outer_rank]);
                let inner = merge_view(&row.inner, &strides[outer_rank..]);
                let row_term = offset_expr(*offset, &outer, "row", width);
                let row_offset = (row_term != lit(0)).then_some(row_term);
                let row_aligned = offset % vec == 0 && outer.iter().all(|d| d.stride % vec == 0);
                let kind = match classify(0, &inner, vec) {
                    _ if vec == 1 => ElementLoad::Gather,
                    VectorAccess::Contiguous if row_aligned => ElementLoad::Vector,
                    VectorAccess::Uniform => ElementLoad::Uniform,
                    _ => ElementLoad::Gather,
                };
                Some(LoadInfo { slot: *input, row_offset, row_var: None, inner, kind })
            }
            _ => None,
        };
        loads.push(info);
    }
    loads
}

/// Registers a thread may hold across a pass boundary in cached arrays, prefetched raw vectors
/// and partial accumulators together for a prefetch to be taken: under the occupancy hint's 64
/// (see [`ROW_RESIDENT_THREADS`]) that leaves 24 for addresses, accumulators and the pass's own
/// values. gpt2_step's f32 layer norm backward rows (three cached arrays of 8 and 16 partial
/// accumulators) spilled with 8 more registers of prefetch, even left to ptxas.
const PREFETCH_REGISTER_BUDGET: usize = 40;

/// Element loads that pass 1 issues for a later pass, which only widens them: streamed
/// (row-dependent) vector loads of cached rows that no pass before theirs reads. Without this a
/// residual added after a norm waits one memory latency of its own after the reductions; so
/// loaded, its latency hides behind the first pass's. Values are taken in body order while the
/// registers held across every pass boundary fit [`PREFETCH_REGISTER_BUDGET`].
fn plan_prefetches(
    row: &RowKernel,
    analysis: &RowAnalysis,
    loads: &[Option<LoadInfo>],
    layout: &Layout,
    input_dtypes: &[DType],
) -> Vec<bool> {
    let mut prefetched = vec![false; loads.len()];
    if !layout.cached || analysis.rounds == 0 || layout.chunks == 0 || layout.threads_per_row >= 1024 {
        return prefetched;
    }
    let held = layout.chunks * layout.vec;
    let partials =
        if row.partials.is_empty() { 0 } else { partial_accumulators(row, layout.threads_per_row, layout.vec) };
    // Registers held across the boundary after pass `b` (1..=rounds).
    let mut across: Vec<usize> = (0..=analysis.rounds)
        .map(|b| {
            let arrays = (0..analysis.cached.len())
                .filter(|&id| {
                    analysis.cached[id] && analysis.needed[id][0] <= b && b < *analysis.needed[id].last().unwrap()
                })
                .count();
            arrays * held + partials
        })
        .collect();
    for (id, info) in loads.iter().enumerate() {
        let Some(info) = info else { continue };
        let later_only = analysis.needed[id].len() == 1 && analysis.needed[id][0] >= 2;
        let streamed = info.row_offset.is_some() && matches!(info.kind, ElementLoad::Vector);
        if analysis.per_row[id] || analysis.cached[id] || !later_only || !streamed {
            continue;
        }
        let (accesses, _, registers) = crate::vector::raw_accesses(input_dtypes[info.slot], layout.vec);
        let cost = layout.chunks * accesses * registers;
        // Held from pass 1 until the pass that widens it.
        let spans = 1..analysis.needed[id][0];
        if spans.clone().all(|b| across[b] + cost <= PREFETCH_REGISTER_BUDGET) {
            spans.for_each(|b| across[b] += cost);
            prefetched[id] = true;
        }
    }
    prefetched
}

/// A reduction's op, operand dtype and accumulator dtype.
fn reduce_info(body: &Body, id: usize) -> (ReduceOp, DType, DType) {
    match body.values[id].expr {
        Expr::Reduce { op, x } => {
            let operand = body.values[x.0].dtype;
            (op, operand, accumulator_dtype(op, operand))
        }
        _ => unreachable!("only reductions are listed"),
    }
}

/// Live per-row values at reduction depth `depth`, reductions excepted.
fn per_row_at(body: &Body, analysis: &RowAnalysis, depth: usize) -> Vec<usize> {
    (0..body.values.len())
        .filter(|&id| {
            analysis.live[id]
                && analysis.per_row[id]
                && analysis.depth[id] == depth
                && !matches!(body.values[id].expr, Expr::Reduce { .. })
        })
        .collect()
}

/// Declares the thread's place in its row (`t`, `lane`, `warp`, `group`); returns the shuffle mask
/// of the row's lanes (empty for one thread per row).
fn emit_thread_indices(w: &mut CodeWriter, tpr: u32, rpb: u32) -> String {
    if tpr > 32 {
        if rpb > 1 {
            w.line(format!("// {tpr} threads cooperate on each row, {rpb} rows per block"));
            w.line(format!("const unsigned t = threadIdx.x % {tpr}u;"));
            w.line(format!("const unsigned group = threadIdx.x / {tpr}u;"));
        } else {
            w.line(format!("// the {tpr} threads of the block cooperate on one row"));
            w.line("const unsigned t = threadIdx.x;");
        }
        w.line("const unsigned lane = threadIdx.x & 31u;");
        // `t` is the thread's place in its row: the row's warps count from 0.
        w.line(if rpb > 1 { "const unsigned warp = t >> 5;" } else { "const unsigned warp = threadIdx.x >> 5;" });
    } else if tpr > 1 {
        w.line(format!("// {tpr} threads cooperate on each row, {rpb} row(s) per block"));
        if rpb > 1 {
            w.line(format!("const unsigned t = threadIdx.x % {tpr}u;"));
            w.line(format!("const unsigned group = threadIdx.x / {tpr}u;"));
        } else {
            w.line("const unsigned t = threadIdx.x;");
        }
    } else {
        w.line(format!("// one thread per row, {rpb} rows per block"));
        w.line("const unsigned group = threadIdx.x;");
    }
    if tpr >= 32 {
        "0xffffffffu".to_string()
    } else if tpr > 1 {
        w.line(format!(
            "const unsigned group_mask = ((1u << {tpr}u) - 1u) << (threadIdx.x & {}u);  // this row's lanes",
            32 - tpr
        ));
        "group_mask".to_string()
    } else {
        String::new()
    }
}

/// Opens the scope of one row: a loop over rows when the grid cannot cover them all, else a
/// bounds check.
fn open_row_loop(w: &mut CodeWriter, rpb: u32, rows_repeat: bool, width: IndexWidth) {
    let first_row = if rpb == 1 {
        "(idx_t)blockIdx.x".to_string()
    } else {
        format!("(idx_t)blockIdx.x * {} + group", width.lit(rpb as usize))
    };
    if rows_repeat {
        let row_step = if rpb == 1 {
            "(idx_t)gridDim.x".to_string()
        } else {
            format!("(idx_t)gridDim.x * {}", width.lit(rpb as usize))
        };
        w.open(format!("for (idx_t row = {first_row}; row < ROWS; row += {row_step})"));
    } else {
        // One row per group: no loop, so nothing row-invariant gets hoisted into registers.
        w.line(format!("const idx_t row = {first_row};"));
        w.open("if (row < ROWS)");
    }
}

/// Declares each partial's accumulators (a thread's elements of the row, in registers, across
/// the block's rows), at their identities.
fn emit_partial_accumulators(w: &mut CodeWriter, row: &RowKernel, layout: &Layout) {
    let held = layout.chunks * layout.vec;
    for (k, p) in row.partials.iter().enumerate() {
        let operand = row.body.values[p.value.0].dtype;
        w.line(format!("float pacc{k}[{held}];  // partial {} of v{} over this block's rows", p.op.name(), p.value.0));
        w.line("#pragma unroll");
        w.line(format!(
            "for (unsigned i = 0u; i < {held}u; ++i) pacc{k}[i] = {};",
            crate::reduce::identity(p.op, operand, DType::F32)
        ));
    }
}

/// Opens the loop over one group of `partial_rows` rows: block `b` takes rows `b *
/// partial_rows ..`, its `rpb` groups of threads a row at a time.
fn open_partial_row_loop(w: &mut CodeWriter, partial_rows: usize, rpb: u32, width: IndexWidth) {
    w.line(format!("const idx_t row_begin = (idx_t)blockIdx.x * {};", width.lit(partial_rows)));
    w.line(format!("const idx_t row_end = row_begin + {0} < ROWS ? row_begin + {0} : ROWS;", width.lit(partial_rows)));
    let (first, step) = if rpb == 1 {
        ("row_begin".to_string(), width.lit(1))
    } else {
        ("row_begin + group".to_string(), width.lit(rpb as usize))
    };
    w.open(format!("for (idx_t row = {first}; row < row_end; row += {step})"));
}

/// After a block's rows: its groups of threads fold their partials in group order through one
/// row of shared memory, then the first group writes the block's row of each partial.
fn emit_partial_stores(w: &mut CodeWriter, helpers: &mut Helpers, row: &RowKernel, layout: &Layout) {
    let (tpr, vec, rpb) = (layout.threads_per_row, layout.vec, layout.slots);
    let t = if tpr > 1 { "t" } else { "0u" };
    // `line` runs for each of the thread's columns `col` of the row, accumulator `i`.
    let each_column = |w: &mut CodeWriter, line: &str| {
        w.line("#pragma unroll");
        w.open(format!("for (unsigned c = 0u; c < {}u; ++c)", layout.chunks));
        w.line("#pragma unroll");
        w.open(format!("for (unsigned u = 0u; u < {vec}u; ++u)"));
        w.line(format!("const unsigned i = c * {vec}u + u;"));
        w.line(format!("const idx_t col = (idx_t)(c * {tpr}u + {t}) * {vec}u + u;"));
        w.line(format!("if (col < COLS) {line}"));
        w.close();
        w.close();
    };
    if rpb > 1 {
        w.line(format!("// the block's {rpb} row groups fold their partials in group order"));
        w.line("__shared__ float partial_row[COLS];");
        for (k, p) in row.partials.iter().enumerate() {
            let folded = combine(helpers, p.op, DType::F32, &format!("pacc{k}[i]"), "partial_row[col]");
            w.open(format!("for (unsigned g = 1u; g < {rpb}u; ++g)"));
            w.open("if (group == g)");
            each_column(w, &format!("partial_row[col] = pacc{k}[i];"));
            w.close();
            w.line("__syncthreads();");
            w.open("if (group == 0u)");
            each_column(w, &format!("pacc{k}[i] = {folded};"));
            w.close();
            w.line("__syncthreads();");
            w.close();
        }
        w.open("if (group == 0u)");
    }
    for (k, p) in row.partials.iter().enumerate() {
        each_column(w, &format!("out{}[(idx_t)blockIdx.x * COLS + col] = pacc{k}[i];", p.output));
    }
    if rpb > 1 {
        w.close();
    }
}

/// Row offsets of element loads, one variable per distinct offset.
fn emit_row_offsets(w: &mut CodeWriter, analysis: &RowAnalysis, loads: &mut [Option<LoadInfo>]) {
    let mut row_vars: Vec<(String, String)> = Vec::new();
    for (id, info) in loads.iter_mut().enumerate() {
        if analysis.per_row[id] {
            continue;
        }
        let Some(info) = info.as_mut() else { continue };
        let Some(row_offset) = &info.row_offset else { continue };
        let var = match row_vars.iter().find(|(expr, _)| expr == row_offset) {
            Some((_, var)) => var.clone(),
            None => {
                let var = format!("v{id}_row");
                w.line(format!("const idx_t {var} = {row_offset};"));
                row_vars.push((row_offset.clone(), var.clone()));
                var
            }
        };
        info.row_var = Some(var);
    }
}

/// Stores of per-row values, by the row's first thread.
fn emit_row_stores(
    w: &mut CodeWriter,
    helpers: &mut Helpers,
    body: &Body,
    analysis: &RowAnalysis,
    output_dtypes: &[DType],
    names: &[String],
    tpr: u32,
) {
    let row_stores: Vec<_> = body.stores.iter().filter(|s| analysis.per_row[s.value.0]).collect();
    if row_stores.is_empty() {
        return;
    }
    if tpr > 1 {
        w.open("if (t == 0u)");
    }
    for store in row_stores {
        let value = cast(helpers, body.values[store.value.0].dtype, output_dtypes[store.output], &names[store.value.0]);
        w.line(format!("out{}[row] = {};", store.output, narrow(output_dtypes[store.output], &value)));
    }
    if tpr > 1 {
        w.close();
    }
}

/// What `braze kernels` says about the kernel's passes and caching.
fn notes(analysis: &RowAnalysis, layout: &Layout) -> Vec<String> {
    let mut notes = vec![format!(
        "{} reduction pass(es); {} elements per thread and chunk; {}",
        analysis.rounds,
        layout.vec,
        if layout.cached {
            format!("{} chunk(s) per thread held in registers", layout.chunks)
        } else {
            "every pass re-reads its inputs".to_string()
        }
    )];
    let cached_values: Vec<String> =
        (0..analysis.cached.len()).filter(|&id| analysis.cached[id]).map(|id| format!("v{id}")).collect();
    if !cached_values.is_empty() {
        notes.push(format!("in registers across passes: {}", cached_values.join(", ")));
    }
    notes
}
