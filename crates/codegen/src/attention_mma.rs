//! The flash-attention forward on tensor cores (sm_80 and later, bf16/f16, head dims that are
//! multiples of 16 up to 128): `mma.sync.aligned.m16n8k16` with f32 accumulators, operands
//! staged into shared memory by `cp.async` (16-byte copies, zero-filled past the sequence) and
//! read into fragments by `ldmatrix` (`.trans` for V, whose fragments run down its columns).
//!
//! A warp owns one or two blocks of 16 query rows (`rows_per_warp` 16 or 32) and a block
//! `warps` of them; key tiles are 64 keys. Per tile each warp computes its `16 x 64` scores per
//! row block as 8 accumulator tiles (`Q` fragments loaded once, each `K` and `V` fragment read
//! from shared memory once for both row blocks: two blocks halve the shared-memory traffic per
//! mma), masks them only on tiles that cross the diagonal or the sequence's end, folds them into
//! the running max and sum of its two rows per thread (quad shuffles; the scale joins the
//! exponent as one fma), rounds the probabilities to the operand dtype as the A fragments of
//! `P V` (the accumulator layout of two score tiles is the A layout of one 16 x 16 block), and
//! accumulates `P V` into `head_dim / 8` tiles. Shared rows are padded by 8 elements (16
//! bytes) so `ldmatrix`'s eight row addresses hit distinct banks.

use crate::attention_layout::{declare_rows, forward_operands};
use crate::cuda::f32_literal;
use crate::error::{invalid_config, Result};
use crate::index::IndexWidth;
use crate::writer::CodeWriter;
use crate::{Emitted, Launch, Unit};
use braze_ir::DType;
use braze_plan::{Attention, AttentionResult, AttentionShape, OperandLayout};

/// Keys a step folds in.
const KEY_TILE: usize = 64;

/// Whether the tensor-core kernels (this forward and the backward of
/// `attention_mma_backward.rs`) can run attention of shape `s` on `unit`'s target.
/// `layouts` are those of its operands and results: each row must start on 16 bytes.
pub(crate) fn supports(unit: &Unit<'_>, s: &AttentionShape, layouts: &[OperandLayout]) -> bool {
    let d = s.head_dim;
    unit.target.compute_capability >= (8, 0)
        && s.dtype.is_narrow_float()
        && d > 0
        && d.is_multiple_of(16)
        && d <= 128
        && layouts.iter().all(|l| l.is_aligned_to(8))
}

