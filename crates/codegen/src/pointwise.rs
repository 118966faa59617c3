//! Pointwise kernels: a flat grid-stride loop over the domain, `vec` consecutive elements per
//! thread and step, with 16-byte loads and stores where the data is contiguous and aligned.

use crate::body::{check_body, declare, emit_values, live_values, value_name, BodyRules};
use crate::cuda::{cast, narrow, occupancy_bounds, value_type, Helpers};
use crate::error::{invalid_config, Result};
use crate::index::{classify, is_constant, merge_view, offset_expr, IndexWidth, VectorAccess, ViewDim};
use crate::vector::{emit_vector_load, emit_vector_store, load_rhs};
use crate::writer::CodeWriter;
use crate::{grid_for, Emitted, Launch, Param, TableSpec, Unit};

use braze_ir::DType;
use braze_plan::{Body, Expr, Pointwise};

/// Threads a pointwise kernel's blocks should fill an SM with (registers capped to fit).
const POINTWISE_RESIDENT_THREADS: u32 = 1536;

/// How a load is read inside the vector loop.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoadKind {
    /// The same element everywhere: loaded once per thread, before the loop.
    KernelConstant,
    /// One aligned vector load per step into `ldN[vec]`.
    Vector,
    /// One scalar load per step, shared by the whole vector.
    Uniform,
    /// One scalar load per element.
    Gather,
}

pub(crate) struct LoadInfo {
    slot: usize,
    base: usize,
    view: Vec<ViewDim>,
    kind: LoadKind,
}

/// Where a pointwise kernel's element count comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Extent {
    /// A literal in the code, with at most `grid_limit` blocks.
    Literal { grid_limit: u32 },
    /// A `u64` table the runtime uploads once: the code is the same for every shape.
    RunTime,
}

/// Whether `pw`'s code can read its element count at run time and be the same for every shape:
/// each live load reads its input contiguously over the whole domain from its start, or one
/// element for all, and nothing is gathered or indexed.
pub(crate) fn serves_any_extent(pw: &Pointwise) -> bool {
    let body = &pw.body;
    let dims = pw.shape.dims();
    let live = live_values(body, body.stores.iter().map(|s| s.value));
    pw.shape.numel() > 0
        && !body.stores.is_empty()
        && body.values.iter().enumerate().filter(|(id, _)| live[*id]).all(|(_, value)| match &value.expr {
            Expr::Load { offset, strides, .. } => {
                let view = merge_view(dims, strides);
                is_constant(&view) || (*offset == 0 && view.len() == 1 && view[0].stride == 1)
            }
            Expr::Gather { .. } | Expr::Index => false,
            _ => true,
        })
}

pub(crate) fn check_config(unit: &Unit<'_>, block: u32, vec: u32, grid_limit: u32) -> Result<()> {
    if !(32..=1024).contains(&block) || !block.is_multiple_of(32) {
        return Err(invalid_config(unit.name(), format!("block {block} is not a multiple of 32 in 32..=1024")));
    }
    if !vec.is_power_of_two() || vec > 16 {
        return Err(invalid_config(unit.name(), format!("vec {vec} is not a power of two up to 16")));
    }
    if grid_limit == 0 {
        return Err(invalid_config(unit.name(), "grid_limit is 0"));
    }
    Ok(())
}

