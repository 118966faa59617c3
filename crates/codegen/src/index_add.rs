//! Index-add kernels (an index_select's gradient): one thread per `(outer, inner)` column of the
//! output, which zeroes its column and then adds the source slices to it in the order of the
//! indices. Each output element is written by one thread in one order, so the sums have the
//! same bits on every run (no atomics).

use crate::cuda::{cast, narrow, storage_type, value_type};
use crate::error::{invalid_config, malformed, Result};
use crate::index::IndexWidth;
use crate::vector::load_rhs;
use crate::writer::CodeWriter;
use crate::{grid_for, Emitted, Launch, Unit};
use braze_ir::DType;
use braze_plan::IndexAdd;

pub(crate) fn generate(unit: &mut Unit<'_>, ia: &IndexAdd, block: u32) -> Result<Emitted> {
    let name = unit.name().to_string();
    if !(32..=1024).contains(&block) || !block.is_multiple_of(32) {
        return Err(invalid_config(&name, format!("block {block} is not a multiple of 32 in 32..=1024")));
    }
    if unit.kernel.inputs.len() != 2 || unit.kernel.outputs.len() != 1 {
        return Err(malformed(&name, "an index_add reads src and indices and writes one output"));
    }
    let (dtype, index) = (ia.dtype, ia.index_dtype);
    let columns = ia.outer * ia.inner;
    let largest = (ia.outer * ia.size * ia.inner).max(ia.outer * ia.indices * ia.inner).max(unit.largest_buffer());
    let width = IndexWidth::for_largest(largest);
    let lit = |n: usize| width.lit(n);
    let (declared, params) = unit.buffer_params();
    let value = value_type(dtype);
    let mut w = CodeWriter::new();
    // `, 1`: few blocks per SM are enough for a loop bound by its loads, and ptxas otherwise
    // holds the kernel to 32 registers and spills.
    w.open(format!("extern \"C\" __global__ void __launch_bounds__({block}, 1) {name}({})", declared.join(", ")));
    if columns == 0 || ia.size == 0 {
        w.line("// no output elements: nothing to do");
        w.close();
    } else {
        w.line(format!("constexpr idx_t COLUMNS = {};", lit(columns)));
        w.line(format!("constexpr idx_t INNER = {};", lit(ia.inner)));
        w.line(format!("constexpr idx_t SIZE = {};", lit(ia.size)));
        w.line(format!("constexpr idx_t INDICES = {};", lit(ia.indices)));
        w.open(format!(
            "for (idx_t column = (idx_t)blockIdx.x * {b} + threadIdx.x; column < COLUMNS; column += (idx_t)gridDim.x * {b})",
            b = lit(block as usize)
        ));
        w.line("const idx_t outer = column / INNER;");
        w.line("const idx_t inner = column % INNER;");
        w.line(format!("{}* __restrict__ into = out0 + outer * SIZE * INNER + inner;", storage_type(dtype)));
        w.line(format!("const {}* __restrict__ from = in0 + outer * INDICES * INNER + inner;", storage_type(dtype)));
        w.line(format!(
            "for (idx_t row = 0; row < SIZE; ++row) into[row * INNER] = {};",
            narrow(dtype, &format!("({value})0"))
        ));
        w.line("// in the order of the indices: the same sum on every run");
        w.open("for (idx_t j = 0; j < INDICES; ++j)");
        w.line(format!("const long long at = (long long){};", load_rhs(&mut unit.helpers, index, index, "in1[j]")));
        w.line("if (at < 0 || at >= (long long)SIZE) continue;  // reported by the forward's check");
        let old = load_rhs(&mut unit.helpers, dtype, dtype, "into[(idx_t)at * INNER]");
        let add = load_rhs(&mut unit.helpers, dtype, dtype, "from[j * INNER]");
        let sum = match dtype {
            DType::I32 | DType::I64 => format!("({value})((unsigned long long){old} + (unsigned long long){add})"),
            _ => cast(&mut unit.helpers, DType::F32, dtype, &format!("({old} + {add})")),
        };
        w.line(format!("into[(idx_t)at * INNER] = {};", narrow(dtype, &sum)));
        w.close();
        w.close();
        w.close();
    }
    let mut launches = Vec::new();
    if columns > 0 && ia.size > 0 {
        let grid = grid_for(columns, block, unit.target.resident_blocks(block));
        launches.push(Launch {
            entry: name.clone(),
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_bytes: 0,
            params,
        });
    }
    Ok(Emitted {
        summary: format!(
            "index_add of {} slices into {} rows ({} columns of {dtype}, {index} indices)",
            ia.indices, ia.size, columns
        ),
        notes: vec!["one thread per output column, slices added in index order (no atomics)".into()],
        width: Some(width),
        code: w.finish(),
        launches,
        scratch: Vec::new(),
        tables: Vec::new(),
    })
}
