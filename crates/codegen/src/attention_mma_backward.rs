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
//! - dq beside dk/dv (a plan kernel of all three gradients): the dk/dv kernel also puts each
//!   query tile's `dS^T` into shared memory, and after a barrier the block's warps compute that
//!   tile's `dS K` over the block's keys (`dS` read with `ldmatrix.trans`, each warp a part of
//!   the tile's rows and columns) and add it into an f32 copy of dq with vector reductions
//!   (`red.global.add.v2.f32`); a second launch writes dq, scaled and rounded, and zeroes the
//!   copy for the next run. The scores are computed once, not once per kernel: five products
//!   per tile pair instead of seven.
//!
//! `P` and `dS` are rounded to the operand dtype as mma operands (as flash-attention does);
//! every sum is f32. In the dq and dk/dv kernels each gradient element is summed by one thread
//! in one order, so the results have the same bits on every run; the dq added by the blocks of
//! a fused kernel is summed in the order they arrive. Under a causal mask a warp skips the
//! tiles wholly on the far side of the diagonal from its rows.
//! Without a GPU, `tests/emulated.rs` runs these kernels (and the forward) on the CPU against
//! the reference.

use crate::attention::check_dtypes;
use crate::attention_layout::{backward_operands, declare_rows};
use crate::attention_mma::{check_config, device_helpers, stage_rows, walk_tiles, Staging};
use crate::cuda::f32_literal;
use crate::error::{invalid_config, Result};
use crate::index::IndexWidth;
use crate::writer::CodeWriter;
use crate::{grid_for, Emitted, Launch, Param, ScratchSpec, Unit};
use braze_ir::{AttentionInput, DType};
use braze_plan::{AttentionBackward, AttentionShape};

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

/// How a fused kernel's warps share one query tile's `dS K`: each takes `m_blocks` blocks of 16
/// query rows from `first_m` (`m_blocks` per warp, or one block shared by several warps) and
/// `n_pairs` pairs of 8 columns from `first_n` (expressions of `warp`).
struct DqSplit {
    m_blocks: usize,
    n_pairs: usize,
    first_m: String,
    first_n: String,
}

/// The split of a `walk x head_dim` dq tile over `warps` warps, if one is even: whole blocks of
/// rows a warp, or the column pairs of a block shared evenly.
fn dq_split(walk: usize, head_dim: usize, warps: usize) -> Option<DqSplit> {
    let (blocks, pairs) = (walk / 16, head_dim / 16);
    if blocks.is_multiple_of(warps) {
        let m_blocks = blocks / warps;
        return Some(DqSplit { m_blocks, n_pairs: pairs, first_m: format!("warp * {m_blocks}"), first_n: "0".into() });
    }
    let sharing = warps / blocks;
    (warps.is_multiple_of(blocks) && pairs.is_multiple_of(sharing)).then(|| {
        let n_pairs = pairs / sharing;
        DqSplit {
            m_blocks: 1,
            n_pairs,
            first_m: format!("warp / {sharing}"),
            first_n: format!("warp % {sharing} * {n_pairs}"),
        }
    })
}

