//! Launch configurations: what the autotuner varies, with defaults chosen for a [`Target`]
//! (tuned on the H200).

use crate::column::{partials_fit as column_partials_fit, vector_width as column_vector_width};
use crate::cuda::Helpers;
use crate::index::merge_view;
use crate::multi_pointwise::work_list;
use crate::row::{vector_width, RowAnalysis, MAX_CACHED_PER_THREAD, MAX_MULTI_WARP_SLOTS};
use crate::{Target, Unit};
use braze_ir::AttentionInput;
use braze_plan::{Attention, AttentionBackward, Body, ColumnKernel, Expr, KernelKind, MultiPointwise, Plan, RowKernel};
use std::fmt;

/// Most reduction passes for which an uncached row kernel is a candidate.
const MAX_UNCACHED_ROUNDS: usize = 4;
/// Registers a cached row may spend on held elements per thread before it is better re-read.
const CACHED_REGISTER_BUDGET: usize = 64;
/// The same budget in a 1024-thread block, where a thread has 64 registers in all: a single-pass
/// RMS norm holding 50 or 64 elements a thread there ran at 0.54-0.80x of the same row re-read
/// (rows sweep Y2, 50,257 and 65,536 columns); rows holding 36 compile without spilling
/// (`regression_cached_rows_in_1024_thread_blocks_do_not_spill`).
const CACHED_REGISTER_BUDGET_AT_1024: usize = 36;
/// Elements a thread of a 1024-thread block (64 registers) may hold when a pass folds two values.
const MAX_HELD_BESIDE_TWO_ACCUMULATORS: usize = 16;
/// cuBLASLt algorithms max-autotune times for a matmul: the heuristic's first eight picks (its
/// first is not always the fastest on the real operands).
const MATMUL_ALGORITHMS: u32 = 8;

/// How one kernel is launched; each variant belongs to one kernel family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelConfig {
    /// `block` threads per block, `vec` consecutive elements per thread and step (a power of
    /// two up to 16), at most `grid_limit` blocks (the rest is a grid-stride loop).
    Pointwise {
        block: u32,
        vec: u32,
        grid_limit: u32,
    },
    /// As `Pointwise`, over an element count read at run time from a table the runtime fills
    /// once (the grid as large as the default's): the kernel's code is the same for every shape its loads allow
    /// (each input contiguous over the whole domain, or one element for all), so one compiled
    /// unit serves an eager op at every size ([`any_extent_config`]).
    PointwiseAnyExtent {
        block: u32,
        vec: u32,
    },
    /// `threads_per_row` threads (a power of two up to 1024) cooperate on a row;
    /// `rows_per_block` rows share a block (1 when a row spans several warps); `cached` keeps
    /// the row's element values in registers across reduction passes.
    Row {
        threads_per_row: u32,
        rows_per_block: u32,
        cached: bool,
    },
    /// `block` threads per block, items cut into segments of at most `chunk` elements.
    MultiReduce {
        block: u32,
        chunk: u32,
    },
    Concat {
        block: u32,
    },
    /// `col_threads x row_threads` threads per block, `vec` consecutive columns per thread (a
    /// power of two up to 8), each block folding `rows_per_block` rows (a grid of column tiles x
    /// row chunks).
    Column {
        col_threads: u32,
        row_threads: u32,
        vec: u32,
        rows_per_block: u32,
    },
    /// `block` threads per block and `vec` elements per thread and step, as for pointwise
    /// kernels; each block does one tile of `block * vec * steps` elements of one member.
    MultiPointwise {
        block: u32,
        vec: u32,
        steps: u32,
    },
    /// Flash attention forward: `warps` warps of `rows_per_warp` query rows each share a
    /// block (and each key tile it stages); `tensor_cores`: the mma.sync kernel (bf16/f16 on
    /// sm_80+, 16 rows a warp), else the FMA kernel; `stages`: tiles in shared memory at once
    /// (2: the next tile's copies are in flight while the current one's math runs; tensor cores
    /// only), else 1.
    Attention {
        warps: u32,
        rows_per_warp: u32,
        tensor_cores: bool,
        stages: u32,
    },
    /// Flash attention backward: as for the forward, the rows being those of the side the
    /// kernel parallelises over (query rows for dq, key rows for dk/dv); `tensor_cores`: the
    /// mma.sync kernels (bf16/f16 on sm_80+, 16 rows a warp), else the FMA kernels; `stages`
    /// as for the forward.
    AttentionBackward {
        warps: u32,
        rows_per_warp: u32,
        tensor_cores: bool,
        stages: u32,
    },
    /// Scatter-add of an index_select's gradient: `warps` warps per block, each owning
    /// `rows_per_warp` output rows; the block scans the indices `chunk` at a time (a multiple of
    /// `32 * warps`) and each warp keeps a slice of at most `columns` inner columns in registers.
    IndexAdd {
        warps: u32,
        rows_per_warp: u32,
        chunk: u32,
        columns: u32,
    },
    /// The kernel is a library call (cuBLASLt) run by the algorithm of rank `algorithm` among
    /// the library's heuristic candidates for the problem (0: the heuristic's own pick).
    Library {
        algorithm: u32,
    },
}

