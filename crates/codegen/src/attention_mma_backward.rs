//! The flash-attention backward on tensor cores (what `attention_mma.rs` is to the forward):
//! the plan's two `attention_backward` sides as two kernels, each of `mma.sync.m16n8k16` with
//! f32 accumulators, operands staged by `cp.async` and read by `ldmatrix`.
//!
//! - dq: a warp owns 16 query rows (their `Q` and `dO` fragments held in registers); per key
//!   tile it computes `S = Q K^T` and `dP = dO V^T`, then `P = exp2(S * scale log2(e) - lse
//!   log2(e))` and `dS = P (dP - delta)` in the accumulators, and adds `dS K` (`K` read with
//!   `ldmatrix.trans`) into `dq`.
//! - dk/dv: a warp owns 16 key rows; per query tile it computes the transposed scores `S^T = K
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
use crate::attention_mma::{check_config, device_helpers, stage_rows, walk_tiles};
use crate::cuda::f32_literal;
use crate::error::{invalid_config, Result};
use crate::index::IndexWidth;
use crate::writer::CodeWriter;
use crate::{Emitted, Launch, Unit};
use braze_ir::{AttentionInput, DType};
use braze_plan::AttentionBackward;

/// Rows of the walked side (keys for dq, queries for dk/dv) per step: 64, or 32 for head dims
/// above 64, whose dk and dv accumulators take twice the registers.
fn walk_tile(head_dim: usize) -> usize {
    if head_dim > 64 {
        32
    } else {
        64
    }
}

pub(crate) fn generate(unit: &mut Unit<'_>, back: &AttentionBackward, warps: u32, stages: u32) -> Result<Emitted> {
    let name = unit.name().to_string();
    let s = back.shape;
    check_config(unit, &s, warps, stages)?;
    let d = s.dtype;
    check_dtypes(unit, &s, &[d, d, d, DType::F32, DType::F32, d], &vec![d; back.grads.len()])?;
    let queries = back.grads == [AttentionInput::Query];
    let rows = 16 * warps as usize;
    let walk = walk_tile(s.head_dim);
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
        "constexpr int SEQ = {}, DIM = {}, ROWS = {rows}, WT = {walk}, STRIDE = {stride};",
        s.seq, s.head_dim
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
    w.line("const int row0 = tile * ROWS, warp_row0 = row0 + warp * 16;");
    w.line("const idx_t base = bh * (idx_t)SEQ * DIM;");
    w.line("extern __shared__ uint4 smem_words[];");
    if queries {
        dq_body(&mut w, stages);
    } else {
        let slot = |g: AttentionInput| back.grads.iter().position(|&x| x == g);
        dkdv_body(&mut w, stages, slot(AttentionInput::Key), slot(AttentionInput::Value));
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
            "{rows} rows a block ({warps} warps x 16), tiles of {walk} of the other side ({stages} in shared memory at once), {shared_bytes} bytes of shared memory; mma.sync m16n8k16, ldmatrix, cp.async"
        )],
        width: Some(width),
        code: w.finish(),
        launches,
        scratch: Vec::new(),
        tables: Vec::new(),
    })
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

/// `float name[tiles][4] = 0`.
fn zeroed(w: &mut CodeWriter, name: &str, tiles: &str) {
    w.line(format!("float {name}[{tiles}][4];"));
    w.line("#pragma unroll");
    w.line(format!(
        "for (int j = 0; j < {tiles}; ++j) {name}[j][0] = {name}[j][1] = {name}[j][2] = {name}[j][3] = 0.0f;"
    ));
}

/// The A fragment of 16 columns `2 kk` and `2 kk + 1` of an accumulator set, rounded.
fn packed(w: &mut CodeWriter, into: &str, acc: &str) {
    w.line(format!(
        "const unsigned {into}[4] = {{pack_half2({acc}[2 * kk][0], {acc}[2 * kk][1]), pack_half2({acc}[2 * kk][2], {acc}[2 * kk][3]),"
    ));
    w.line(format!(
        "                        pack_half2({acc}[2 * kk + 1][0], {acc}[2 * kk + 1][1]), pack_half2({acc}[2 * kk + 1][2], {acc}[2 * kk + 1][3])}};"
    ));
}

