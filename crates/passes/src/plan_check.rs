//! Structural checks of a [`Plan`]: run after fusion in debug builds and by tests, so a fusion
//! bug shows up as a message naming the kernel instead of a wrong answer on the device.

use crate::plan::{Body, BufferRole, Expr, Kernel, KernelKind, Plan};
use crate::{PassError, Result};

impl Plan {
    /// Checks the invariants `plan.rs` documents: kernels read only inputs and earlier results,
    /// write each buffer once, index inside their buffers and store every output exactly once.
    pub fn check(&self) -> Result<()> {
        let fail = |msg: String| Err(PassError::InvalidPlan(msg));
        for (i, b) in self.inputs.iter().enumerate() {
            if self.buffers.get(b.0).map(|buf| buf.role) != Some(BufferRole::Input(i)) {
                return fail(format!("inputs[{i}] = {b} is not buffer of input #{i}"));
            }
        }
        let mut written: Vec<bool> = self.buffers.iter().map(|b| matches!(b.role, BufferRole::Input(_))).collect();
        for (k, kernel) in self.kernels.iter().enumerate() {
            let here = |msg: String| PassError::InvalidPlan(format!("kernel {k} ({}): {msg}", kernel.name));
            for b in &kernel.inputs {
                if !written.get(b.0).copied().unwrap_or(false) {
                    return Err(here(format!("reads {b} before anything writes it")));
                }
            }
            for b in &kernel.outputs {
                match self.buffers.get(b.0) {
                    None => return Err(here(format!("writes {b}, which does not exist"))),
                    Some(buf) if matches!(buf.role, BufferRole::Input(_)) => {
                        return Err(here(format!("writes input buffer {b}")))
                    }
                    Some(_) if written[b.0] => return Err(here(format!("writes {b}, already written"))),
                    Some(_) => written[b.0] = true,
                }
            }
            self.check_kernel(kernel).map_err(here)?;
        }
        for (j, out) in self.outputs.iter().enumerate() {
            match self.buffers.get(out.buffer.0) {
                Some(buf) if buf.numel == out.shape.numel() && written[out.buffer.0] => {}
                _ => return fail(format!("output {j} ({} as {}) has no matching buffer", out.buffer, out.shape)),
            }
        }
        Ok(())
    }

    fn numel_of_input(&self, kernel: &Kernel, slot: usize) -> usize {
        self.buffer(kernel.inputs[slot]).numel
    }

    fn check_kernel(&self, kernel: &Kernel) -> std::result::Result<(), String> {
        let out_numel = |slot: usize| kernel.outputs.get(slot).map(|&b| self.buffer(b).numel);
        match &kernel.kind {
            KernelKind::Pointwise(pw) => {
                self.check_body(kernel, &pw.body, pw.shape.dims(), false)?;
                self.check_stores(kernel, &pw.body, |_| pw.shape.numel())
            }
            KernelKind::Row(row) => {
                let domain = row.domain();
                self.check_body(kernel, &row.body, domain.dims(), true)?;
                let per_row = row.body.row_values(row.outer.len());
                self.check_stores(kernel, &row.body, |v| if per_row[v] { row.rows() } else { row.rows() * row.cols() })
            }
            KernelKind::MultiReduce(mr) => {
                if mr.items.len() != kernel.inputs.len() {
                    return Err(format!("{} items but {} inputs", mr.items.len(), kernel.inputs.len()));
                }
                for (i, &n) in mr.items.iter().enumerate() {
                    let buf = self.buffer(kernel.inputs[i]);
                    if buf.numel != n || buf.dtype != mr.dtype {
                        return Err(format!(
                            "item {i}: {n} {} elements, buffer holds {} {}",
                            mr.dtype, buf.numel, buf.dtype
                        ));
                    }
                }
                if kernel.outputs.len() != 1 || out_numel(0) != Some(mr.items.len()) {
                    return Err("a multi-reduce writes one buffer of one element per item".into());
                }
                let element = Expr::Load { input: 0, offset: 0, strides: vec![1] };
                for v in &mr.prologue.values {
                    match &v.expr {
                        Expr::Load { .. } if v.expr != element => {
                            return Err("prologue reads more than the item".into())
                        }
                        Expr::Reduce { .. } => return Err("prologue reduces".into()),
                        _ => {}
                    }
                }
                if mr.prologue.values.is_empty() || !mr.prologue.stores.is_empty() {
                    return Err("prologue must compute one value and store nothing".into());
                }
                check_operands(&mr.prologue)
            }
            KernelKind::MatMul(mm) => {
                let batches: usize = mm.batch.iter().product();
                let need = |stride: usize, size: usize| if batches == 0 { 0 } else { stride * (batches - 1) + size };
                let wanted_inputs = if mm.bias { 3 } else { 2 };
                if kernel.inputs.len() != wanted_inputs || kernel.outputs.len() != 1 {
                    return Err("matmul inputs or outputs".into());
                }
                if self.numel_of_input(kernel, 0) < need(mm.a_batch_stride, mm.m * mm.k)
                    || self.numel_of_input(kernel, 1) < need(mm.b_batch_stride, mm.k * mm.n)
                    || (mm.bias && self.numel_of_input(kernel, 2) != mm.n)
                    || out_numel(0) != Some(batches * mm.m * mm.n)
                {
                    return Err("matmul buffer sizes".into());
                }
                Ok(())
            }
            KernelKind::Concat(cat) => {
                if cat.extents.len() != kernel.inputs.len()
                    || cat.extents.iter().sum::<usize>() != cat.shape.dims()[cat.axis]
                {
                    return Err("concat extents".into());
                }
                for (i, &e) in cat.extents.iter().enumerate() {
                    let mut dims = cat.shape.dims().to_vec();
                    dims[cat.axis] = e;
                    if self.numel_of_input(kernel, i) != dims.iter().product::<usize>() {
                        return Err(format!("concat input {i} size"));
                    }
                }
                if out_numel(0) != Some(cat.shape.numel()) {
                    return Err("concat output size".into());
                }
                Ok(())
            }
        }
    }