impl KernelConfig {
    /// The kernel family this config is for, as [`braze_plan::KernelKind::family`] names it.
    pub fn family(&self) -> &'static str {
        match self {
            KernelConfig::Pointwise { .. } | KernelConfig::PointwiseAnyExtent { .. } => "pointwise",
            KernelConfig::Row { .. } => "row",
            KernelConfig::MultiReduce { .. } => "multi_reduce",
            KernelConfig::Concat { .. } => "concat",
            KernelConfig::Column { .. } => "column",
            KernelConfig::MultiPointwise { .. } => "multi_pointwise",
            KernelConfig::Attention { .. } => "attention",
            KernelConfig::AttentionBackward { .. } => "attention_backward",
            KernelConfig::IndexAdd { .. } => "index_add",
            KernelConfig::Library { .. } => "matmul",
        }
    }
}

impl fmt::Display for KernelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelConfig::Pointwise { block, vec, grid_limit } => {
                write!(f, "pointwise block={block} vec={vec} grid_limit={grid_limit}")
            }
            KernelConfig::PointwiseAnyExtent { block, vec } => {
                write!(f, "pointwise block={block} vec={vec} any extent")
            }
            KernelConfig::Row { threads_per_row, rows_per_block, cached } => write!(
                f,
                "row threads_per_row={threads_per_row} rows_per_block={rows_per_block} {}",
                if *cached { "cached" } else { "uncached" }
            ),
            KernelConfig::MultiReduce { block, chunk } => write!(f, "multi_reduce block={block} chunk={chunk}"),
            KernelConfig::Concat { block } => write!(f, "concat block={block}"),
            KernelConfig::IndexAdd { warps, rows_per_warp, chunk, columns } => {
                write!(f, "index_add warps={warps} rows_per_warp={rows_per_warp} chunk={chunk} columns={columns}")
            }
            KernelConfig::Column { col_threads, row_threads, vec, rows_per_block } => write!(
                f,
                "column col_threads={col_threads} row_threads={row_threads} vec={vec} rows_per_block={rows_per_block}"
            ),
            KernelConfig::MultiPointwise { block, vec, steps } => {
                write!(f, "multi_pointwise block={block} vec={vec} steps={steps}")
            }
            KernelConfig::Attention { warps, rows_per_warp, tensor_cores, stages } => write!(
                f,
                "attention warps={warps} rows_per_warp={rows_per_warp}{}{}",
                if *tensor_cores { " tensor_cores" } else { "" },
                if *stages > 1 { format!(" stages={stages}") } else { String::new() }
            ),
            KernelConfig::AttentionBackward { warps, rows_per_warp, tensor_cores, stages } => write!(
                f,
                "attention_backward warps={warps} rows_per_warp={rows_per_warp}{}{}",
                if *tensor_cores { " tensor_cores" } else { "" },
                if *stages > 1 { format!(" stages={stages}") } else { String::new() }
            ),
            KernelConfig::Library { algorithm: 0 } => write!(f, "library call"),
            KernelConfig::Library { algorithm } => write!(f, "library call algorithm={algorithm}"),
        }
    }
}

/// A good configuration for `plan.kernels[kernel]` on `target`.
///
/// # Panics
/// If `kernel` is not an index into `plan.kernels`.
pub fn default_config(plan: &Plan, kernel: usize, target: &Target) -> KernelConfig {
    candidate_configs(plan, kernel, target)[0]
}

/// The default configuration of pointwise kernel `kernel` made to read its element count at run
/// time, when its loads allow that (see [`KernelConfig::PointwiseAnyExtent`]); `None` for other
/// kernels and other loads (a broadcast along some axes, a gather, a strided view).
pub fn any_extent_config(plan: &Plan, kernel: usize, target: &Target) -> Option<KernelConfig> {
    let KernelKind::Pointwise(pointwise) = &plan.kernels.get(kernel)?.kind else { return None };
    if !crate::pointwise::serves_any_extent(pointwise) {
        return None;
    }
    match default_config(plan, kernel, target) {
        KernelConfig::Pointwise { block, vec, .. } => Some(KernelConfig::PointwiseAnyExtent { block, vec }),
        _ => None,
    }
}

