//! braze-codegen: one plan kernel plus a launch config in, CUDA C source text out.
//!
//! Pure text generation: no device, no driver, deterministic (the same kernel and config give
//! byte-identical source), so every kernel can be snapshotted and compiled with NVRTC on a
//! machine without a GPU. Each [`GeneratedKernel`] is one self-contained translation unit that
//! includes no headers (cold compiles stay in milliseconds), with `extern "C"` entry points named
//! after the plan kernel and a comment block that lists the source ops it implements, their user
//! source locations, its launches and workspaces.
//!
//! Contract with the runtime:
//! - every kernel parameter is a device pointer; sizes are baked into the source (a plan is
//!   specialised to one input signature);
//! - every buffer starts at a 16-byte aligned address (vector loads rely on it), and no output
//!   buffer of a kernel overlaps one of its inputs, except an input the kernel reads only at the
//!   element it stores (in-place write-backs and the memory plan's shared slots: each thread
//!   reads the element before it writes it, so `__restrict__` parameters stay sound);
//! - [`Launch`]es run in order on one stream; a kernel with no elements has no launches;
//! - [`ScratchSpec`] workspaces are allocated once per plan and signature; a `zero_init` one is
//!   zeroed at allocation and the kernels leave it zeroed after every run, so CUDA-graph replays
//!   stay valid;
//! - [`TableSpec::InputPointers`] holds one `u64` device pointer per kernel input slot, refreshed
//!   whenever input buffers change; [`TableSpec::Static`] is uploaded once (the work lists of
//!   multi-reduce and multi-pointwise kernels).
//!
//! Families, one module each: `pointwise`, `row`, `multi_reduce`, `multi_pointwise`
//! (independent pointwise programs in one launch, a block per tile of one member), `concat`,
//! `attention` (flash-attention forward, and a dq and a dk/dv backward kernel), `index_add`
//! (an index_select's gradient, each output row summed by the warp that owns it);
//! matmuls are [`KernelCode::CuBlasLt`].
//!
//! Launch configurations and the grids they leave open are chosen for a [`Target`], the GPU as
//! data (SM count, compute capability, thread and shared-memory limits): `braze-cuda` builds it
//! from the device, and everything without a GPU assumes [`Target::h200`] and says so.
//!
//! Index math is 32-bit when every extent and offset a kernel touches is below 2^31, else 64-bit.
//! Float math is f32 whatever the storage dtype (f16/bf16 widen on load, narrow on store, and
//! round where a cast says so); the op semantics are those of the CPU reference.

mod attention;
mod attention_layout;
mod attention_mma;
mod attention_mma_backward;
mod body;
mod column;
mod concat;
mod config;
mod cuda;
mod error;
mod gather;
mod index;
mod index_add;
mod multi_pointwise;
mod multi_reduce;
mod multi_reduce_epilogue;
mod pointwise;
mod reduce;
mod row;
mod target;
mod vector;
mod writer;

pub use config::{any_extent_config, candidate_configs, default_config, KernelConfig};
pub use cuda::{has_occupancy_hint, occupancy_hints, OccupancyHint, NO_OCCUPANCY_HINT, ONE_BLOCK_AN_SM};
pub use error::{CodegenError, Result};
pub use target::Target;

use braze_ir::DType;
use braze_plan::{Kernel, KernelKind, MatMul, Plan};
use cuda::{storage_type, Helpers};
use index::IndexWidth;
use pointwise::Extent;
use writer::CodeWriter;

/// What the runtime runs for one plan kernel.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelCode {
    Cuda(GeneratedKernel),
    /// A matrix product the runtime hands to cuBLASLt (nothing to compile).
    CuBlasLt(MatMul),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratedKernel {
    /// The plan kernel's name; also the name of its (first) entry point.
    pub name: String,
    /// One self-contained CUDA C translation unit; may hold several `__global__` functions.
    pub source: String,
    /// Run in order on one stream; empty when the kernel has no elements.
    pub launches: Vec<Launch>,
    /// Device workspaces the runtime allocates once per plan and input signature.
    pub scratch: Vec<ScratchSpec>,
    /// Device data the runtime prepares.
    pub tables: Vec<TableSpec>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// `extern "C"` entry point in [`GeneratedKernel::source`].
    pub entry: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory (static shared memory is declared in the source).
    pub shared_bytes: u32,
    /// One device pointer per kernel parameter, in order.
    pub params: Vec<Param>,
}