pub(crate) fn generate(
    unit: &mut Unit<'_>,
    att: &Attention,
    warps: u32,
    rows_per_warp: u32,
    stages: u32,
) -> Result<Emitted> {
    let name = unit.name().to_string();
    let s = att.shape;
    check_config(unit, &s, &att.layouts(), warps, rows_per_warp, stages)?;
    let rows = (rows_per_warp * warps) as usize;
    let stride = s.head_dim + 8;
    let shared_bytes = (rows + 2 * KEY_TILE * stages as usize) * stride * 2;
    if shared_bytes > unit.target.shared_memory_per_block_optin as usize {
        return Err(invalid_config(&name, format!("{shared_bytes} bytes of shared memory a block")));
    }
    let out_slot = att.results.iter().position(|r| *r == AttentionResult::Out);
    let lse_slot = att.results.iter().position(|r| *r == AttentionResult::Lse);
    let width = IndexWidth::for_largest(unit.largest_buffer());
    let (declared, params) = unit.buffer_params();
    let tiles = s.seq.div_ceil(rows);
    // With a positive scale the running max is kept on the raw scores and the scale joins the
    // exponent's subtraction (one fma a score); otherwise scores are scaled first.
    let raw_max = s.scale > 0.0;

    let mut w = CodeWriter::new();
    device_helpers(&mut w, s.dtype);
    w.line(format!("extern \"C\" __global__ void __launch_bounds__({}) {name}({})", warps * 32, declared.join(", ")));
    w.open("");
    w.line(format!(
        "constexpr int SEQ = {}, DIM = {}, ROWS = {rows}, KT = {KEY_TILE}, STRIDE = {stride}, MT = {}, RW = 16 * MT;",
        s.seq,
        s.head_dim,
        rows_per_warp / 16
    ));
    w.line("constexpr int KSTEPS = DIM / 16, DTILES = DIM / 8, CHUNKS = DIM / 8;");
    let scale_log2 = f32_literal((s.scale * std::f64::consts::LOG2_E) as f32);
    w.line(format!("constexpr float SCALE_LOG2 = {scale_log2};"));
    w.line(format!(
        "constexpr float RAW_SCALE = {};  // what turns a kept score into the base-2 exponent",
        if raw_max { scale_log2.as_str() } else { "1.0f" }
    ));
    w.line(format!("constexpr bool CAUSAL = {};", s.causal));
    w.line("const float NEG_INF = __int_as_float(0xff800000);");
    w.line("const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;");
    w.line("const int g = lane >> 2, t = lane & 3;  // the accumulator row (and row + 8) and column pair");
    w.line("const int m = lane >> 3;  // the 8 x 8 matrix whose row address this lane gives ldmatrix");
    w.line(format!("const int tiles = {tiles};"));
    w.line(
        "const int tile = tiles - 1 - (int)(blockIdx.x % tiles);  // latest rows first: under a mask they do the most",
    );
    w.line("const idx_t bh = blockIdx.x / tiles;");
    w.line("const int row0 = tile * ROWS, warp_row0 = row0 + warp * RW;");
    declare_rows(&mut w, &s, &forward_operands(att));
    w.line("extern __shared__ uint4 smem_words[];");
    w.line("unsigned short* qs = reinterpret_cast<unsigned short*>(smem_words);  // ROWS x STRIDE");
    w.line(format!(
        "unsigned short* kv = qs + ROWS * STRIDE;  // {stages} x (a key tile, its values): KT x STRIDE each"
    ));
    let staging = Staging::new(warps, &s);
    stage_rows(&mut w, staging, "qs", "in0", "row0", rows);
    w.line("asm volatile(\"cp.async.wait_group 0;\" ::);");
    w.line("__syncthreads();");
    w.line("// The warp's Q fragments: MT blocks of 16 rows x DIM, one A fragment per 16 columns.");
    w.line("unsigned qf[MT][KSTEPS][4];");
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < MT; ++mi)");
    w.line("#pragma unroll");
    w.line("for (int kk = 0; kk < KSTEPS; ++kk)");
    w.line("    ldmatrix_x4(qf[mi][kk], qs + (warp * RW + mi * 16 + (lane & 7) + (m & 1) * 8) * STRIDE + kk * 16 + (m >> 1) * 8);");
    w.close();
    w.line("float o[MT][DTILES][4];");
    w.line("float row_max[MT][2], row_sum[MT][2];  // sums: this thread's columns only");
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < MT; ++mi)");
    w.line("#pragma unroll");
    w.line("for (int j = 0; j < DTILES; ++j) o[mi][j][0] = o[mi][j][1] = o[mi][j][2] = o[mi][j][3] = 0.0f;");
    w.line("row_max[mi][0] = row_max[mi][1] = NEG_INF;");
    w.line("row_sum[mi][0] = row_sum[mi][1] = 0.0f;");
    w.close();
    w.line("const int key_end = CAUSAL ? min(SEQ, row0 + ROWS) : SEQ;");
    walk_tiles(
        &mut w,
        staging,
        stages,
        "k0",
        "0",
        "key_end",
        KEY_TILE,
        &[("ks", "in1", "kv"), ("vs", "in2", "kv + KT * STRIDE")],
        "2 * KT * STRIDE",
        &|_, _, _| {},
    );
    w.line("if (CAUSAL && k0 > warp_row0 + RW - 1) continue;  // every key of the tile after the warp's rows");
    w.line("float sc[MT][KT / 8][4];");
    w.line("#pragma unroll");
    w.line("for (int mi = 0; mi < MT; ++mi)");
    w.line("    #pragma unroll");
    w.line("    for (int j = 0; j < KT / 8; ++j) sc[mi][j][0] = sc[mi][j][1] = sc[mi][j][2] = sc[mi][j][3] = 0.0f;");
    w.line("#pragma unroll");
    w.open("for (int kk = 0; kk < KSTEPS; ++kk)");
    w.line("#pragma unroll");
    w.open("for (int np = 0; np < KT / 16; ++np)");
    w.line("unsigned kf[4];  // B fragments of key tiles 2 np and 2 np + 1, shared by the warp's row blocks");
    w.line("ldmatrix_x4(kf, ks + (np * 16 + (lane & 7) + (m >> 1) * 8) * STRIDE + kk * 16 + (m & 1) * 8);");
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < MT; ++mi)");
    w.line("mma_16816(sc[mi][2 * np], qf[mi][kk], kf[0], kf[1]);");
    w.line("mma_16816(sc[mi][2 * np + 1], qf[mi][kk], kf[2], kf[3]);");
    w.close();
    w.close();
    w.close();
    if !raw_max {
        w.line("#pragma unroll");
        w.line("for (int mi = 0; mi < MT; ++mi)");
        w.line("    #pragma unroll");
        w.line("    for (int j = 0; j < KT / 8; ++j)");
        w.line("        #pragma unroll");
        w.line("        for (int c = 0; c < 4; ++c) sc[mi][j][c] *= SCALE_LOG2;");
    }
    w.line("// Only tiles past the sequence or across the diagonal of the warp's rows mask scores.");
    w.open("if (k0 + KT > SEQ || (CAUSAL && k0 + KT - 1 > warp_row0))");
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < MT; ++mi)");
    w.line("#pragma unroll");
    w.open("for (int j = 0; j < KT / 8; ++j)");
    w.line("#pragma unroll");
    w.open("for (int c = 0; c < 4; ++c)");
    w.line("const int key = k0 + j * 8 + 2 * t + (c & 1), q = warp_row0 + mi * 16 + g + 8 * (c >> 1);");
    w.line("if (key >= SEQ || (CAUSAL && key > q)) sc[mi][j][c] = NEG_INF;");
    w.close();
    w.close();
    w.close();
    w.close();
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < MT; ++mi)");
    w.line("// The tile's max and (below) sum of each of the thread's rows by halving trees: chains of");
    w.line("// log2(KT / 4) dependent ops, not KT / 4.");
    halving_tree(&mut w, "tile_max", |a, b| format!("fmaxf({a}, {b})"));
    w.line("float rescale[2], shift[2];");
    w.line("#pragma unroll");
    w.open("for (int h = 0; h < 2; ++h)");
    w.line("float row_tile_max = tile_max[h][0];");
    w.line("row_tile_max = fmaxf(row_tile_max, __shfl_xor_sync(0xffffffffu, row_tile_max, 1));");
    w.line("row_tile_max = fmaxf(row_tile_max, __shfl_xor_sync(0xffffffffu, row_tile_max, 2));");
    w.line("const float new_max = fmaxf(row_max[mi][h], row_tile_max);");
    w.line("shift[h] = new_max == NEG_INF ? 0.0f : new_max * RAW_SCALE;  // no -inf - -inf");
    w.line("rescale[h] = fast_exp2(row_max[mi][h] * RAW_SCALE - shift[h]);");
    w.line("row_max[mi][h] = new_max;");
    w.line("row_sum[mi][h] *= rescale[h];");
    w.close();
    w.line("#pragma unroll");
    w.open("for (int j = 0; j < DTILES; ++j)");
    w.line(
        "o[mi][j][0] *= rescale[0]; o[mi][j][1] *= rescale[0]; o[mi][j][2] *= rescale[1]; o[mi][j][3] *= rescale[1];",
    );
    w.close();
    w.line("#pragma unroll");
    w.open("for (int j = 0; j < KT / 8; ++j)");
    w.line("#pragma unroll");
    w.open("for (int c = 0; c < 4; ++c)");
    w.line("sc[mi][j][c] = fast_exp2(fmaf(sc[mi][j][c], RAW_SCALE, -shift[c >> 1]));");
    w.close();
    w.close();
    halving_tree(&mut w, "tile_sum", |a, b| format!("{a} + {b}"));
    w.line("row_sum[mi][0] += tile_sum[0][0];");
    w.line("row_sum[mi][1] += tile_sum[1][0];");
    w.close();
    w.line("// P V: two score tiles are one A fragment of 16 keys; V fragments shared by the row blocks.");
    w.line("#pragma unroll");
    w.open("for (int kk = 0; kk < KT / 16; ++kk)");
    w.line("unsigned pf[MT][4];");
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < MT; ++mi)");
    w.line("pf[mi][0] = pack_half2(sc[mi][2 * kk][0], sc[mi][2 * kk][1]);");
    w.line("pf[mi][1] = pack_half2(sc[mi][2 * kk][2], sc[mi][2 * kk][3]);");
    w.line("pf[mi][2] = pack_half2(sc[mi][2 * kk + 1][0], sc[mi][2 * kk + 1][1]);");
    w.line("pf[mi][3] = pack_half2(sc[mi][2 * kk + 1][2], sc[mi][2 * kk + 1][3]);");
    w.close();
    w.line("#pragma unroll");
    w.open("for (int dn = 0; dn < DTILES / 2; ++dn)");
    w.line("unsigned vf[4];  // B fragments of value columns 16 dn .. 16 dn + 15");
    w.line("ldmatrix_x4_trans(vf, vs + (kk * 16 + (lane & 7) + (m & 1) * 8) * STRIDE + dn * 16 + (m >> 1) * 8);");
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < MT; ++mi)");
    w.line("mma_16816(o[mi][2 * dn], pf[mi], vf[0], vf[1]);");
    w.line("mma_16816(o[mi][2 * dn + 1], pf[mi], vf[2], vf[3]);");
    w.close();
    w.close();
    w.close();
    w.close();
    w.line("#pragma unroll");
    w.open("for (int mi = 0; mi < MT; ++mi)");
    w.line("#pragma unroll");
    w.open("for (int h = 0; h < 2; ++h)");
    w.line("float sum = row_sum[mi][h];");
    w.line("sum += __shfl_xor_sync(0xffffffffu, sum, 1);");
    w.line("sum += __shfl_xor_sync(0xffffffffu, sum, 2);");
    w.line("const int i = warp_row0 + mi * 16 + g + 8 * h;");
    w.line("if (i >= SEQ) continue;");
    if let Some(slot) = out_slot {
        w.line("const float inv = 1.0f / sum;");
        w.line("#pragma unroll");
        w.open("for (int j = 0; j < DTILES; ++j)");
        w.line(format!(
            "*reinterpret_cast<unsigned*>(out{slot} + out{slot}_at + (idx_t)i * out{slot}_row + j * 8 + 2 * t) = pack_half2(o[mi][j][2 * h] * inv, o[mi][j][2 * h + 1] * inv);"
        ));
        w.close();
    }
    if let Some(slot) = lse_slot {
        w.line(format!(
            "if (t == 0) out{slot}[bh * SEQ + i] = (row_max[mi][h] * RAW_SCALE + log2f(sum)) * {};",
            f32_literal(std::f32::consts::LN_2)
        ));
    }
    w.close();
    w.close();
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
    Ok(Emitted {
        summary: format!(
            "flash attention forward on tensor cores, {} x [{}, {}] {}{}",
            s.batch,
            s.seq,
            s.head_dim,
            s.dtype,
            if s.causal { ", causal" } else { "" }
        ),
        notes: vec![format!(
            "{rows} query rows a block ({warps} warps x {rows_per_warp}), key tiles of {KEY_TILE} ({stages} in shared memory at once), {shared_bytes} bytes of shared memory; mma.sync m16n8k16, ldmatrix, cp.async"
        )],
        width: Some(width),
        code: w.finish(),
        launches,
        scratch: Vec::new(),
        tables: Vec::new(),
    })
}