/// A small set of configurations (one to eight, the default first) for the autotuner to time.
///
/// # Panics
/// If `kernel` is not an index into `plan.kernels`.
pub fn candidate_configs(plan: &Plan, kernel: usize, target: &Target) -> Vec<KernelConfig> {
    let k = &plan.kernels[kernel];
    let unit = Unit { plan, kernel: k, target, helpers: Helpers::for_target(target) };
    let candidates = match &k.kind {
        KernelKind::Pointwise(_) => pointwise_candidates(&unit),
        KernelKind::Row(row) => row_candidates(&unit, row),
        KernelKind::MultiReduce(mr) => {
            let default = multi_reduce_default(mr, target);
            // New candidates go last: a remembered winner is an index into this list.
            [
                default,
                (256, 16_384),
                (256, 8_192),
                (512, 16_384),
                (256, 32_768),
                (128, 4_096),
                (512, 32_768),
                (256, 65_536),
            ]
            .into_iter()
            .map(|(block, chunk)| KernelConfig::MultiReduce { block, chunk })
            .collect()
        }
        KernelKind::Concat(_) => [256, 128, 512].into_iter().map(|block| KernelConfig::Concat { block }).collect(),
        KernelKind::MatMul(_) => (0..MATMUL_ALGORITHMS).map(|algorithm| KernelConfig::Library { algorithm }).collect(),
        KernelKind::IndexAdd(ia) => crate::index_add::candidates(ia)
            .into_iter()
            .map(|crate::index_add::Shape { warps, rows_per_warp, chunk, columns }| KernelConfig::IndexAdd {
                warps,
                rows_per_warp,
                chunk,
                columns,
            })
            .collect(),
        KernelKind::Column(col) => column_candidates(&unit, col),
        KernelKind::MultiPointwise(multi) => multi_pointwise_candidates(&unit, multi),
        KernelKind::Attention(att) => attention_forward_candidates(&unit, att),
        KernelKind::AttentionBackward(back) => attention_backward_candidates(&unit, back),
    };
    let mut unique: Vec<KernelConfig> = Vec::new();
    for candidate in candidates {
        if !unique.contains(&candidate) {
            unique.push(candidate);
        }
    }
    unique.truncate(8);
    unique
}

/// The tensor-core kernel first where it applies: on the H200 it matched the reference at every
/// tested size and ran the causal bf16 forward of B=16, H=12, T=1024, D=64 in 165 us where the
/// CUDA-core default took 3.5 ms. The CUDA-core shapes after it.
fn attention_forward_candidates(unit: &Unit<'_>, att: &Attention) -> Vec<KernelConfig> {
    let mut candidates = Vec::new();
    if crate::attention_mma::supports(unit, &att.shape, &att.layouts()) {
        // Two row blocks a warp (each shared-memory fragment feeds twice the mmas) in two stages
        // first at head dims up to 64: on the H200 at GPT-2's shape 144 us, the others 146-160 us.
        let mut shapes = Vec::new();
        if att.shape.head_dim <= 64 {
            shapes.extend([(4, 32, 2), (4, 32, 1)]);
        }
        shapes.extend([(4, 1), (8, 1), (4, 2), (8, 2)].map(|(warps, stages)| (warps, 16, stages)));
        for (warps, rows_per_warp, stages) in shapes {
            candidates.push(KernelConfig::Attention { warps, rows_per_warp, tensor_cores: true, stages });
        }
    }
    for (warps, rows_per_warp) in attention_candidates(att.shape.head_dim, false) {
        candidates.push(KernelConfig::Attention { warps, rows_per_warp, tensor_cores: false, stages: 1 });
    }
    candidates
}

/// As for the forward: the tensor-core kernels first where they apply, the CUDA-core shapes
/// after them.
fn attention_backward_candidates(unit: &Unit<'_>, back: &AttentionBackward) -> Vec<KernelConfig> {
    let mut candidates = Vec::new();
    if crate::attention_mma::supports(unit, &back.shape, &back.layouts()) {
        // On the H200 at GPT-2's shape (B=16, H=12, T=1024, D=64, causal bf16): dq fastest with
        // two row blocks a warp in two stages (151 us; one block in one stage 167 us), dk/dv with
        // one row block (240-244 us in one or two stages; two blocks 265 us).
        let queries = back.grads == [AttentionInput::Query];
        let narrow = back.shape.head_dim <= 64;
        let mut shapes: Vec<(u32, u32, u32)> = Vec::new();
        if queries && narrow {
            shapes.push((4, 32, 2));
        }
        let first = if queries { (4, 1) } else { (4, 2) };
        let one_block = [first, (4, 1), (8, 1), (2, 1), (4, 2), (2, 2)];
        shapes.extend(one_block.iter().map(|&(warps, stages)| (warps, 16, stages)));
        if narrow {
            shapes.extend([(4, 32, 2), (4, 32, 1)]);
        }
        for (warps, rows_per_warp, stages) in shapes {
            candidates.push(KernelConfig::AttentionBackward { warps, rows_per_warp, tensor_cores: true, stages });
        }
    }
    for (warps, rows_per_warp) in attention_candidates(back.shape.head_dim, true) {
        candidates.push(KernelConfig::AttentionBackward { warps, rows_per_warp, tensor_cores: false, stages: 1 });
    }
    candidates
}

