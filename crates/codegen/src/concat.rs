//! Concat kernels: one copy kernel over the output. Elements are copied as raw bits in the
//! widest aligned words that every input's runs allow.
//!
//! Up to [`MAX_DIRECT_INPUTS`] inputs are kernel parameters and each output vector picks its
//! input with a chain of compile-time bounds. More inputs (a stack of hundreds of tensors) come
//! from an input-pointer table and each `blockIdx.y` copies one input, so no thread searches.

use crate::cuda::storage_type;
use crate::error::{invalid_config, malformed, unsupported, Result};
use crate::index::IndexWidth;
use crate::writer::CodeWriter;
use crate::{grid_for, Emitted, Launch, Param, TableSpec, Unit};
use braze_plan::Concat;

pub(crate) const MAX_DIRECT_INPUTS: usize = 8;
/// Blocks per input (grid x) at most, in the table form.
const MAX_BLOCKS_PER_INPUT: u32 = 1024;

/// The raw C type of a `bytes`-byte aligned word.
fn raw_word(bytes: usize) -> &'static str {
    match bytes {
        1 => "unsigned char",
        2 => "unsigned short",
        4 => "unsigned",
        8 => "uint2",
        _ => "uint4",
    }
}

/// `dst[..] = src[..]` for `vec` elements of `element_bytes` each, as one raw word.
fn copy_line(dst: &str, src: &str, vec: usize, element_bytes: usize) -> String {
    let word = raw_word(vec * element_bytes);
    if vec == 1 {
        format!("{dst} = {src};")
    } else {
        format!("*reinterpret_cast<{word}*>(&{dst}) = *reinterpret_cast<const {word}*>(&{src});")
    }
}