/// Stores a warp's 16 rows of `acc` (rows `first + g`, `first + g + 8`) times `factor` to `out`.
fn store(w: &mut CodeWriter, out: &str, acc: &str, first: &str, factor: &str) {
    w.line("#pragma unroll");
    w.open("for (int h = 0; h < 2; ++h)");
    w.line(format!("const int i = {first} + g + 8 * h;"));
    w.line("if (i >= SEQ) continue;");
    w.line("#pragma unroll");
    w.open("for (int j = 0; j < DTILES; ++j)");
    w.line(format!(
        "*reinterpret_cast<unsigned*>({out} + base + (idx_t)i * DIM + j * 8 + 2 * t) = pack_half2({acc}[j][2 * h] * {factor}, {acc}[j][2 * h + 1] * {factor});"
    ));
    w.close();
    w.close();
}

/// dq: inputs q, k, v, lse, delta, dout; output 0.
fn dq_body(w: &mut CodeWriter, stages: u32) {
    w.line("unsigned short* qs = reinterpret_cast<unsigned short*>(smem_words);  // ROWS x STRIDE");
    w.line("unsigned short* dos = qs + ROWS * STRIDE;                            // ROWS x STRIDE");
    w.line(format!(
        "unsigned short* kv = dos + ROWS * STRIDE;  // {stages} x (a key tile, its values): WT x STRIDE each"
    ));
    stage_rows(w, "qs", "in0", "row0", "ROWS");
    stage_rows(w, "dos", "in5", "row0", "ROWS");
    w.line("asm volatile(\"cp.async.wait_group 0;\" ::);");
    w.line("__syncthreads();");
    w.line("// The warp's Q and dO fragments: 16 rows x DIM, one A fragment per 16 columns.");
    w.line("unsigned qf[KSTEPS][4], df[KSTEPS][4];");
    w.line("#pragma unroll");
    w.open("for (int kk = 0; kk < KSTEPS; ++kk)");
    a_fragment(w, "qf[kk]", "qs", "warp * 16", "kk * 16");
    a_fragment(w, "df[kk]", "dos", "warp * 16", "kk * 16");
    w.close();
    w.line("const int qrow[2] = {warp_row0 + g, warp_row0 + g + 8};");
    w.line("float lse2[2], delta[2];");
    w.line("#pragma unroll");
    w.open("for (int h = 0; h < 2; ++h)");
    w.line("const int i = min(qrow[h], SEQ - 1);");
    w.line("lse2[h] = in3[bh * SEQ + i] * LOG2E;");
    w.line("delta[h] = in4[bh * SEQ + i];");
    w.close();
    zeroed(w, "dq", "DTILES");
    w.line("const int key_end = CAUSAL ? min(SEQ, row0 + ROWS) : SEQ;");
    walk_tiles(
        w,
        stages,
        "k0",
        "0",
        "key_end",
        "WT",
        &[("ks", "in1", "kv"), ("vs", "in2", "kv + WT * STRIDE")],
        "2 * WT * STRIDE",
        &|_, _, _| {},
    );
    w.line("if (CAUSAL && k0 > warp_row0 + 15) continue;  // every key of the tile after the warp's rows");
    zeroed(w, "sc", "WT / 8");
    zeroed(w, "dp", "WT / 8");
    w.line("#pragma unroll");
    w.open("for (int kk = 0; kk < KSTEPS; ++kk)");
    w.line("#pragma unroll");
    w.open("for (int np = 0; np < WT / 16; ++np)");
    w.line("unsigned kb[4], vb[4];");
    b_fragments(w, "kb", "ks", "np * 16", "kk * 16");
    b_fragments(w, "vb", "vs", "np * 16", "kk * 16");
    w.line("mma_16816(sc[2 * np], qf[kk], kb[0], kb[1]);");
    w.line("mma_16816(sc[2 * np + 1], qf[kk], kb[2], kb[3]);");
    w.line("mma_16816(dp[2 * np], df[kk], vb[0], vb[1]);");
    w.line("mma_16816(dp[2 * np + 1], df[kk], vb[2], vb[3]);");
    w.close();
    w.close();
    w.line("// dS = P (dP - delta) in place of the scores.");
    w.line("#pragma unroll");
    w.open("for (int j = 0; j < WT / 8; ++j)");
    w.line("#pragma unroll");
    w.open("for (int c = 0; c < 4; ++c)");
    w.line("const int key = k0 + j * 8 + 2 * t + (c & 1), h = c >> 1;");
    w.line("const bool valid = key < SEQ && (!CAUSAL || key <= qrow[h]);");
    w.line("const float p = valid ? exp2f(sc[j][c] * SCALE_LOG2 - lse2[h]) : 0.0f;");
    w.line("sc[j][c] = p * (dp[j][c] - delta[h]);");
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
    w.line("mma_16816(dq[2 * dn], sf, kb[0], kb[1]);");
    w.line("mma_16816(dq[2 * dn + 1], sf, kb[2], kb[3]);");
    w.close();
    w.close();
    w.close();
    store(w, "out0", "dq", "warp_row0", "SCALE");
}