/// `(warps, rows_per_warp)` of attention blocks: more rows a block share each staged tile, fewer
/// rows a warp keep its accumulators (`rows_per_warp * ceil(head_dim / 32)` words a lane, two
/// sets for dk/dv) in registers; wide heads hold fewer rows per warp. Only shapes that ptxas
/// (CUDA 13.0, sm_90) compiles without spilling are listed: some in between (a backward of 4
/// warps x 4 rows at head dim 64, or 2 rows at 128) leave a few words of the accumulators in
/// local memory.
fn attention_candidates(head_dim: usize, backward: bool) -> Vec<(u32, u32)> {
    match (head_dim > 64, backward) {
        (false, false) => vec![(4, 8), (4, 4), (8, 4), (8, 2)],
        (true, false) => vec![(4, 4), (4, 2), (8, 2), (4, 8)],
        (false, true) => vec![(4, 8), (8, 2)],
        (true, true) => vec![(4, 4), (8, 4), (4, 8)],
    }
}

/// The narrowest element (bytes) among the buffers a kernel touches, at most 4.
fn narrowest_element(unit: &Unit<'_>) -> usize {
    let kernel = unit.kernel;
    kernel
        .inputs
        .iter()
        .chain(&kernel.outputs)
        .map(|&b| unit.plan.buffer(b).dtype.size_bytes())
        .min()
        .unwrap_or(4)
        .min(4)
}

/// The bytes a pointwise body streams in per element, and the widest element among them: each
/// input it loads element by element counts (an operand of less than half the domain's
/// elements, such as a bias row or a device scalar, stays in cache and does not).
fn streamed_bytes(unit: &Unit<'_>, body: &Body, numel: usize) -> (usize, usize) {
    let mut slots: Vec<usize> = body
        .values
        .iter()
        .filter_map(|v| match &v.expr {
            Expr::Load { input, strides, .. } if strides.iter().any(|&s| s != 0) => Some(*input),
            _ => None,
        })
        .filter(|&slot| {
            slot < unit.kernel.inputs.len() && 2 * unit.plan.buffer(unit.kernel.inputs[slot]).numel >= numel
        })
        .collect();
    slots.sort_unstable();
    slots.dedup();
    let sizes = slots.iter().map(|&slot| unit.input_dtype(slot).size_bytes());
    (sizes.clone().sum(), sizes.max().unwrap_or(0))
}

/// Elements per thread and step: 16-byte accesses of the narrowest dtype (wider dtypes then take
/// several per step), then, where every stream is 16-bit, up to 32 bytes a stream while all the
/// streams together hold at most 64 bytes a thread, and fewer where wider streams beside a
/// narrow one would hold more, down to 16-byte accesses of the widest. Measured in gpt2_step on the H200:
/// the GELU backward (two bf16 streams) ran 96.6 us at 8 elements and 86.0 us at 16; the AdamW
/// update (three f32 streams and a bf16 one) 627 us at 8 and 488 us at 4.
fn pointwise_vector(unit: &Unit<'_>, (streamed, widest): (usize, usize)) -> u32 {
    let narrowest = narrowest_element(unit);
    let mut vec = (16 / narrowest as u32).min(8);
    let streamed = streamed.max(1) as u32;
    if narrowest == 2 && widest == 2 {
        while vec < 16 && 2 * vec * streamed <= 64 {
            vec *= 2;
        }
    }
    let least = (16 / widest.clamp(1, 16) as u32).max(1);
    while vec > least && vec * streamed > 64 {
        vec /= 2;
    }
    vec
}

fn pointwise_candidates(unit: &Unit<'_>) -> Vec<KernelConfig> {
    let KernelKind::Pointwise(pointwise) = &unit.kernel.kind else { unreachable!("a pointwise kernel") };
    let vec = pointwise_vector(unit, streamed_bytes(unit, &pointwise.body, pointwise.shape.numel()));
    // Measured on the H200: a grid with one vector per thread streams a few percent faster than
    // a persistent grid, so the cap only bounds the grid for huge tensors.
    let large = unit.target.sm_count * 1024;
    let persistent = unit.target.resident_blocks(256);
    vec![
        KernelConfig::Pointwise { block: 256, vec, grid_limit: large },
        KernelConfig::Pointwise { block: 128, vec, grid_limit: large },
        KernelConfig::Pointwise { block: 512, vec, grid_limit: large },
        KernelConfig::Pointwise { block: 256, vec: (vec * 2).min(16), grid_limit: large },
        KernelConfig::Pointwise { block: 256, vec: (vec / 2).max(1), grid_limit: large },
        KernelConfig::Pointwise { block: 256, vec, grid_limit: persistent },
    ]
}

