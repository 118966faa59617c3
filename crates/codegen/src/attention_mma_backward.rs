//! The flash-attention backward on tensor cores (what `attention_mma.rs` is to the forward):
//! the plan's two `attention_backward` sides as two kernels, each of `mma.sync.m16n8k16` with
//! f32 accumulators, operands staged by `cp.async` and read by `ldmatrix`.
//!
//! A warp owns one or two blocks of 16 rows of its side (`rows_per_warp` 16 or 32; two halve
//! the shared-memory reads per mma, as in the forward), and only tiles that cross the diagonal
//! or the sequence's end are masked.
//!
//! - dq: a warp owns its query rows (their `Q` and `dO` fragments held in registers); per key
//!   tile it computes `S = Q K^T` and `dP = dO V^T`, then `P = exp2(S * scale log2(e) - lse
//!   log2(e))` and `dS = P (dP - delta)` in the accumulators, and adds `dS K` (`K` read with
//!   `ldmatrix.trans`) into `dq`.
//! - dk/dv: a warp owns its key rows; per query tile it computes the transposed scores `S^T = K
//!   Q^T` and `dP^T = V dO^T`, so that `P^T` and `dS^T` sit in the accumulator layout, which
//!   is the A layout of `P^T dO` into `dv` and `dS^T Q` into `dk`.
//!
//! `P` and `dS` are rounded to the operand dtype as mma operands (as flash-attention does);
//! every sum is f32. Each gradient element is summed by one thread in one order, so the results
//! have the same bits on every run (the reason for two kernels, see `attention.rs`). Under a
//! causal mask a warp skips the tiles wholly on the far side of the diagonal from its rows.
//! Without a GPU, `tests/emulated.rs` runs these kernels (and the forward) on the CPU against
//! the reference.

use crate::attention::check_dtypes;
use crate::attention_layout::{backward_operands, declare_rows};
use crate::attention_mma::{check_config, device_helpers, stage_rows, walk_tiles, Staging};
use crate::cuda::f32_literal;
use crate::error::{invalid_config, Result};
use crate::index::IndexWidth;
use crate::writer::CodeWriter;
use crate::{Emitted, Launch, Unit};
use braze_ir::{AttentionInput, DType};
use braze_plan::AttentionBackward;

/// Rows of the walked side (keys for dq, queries for dk/dv) per step: 64 for one block of 16
/// rows a warp at head dims up to 64; 32 for two blocks or wider heads, whose accumulators take
/// twice the registers.
fn walk_tile(head_dim: usize, rows_per_warp: u32) -> usize {
    if head_dim > 64 || rows_per_warp > 16 {
        32
    } else {
        64
    }
}