    fn check_body(&self, kernel: &Kernel, body: &Body, domain: &[usize], row: bool) -> std::result::Result<(), String> {
        check_operands(body)?;
        let empty = domain.contains(&0);
        for (i, v) in body.values.iter().enumerate() {
            match &v.expr {
                Expr::Load { input, offset, strides } => {
                    let Some(&b) = kernel.inputs.get(*input) else { return Err(format!("v{i} reads slot {input}")) };
                    let buf = self.buffer(b);
                    if strides.len() != domain.len() || buf.dtype != v.dtype {
                        return Err(format!(
                            "v{i}: load of {b} with {} strides over a rank-{} domain",
                            strides.len(),
                            domain.len()
                        ));
                    }
                    let last: usize =
                        offset + domain.iter().zip(strides).map(|(&d, &s)| d.saturating_sub(1) * s).sum::<usize>();
                    if !empty && last >= buf.numel {
                        return Err(format!("v{i}: reads element {last} of {b}, which holds {}", buf.numel));
                    }
                }
                Expr::Reduce { x, .. }
                    if !row || body.values[x.0].dtype.is_float() && v.dtype != braze_ir::DType::F32 =>
                {
                    return Err(format!("v{i}: reductions belong in row kernels and accumulate floats in f32"));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn check_stores(
        &self,
        kernel: &Kernel,
        body: &Body,
        numel: impl Fn(usize) -> usize,
    ) -> std::result::Result<(), String> {
        let mut stored = vec![false; kernel.outputs.len()];
        for s in &body.stores {
            let Some(done) = stored.get_mut(s.output) else { return Err(format!("store to slot {}", s.output)) };
            if std::mem::replace(done, true) {
                return Err(format!("slot {} stored twice", s.output));
            }
            let buf = self.buffer(kernel.outputs[s.output]);
            if s.value.0 >= body.values.len() || buf.numel != numel(s.value.0) {
                return Err(format!(
                    "store {} -> out{}: {} elements into {}",
                    s.value,
                    s.output,
                    numel(s.value.0),
                    buf.numel
                ));
            }
            if buf.dtype != body.values[s.value.0].dtype {
                return Err(format!("store {} -> out{}: dtype", s.value, s.output));
            }
        }
        if stored.iter().any(|&s| !s) {
            return Err("an output slot is never stored".into());
        }
        Ok(())
    }
}

fn check_operands(body: &Body) -> std::result::Result<(), String> {
    for (i, v) in body.values.iter().enumerate() {
        if let Some(o) = v.expr.operands().into_iter().find(|o| o.0 >= i) {
            return Err(format!("v{i} uses {o}, which is not defined before it"));
        }
    }
    Ok(())
}
