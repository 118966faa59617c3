//! Column kernels: reductions over leading axes, `out[c] = epilogue(reduce_r prologue(r, c))`.
//!
//! A block is `col_threads x row_threads` threads over a tile of `col_threads * vec` columns:
//! threads side by side take `vec` consecutive columns each, so a warp reads a row's columns
//! coalesced (16-byte vector loads where the data is contiguous and aligned); the block's
//! `row_threads` rows of threads step down one chunk of `rows_per_block` rows. The grid is column
//! tiles x row chunks. Inside a block the row threads' partials are combined through shared
//! memory in a fixed pairwise tree; with one chunk the block runs the epilogue and stores. With
//! several, each block writes its partials to scratch, and the block that arrives last at a
//! column tile (an integer counter in zeroed scratch, reset by that block) combines the tile's
//! chunk partials in chunk order. Every step has a fixed order, so the same config gives the same
//! bits on every run; no float atomics.

use crate::body::{check_body, emit_values, live_values, value_name, BodyRules};
use crate::cuda::{cast, narrow, value_type, Helpers};
use crate::error::{invalid_config, malformed, Result};
use crate::index::{classify, merge_view, offset_expr, IndexWidth, VectorAccess, ViewDim};
use crate::reduce::{accumulate, accumulator_dtype, combine, finalize, identity};
use crate::vector::{emit_vector_load, load_rhs};
use crate::writer::CodeWriter;
use crate::{Emitted, Launch, Param, ScratchSpec, Unit};
use braze_ir::{DType, ReduceOp};
use braze_plan::{ColumnKernel, Expr};

/// Most row chunks (the grid's y extent).
const MAX_CHUNKS: usize = 65_535;
/// Static shared memory a block may use for its row threads' partials and tile totals (48 KiB,
/// less room for the few flags beside them).
const SHARED_LIMIT: usize = 48 * 1024 - 64;
/// Blocks each SM keeps resident (the launch bounds' minimum): the grid is sized in waves of them.
pub(crate) const BLOCKS_PER_SM: usize = 2;

/// A load of another block's partial at `ptr`, through L2 (`__ldcg`: the partials were written
/// after this SM may have cached the lines); a volatile read where `__ldcg` has no overload.
fn partial_load(acc: DType, ptr: &str) -> String {
    match acc {
        DType::F32 | DType::I32 | DType::I64 => format!("__ldcg({ptr})"),
        _ => format!("*(const volatile {}*)({ptr})", value_type(acc)),
    }
}

/// The widest vector of columns per thread (at most 16 bytes of the narrowest element the rows
/// stream, at most 8) that divides the columns.
pub(crate) fn vector_width(unit: &Unit<'_>, col: &ColumnKernel) -> usize {
    let per_column = col.body.column_values(col.reduced.len());
    let mut narrowest = 4;
    for (id, value) in col.body.values.iter().enumerate() {
        if let Expr::Load { input, .. } = value.expr {
            if !per_column[id] && input < unit.kernel.inputs.len() {
                narrowest = narrowest.min(unit.input_dtype(input).size_bytes());
            }
        }
    }
    let mut vec = (16 / narrowest).min(8);
    while vec > 1 && !col.cols().is_multiple_of(vec) {
        vec /= 2;
    }
    vec
}

/// Columns of a tile one thread folds in the combining step: four (one 16-byte load of f32
/// partials) where the tile's columns allow.
fn fold_columns(tile_cols: usize) -> usize {
    if tile_cols.is_multiple_of(4) {
        4
    } else {
        1
    }
}

/// Groups of chunks the combining block folds side by side: as many as its threads allow with
/// [`fold_columns`] each, at most the chunks and as many as `room` rows of tile totals in shared
/// memory (a power of two, at least one).
fn fold_groups(block: usize, tile_cols: usize, chunks: usize, room: usize) -> usize {
    let slots = tile_cols / fold_columns(tile_cols);
    let mut groups = (block / slots).max(1);
    while groups > 1 && (groups > chunks || groups > room) {
        groups /= 2;
    }
    groups
}

