//! Row kernels: `threads_per_row` threads (part of a warp, a warp, or a whole block) cooperate on
//! one row. The body runs in passes: pass `p` evaluates the element values that the reductions
//! of depth `p` need and reduces them (warp butterfly, then the warps' partials in warp order
//! through shared memory: deterministic), a final pass computes and stores the element outputs.
//!
//! With `cached`, each thread keeps its elements of every value that a later pass needs in
//! fixed-size register arrays (indexed by compile-time constants in unrolled loops), so a chain
//! of dependent reductions (16 layer norms) reads its inputs once. Without it every pass re-reads
//! and recomputes what it needs, which suits rows too long for registers.

use crate::body::{check_body, declare, emit_values, live_values, users, value_name, BodyRules};
use crate::cuda::{cast, narrow, value_type, Helpers};
use crate::error::{invalid_config, Result};
use crate::index::{classify, merge_view, offset_expr, IndexWidth, VectorAccess, ViewDim};
use crate::reduce::{accumulate, accumulator_dtype, butterfly, declare_accumulator, finalize};
use crate::vector::{emit_vector_load, emit_vector_store, load_rhs};
use crate::writer::CodeWriter;
use crate::{grid_for, Emitted, Launch, Unit};
use braze_ir::{DType, ReduceOp};
use braze_plan::{Body, Expr, RowKernel};

/// A compiler-only barrier: keeps a pass's loads from being hoisted out of the row loop into
/// registers held across every pass (which spills chained layers).
const HOIST_BARRIER: &str =
    "asm volatile(\"\" ::: \"memory\");  // keep later passes' loads out of registers until needed";

/// Most elements of one value a thread may keep in registers.
pub(crate) const MAX_CACHED_PER_THREAD: usize = 64;

/// Which values are per row, how deep in reductions each value is, and in which passes each
/// element value is needed.
pub(crate) struct RowAnalysis {
    pub(crate) per_row: Vec<bool>,
    /// Reductions on the longest path to the value (a reduction counts itself).
    pub(crate) depth: Vec<usize>,
    /// Passes that reduce (1..=rounds); pass `rounds + 1` stores element outputs.
    pub(crate) rounds: usize,
    pub(crate) live: Vec<bool>,
    /// For element values: the passes that evaluate them, ascending.
    pub(crate) needed: Vec<Vec<usize>>,
    /// Element values kept in registers from their first pass on.
    pub(crate) cached: Vec<bool>,
    pub(crate) has_element_stores: bool,
}

impl RowAnalysis {
    pub(crate) fn new(body: &Body, outer_rank: usize, cached_mode: bool) -> RowAnalysis {
        let n = body.values.len();
        let per_row = body.row_values(outer_rank);
        let live = live_values(body, body.stores.iter().map(|s| s.value));
        let mut depth = vec![0; n];
        for (id, value) in body.values.iter().enumerate() {
            let deepest = value.expr.operands().iter().map(|o| depth[o.0]).max().unwrap_or(0);
            depth[id] = if matches!(value.expr, Expr::Reduce { .. }) { deepest + 1 } else { deepest };
        }
        let rounds = (0..n)
            .filter(|&id| live[id] && matches!(body.values[id].expr, Expr::Reduce { .. }))
            .map(|id| depth[id])
            .max()
            .unwrap_or(0);
        let final_pass = rounds + 1;
        let users = users(body);
        let mut stored_elements = vec![false; n];
        for store in &body.stores {
            if !per_row[store.value.0] {
                stored_elements[store.value.0] = true;
            }
        }
        let mut needed: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut cached = vec![false; n];
        for id in (0..n).rev() {
            if !live[id] || per_row[id] {
                continue;
            }
            let mut passes = Vec::new();
            if stored_elements[id] {
                passes.push(final_pass);
            }
            for &user in &users[id] {
                if !live[user] {
                    continue;
                }
                if matches!(body.values[user].expr, Expr::Reduce { .. }) {
                    passes.push(depth[user]);
                } else if !per_row[user] {
                    if cached[user] {
                        passes.push(needed[user][0]);
                    } else {
                        passes.extend(&needed[user]);
                    }
                }
            }
            passes.sort();
            passes.dedup();
            cached[id] = cached_mode && passes.len() >= 2;
            needed[id] = passes;
        }
        RowAnalysis {
            per_row,
            depth,
            rounds,
            live,
            needed,
            cached,
            has_element_stores: stored_elements.iter().any(|&s| s),
        }
    }