/// Declares `name[2][KT / 8]` and folds row block `mi`'s scores into `name[h][0]` for each of
/// the thread's two rows `h` by `combine` (the C expression of two operands), pairwise.
fn halving_tree(w: &mut CodeWriter, name: &str, combine: impl Fn(&str, &str) -> String) {
    w.line(format!("float {name}[2][KT / 8];"));
    w.line("#pragma unroll");
    w.open("for (int j = 0; j < KT / 8; ++j)");
    w.line(format!("{name}[0][j] = {};", combine("sc[mi][j][0]", "sc[mi][j][1]")));
    w.line(format!("{name}[1][j] = {};", combine("sc[mi][j][2]", "sc[mi][j][3]")));
    w.close();
    w.line("#pragma unroll");
    w.open("for (int span = KT / 16; span > 0; span >>= 1)");
    w.line("#pragma unroll");
    w.open("for (int j = 0; j < span; ++j)");
    w.line(format!("{name}[0][j] = {};", combine(&format!("{name}[0][j]"), &format!("{name}[0][j + span]"))));
    w.line(format!("{name}[1][j] = {};", combine(&format!("{name}[1][j]"), &format!("{name}[1][j + span]"))));
    w.close();
    w.close();
}

/// The device functions both directions use: `pack_half2`, `mma_16816` (of `dtype`),
/// `ldmatrix_x4`, `ldmatrix_x4_trans`, `cp_async_16` and `fast_exp2`.
pub(crate) fn device_helpers(w: &mut CodeWriter, dtype: DType) {
    let (ty, cvt) = match dtype {
        DType::BF16 => ("bf16", "cvt.rn.bf16x2.f32"),
        _ => ("f16", "cvt.rn.f16x2.f32"),
    };
    w.line("// Two f32 values as one register of two 16-bit floats, `lo` in the low half.");
    w.open("__device__ __forceinline__ unsigned pack_half2(float lo, float hi)");
    w.line("unsigned r;");
    w.line(format!("asm(\"{cvt} %0, %1, %2;\" : \"=r\"(r) : \"f\"(hi), \"f\"(lo));"));
    w.line("return r;");
    w.close();
    w.line("");
    w.open("__device__ __forceinline__ void mma_16816(float* c, const unsigned* a, unsigned b0, unsigned b1)");
    w.line(format!(
        "asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};\""
    ));
    w.line("    : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3])");
    w.line("    : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b0), \"r\"(b1));");
    w.close();
    w.line("");
    w.open("__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* p)");
    w.line("const unsigned a = (unsigned)__cvta_generic_to_shared(p);");
    w.line("asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\" : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(a));");
    w.close();
    w.line("");
    w.open("__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const void* p)");
    w.line("const unsigned a = (unsigned)__cvta_generic_to_shared(p);");
    w.line("asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\" : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(a));");
    w.close();
    w.line("");
    w.line("// 2^x as one multi-function unit instruction (`exp2f` adds a range check and two scalings");
    w.line("// for results below 2^-126, which flush to zero here: weights that small vanish beside the");
    w.line("// row's largest, which is 1).");
    w.open("__device__ __forceinline__ float fast_exp2(float x)");
    w.line("float y;");
    w.line("asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(y) : \"f\"(x));");
    w.line("return y;");
    w.close();
    w.line("");
    w.line("// 16 bytes from global to shared memory, zeros where `bytes` is 0 (rows past the sequence).");
    w.open("__device__ __forceinline__ void cp_async_16(void* dst, const void* src, unsigned bytes)");
    w.line("const unsigned d = (unsigned)__cvta_generic_to_shared(dst);");
    w.line("asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\" :: \"r\"(d), \"l\"(src), \"r\"(bytes));");
    w.close();
    w.line("");
}

