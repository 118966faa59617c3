//! Index-add kernels (an index_select's gradient, such as an embedding's): the output
//! `[outer, size, inner]` is zero except that slice `j` of the source `[outer, indices, inner]`
//! is added at row `indices[j]`.
//!
//! The owner computes. A block owns `ROWS` consecutive output rows of one `outer` (each of its
//! warps `rows_per_warp` of them) and one slice of at most `columns` inner columns, and each
//! warp keeps its rows' slice in registers (each lane a few vectors of columns, moved with
//! 16-byte accesses where the inner extent allows). The block reads the indices a chunk at a
//! time: each warp tests its part of the chunk against the block's row range (one compare per
//! index and a `__ballot_sync`) and lists the hits in shared memory in index order; after a
//! barrier every warp walks the lists in order and adds the source rows of the hits on its own
//! rows (coalesced row reads). At the end each warp writes its rows once, zeros where no index
//! hit them, so there is no zeroing pass. Scanning costs `size / ROWS * indices` compares:
//! `ROWS` times fewer than a warp per row testing every index, and far fewer dependent steps
//! than a thread per column reading and writing its output for every index.
//!
//! Deterministic: every output element is summed by one lane, from zero, in the order of the
//! indices, in f32 for f32/f16/bf16 (wrapping for integers), and rounded to its dtype once when
//! it is stored, so the bits are the same on every run (no atomics); the CPU plan executor sums
//! the same way. An index outside `0..size`, negative ones included, adds nothing: the
//! forward's gather reports it.

use crate::cuda::{load_vec_name, narrow, storage_type, store_vec_name, value_type, widen, Helper};
use crate::error::{invalid_config, malformed, Result};
use crate::index::IndexWidth;
use crate::vector::load_rhs;
use crate::writer::CodeWriter;
use crate::{Emitted, Launch, Unit};
use braze_ir::DType;
use braze_plan::IndexAdd;

/// The knobs of `KernelConfig::IndexAdd`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) warps: u32,
    pub(crate) rows_per_warp: u32,
    pub(crate) chunk: u32,
    pub(crate) columns: u32,
}

/// Indices a block may list in shared memory per chunk (4 bytes each).
const MAX_CHUNK: u32 = 8192;
/// Hits are listed as `position << 8 | row`: a block owns fewer than 256 rows.
const MAX_ROWS: u32 = 255;

/// The tuning candidates for `ia`, the default first: a block of 16 warps of 2 rows each (32
/// rows test each index together, which keeps the index reads per output row low) with whole
/// rows of up to 1024 columns in registers; then narrower blocks, fewer rows per warp and
/// narrower slices. Shapes whose accumulators would not fit in registers are left out. The
/// default follows the cost model above and ptxas's register counts; it has not been timed
/// against the others on a GPU yet.
pub(crate) fn candidates(ia: &IndexAdd) -> Vec<Shape> {
    let shapes = [
        (16, 2, 4096, 1024),
        (8, 2, 2048, 1024),
        (16, 1, 4096, 1024),
        (8, 4, 2048, 512),
        (4, 4, 1024, 1024),
        (8, 1, 2048, 1024),
        (32, 1, 4096, 256),
        (8, 2, 1024, 256),
    ];
    let mut fitting: Vec<Shape> = shapes
        .into_iter()
        .map(|(warps, rows_per_warp, chunk, columns)| Shape { warps, rows_per_warp, chunk, columns })
        .filter(|&shape| check(ia, shape).is_ok())
        .collect();
    if fitting.is_empty() {
        // At most 8 accumulators a lane: fits whatever the dtype.
        fitting.push(Shape { warps: 8, rows_per_warp: 1, chunk: 2048, columns: 256 });
    }
    fitting
}

/// How a shape cuts the inner columns: slices of `width` columns, `vectors` vectors of `vec`
/// consecutive columns for each lane of a slice.
#[derive(Clone, Copy, Debug)]
struct Layout {
    vec: usize,
    vectors: usize,
    width: usize,
    slices: usize,
}

impl Layout {
    fn of(ia: &IndexAdd, shape: Shape) -> Layout {
        // The widest access of at most 16 bytes that every row start stays aligned to.
        let most = 16 / ia.dtype.size_bytes();
        let vec = (0..).map(|k| most >> k).find(|&v| v <= 1 || ia.inner.is_multiple_of(v)).unwrap_or(1).max(1);
        let step = 32 * vec;
        let inner = ia.inner.max(1);
        // Slices of equal width, each a whole number of the warp's vectors.
        let cuts = inner.div_ceil(shape.columns as usize);
        let width = inner.div_ceil(cuts).next_multiple_of(step);
        Layout { vec, vectors: width / step, width, slices: ia.inner.div_ceil(width) }
    }