/// Bytes of accumulator per column over the kernel's reductions.
fn accumulator_bytes(col: &ColumnKernel) -> usize {
    col.body
        .values
        .iter()
        .filter_map(|v| match v.expr {
            Expr::Reduce { op, x } => {
                col.body.values.get(x.0).map(|operand| accumulator_dtype(op, operand.dtype).size_bytes())
            }
            _ => None,
        })
        .sum()
}

/// Rows of tile totals (one per chunk group) that fit in shared memory beside the row threads'
/// partials.
fn fold_room(col: &ColumnKernel, tile_cols: usize, row_threads: usize) -> usize {
    let row = accumulator_bytes(col).max(1) * tile_cols;
    let rows_of_partials = if row_threads == 1 { 0 } else { row_threads };
    (SHARED_LIMIT / row).saturating_sub(rows_of_partials)
}

/// Whether a block of `col_threads x row_threads` threads with `vec` columns each has room in
/// shared memory for its row threads' partials (one row of threads needs none) and for at least
/// one row of tile totals for its combining step.
pub(crate) fn partials_fit(col: &ColumnKernel, col_threads: usize, row_threads: usize, vec: usize) -> bool {
    fold_room(col, col_threads * vec, row_threads) >= 1
}

/// The rows one block folds, given the config's wish: at least one, and few enough chunks for
/// the grid.
pub(crate) fn chunk_rows(rows: usize, rows_per_block: usize) -> usize {
    rows_per_block.max(rows.div_ceil(MAX_CHUNKS)).max(1)
}

/// How the prologue reads one load.
struct LoadInfo {
    slot: usize,
    base: usize,
    rows: Vec<ViewDim>,
    cols: Vec<ViewDim>,
    /// One aligned vector load per row for threads whose columns all exist.
    vector: bool,
}

impl LoadInfo {
    /// The element offset at row `r` and column `c` (C identifiers).
    fn offset(&self, r: &str, c: &str, width: IndexWidth) -> String {
        let row = offset_expr(0, &self.rows, r, width);
        let col = offset_expr(self.base, &self.cols, c, width);
        match (row == width.lit(0), col == width.lit(0)) {
            (true, _) => col,
            (false, true) => row,
            (false, false) => format!("{row} + {col}"),
        }
    }
}

struct Config {
    col_threads: usize,
    row_threads: usize,
    vec: usize,
    rows_per_block: usize,
}

fn check_config(unit: &Unit<'_>, config: &Config, reductions: &[(usize, ReduceOp, DType)]) -> Result<()> {
    let name = unit.name();
    let Config { col_threads: tx, row_threads: ty, vec, rows_per_block } = *config;
    if !tx.is_power_of_two() || !ty.is_power_of_two() {
        return Err(invalid_config(name, format!("col_threads {tx} and row_threads {ty} must be powers of two")));
    }
    let block = tx * ty;
    if !(32..=1024).contains(&block) {
        return Err(invalid_config(name, format!("a block of {block} threads is not in 32..=1024")));
    }
    if !vec.is_power_of_two() || vec > 8 {
        return Err(invalid_config(name, format!("vec {vec} is not a power of two up to 8")));
    }
    if rows_per_block == 0 {
        return Err(invalid_config(name, "rows_per_block is 0"));
    }
    // The row threads' partials (with several rows of threads) and one row of tile totals.
    let rows_of_partials = if ty > 1 { ty } else { 0 };
    let shared = reductions.iter().map(|r| r.2.size_bytes()).sum::<usize>() * tx * vec * (rows_of_partials + 1);
    if shared > SHARED_LIMIT {
        return Err(invalid_config(name, format!("{shared} bytes of shared partials exceed {SHARED_LIMIT}")));
    }
    Ok(())
}