/// As for pointwise kernels, plus tile sizes: by default the largest tiles (fewer blocks and
/// records for large members) that still give every SM two blocks, then smaller and larger ones.
fn multi_pointwise_candidates(unit: &Unit<'_>, multi: &MultiPointwise) -> Vec<KernelConfig> {
    // A thread works on one member at a time: the member streaming the most sets the vector.
    let streamed = multi.members.iter().map(|m| streamed_bytes(unit, &m.body, m.shape.numel())).max().unwrap_or((0, 0));
    let vec = pointwise_vector(unit, streamed);
    let numels: Vec<usize> = multi.members.iter().map(|m| m.shape.numel()).collect();
    let tiles = |block: u32, steps: u32| work_list(&numels, vec as usize, (block * steps) as usize).len();
    let wanted = 2 * unit.target.sm_count as usize;
    let mut steps = 16;
    while steps > 1 && tiles(256, steps) < wanted {
        steps /= 2;
    }
    let config = |block, vec, steps| KernelConfig::MultiPointwise { block, vec, steps };
    vec![
        config(256, vec, steps),
        config(256, vec, 1),
        config(256, vec, 4),
        config(256, vec, 16),
        config(128, vec, steps),
        config(512, vec, (steps / 2).max(1)),
        config(256, (vec / 2).max(1), steps),
    ]
}

/// Whether the row's elements are strided while consecutive rows are adjacent in memory (a
/// reduction over a non-trailing axis): then a thread per row keeps every access coalesced.
fn columns_are_strided(row: &RowKernel) -> bool {
    let per_row = row.body.row_values(row.outer.len());
    let mut strided = false;
    for (id, value) in row.body.values.iter().enumerate() {
        if let Expr::Load { strides, .. } = &value.expr {
            if per_row[id] || strides.len() != row.outer.len() + row.inner.len() {
                continue;
            }
            let inner = merge_view(&row.inner, &strides[row.outer.len()..]);
            let outer = merge_view(&row.outer, &strides[..row.outer.len()]);
            let unit_columns = inner.last().is_some_and(|d| d.stride == 1);
            let unit_rows = outer.last().is_some_and(|d| d.stride == 1);
            if unit_columns {
                return false;
            }
            strided |= unit_rows;
        }
    }
    strided
}

/// Elements of one value a thread holds when `tpr` threads share a row.
fn per_thread_elements(cols: usize, tpr: usize, vec: usize) -> usize {
    cols.div_ceil(tpr * vec) * vec
}

fn row_config_valid(cols: usize, vec: usize, config: &KernelConfig, target: &Target) -> bool {
    let KernelConfig::Row { threads_per_row: tpr, rows_per_block: rpb, cached } = *config else { return false };
    let block = tpr * rpb;
    let most = target.max_threads_per_block.min(1024);
    tpr.is_power_of_two()
        && tpr <= most
        && (tpr <= 32 || rpb <= MAX_MULTI_WARP_SLOTS)
        && (32..=most).contains(&block)
        && block % 32 == 0
        && (!cached || per_thread_elements(cols, tpr as usize, vec) <= MAX_CACHED_PER_THREAD)
}

/// Rows per block for rows of `tpr` threads (at most a warp): blocks of 32..256 threads, with
/// at least two blocks per SM where there are rows enough.
fn rows_per_block(rows: usize, tpr: u32, sm_count: u32) -> u32 {
    if tpr > 32 {
        return 1;
    }
    let most = 256 / tpr;
    let least = 32 / tpr;
    let wanted = (rows / (2 * sm_count as usize)).max(1);
    let wanted = 1u32 << (usize::BITS - 1 - wanted.leading_zeros()).min(31);
    wanted.clamp(least, most)
}

/// Threads per row by default: the power of two (at most `most`) whose threads hold the row in
/// registers (`fits`) with the fewest idle lanes, a warp's vectors in every step but the row's
/// last; among those equally full, the one nearest `per_thread` elements a thread (64 bytes of
/// the narrowest element). On the H200 (rows sweep, run Y1) rows of 8-12 elements a thread ran
/// at 48-66% of copy bandwidth where the autotuner's wider-per-thread pick reached 60-78%: few
/// elements a thread leave few loads in flight before the row's first reduction, and a
/// 1024-thread block over a 5,120-wide f32 row (1,280 vectors) left three quarters of its
/// second step idle. Where no width fits, the narrowest row whose elements fit uncached.
fn default_threads_per_row(cols: usize, vec: usize, per_thread: usize, most: u32, fits: &dyn Fn(u32) -> bool) -> u32 {
    let vectors = cols.div_ceil(vec).max(1);
    // The share of thread steps with no vector to work on.
    let idle = |t: u32| {
        let slots = vectors.div_ceil(t as usize) * t as usize;
        1.0 - vectors as f64 / slots as f64
    };
    let distance = |t: u32| {
        let held = per_thread_elements(cols, t as usize, vec) as f64;
        (held / per_thread as f64).log2().abs()
    };
    let fitting: Vec<u32> = (0..=most.trailing_zeros())
        .map(|p| 1u32 << p)
        .filter(|&t| t as usize <= vectors.next_power_of_two() && fits(t))
        .collect();
    // Idle shares within 10 points of the least count as equal; then the per-thread target decides.
    let least_idle = fitting.iter().map(|&t| idle(t)).fold(f64::INFINITY, f64::min);
    let best = fitting
        .into_iter()
        .filter(|&t| idle(t) <= least_idle + 0.1)
        .min_by(|&a, &b| distance(a).total_cmp(&distance(b)));
    best.unwrap_or_else(|| {
        let mut tpr = cols.div_ceil(per_thread).next_power_of_two().clamp(1, most as usize) as u32;
        while tpr < most && !fits(tpr) {
            tpr *= 2;
        }
        tpr
    })
}

