//! The plan validator: checks every [`Rule`] of the contract between fusion and the backends.
//! Fusion runs it on every plan in debug builds and the CPU executor before it runs one, so a
//! fusion bug shows up as a message naming the kernel and the rule instead of a wrong answer.
//!
//! Checks run in an order that lets later ones index safely: buffer ids before buffer lookups,
//! operand order and load strides before per-row analysis, value ids before store sizes.

use crate::error::{PlanError, Result, Rule};
use crate::plan::{
    AttentionBackward, Body, BufferId, BufferRole, Expr, Kernel, KernelKind, MultiPointwise, Plan, RowPart, ValueId,
};
use braze_ir::infer::infer;
use braze_ir::{DType, Op, Shape};
use std::collections::{HashMap, HashSet};

/// A rule broken inside one kernel, before the kernel is named.
pub(crate) struct Broken {
    rule: Rule,
    detail: String,
}

impl Broken {
    /// The same rule, the detail prefixed with where inside the kernel (`member 2`).
    fn within(self, at: &str) -> Broken {
        Broken { rule: self.rule, detail: format!("{at}: {}", self.detail) }
    }
}

pub(crate) type KernelResult = std::result::Result<(), Broken>;

pub(crate) fn broken(rule: Rule, detail: impl Into<String>) -> Broken {
    Broken { rule, detail: detail.into() }
}

fn invalid(rule: Rule, at: impl Into<String>, detail: impl Into<String>) -> PlanError {
    PlanError::Invalid { rule, at: at.into(), detail: detail.into() }
}

