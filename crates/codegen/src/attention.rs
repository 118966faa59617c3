//! Attention kernels, flash-attention style on CUDA cores (FMA): no `seq x seq` matrix in
//! memory, f32 accumulation whatever the storage dtype, the causal mask computed from the
//! indices, key (query) tiles wholly above the diagonal never visited.
//!
//! One layout serves all three kernels: a block holds `warps * rows_per_warp` rows of the side
//! it parallelises over (query rows for the forward and dq, key rows for dk/dv) in shared
//! memory, and walks the other side in tiles of 32, one row per lane, staged through shared
//! memory as f32 with rows padded by one word (lane `j` reading row `j` hits 32 banks). Each
//! warp owns `rows_per_warp` rows; for each it computes the 32 dot products of a tile at once
//! (lane `j`: row `j` of the tile), reduces across the warp with shuffles, and folds the tile
//! into its accumulators, lane `l` owning dims `l, l + 32, ...` of each row.
//!
//! - forward: scores in the base-2 domain (`scale * log2(e)` folded in), an online softmax per
//!   row (running max, rescaled sum and accumulator); stores `out = acc / sum` and the lse
//!   `(max + log2(sum)) * ln 2`.
//! - backward, two kernels (the plan's two `attention_backward` sides): dq over query tiles,
//!   dk and dv over key tiles. Each recomputes `p = exp2(s - lse * log2(e))` and
//!   `ds = p (dout . v - delta)`; splitting them lets every gradient element be summed by one
//!   thread in one order, with no atomics, so gradients have the same bits on every run (one
//!   kernel would have to add dq across key tiles atomically).
//!
//! These kernels are the portable path for every dtype and target; for bf16/f16 on sm_80+ the
//! tensor-core kernels (`attention_mma.rs`, `attention_mma_backward.rs`) come first among the
//! candidates, these after them.

use crate::attention_layout::{backward_operands, declare_rows, forward_operands};
use crate::cuda::{f32_literal, narrow, widen};
use crate::error::{invalid_config, malformed, Result};
use crate::index::IndexWidth;
use crate::writer::CodeWriter;
use crate::{Emitted, Launch, Param, Unit};
use braze_ir::{AttentionInput, DType};
use braze_plan::{Attention, AttentionBackward, AttentionResult, AttentionShape, OperandLayout};

/// Rows of the walked side per step: one per lane.
pub(crate) const TILE: usize = 32;

/// The parts of a launch every attention kernel shares.
struct Layout {
    warps: u32,
    rows_per_warp: u32,
    /// `ceil(head_dim / 32)`, at least 1: accumulator words per lane and row.
    chunks: usize,
    /// Rows a block owns.
    rows: usize,
    /// Blocks along the sequence for one (batch, head) pair.
    tiles: usize,
}

fn layout(name: &str, s: &AttentionShape, warps: u32, rows_per_warp: u32) -> Result<Layout> {
    if !(1..=16).contains(&warps) || !(1..=16).contains(&rows_per_warp) {
        return Err(invalid_config(name, format!("warps {warps} and rows_per_warp {rows_per_warp} must be in 1..=16")));
    }
    if s.head_dim > 256 {
        return Err(malformed(name, format!("head_dim {} is above the 256 these kernels hold", s.head_dim)));
    }
    let rows = (warps * rows_per_warp) as usize;
    Ok(Layout { warps, rows_per_warp, chunks: s.head_dim.div_ceil(32).max(1), rows, tiles: s.seq.div_ceil(rows) })
}

/// The grid: one block per row tile of each (batch, head) pair, heaviest (latest, under a
/// causal mask) tiles first; none for an empty problem.
fn launches(name: &str, s: &AttentionShape, l: &Layout, shared_words: usize, params: Vec<Param>) -> Vec<Launch> {
    let blocks = s.batch * l.tiles;
    if blocks == 0 {
        return Vec::new();
    }
    vec![Launch {
        entry: name.to_string(),
        grid: [blocks as u32, 1, 1],
        block: [l.warps * 32, 1, 1],
        shared_bytes: (shared_words * 4) as u32,
        params,
    }]
}