/// Elements a thread holds by default: 64 bytes of the narrowest element for rows reduced in two
/// rounds or more (layer norm, softmax), 32 bytes for a single round (RMS norm, a row dot
/// product), whose one barrier makes more threads a row cheap. On the H200 (rows sweep Y2) RMS
/// rows of 1,024-4,096 columns ran 5-20% faster at 32 bytes a thread than at 64, layer norm and
/// softmax rows within noise or slower.
fn per_thread_target(unit: &Unit<'_>, rounds: usize) -> usize {
    let bytes = if rounds <= 1 { 32 } else { 64 };
    (bytes / narrowest_element(unit)).min(32)
}

fn row_candidates(unit: &Unit<'_>, row: &RowKernel) -> Vec<KernelConfig> {
    let cols = row.cols();
    let rows = row.rows();
    let vec = vector_width(unit, row);
    let analysis = RowAnalysis::of(row, true);
    let peak = analysis.peak_cached_arrays().max(1);
    let rounds = analysis.rounds;
    let target = unit.target;
    // Row kernels are written for at most 1024 threads (32 warps reduce through one warp).
    let most = target.max_threads_per_block.min(1024);
    let config = |tpr: u32, cached: bool| KernelConfig::Row {
        threads_per_row: tpr,
        rows_per_block: rows_per_block(rows, tpr, target.sm_count),
        cached,
    };
    // A 1024-thread block has 64 registers a thread; with a pass folding two values at once, 18
    // held elements spilled (fuzz seed 98,000,080: a bf16 layer norm of 18,291 columns, its
    // centred sum and sum of squares).
    let two_accumulators = analysis.widest_round(&row.body) >= 2;
    let fits = |tpr: u32| {
        let held = per_thread_elements(cols, tpr as usize, vec);
        let crowded = tpr >= 1024 && two_accumulators && held > MAX_HELD_BESIDE_TWO_ACCUMULATORS;
        let budget = if tpr >= 1024 { CACHED_REGISTER_BUDGET_AT_1024 } else { CACHED_REGISTER_BUDGET };
        held <= MAX_CACHED_PER_THREAD && held * peak <= budget && !crowded
    };
    let mut candidates = Vec::new();
    if columns_are_strided(row) {
        candidates.push(config(1, fits(1)));
        candidates.push(config(1, false));
        candidates.push(config(32, fits(32)));
    }
    let mut tpr = default_threads_per_row(cols, vec, per_thread_target(unit, rounds), most, &fits);
    // Too few rows to fill the GPU: latency, not bandwidth, bounds the kernel, so rows spread
    // over more threads, up to a warp (no block barrier), as long as every thread has a vector.
    let few_rows = |t: u32| rows * (t as usize) < target.sm_count as usize * 1024;
    while few_rows(tpr) && tpr < 32.min(most) && (2 * tpr as usize) <= cols.div_ceil(vec) && fits(2 * tpr) {
        tpr *= 2;
    }
    let cached = fits(tpr);
    candidates.push(config(tpr, cached));
    // Re-reading recomputes every earlier layer in every pass: only worth a try (and a compile)
    // for a few passes.
    if cached && rounds <= MAX_UNCACHED_ROUNDS {
        candidates.push(config(tpr, false));
    }
    if tpr > 1 {
        candidates.push(config(tpr / 2, fits(tpr / 2)));
    }
    if tpr < most {
        candidates.push(config(tpr * 2, fits(tpr * 2)));
    }
    if tpr != 32 {
        candidates.push(config(32, fits(32)));
    }
    candidates.push(config(most, fits(most)));
    // Rows of a vector or two a thread, several rows a 256-thread block (each at a barrier of its
    // own): many threads with few registers each, whose loads all issue before the first
    // reduction. The rows sweep's 16-bit rows of 768-1024 columns stayed behind torch.compile
    // even autotuned without them (run Y2), where a row of several warps had a block to itself
    // (65536x768 bf16 layer norm: 64 threads a block 147 us, a warp a row 117 us).
    for per_thread_vectors in [1, 2] {
        let t = (cols.div_ceil(vec * per_thread_vectors).next_power_of_two() as u32).min(most);
        let rows_per_block =
            if t > 32 { multi_warp_slots(t, rows, 256) } else { rows_per_block(rows, t, target.sm_count) };
        let candidate = KernelConfig::Row { threads_per_row: t, rows_per_block, cached: fits(t) };
        if t > 1 && !candidates.contains(&candidate) {
            candidates.push(candidate);
        }
    }
    // No more threads than the row has vectors (rounded up to a warp).
    let most_threads = cols.div_ceil(vec).next_power_of_two().max(32);
    if !row.partials.is_empty() {
        candidates = candidates.into_iter().map(|c| with_room_for_partials(c, row, vec, most)).collect();
        // The default's rows of several warps also in blocks twice as wide, and one row at a time.
        if let Some(&KernelConfig::Row { threads_per_row, cached, .. }) = candidates.first() {
            if threads_per_row > 32 {
                let wide = multi_warp_slots(threads_per_row, row.partial_rows, 2 * PARTIAL_BLOCK_THREADS);
                for (at, rows_per_block) in [(1, wide), (2, 1)] {
                    candidates.insert(at, KernelConfig::Row { threads_per_row, rows_per_block, cached });
                }
            }
        }
    }
    candidates.retain(|c| {
        row_config_valid(cols, vec, c, target)
            && matches!(c, KernelConfig::Row { threads_per_row, .. } if *threads_per_row as usize <= most_threads)
            && partials_fit(row, vec, c)
    });
    if candidates.is_empty() {
        candidates.push(with_room_for_partials(config(32, false), row, vec, most));
    }
    candidates
}

