//! The finishing step of a multi-reduce kernel: where each item's result goes when it is done,
//! and the epilogue that the step finishing the last item runs once over all K results.
//!
//! A stack of the results in item order (an output slot whose element `i` is item `i`'s result)
//! is written directly by whichever step finishes each item. Everything else the epilogue
//! computes: every item's result is parked in a scratch slot, a zeroed counter counts finished
//! items, and the one step that finishes the last item runs the epilogue (one thread, the values
//! in a fixed order, so results never vary between runs) and zeroes the counter again. The
//! epilogue is written once, at the end of the kernel, behind a flag that thread raises: no call,
//! no stack frame.

use crate::body::{emit_values, value_name};
use crate::cuda::{narrow, storage_type, value_type, Helpers};
use crate::error::{malformed, Result};
use crate::writer::CodeWriter;
use braze_ir::DType;
use braze_plan::{ElementStore, Expr, MultiReduce};

/// How a kernel's item results leave it.
pub(crate) struct Finish {
    /// The output slot that stacks the results in item order, written as items finish.
    pub(crate) stack: Option<usize>,
    /// The stores left to the epilogue (empty: no epilogue, no scratch).
    pub(crate) epilogue_stores: Vec<ElementStore>,
    /// The output slot count and each slot's dtype.
    pub(crate) outputs: Vec<DType>,
}

impl Finish {
    pub(crate) fn plan(multi: &MultiReduce, outputs: Vec<DType>, output_numels: &[usize]) -> Finish {
        let k = multi.items.len();
        let is_result = |s: &ElementStore| {
            multi.epilogue.values.get(s.value.0).is_some_and(|v| v.expr == MultiReduce::result_load(s.index))
        };
        let stack = (0..outputs.len()).find(|&slot| {
            let stores: Vec<&ElementStore> = multi.stores.iter().filter(|s| s.output == slot).collect();
            k > 0 && output_numels[slot] == k && stores.len() == k && stores.iter().all(|s| is_result(s))
        });
        let epilogue_stores = multi.stores.iter().filter(|s| Some(s.output) != stack).copied().collect();
        Finish { stack, epilogue_stores, outputs }
    }

    pub(crate) fn has_epilogue(&self) -> bool {
        !self.epilogue_stores.is_empty()
    }

    /// The output parameters, `T* __restrict__ outN`.
    pub(crate) fn output_params(&self, helpers: &mut Helpers) -> Vec<String> {
        self.outputs
            .iter()
            .enumerate()
            .map(|(slot, &dtype)| {
                helpers.need_storage(dtype);
                format!("{}* __restrict__ out{slot}", storage_type(dtype))
            })
            .collect()
    }

    /// Emits what happens to `result` (a C expression of `result_dtype`) of item `item` (a C
    /// expression) once it is known, in the one thread that holds it.
    pub(crate) fn emit_item_done(
        &self,
        w: &mut CodeWriter,
        items: usize,
        item: &str,
        result: &str,
        result_dtype: DType,
    ) {
        w.open("");
        w.line(format!("const {} result = {result};", value_type(result_dtype)));
        if let Some(slot) = self.stack {
            w.line(format!("out{slot}[{item}] = {};", narrow(self.outputs[slot], "result")));
        }
        if self.has_epilogue() {
            w.line(format!("*reinterpret_cast<{}*>(&results[{item}]) = result;", value_type(result_dtype)));
            w.line("__threadfence();  // publish the result before counting the item as finished");
            w.line(format!("if (atomicAdd(finished, 1u) == {}u) run_epilogue = true;", items - 1));
        }
        w.close();
    }

    /// The epilogue over the parked results, run by the thread that finished the last item.
    pub(crate) fn emit_epilogue(
        &self,
        w: &mut CodeWriter,
        helpers: &mut Helpers,
        kernel: &str,
        multi: &MultiReduce,
    ) -> Result<()> {
        let body = &multi.epilogue;
        w.line("// The thread that finished the last item runs the epilogue over every item's result.");
        w.open("if (run_epilogue)");
        w.line("__threadfence();");
        let roots = self.epilogue_stores.iter().map(|s| s.value);
        let live = crate::body::live_values(body, roots);
        let ids: Vec<usize> = (0..body.values.len()).filter(|&id| live[id]).collect();
        let mut names: Vec<String> = (0..body.values.len()).map(value_name).collect();
        let mut bad_load = None;
        emit_values(w, kernel, helpers, body, ids.iter().copied(), &mut names, |id, _| match body.values[id].expr {
            Expr::Load { input, .. } if input < multi.items.len() => Some(format!(
                "*reinterpret_cast<const volatile {}*>(&results[{input}])",
                value_type(body.values[id].dtype)
            )),
            Expr::Load { input, .. } => {
                bad_load = Some(input);
                Some("0".to_string())
            }
            _ => None,
        })?;
        if let Some(input) = bad_load {
            return Err(malformed(
                kernel,
                format!("the epilogue reads the result of item {input}, which does not exist"),
            ));
        }
        for s in &self.epilogue_stores {
            let dtype = self.outputs[s.output];
            w.line(format!("out{}[{}] = {};", s.output, s.index, narrow(dtype, &names[s.value.0])));
        }
        w.line("*finished = 0u;  // leave the scratch zeroed for the next run");
        w.close();
        Ok(())
    }
}