pub(crate) fn generate(
    unit: &mut Unit<'_>,
    back: &AttentionBackward,
    warps: u32,
    rows_per_warp: u32,
    stages: u32,
) -> Result<Emitted> {
    let name = unit.name().to_string();
    let s = back.shape;
    check_config(unit, &s, &back.layouts(), warps, rows_per_warp, stages)?;
    let d = s.dtype;
    check_dtypes(unit, &s, &[d, d, d, DType::F32, DType::F32, d], &vec![d; back.grads.len()])?;
    let queries = back.grads == [AttentionInput::Query];
    let rows = (rows_per_warp * warps) as usize;
    let walk = walk_tile(s.head_dim, rows_per_warp);
    let stride = s.head_dim + 8;
    let per_stage = 2 * walk * stride * 2 + if queries { 0 } else { 2 * walk * 4 };
    let shared_bytes = 2 * rows * stride * 2 + stages as usize * per_stage;
    if shared_bytes > unit.target.shared_memory_per_block_optin as usize {
        return Err(invalid_config(&name, format!("{shared_bytes} bytes of shared memory a block")));
    }
    let width = IndexWidth::for_largest(unit.largest_buffer());
    let (declared, params) = unit.buffer_params();
    let tiles = s.seq.div_ceil(rows);

    let mut w = CodeWriter::new();
    device_helpers(&mut w, d);
    w.line(format!("extern \"C\" __global__ void __launch_bounds__({}) {name}({})", warps * 32, declared.join(", ")));
    w.open("");
    w.line(format!(
        "constexpr int SEQ = {}, DIM = {}, ROWS = {rows}, WT = {walk}, STRIDE = {stride}, MT = {}, RW = 16 * MT;",
        s.seq,
        s.head_dim,
        rows_per_warp / 16
    ));
    w.line("constexpr int KSTEPS = DIM / 16, DTILES = DIM / 8, CHUNKS = DIM / 8;");
    w.line(format!("constexpr float SCALE_LOG2 = {};", f32_literal((s.scale * std::f64::consts::LOG2_E) as f32)));
    w.line(format!("constexpr float SCALE = {};", f32_literal(s.scale as f32)));
    w.line(format!("constexpr bool CAUSAL = {};", s.causal));
    w.line(format!("const float LOG2E = {};", f32_literal(std::f32::consts::LOG2_E)));
    w.line("const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;");
    w.line("const int g = lane >> 2, t = lane & 3;  // the accumulator row (and row + 8) and column pair");
    w.line("const int m = lane >> 3;  // the 8 x 8 matrix whose row address this lane gives ldmatrix");
    w.line(format!("const int tiles = {tiles};"));
    w.line(
        "const int tile = tiles - 1 - (int)(blockIdx.x % tiles);  // latest rows first: under a mask they do the most",
    );
    w.line("const idx_t bh = blockIdx.x / tiles;");
    w.line("const int row0 = tile * ROWS, warp_row0 = row0 + warp * RW;");
    declare_rows(&mut w, &s, &backward_operands(back));
    w.line("extern __shared__ uint4 smem_words[];");
    let tiling = Tiles { stages, staging: Staging::new(warps, &s), rows, walk };
    if queries {
        dq_body(&mut w, tiling);
    } else {
        let slot = |g: AttentionInput| back.grads.iter().position(|&x| x == g);
        dkdv_body(&mut w, tiling, slot(AttentionInput::Key), slot(AttentionInput::Value));
    }
    w.close();

    let launches = if s.batch * tiles == 0 {
        Vec::new()
    } else {
        vec![Launch {
            entry: name.clone(),
            grid: [(s.batch * tiles) as u32, 1, 1],
            block: [warps * 32, 1, 1],
            shared_bytes: shared_bytes as u32,
            params,
        }]
    };
    let side = if queries { "dq over query tiles" } else { "dk/dv over key tiles" };
    Ok(Emitted {
        summary: format!(
            "flash attention backward ({side}) on tensor cores, {} x [{}, {}] {}{}",
            s.batch,
            s.seq,
            s.head_dim,
            s.dtype,
            if s.causal { ", causal" } else { "" }
        ),
        notes: vec![format!(
            "{rows} rows a block ({warps} warps x {rows_per_warp}), tiles of {walk} of the other side ({stages} in shared memory at once), {shared_bytes} bytes of shared memory; mma.sync m16n8k16, ldmatrix, cp.async"
        )],
        width: Some(width),
        code: w.finish(),
        launches,
        scratch: Vec::new(),
        tables: Vec::new(),
    })
}

/// A kernel's tiling: its stages, its copies, the rows a block owns and the walked tile.
#[derive(Clone, Copy)]
struct Tiles {
    stages: u32,
    staging: Staging,
    rows: usize,
    walk: usize,
}

/// `ldmatrix_x4` of the 16 x 16 A fragment at rows `row`, columns `col` of `rows`.
fn a_fragment(w: &mut CodeWriter, into: &str, rows: &str, row: &str, col: &str) {
    w.line(format!(
        "ldmatrix_x4({into}, {rows} + ({row} + (lane & 7) + (m & 1) * 8) * STRIDE + {col} + (m >> 1) * 8);"
    ));
}

/// `ldmatrix_x4` of the B fragments of two 8-wide n tiles from `rows` stored n-major: n rows
/// `n..n + 16`, k columns `k..k + 16`; registers 0, 1 for the first tile, 2, 3 the second.
fn b_fragments(w: &mut CodeWriter, into: &str, rows: &str, n: &str, k: &str) {
    w.line(format!("ldmatrix_x4({into}, {rows} + ({n} + (lane & 7) + (m >> 1) * 8) * STRIDE + {k} + (m & 1) * 8);"));
}

/// As [`b_fragments`] from `rows` stored k-major (`ldmatrix.trans`): k rows `k..k + 16`, n
/// columns `n..n + 16`.
fn b_fragments_trans(w: &mut CodeWriter, into: &str, rows: &str, k: &str, n: &str) {
    w.line(format!(
        "ldmatrix_x4_trans({into}, {rows} + ({k} + (lane & 7) + (m & 1) * 8) * STRIDE + {n} + (m >> 1) * 8);"
    ));
}

