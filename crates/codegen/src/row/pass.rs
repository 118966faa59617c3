//! One pass over a thread's columns of the row: element values, accumulation, element stores.

use super::{reduce_info, ElementLoad, Layout, LoadInfo, RowAnalysis};
use crate::body::{declare, emit_values, value_name};
use crate::cuda::{cast, value_type, Helpers};
use crate::error::Result;
use crate::index::{offset_expr, IndexWidth};
use crate::reduce::{accumulate, accumulator_dtype, butterfly, combine, declare_accumulator, finalize};
use crate::vector::{
    emit_vector_load, emit_vector_prefetch, emit_vector_store, emit_vector_unpack, load_rhs, raw_accesses,
};
use crate::writer::CodeWriter;
use braze_ir::{DType, ReduceOp};
use braze_plan::{Body, Expr};

/// What every pass of one row kernel reads.
pub(super) struct PassContext<'a> {
    pub(super) kernel: &'a str,
    pub(super) body: &'a Body,
    pub(super) analysis: &'a RowAnalysis,
    pub(super) loads: &'a [Option<LoadInfo>],
    pub(super) layout: &'a Layout,
    pub(super) input_dtypes: &'a [DType],
    pub(super) output_dtypes: &'a [DType],
    /// Values the last pass folds into the block's partial accumulators (`pacc{k}`).
    pub(super) partials: &'a [braze_plan::ColumnPartial],
    /// Element loads pass 1 issues as raw vectors (`v{id}_p`) for the later pass that reads them.
    pub(super) prefetched: &'a [bool],
    pub(super) width: IndexWidth,
}