/// dk and/or dv: inputs q, k, v, lse, delta, dout; outputs at the given slots.
fn dkdv_body(w: &mut CodeWriter, stages: u32, dk: Option<usize>, dv: Option<usize>) {
    w.line("unsigned short* ks = reinterpret_cast<unsigned short*>(smem_words);  // ROWS x STRIDE");
    w.line("unsigned short* vs = ks + ROWS * STRIDE;                             // ROWS x STRIDE");
    w.line(format!("unsigned short* qdo = vs + ROWS * STRIDE;  // {stages} x (a query tile, its output gradients): WT x STRIDE each"));
    w.line(format!("float* stats = reinterpret_cast<float*>(qdo + {stages} * 2 * WT * STRIDE);  // {stages} x (lse * log2(e), rowsum(dout * out)): WT each"));
    stage_rows(w, "ks", "in1", "row0", "ROWS");
    stage_rows(w, "vs", "in2", "row0", "ROWS");
    w.line("const int krow[2] = {warp_row0 + g, warp_row0 + g + 8};");
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
        stages,
        "q0",
        "query_start",
        "SEQ",
        "WT",
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
    w.line("unsigned kf[4];  // the warp's 16 keys, dims 16 kk .. 16 kk + 15");
    a_fragment(w, "kf", "ks", "warp * 16", "kk * 16");
    if dk.is_some() {
        w.line("unsigned vf[4];");
        a_fragment(w, "vf", "vs", "warp * 16", "kk * 16");
    }
    w.line("#pragma unroll");
    w.open("for (int np = 0; np < WT / 16; ++np)");
    w.line("unsigned qb[4];");
    b_fragments(w, "qb", "qs", "np * 16", "kk * 16");
    w.line("mma_16816(st[2 * np], kf, qb[0], qb[1]);");
    w.line("mma_16816(st[2 * np + 1], kf, qb[2], qb[3]);");
    if dk.is_some() {
        w.line("unsigned db[4];");
        b_fragments(w, "db", "dos", "np * 16", "kk * 16");
        w.line("mma_16816(dpt[2 * np], vf, db[0], db[1]);");
        w.line("mma_16816(dpt[2 * np + 1], vf, db[2], db[3]);");
    }
    w.close();
    w.close();
    w.line(if dk.is_some() {
        "// P^T in place of the scores, dS^T = P^T (dP^T - delta) in place of dP^T."
    } else {
        "// P^T in place of the scores."
    });
    w.line("#pragma unroll");
    w.open("for (int j = 0; j < WT / 8; ++j)");
    w.line("#pragma unroll");
    w.open("for (int c = 0; c < 4; ++c)");
    w.line("const int ql = j * 8 + 2 * t + (c & 1), q = q0 + ql, key = krow[c >> 1];");
    w.line("const bool valid = q < SEQ && key < SEQ && (!CAUSAL || key <= q);");
    w.line("const float p = valid ? exp2f(st[j][c] * SCALE_LOG2 - lse2s[ql]) : 0.0f;");
    w.line("st[j][c] = p;");
    if dk.is_some() {
        w.line("dpt[j][c] = p * (dpt[j][c] - deltas[ql]);");
    }
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
        w.line("mma_16816(dv[2 * dn], pf, db[0], db[1]);");
        w.line("mma_16816(dv[2 * dn + 1], pf, db[2], db[3]);");
    }
    if dk.is_some() {
        w.line("unsigned qb[4];");
        b_fragments_trans(w, "qb", "qs", "kk * 16", "dn * 16");
        w.line("mma_16816(dk[2 * dn], sf, qb[0], qb[1]);");
        w.line("mma_16816(dk[2 * dn + 1], sf, qb[2], qb[3]);");
    }
    w.close();
    w.close();
    w.close();
    if let Some(slot) = dk {
        store(w, &format!("out{slot}"), "dk", "warp_row0", "SCALE");
    }
    if let Some(slot) = dv {
        store(w, &format!("out{slot}"), "dv", "warp_row0", "1.0f");
    }
}