/// `float name[MT][tiles][4] = 0`: a set of accumulator tiles per row block of the warp.
fn zeroed(w: &mut CodeWriter, name: &str, tiles: &str) {
    w.line(format!("float {name}[MT][{tiles}][4];"));
    w.line("#pragma unroll");
    w.line("for (int mi = 0; mi < MT; ++mi)");
    w.line("    #pragma unroll");
    w.line(format!(
        "    for (int j = 0; j < {tiles}; ++j) {name}[mi][j][0] = {name}[mi][j][1] = {name}[mi][j][2] = {name}[mi][j][3] = 0.0f;"
    ));
}

/// The A fragments (one per row block) of 16 columns `2 kk` and `2 kk + 1` of an accumulator
/// set, rounded.
fn packed(w: &mut CodeWriter, into: &str, acc: &str) {
    w.line(format!("unsigned {into}[MT][4];"));
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < MT; ++mi)");
    for (r, (j, c)) in [("2 * kk", 0), ("2 * kk", 2), ("2 * kk + 1", 0), ("2 * kk + 1", 2)].into_iter().enumerate() {
        w.line(format!("{into}[mi][{r}] = pack_half2({acc}[mi][{j}][{c}], {acc}[mi][{j}][{}]);", c + 1));
    }
    w.close();
}

/// `acc[mi][2 dn] += a[mi] b[0..2]`, `acc[mi][2 dn + 1] += a[mi] b[2..4]` for each row block.
fn mma_pair(w: &mut CodeWriter, acc: &str, tile: &str, a: &str, b: &str) {
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < MT; ++mi)");
    w.line(format!("mma_16816({acc}[mi][2 * {tile}], {a}, {b}[0], {b}[1]);"));
    w.line(format!("mma_16816({acc}[mi][2 * {tile} + 1], {a}, {b}[2], {b}[3]);"));
    w.close();
}

/// Stores a warp's rows of `acc` (block `mi`: rows `warp_row0 + 16 mi + g` and `+ 8`) times
/// `factor` to `out`.
fn store(w: &mut CodeWriter, out: &str, acc: &str, factor: &str) {
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < MT; ++mi)");
    w.line("#pragma unroll");
    w.open("for (int h = 0; h < 2; ++h)");
    w.line("const int i = warp_row0 + mi * 16 + g + 8 * h;");
    w.line("if (i >= SEQ) continue;");
    w.line("#pragma unroll");
    w.open("for (int j = 0; j < DTILES; ++j)");
    w.line(format!(
        "*reinterpret_cast<unsigned*>({out} + {out}_at + (idx_t)i * {out}_row + j * 8 + 2 * t) = pack_half2({acc}[mi][j][2 * h] * {factor}, {acc}[mi][j][2 * h + 1] * {factor});"
    ));
    w.close();
    w.close();
    w.close();
}