    /// Accumulators each lane keeps for one row.
    fn per_row(self) -> usize {
        self.vectors * self.vec
    }
}

/// Why `shape` cannot run `ia`, if it cannot.
fn check(ia: &IndexAdd, shape: Shape) -> std::result::Result<(), String> {
    let Shape { warps, rows_per_warp, chunk, columns } = shape;
    if !(1..=32).contains(&warps) {
        return Err(format!("{warps} warps is not in 1..=32"));
    }
    if rows_per_warp == 0 || warps * rows_per_warp > MAX_ROWS {
        return Err(format!("{warps} warps of {rows_per_warp} rows is not 1..={MAX_ROWS} rows a block"));
    }
    if chunk == 0 || chunk > MAX_CHUNK || !chunk.is_multiple_of(32 * warps) {
        return Err(format!("chunk {chunk} is not a multiple of 32 x {warps} warps up to {MAX_CHUNK}"));
    }
    if !(32..=4096).contains(&columns) || !columns.is_multiple_of(32) {
        return Err(format!("columns {columns} is not a multiple of 32 in 32..=4096"));
    }
    let threads = 32 * warps as usize;
    let registers = (65_536 / threads).min(255);
    if registers_needed(ia, shape) > registers {
        return Err(format!(
            "{} accumulators a lane do not fit in the {registers} registers of a {threads}-thread block",
            rows_per_warp as usize * Layout::of(ia, shape).per_row()
        ));
    }
    Ok(())
}

/// Registers a thread needs: its accumulators, the loaded vectors of the hits in flight (half as
/// many again: ptxas overlaps fewer loads where registers are short) and the index math.
fn registers_needed(ia: &IndexAdd, shape: Shape) -> usize {
    let accumulators = shape.rows_per_warp as usize * Layout::of(ia, shape).per_row();
    accumulators * 3 / 2 + 40
}