/// Whether a kernel of all three gradients can run on tensor cores with `warps` warps of
/// `rows_per_warp` rows (its dq tiles split evenly over the warps).
pub(crate) fn fused_dq_fits(head_dim: usize, warps: u32, rows_per_warp: u32) -> bool {
    dq_split(walk_tile(head_dim, rows_per_warp), head_dim, warps as usize).is_some()
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
    let slot = |g: AttentionInput| back.grads.iter().position(|&x| x == g);
    let (dq, dk, dv) = (slot(AttentionInput::Query), slot(AttentionInput::Key), slot(AttentionInput::Value));
    let queries = dk.is_none() && dv.is_none();
    // dq beside dk/dv: added by the key tiles' blocks into an f32 copy.
    let fused = if queries { None } else { dq };
    let rows = (rows_per_warp * warps) as usize;
    let walk = walk_tile(s.head_dim, rows_per_warp);
    let split = match fused {
        Some(_) => Some(dq_split(walk, s.head_dim, warps as usize).ok_or_else(|| {
            invalid_config(&name, format!("{walk} x {} dq tiles do not split evenly over {warps} warps", s.head_dim))
        })?),
        None => None,
    };
    let stride = s.head_dim + 8;
    let per_stage = 2 * walk * stride * 2 + if queries { 0 } else { 2 * walk * 4 };
    let ds_bytes = if fused.is_some() { rows * (walk + 8) * 2 } else { 0 };
    let shared_bytes = 2 * rows * stride * 2 + stages as usize * per_stage + ds_bytes;
    if shared_bytes > unit.target.shared_memory_per_block_optin as usize {
        return Err(invalid_config(&name, format!("{shared_bytes} bytes of shared memory a block")));
    }
    let width = IndexWidth::for_largest(unit.largest_buffer());
    let (mut declared, mut params) = unit.buffer_params();
    if fused.is_some() {
        declared.push("float* __restrict__ scratch0".into());
        params.push(Param::Scratch(0));
    }
    let tiles = s.seq.div_ceil(rows);
    let dq_elements = s.batch * s.seq * s.head_dim;

    let mut w = CodeWriter::new();
    device_helpers(&mut w, d);
    if fused.is_some() {
        reduction_helper(&mut w, unit.target.compute_capability >= (9, 0));
    }
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
    match dq {
        Some(q) if queries => dq_body(&mut w, tiling, q),
        _ => dkdv_body(&mut w, tiling, Grads { dk, dv, dq: split }),
    }
    w.close();
    if let Some(q) = fused {
        dq_from_copy(&mut w, &name, &s, back, q, &declared);
    }

    let mut launches = Vec::new();
    if s.batch * tiles > 0 {
        launches.push(Launch {
            entry: name.clone(),
            grid: [(s.batch * tiles) as u32, 1, 1],
            block: [warps * 32, 1, 1],
            shared_bytes: shared_bytes as u32,
            params: params.clone(),
        });
        if fused.is_some() {
            launches.push(Launch {
                entry: format!("{name}_dq"),
                grid: [grid_for(dq_elements / 8, COPY_BLOCK, unit.target.sm_count * 16), 1, 1],
                block: [COPY_BLOCK, 1, 1],
                shared_bytes: 0,
                params,
            });
        }
    }
    let side = match (queries, fused.is_some()) {
        (true, _) => "dq over query tiles",
        (false, true) => "dk/dv over key tiles, dq added from them",
        (false, false) => "dk/dv over key tiles",
    };
    let mut notes = vec![format!(
        "{rows} rows a block ({warps} warps x {rows_per_warp}), tiles of {walk} of the other side ({stages} in shared memory at once), {shared_bytes} bytes of shared memory; mma.sync m16n8k16, ldmatrix, cp.async"
    )];
    if fused.is_some() {
        notes.push(
            "dq: each query tile's dS K added into scratch0 (f32, zero between runs) by every key tile's block; `_dq` writes it scaled and zeroes it"
                .into(),
        );
    }
    Ok(Emitted {
        summary: format!(
            "flash attention backward ({side}) on tensor cores, {} x [{}, {}] {}{}",
            s.batch,
            s.seq,
            s.head_dim,
            s.dtype,
            if s.causal { ", causal" } else { "" }
        ),
        notes,
        width: Some(width),
        code: w.finish(),
        launches,
        scratch: if fused.is_some() {
            vec![ScratchSpec { bytes: 4 * dq_elements, zero_init: true }]
        } else {
            Vec::new()
        },
        tables: Vec::new(),
    })
}

/// Threads a block of the launch that writes dq from its f32 copy.
const COPY_BLOCK: u32 = 256;