/// dq: inputs q, k, v, lse, delta, dout; output 0.
fn dq_body(w: &mut CodeWriter, tiles: Tiles) {
    let stages = tiles.stages;
    w.line("unsigned short* qs = reinterpret_cast<unsigned short*>(smem_words);  // ROWS x STRIDE");
    w.line("unsigned short* dos = qs + ROWS * STRIDE;                            // ROWS x STRIDE");
    w.line(format!(
        "unsigned short* kv = dos + ROWS * STRIDE;  // {stages} x (a key tile, its values): WT x STRIDE each"
    ));
    stage_rows(w, tiles.staging, "qs", "in0", "row0", tiles.rows);
    stage_rows(w, tiles.staging, "dos", "in5", "row0", tiles.rows);
    w.line("asm volatile(\"cp.async.wait_group 0;\" ::);");
    w.line("__syncthreads();");
    w.line("// The warp's Q and dO fragments: MT blocks of 16 rows x DIM, one A fragment per 16 columns.");
    w.line("unsigned qf[MT][KSTEPS][4], df[MT][KSTEPS][4];");
    w.line("float lse2[MT][2], delta[MT][2];");
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < MT; ++mi)");
    w.line("#pragma unroll");
    w.open("for (int kk = 0; kk < KSTEPS; ++kk)");
    a_fragment(w, "qf[mi][kk]", "qs", "warp * RW + mi * 16", "kk * 16");
    a_fragment(w, "df[mi][kk]", "dos", "warp * RW + mi * 16", "kk * 16");
    w.close();
    w.line("#pragma unroll");
    w.open("for (int h = 0; h < 2; ++h)");
    w.line("const int i = min(warp_row0 + mi * 16 + g + 8 * h, SEQ - 1);");
    w.line("lse2[mi][h] = in3[bh * SEQ + i] * LOG2E;");
    w.line("delta[mi][h] = in4[bh * SEQ + i];");
    w.close();
    w.close();
    zeroed(w, "dq", "DTILES");
    w.line("const int key_end = CAUSAL ? min(SEQ, row0 + ROWS) : SEQ;");
    walk_tiles(
        w,
        tiles.staging,
        stages,
        "k0",
        "0",
        "key_end",
        tiles.walk,
        &[("ks", "in1", "kv"), ("vs", "in2", "kv + WT * STRIDE")],
        "2 * WT * STRIDE",
        &|_, _, _| {},
    );
    w.line("if (CAUSAL && k0 > warp_row0 + RW - 1) continue;  // every key of the tile after the warp's rows");
    zeroed(w, "sc", "WT / 8");
    zeroed(w, "dp", "WT / 8");
    w.line("#pragma unroll");
    w.open("for (int kk = 0; kk < KSTEPS; ++kk)");
    w.line("#pragma unroll");
    w.open("for (int np = 0; np < WT / 16; ++np)");
    w.line("unsigned kb[4], vb[4];  // shared by the warp's row blocks");
    b_fragments(w, "kb", "ks", "np * 16", "kk * 16");
    b_fragments(w, "vb", "vs", "np * 16", "kk * 16");
    mma_pair(w, "sc", "np", "qf[mi][kk]", "kb");
    mma_pair(w, "dp", "np", "df[mi][kk]", "vb");
    w.close();
    w.close();
    w.line("// dS = P (dP - delta) in place of the scores; only tiles past the sequence or across the");
    w.line("// diagonal of the warp's rows mask.");
    w.line("const bool edge = k0 + WT > SEQ || (CAUSAL && k0 + WT - 1 > warp_row0);");
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < MT; ++mi)");
    w.line("#pragma unroll");
    w.open("for (int j = 0; j < WT / 8; ++j)");
    w.line("#pragma unroll");
    w.open("for (int c = 0; c < 4; ++c)");
    w.line("const int key = k0 + j * 8 + 2 * t + (c & 1), h = c >> 1, q = warp_row0 + mi * 16 + g + 8 * h;");
    w.line("float p = fast_exp2(fmaf(sc[mi][j][c], SCALE_LOG2, -lse2[mi][h]));");
    w.line("if (edge && (key >= SEQ || (CAUSAL && key > q))) p = 0.0f;");
    w.line("sc[mi][j][c] = p * (dp[mi][j][c] - delta[mi][h]);");
    w.close();
    w.close();
    w.close();
    w.line("// dq += dS K: two score tiles are one A fragment of 16 keys.");
    w.line("#pragma unroll");
    w.open("for (int kk = 0; kk < WT / 16; ++kk)");
    packed(w, "sf", "sc");
    w.line("#pragma unroll");
    w.open("for (int dn = 0; dn < DTILES / 2; ++dn)");
    w.line("unsigned kb[4];");
    b_fragments_trans(w, "kb", "ks", "kk * 16", "dn * 16");
    mma_pair(w, "dq", "dn", "sf[mi]", "kb");
    w.close();
    w.close();
    w.close();
    store(w, "out0", "dq", "SCALE");
}