/// Whether `config`'s threads hold the row kernel's partial accumulators in registers.
fn partials_fit(row: &RowKernel, vec: usize, config: &KernelConfig) -> bool {
    let KernelConfig::Row { threads_per_row: tpr, .. } = *config else { return false };
    crate::row::partial_accumulators(row, tpr as usize, vec) <= crate::row::MAX_PARTIAL_ACCUMULATORS
}

/// Threads a block of a row kernel with partials aims at.
const PARTIAL_BLOCK_THREADS: u32 = 256;

/// Rows a block of rows of `tpr` threads (several warps) works on at once: the largest power
/// of two that fits `block_threads`, at most `rows` and `MAX_MULTI_WARP_SLOTS` (at least 1).
fn multi_warp_slots(tpr: u32, rows: usize, block_threads: u32) -> u32 {
    let most = (block_threads / tpr).min(rows.min(u32::MAX as usize) as u32).clamp(1, MAX_MULTI_WARP_SLOTS);
    1 << most.ilog2()
}

/// `config` with threads enough a row for the partials' accumulators (up to `most`), and no
/// more row groups a block than a block has rows of partials.
fn with_room_for_partials(config: KernelConfig, row: &RowKernel, vec: usize, most: u32) -> KernelConfig {
    let KernelConfig::Row { mut threads_per_row, mut rows_per_block, cached } = config else { return config };
    while threads_per_row < most
        && !partials_fit(row, vec, &KernelConfig::Row { threads_per_row, rows_per_block, cached })
    {
        threads_per_row *= 2;
    }
    let tpr = threads_per_row as usize;
    if tpr > 32 {
        // Rows of several warps: a block of several of them (each a slot with a barrier of its
        // own) where the group has rows enough, so the group's rows run side by side rather than
        // one at a time in a block too small to keep the SM busy.
        rows_per_block = multi_warp_slots(threads_per_row, row.partial_rows, PARTIAL_BLOCK_THREADS);
    } else {
        // Blocks of a warp at least, of no more row groups than the block's rows.
        let least = 32 / tpr;
        let wanted = (rows_per_block as usize).min(row.partial_rows.max(1));
        rows_per_block = wanted.max(least) as u32;
    }
    let held = per_thread_elements(row.cols(), tpr, vec);
    KernelConfig::Row { threads_per_row, rows_per_block, cached: cached && held <= MAX_CACHED_PER_THREAD }
}

/// A multi-reduce's default `(block, chunk)`: 256 threads over 16,384 elements, or 512 over
/// 32,768 where that still leaves four waves of resident blocks. gpt2_step's check of 249M
/// gradient elements took 416 us in blocks of 256 x 16,384, 314 us in 256 x 32,768 and 261 us in
/// 512 x 32,768 (its partials, arrivals and block tails a fourth as many).
fn multi_reduce_default(mr: &braze_plan::MultiReduce, target: &Target) -> (u32, u32) {
    let total: usize = mr.items.iter().map(|item| item.len).sum();
    let resident = (target.sm_count * (target.max_threads_per_sm / 512)) as usize;
    if total / 32_768 >= 4 * resident {
        (512, 32_768)
    } else {
        (256, 16_384)
    }
}

/// Column tiles a column kernel's grid should have at least, where the columns allow.
const MIN_COLUMN_TILES: usize = 16;
/// Threads across columns never fewer than this when narrowing tiles (of vectors of 4 or more
/// columns; scalar columns are left a warp wide): a row's segment stays 64 bytes of 16-byte
/// vectors.
const MIN_COLUMN_THREADS: usize = 4;