pub(crate) fn generate(unit: &mut Unit<'_>, pw: &Pointwise, block: u32, vec: u32, extent: Extent) -> Result<Emitted> {
    let grid_limit = match extent {
        Extent::Literal { grid_limit } => grid_limit,
        Extent::RunTime => unit.target.sm_count * 1024,
    };
    check_config(unit, block, vec, grid_limit)?;
    let run_time = extent == Extent::RunTime;
    if run_time && !serves_any_extent(pw) {
        return Err(invalid_config(
            unit.name(),
            "an element count read at run time needs every load contiguous over the domain or of one element",
        ));
    }
    let kernel = unit.kernel;
    let body = &pw.body;
    let dims = pw.shape.dims();
    let rules =
        BodyRules { inputs: kernel.inputs.len(), outputs: kernel.outputs.len(), rank: dims.len(), reductions: false };
    check_body(&kernel.name, body, &rules)?;
    let numel = pw.shape.numel();
    let width = IndexWidth::for_largest(numel.max(unit.largest_buffer()));
    let vec = vec as usize;
    let lit = |n: usize| width.lit(n);
    let slots = SlotTypes::of(unit);
    let loads = analyze_loads(body, dims, vec);

    let (mut declared, mut params) = unit.buffer_params();
    if run_time {
        declared.push("const unsigned long long* __restrict__ extent".into());
        params.push(Param::Table(0));
    }
    let mut w = CodeWriter::new();
    if crate::gather::body_gathers(body) {
        for line in crate::gather::CHECKED_INDEX.lines() {
            w.line(line);
        }
    }
    // Not full occupancy: at 32 registers (256 threads) ptxas spills around the slow-path calls
    // of divisions, reciprocals, `sinf`/`cosf` and the like (fuzz seeds 91,000,810, 1,460 and
    // 5,003). Without any bound it may take as many registers as it likes: the bf16 GELU over
    // [8192, 4096] took 54, four blocks an SM, and ran in 55.8 us on the H100 where 40 (six
    // blocks) ran in 51.8 (run E). Where the cap spills, the kernel is compiled without it.
    let bounds = occupancy_bounds(&mut unit.helpers, block, POINTWISE_RESIDENT_THREADS);
    w.open(format!(
        "extern \"C\" __global__ void __launch_bounds__({bounds}) {}({})",
        kernel.name,
        declared.join(", ")
    ));
    if run_time {
        w.line("const idx_t NUMEL = (idx_t)extent[0];");
    } else if numel == 0 {
        w.line("// no elements: nothing to do");
    } else {
        w.line(format!("constexpr idx_t NUMEL = {};", lit(numel)));
    }
    let per_thread = if vec == 1 { "NUMEL".to_string() } else { format!("NUMEL / {}", lit(vec)) };
    let span = Span {
        first: format!("(idx_t)blockIdx.x * {} + threadIdx.x", lit(block as usize)),
        step: format!("(idx_t)gridDim.x * {}", lit(block as usize)),
        end: per_thread,
        tail_block: "blockIdx.x == 0u".into(),
        tail_comment: "one per thread of block 0",
        tail_first: false,
    };
    let emit = BodyEmit { kernel: &kernel.name, body, dims, loads: &loads, slots: &slots, vec, width, run_time };
    emit.emit(&mut w, &mut unit.helpers, &span)?;
    w.close();

    let mut launches = Vec::new();
    if numel > 0 && !body.stores.is_empty() {
        let vectors = numel / vec;
        let threads = if vec == 1 { numel } else { vectors.max(1) };
        let grid = grid_for(threads, block, grid_limit);
        launches.push(Launch {
            entry: kernel.name.clone(),
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_bytes: 0,
            params,
        });
    }
    let described = describe_loads(&loads);
    let mut notes = Vec::new();
    if !described.is_empty() {
        notes.push(format!("loads: {}", described.join(", ")));
    }
    Ok(Emitted {
        summary: format!("pointwise over {} ({numel} elements)", pw.shape),
        notes,
        width: Some(width),
        code: w.finish(),
        launches,
        scratch: Vec::new(),
        tables: if run_time { vec![TableSpec::Static((numel as u64).to_le_bytes().to_vec())] } else { Vec::new() },
    })
}

/// The storage dtypes of a kernel's input and output slots.
pub(crate) struct SlotTypes {
    pub(crate) inputs: Vec<DType>,
    pub(crate) outputs: Vec<DType>,
}

impl SlotTypes {
    pub(crate) fn of(unit: &Unit<'_>) -> SlotTypes {
        SlotTypes {
            inputs: (0..unit.kernel.inputs.len()).map(|slot| unit.input_dtype(slot)).collect(),
            outputs: (0..unit.kernel.outputs.len()).map(|slot| unit.output_dtype(slot)).collect(),
        }
    }
}