/// Refuses a config whose shared memory the target cannot give one block.
fn check_shared(unit: &Unit<'_>, words: usize) -> Result<()> {
    let bytes = words * 4;
    if bytes > unit.target.shared_memory_per_block_optin as usize {
        return Err(invalid_config(
            unit.name(),
            format!(
                "{bytes} bytes of shared memory a block, above the {} the target allows",
                unit.target.shared_memory_per_block_optin
            ),
        ));
    }
    Ok(())
}

pub(crate) fn check_dtypes(unit: &Unit<'_>, s: &AttentionShape, inputs: &[DType], outputs: &[DType]) -> Result<()> {
    let name = unit.name();
    if !s.dtype.is_float() {
        return Err(malformed(name, format!("dtype {} is not a float", s.dtype)));
    }
    if unit.kernel.inputs.len() != inputs.len() || unit.kernel.outputs.len() != outputs.len() {
        return Err(malformed(name, "input or output slots do not match the kernel's results"));
    }
    for (slot, &d) in inputs.iter().enumerate() {
        if unit.input_dtype(slot) != d {
            return Err(malformed(name, format!("input {slot} is {}, expected {d}", unit.input_dtype(slot))));
        }
    }
    for (slot, &d) in outputs.iter().enumerate() {
        if unit.output_dtype(slot) != d {
            return Err(malformed(name, format!("output {slot} is {}, expected {d}", unit.output_dtype(slot))));
        }
    }
    Ok(())
}

/// Constants, thread coordinates, the block's (batch, head) pair and row tile, and where the
/// pair's rows of each of `operands` lie.
fn prologue(w: &mut CodeWriter, s: &AttentionShape, l: &Layout, operands: &[(String, OperandLayout)]) {
    w.line(format!("constexpr int SEQ = {}, DIM = {}, ROWS = {}, TILE = {TILE};", s.seq, s.head_dim, l.rows));
    w.line(format!("constexpr int RPW = {}, CHUNKS = {}, PAD = DIM + 1;", l.rows_per_warp, l.chunks));
    w.line(format!("constexpr float SCALE_LOG2 = {};", f32_literal((s.scale * std::f64::consts::LOG2_E) as f32)));
    w.line(format!("constexpr bool CAUSAL = {};", s.causal));
    w.line("const float NEG_INF = __int_as_float(0xff800000);");
    w.line("const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;");
    w.line(format!("const int tiles = {};", l.tiles));
    w.line(
        "const int tile = tiles - 1 - (int)(blockIdx.x % tiles);  // latest rows first: under a mask they do the most",
    );
    w.line("const idx_t bh = blockIdx.x / tiles;");
    w.line("const int row0 = tile * ROWS;");
    declare_rows(w, s, operands);
    w.line("extern __shared__ float smem[];");
}

/// Stages `rows` rows from `first` of `src` (an operand, its rows at `{src}_at`) into `dst`
/// with row stride `stride`, zeros past the sequence.
fn stage(w: &mut CodeWriter, dtype: DType, dst: &str, src: &str, first: &str, rows: &str, stride: &str) {
    w.open(format!("for (int e = threadIdx.x; e < {rows} * DIM; e += blockDim.x)"));
    w.line(format!("const int r = e / DIM, d = e - r * DIM, t = {first} + r;"));
    w.line(format!(
        "{dst}[r * {stride} + d] = t < SEQ ? {} : 0.0f;",
        widen(dtype, &format!("{src}[{src}_at + (idx_t)t * {src}_row + d]"))
    ));
    w.close();
}

/// `float name = dot(a[..], b[..])` over DIM.
fn dot(w: &mut CodeWriter, name: &str, a: &str, b: &str) {
    w.line(format!("float {name} = 0.0f;"));
    w.line("#pragma unroll 8");
    w.line(format!("for (int d = 0; d < DIM; ++d) {name} = fmaf({a}[d], {b}[d], {name});"));
}