pub(crate) fn generate(
    unit: &mut Unit<'_>,
    col: &ColumnKernel,
    col_threads: u32,
    row_threads: u32,
    vec: u32,
    rows_per_block: u32,
) -> Result<Emitted> {
    let kernel = unit.kernel;
    let name = kernel.name.clone();
    let body = &col.body;
    let reduced_rank = col.reduced.len();
    let rules = BodyRules {
        inputs: kernel.inputs.len(),
        outputs: kernel.outputs.len(),
        rank: reduced_rank + col.kept.len(),
        reductions: true,
    };
    check_body(&name, body, &rules)?;
    // (value id, op, accumulator dtype) of each reduction, in body order.
    let reductions: Vec<(usize, ReduceOp, DType)> = body
        .values
        .iter()
        .enumerate()
        .filter_map(|(id, v)| match v.expr {
            Expr::Reduce { op, x } => Some((id, op, accumulator_dtype(op, body.values[x.0].dtype))),
            _ => None,
        })
        .collect();
    let config = Config {
        col_threads: col_threads as usize,
        row_threads: row_threads as usize,
        vec: vec as usize,
        rows_per_block: rows_per_block as usize,
    };
    check_config(unit, &config, &reductions)?;
    let Config { col_threads: tx, row_threads: ty, vec, .. } = config;
    let (rows, cols) = (col.rows(), col.cols());
    let chunk = chunk_rows(rows, config.rows_per_block);
    let chunks = rows.div_ceil(chunk).max(1);
    let tiles = cols.div_ceil(tx * vec);
    let multi_chunk = chunks > 1;
    let width = IndexWidth::for_largest((rows * cols).max(unit.largest_buffer()).max(tiles * tx * vec + vec));
    let lit = |n: usize| width.lit(n);
    let input_dtypes: Vec<DType> = (0..kernel.inputs.len()).map(|slot| unit.input_dtype(slot)).collect();
    let output_dtypes: Vec<DType> = (0..kernel.outputs.len()).map(|slot| unit.output_dtype(slot)).collect();

    // The prologue: what the reductions' operands need, per row. The epilogue: what the stores
    // need once the rows are folded (reductions are its leaves).
    let prologue = live_values(
        body,
        reductions.iter().map(|r| match body.values[r.0].expr {
            Expr::Reduce { x, .. } => x,
            _ => unreachable!("reductions are reduce values"),
        }),
    );
    let mut epilogue = vec![false; body.values.len()];
    for s in &body.stores {
        epilogue[s.value.0] = true;
    }
    for id in (0..body.values.len()).rev() {
        if epilogue[id] && !matches!(body.values[id].expr, Expr::Reduce { .. }) {
            for o in body.values[id].expr.operands() {
                epilogue[o.0] = true;
            }
        }
    }
    let per_column = body.column_values(reduced_rank);
    if let Some(id) =
        (0..body.values.len()).find(|&id| prologue[id] && matches!(body.values[id].expr, Expr::Reduce { .. }))
    {
        return Err(malformed(&name, format!("v{id}: a reduction of a value computed from a reduction")));
    }
    if let Some(id) = (0..body.values.len()).find(|&id| epilogue[id] && !per_column[id]) {
        return Err(malformed(&name, format!("v{id}: the stores need a value that varies with the row")));
    }
    let loads: Vec<Option<LoadInfo>> = body
        .values
        .iter()
        .map(|value| match &value.expr {
            Expr::Load { input, offset, strides } => {
                let rows_view = merge_view(&col.reduced, &strides[..reduced_rank]);
                let cols_view = merge_view(&col.kept, &strides[reduced_rank..]);
                let aligned = offset.is_multiple_of(vec) && rows_view.iter().all(|d| d.stride.is_multiple_of(vec));
                let contiguous = classify(0, &cols_view, vec) == VectorAccess::Contiguous && !cols_view.is_empty();
                let vector = vec > 1 && aligned && contiguous;
                Some(LoadInfo { slot: *input, base: *offset, rows: rows_view, cols: cols_view, vector })
            }
            _ => None,
        })
        .collect();
    let load_at = |helpers: &mut Helpers, id: usize, r: &str, c: &str| -> String {
        let info = loads[id].as_ref().expect("a load");
        let lvalue = format!("in{}[{}]", info.slot, info.offset(r, c, width));
        load_rhs(helpers, input_dtypes[info.slot], body.values[id].dtype, &lvalue)
    };

    let (mut declared, mut params) = unit.buffer_params();
    if multi_chunk {
        for (k, &(_, _, acc)) in reductions.iter().enumerate() {
            declared.push(format!("{}* __restrict__ partials{k}", value_type(acc)));
            params.push(Param::Scratch(k));
        }
        declared.push("unsigned* __restrict__ arrivals".to_string());
        params.push(Param::Scratch(reductions.len()));
    }
    let helpers = &mut unit.helpers;
    let mut w = CodeWriter::new();
    let block = tx * ty;
    // `, 2`: the grid is sized for two resident blocks per SM (`config.rs`), which the row loop's
    // registers must leave room for.
    w.open(format!(
        "extern \"C\" __global__ void __launch_bounds__({block}, {BLOCKS_PER_SM}) {name}({})",
        declared.join(", ")
    ));
    w.line(format!("constexpr idx_t ROWS = {};", lit(rows)));
    w.line(format!("constexpr idx_t COLS = {};", lit(cols)));
    w.line(format!("constexpr idx_t CHUNK_ROWS = {};", lit(chunk)));
    w.line(format!("const unsigned tx = threadIdx.x % {tx}u;"));
    w.line(format!("const unsigned ty = threadIdx.x / {tx}u;"));
    w.line(format!("const idx_t c0 = ((idx_t)blockIdx.x * {} + tx) * {};", lit(tx), lit(vec)));
    for (k, &(id, op, acc)) in reductions.iter().enumerate() {
        let operand = match body.values[id].expr {
            Expr::Reduce { x, .. } => body.values[x.0].dtype,
            _ => unreachable!("reductions are reduce values"),
        };
        w.line(format!("{} acc{k}[{vec}];", value_type(acc)));
        w.line("#pragma unroll");
        w.line(format!("for (unsigned u = 0u; u < {vec}u; ++u) acc{k}[u] = {};", identity(op, operand, acc)));
    }

    // The rows of this block's chunk.
    let prologue_ids: Vec<usize> = (0..body.values.len()).filter(|&id| prologue[id]).collect();
    let vector_ids: Vec<usize> =
        prologue_ids.iter().copied().filter(|&id| loads[id].as_ref().is_some_and(|l| l.vector)).collect();
    let gathers = prologue_ids.iter().any(|id| loads[*id].as_ref().is_some_and(|l| !l.vector));
    // Registers a row's loads take (a 64-bit element two).
    let loaded: usize = prologue_ids
        .iter()
        .filter_map(|&id| loads[id].as_ref().map(|l| input_dtypes[l.slot].size_bytes().div_ceil(4)))
        .sum::<usize>()
        .max(1);
    let accumulators: usize = reductions.iter().map(|&(_, _, acc)| vec * acc.size_bytes().div_ceil(4)).sum();
    // Half the registers a thread of this block may have at two blocks per SM, for the values:
    // the rest holds indices, addresses and the prologue's temporaries.
    let budget = (65_536 / (BLOCKS_PER_SM * block)).min(255) / 2;
    let batch = [8, 4, 2, 1].into_iter().find(|b| b * loaded * vec + accumulators <= budget).unwrap_or(1);
    // The prologue and the folds of one row `r` (columns `c0 + u`), `vector_source` giving the
    // register that holds vector load `id`'s element `u`, or `None` to load it in place.
    let emit_row = |w: &mut CodeWriter,
                    helpers: &mut Helpers,
                    vector_source: &dyn Fn(usize) -> Option<String>,
                    clamp: bool|
     -> Result<()> {
        w.line("#pragma unroll");
        w.open(format!("for (unsigned u = 0u; u < {vec}u; ++u)"));
        if clamp {
            w.line("// columns past the end read the last one; their results are never stored");
            w.line("const idx_t c = c0 + u < COLS ? c0 + u : COLS - 1;");
        } else if gathers {
            w.line("const idx_t c = c0 + u;");
        }
        let mut names: Vec<String> = (0..body.values.len()).map(value_name).collect();
        emit_values(w, &name, helpers, body, prologue_ids.iter().copied(), &mut names, |id, helpers| {
            loads[id].as_ref()?;
            Some(match vector_source(id) {
                Some(register) => {
                    let info = loads[id].as_ref().expect("a load");
                    cast(helpers, input_dtypes[info.slot], body.values[id].dtype, &register)
                }
                None => load_at(helpers, id, "r", "c"),
            })
        })?;
        for (k, &(id, op, acc)) in reductions.iter().enumerate() {
            let Expr::Reduce { x, .. } = body.values[id].expr else { unreachable!("reductions are reduce values") };
            let element = &names[x.0];
            w.line(accumulate(helpers, op, acc, &format!("acc{k}[u]"), element, body.values[x.0].dtype));
        }
        w.close();
        Ok(())
    };
    let first_row = "(idx_t)blockIdx.y * CHUNK_ROWS + ty";
    w.open("if (c0 < COLS)");
    w.line("const idx_t row_end = ((idx_t)blockIdx.y + 1) * CHUNK_ROWS < ROWS ? ((idx_t)blockIdx.y + 1) * CHUNK_ROWS : ROWS;");
    // Only where `vec` does not divide the columns can a thread's vector run past the last one.
    let partial_tiles = !cols.is_multiple_of(vec);
    if !vector_ids.is_empty() {
        // Threads whose columns all exist load `batch` rows' vectors before folding any: the
        // loads are in flight together (with the test for a partial tile inside the row loop,
        // each row's load waited for the one before: a column kernel ran at a third of the
        // DRAM bandwidth so).
        if partial_tiles {
            w.open(format!("if (c0 + {} <= COLS)", lit(vec)));
        }
        w.open(format!("for (idx_t r0 = {first_row}; r0 < row_end; r0 += {})", lit(batch * ty)));
        for &id in &vector_ids {
            let dtype = input_dtypes[loads[id].as_ref().unwrap().slot];
            w.line(format!("{} ld{id}[{batch}][{vec}];", value_type(dtype)));
        }
        w.line("#pragma unroll");
        w.open(format!("for (unsigned b = 0u; b < {batch}u; ++b)"));
        w.line(format!("const idx_t r = r0 + b * {};", lit(ty)));
        w.open("if (r < row_end)");
        for &id in &vector_ids {
            let info = loads[id].as_ref().unwrap();
            let dtype = input_dtypes[info.slot];
            let offset = info.offset("r", "c0", width);
            emit_vector_load(
                &mut w,
                helpers,
                dtype,
                &format!("in{}", info.slot),
                &offset,
                &format!("ld{id}[b]"),
                "",
                vec,
                width,
            );
        }
        w.close();
        w.close();
        w.line("#pragma unroll");
        w.open(format!("for (unsigned b = 0u; b < {batch}u; ++b)"));
        w.line(format!("const idx_t r = r0 + b * {};", lit(ty)));
        w.open("if (r < row_end)");
        let from_batch = |id: usize| vector_ids.contains(&id).then(|| format!("ld{id}[b][u]"));
        emit_row(&mut w, helpers, &from_batch, false)?;
        w.close();
        w.close();
        w.close();
        if partial_tiles {
            w.reopen("else");
        }
    }
    if vector_ids.is_empty() || partial_tiles {
        // A partial tile (or loads that are no vectors): each row's elements loaded where they
        // are used, unrolled so that several rows' loads are in flight.
        w.line(format!("#pragma unroll {}", batch.min(4)));
        w.open(format!("for (idx_t r = {first_row}; r < row_end; r += {})", lit(ty)));
        emit_row(&mut w, helpers, &|_| None, gathers || !vector_ids.is_empty())?;
        w.close();
    }
    if !vector_ids.is_empty() && partial_tiles {
        w.close();
    }
    w.close();

    // The row threads' partials, combined in a fixed pairwise tree (row thread y folds y + half
    // for half = ty/2, ty/4, .., 1), so the first row of threads ends with the block's totals;
    // every thread takes part (the first row folding all of them alone was a tenth of a column
    // kernel's time).
    if ty > 1 && !reductions.is_empty() {
        for (k, &(_, _, acc)) in reductions.iter().enumerate() {
            w.line(format!("__shared__ {} shared{k}[{ty}][{}];", value_type(acc), tx * vec));
        }
        w.line("#pragma unroll");
        w.open(format!("for (unsigned u = 0u; u < {vec}u; ++u)"));
        for k in 0..reductions.len() {
            w.line(format!("shared{k}[ty][tx * {vec}u + u] = acc{k}[u];"));
        }
        w.close();
        w.line("__syncthreads();");
        w.line("#pragma unroll");
        w.open(format!("for (unsigned half = {}u; half > 0u; half >>= 1)", ty / 2));
        w.open("if (ty < half)");
        w.line("#pragma unroll");
        w.open(format!("for (unsigned u = 0u; u < {vec}u; ++u)"));
        for (k, &(_, op, acc)) in reductions.iter().enumerate() {
            let folded =
                combine(helpers, op, acc, &format!("acc{k}[u]"), &format!("shared{k}[ty + half][tx * {vec}u + u]"));
            w.line(format!("acc{k}[u] = {folded};"));
            w.line(format!("shared{k}[ty][tx * {vec}u + u] = acc{k}[u];"));
        }
        w.close();
        w.close();
        w.line("__syncthreads();");
        w.close();
    }

    let epilogue_ids: Vec<usize> = (0..body.values.len()).filter(|&id| epilogue[id]).collect();
    let reduction_of = |id: usize| reductions.iter().position(|r| r.0 == id);
    // Runs the epilogue of column `c0 + u` from the folded accumulators `total{k}` and stores.
    let emit_epilogue = |w: &mut CodeWriter, helpers: &mut Helpers| -> Result<()> {
        w.line("#pragma unroll");
        w.open(format!("for (unsigned u = 0u; u < {vec}u; ++u)"));
        w.line("const idx_t c = c0 + u;");
        w.open("if (c < COLS)");
        let mut names: Vec<String> = (0..body.values.len()).map(value_name).collect();
        emit_values(w, &name, helpers, body, epilogue_ids.iter().copied(), &mut names, |id, helpers| {
            if let Some(k) = reduction_of(id) {
                let (_, op, acc) = reductions[k];
                return Some(finalize(helpers, op, acc, &format!("acc{k}[u]"), "ROWS", body.values[id].dtype));
            }
            loads[id].as_ref().map(|_| load_at(helpers, id, "0", "c"))
        })?;
        for s in &body.stores {
            let dtype = output_dtypes[s.output];
            let value = cast(helpers, body.values[s.value.0].dtype, dtype, &names[s.value.0]);
            w.line(format!("out{}[c] = {};", s.output, narrow(dtype, &value)));
        }
        w.close();
        w.close();
        Ok(())
    };
    if !multi_chunk {
        w.open("if (ty == 0u && c0 < COLS)");
        emit_epilogue(&mut w, helpers)?;
        w.close();
    } else {
        w.line("__shared__ bool last_arrival;");
        w.open("if (ty == 0u && c0 < COLS)");
        w.line("#pragma unroll");
        w.open(format!("for (unsigned u = 0u; u < {vec}u; ++u)"));
        w.open("if (c0 + u < COLS)");
        for k in 0..reductions.len() {
            w.line(format!("partials{k}[(idx_t)blockIdx.y * COLS + c0 + u] = acc{k}[u];"));
        }
        w.close();
        w.close();
        w.close();
        w.line("__threadfence();  // publish the partials before counting this chunk as arrived");
        w.line("__syncthreads();");
        w.line(format!(
            "if (threadIdx.x == 0u) last_arrival = atomicAdd(&arrivals[blockIdx.x], 1u) == {}u;",
            chunks - 1
        ));
        w.line("__syncthreads();");
        let tile_cols = tx * vec;
        let per_thread = fold_columns(tile_cols);
        let slots = tile_cols / per_thread;
        let groups = fold_groups(block, tile_cols, chunks, fold_room(col, tile_cols, ty));
        let per_group = chunks.div_ceil(groups);
        let vector_partials = per_thread == 4 && cols.is_multiple_of(4) && reductions.iter().all(|r| r.2 == DType::F32);
        w.line("// The block that finishes a column tile's last chunk combines its partials: thread slot s");
        w.line(format!(
            "// folds columns {per_thread}s..{per_thread}s+{} of chunk group g ({per_group} chunks) in chunk order, then",
            per_thread - 1
        ));
        w.line("// the groups' totals fold in group order: a fixed order, many loads in flight.");
        w.open("if (last_arrival)");
        w.line("__threadfence();");
        for (k, &(_, _, acc)) in reductions.iter().enumerate() {
            w.line(format!("__shared__ {} group_total{k}[{groups}][{tile_cols}];", value_type(acc)));
        }
        w.line(format!("const unsigned group = threadIdx.x / {slots}u;"));
        w.open(format!(
            "for (unsigned slot = threadIdx.x % {slots}u; group < {groups}u && slot < {slots}u; slot += {block}u)"
        ));
        w.line(format!("const idx_t first = (idx_t)blockIdx.x * {} + slot * {per_thread}u;", lit(tile_cols)));
        w.line(format!("const unsigned chunk_end = group * {per_group}u + {per_group}u < {chunks}u ? group * {per_group}u + {per_group}u : {chunks}u;"));
        for (k, &(id, op, acc)) in reductions.iter().enumerate() {
            let Expr::Reduce { x, .. } = body.values[id].expr else { unreachable!("reductions are reduce values") };
            let operand = body.values[x.0].dtype;
            w.line(format!("{} total{k}[{per_thread}];", value_type(acc)));
            w.line("#pragma unroll");
            w.line(format!(
                "for (unsigned f = 0u; f < {per_thread}u; ++f) total{k}[f] = {};",
                identity(op, operand, acc)
            ));
        }
        if !vector_partials {
            // Columns past the end fold the last one; their totals are never stored.
            w.line(format!("idx_t c[{per_thread}];"));
            w.line("#pragma unroll");
            w.line(format!(
                "for (unsigned f = 0u; f < {per_thread}u; ++f) c[f] = first + f < COLS ? first + f : COLS - 1;"
            ));
        }
        // Through L2 (the other blocks' partials are not in this SM's L1), several chunks' loads
        // in flight at once.
        w.line("#pragma unroll 4");
        w.open(format!("for (unsigned chunk = group * {per_group}u; chunk < chunk_end; ++chunk)"));
        for (k, &(_, op, acc)) in reductions.iter().enumerate() {
            if vector_partials {
                w.line(format!(
                    "const float4 p{k} = first < COLS ? __ldcg(reinterpret_cast<const float4*>(partials{k} + (idx_t)chunk * COLS + first)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);"
                ));
                for (f, lane) in ["x", "y", "z", "w"].iter().enumerate() {
                    let folded = combine(helpers, op, acc, &format!("total{k}[{f}]"), &format!("p{k}.{lane}"));
                    w.line(format!("total{k}[{f}] = {folded};"));
                }
            } else {
                w.line("#pragma unroll");
                w.open(format!("for (unsigned f = 0u; f < {per_thread}u; ++f)"));
                let partial = partial_load(acc, &format!("partials{k} + (idx_t)chunk * COLS + c[f]"));
                let folded = combine(helpers, op, acc, &format!("total{k}[f]"), &partial);
                w.line(format!("total{k}[f] = {folded};"));
                w.close();
            }
        }
        w.close();
        w.line("#pragma unroll");
        w.open(format!("for (unsigned f = 0u; f < {per_thread}u; ++f)"));
        for k in 0..reductions.len() {
            w.line(format!("group_total{k}[group][slot * {per_thread}u + f] = total{k}[f];"));
        }
        w.close();
        w.close();
        w.line("__syncthreads();");
        w.open("if (ty == 0u && c0 < COLS)");
        w.line("#pragma unroll");
        w.open(format!("for (unsigned u = 0u; u < {vec}u; ++u)"));
        for (k, &(_, op, acc)) in reductions.iter().enumerate() {
            w.line(format!("acc{k}[u] = group_total{k}[0][tx * {vec}u + u];"));
            if groups > 1 {
                let folded =
                    combine(helpers, op, acc, &format!("acc{k}[u]"), &format!("group_total{k}[g][tx * {vec}u + u]"));
                w.line(format!("for (unsigned g = 1u; g < {groups}u; ++g) acc{k}[u] = {folded};"));
            }
        }
        w.close();
        emit_epilogue(&mut w, helpers)?;
        w.close();
        w.line("if (threadIdx.x == 0u) arrivals[blockIdx.x] = 0u;  // leave the scratch zeroed for the next run");
        w.close();
    }
    w.close();

    let mut launches = Vec::new();
    if cols > 0 && !body.stores.is_empty() {
        launches.push(Launch {
            entry: name.clone(),
            grid: [tiles as u32, chunks as u32, 1],
            block: [block as u32, 1, 1],
            shared_bytes: 0,
            params,
        });
    }
    let mut scratch = Vec::new();
    if multi_chunk {
        for &(_, _, acc) in &reductions {
            scratch.push(ScratchSpec { bytes: chunks * cols * acc.size_bytes(), zero_init: false });
        }
        scratch.push(ScratchSpec { bytes: tiles * 4, zero_init: true });
    }
    let vectors: Vec<String> = (0..body.values.len())
        .filter(|&id| prologue[id] && loads[id].as_ref().is_some_and(|l| l.vector))
        .map(|id| format!("v{id}"))
        .collect();
    let mut notes = vec![format!(
        "{tiles} column tiles of {} columns x {chunks} row chunks of {chunk} rows; {tx} x {ty} threads, {vec} columns each",
        tx * vec
    )];
    if !vectors.is_empty() {
        notes.push(format!("vector loads: {}", vectors.join(", ")));
    }
    if multi_chunk {
        notes.push(format!(
            "scratch0..{}: one partial per reduction, chunk and column; scratch{}: per-tile arrival counters",
            reductions.len().saturating_sub(1),
            reductions.len()
        ));
    }
    let ops: Vec<&str> = reductions.iter().map(|r| r.1.name()).collect();
    Ok(Emitted {
        summary: format!(
            "{} over {rows} rows of {cols} columns (reduced {:?}, kept {:?})",
            ops.join(", "),
            col.reduced,
            col.kept
        ),
        notes,
        width: Some(width),
        code: w.finish(),
        launches,
        scratch,
        tables: Vec::new(),
    })
}
