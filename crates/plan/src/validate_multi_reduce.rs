//! The validation rules of the multi-reduce kernel family: K independent full reductions in one
//! launch, each item with its reduction's prologue over one or more leaves of its length, and the
//! scalar epilogue over their results.

use crate::error::Rule;
use crate::plan::{Expr, ItemReduction, Kernel, MultiReduce, Plan};
use crate::validate::{broken, validate_value_types, KernelResult};
use braze_ir::infer::infer;
use braze_ir::{Op, Shape};

impl Plan {
    pub(crate) fn validate_multi_reduce(&self, kernel: &Kernel, mr: &MultiReduce) -> KernelResult {
        let fail = |detail: String| Err(broken(Rule::MultiReduce, detail));
        for (r, reduction) in mr.reductions.iter().enumerate() {
            validate_item_reduction(r, reduction)?;
        }
        let Some((firsts, slots)) = mr.first_inputs() else {
            let bad = mr.items.iter().position(|it| it.reduction >= mr.reductions.len()).unwrap_or(0);
            return fail(format!("item {bad} runs reduction {} of {}", mr.items[bad].reduction, mr.reductions.len()));
        };
        if slots != kernel.inputs.len() {
            return fail(format!(
                "{} items read {slots} leaves but the kernel has {} inputs",
                mr.items.len(),
                kernel.inputs.len()
            ));
        }
        for (i, item) in mr.items.iter().enumerate() {
            let reduction = &mr.reductions[item.reduction];
            for slot in firsts[i]..firsts[i] + reduction.leaves {
                let buffer = self.buffer(kernel.inputs[slot]);
                if buffer.numel != item.len || buffer.dtype != reduction.dtype {
                    return fail(format!(
                        "item {i}: {} {} elements, but its buffer in{slot} holds {} {}",
                        item.len, reduction.dtype, buffer.numel, buffer.dtype
                    ));
                }
            }
        }
        self.validate_epilogue(kernel, mr)
    }

    fn validate_epilogue(&self, kernel: &Kernel, mr: &MultiReduce) -> KernelResult {
        let fail = |detail: String| Err(broken(Rule::MultiReduce, format!("epilogue: {detail}")));
        let epilogue = &mr.epilogue;
        if !epilogue.stores.is_empty() {
            return fail("stores through the body; element stores go in `stores`".into());
        }
        for (i, value) in epilogue.values.iter().enumerate() {
            if let Expr::Load { input, offset, strides } = &value.expr {
                if *input >= mr.items.len() || *offset != 0 || !strides.is_empty() {
                    return fail(format!("v{i}: a load other than an item's result"));
                }
                if value.dtype != mr.result_dtype(*input) {
                    return fail(format!(
                        "v{i}: reads item {input}'s {} result as {}",
                        mr.result_dtype(*input),
                        value.dtype
                    ));
                }
            }
        }
        validate_value_types(epilogue, false)?;
        let computes = mr
            .stores
            .iter()
            .any(|s| epilogue.values.get(s.value.0).is_some_and(|v| !matches!(v.expr, Expr::Load { .. })));
        if computes && mr.items.is_empty() {
            return fail("computes a value but no item finishes to run it".into());
        }
        let mut written: Vec<Vec<bool>> = kernel.outputs.iter().map(|&b| vec![false; self.buffer(b).numel]).collect();
        for s in &mr.stores {
            let Some(value) = epilogue.values.get(s.value.0) else {
                return fail(format!("stores {}, which is not a value", s.value));
            };
            let Some(out) = written.get_mut(s.output) else {
                return fail(format!("stores to output slot {} of {}", s.output, kernel.outputs.len()));
            };
            let buffer = self.buffer(kernel.outputs[s.output]);
            if buffer.dtype != value.dtype {
                return fail(format!("stores {} {} into out{} of {}", value.dtype, s.value, s.output, buffer.dtype));
            }
            match out.get_mut(s.index) {
                None => return fail(format!("stores out{}[{}] of {} elements", s.output, s.index, buffer.numel)),
                Some(done) if *done => return fail(format!("stores out{}[{}] twice", s.output, s.index)),
                Some(done) => *done = true,
            }
        }
        for (slot, out) in written.iter().enumerate() {
            if let Some(index) = out.iter().position(|&w| !w) {
                return fail(format!("out{slot}[{index}] is never stored"));
            }
        }
        Ok(())
    }
}

fn validate_item_reduction(r: usize, red: &ItemReduction) -> KernelResult {
    let fail = |detail: String| Err(broken(Rule::MultiReduce, format!("reduction {r}: {detail}")));
    let prologue = &red.prologue;
    let Some(reduced) = prologue.values.last() else { return fail("the prologue has no values".into()) };
    if red.leaves == 0 {
        return fail("reads no leaf".into());
    }
    if !prologue.stores.is_empty() {
        return fail("the prologue stores".into());
    }
    for (i, value) in prologue.values.iter().enumerate() {
        if let Expr::Load { input, .. } = value.expr {
            if input >= red.leaves || value.expr != MultiReduce::leaf_load(input) {
                return fail(format!("v{i}: the prologue reads more than the current element of its leaves"));
            }
            if value.dtype != red.dtype {
                return fail(format!("v{i}: loads {} elements as {}", red.dtype, value.dtype));
            }
        }
    }
    validate_value_types(prologue, false)?;
    let result =
        infer(&Op::Reduce { op: red.op, axes: vec![], keepdim: false }, &[(reduced.dtype, &Shape::scalar())], None)
            .map_err(|e| broken(Rule::MultiReduce, e.to_string()))?;
    if result.0 != reduced.dtype {
        return fail(format!("reducing a {} value gives {}", reduced.dtype, result.0));
    }
    Ok(())
}