/// How each live load of `body` over `dims` is read when a thread takes `vec` elements a step.
pub(crate) fn analyze_loads(body: &Body, dims: &[usize], vec: usize) -> Vec<Option<LoadInfo>> {
    let live = live_values(body, body.stores.iter().map(|s| s.value));
    body.values
        .iter()
        .enumerate()
        .map(|(id, value)| match &value.expr {
            Expr::Load { input, offset, strides } if live[id] => {
                let view = merge_view(dims, strides);
                let kind = if is_constant(&view) {
                    LoadKind::KernelConstant
                } else if vec == 1 {
                    LoadKind::Gather
                } else {
                    match classify(*offset, &view, vec) {
                        VectorAccess::Contiguous => LoadKind::Vector,
                        VectorAccess::Uniform => LoadKind::Uniform,
                        VectorAccess::Gather => LoadKind::Gather,
                    }
                };
                Some(LoadInfo { slot: *input, base: *offset, view, kind })
            }
            _ => None,
        })
        .collect()
}

/// `v3 = in1 vector`, one entry per live load, for the kernel's header.
pub(crate) fn describe_loads(loads: &[Option<LoadInfo>]) -> Vec<String> {
    loads
        .iter()
        .enumerate()
        .filter_map(|(id, load)| {
            load.as_ref().map(|l| {
                let kind = match l.kind {
                    LoadKind::KernelConstant => "once per thread",
                    LoadKind::Vector => "vector",
                    LoadKind::Uniform => "once per vector",
                    LoadKind::Gather => "per element",
                };
                format!("v{id} = in{} {kind}", l.slot)
            })
        })
        .collect()
}

/// Which part of a pointwise domain one thread computes, as C expressions: vectors (elements
/// when `vec` is 1) `first, first + step, ...` below `end`; and, in the block for which
/// `tail_block` holds, the elements past the last whole vector.
pub(crate) struct Span {
    pub(crate) first: String,
    pub(crate) step: String,
    pub(crate) end: String,
    pub(crate) tail_block: String,
    /// Says who runs the tail, in its comment.
    pub(crate) tail_comment: &'static str,
    /// The tail before the loop rather than after it: then nothing the tail needs (a block's
    /// tile index) stays live across the loop, whose calls (a division's slow path) would
    /// make it spill.
    pub(crate) tail_first: bool,
}

/// One pointwise body to emit over its domain.
pub(crate) struct BodyEmit<'a> {
    pub(crate) kernel: &'a str,
    pub(crate) body: &'a Body,
    pub(crate) dims: &'a [usize],
    pub(crate) loads: &'a [Option<LoadInfo>],
    pub(crate) slots: &'a SlotTypes,
    pub(crate) vec: usize,
    pub(crate) width: IndexWidth,
    /// `NUMEL` is known only at run time: the vector loop and the tail are emitted for any count.
    pub(crate) run_time: bool,
}