/// `acc[r][c] += scalar_from_lane_jj * rows[jj * PAD + d]` over the 32 rows of a tile.
fn fold(w: &mut CodeWriter, folds: &[(&str, &str, &str)]) {
    w.line("#pragma unroll 4");
    w.open("for (int jj = 0; jj < TILE; ++jj)");
    for (acc, value, rows) in folds {
        w.line(format!("const float {value}_jj = __shfl_sync(0xffffffffu, {value}, jj);"));
        w.line("#pragma unroll");
        w.open("for (int c = 0; c < CHUNKS; ++c)");
        w.line("const int d = lane + 32 * c;");
        w.line(format!("if (d < DIM) {acc}[r][c] = fmaf({value}_jj, {rows}[jj * PAD + d], {acc}[r][c]);"));
        w.close();
    }
    w.close();
}

/// `out[row i] = scale * acc[r]`, narrowed, by each lane for its dims.
fn store_rows(w: &mut CodeWriter, dtype: DType, out: &str, acc: &str, factor: &str) {
    w.line("#pragma unroll");
    w.open("for (int c = 0; c < CHUNKS; ++c)");
    w.line("const int d = lane + 32 * c;");
    w.line(format!(
        "if (d < DIM) {out}[{out}_at + (idx_t)i * {out}_row + d] = {};",
        narrow(dtype, &format!("{acc}[r][c] * {factor}"))
    ));
    w.close();
}

fn butterfly(w: &mut CodeWriter, var: &str, combine: &str) {
    w.line(format!(
        "for (int o = 16; o > 0; o >>= 1) {var} = {combine}({var}, __shfl_xor_sync(0xffffffffu, {var}, o));"
    ));
}