/// dk and/or dv: inputs q, k, v, lse, delta, dout; outputs at the given slots.
fn dkdv_body(w: &mut CodeWriter, tiles: Tiles, dk: Option<usize>, dv: Option<usize>) {
    let stages = tiles.stages;
    w.line("unsigned short* ks = reinterpret_cast<unsigned short*>(smem_words);  // ROWS x STRIDE");
    w.line("unsigned short* vs = ks + ROWS * STRIDE;                             // ROWS x STRIDE");
    w.line(format!("unsigned short* qdo = vs + ROWS * STRIDE;  // {stages} x (a query tile, its output gradients): WT x STRIDE each"));
    w.line(format!("float* stats = reinterpret_cast<float*>(qdo + {stages} * 2 * WT * STRIDE);  // {stages} x (lse * log2(e), rowsum(dout * out)): WT each"));
    stage_rows(w, tiles.staging, "ks", "in1", "row0", tiles.rows);
    stage_rows(w, tiles.staging, "vs", "in2", "row0", tiles.rows);
    if dk.is_some() {
        zeroed(w, "dk", "DTILES");
    }
    if dv.is_some() {
        zeroed(w, "dv", "DTILES");
    }
    w.line("// Under the mask, query tiles before the block's first key row are never visited.");
    w.line("const int query_start = CAUSAL ? row0 / WT * WT : 0;");
    walk_tiles(
        w,
        tiles.staging,
        stages,
        "q0",
        "query_start",
        "SEQ",
        tiles.walk,
        &[("qs", "in0", "qdo"), ("dos", "in5", "qdo + WT * STRIDE")],
        "2 * WT * STRIDE",
        &|w, slot, row| {
            w.open("for (int e = threadIdx.x; e < WT; e += blockDim.x)");
            w.line(format!("const int i = min({row} + e, SEQ - 1);"));
            w.line(format!("stats[{slot} * 2 * WT + e] = in3[bh * SEQ + i] * LOG2E;"));
            w.line(format!("stats[{slot} * 2 * WT + WT + e] = in4[bh * SEQ + i];"));
            w.close();
        },
    );
    w.line(if stages == 1 { "const float* lse2s = stats;" } else { "const float* lse2s = stats + slot * 2 * WT;" });
    w.line("const float* deltas = lse2s + WT;");
    w.line("if (CAUSAL && q0 + WT - 1 < warp_row0) continue;  // every query of the tile before the warp's keys");
    zeroed(w, "st", "WT / 8");
    if dk.is_some() {
        zeroed(w, "dpt", "WT / 8");
    }
    w.line("#pragma unroll");
    w.open("for (int kk = 0; kk < KSTEPS; ++kk)");
    w.line("unsigned kf[MT][4];  // the warp's keys, dims 16 kk .. 16 kk + 15");
    if dk.is_some() {
        w.line("unsigned vf[MT][4];");
    }
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < MT; ++mi)");
    a_fragment(w, "kf[mi]", "ks", "warp * RW + mi * 16", "kk * 16");
    if dk.is_some() {
        a_fragment(w, "vf[mi]", "vs", "warp * RW + mi * 16", "kk * 16");
    }
    w.close();
    w.line("#pragma unroll");
    w.open("for (int np = 0; np < WT / 16; ++np)");
    w.line("unsigned qb[4];  // shared by the warp's row blocks");
    b_fragments(w, "qb", "qs", "np * 16", "kk * 16");
    mma_pair(w, "st", "np", "kf[mi]", "qb");
    if dk.is_some() {
        w.line("unsigned db[4];");
        b_fragments(w, "db", "dos", "np * 16", "kk * 16");
        mma_pair(w, "dpt", "np", "vf[mi]", "db");
    }
    w.close();
    w.close();
    w.line(if dk.is_some() {
        "// P^T in place of the scores, dS^T = P^T (dP^T - delta) in place of dP^T; only tiles past"
    } else {
        "// P^T in place of the scores; only tiles past"
    });
    w.line("// the sequence or across the diagonal of the warp's keys mask.");
    w.line("const bool edge = q0 + WT > SEQ || (CAUSAL && q0 < warp_row0 + RW - 1);");
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < MT; ++mi)");
    w.line("#pragma unroll");
    w.open("for (int j = 0; j < WT / 8; ++j)");
    w.line("#pragma unroll");
    w.open("for (int c = 0; c < 4; ++c)");
    w.line("const int ql = j * 8 + 2 * t + (c & 1), q = q0 + ql, key = warp_row0 + mi * 16 + g + 8 * (c >> 1);");
    w.line("float p = fast_exp2(fmaf(st[mi][j][c], SCALE_LOG2, -lse2s[ql]));");
    w.line("if (edge && (q >= SEQ || (CAUSAL && key > q))) p = 0.0f;");
    w.line("st[mi][j][c] = p;");
    if dk.is_some() {
        w.line("dpt[mi][j][c] = p * (dpt[mi][j][c] - deltas[ql]);");
    }
    w.close();
    w.close();
    w.close();
    w.line("// dv += P^T dO and dk += dS^T Q: two tiles are one A fragment of 16 queries.");
    w.line("#pragma unroll");
    w.open("for (int kk = 0; kk < WT / 16; ++kk)");
    if dv.is_some() {
        packed(w, "pf", "st");
    }
    if dk.is_some() {
        packed(w, "sf", "dpt");
    }
    w.line("#pragma unroll");
    w.open("for (int dn = 0; dn < DTILES / 2; ++dn)");
    if dv.is_some() {
        w.line("unsigned db[4];");
        b_fragments_trans(w, "db", "dos", "kk * 16", "dn * 16");
        mma_pair(w, "dv", "dn", "pf[mi]", "db");
    }
    if dk.is_some() {
        w.line("unsigned qb[4];");
        b_fragments_trans(w, "qb", "qs", "kk * 16", "dn * 16");
        mma_pair(w, "dk", "dn", "sf[mi]", "qb");
    }
    w.close();
    w.close();
    w.close();
    if let Some(slot) = dk {
        store(w, &format!("out{slot}"), "dk", "SCALE");
    }
    if let Some(slot) = dv {
        store(w, &format!("out{slot}"), "dv", "1.0f");
    }
}