impl BodyEmit<'_> {
    fn load_of(&self, id: usize) -> Option<&LoadInfo> {
        self.loads[id].as_ref()
    }

    fn is_kind(&self, id: usize, kind: LoadKind) -> bool {
        self.load_of(id).is_some_and(|l| l.kind == kind)
    }

    /// The load of value `id` at flat index `flat`, by index math.
    fn gather(&self, helpers: &mut Helpers, id: usize, flat: &str) -> String {
        let info = self.load_of(id).expect("a load");
        let lvalue = format!("in{}[{}]", info.slot, offset_expr(info.base, &info.view, flat, self.width));
        load_rhs(helpers, self.slots.inputs[info.slot], self.body.values[id].dtype, &lvalue)
    }

    /// The gather of value `id` at flat index `flat`: the table read at the checked index.
    fn gather_at(&self, helpers: &mut Helpers, id: usize, flat: &str) -> Option<String> {
        let Expr::Gather { input, offset, strides, index, index_stride, bound, check } = &self.body.values[id].expr
        else {
            return None;
        };
        let dtype = self.body.values[id].dtype;
        let checked =
            format!("braze_checked_index((long long){}, {bound}LL, checks + {})", value_name(index.0), 2 * check);
        if *bound == 0 {
            // Every index is out of range and there is no row to read.
            return Some(format!("((void){checked}, ({})0)", value_type(dtype)));
        }
        let view = merge_view(self.dims, strides);
        let lvalue = format!(
            "in{input}[{} + (idx_t){checked} * {}]",
            offset_expr(*offset, &view, flat, self.width),
            self.width.lit(*index_stride)
        );
        Some(load_rhs(helpers, self.slots.inputs[*input], dtype, &lvalue))
    }

    /// The element index `flat` as value `id`, when `id` is an index (an arange's element).
    fn index_at(&self, helpers: &mut Helpers, id: usize, flat: &str) -> Option<String> {
        let value = &self.body.values[id];
        matches!(value.expr, Expr::Index).then(|| cast(helpers, DType::I64, value.dtype, &format!("(long long){flat}")))
    }

    /// A load, a gather or an index at flat index `flat`.
    fn read_at(&self, helpers: &mut Helpers, id: usize, flat: &str) -> Option<String> {
        self.gather_at(helpers, id, flat)
            .or_else(|| self.index_at(helpers, id, flat))
            .or_else(|| self.load_of(id).map(|_| self.gather(helpers, id, flat)))
    }

    fn store_value(&self, helpers: &mut Helpers, id: usize, slot: usize, names: &[String]) -> String {
        cast(helpers, self.body.values[id].dtype, self.slots.outputs[slot], &names[id])
    }

    /// The loads that are the same everywhere, then the loop over `span`, then the tail.
    pub(crate) fn emit(&self, w: &mut CodeWriter, helpers: &mut Helpers, span: &Span) -> Result<()> {
        let body = self.body;
        let (vec, width) = (self.vec, self.width);
        let lit = |n: usize| width.lit(n);
        let numel: usize = self.dims.iter().product();
        let output_dtypes = &self.slots.outputs;
        let mut names: Vec<String> = (0..body.values.len()).map(value_name).collect();
        let live = live_values(body, body.stores.iter().map(|s| s.value));

        let constant_loads: Vec<usize> =
            (0..body.values.len()).filter(|&id| self.is_kind(id, LoadKind::KernelConstant)).collect();
        if !constant_loads.is_empty() {
            w.line("// the same element for every position: loaded once");
            for &id in &constant_loads {
                let info = self.load_of(id).unwrap();
                let rhs = load_rhs(
                    helpers,
                    self.slots.inputs[info.slot],
                    body.values[id].dtype,
                    &format!("in{}[{}]", info.slot, lit(info.base)),
                );
                w.line(declare(body, id, &rhs));
            }
        }
        let computed: Vec<usize> =
            (0..body.values.len()).filter(|&id| live[id] && !self.is_kind(id, LoadKind::KernelConstant)).collect();
        let mut stored_slots: Vec<usize> = body.stores.iter().map(|s| s.output).collect();
        stored_slots.sort();
        stored_slots.dedup();

        if span.tail_first {
            self.emit_tail(w, helpers, span, &computed)?;
        }
        let vectors = numel / vec;
        let Span { first, step, end, .. } = span;
        if (numel > 0 || self.run_time) && vec == 1 {
            w.open(format!("for (idx_t i = {first}; i < {end}; i += {step})"));
            self.emit_element_i(w, helpers, &computed)?;
            w.close();
        } else if vectors > 0 || self.run_time {
            w.line(format!("// {vec} consecutive elements per thread and step"));
            w.open(format!("for (idx_t vector = {first}; vector < {end}; vector += {step})"));
            w.line(format!("const idx_t i0 = vector * {};", lit(vec)));
            for id in (0..body.values.len()).filter(|&id| self.is_kind(id, LoadKind::Vector)) {
                let info = self.load_of(id).unwrap();
                let dtype = self.slots.inputs[info.slot];
                w.line(format!("{} ld{id}[{vec}];", value_type(dtype)));
                let offset = offset_expr(info.base, &info.view, "i0", width);
                emit_vector_load(
                    w,
                    helpers,
                    dtype,
                    &format!("in{}", info.slot),
                    &offset,
                    &format!("ld{id}"),
                    "",
                    vec,
                    width,
                );
            }
            for id in (0..body.values.len()).filter(|&id| self.is_kind(id, LoadKind::Uniform)) {
                let rhs = self.gather(helpers, id, "i0");
                w.line(format!("const {} ld{id} = {rhs};", value_type(body.values[id].dtype)));
            }
            for &slot in &stored_slots {
                w.line(format!("{} st{slot}[{vec}];", value_type(output_dtypes[slot])));
            }
            w.line("#pragma unroll");
            w.open(format!("for (unsigned k = 0u; k < {vec}u; ++k)"));
            let gathers = computed.iter().any(|&id| matches!(body.values[id].expr, Expr::Gather { .. } | Expr::Index));
            if gathers || computed.iter().any(|&id| self.is_kind(id, LoadKind::Gather)) {
                w.line("const idx_t i = i0 + k;");
            }
            emit_values(w, self.kernel, helpers, body, computed.iter().copied(), &mut names, |id, helpers| {
                if let Some(read) = self.gather_at(helpers, id, "i").or_else(|| self.index_at(helpers, id, "i")) {
                    return Some(read);
                }
                let info = self.load_of(id)?;
                Some(match info.kind {
                    LoadKind::Vector => {
                        cast(helpers, self.slots.inputs[info.slot], body.values[id].dtype, &format!("ld{id}[k]"))
                    }
                    LoadKind::Uniform => format!("ld{id}"),
                    _ => self.gather(helpers, id, "i"),
                })
            })?;
            for store in &body.stores {
                let value = self.store_value(helpers, store.value.0, store.output, &names);
                w.line(format!("st{}[k] = {value};", store.output));
            }
            w.close();
            for &slot in &stored_slots {
                let pointer = format!("out{slot}");
                emit_vector_store(w, helpers, output_dtypes[slot], &pointer, "i0", &format!("st{slot}"), vec, width);
            }
            w.close();
        }
        if !span.tail_first {
            self.emit_tail(w, helpers, span, &computed)?;
        }
        Ok(())
    }

    /// The elements past the last whole vector, one per thread of the block `span` names.
    fn emit_tail(&self, w: &mut CodeWriter, helpers: &mut Helpers, span: &Span, computed: &[usize]) -> Result<()> {
        let (vec, width) = (self.vec, self.width);
        if self.run_time && vec > 1 {
            w.line(format!("// the elements past the last whole vector, {}", span.tail_comment));
            w.open(format!("if ({})", span.tail_block));
            w.line(format!("const idx_t tail_start = NUMEL / {} * {};", width.lit(vec), width.lit(vec)));
            w.open("if ((idx_t)threadIdx.x < NUMEL - tail_start)");
            w.line("const idx_t i = tail_start + threadIdx.x;");
            self.emit_element_i(w, helpers, computed)?;
            w.close();
            w.close();
            return Ok(());
        }
        let numel: usize = self.dims.iter().product();
        let tail = if vec == 1 { 0 } else { numel % vec };
        if tail > 0 {
            w.line(format!("// the last {tail} elements, {}", span.tail_comment));
            w.open(format!("if ({} && threadIdx.x < {tail}u)", span.tail_block));
            w.line(format!("const idx_t i = {} + threadIdx.x;", width.lit(numel / vec * vec)));
            self.emit_element_i(w, helpers, computed)?;
            w.close();
        }
        Ok(())
    }

    /// The body's values at element `i` (a variable in scope) and its stores there.
    fn emit_element_i(&self, w: &mut CodeWriter, helpers: &mut Helpers, computed: &[usize]) -> Result<()> {
        let body = self.body;
        let mut names: Vec<String> = (0..body.values.len()).map(value_name).collect();
        emit_values(w, self.kernel, helpers, body, computed.iter().copied(), &mut names, |id, helpers| {
            self.read_at(helpers, id, "i")
        })?;
        for store in &body.stores {
            let value = self.store_value(helpers, store.value.0, store.output, &names);
            let dtype = self.slots.outputs[store.output];
            w.line(format!("out{}[i] = {};", store.output, narrow(dtype, &value)));
        }
        Ok(())
    }
}