pub(crate) fn generate_forward(
    unit: &mut Unit<'_>,
    att: &Attention,
    warps: u32,
    rows_per_warp: u32,
) -> Result<Emitted> {
    let name = unit.name().to_string();
    let s = att.shape;
    let l = layout(&name, &s, warps, rows_per_warp)?;
    let outputs: Vec<DType> =
        att.results.iter().map(|r| if *r == AttentionResult::Out { s.dtype } else { DType::F32 }).collect();
    check_dtypes(unit, &s, &[s.dtype; 3], &outputs)?;
    let out_slot = att.results.iter().position(|r| *r == AttentionResult::Out);
    let lse_slot = att.results.iter().position(|r| *r == AttentionResult::Lse);
    let width = IndexWidth::for_largest(unit.largest_buffer());
    let (declared, params) = unit.buffer_params();
    let shared_words = l.rows * s.head_dim + TILE * (s.head_dim + 1) * 2;
    check_shared(unit, shared_words)?;

    let mut w = CodeWriter::new();
    w.line(format!("extern \"C\" __global__ void __launch_bounds__({}) {name}({})", warps * 32, declared.join(", ")));
    w.open("");
    prologue(&mut w, &s, &l, &forward_operands(att));
    w.line("float* qs = smem;                  // ROWS x DIM: the block's query rows");
    w.line("float* ks = qs + ROWS * DIM;       // TILE x PAD: a key tile");
    w.line("float* vs = ks + TILE * PAD;       // TILE x PAD: its values");
    stage(&mut w, s.dtype, "qs", "in0", "row0", "ROWS", "DIM");
    w.line("float row_max[RPW], row_sum[RPW], acc[RPW][CHUNKS];");
    w.line("#pragma unroll");
    w.open("for (int r = 0; r < RPW; ++r)");
    w.line("row_max[r] = NEG_INF;");
    w.line("row_sum[r] = 0.0f;");
    w.line("#pragma unroll");
    w.line("for (int c = 0; c < CHUNKS; ++c) acc[r][c] = 0.0f;");
    w.close();
    w.line("// Under the mask, key tiles past the block's last query row are never visited.");
    w.line("const int key_end = CAUSAL ? min(SEQ, row0 + ROWS) : SEQ;");
    w.open("for (int k0 = 0; k0 < key_end; k0 += TILE)");
    w.line("__syncthreads();  // the previous tile is no longer read");
    stage(&mut w, s.dtype, "ks", "in1", "k0", "TILE", "PAD");
    stage(&mut w, s.dtype, "vs", "in2", "k0", "TILE", "PAD");
    w.line("__syncthreads();");
    w.line("const int j = k0 + lane;");
    w.line("#pragma unroll");
    w.open("for (int r = 0; r < RPW; ++r)");
    w.line("const int i = row0 + warp * RPW + r;");
    w.line("if (i >= SEQ) continue;  // warp-uniform");
    dot(&mut w, "score", "(qs + (warp * RPW + r) * DIM)", "(ks + lane * PAD)");
    w.line("const bool valid = j < SEQ && (!CAUSAL || j <= i);");
    w.line("score = valid ? score * SCALE_LOG2 : NEG_INF;");
    w.line("float tile_max = score;");
    butterfly(&mut w, "tile_max", "fmaxf");
    w.line("const float new_max = fmaxf(row_max[r], tile_max);");
    w.line("// A row with only -inf scores so far subtracts 0 (no -inf - -inf).");
    w.line("const float shift = new_max == NEG_INF ? 0.0f : new_max;");
    w.line("const float rescale = exp2f(row_max[r] - shift);");
    w.line("const float p = valid ? exp2f(score - shift) : 0.0f;");
    w.line("float tile_sum = p;");
    butterfly(&mut w, "tile_sum", "__fadd_rn");
    w.line("row_sum[r] = row_sum[r] * rescale + tile_sum;");
    w.line("row_max[r] = new_max;");
    w.line("#pragma unroll");
    w.line("for (int c = 0; c < CHUNKS; ++c) acc[r][c] *= rescale;");
    fold(&mut w, &[("acc", "p", "vs")]);
    w.close();
    w.close();
    w.line("#pragma unroll");
    w.open("for (int r = 0; r < RPW; ++r)");
    w.line("const int i = row0 + warp * RPW + r;");
    w.line("if (i >= SEQ) continue;");
    if let Some(slot) = out_slot {
        w.line("const float inv = 1.0f / row_sum[r];");
        store_rows(&mut w, s.dtype, &format!("out{slot}"), "acc", "inv");
    }
    if let Some(slot) = lse_slot {
        w.line(format!(
            "if (lane == 0) out{slot}[bh * SEQ + i] = (row_max[r] + log2f(row_sum[r])) * {};",
            f32_literal(std::f32::consts::LN_2)
        ));
    }
    w.close();
    w.close();

    Ok(Emitted {
        summary: format!(
            "flash attention forward, {} x [{}, {}] {}{}",
            s.batch,
            s.seq,
            s.head_dim,
            s.dtype,
            if s.causal { ", causal" } else { "" }
        ),
        notes: vec![format!(
            "{} query rows a block ({} warps x {}), key tiles of {TILE}, {} bytes of shared memory; FMA path",
            l.rows,
            warps,
            rows_per_warp,
            shared_words * 4
        )],
        width: Some(width),
        code: w.finish(),
        launches: launches(&name, &s, &l, shared_words, params),
        scratch: Vec::new(),
        tables: Vec::new(),
    })
}