impl Launch {
    /// A grid of one block per entry of a work list (`entries` blocks of `block` threads), or no
    /// launch for an empty list.
    pub(crate) fn per_work_item(entry: &str, entries: usize, block: u32, params: Vec<Param>) -> Vec<Launch> {
        if entries == 0 {
            return Vec::new();
        }
        vec![Launch {
            entry: entry.to_string(),
            grid: [entries as u32, 1, 1],
            block: [block, 1, 1],
            shared_bytes: 0,
            params,
        }]
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Param {
    /// The buffer of kernel input slot `i` (as in the plan's [`Kernel::inputs`]).
    Input(usize),
    /// The buffer of kernel output slot `o` (as in the plan's [`Kernel::outputs`]).
    Output(usize),
    /// [`GeneratedKernel::scratch`] entry `s`.
    Scratch(usize),
    /// [`GeneratedKernel::tables`] entry `t`.
    Table(usize),
    /// The plan's check words: two `u64` per [`braze_plan::Plan::checks`] entry, `[raised,
    /// first index]`, zero before a run; a kernel that raises check `c` sets word `2c` to 1
    /// and word `2c + 1` to the offending index (as an i64's bits).
    Checks,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScratchSpec {
    pub bytes: usize,
    /// Zeroed once at allocation; kernels leave it zeroed again after each run.
    pub zero_init: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableSpec {
    /// A `u64` device pointer per kernel input slot, filled by the runtime whenever the input
    /// buffers change.
    InputPointers,
    /// Constant data uploaded once.
    Static(Vec<u8>),
}

/// Generates the code of `plan.kernels[kernel]` for `config` on `target` (which sizes the
/// grids that are not part of the config).
pub fn generate(plan: &Plan, kernel: usize, config: &KernelConfig, target: &Target) -> Result<KernelCode> {
    let count = plan.kernels.len();
    let k = plan.kernels.get(kernel).ok_or(CodegenError::NoSuchKernel { index: kernel, count })?;
    check_kernel(plan, k)?;
    let mismatch =
        || CodegenError::ConfigMismatch { kernel: k.name.clone(), family: k.kind.family(), config: config.family() };
    let mut unit = Unit { plan, kernel: k, target, helpers: Helpers::for_target(target) };
    let emitted = match (&k.kind, *config) {
        (KernelKind::MatMul(matmul), KernelConfig::Library { .. }) => return Ok(KernelCode::CuBlasLt(matmul.clone())),
        (KernelKind::Pointwise(pointwise), KernelConfig::Pointwise { block, vec, grid_limit }) => {
            pointwise::generate(&mut unit, pointwise, block, vec, Extent::Literal { grid_limit })?
        }
        (KernelKind::Pointwise(pointwise), KernelConfig::PointwiseAnyExtent { block, vec }) => {
            pointwise::generate(&mut unit, pointwise, block, vec, Extent::RunTime)?
        }
        (KernelKind::Row(row), KernelConfig::Row { threads_per_row, rows_per_block, cached }) => {
            row::generate(&mut unit, row, threads_per_row, rows_per_block, cached)?
        }
        (KernelKind::MultiReduce(multi), KernelConfig::MultiReduce { block, chunk }) => {
            multi_reduce::generate(&mut unit, multi, block, chunk)?
        }
        (KernelKind::Concat(concat), KernelConfig::Concat { block }) => concat::generate(&mut unit, concat, block)?,
        (KernelKind::Column(col), KernelConfig::Column { col_threads, row_threads, vec, rows_per_block }) => {
            column::generate(&mut unit, col, col_threads, row_threads, vec, rows_per_block)?
        }
        (KernelKind::MultiPointwise(multi), KernelConfig::MultiPointwise { block, vec, steps }) => {
            multi_pointwise::generate(&mut unit, multi, block, vec, steps)?
        }
        (KernelKind::Attention(att), KernelConfig::Attention { warps, rows_per_warp, tensor_cores: true, stages }) => {
            attention_mma::generate(&mut unit, att, warps, rows_per_warp, stages)?
        }
        (
            KernelKind::Attention(att),
            KernelConfig::Attention { warps, rows_per_warp, tensor_cores: false, stages: 1 },
        ) => attention::generate_forward(&mut unit, att, warps, rows_per_warp)?,
        (
            KernelKind::AttentionBackward(back),
            KernelConfig::AttentionBackward { warps, rows_per_warp, tensor_cores: true, stages },
        ) => attention_mma_backward::generate(&mut unit, back, warps, rows_per_warp, stages)?,
        (
            KernelKind::AttentionBackward(back),
            KernelConfig::AttentionBackward { warps, rows_per_warp, tensor_cores: false, stages: 1 },
        ) => attention::generate_backward(&mut unit, back, warps, rows_per_warp)?,
        (KernelKind::Attention(_), KernelConfig::Attention { tensor_cores: false, stages, .. })
        | (KernelKind::AttentionBackward(_), KernelConfig::AttentionBackward { tensor_cores: false, stages, .. }) => {
            return Err(error::invalid_config(
                &k.name,
                format!("the CUDA-core attention kernels stage one tile at a time, not {stages}"),
            ))
        }
        (KernelKind::IndexAdd(ia), KernelConfig::IndexAdd { warps, rows_per_warp, chunk, columns }) => {
            index_add::generate(&mut unit, ia, index_add::Shape { warps, rows_per_warp, chunk, columns })?
        }
        _ => return Err(mismatch()),
    };
    Ok(KernelCode::Cuda(assemble(unit, config, emitted)))
}

/// Generates every kernel of a plan for `target`, `configs[i]` for kernel `i`.
pub fn plan_sources(plan: &Plan, configs: &[KernelConfig], target: &Target) -> Result<Vec<KernelCode>> {
    if configs.len() != plan.kernels.len() {
        return Err(CodegenError::ConfigCount { configs: configs.len(), kernels: plan.kernels.len() });
    }
    configs.iter().enumerate().map(|(i, config)| generate(plan, i, config, target)).collect()
}

/// Checks what every family relies on: a usable entry name and existing buffers.
fn check_kernel(plan: &Plan, kernel: &Kernel) -> Result<()> {
    let name = &kernel.name;
    let valid_identifier = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid_identifier {
        return Err(error::malformed(name, "the kernel name is not a C identifier"));
    }
    for (role, ids) in [("input", &kernel.inputs), ("output", &kernel.outputs)] {
        for (slot, id) in ids.iter().enumerate() {
            if id.0 >= plan.buffers.len() {
                return Err(error::malformed(name, format!("{role} slot {slot} names {id}, which does not exist")));
            }
        }
    }
    Ok(())
}

/// The kernel being generated and the helpers its source needs.
pub(crate) struct Unit<'a> {
    pub(crate) plan: &'a Plan,
    pub(crate) kernel: &'a Kernel,
    pub(crate) target: &'a Target,
    pub(crate) helpers: Helpers,
}

impl Unit<'_> {
    pub(crate) fn name(&self) -> &str {
        &self.kernel.name
    }

    pub(crate) fn input_dtype(&self, slot: usize) -> DType {
        self.plan.buffer(self.kernel.inputs[slot]).dtype
    }

    pub(crate) fn output_dtype(&self, slot: usize) -> DType {
        self.plan.buffer(self.kernel.outputs[slot]).dtype
    }

    /// The element count of the largest buffer the kernel touches.
    pub(crate) fn largest_buffer(&self) -> usize {
        self.kernel.inputs.iter().chain(&self.kernel.outputs).map(|&b| self.plan.buffer(b).numel).max().unwrap_or(0)
    }

    /// `const T* __restrict__ inN`
    pub(crate) fn input_param(&mut self, slot: usize) -> String {
        let dtype = self.input_dtype(slot);
        self.helpers.need_storage(dtype);
        format!("const {}* __restrict__ in{slot}", storage_type(dtype))
    }

    /// `T* __restrict__ outN`
    pub(crate) fn output_param(&mut self, slot: usize) -> String {
        let dtype = self.output_dtype(slot);
        self.helpers.need_storage(dtype);
        format!("{}* __restrict__ out{slot}", storage_type(dtype))
    }

    /// Input parameters then output parameters, as declared and as launched.
    pub(crate) fn buffer_params(&mut self) -> (Vec<String>, Vec<Param>) {
        let mut declared = Vec::new();
        let mut params = Vec::new();
        for slot in 0..self.kernel.inputs.len() {
            declared.push(self.input_param(slot));
            params.push(Param::Input(slot));
        }
        for slot in 0..self.kernel.outputs.len() {
            declared.push(self.output_param(slot));
            params.push(Param::Output(slot));
        }
        if gather::kernel_gathers(self.kernel) {
            declared.push("unsigned long long* __restrict__ checks".into());
            params.push(Param::Checks);
        }
        (declared, params)
    }
}

/// What a family produced, before the header and helpers are put in front.
pub(crate) struct Emitted {
    /// One line saying what the kernel computes over which domain.
    pub(crate) summary: String,
    /// Further header lines (layout of tables, strategy).
    pub(crate) notes: Vec<String>,
    /// `None` for families that declare no `idx_t`.
    pub(crate) width: Option<IndexWidth>,
    /// Types and `__global__` functions.
    pub(crate) code: String,
    pub(crate) launches: Vec<Launch>,
    pub(crate) scratch: Vec<ScratchSpec>,
    pub(crate) tables: Vec<TableSpec>,
}

/// Keeps user-provided text (file names) from breaking out of a `//` comment.
fn comment_safe(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { '?' } else { c }).collect()
}

fn describe_param(param: &Param) -> String {
    match param {
        Param::Input(i) => format!("in{i}"),
        Param::Output(o) => format!("out{o}"),
        Param::Scratch(s) => format!("scratch{s}"),
        Param::Table(t) => format!("table{t}"),
        Param::Checks => "checks".into(),
    }
}

fn assemble(unit: Unit<'_>, config: &KernelConfig, emitted: Emitted) -> GeneratedKernel {
    let kernel = unit.kernel;
    let plan = unit.plan;
    let mut w = CodeWriter::new();
    w.line(format!("// braze kernel `{}`: {}", kernel.name, emitted.summary));
    w.line(format!("// config: {config}"));
    for note in &emitted.notes {
        w.line(format!("// {note}"));
    }
    w.line("// source ops:");
    if kernel.sources.is_empty() {
        w.line("//   (none recorded)");
    }
    for source in &kernel.sources {
        let location = source.loc.as_ref().map_or_else(|| "(no location)".to_string(), |loc| loc.to_string());
        w.line(comment_safe(&format!("//   {:<14} {location}", source.op)));
    }
    w.line("// buffers:");
    for (role, ids) in [("in", &kernel.inputs), ("out", &kernel.outputs)] {
        for (slot, id) in ids.iter().enumerate() {
            let buffer = plan.buffer(*id);
            w.line(format!("//   {role}{slot} = {id}: {} x {}", buffer.numel, buffer.dtype));
        }
    }
    for (s, scratch) in emitted.scratch.iter().enumerate() {
        let zeroed = if scratch.zero_init { ", zeroed once and left zeroed by every run" } else { "" };
        w.line(format!("//   scratch{s}: {} bytes{zeroed}", scratch.bytes));
    }
    for (t, table) in emitted.tables.iter().enumerate() {
        match table {
            TableSpec::InputPointers => w.line(format!("//   table{t}: one device pointer per input slot")),
            TableSpec::Static(bytes) => w.line(format!("//   table{t}: {} bytes of constant data", bytes.len())),
        }
    }
    w.line("// launches:");
    if emitted.launches.is_empty() {
        w.line("//   none (no elements)");
    }
    for launch in &emitted.launches {
        let params: Vec<String> = launch.params.iter().map(describe_param).collect();
        w.line(format!(
            "//   {}<<<{}, {}, {}>>>({})",
            launch.entry,
            grid_text(launch.grid),
            launch.block[0],
            launch.shared_bytes,
            params.join(", ")
        ));
    }
    w.line("");
    if let Some(width) = emitted.width {
        w.line(width.typedef());
        w.line("");
    }
    unit.helpers.render(&mut w, &emitted.code);
    let mut source = w.finish();
    source.push_str(&emitted.code);
    GeneratedKernel {
        name: kernel.name.clone(),
        source,
        launches: emitted.launches,
        scratch: emitted.scratch,
        tables: emitted.tables,
    }
}

/// `x` or `(x, y)` or `(x, y, z)`: the grid as the launch comment prints it.
fn grid_text(grid: [u32; 3]) -> String {
    match grid {
        [x, 1, 1] => x.to_string(),
        [x, y, 1] => format!("({x}, {y})"),
        [x, y, z] => format!("({x}, {y}, {z})"),
    }
}

/// Blocks needed to give `threads` threads `block` threads each, at most `limit`, at least 1.
pub(crate) fn grid_for(threads: usize, block: u32, limit: u32) -> u32 {
    let blocks = threads.div_ceil(block as usize).max(1);
    blocks.min(limit as usize).min(i32::MAX as usize) as u32
}