/// `red_add_f32x2(p, a, b)`: `p[0] += a`, `p[1] += b` in global memory, as one vector
/// reduction on sm_90 (two scalar ones before it).
fn reduction_helper(w: &mut CodeWriter, vector: bool) {
    w.open("__device__ __forceinline__ void red_add_f32x2(float* p, float a, float b)");
    if vector {
        w.line("asm volatile(\"red.global.add.v2.f32 [%0], {%1, %2};\" :: \"l\"(p), \"f\"(a), \"f\"(b) : \"memory\");");
    } else {
        w.line("atomicAdd(p, a);");
        w.line("atomicAdd(p + 1, b);");
    }
    w.close();
    w.line("");
}

/// The second launch of a fused kernel: dq (`out{slot}`, placed by its layout) from its f32
/// copy in `scratch0` (`[batch, seq, head_dim]`), scaled and rounded, 8 elements a thread and
/// step; the copy is left zeroed for the next run.
fn dq_from_copy(
    w: &mut CodeWriter,
    name: &str,
    s: &AttentionShape,
    back: &AttentionBackward,
    slot: usize,
    declared: &[String],
) {
    w.line("");
    w.line(format!("extern \"C\" __global__ void __launch_bounds__({COPY_BLOCK}) {name}_dq({})", declared.join(", ")));
    w.open("");
    w.line(format!("constexpr int SEQ = {}, DIM = {};", s.seq, s.head_dim));
    w.line(format!("constexpr float SCALE = {};", f32_literal(s.scale as f32)));
    w.line(format!("const idx_t groups = (idx_t){} / 8;", s.batch * s.seq * s.head_dim));
    w.open(
        "for (idx_t e = (idx_t)blockIdx.x * blockDim.x + threadIdx.x; e < groups; e += (idx_t)gridDim.x * blockDim.x)",
    );
    w.line("const idx_t i = e * 8, bh = i / ((idx_t)SEQ * DIM), row = i / DIM % SEQ;");
    w.line("const int d = (int)(i % DIM);");
    declare_rows(w, s, &[(format!("out{slot}"), back.grad_layouts[slot])]);
    w.line("float4* copy = reinterpret_cast<float4*>(scratch0 + i);");
    w.line("const float4 a = copy[0], b = copy[1];");
    w.line("copy[0] = copy[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);");
    w.line("uint4 packed;");
    w.line("packed.x = pack_half2(a.x * SCALE, a.y * SCALE);");
    w.line("packed.y = pack_half2(a.z * SCALE, a.w * SCALE);");
    w.line("packed.z = pack_half2(b.x * SCALE, b.y * SCALE);");
    w.line("packed.w = pack_half2(b.z * SCALE, b.w * SCALE);");
    w.line(format!("*reinterpret_cast<uint4*>(out{slot} + out{slot}_at + row * out{slot}_row + d) = packed;"));
    w.close();
    w.close();
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

/// dq: inputs q, k, v, lse, delta, dout; output `slot`.
fn dq_body(w: &mut CodeWriter, tiles: Tiles, slot: usize) {
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
    store(w, &format!("out{slot}"), "dq", "SCALE");
}

/// The gradients a kernel over key tiles writes: dk and dv at their output slots, and dq added
/// into its f32 copy, split over the warps so.
struct Grads {
    dk: Option<usize>,
    dv: Option<usize>,
    dq: Option<DqSplit>,
}

/// dk and/or dv (and dq's parts): inputs q, k, v, lse, delta, dout; outputs at the given slots.
fn dkdv_body(w: &mut CodeWriter, tiles: Tiles, grads: Grads) {
    let Grads { dk, dv, dq } = grads;
    // dS^T: for dk, and for dq's parts.
    let ds = dk.is_some() || dq.is_some();
    let stages = tiles.stages;
    w.line("unsigned short* ks = reinterpret_cast<unsigned short*>(smem_words);  // ROWS x STRIDE");
    w.line("unsigned short* vs = ks + ROWS * STRIDE;                             // ROWS x STRIDE");
    w.line(format!("unsigned short* qdo = vs + ROWS * STRIDE;  // {stages} x (a query tile, its output gradients): WT x STRIDE each"));
    w.line(format!("float* stats = reinterpret_cast<float*>(qdo + {stages} * 2 * WT * STRIDE);  // {stages} x (lse * log2(e), rowsum(dout * out)): WT each"));
    if dq.is_some() {
        w.line("constexpr int DSTRIDE = WT + 8;");
        w.line(format!(
            "unsigned short* dss = reinterpret_cast<unsigned short*>(stats + {stages} * 2 * WT);  // ROWS x DSTRIDE: the tile's dS^T"
        ));
    }
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
    if dq.is_some() {
        // The block meets at a barrier below: a warp whose keys all follow the tile's queries
        // leaves its dS^T rows unwritten instead of leaving the step (dq's parts never read them).
        w.line("// Some query of the tile sees the warp's keys:");
        w.open("if (!CAUSAL || q0 + WT - 1 >= warp_row0)");
    } else {
        w.line("if (CAUSAL && q0 + WT - 1 < warp_row0) continue;  // every query of the tile before the warp's keys");
    }
    zeroed(w, "st", "WT / 8");
    if ds {
        zeroed(w, "dpt", "WT / 8");
    }
    w.line("#pragma unroll");
    w.open("for (int kk = 0; kk < KSTEPS; ++kk)");
    w.line("unsigned kf[MT][4];  // the warp's keys, dims 16 kk .. 16 kk + 15");
    if ds {
        w.line("unsigned vf[MT][4];");
    }
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < MT; ++mi)");
    a_fragment(w, "kf[mi]", "ks", "warp * RW + mi * 16", "kk * 16");
    if ds {
        a_fragment(w, "vf[mi]", "vs", "warp * RW + mi * 16", "kk * 16");
    }
    w.close();
    w.line("#pragma unroll");
    w.open("for (int np = 0; np < WT / 16; ++np)");
    w.line("unsigned qb[4];  // shared by the warp's row blocks");
    b_fragments(w, "qb", "qs", "np * 16", "kk * 16");
    mma_pair(w, "st", "np", "kf[mi]", "qb");
    if ds {
        w.line("unsigned db[4];");
        b_fragments(w, "db", "dos", "np * 16", "kk * 16");
        mma_pair(w, "dpt", "np", "vf[mi]", "db");
    }
    w.close();
    w.close();
    w.line(if ds {
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
    if ds {
        w.line("dpt[mi][j][c] = p * (dpt[mi][j][c] - deltas[ql]);");
    }
    w.close();
    w.close();
    w.close();
    w.line(match dq {
        Some(_) => {
            "// dv += P^T dO and dk += dS^T Q: two tiles are one A fragment of 16 queries; dS^T to shared memory."
        }
        None => "// dv += P^T dO and dk += dS^T Q: two tiles are one A fragment of 16 queries.",
    });
    w.line("#pragma unroll");
    w.open("for (int kk = 0; kk < WT / 16; ++kk)");
    if dv.is_some() {
        packed(w, "pf", "st");
    }
    if ds {
        packed(w, "sf", "dpt");
    }
    if dq.is_some() {
        // The A fragment's registers: rows g and g + 8 of the row block, columns 2t and 8 + 2t.
        w.line("#pragma unroll");
        w.open("for (int mi = 0; mi < MT; ++mi)");
        w.line("unsigned short* at = dss + (warp * RW + mi * 16 + g) * DSTRIDE + kk * 16 + 2 * t;");
        w.line("*reinterpret_cast<unsigned*>(at) = sf[mi][0];");
        w.line("*reinterpret_cast<unsigned*>(at + 8 * DSTRIDE) = sf[mi][1];");
        w.line("*reinterpret_cast<unsigned*>(at + 8) = sf[mi][2];");
        w.line("*reinterpret_cast<unsigned*>(at + 8 * DSTRIDE + 8) = sf[mi][3];");
        w.close();
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
    if let Some(split) = &dq {
        w.close();
        dq_parts(w, split);
    }
    w.close();
    if let Some(slot) = dk {
        store(w, &format!("out{slot}"), "dk", "SCALE");
    }
    if let Some(slot) = dv {
        store(w, &format!("out{slot}"), "dv", "1.0f");
    }
}

/// A fused kernel's dq parts of one query tile: after a barrier (every warp's dS^T in shared
/// memory), each warp multiplies its rows and columns of `dS K` over the block's keys (under
/// the mask only the keys up to its last query) and adds them into the f32 copy of dq.
fn dq_parts(w: &mut CodeWriter, split: &DqSplit) {
    let DqSplit { m_blocks, n_pairs, first_m, first_n } = split;
    w.line("__syncthreads();  // the tile's dS^T from every warp");
    w.line(format!(
        "// dq rows += dS K: {m_blocks} block(s) of 16 query rows and {n_pairs} pair(s) of 8 columns a warp."
    ));
    w.line(format!("constexpr int QM = {m_blocks}, NP = {n_pairs};"));
    w.line(format!("const int qm0 = {first_m}, np0 = {first_n};"));
    w.line("const int q_last = q0 + (qm0 + QM) * 16 - 1;  // the warp's last query row");
    w.line("// Else every dS the warp would read is masked:");
    w.open("if (!CAUSAL || q_last >= row0)");
    w.line("float dqa[QM][2 * NP][4];");
    w.line("#pragma unroll");
    w.line("for (int mi = 0; mi < QM; ++mi)");
    w.line("    #pragma unroll");
    w.line(
        "    for (int j = 0; j < 2 * NP; ++j) dqa[mi][j][0] = dqa[mi][j][1] = dqa[mi][j][2] = dqa[mi][j][3] = 0.0f;",
    );
    w.line("#pragma unroll");
    w.open("for (int kk = 0; kk < ROWS / 16; ++kk)");
    w.line("if (CAUSAL && row0 + kk * 16 > q_last) break;  // keys after the warp's queries");
    w.line("unsigned af[QM][4];  // dS of 16 queries x these 16 keys, from dS^T");
    w.line("#pragma unroll");
    w.line("for (int mi = 0; mi < QM; ++mi)");
    w.line("    ldmatrix_x4_trans(af[mi], dss + (kk * 16 + (lane & 7) + (m >> 1) * 8) * DSTRIDE + (qm0 + mi) * 16 + (m & 1) * 8);");
    w.line("#pragma unroll");
    w.open("for (int dn = 0; dn < NP; ++dn)");
    w.line("unsigned kb[4];");
    b_fragments_trans(w, "kb", "ks", "kk * 16", "(np0 + dn) * 16");
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < QM; ++mi)");
    w.line("mma_16816(dqa[mi][2 * dn], af[mi], kb[0], kb[1]);");
    w.line("mma_16816(dqa[mi][2 * dn + 1], af[mi], kb[2], kb[3]);");
    w.close();
    w.close();
    w.close();
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < QM; ++mi)");
    w.line("#pragma unroll");
    w.open("for (int h = 0; h < 2; ++h)");
    w.line("const int q = q0 + (qm0 + mi) * 16 + g + 8 * h;");
    w.line("if (q >= SEQ) continue;");
    w.line("float* row = scratch0 + (bh * SEQ + q) * DIM + np0 * 16 + 2 * t;");
    w.line("#pragma unroll");
    w.line("for (int j = 0; j < 2 * NP; ++j) red_add_f32x2(row + j * 8, dqa[mi][j][2 * h], dqa[mi][j][2 * h + 1]);");
    w.close();
    w.close();
    w.close();
}