pub(crate) fn generate(unit: &mut Unit<'_>, concat: &Concat, block: u32) -> Result<Emitted> {
    let kernel = unit.kernel;
    let name = kernel.name.clone();
    if !(32..=1024).contains(&block) || !block.is_multiple_of(32) {
        return Err(invalid_config(&name, format!("block {block} is not a multiple of 32 in 32..=1024")));
    }
    let dims = concat.shape.dims();
    if concat.axis >= dims.len() {
        return Err(malformed(&name, format!("axis {} of a rank-{} shape", concat.axis, dims.len())));
    }
    if kernel.inputs.len() != concat.extents.len() || kernel.outputs.len() != 1 {
        return Err(malformed(
            &name,
            format!(
                "{} extents for {} inputs and {} outputs",
                concat.extents.len(),
                kernel.inputs.len(),
                kernel.outputs.len()
            ),
        ));
    }
    if concat.extents.iter().sum::<usize>() != dims[concat.axis] {
        return Err(malformed(&name, format!("extents {:?} do not add up to {}", concat.extents, dims[concat.axis])));
    }
    for slot in 0..kernel.inputs.len() {
        if unit.input_dtype(slot) != concat.dtype {
            return Err(malformed(&name, format!("input {slot} is {}, not {}", unit.input_dtype(slot), concat.dtype)));
        }
    }
    let outer: usize = dims[..concat.axis].iter().product();
    let inner: usize = dims[concat.axis + 1..].iter().product();
    let row = dims[concat.axis] * inner;
    let numel = outer * row;
    let runs: Vec<usize> = concat.extents.iter().map(|e| e * inner).collect();
    let starts: Vec<usize> = runs
        .iter()
        .scan(0, |acc, r| {
            let s = *acc;
            *acc += r;
            Some(s)
        })
        .collect();
    let element_bytes = concat.dtype.size_bytes();
    let mut vec = 16 / element_bytes;
    while vec > 1 && runs.iter().any(|r| r % vec != 0) {
        vec /= 2;
    }
    let width = IndexWidth::for_largest(numel.max(unit.largest_buffer()));
    let lit = |n: usize| width.lit(n);
    let storage = storage_type(concat.dtype);
    unit.helpers.need_storage(concat.dtype);
    let mut w = CodeWriter::new();
    let mut launches = Vec::new();
    let mut tables = Vec::new();
    let direct = kernel.inputs.len() <= MAX_DIRECT_INPUTS;
    let notes = if direct {
        vec![format!("{vec} elements per copy; each vector picks its input by position along axis {}", concat.axis)]
    } else {
        vec![format!("{vec} elements per copy; table1: (start in row, run length) as u64 pairs per input")]
    };

    if direct {
        let (declared, params) = unit.buffer_params();
        w.open(format!("extern \"C\" __global__ void __launch_bounds__({block}) {name}({})", declared.join(", ")));
        w.line(format!("constexpr idx_t NUMEL = {};", lit(numel)));
        w.line(format!("constexpr idx_t ROW = {};  // output elements per index before the axis", lit(row)));
        w.open(format!(
            "for (idx_t vector = (idx_t)blockIdx.x * {b} + threadIdx.x; vector < NUMEL / {v}; vector += (idx_t)gridDim.x * {b})",
            b = lit(block as usize),
            v = lit(vec)
        ));
        w.line(format!("const idx_t i = vector * {};", lit(vec)));
        if outer > 1 {
            w.line("const idx_t outer = i / ROW;");
            w.line("const idx_t along = i % ROW;");
        } else {
            w.line("const idx_t along = i;");
        }
        let nonempty: Vec<usize> = (0..runs.len()).filter(|&j| runs[j] > 0).collect();
        for (position, &j) in nonempty.iter().enumerate() {
            let source_offset = {
                let within = if starts[j] == 0 { "along".to_string() } else { format!("(along - {})", lit(starts[j])) };
                if outer > 1 {
                    format!("outer * {} + {within}", lit(runs[j]))
                } else {
                    within
                }
            };
            let copy = copy_line("out0[i]", &format!("in{j}[{source_offset}]"), vec, element_bytes);
            let last = position + 1 == nonempty.len();
            let end = starts[j] + runs[j];
            match (position, last) {
                (0, true) => {
                    w.line(copy);
                }
                (0, false) => {
                    w.open(format!("if (along < {})", lit(end)));
                    w.line(copy);
                }
                (_, false) => {
                    w.reopen(format!("else if (along < {})", lit(end)));
                    w.line(copy);
                }
                (_, true) => {
                    w.reopen("else");
                    w.line(copy);
                    w.close();
                }
            }
        }
        w.close();
        w.close();
        if numel > 0 {
            let grid = grid_for(numel / vec, block, unit.target.resident_blocks(block));
            launches.push(Launch {
                entry: name.clone(),
                grid: [grid, 1, 1],
                block: [block, 1, 1],
                shared_bytes: 0,
                params,
            });
        }
    } else {
        if kernel.inputs.len() > 65_535 {
            return Err(unsupported(&name, format!("a concat of {} inputs", kernel.inputs.len())));
        }
        // Per input: where its run starts in an output row, and its run length.
        let mut layout = Vec::with_capacity(runs.len() * 16);
        for (start, run) in starts.iter().zip(&runs) {
            layout.extend_from_slice(&(*start as u64).to_le_bytes());
            layout.extend_from_slice(&(*run as u64).to_le_bytes());
        }
        tables.push(TableSpec::InputPointers);
        tables.push(TableSpec::Static(layout));
        let declared = [
            format!("{storage}* __restrict__ out0"),
            format!("const {storage}* const* __restrict__ input_ptrs"),
            "const unsigned long long* __restrict__ layout".to_string(),
        ];
        w.line("// blockIdx.y picks the input; its blocks copy it in a grid-stride loop");
        w.open(format!("extern \"C\" __global__ void __launch_bounds__({block}) {name}({})", declared.join(", ")));
        w.line(format!("constexpr idx_t ROW = {};  // output elements per index before the axis", lit(row)));
        w.line(format!("const {storage}* __restrict__ in = input_ptrs[blockIdx.y];"));
        w.line("const idx_t start = (idx_t)layout[2u * blockIdx.y];");
        w.line("const idx_t run = (idx_t)layout[2u * blockIdx.y + 1u];");
        w.line(format!("const idx_t count = {} * run;", lit(outer)));
        w.open(format!(
            "for (idx_t j = ((idx_t)blockIdx.x * {b} + threadIdx.x) * {v}; j < count; j += (idx_t)gridDim.x * {b} * {v})",
            b = lit(block as usize),
            v = lit(vec)
        ));
        let destination = if outer > 1 { "out0[(j / run) * ROW + start + j % run]" } else { "out0[start + j]" };
        w.line(copy_line(destination, "in[j]", vec, element_bytes));
        w.close();
        w.close();
        let longest = outer * runs.iter().copied().max().unwrap_or(0);
        if numel > 0 {
            let grid_x = grid_for(longest / vec, block, MAX_BLOCKS_PER_INPUT);
            launches.push(Launch {
                entry: name.clone(),
                grid: [grid_x, kernel.inputs.len() as u32, 1],
                block: [block, 1, 1],
                shared_bytes: 0,
                params: vec![Param::Output(0), Param::Table(0), Param::Table(1)],
            });
        }
    }
    Ok(Emitted {
        summary: format!(
            "concat of {} inputs along axis {} into {} ({numel} elements)",
            kernel.inputs.len(),
            concat.axis,
            concat.shape
        ),
        notes,
        width: Some(width),
        code: w.finish(),
        launches,
        scratch: Vec::new(),
        tables,
    })
}