impl PassContext<'_> {
    /// Pass `round` of the reductions: accumulates the reductions `reduced` over the row, combines
    /// the row's threads (the lanes by butterfly, the warps through shared memory), and finalizes
    /// them into per-row values. `mask` is the shuffle mask of the row's lanes.
    pub(super) fn emit_reduction_round(
        &self,
        w: &mut CodeWriter,
        helpers: &mut Helpers,
        round: usize,
        reduced: &[usize],
        mask: &str,
    ) -> Result<()> {
        let (body, analysis, layout) = (self.body, self.analysis, self.layout);
        let list: Vec<String> = reduced.iter().map(|id| format!("v{id}")).collect();
        w.line(format!(
            "// pass {round} of {}: reduce {}",
            analysis.rounds + analysis.has_element_stores as usize,
            list.join(", ")
        ));
        let accumulators: Vec<(String, ReduceOp, DType)> = reduced
            .iter()
            .map(|&id| {
                let (op, operand, acc) = reduce_info(body, id);
                w.line(declare_accumulator(op, operand, acc, &format!("acc_v{id}")));
                (format!("acc_v{id}"), op, acc)
            })
            .collect();
        self.emit_pass(w, helpers, round, reduced)?;
        let tpr = layout.threads_per_row;
        if tpr > 1 {
            let how = if layout.warps_per_row > 1 {
                format!("butterfly within each warp, then the {} warp partials in warp order", layout.warps_per_row)
            } else {
                format!("butterfly over the row's {tpr} lanes")
            };
            w.line(format!("// combine across the row's threads: {how}"));
            butterfly(w, helpers, &accumulators, (tpr as u32).min(32), mask);
        }
        if layout.warps_per_row > 1 {
            w.open("if (lane == 0u)");
            for &id in reduced {
                w.line(format!("{} = acc_v{id};", layout.warp_partial(&format!("red_v{id}"), "warp")));
            }
            w.close();
            w.line(layout.row_barrier());
            for (&id, (name, op, acc)) in reduced.iter().zip(&accumulators) {
                let array = format!("red_v{id}");
                w.line(format!("{name} = {};", layout.warp_partial(&array, "0")));
                w.line("#pragma unroll");
                w.open(format!("for (unsigned w = 1u; w < {}u; ++w)", layout.warps_per_row));
                w.line(format!("{name} = {};", combine(helpers, *op, *acc, name, &layout.warp_partial(&array, "w"))));
                w.close();
            }
        }
        for (&id, (name, op, acc)) in reduced.iter().zip(&accumulators) {
            let value = finalize(helpers, *op, *acc, name, "COLS", body.values[id].dtype);
            w.line(declare(body, id, &value));
        }
        Ok(())
    }

    /// One pass over the thread's columns of the row: evaluates the element values pass `pass`
    /// needs, accumulates the reductions `reduced`, and in the final pass stores element outputs.
    pub(super) fn emit_pass(
        &self,
        w: &mut CodeWriter,
        helpers: &mut Helpers,
        pass: usize,
        reduced: &[usize],
    ) -> Result<()> {
        let (body, analysis, layout, width) = (self.body, self.analysis, self.layout, self.width);
        if layout.chunks == 0 {
            // An empty row: accumulators keep their identities.
            return Ok(());
        }
        let lit = |n: usize| width.lit(n);
        let vec = layout.vec;
        let final_pass = pass == analysis.rounds + 1;
        let values: Vec<usize> = (0..body.values.len())
            .filter(|&id| analysis.live[id] && !analysis.per_row[id] && analysis.needed[id].contains(&pass))
            .collect();
        let first_pass_of = |id: usize| analysis.needed[id][0];
        // Cached values first computed in this pass get their arrays now, at row scope.
        for &id in &values {
            if analysis.cached[id] && first_pass_of(id) == pass {
                w.line(format!("{} v{id}_c[{}];", value_type(body.values[id].dtype), layout.chunks * vec));
            }
        }
        let fresh = |id: usize| !(analysis.cached[id] && first_pass_of(id) != pass);
        // Pass 1 issues the prefetched loads; their raw vectors live at row scope.
        let prefetches: Vec<usize> =
            if pass == 1 { (0..body.values.len()).filter(|&id| self.prefetched[id]).collect() } else { Vec::new() };
        for &id in &prefetches {
            let info = self.loads[id].as_ref().expect("prefetched values are loads");
            let (accesses, raw, _) = raw_accesses(self.input_dtypes[info.slot], vec);
            w.line(format!(
                "{raw} v{id}_p[{}];  // loaded now, widened in pass {}",
                layout.chunks * accesses,
                analysis.needed[id][0]
            ));
        }
        // Whether the pass touches memory (else it runs from registers and needs no column).
        let touches_memory =
            final_pass || !prefetches.is_empty() || values.iter().any(|&id| fresh(id) && self.loads[id].is_some());
        let tpr = layout.threads_per_row;
        // The partials' accumulators are indexed by the chunk: the last pass of a kernel with
        // partials walks the chunks as cached rows do.
        let chunked = layout.cached || (final_pass && !self.partials.is_empty());
        if chunked {
            w.line("#pragma unroll");
            w.open(format!("for (unsigned c = 0u; c < {}u; ++c)", layout.chunks));
            if touches_memory || layout.partial {
                let chunk_start = if tpr > 1 { format!("(c * {tpr}u + t)") } else { "c".to_string() };
                w.line(format!("const idx_t col0 = (idx_t){chunk_start} * {};", lit(vec)));
            }
            if layout.partial {
                w.open("if (col0 < COLS)");
            }
        } else {
            let start = if tpr > 1 { format!("(idx_t)t * {}", lit(vec)) } else { lit(0) };
            w.line("#pragma unroll 4");
            w.open(format!("for (idx_t col0 = {start}; col0 < COLS; col0 += {})", lit(tpr * vec)));
        }
        let slot = if vec == 1 { "c".to_string() } else { format!("c * {vec}u + u") };
        let slot_base = if vec == 1 { "c".to_string() } else { format!("c * {vec}u") };
        // Loads this pass computes: vector ones before the element loop, into the cache array
        // when the value is cached.
        let mut gathers = false;
        for &id in &values {
            let Some(info) = self.loads[id].as_ref() else { continue };
            if !fresh(id) {
                continue;
            }
            let dtype = self.input_dtypes[info.slot];
            let col_offset = offset_expr(0, &info.inner, "col0", width);
            let offset = match &info.row_var {
                Some(var) => format!("{var} + {col_offset}"),
                None => col_offset,
            };
            match info.kind {
                ElementLoad::Vector => {
                    let pointer = format!("in{}", info.slot);
                    if self.prefetched[id] {
                        let (accesses, _, _) = raw_accesses(dtype, vec);
                        w.line(format!("{} v{id}_l[{vec}];", value_type(dtype)));
                        let base = raw_chunk_base(accesses);
                        emit_vector_unpack(w, helpers, dtype, &format!("v{id}_p"), &base, &format!("v{id}_l"), vec);
                    } else if analysis.cached[id] && dtype == body.values[id].dtype {
                        emit_vector_load(
                            w,
                            helpers,
                            dtype,
                            &pointer,
                            &offset,
                            &format!("v{id}_c"),
                            &slot_base,
                            vec,
                            width,
                        );
                    } else {
                        w.line(format!("{} v{id}_l[{vec}];", value_type(dtype)));
                        emit_vector_load(w, helpers, dtype, &pointer, &offset, &format!("v{id}_l"), "", vec, width);
                    }
                }
                ElementLoad::Uniform => {
                    let rhs = load_rhs(helpers, dtype, body.values[id].dtype, &format!("in{}[{offset}]", info.slot));
                    w.line(format!("const {} v{id}_u = {rhs};", value_type(body.values[id].dtype)));
                }
                ElementLoad::Gather => gathers = true,
            }
        }
        for &id in &prefetches {
            let info = self.loads[id].as_ref().expect("prefetched values are loads");
            let dtype = self.input_dtypes[info.slot];
            let (accesses, _, _) = raw_accesses(dtype, vec);
            let row_var = info.row_var.as_ref().expect("prefetched loads are streamed");
            let offset = format!("{row_var} + {}", offset_expr(0, &info.inner, "col0", width));
            let base = raw_chunk_base(accesses);
            emit_vector_prefetch(
                w,
                dtype,
                &format!("in{}", info.slot),
                &offset,
                &format!("v{id}_p"),
                &base,
                vec,
                width,
            );
        }
        let stores: Vec<_> =
            if final_pass { body.stores.iter().filter(|s| !analysis.per_row[s.value.0]).collect() } else { Vec::new() };
        let mut stored_slots: Vec<usize> = stores.iter().map(|s| s.output).collect();
        stored_slots.sort();
        stored_slots.dedup();
        for &out in &stored_slots {
            w.line(format!("{} st{out}[{vec}];", value_type(self.output_dtypes[out])));
        }
        w.line("#pragma unroll");
        w.open(format!("for (unsigned u = 0u; u < {vec}u; ++u)"));
        if gathers {
            w.line("const idx_t col = col0 + u;");
        }
        let mut names: Vec<String> = (0..body.values.len()).map(value_name).collect();
        let slot_ref = slot.clone();
        emit_values(w, self.kernel, helpers, body, values.iter().copied(), &mut names, |id, helpers| {
            if !fresh(id) {
                return Some(format!("v{id}_c[{slot_ref}]"));
            }
            let info = self.loads[id].as_ref()?;
            let dtype = self.input_dtypes[info.slot];
            let value_dtype = body.values[id].dtype;
            Some(match info.kind {
                ElementLoad::Vector if analysis.cached[id] && dtype == value_dtype => format!("v{id}_c[{slot_ref}]"),
                ElementLoad::Vector => cast(helpers, dtype, value_dtype, &format!("v{id}_l[u]")),
                ElementLoad::Uniform => format!("v{id}_u"),
                ElementLoad::Gather => {
                    let col_offset = offset_expr(0, &info.inner, "col", width);
                    let offset = match &info.row_var {
                        Some(var) => format!("{var} + {col_offset}"),
                        None => col_offset,
                    };
                    load_rhs(helpers, dtype, value_dtype, &format!("in{}[{offset}]", info.slot))
                }
            })
        })?;
        for &id in &values {
            let loaded_in_place = matches!(self.loads[id].as_ref().map(|l| &l.kind), Some(ElementLoad::Vector))
                && self.input_dtypes[self.loads[id].as_ref().unwrap().slot] == body.values[id].dtype;
            if analysis.cached[id] && first_pass_of(id) == pass && !loaded_in_place {
                w.line(format!("v{id}_c[{slot}] = v{id};"));
            }
        }
        for &id in reduced {
            let Expr::Reduce { op, x } = body.values[id].expr else { unreachable!() };
            let acc = accumulator_dtype(op, body.values[x.0].dtype);
            w.line(accumulate(helpers, op, acc, &format!("acc_v{id}"), &names[x.0], body.values[x.0].dtype));
        }
        for store in &stores {
            let value = cast(
                helpers,
                body.values[store.value.0].dtype,
                self.output_dtypes[store.output],
                &names[store.value.0],
            );
            w.line(format!("st{}[u] = {value};", store.output));
        }
        if final_pass {
            for (k, p) in self.partials.iter().enumerate() {
                let dtype = body.values[p.value.0].dtype;
                w.line(accumulate(helpers, p.op, DType::F32, &format!("pacc{k}[{slot}]"), &names[p.value.0], dtype));
            }
        }
        w.close();
        for &out in &stored_slots {
            emit_vector_store(
                w,
                helpers,
                self.output_dtypes[out],
                &format!("out{out}"),
                "row * COLS + col0",
                &format!("st{out}"),
                vec,
                width,
            );
        }
        if chunked && layout.partial {
            w.close();
        }
        w.close();
        Ok(())
    }
}

/// The first of chunk `c`'s entries in a prefetched value's raw array (`accesses` a chunk).
fn raw_chunk_base(accesses: usize) -> String {
    if accesses == 1 {
        "c".to_string()
    } else {
        format!("c * {accesses}u")
    }
}