    /// Most cached arrays alive at once (between two passes): the register pressure of caching.
    pub(crate) fn peak_cached_arrays(&self) -> usize {
        (1..=self.rounds + 1)
            .map(|boundary| {
                (0..self.cached.len())
                    .filter(|&id| {
                        self.cached[id]
                            && self.needed[id][0] <= boundary
                            && boundary <= *self.needed[id].last().unwrap()
                    })
                    .count()
            })
            .max()
            .unwrap_or(0)
    }
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
}

fn check_config(unit: &Unit<'_>, tpr: u32, rpb: u32) -> Result<()> {
    if !tpr.is_power_of_two() || tpr > 1024 {
        return Err(invalid_config(unit.name(), format!("threads_per_row {tpr} is not a power of two up to 1024")));
    }
    if rpb == 0 || (tpr > 32 && rpb != 1) {
        return Err(invalid_config(
            unit.name(),
            format!("rows_per_block {rpb}: must be 1 when a row spans several warps, else at least 1"),
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
    let analysis = RowAnalysis::new(body, outer_rank, cached);
    let input_dtypes: Vec<DType> = (0..kernel.inputs.len()).map(|slot| unit.input_dtype(slot)).collect();
    let output_dtypes: Vec<DType> = (0..kernel.outputs.len()).map(|slot| unit.output_dtype(slot)).collect();

    // Where each live load reads.
    let mut loads: Vec<Option<LoadInfo>> = Vec::new();
    for (id, value) in body.values.iter().enumerate() {
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
    let (declared, params) = unit.buffer_params();
    let helpers = &mut unit.helpers;
    let block = tpr * rpb;
    // For 1024-thread blocks ptxas aims at two blocks per SM (32 registers a thread) unless told
    // that one will do; a cached row needs the 64 registers one block leaves it, or it spills.
    let bounds = if block == 1024 && cached { format!("{block}, 1") } else { block.to_string() };
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
    // A reduction's op and accumulator dtype.
    let reduce_info = |id: usize| -> (ReduceOp, DType) {
        match body.values[id].expr {
            Expr::Reduce { op, x } => (op, accumulator_dtype(op, body.values[x.0].dtype)),
            _ => unreachable!("only reductions are listed"),
        }
    };
    if layout.warps_per_row > 1 {
        for &id in &reductions {
            let (_, acc) = reduce_info(id);
            w.line(format!(
                "__shared__ {} red_v{id}[{}];  // one partial per warp",
                value_type(acc),
                layout.warps_per_row
            ));
        }
    }
    if tpr > 32 {
        w.line(format!("// the {tpr} threads of the block cooperate on one row"));
        w.line("const unsigned t = threadIdx.x;");
        w.line("const unsigned lane = threadIdx.x & 31u;");
        w.line("const unsigned warp = threadIdx.x >> 5;");
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
    let mask = if tpr >= 32 {
        "0xffffffffu".to_string()
    } else if tpr > 1 {
        w.line(format!(
            "const unsigned group_mask = ((1u << {tpr}u) - 1u) << (threadIdx.x & {}u);  // this row's lanes",
            32 - tpr
        ));
        "group_mask".to_string()
    } else {
        String::new()
    };
    // A grid covers every row unless there are more rows than a grid can have blocks: then each
    // group of threads loops over rows.
    let grid = grid_for(rows.div_ceil(rpb as usize), 1, i32::MAX as u32);
    let rows_repeat = (grid as usize) * (rpb as usize) < rows;
    let first_row = if rpb == 1 {
        "(idx_t)blockIdx.x".to_string()
    } else {
        format!("(idx_t)blockIdx.x * {} + group", lit(rpb as usize))
    };
    if rows_repeat {
        let row_step =
            if rpb == 1 { "(idx_t)gridDim.x".to_string() } else { format!("(idx_t)gridDim.x * {}", lit(rpb as usize)) };
        w.open(format!("for (idx_t row = {first_row}; row < ROWS; row += {row_step})"));
    } else {
        // One row per group: no loop, so nothing row-invariant gets hoisted into registers.
        w.line(format!("const idx_t row = {first_row};"));
        w.open("if (row < ROWS)");
    }
    let ids = 0..body.values.len();
    let per_row_at = |depth: usize| -> Vec<usize> {
        ids.clone()
            .filter(|&id| {
                analysis.live[id]
                    && analysis.per_row[id]
                    && analysis.depth[id] == depth
                    && !matches!(body.values[id].expr, Expr::Reduce { .. })
            })
            .collect()
    };
    let mut names: Vec<String> = ids.clone().map(value_name).collect();
    // Per-row values that need no reduction, per-row loads among them.
    emit_values(&mut w, &kernel.name, helpers, body, per_row_at(0), &mut names, |id, helpers| {
        let info = loads[id].as_ref()?;
        let at = info.row_offset.clone().unwrap_or_else(|| lit(0));
        Some(load_rhs(helpers, input_dtypes[info.slot], body.values[id].dtype, &format!("in{}[{at}]", info.slot)))
    })?;
    // Row offsets of element loads, one variable per distinct offset.
    let mut row_vars: Vec<(String, String)> = Vec::new();
    for id in ids.clone() {
        if analysis.per_row[id] {
            continue;
        }
        let Some(info) = loads[id].as_mut() else { continue };
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

    let pass_ctx = PassContext {
        kernel: &kernel.name,
        body,
        analysis: &analysis,
        loads: &loads,
        layout: &layout,
        input_dtypes: &input_dtypes,
        output_dtypes: &output_dtypes,
        width,
    };
    for round in 1..=analysis.rounds {
        let reduced: Vec<usize> = reductions.iter().copied().filter(|&id| analysis.depth[id] == round).collect();
        let list: Vec<String> = reduced.iter().map(|id| format!("v{id}")).collect();
        if rows_repeat && round > 1 {
            w.line(HOIST_BARRIER);
        }
        w.line(format!(
            "// pass {round} of {}: reduce {}",
            analysis.rounds + analysis.has_element_stores as usize,
            list.join(", ")
        ));
        let accumulators: Vec<(String, ReduceOp, DType)> = reduced
            .iter()
            .map(|&id| {
                let (op, acc) = reduce_info(id);
                (format!("acc_v{id}"), op, acc)
            })
            .collect();
        for (name, op, acc) in &accumulators {
            w.line(declare_accumulator(*op, *acc, name));
        }
        pass_ctx.emit_pass(&mut w, helpers, round, &reduced)?;
        if tpr > 1 {
            let how = if layout.warps_per_row > 1 {
                format!("butterfly within each warp, then the {} warp partials in warp order", layout.warps_per_row)
            } else {
                format!("butterfly over the row's {tpr} lanes")
            };
            w.line(format!("// combine across the row's threads: {how}"));
            butterfly(&mut w, helpers, &accumulators, tpr.min(32), &mask);
        }
        if layout.warps_per_row > 1 {
            w.open("if (lane == 0u)");
            for &id in &reduced {
                w.line(format!("red_v{id}[warp] = acc_v{id};"));
            }
            w.close();
            w.line("__syncthreads();");
            for (&id, (name, op, acc)) in reduced.iter().zip(&accumulators) {
                w.line(format!("{name} = red_v{id}[0];"));
                w.line("#pragma unroll");
                w.open(format!("for (unsigned w = 1u; w < {}u; ++w)", layout.warps_per_row));
                w.line(format!(
                    "{name} = {};",
                    crate::reduce::combine(helpers, *op, *acc, name, &format!("red_v{id}[w]"))
                ));
                w.close();
            }
        }
        for (&id, (name, op, acc)) in reduced.iter().zip(&accumulators) {
            let value = finalize(helpers, *op, *acc, name, "COLS", body.values[id].dtype);
            w.line(declare(body, id, &value));
        }
        emit_values(&mut w, &kernel.name, helpers, body, per_row_at(round), &mut names, |_, _| None)?;
    }
    if analysis.has_element_stores && cols > 0 {
        if rows_repeat && analysis.rounds > 0 {
            w.line(HOIST_BARRIER);
        }
        w.line(format!("// pass {} of {}: element outputs", analysis.rounds + 1, analysis.rounds + 1));
        pass_ctx.emit_pass(&mut w, helpers, analysis.rounds + 1, &[])?;
    }
    let row_stores: Vec<_> = body.stores.iter().filter(|s| analysis.per_row[s.value.0]).collect();
    if !row_stores.is_empty() {
        if tpr > 1 {
            w.open("if (t == 0u)");
        }
        for store in row_stores {
            let value =
                cast(helpers, body.values[store.value.0].dtype, output_dtypes[store.output], &names[store.value.0]);
            w.line(format!("out{}[row] = {};", store.output, narrow(output_dtypes[store.output], &value)));
        }
        if tpr > 1 {
            w.close();
        }
    }
    if layout.warps_per_row > 1 && analysis.rounds == 1 && rows_repeat {
        w.line("__syncthreads();  // the next row reuses the shared partials");
    }
    w.close();
    w.close();

    let mut launches = Vec::new();
    if rows > 0 && !body.stores.is_empty() {
        launches.push(Launch {
            entry: kernel.name.clone(),
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_bytes: 0,
            params,
        });
    }
    let mut notes = vec![format!(
        "{} reduction pass(es); {} elements per thread and chunk; {}",
        analysis.rounds,
        vec,
        if cached {
            format!("{} chunk(s) per thread held in registers", layout.chunks)
        } else {
            "every pass re-reads its inputs".to_string()
        }
    )];
    let cached_values: Vec<String> = ids.clone().filter(|&id| analysis.cached[id]).map(|id| format!("v{id}")).collect();
    if !cached_values.is_empty() {
        notes.push(format!("in registers across passes: {}", cached_values.join(", ")));
    }
    Ok(Emitted {
        summary: format!(
            "row kernel over {} rows of {} columns (outer {:?}, inner {:?})",
            rows, cols, row.outer, row.inner
        ),
        notes,
        width: Some(width),
        code: w.finish(),
        launches,
        scratch: Vec::new(),
        tables: Vec::new(),
    })
}

struct PassContext<'a> {
    kernel: &'a str,
    body: &'a Body,
    analysis: &'a RowAnalysis,
    loads: &'a [Option<LoadInfo>],
    layout: &'a Layout,
    input_dtypes: &'a [DType],
    output_dtypes: &'a [DType],
    width: IndexWidth,
}

impl PassContext<'_> {
    /// One pass over the thread's columns of the row: evaluates the element values pass `pass`
    /// needs, accumulates the reductions `reduced`, and in the final pass stores element outputs.
    fn emit_pass(&self, w: &mut CodeWriter, helpers: &mut Helpers, pass: usize, reduced: &[usize]) -> Result<()> {
        let (body, analysis, layout, width) = (self.body, self.analysis, self.layout, self.width);
        if layout.chunks == 0 {
            // An empty row: accumulators keep their identities.
            return Ok(());
        }
        let lit = |n: usize| width.lit(n);
        let vec = layout.vec;
        let final_pass = pass == analysis.rounds + 1;
        let values: Vec<usize> = (0..body.values.len())
            .filter(|&id| analysis.live[id] && !analysis.per_row[id] && analysis.needed[id].contains(&pass))
            .collect();
        let first_pass_of = |id: usize| analysis.needed[id][0];
        // Cached values first computed in this pass get their arrays now, at row scope.
        for &id in &values {
            if analysis.cached[id] && first_pass_of(id) == pass {
                w.line(format!("{} v{id}_c[{}];", value_type(body.values[id].dtype), layout.chunks * vec));
            }
        }
        let fresh = |id: usize| !(analysis.cached[id] && first_pass_of(id) != pass);
        // Whether the pass touches memory (else it runs from registers and needs no column).
        let touches_memory = final_pass || values.iter().any(|&id| fresh(id) && self.loads[id].is_some());
        let tpr = layout.threads_per_row;
        if layout.cached {
            w.line("#pragma unroll");
            w.open(format!("for (unsigned c = 0u; c < {}u; ++c)", layout.chunks));
            if touches_memory || layout.partial {
                let chunk_start = if tpr > 1 { format!("(c * {tpr}u + t)") } else { "c".to_string() };
                w.line(format!("const idx_t col0 = (idx_t){chunk_start} * {};", lit(vec)));
            }
            if layout.partial {
                w.open("if (col0 < COLS)");
            }
        } else {
            let start = if tpr > 1 { format!("(idx_t)t * {}", lit(vec)) } else { lit(0) };
            w.line("#pragma unroll 4");
            w.open(format!("for (idx_t col0 = {start}; col0 < COLS; col0 += {})", lit(tpr * vec)));
        }
        let slot = if vec == 1 { "c".to_string() } else { format!("c * {vec}u + u") };
        let slot_base = if vec == 1 { "c".to_string() } else { format!("c * {vec}u") };
        // Loads this pass computes: vector ones before the element loop, into the cache array
        // when the value is cached.
        let mut gathers = false;
        for &id in &values {
            let Some(info) = self.loads[id].as_ref() else { continue };
            if !fresh(id) {
                continue;
            }
            let dtype = self.input_dtypes[info.slot];
            let col_offset = offset_expr(0, &info.inner, "col0", width);
            let offset = match &info.row_var {
                Some(var) => format!("{var} + {col_offset}"),
                None => col_offset,
            };
            match info.kind {
                ElementLoad::Vector => {
                    let pointer = format!("in{}", info.slot);
                    if analysis.cached[id] && dtype == body.values[id].dtype {
                        emit_vector_load(
                            w,
                            helpers,
                            dtype,
                            &pointer,
                            &offset,
                            &format!("v{id}_c"),
                            &slot_base,
                            vec,
                            width,
                        );
                    } else {
                        w.line(format!("{} v{id}_l[{vec}];", value_type(dtype)));
                        emit_vector_load(w, helpers, dtype, &pointer, &offset, &format!("v{id}_l"), "", vec, width);
                    }
                }
                ElementLoad::Uniform => {
                    let rhs = load_rhs(helpers, dtype, body.values[id].dtype, &format!("in{}[{offset}]", info.slot));
                    w.line(format!("const {} v{id}_u = {rhs};", value_type(body.values[id].dtype)));
                }
                ElementLoad::Gather => gathers = true,
            }
        }
        let stores: Vec<_> =
            if final_pass { body.stores.iter().filter(|s| !analysis.per_row[s.value.0]).collect() } else { Vec::new() };
        let mut stored_slots: Vec<usize> = stores.iter().map(|s| s.output).collect();
        stored_slots.sort();
        stored_slots.dedup();
        for &out in &stored_slots {
            w.line(format!("{} st{out}[{vec}];", value_type(self.output_dtypes[out])));
        }
        w.line("#pragma unroll");
        w.open(format!("for (unsigned u = 0u; u < {vec}u; ++u)"));
        if gathers {
            w.line("const idx_t col = col0 + u;");
        }
        let mut names: Vec<String> = (0..body.values.len()).map(value_name).collect();
        let slot_ref = slot.clone();
        emit_values(w, self.kernel, helpers, body, values.iter().copied(), &mut names, |id, helpers| {
            if !fresh(id) {
                return Some(format!("v{id}_c[{slot_ref}]"));
            }
            let info = self.loads[id].as_ref()?;
            let dtype = self.input_dtypes[info.slot];
            let value_dtype = body.values[id].dtype;
            Some(match info.kind {
                ElementLoad::Vector if analysis.cached[id] && dtype == value_dtype => format!("v{id}_c[{slot_ref}]"),
                ElementLoad::Vector => cast(helpers, dtype, value_dtype, &format!("v{id}_l[u]")),
                ElementLoad::Uniform => format!("v{id}_u"),
                ElementLoad::Gather => {
                    let col_offset = offset_expr(0, &info.inner, "col", width);
                    let offset = match &info.row_var {
                        Some(var) => format!("{var} + {col_offset}"),
                        None => col_offset,
                    };
                    load_rhs(helpers, dtype, value_dtype, &format!("in{}[{offset}]", info.slot))
                }
            })
        })?;
        for &id in &values {
            let loaded_in_place = matches!(self.loads[id].as_ref().map(|l| &l.kind), Some(ElementLoad::Vector))
                && self.input_dtypes[self.loads[id].as_ref().unwrap().slot] == body.values[id].dtype;
            if analysis.cached[id] && first_pass_of(id) == pass && !loaded_in_place {
                w.line(format!("v{id}_c[{slot}] = v{id};"));
            }
        }
        for &id in reduced {
            let Expr::Reduce { op, x } = body.values[id].expr else { unreachable!() };
            let acc = accumulator_dtype(op, body.values[x.0].dtype);
            w.line(accumulate(helpers, op, acc, &format!("acc_v{id}"), &names[x.0], body.values[x.0].dtype));
        }
        for store in &stores {
            let value = cast(
                helpers,
                body.values[store.value.0].dtype,
                self.output_dtypes[store.output],
                &names[store.value.0],
            );
            w.line(format!("st{}[u] = {value};", store.output));
        }
        w.close();
        for &out in &stored_slots {
            emit_vector_store(
                w,
                helpers,
                self.output_dtypes[out],
                &format!("out{out}"),
                "row * COLS + col0",
                &format!("st{out}"),
                vec,
                width,
            );
        }
        if layout.cached && layout.partial {
            w.close();
        }
        w.close();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braze_ir::BinaryOp;

    #[test]
    fn layer_norm_caches_the_input_and_the_centred_values() {
        // mean = sum(x) * c; d = x - mean; var = sum(d * d) * c; y = d * var
        let mut body = Body::default();
        let x = body.push(Expr::Load { input: 0, offset: 0, strides: vec![8, 1] }, DType::F32);
        let s = body.push(Expr::Reduce { op: ReduceOp::Sum, x }, DType::F32);
        let c = body.push(Expr::Const { value: 0.125 }, DType::F32);
        let mean = body.push(Expr::Binary { op: BinaryOp::Mul, a: s, b: c }, DType::F32);
        let d = body.push(Expr::Binary { op: BinaryOp::Sub, a: x, b: mean }, DType::F32);
        let dd = body.push(Expr::Binary { op: BinaryOp::Mul, a: d, b: d }, DType::F32);
        let v = body.push(Expr::Reduce { op: ReduceOp::Sum, x: dd }, DType::F32);
        let y = body.push(Expr::Binary { op: BinaryOp::Mul, a: d, b: v }, DType::F32);
        body.stores.push(braze_plan::Store { value: y, output: 0 });
        let a = RowAnalysis::new(&body, 1, true);
        assert_eq!(a.rounds, 2);
        assert_eq!(a.needed[x.0], vec![1, 2]);
        assert_eq!(a.needed[d.0], vec![2, 3]);
        assert!(a.cached[x.0] && a.cached[d.0] && !a.cached[dd.0] && !a.cached[y.0]);
        assert_eq!(a.peak_cached_arrays(), 2);
        let uncached = RowAnalysis::new(&body, 1, false);
        assert_eq!(uncached.needed[x.0], vec![1, 2, 3]);
        assert!(!uncached.cached.iter().any(|&c| c));
    }
}