/// What a block's copies of operand rows into shared memory are shaped by: its threads, the
/// 16-byte chunks of a row (`head_dim / 8`) and the sequence's length.
#[derive(Clone, Copy)]
pub(crate) struct Staging {
    pub threads: usize,
    pub chunks: usize,
    pub seq: usize,
}

impl Staging {
    /// The copies of a block of `warps` warps over attention of shape `s`.
    pub(crate) fn new(warps: u32, s: &AttentionShape) -> Staging {
        Staging { threads: (warps * 32) as usize, chunks: s.head_dim / 8, seq: s.seq }
    }
}

/// Starts copying `count` rows from row `first` of `src` (an operand, its rows placed by
/// `{src}_at` and `{src}_row` of `attention_layout.rs`)
/// into `dst` (rows of `STRIDE`) as one `cp.async` group. `first` is a multiple of `count`, so
/// rows past the sequence (clamped, zero-filled) occur only where `count` does not divide it.
/// Where the block's threads split the copies evenly, each thread copies one chunk column of
/// every `threads / chunks`-th row: an unrolled loop whose addresses differ by constants, not a
/// division per copy (the per-copy index math once cost a fifth of the forward's instructions).
pub(crate) fn stage_rows(w: &mut CodeWriter, staging: Staging, dst: &str, src: &str, first: &str, count: usize) {
    let total = count * staging.chunks;
    let ragged = !staging.seq.is_multiple_of(count);
    let (src_row, bytes) =
        if ragged { ("(idx_t)min(row, SEQ - 1)", "row < SEQ ? 16u : 0u") } else { ("(idx_t)row", "16u") };
    let copy =
        format!("cp_async_16({dst} + r * STRIDE + c * 8, {src} + {src}_at + {src_row} * {src}_row + c * 8, {bytes});");
    if staging.threads.is_multiple_of(staging.chunks) && total.is_multiple_of(staging.threads) {
        w.line("#pragma unroll");
        w.open(format!("for (int p = 0; p < {}; ++p)", total / staging.threads));
        w.line(format!(
            "const int c = threadIdx.x % CHUNKS, r = threadIdx.x / CHUNKS + p * {}, row = {first} + r;",
            staging.threads / staging.chunks
        ));
    } else {
        w.open(format!("for (int e = threadIdx.x; e < {total}; e += blockDim.x)"));
        w.line(format!("const int r = e / CHUNKS, c = e - r * CHUNKS, row = {first} + r;"));
    }
    w.line(copy);
    w.close();
    w.line("asm volatile(\"cp.async.commit_group;\" ::);");
}