pub(crate) fn generate(unit: &mut Unit<'_>, ia: &IndexAdd, shape: Shape) -> Result<Emitted> {
    let name = unit.name().to_string();
    check(ia, shape).map_err(|why| invalid_config(&name, why))?;
    if unit.kernel.inputs.len() != 2 || unit.kernel.outputs.len() != 1 {
        return Err(malformed(&name, "an index_add reads src and indices and writes one output"));
    }
    let (dtype, index) = (ia.dtype, ia.index_dtype);
    let Shape { warps, rows_per_warp, chunk, .. } = shape;
    let layout = Layout::of(ia, shape);
    let Layout { vec, vectors, width: slice_width, slices } = layout;
    let threads = 32 * warps;
    let rows = warps * rows_per_warp;
    let groups = ia.size.div_ceil(rows as usize);
    let tiles = ia.outer * groups * slices;
    // No more indices per chunk than there are, rounded up to the warps' share.
    let chunk = (chunk as usize).min(ia.indices.next_multiple_of(32 * warps as usize));
    let segment = chunk / warps as usize;
    let largest = (ia.outer * ia.size * ia.inner).max(ia.outer * ia.indices * ia.inner).max(unit.largest_buffer());
    let width = IndexWidth::for_largest(largest);
    let lit = |n: usize| width.lit(n);
    let (declared, params) = unit.buffer_params();
    let (value, storage) = (value_type(dtype), storage_type(dtype));
    let step = 32 * vec;
    // The last slice is short: its lanes test their vectors against the inner extent.
    let ragged = !ia.inner.is_multiple_of(slice_width);
    let per_row = layout.per_row();
    if vec > 1 {
        unit.helpers.need(Helper::LoadVec(dtype, vec as u32));
        unit.helpers.need(Helper::StoreVec(dtype, vec as u32));
    }
    let full = "0xffffffffu";

    // Two blocks an SM where their registers allow it (more warps hide the index reads), else
    // one: ptxas gives the accumulators what they need rather than spilling them.
    let min_blocks = if 2 * threads as usize * registers_needed(ia, shape) <= 65_536 { 2 } else { 1 };
    let mut w = CodeWriter::new();
    w.open(format!(
        "extern \"C\" __global__ void __launch_bounds__({threads}, {min_blocks}) {name}({})",
        declared.join(", ")
    ));
    if tiles == 0 {
        w.line("// no output elements: nothing to do");
        w.close();
    } else {
        w.line(format!("constexpr idx_t INNER = {};", lit(ia.inner)));
        w.line(format!("constexpr idx_t SIZE = {};", lit(ia.size)));
        w.line(format!("constexpr idx_t INDICES = {};", lit(ia.indices)));
        w.line(format!(
            "constexpr idx_t WIDTH = {};  // columns of a slice: {vectors} vectors of {vec} for each lane",
            lit(slice_width)
        ));
        w.line(format!("constexpr idx_t SLICES = {};", lit(slices)));
        w.line(format!("constexpr idx_t GROUPS = {};  // of ROWS rows", lit(groups)));
        w.line(format!("constexpr idx_t TILES = {};  // (outer, group, slice), a block each", lit(tiles)));
        w.line(format!("constexpr unsigned ROWS = {rows}u;  // rows of a block, {rows_per_warp} for each warp"));
        if ia.indices > 0 {
            w.line(format!("constexpr unsigned CHUNK = {chunk}u;  // indices scanned between two barriers"));
            w.line(format!("constexpr unsigned SEGMENT = {segment}u;  // each warp's part of a chunk"));
            w.line("// The chunk's hits on the block's rows, each warp's part in index order, as");
            w.line("// `position in the chunk << 8 | row of the block`, and how many each warp found.");
            w.line("__shared__ unsigned hits[CHUNK];");
            w.line(format!("__shared__ unsigned hit_count[{warps}];"));
        }
        w.line("const unsigned lane = threadIdx.x & 31u;");
        w.line("const unsigned warp = threadIdx.x >> 5;");
        w.open("for (idx_t tile = blockIdx.x; tile < TILES; tile += gridDim.x)");
        w.line("const idx_t slice = tile % SLICES;");
        w.line("const idx_t group = tile / SLICES % GROUPS;");
        w.line("const idx_t outer = tile / (SLICES * GROUPS);");
        w.line("const idx_t first = group * ROWS;  // the block's first row");
        w.line("const unsigned rows = SIZE - first < ROWS ? (unsigned)(SIZE - first) : ROWS;");
        w.line(format!("const idx_t column = slice * WIDTH + lane * {};  // the lane's first column", lit(vec)));
        let acc_names: Vec<String> = (0..rows_per_warp).map(|k| format!("acc{k}")).collect();
        w.line(format!(
            "// Row `warp * {rows_per_warp} + k` of the block in acc<k>: vector v of the lane at [v * {vec}..]."
        ));
        for acc in &acc_names {
            w.line(format!("{value} {acc}[{per_row}];"));
        }
        w.line("#pragma unroll");
        w.open(format!("for (unsigned i = 0; i < {per_row}u; ++i)"));
        for acc in &acc_names {
            w.line(format!("{acc}[i] = ({value})0;"));
        }
        w.close();
        let in_slice = |w: &mut CodeWriter| {
            w.line("#pragma unroll");
            w.open(format!("for (unsigned v = 0; v < {vectors}u; ++v)"));
            if ragged {
                w.open(format!("if (column + v * {} < INNER)", lit(step)));
            }
        };
        let end_slice = |w: &mut CodeWriter| {
            if ragged {
                w.close();
            }
            w.close();
        };
        if ia.indices > 0 {
            w.line(format!("const {storage}* __restrict__ from = in0 + outer * INDICES * INNER + column;"));
            w.open("for (idx_t base = 0; base < INDICES; base += CHUNK)");
            w.line("// Scan: this warp's part of the chunk against the block's rows.");
            w.line("unsigned count = 0;");
            w.line("#pragma unroll");
            w.open("for (unsigned u = 0; u < SEGMENT; u += 32u)");
            w.line("const unsigned at = warp * SEGMENT + u + lane;");
            w.line("// Below `rows` exactly for an index in first..first + rows: a negative one wraps");
            w.line("// far above (out of range: reported by the forward's check).");
            let load = load_rhs(&mut unit.helpers, index, index, "in1[base + at]");
            let row = format!("(unsigned long long)(long long){load} - (unsigned long long)first");
            if ia.indices.is_multiple_of(chunk) {
                w.line(format!("const unsigned long long row = {row};"));
            } else {
                w.line(format!("const unsigned long long row = base + at < INDICES ? {row} : ~0ull;"));
            }
            w.line("const bool hit = row < rows;");
            w.line(format!("const unsigned mask = __ballot_sync({full}, hit);"));
            w.line(
                "if (hit) hits[warp * SEGMENT + count + __popc(mask & ((1u << lane) - 1u))] = at << 8 | (unsigned)row;",
            );
            w.line("count += __popc(mask);");
            w.close();
            w.line("if (lane == 0u) hit_count[warp] = count;");
            w.line("__syncthreads();");
            w.line("// Add: the hits on this warp's rows, list after list, so each row sums in index order.");
            w.open(format!("for (unsigned list = 0; list < {warps}u; ++list)"));
            w.line("const unsigned listed = hit_count[list];");
            w.open("for (unsigned q = 0; q < listed; q += 32u)");
            w.line("const bool valid = q + lane < listed;");
            w.line("const unsigned entry = valid ? hits[list * SEGMENT + q + lane] : 0u;");
            for (k, acc) in acc_names.iter().enumerate() {
                w.open("");
                w.line(format!(
                    "unsigned mask = __ballot_sync({full}, valid && (entry & 255u) == warp * {rows_per_warp}u + {k}u);"
                ));
                w.line("const unsigned mine = __popc(mask);");
                w.line("// Unrolled so that the loads of the next hit overlap the adds of this one.");
                w.line("#pragma unroll 2");
                w.open("for (unsigned h = 0; h < mine; ++h)");
                w.line("const unsigned bit = __ffs(mask) - 1u;");
                w.line("mask &= mask - 1u;");
                w.line(format!(
                    "const {storage}* __restrict__ src = from + (base + (__shfl_sync({full}, entry, bit) >> 8)) * INNER;"
                ));
                in_slice(&mut w);
                let add = |w: &mut CodeWriter, slot: &str, x: &str| {
                    let sum = match dtype {
                        DType::I32 => format!("(int)((unsigned){slot} + (unsigned){x})"),
                        DType::I64 => format!("(long long)((unsigned long long){slot} + (unsigned long long){x})"),
                        _ => format!("{slot} + {x}"),
                    };
                    w.line(format!("{slot} = {sum};"));
                };
                if vec == 1 {
                    add(&mut w, &format!("{acc}[v]"), &widen(dtype, &format!("src[v * {}]", lit(step))));
                } else {
                    w.line(format!("{value} ld[{vec}];"));
                    w.line(format!("{}(src + v * {}, ld);", load_vec_name(dtype, vec as u32), lit(step)));
                    w.line("#pragma unroll");
                    w.open(format!("for (unsigned i = 0; i < {vec}u; ++i)"));
                    add(&mut w, &format!("{acc}[v * {vec}u + i]"), "ld[i]");
                    w.close();
                }
                end_slice(&mut w);
                w.close();
                w.close();
            }
            w.close();
            w.close();
            w.line("__syncthreads();  // the next chunk rewrites the lists");
            w.close();
        }
        w.line("// Each row of the block written once: its sums rounded to the dtype, or zeros.");
        for (k, acc) in acc_names.iter().enumerate() {
            w.open(format!("if (warp * {rows_per_warp}u + {k}u < rows)"));
            w.line(format!(
                "{storage}* __restrict__ into = out0 + (outer * SIZE + first + warp * {rows_per_warp}u + {k}u) * INNER + column;"
            ));
            in_slice(&mut w);
            if vec == 1 {
                w.line(format!("into[v * {}] = {};", lit(step), narrow(dtype, &format!("{acc}[v]"))));
            } else {
                w.line(format!("{}(into + v * {}, {acc} + v * {vec}u);", store_vec_name(dtype, vec as u32), lit(step)));
            }
            end_slice(&mut w);
            w.close();
        }
        w.close();
        w.close();
    }
    let mut launches = Vec::new();
    if tiles > 0 {
        launches.push(Launch {
            entry: name.clone(),
            grid: [tiles.min(i32::MAX as usize) as u32, 1, 1],
            block: [threads, 1, 1],
            shared_bytes: 0,
            params,
        });
    }
    Ok(Emitted {
        summary: format!(
            "index_add of {} slices into {} rows ({} columns of {dtype}, {index} indices)",
            ia.indices,
            ia.size,
            ia.outer * ia.inner
        ),
        notes: vec![format!(
            "blocks of {rows} rows x {slice_width} columns summed in registers, the hits of each {chunk}-index chunk \
             listed in shared memory and added in index order (no atomics)"
        )],
        width: Some(width),
        code: w.finish(),
        launches,
        scratch: Vec::new(),
        tables: Vec::new(),
    })
}