/// Threads across columns for `cols` columns of `vec` each: a warp at most (rows fill the
/// block), fewer where a warp's tiles would be few. One block folds all of a tile's row-chunk
/// partials at the end, so few wide tiles mean many chunks a tile and a long serial fold: 1,024
/// bf16 columns in 4 tiles of 256 folded 128 chunks each, and the bias gradient of a
/// `[8192, 1024]` matrix ran at 38% of the DRAM bandwidth.
fn column_threads(cols: usize, vec: usize) -> u32 {
    let vectors = cols.div_ceil(vec);
    let mut threads = vectors.next_power_of_two().clamp(1, 32);
    while vec >= 4 && threads > MIN_COLUMN_THREADS && vectors.div_ceil(threads) < MIN_COLUMN_TILES {
        threads /= 2;
    }
    threads as u32
}

/// Rows per block: enough chunks for two full waves of resident blocks (each SM the same number
/// of equal blocks, so none finishes last alone), each thread at least four rows.
fn column_rows_per_block(rows: usize, tiles: usize, row_threads: u32, sm_count: u32) -> u32 {
    let wanted_blocks = 2 * crate::column::BLOCKS_PER_SM * sm_count as usize;
    let wanted_chunks = wanted_blocks.div_ceil(tiles.max(1)).max(1);
    let least = row_threads as usize * 4;
    let rows_per_block = rows.div_ceil(wanted_chunks).max(least).next_multiple_of(row_threads as usize);
    rows_per_block.min(u32::MAX as usize) as u32
}

fn column_candidates(unit: &Unit<'_>, col: &ColumnKernel) -> Vec<KernelConfig> {
    let (rows, cols) = (col.rows(), col.cols());
    let sms = unit.target.sm_count;
    let config = |vec: usize, row_threads: u32, rows_scale: f64| {
        let col_threads = column_threads(cols, vec);
        let row_threads = row_threads.max(32u32.div_ceil(col_threads)).min(1024 / col_threads);
        let tiles = cols.div_ceil(col_threads as usize * vec);
        let rows_per_block = column_rows_per_block(rows, tiles, row_threads, sms) as f64 * rows_scale;
        KernelConfig::Column {
            col_threads,
            row_threads,
            vec: vec as u32,
            rows_per_block: (rows_per_block as u32).max(1),
        }
    };
    let vec = column_vector_width(unit, col);
    // 256-thread blocks by default.
    let row_threads = 256 / column_threads(cols, vec);
    let mut candidates = vec![
        config(vec, row_threads, 1.0),
        config(vec, row_threads * 2, 1.0),
        config(vec, (row_threads / 2).max(1), 1.0),
        config(vec, row_threads, 4.0),
        config(vec, row_threads, 0.25),
        config(1, row_threads, 1.0),
    ];
    // Many reductions of wide accumulators: fewer row threads, down to one row (no shared memory).
    candidates.retain(|c| {
        let KernelConfig::Column { col_threads, row_threads, vec, .. } = *c else { return false };
        column_partials_fit(col, col_threads as usize, row_threads as usize, vec as usize)
    });
    if candidates.is_empty() {
        candidates.push(KernelConfig::Column {
            col_threads: 32,
            row_threads: 1,
            vec: 1,
            rows_per_block: column_rows_per_block(rows, cols.div_ceil(32), 1, sms),
        });
    }
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At the rows sweep's widths, a layer norm's two cached values (64 registers for both):
    /// rows of 64 bytes a thread where that leaves no lane idle, else the fullest steps.
    #[test]
    fn default_threads_per_row_fill_their_steps_with_64_bytes_a_thread() {
        let pick = |cols: usize, vec: usize, per_thread: usize| {
            let fits = |t: u32| {
                let held = per_thread_elements(cols, t as usize, vec);
                held <= MAX_CACHED_PER_THREAD && held * 2 <= CACHED_REGISTER_BUDGET
            };
            default_threads_per_row(cols, vec, per_thread, 1024, &fits)
        };
        let f32_rows: Vec<u32> = [768, 1024, 3072, 4096, 5120, 8192].iter().map(|&c| pick(c, 4, 16)).collect();
        assert_eq!(f32_rows, [64, 64, 256, 256, 256, 512]);
        let bf16_rows: Vec<u32> = [768, 1024, 2048, 3072, 5120, 8192].iter().map(|&c| pick(c, 8, 32)).collect();
        assert_eq!(bf16_rows, [32, 32, 64, 128, 256, 256]);
        // 50,257 scalar columns fit no block's registers: the widest row, re-read.
        assert_eq!(pick(50_257, 1, 16), 1024);
    }

    #[test]
    fn rows_per_block_fills_blocks_and_sms() {
        let sms = Target::h200().sm_count;
        assert_eq!(rows_per_block(64, 32, sms), 1);
        assert_eq!(rows_per_block(16_384, 32, sms), 8);
        assert_eq!(rows_per_block(16_384, 512, sms), 1);
        assert_eq!(rows_per_block(10, 4, sms), 8);
        // Half the SMs: blocks fill up with rows sooner.
        assert_eq!(rows_per_block(16_384, 4, sms / 2), 64);
    }
}