pub(crate) fn generate_backward(
    unit: &mut Unit<'_>,
    back: &AttentionBackward,
    warps: u32,
    rows_per_warp: u32,
) -> Result<Emitted> {
    let name = unit.name().to_string();
    let s = back.shape;
    let l = layout(&name, &s, warps, rows_per_warp)?;
    let d = s.dtype;
    check_dtypes(unit, &s, &[d, d, d, DType::F32, DType::F32, d], &vec![d; back.grads.len()])?;
    let width = IndexWidth::for_largest(unit.largest_buffer());
    let (declared, params) = unit.buffer_params();
    let queries = back.grads == [AttentionInput::Query];
    let slot = |g: AttentionInput| back.grads.iter().position(|&x| x == g);
    let shared_words = 2 * l.rows * s.head_dim + 2 * TILE * (s.head_dim + 1) + 2 * TILE;
    check_shared(unit, shared_words)?;
    let scale = f32_literal(s.scale as f32);

    let mut w = CodeWriter::new();
    w.line(format!("extern \"C\" __global__ void __launch_bounds__({}) {name}({})", warps * 32, declared.join(", ")));
    w.open("");
    prologue(&mut w, &s, &l, &backward_operands(back));
    w.line(format!("const float LOG2E = {};", f32_literal(std::f32::consts::LOG2_E)));
    if queries {
        w.line("float* qs = smem;                  // ROWS x DIM: the block's query rows");
        w.line("float* dos = qs + ROWS * DIM;      // ROWS x DIM: their output gradients");
        w.line("float* ks = dos + ROWS * DIM;      // TILE x PAD: a key tile");
        w.line("float* vs = ks + TILE * PAD;       // TILE x PAD: its values");
        stage(&mut w, d, "qs", "in0", "row0", "ROWS", "DIM");
        stage(&mut w, d, "dos", "in5", "row0", "ROWS", "DIM");
        w.line("float lse2[RPW], delta[RPW], dq[RPW][CHUNKS];");
        w.line("#pragma unroll");
        w.open("for (int r = 0; r < RPW; ++r)");
        w.line("const int i = min(row0 + warp * RPW + r, SEQ - 1);");
        w.line("lse2[r] = in3[bh * SEQ + i] * LOG2E;");
        w.line("delta[r] = in4[bh * SEQ + i];");
        w.line("#pragma unroll");
        w.line("for (int c = 0; c < CHUNKS; ++c) dq[r][c] = 0.0f;");
        w.close();
        w.line("const int key_end = CAUSAL ? min(SEQ, row0 + ROWS) : SEQ;");
        w.open("for (int k0 = 0; k0 < key_end; k0 += TILE)");
        w.line("__syncthreads();");
        stage(&mut w, d, "ks", "in1", "k0", "TILE", "PAD");
        stage(&mut w, d, "vs", "in2", "k0", "TILE", "PAD");
        w.line("__syncthreads();");
        w.line("const int j = k0 + lane;");
        w.line("#pragma unroll");
        w.open("for (int r = 0; r < RPW; ++r)");
        w.line("const int i = row0 + warp * RPW + r;");
        w.line("if (i >= SEQ) continue;  // warp-uniform");
        dot(&mut w, "score", "(qs + (warp * RPW + r) * DIM)", "(ks + lane * PAD)");
        dot(&mut w, "dp", "(dos + (warp * RPW + r) * DIM)", "(vs + lane * PAD)");
        w.line("const bool valid = j < SEQ && (!CAUSAL || j <= i);");
        w.line("const float p = valid ? exp2f(score * SCALE_LOG2 - lse2[r]) : 0.0f;");
        w.line("const float ds = p * (dp - delta[r]);");
        fold(&mut w, &[("dq", "ds", "ks")]);
        w.close();
        w.close();
        w.line("#pragma unroll");
        w.open("for (int r = 0; r < RPW; ++r)");
        w.line("const int i = row0 + warp * RPW + r;");
        w.line("if (i >= SEQ) continue;");
        store_rows(&mut w, d, "out0", "dq", &scale);
        w.close();
    } else {
        let (dk, dv) = (slot(AttentionInput::Key), slot(AttentionInput::Value));
        w.line("float* ks = smem;                  // ROWS x DIM: the block's key rows");
        w.line("float* vs = ks + ROWS * DIM;       // ROWS x DIM: their values");
        w.line("float* qs = vs + ROWS * DIM;       // TILE x PAD: a query tile");
        w.line("float* dos = qs + TILE * PAD;      // TILE x PAD: its output gradients");
        w.line("float* lse2s = dos + TILE * PAD;   // TILE: its lse * log2(e)");
        w.line("float* deltas = lse2s + TILE;      // TILE: its rowsum(dout * out)");
        stage(&mut w, d, "ks", "in1", "row0", "ROWS", "DIM");
        stage(&mut w, d, "vs", "in2", "row0", "ROWS", "DIM");
        w.line("float dk[RPW][CHUNKS], dv[RPW][CHUNKS];");
        w.line("#pragma unroll");
        w.open("for (int r = 0; r < RPW; ++r)");
        w.line("#pragma unroll");
        w.line("for (int c = 0; c < CHUNKS; ++c) { dk[r][c] = 0.0f; dv[r][c] = 0.0f; }");
        w.close();
        w.line("// Under the mask, query tiles before the block's first key row are never visited.");
        w.line("const int query_start = CAUSAL ? row0 / TILE * TILE : 0;");
        w.open("for (int q0 = query_start; q0 < SEQ; q0 += TILE)");
        w.line("__syncthreads();");
        stage(&mut w, d, "qs", "in0", "q0", "TILE", "PAD");
        stage(&mut w, d, "dos", "in5", "q0", "TILE", "PAD");
        w.open("if (threadIdx.x < TILE)");
        w.line("const int t = min(q0 + (int)threadIdx.x, SEQ - 1);");
        w.line("lse2s[threadIdx.x] = in3[bh * SEQ + t] * LOG2E;");
        w.line("deltas[threadIdx.x] = in4[bh * SEQ + t];");
        w.close();
        w.line("__syncthreads();");
        w.line("const int i = q0 + lane;");
        w.line("#pragma unroll");
        w.open("for (int r = 0; r < RPW; ++r)");
        w.line("const int j = row0 + warp * RPW + r;");
        w.line("if (j >= SEQ) continue;  // warp-uniform");
        dot(&mut w, "score", "(qs + lane * PAD)", "(ks + (warp * RPW + r) * DIM)");
        dot(&mut w, "dp", "(dos + lane * PAD)", "(vs + (warp * RPW + r) * DIM)");
        w.line("const bool valid = i < SEQ && (!CAUSAL || j <= i);");
        w.line("const float p = valid ? exp2f(score * SCALE_LOG2 - lse2s[lane]) : 0.0f;");
        w.line("const float ds = p * (dp - deltas[lane]);");
        let mut folds = Vec::new();
        if dk.is_some() {
            folds.push(("dk", "ds", "qs"));
        }
        if dv.is_some() {
            folds.push(("dv", "p", "dos"));
        }
        fold(&mut w, &folds);
        w.close();
        w.close();
        w.line("#pragma unroll");
        w.open("for (int r = 0; r < RPW; ++r)");
        w.line("const int i = row0 + warp * RPW + r;  // the key row");
        w.line("if (i >= SEQ) continue;");
        if let Some(k) = dk {
            store_rows(&mut w, d, &format!("out{k}"), "dk", &scale);
        }
        if let Some(v) = dv {
            store_rows(&mut w, d, &format!("out{v}"), "dv", "1.0f");
        }
        w.close();
    }
    w.close();

    let side = if queries { "dq over query tiles" } else { "dk/dv over key tiles" };
    Ok(Emitted {
        summary: format!(
            "flash attention backward ({side}), {} x [{}, {}] {}{}",
            s.batch,
            s.seq,
            s.head_dim,
            s.dtype,
            if s.causal { ", causal" } else { "" }
        ),
        notes: vec![format!(
            "{} rows a block ({} warps x {}), tiles of {TILE} of the other side, {} bytes of shared memory; FMA path",
            l.rows,
            warps,
            rows_per_warp,
            shared_words * 4
        )],
        width: Some(width),
        code: w.finish(),
        launches: launches(&name, &s, &l, shared_words, params),
        scratch: Vec::new(),
        tables: Vec::new(),
    })
}