/// Refuses a config the tensor-core kernels cannot run on `unit`'s target for shape `s`.
pub(crate) fn check_config(
    unit: &Unit<'_>,
    s: &AttentionShape,
    layouts: &[OperandLayout],
    warps: u32,
    rows_per_warp: u32,
    stages: u32,
) -> Result<()> {
    let name = unit.name();
    if !supports(unit, s, layouts) {
        return Err(invalid_config(
            name,
            format!("tensor cores need sm_80+, bf16 or f16, a head dim that is a multiple of 16 up to 128 and rows on 16 bytes (got {} on {})", s.dtype, unit.target.arch()),
        ));
    }
    if !(1..=8).contains(&warps) {
        return Err(invalid_config(name, format!("warps {warps} must be in 1..=8")));
    }
    if !matches!(rows_per_warp, 16 | 32) {
        return Err(invalid_config(
            name,
            format!("rows_per_warp {rows_per_warp} must be 16 or 32 (one or two mma row blocks)"),
        ));
    }
    if rows_per_warp == 32 && s.head_dim > 64 {
        // Two row blocks' accumulators of a wider head do not fit in a lane's registers.
        return Err(invalid_config(name, format!("32 rows a warp need a head dim of at most 64, got {}", s.head_dim)));
    }
    if !(1..=2).contains(&stages) {
        return Err(invalid_config(name, format!("stages {stages} must be 1 or 2")));
    }
    Ok(())
}