impl Plan {
    /// Checks every [`Rule`]; the error names the first rule broken and where.
    pub fn validate(&self) -> Result<()> {
        self.validate_inputs()?;
        let mut written: Vec<bool> = self.buffers.iter().map(|b| matches!(b.role, BufferRole::Input(_))).collect();
        let mut names = HashSet::new();
        // The parts written so far of buffers that several kernels (or slots) write side by side.
        let mut parts: HashMap<usize, Vec<RowPart>> = HashMap::new();
        for (k, kernel) in self.kernels.iter().enumerate() {
            let at = || format!("kernel {k} ({})", kernel.name);
            if !is_c_identifier(&kernel.name) {
                return Err(invalid(Rule::KernelNames, at(), "the name is not a C identifier"));
            }
            if !names.insert(kernel.name.as_str()) {
                return Err(invalid(Rule::KernelNames, at(), "an earlier kernel has the same name"));
            }
            for (role, ids) in [("input", &kernel.inputs), ("output", &kernel.outputs)] {
                if let Some((slot, id)) = ids.iter().enumerate().find(|(_, id)| id.0 >= self.buffers.len()) {
                    return Err(invalid(
                        Rule::BufferIds,
                        at(),
                        format!("{role} slot {slot} names {id}, which does not exist"),
                    ));
                }
            }
            if let Some(b) = kernel.inputs.iter().find(|b| !written[b.0]) {
                return Err(invalid(Rule::ReadBeforeWrite, at(), format!("reads {b} before any kernel writes it")));
            }
            for (slot, &b) in kernel.outputs.iter().enumerate() {
                if matches!(self.buffer(b).role, BufferRole::Input(_)) {
                    return Err(invalid(Rule::SingleWriter, at(), format!("writes {b}, a graph input")));
                }
                if written[b.0] {
                    return Err(invalid(Rule::SingleWriter, at(), format!("writes {b}, which is already written")));
                }
                let Some(part) = self.output_part(kernel, slot) else {
                    if parts.contains_key(&b.0) {
                        return Err(invalid(
                            Rule::SingleWriter,
                            at(),
                            format!("writes all of {b}, part of which is written"),
                        ));
                    }
                    written[b.0] = true;
                    continue;
                };
                let done = parts.entry(b.0).or_default();
                let same_rows = done.iter().all(|o| o.rows == part.rows && o.row_stride == part.row_stride);
                let overlaps = done.iter().any(|o| o.first < part.first + part.width && part.first < o.first + o.width);
                let columns = format!("columns {}..{} of {b}", part.first, part.first + part.width);
                if !same_rows {
                    return Err(invalid(
                        Rule::SingleWriter,
                        at(),
                        format!("writes {columns} in rows unlike its other parts'"),
                    ));
                }
                if overlaps {
                    return Err(invalid(Rule::SingleWriter, at(), format!("writes {columns} over another part")));
                }
                done.push(part);
                written[b.0] = done.iter().map(|p| p.width).sum::<usize>() == part.row_stride;
            }
            self.validate_kernel(kernel).map_err(|e| invalid(e.rule, at(), e.detail))?;
        }
        if let Some(b) = parts.keys().copied().filter(|&b| !written[b]).min() {
            return Err(invalid(Rule::SingleWriter, format!("b{b}"), "is only partly written"));
        }
        self.validate_in_place()?;
        for (j, out) in self.outputs.iter().enumerate() {
            let at = format!("output {j}");
            let Some(buffer) = self.buffers.get(out.buffer.0) else {
                return Err(invalid(Rule::BufferIds, at, format!("{} does not exist", out.buffer)));
            };
            if !written[out.buffer.0] {
                return Err(invalid(Rule::Outputs, at, format!("reads {}, which nothing wrote", out.buffer)));
            }
            if buffer.numel != out.shape.numel() {
                return Err(invalid(
                    Rule::Outputs,
                    at,
                    format!(
                        "{} holds {} elements, not the {} of {}",
                        out.buffer,
                        buffer.numel,
                        out.shape.numel(),
                        out.shape
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_inputs(&self) -> Result<()> {
        for (i, b) in self.inputs.iter().enumerate() {
            let Some(buffer) = self.buffers.get(b.0) else {
                return Err(invalid(Rule::BufferIds, "plan", format!("inputs[{i}] = {b} does not exist")));
            };
            if buffer.role != BufferRole::Input(i) {
                return Err(invalid(
                    Rule::InputRoles,
                    "plan",
                    format!("inputs[{i}] = {b} is not the buffer of input #{i}"),
                ));
            }
        }
        for (id, buffer) in self.buffers.iter().enumerate() {
            if let BufferRole::Input(i) = buffer.role {
                if self.inputs.get(i) != Some(&BufferId(id)) {
                    return Err(invalid(Rule::InputRoles, "plan", format!("b{id} is input #{i} but not inputs[{i}]")));
                }
            }
        }
        Ok(())
    }

    /// [`Rule::InPlace`]; kernels' buffer ids are known to exist.
    fn validate_in_place(&self) -> Result<()> {
        let mut taken = vec![false; self.inputs.len()];
        for (id, buffer) in self.buffers.iter().enumerate() {
            let BufferRole::InPlace(n) = buffer.role else { continue };
            self.validate_in_place_buffer(id)?;
            if std::mem::replace(&mut taken[n], true) {
                return Err(invalid(
                    Rule::InPlace,
                    format!("b{id}"),
                    format!("a second buffer in place of input #{n}"),
                ));
            }
        }
        Ok(())
    }

    /// [`Rule::InPlace`] for buffer `b` alone, in a plan that was valid before `b` was placed (or
    /// before a last kernel copying into `b` was added): what fusion asks of each write-back
    /// without checking the whole plan again.
    pub fn validate_in_place_of(&self, b: BufferId) -> Result<()> {
        if self.kernels.iter().any(|k| k.inputs.iter().chain(&k.outputs).any(|id| id.0 >= self.buffers.len())) {
            return Err(invalid(Rule::BufferIds, "plan", "a kernel names a buffer that does not exist"));
        }
        let Some(buffer) = self.buffers.get(b.0) else {
            return Err(invalid(Rule::BufferIds, "plan", format!("{b} does not exist")));
        };
        let BufferRole::InPlace(n) = buffer.role else {
            return Err(invalid(Rule::InPlace, format!("{b}"), "is not placed in an input's memory"));
        };
        self.validate_in_place_buffer(b.0)?;
        if self.buffers.iter().enumerate().any(|(id, other)| id != b.0 && other.role == BufferRole::InPlace(n)) {
            return Err(invalid(Rule::InPlace, format!("{b}"), format!("a second buffer in place of input #{n}")));
        }
        Ok(())
    }

    /// [`Rule::InPlace`] for buffer `id`, an `InPlace` one, except that no other buffer takes the
    /// same input.
    fn validate_in_place_buffer(&self, id: usize) -> Result<()> {
        let buffer = &self.buffers[id];
        let BufferRole::InPlace(n) = buffer.role else { return Ok(()) };
        let at = format!("b{id}");
        let Some(&input) = self.inputs.get(n) else {
            return Err(invalid(Rule::InPlace, at, format!("in place of input #{n}, which does not exist")));
        };
        let source = self.buffer(input);
        if source.dtype != buffer.dtype || source.numel != buffer.numel {
            return Err(invalid(
                Rule::InPlace,
                at,
                format!(
                    "{} x{} in place of input #{n}, a {} x{}",
                    buffer.dtype, buffer.numel, source.dtype, source.numel
                ),
            ));
        }
        if self.outputs.iter().any(|o| o.buffer == input) {
            return Err(invalid(Rule::InPlace, at, format!("input #{n} is also a plan output")));
        }
        let Some(w) = self.kernels.iter().position(|k| k.outputs.contains(&BufferId(id))) else { return Ok(()) };
        let writer = &self.kernels[w];
        let output_slot = writer.outputs.iter().position(|&b| b == BufferId(id)).unwrap_or(0);
        for (slot, _) in writer.inputs.iter().enumerate().filter(|(_, &b)| b == input) {
            if !writer.reads_only_stored_element(slot, output_slot) {
                return Err(invalid(
                    Rule::InPlace,
                    format!("kernel {w} ({})", writer.name),
                    format!("writes {at} in place of input #{n} and reads that input at other elements"),
                ));
            }
        }
        if let Some((k, later)) = self.kernels.iter().enumerate().skip(w + 1).find(|(_, k)| k.inputs.contains(&input)) {
            return Err(invalid(
                Rule::InPlace,
                format!("kernel {k} ({})", later.name),
                format!("reads input #{n} after kernel {w} overwrote it with {at}"),
            ));
        }
        Ok(())
    }

    fn input_numel(&self, kernel: &Kernel, slot: usize) -> usize {
        self.buffer(kernel.inputs[slot]).numel
    }

    /// The checks of one kernel's family; buffer ids are known to exist.
    fn validate_kernel(&self, kernel: &Kernel) -> KernelResult {
        match &kernel.kind {
            KernelKind::Pointwise(pw) => {
                let numel = pw.shape.numel();
                self.validate_body(&kernel.inputs, &pw.body, pw.shape.dims(), false, |_| numel > 0)?;
                self.validate_stores(kernel, &pw.body, &[], |_| numel)
            }
            KernelKind::Row(row) => {
                let domain = row.domain();
                let (rows, cols) = (row.rows(), row.cols());
                validate_value_order(&row.body)?;
                validate_load_ranks(&row.body, domain.rank())?;
                let per_row = row.body.row_values(row.outer.len());
                self.validate_body(&kernel.inputs, &row.body, domain.dims(), true, |i| {
                    rows > 0 && (per_row[i] || cols > 0)
                })?;
                let filled = self.validate_partials(kernel, row)?;
                self.validate_stores(kernel, &row.body, &filled, |v| if per_row[v.0] { rows } else { rows * cols })
            }
            KernelKind::Column(col) => self.validate_column(kernel, col),
            KernelKind::MultiReduce(mr) => self.validate_multi_reduce(kernel, mr),
            KernelKind::MatMul(mm) => self.validate_matmul(kernel, mm),
            KernelKind::Concat(cat) => self.validate_concat(kernel, cat),
            KernelKind::MultiPointwise(multi) => self.validate_multi_pointwise(kernel, multi),
            KernelKind::Attention(att) => self.validate_attention(kernel, att),
            KernelKind::AttentionBackward(back) => self.validate_attention_backward(kernel, back),
            KernelKind::IndexAdd(ia) => self.validate_index_add(kernel, ia),
        }
    }

    /// Dtype and size of every buffer slot of an attention kernel, against `wanted`.
    fn check_slots(&self, rule: Rule, kind: &str, ids: &[BufferId], wanted: &[(&str, DType, usize)]) -> KernelResult {
        if ids.len() != wanted.len() {
            return Err(broken(rule, format!("has {} {kind} slots, expected {}", ids.len(), wanted.len())));
        }
        for (slot, (&id, &(what, dtype, numel))) in ids.iter().zip(wanted).enumerate() {
            let buffer = self.buffer(id);
            if buffer.dtype != dtype || buffer.numel != numel {
                return Err(broken(
                    rule,
                    format!(
                        "{kind} {slot} ({what}) is {id}: {} x {}, expected {numel} x {dtype}",
                        buffer.numel, buffer.dtype
                    ),
                ));
            }
        }
        Ok(())
    }

    fn check_attention_shape(rule: Rule, shape: &crate::plan::AttentionShape) -> KernelResult {
        if !shape.dtype.is_float() {
            return Err(broken(rule, format!("dtype {} is not a float", shape.dtype)));
        }
        if !(shape.scale.is_finite() && shape.scale > 0.0) {
            return Err(broken(rule, format!("scale {} is not finite and positive", shape.scale)));
        }
        let fits = shape.batch.checked_mul(shape.seq).and_then(|r| r.checked_mul(shape.head_dim)).is_some();
        if !fits {
            return Err(broken(rule, "batch x seq x head_dim overflows"));
        }
        if shape.heads == 0 || !shape.batch.is_multiple_of(shape.heads) {
            return Err(broken(rule, format!("heads {} do not divide the {} pairs", shape.heads, shape.batch)));
        }
        Ok(())
    }

    /// Slot `slot` of `ids` holds `what` of `dtype` placed by `layout`: every element the layout
    /// reaches inside the buffer, and for a result (`dense`) the buffer covered exactly once.
    #[allow(clippy::too_many_arguments)]
    fn check_operand(
        &self,
        rule: Rule,
        kind: &str,
        ids: &[BufferId],
        slot: usize,
        what: &str,
        s: &crate::plan::AttentionShape,
        layout: &crate::plan::OperandLayout,
        dense: bool,
    ) -> KernelResult {
        let id = ids[slot];
        let buffer = self.buffer(id);
        let reach = layout.extent(s);
        let fits = if dense {
            buffer.numel == s.operand_numel() && layout.covers_densely(s)
        } else {
            reach.is_some_and(|end| end <= buffer.numel)
        };
        if buffer.dtype != s.dtype || !fits {
            return Err(broken(
                rule,
                format!(
                    "{kind} {slot} ({what}) is {id}: {} x {}, which {layout:?} does not place a {} operand in{}",
                    buffer.numel,
                    buffer.dtype,
                    s.dtype,
                    if dense { " (a result's layout must cover its buffer once)" } else { "" }
                ),
            ));
        }
        Ok(())
    }

    fn validate_attention(&self, kernel: &Kernel, att: &crate::plan::Attention) -> KernelResult {
        use crate::plan::AttentionResult;
        let rule = Rule::Attention;
        let s = &att.shape;
        Self::check_attention_shape(rule, s)?;
        if kernel.inputs.len() != 3 {
            return Err(broken(rule, format!("has {} input slots, expected 3", kernel.inputs.len())));
        }
        for (slot, (what, layout)) in ["q", "k", "v"].iter().zip(&att.input_layouts).enumerate() {
            self.check_operand(rule, "input", &kernel.inputs, slot, what, s, layout, false)?;
        }
        let ordered = matches!(
            att.results.as_slice(),
            [AttentionResult::Out] | [AttentionResult::Lse] | [AttentionResult::Out, AttentionResult::Lse]
        );
        if !ordered {
            return Err(broken(rule, format!("results {:?} are not Out and/or Lse in that order", att.results)));
        }
        if kernel.outputs.len() != att.results.len() {
            return Err(broken(
                rule,
                format!("has {} output slots, expected {}", kernel.outputs.len(), att.results.len()),
            ));
        }
        for (slot, result) in att.results.iter().enumerate() {
            match result {
                AttentionResult::Out => {
                    self.check_operand(rule, "output", &kernel.outputs, slot, "out", s, &att.out_layout, true)?
                }
                AttentionResult::Lse => {
                    self.check_slots(rule, "output", &kernel.outputs[slot..slot + 1], &[("lse", DType::F32, s.rows())])?
                }
            }
        }
        Ok(())
    }

    fn validate_attention_backward(&self, kernel: &Kernel, back: &crate::plan::AttentionBackward) -> KernelResult {
        use braze_ir::AttentionInput::{Key, Query, Value};
        let rule = Rule::AttentionBackward;
        let s = &back.shape;
        Self::check_attention_shape(rule, s)?;
        if kernel.inputs.len() != AttentionBackward::INPUTS.len() {
            return Err(broken(rule, format!("has {} input slots, expected 6", kernel.inputs.len())));
        }
        for (&slot, layout) in [0, 1, 2, 5].iter().zip(&back.input_layouts) {
            let what = AttentionBackward::INPUTS[slot];
            self.check_operand(rule, "input", &kernel.inputs, slot, what, s, layout, false)?;
        }
        let statistics = [("lse", DType::F32, s.rows()), ("delta", DType::F32, s.rows())];
        self.check_slots(rule, "input", &kernel.inputs[3..5], &statistics)?;
        if !matches!(back.grads.as_slice(), [Query] | [Key] | [Value] | [Key, Value]) {
            return Err(broken(
                rule,
                format!("grads {:?} are not [Query] or Key and/or Value in that order", back.grads),
            ));
        }
        if kernel.outputs.len() != back.grads.len() || back.grad_layouts.len() != back.grads.len() {
            return Err(broken(
                rule,
                format!(
                    "has {} output slots and {} layouts for {} grads",
                    kernel.outputs.len(),
                    back.grad_layouts.len(),
                    back.grads.len()
                ),
            ));
        }
        for (slot, (grad, layout)) in back.grads.iter().zip(&back.grad_layouts).enumerate() {
            // A gradient written as columns of a shared buffer's rows needs only to lie inside it.
            let whole = self.output_part(kernel, slot).is_none();
            self.check_operand(rule, "output", &kernel.outputs, slot, grad.name(), s, layout, whole)?;
        }
        Ok(())
    }

    /// Value order, typing, loads and reductions of a body over `domain`; `runs(i)` tells
    /// whether value `i`'s load is executed at all for this domain.
    fn validate_body(
        &self,
        inputs: &[BufferId],
        body: &Body,
        domain: &[usize],
        reductions_allowed: bool,
        runs: impl Fn(usize) -> bool,
    ) -> KernelResult {
        validate_value_order(body)?;
        for (i, value) in body.values.iter().enumerate() {
            let here = |rule: Rule, detail: String| broken(rule, format!("v{i}: {detail}"));
            match &value.expr {
                Expr::Load { input, offset, strides } => {
                    let Some(&b) = inputs.get(*input) else {
                        return Err(here(Rule::Loads, format!("loads input slot {input} of {}", inputs.len())));
                    };
                    let buffer = self.buffer(b);
                    let widens = value.dtype == DType::F32 && buffer.dtype.is_narrow_float();
                    if buffer.dtype != value.dtype && !widens {
                        return Err(here(
                            Rule::Loads,
                            format!("loads {} data of {b} as {}", buffer.dtype, value.dtype),
                        ));
                    }
                    if strides.len() != domain.len() {
                        return Err(here(
                            Rule::Loads,
                            format!("has {} strides for a rank-{} domain", strides.len(), domain.len()),
                        ));
                    }
                    if runs(i) {
                        let last = domain.iter().zip(strides).try_fold(*offset, |acc, (&d, &s)| {
                            d.saturating_sub(1).checked_mul(s).and_then(|step| acc.checked_add(step))
                        });
                        if last.is_none_or(|last| last >= buffer.numel) {
                            return Err(here(
                                Rule::Loads,
                                format!(
                                    "load at offset {offset} with strides {strides:?} over {domain:?} leaves the {} elements of {b}",
                                    buffer.numel
                                ),
                            ));
                        }
                    }
                }
                Expr::Gather { input, offset, strides, index, index_stride, bound, check } => {
                    if reductions_allowed {
                        // Only the pointwise loops check and clamp an index.
                        return Err(here(Rule::Gathers, "a gather outside a pointwise kernel".into()));
                    }
                    let Some(&b) = inputs.get(*input) else {
                        return Err(here(Rule::Loads, format!("gathers from input slot {input} of {}", inputs.len())));
                    };
                    let buffer = self.buffer(b);
                    let widens = value.dtype == DType::F32 && buffer.dtype.is_narrow_float();
                    if buffer.dtype != value.dtype && !widens {
                        return Err(here(
                            Rule::Loads,
                            format!("gathers {} data of {b} as {}", buffer.dtype, value.dtype),
                        ));
                    }
                    if strides.len() != domain.len() {
                        return Err(here(
                            Rule::Loads,
                            format!("has {} strides for a rank-{} domain", strides.len(), domain.len()),
                        ));
                    }
                    if !body.values[index.0].dtype.is_int() {
                        return Err(here(Rule::Gathers, format!("its index {index} is not an integer")));
                    }
                    match self.checks.get(*check) {
                        Some(c) if c.bound == *bound => {}
                        _ => {
                            return Err(here(
                                Rule::Gathers,
                                format!("check {check} is not a check of the plan with bound {bound}"),
                            ))
                        }
                    }
                    if runs(i) && *bound > 0 {
                        let start = (*bound - 1).checked_mul(*index_stride).and_then(|s| s.checked_add(*offset));
                        let last = domain.iter().zip(strides).try_fold(start.unwrap_or(usize::MAX), |acc, (&d, &s)| {
                            d.saturating_sub(1).checked_mul(s).and_then(|step| acc.checked_add(step))
                        });
                        if last.is_none_or(|last| last >= buffer.numel) {
                            return Err(here(
                                Rule::Gathers,
                                format!(
                                    "gather at offset {offset}, index stride {index_stride} and bound {bound} with strides {strides:?} over {domain:?} leaves the {} elements of {b}",
                                    buffer.numel
                                ),
                            ));
                        }
                    }
                }
                _ => check_value_type(body, i, reductions_allowed)?,
            }
        }
        Ok(())
    }

    fn validate_index_add(&self, kernel: &Kernel, ia: &crate::plan::IndexAdd) -> KernelResult {
        let fail = |detail: String| Err(broken(Rule::IndexAdd, detail));
        if kernel.inputs.len() != 2 || kernel.outputs.len() != 1 {
            return fail(format!(
                "reads {} and writes {} buffers, expected src and indices, and one output",
                kernel.inputs.len(),
                kernel.outputs.len()
            ));
        }
        if !ia.dtype.is_float() && !ia.dtype.is_int() {
            return fail(format!("cannot add {} values", ia.dtype));
        }
        if !ia.index_dtype.is_int() {
            return fail(format!("indices of {} are not integers", ia.index_dtype));
        }
        let expected = [
            ("src", kernel.inputs[0], ia.dtype, ia.outer * ia.indices * ia.inner),
            ("indices", kernel.inputs[1], ia.index_dtype, ia.indices),
            ("output", kernel.outputs[0], ia.dtype, ia.outer * ia.size * ia.inner),
        ];
        for (what, b, dtype, numel) in expected {
            let buffer = self.buffer(b);
            if buffer.dtype != dtype || buffer.numel != numel {
                return fail(format!(
                    "the {what} {b} is {} x{}, expected {dtype} x{numel}",
                    buffer.dtype, buffer.numel
                ));
            }
        }
        Ok(())
    }

    /// Every output slot stored once, with the dtype and element count (`numel(value)`) of its
    /// buffer; the slots `filled` are written otherwise (a row kernel's partials) and take no
    /// store.
    fn validate_stores(
        &self,
        kernel: &Kernel,
        body: &Body,
        filled: &[usize],
        numel: impl Fn(ValueId) -> usize,
    ) -> KernelResult {
        let mut stored = vec![false; kernel.outputs.len()];
        for &slot in filled {
            if let Some(done) = stored.get_mut(slot) {
                *done = true;
            }
        }
        for s in &body.stores {
            let Some(value) = body.values.get(s.value.0) else {
                return Err(broken(Rule::ValueOrder, format!("stores {}, which is not a value", s.value)));
            };
            let Some(done) = stored.get_mut(s.output) else {
                return Err(broken(
                    Rule::Stores,
                    format!("stores to output slot {} of {}", s.output, kernel.outputs.len()),
                ));
            };
            if std::mem::replace(done, true) {
                return Err(broken(Rule::Stores, format!("stores output slot {} twice", s.output)));
            }
            let b = kernel.outputs[s.output];
            let buffer = self.buffer(b);
            if buffer.dtype != value.dtype {
                return Err(broken(
                    Rule::Stores,
                    format!("stores {} {} into {b} of {}", value.dtype, s.value, buffer.dtype),
                ));
            }
            let len = numel(s.value);
            if buffer.numel != len {
                return Err(broken(
                    Rule::Stores,
                    format!("store of {} fills {len} elements but {b} holds {}", s.value, buffer.numel),
                ));
            }
        }
        match stored.iter().position(|&s| !s) {
            Some(slot) => Err(broken(Rule::Stores, format!("output slot {slot} is never stored"))),
            None => Ok(()),
        }
    }

    /// [`Rule::ColumnPartials`] of a row kernel; returns the output slots its partials fill.
    fn validate_partials(
        &self,
        kernel: &Kernel,
        row: &crate::plan::RowKernel,
    ) -> std::result::Result<Vec<usize>, Broken> {
        let fail = |detail: String| Err(broken(Rule::ColumnPartials, detail));
        if row.partials.is_empty() {
            return if row.partial_rows == 0 { Ok(Vec::new()) } else { fail("partial_rows without partials".into()) };
        }
        if row.partial_rows == 0 {
            return fail("partials in groups of 0 rows".into());
        }
        if row.partials.len() > crate::plan::RowKernel::MAX_PARTIALS {
            return fail(format!(
                "{} partials, more than {}",
                row.partials.len(),
                crate::plan::RowKernel::MAX_PARTIALS
            ));
        }
        if row.cols() > crate::plan::RowKernel::MAX_PARTIAL_COLS {
            return fail(format!(
                "partials of {} columns, more than {}",
                row.cols(),
                crate::plan::RowKernel::MAX_PARTIAL_COLS
            ));
        }
        let numel = row.partial_groups() * row.cols();
        let mut slots = Vec::new();
        for p in &row.partials {
            let Some(value) = row.body.values.get(p.value.0) else {
                return fail(format!("folds {}, which is not a value", p.value));
            };
            if !matches!(p.op, braze_ir::ReduceOp::Sum | braze_ir::ReduceOp::Max | braze_ir::ReduceOp::Min) {
                return fail(format!("folds {} by {}, not sum, max or min", p.value, p.op.name()));
            }
            if !value.dtype.is_float() {
                return fail(format!("folds {} of {}, not a float", p.value, value.dtype));
            }
            let Some(&b) = kernel.outputs.get(p.output) else {
                return fail(format!("writes output slot {} of {}", p.output, kernel.outputs.len()));
            };
            if slots.contains(&p.output) || row.body.stores.iter().any(|s| s.output == p.output) {
                return fail(format!("output slot {} is written twice", p.output));
            }
            let buffer = self.buffer(b);
            if buffer.dtype != DType::F32 || buffer.numel != numel {
                return fail(format!(
                    "partials of {} into {b}: {} x {}, expected {numel} x f32",
                    p.value, buffer.numel, buffer.dtype
                ));
            }
            slots.push(p.output);
        }
        Ok(slots)
    }

    fn validate_column(&self, kernel: &Kernel, col: &crate::plan::ColumnKernel) -> KernelResult {
        let domain = col.domain();
        let (rows, cols) = (col.rows(), col.cols());
        validate_value_order(&col.body)?;
        validate_load_ranks(&col.body, domain.rank())?;
        let per_column = col.body.column_values(col.reduced.len());
        // The epilogue runs for every column even when there are no rows (it stores identities).
        self.validate_body(&kernel.inputs, &col.body, domain.dims(), true, |i| {
            cols > 0 && (per_column[i] || rows > 0)
        })?;
        let mut after_reduce = vec![false; col.body.values.len()];
        for (i, value) in col.body.values.iter().enumerate() {
            let operands = value.expr.operands();
            if matches!(value.expr, Expr::Reduce { .. }) && operands.iter().any(|o| after_reduce[o.0]) {
                return Err(broken(Rule::ColumnReduce, format!("v{i}: reduces a value computed from a reduction")));
            }
            after_reduce[i] = matches!(value.expr, Expr::Reduce { .. }) || operands.iter().any(|o| after_reduce[o.0]);
        }
        if let Some(s) = col.body.stores.iter().find(|s| s.value.0 < per_column.len() && !per_column[s.value.0]) {
            return Err(broken(Rule::ColumnReduce, format!("stores {}, which varies with the row", s.value)));
        }
        self.validate_stores(kernel, &col.body, &[], |_| cols)
    }

    /// [`Rule::MultiPointwise`], with each member's body held to the pointwise rules.
    fn validate_multi_pointwise(&self, kernel: &Kernel, multi: &MultiPointwise) -> KernelResult {
        let fail = |detail: String| Err(broken(Rule::MultiPointwise, detail));
        if multi.members.is_empty() {
            return fail("no members".into());
        }
        let mut stored_by: Vec<Option<usize>> = vec![None; kernel.outputs.len()];
        for (m, member) in multi.members.iter().enumerate() {
            let numel = member.shape.numel();
            self.validate_body(&kernel.inputs, &member.body, member.shape.dims(), false, |_| numel > 0)
                .map_err(|e| e.within(&format!("member {m}")))?;
            if member.body.stores.is_empty() {
                return fail(format!("member {m} stores nothing"));
            }
            for store in &member.body.stores {
                let Some(value) = member.body.values.get(store.value.0) else {
                    return fail(format!("member {m} stores {}, which is not a value", store.value));
                };
                let Some(owner) = stored_by.get_mut(store.output) else {
                    return fail(format!(
                        "member {m} stores to output slot {} of {}",
                        store.output,
                        kernel.outputs.len()
                    ));
                };
                if let Some(first) = owner.replace(m) {
                    return fail(format!(
                        "output slot {} is stored by member {first} and again by member {m}",
                        store.output
                    ));
                }
                let b = kernel.outputs[store.output];
                let buffer = self.buffer(b);
                if buffer.dtype != value.dtype || buffer.numel != numel {
                    return fail(format!(
                        "member {m} stores {numel} {} values into {b}, which holds {} {}",
                        value.dtype, buffer.numel, buffer.dtype
                    ));
                }
            }
        }
        match stored_by.iter().position(Option::is_none) {
            Some(slot) => fail(format!("output slot {slot} is never stored")),
            None => Ok(()),
        }
    }

    fn validate_matmul(&self, kernel: &Kernel, mm: &crate::plan::MatMul) -> KernelResult {
        let fail = |detail: String| Err(broken(Rule::MatMul, detail));
        let wanted_inputs = if mm.bias { 3 } else { 2 };
        if kernel.inputs.len() != wanted_inputs || kernel.outputs.len() != 1 {
            return fail(format!("needs {wanted_inputs} inputs and 1 output"));
        }
        let all_of_dtype = kernel.inputs.iter().chain(&kernel.outputs).all(|&b| self.buffer(b).dtype == mm.dtype);
        if !mm.dtype.is_float() || !all_of_dtype {
            return fail(format!("reads and writes {} floats only", mm.dtype));
        }
        let batches: usize = mm.batch.iter().product();
        // The last element each operand's batches reach must lie inside it.
        let reach = |stride: usize, matrix: usize| {
            if batches == 0 || matrix == 0 {
                Some(0)
            } else {
                (batches - 1).checked_mul(stride).and_then(|last| last.checked_add(matrix))
            }
        };
        let fits = |slot: usize, stride: usize, rows: usize, cols: usize| {
            rows.checked_mul(cols)
                .and_then(|matrix| reach(stride, matrix))
                .is_some_and(|needed| needed <= self.input_numel(kernel, slot))
        };
        if !fits(0, mm.a_batch_stride, mm.m, mm.k) || !fits(1, mm.b_batch_stride, mm.k, mm.n) {
            return fail(format!("A or B is too small for {batches} batches"));
        }
        if mm.bias && self.input_numel(kernel, 2) != mm.n {
            return fail(format!("the bias must hold n = {} elements", mm.n));
        }
        if self.buffer(kernel.outputs[0]).numel != batches * mm.m * mm.n {
            return fail(format!("the output must hold {batches} x {} x {} elements", mm.m, mm.n));
        }
        if let Some(op) = mm.activation.filter(|op| !crate::plan::MatMul::EPILOGUE_ACTIVATIONS.contains(op)) {
            return fail(format!("{} is not an epilogue activation", op.name()));
        }
        Ok(())
    }

    fn validate_concat(&self, kernel: &Kernel, cat: &crate::plan::Concat) -> KernelResult {
        let fail = |detail: String| Err(broken(Rule::Concat, detail));
        let dims = cat.shape.dims();
        if cat.axis >= dims.len() {
            return fail(format!("axis {} of {}", cat.axis, cat.shape));
        }
        if cat.extents.len() != kernel.inputs.len() || kernel.outputs.len() != 1 {
            return fail(format!(
                "{} extents for {} inputs and {} outputs",
                cat.extents.len(),
                kernel.inputs.len(),
                kernel.outputs.len()
            ));
        }
        if cat.extents.iter().sum::<usize>() != dims[cat.axis] {
            return fail(format!("extents {:?} do not add up to {}", cat.extents, cat.shape));
        }
        for (i, &extent) in cat.extents.iter().enumerate() {
            let mut part = dims.to_vec();
            part[cat.axis] = extent;
            let buffer = self.buffer(kernel.inputs[i]);
            if buffer.dtype != cat.dtype || buffer.numel != part.iter().product::<usize>() {
                return fail(format!("input {i} must be {}{}", cat.dtype, Shape(part)));
            }
        }
        let out = self.buffer(kernel.outputs[0]);
        if out.dtype != cat.dtype || out.numel != cat.shape.numel() {
            return fail(format!("the output must be {}{}", cat.dtype, cat.shape));
        }
        Ok(())
    }
}

/// Value order and typing of a body whose loads its family checks: every value's dtype is what
/// its op gives for its operands' dtypes.
pub(crate) fn validate_value_types(body: &Body, reductions_allowed: bool) -> KernelResult {
    validate_value_order(body)?;
    for (i, value) in body.values.iter().enumerate() {
        if !matches!(value.expr, Expr::Load { .. }) {
            check_value_type(body, i, reductions_allowed)?;
        }
    }
    Ok(())
}

/// The typing of value `i`, which is not a load.
fn check_value_type(body: &Body, i: usize, reductions_allowed: bool) -> KernelResult {
    let value = &body.values[i];
    let here = |rule: Rule, detail: String| broken(rule, format!("v{i}: {detail}"));
    let scalar = Shape::scalar();
    let typed = |op: Op, operands: &[ValueId]| -> KernelResult {
        let types: Vec<(DType, &Shape)> = operands.iter().map(|v| (body.values[v.0].dtype, &scalar)).collect();
        let (dtype, _) = infer(&op, &types, None).map_err(|e| here(Rule::ValueTypes, e.to_string()))?;
        if dtype != value.dtype {
            return Err(here(
                Rule::ValueTypes,
                format!("{} gives {dtype}, but the value is {}", op.name(), value.dtype),
            ));
        }
        Ok(())
    };
    match &value.expr {
        Expr::Load { .. } => Ok(()),
        Expr::Gather { .. } => Err(here(Rule::Gathers, "a gather outside a pointwise kernel".into())),
        Expr::Const { value: c } => {
            if !c.fits(value.dtype) {
                return Err(here(Rule::ValueTypes, format!("constant {c} is not a {} value", value.dtype)));
            }
            Ok(())
        }
        Expr::Index if reductions_allowed => {
            Err(here(Rule::Indices, "an element index outside a pointwise kernel".into()))
        }
        Expr::Index if value.dtype == DType::Bool => Err(here(Rule::Indices, "an element index of bool".into())),
        Expr::Index => Ok(()),
        Expr::Cast { .. } => Ok(()),
        Expr::Unary { op, x } => typed(Op::Unary { op: *op }, &[*x]),
        Expr::Binary { op, a, b } => typed(Op::Binary { op: *op }, &[*a, *b]),
        Expr::Where { cond, a, b } => typed(Op::Where, &[*cond, *a, *b]),
        Expr::Reduce { op, x } => {
            if !reductions_allowed {
                return Err(here(Rule::Reductions, "a reduction outside a row or column kernel".into()));
            }
            typed(Op::Reduce { op: *op, axes: vec![], keepdim: false }, &[*x])
        }
    }
}

/// Values use only earlier values.
fn validate_value_order(body: &Body) -> KernelResult {
    for (i, v) in body.values.iter().enumerate() {
        if let Some(o) = v.expr.operands().into_iter().find(|o| o.0 >= i) {
            return Err(broken(Rule::ValueOrder, format!("v{i}: uses {o}, which is not defined before it")));
        }
    }
    Ok(())
}

/// One stride per domain dim on every load (what per-row analysis indexes).
fn validate_load_ranks(body: &Body, rank: usize) -> KernelResult {
    for (i, v) in body.values.iter().enumerate() {
        if let Expr::Load { strides, .. } = &v.expr {
            if strides.len() != rank {
                return Err(broken(
                    Rule::Loads,
                    format!("v{i}: has {} strides for a rank-{rank} domain", strides.len()),
                ));
            }
        }
    }
    Ok(())
}

fn is_c_identifier(name: &str) -> bool {
    name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}