/// Opens the loop over the walked side's tiles (`var` from `first` while below `end`, by
/// `step` rows) and stages each tile: every `(name, src, base)` buffer gets `step` rows of
/// `src` at `base` (plus the slot's offset, `slot_size` elements a slot), and `extra(w, slot,
/// row)` stages what else a tile needs (`slot`: the expression of the tile's slot, `row`: of
/// its first row). With one stage the block copies a tile and then computes on it; with two
/// the next tile's copies are issued before the current one's math (into the other of two
/// slots, `name` pointing at the current one), so they overlap it. The caller writes the loop
/// body and closes the loop.
#[allow(clippy::too_many_arguments)]
pub(crate) fn walk_tiles(
    w: &mut CodeWriter,
    staging: Staging,
    stages: u32,
    var: &str,
    first: &str,
    end: &str,
    step: usize,
    buffers: &[(&str, &str, &str)],
    slot_size: &str,
    extra: &dyn Fn(&mut CodeWriter, &str, &str),
) {
    if stages == 1 {
        w.open(format!("for (int {var} = {first}; {var} < {end}; {var} += {step})"));
        w.line("__syncthreads();  // the previous tile is no longer read");
        for (name, src, base) in buffers {
            w.line(format!("unsigned short* {name} = {base};"));
            stage_rows(w, staging, name, src, var, step);
        }
        extra(w, "0", var);
        w.line("asm volatile(\"cp.async.wait_group 0;\" ::);");
        w.line("__syncthreads();");
        return;
    }
    w.line("// The first tile's copies; each step issues the next one's before its own math.");
    w.open("");
    for (name, src, base) in buffers {
        w.line(format!("unsigned short* {name} = {base};"));
        stage_rows(w, staging, name, src, first, step);
    }
    extra(w, "0", first);
    w.close();
    w.open(format!("for (int {var} = {first}, slot = 0; {var} < {end}; {var} += {step}, slot ^= 1)"));
    w.line("asm volatile(\"cp.async.wait_group 0;\" ::);  // this tile's copies");
    w.line("__syncthreads();  // visible to all; and the other slot is no longer read");
    w.open(format!("if ({var} + {step} < {end})"));
    w.line(format!("const int next = {var} + {step};"));
    for (name, src, base) in buffers {
        w.line(format!("unsigned short* {name} = {base} + (slot ^ 1) * ({slot_size});"));
        stage_rows(w, staging, name, src, "next", step);
    }
    extra(w, "(slot ^ 1)", "next");
    w.close();
    for (name, _, base) in buffers {
        w.line(format!("unsigned short* {name} = {base} + slot * ({slot_size});"));
    }
}
