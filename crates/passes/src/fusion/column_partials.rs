//! Column reductions folded into the row kernel that reads their rows anyway: a layer norm's
//! backward reads `dy` and `x` row by row, and the column kernel after it reads them again to
//! sum `dy` and `dy * xhat` down the columns (the weight and bias grads), as does the sum of the
//! residual's gradient that the row kernel writes. Here the row kernel also folds those values
//! over each group of its rows ([`ColumnPartial`]), and the column kernel reduces
//! the `[groups, cols]` f32 partials instead of the rows: the rows cross memory once, and the
//! sums keep a fixed order (rows within a group, then groups in order).
//!
//! A pointwise kernel over the column kernel's domain takes the row kernel's place as a row
//! kernel without reductions (a GELU backward writing the `dh` whose column sums are a bias's
//! grad): its rows cross memory once too.
//!
//! A column kernel folds into the nearest earlier row kernel over the same rows and columns
//! whose partials can compute each of its reductions' operands: from loads of buffers the row
//! kernel reads or writes itself (a small per-row or per-column load may be new), or loads
//! available before it runs. Its reductions are float sums, means, maxima or minima with f32
//! results; its per-column epilogue (an optimizer's update of the weight) stays where it is.

use braze_ir::{BinaryOp, DType, Literal, ReduceOp};
use braze_plan::{
    Body, Buffer, BufferId, BufferRole, ColumnKernel, ColumnPartial, Expr, Kernel, KernelKind, Plan, RowKernel, Value,
    ValueId,
};
use std::collections::HashMap;

/// Groups of rows the partials aim at: a block of the row kernel takes one group, so the groups
/// are its grid. On the H100 (RESULTS, 2026-12-07 run C) groups of 8 rows beat groups of 16 in
/// mlp_step's step (3494 against 3541 us: its GELU backward rows 108 us against 120, though its
/// layer norm backward rows took 57 against 47) and groups of 32 in gpt2_step's (35.75 against
/// 35.86 ms: layer norm backward rows 83 us against 87, GELU backward rows 165 against 198).
const TARGET_GROUPS: usize = 2048;
/// Fewest rows a group folds: each group writes one row of f32 per partial, which the column
/// kernel reads back, so a group of `r` rows adds `1 / r` of an f32 row's bytes to each row.
const MIN_PARTIAL_ROWS: usize = 8;
/// Most rows a group folds (a block walks its group's rows one after another).
const MAX_PARTIAL_ROWS: usize = 64;

/// Rows per group of partials for `rows` rows.
fn partial_rows(rows: usize) -> usize {
    (rows / TARGET_GROUPS).clamp(MIN_PARTIAL_ROWS, MAX_PARTIAL_ROWS)
}

/// Folds every column kernel it can into an earlier row kernel (see the module docs); a value
/// the row kernel stored only for the column kernel is no longer stored.
pub(super) fn fold_into_row_kernels(plan: &mut Plan) {
    let mut folded_into = Vec::new();
    for j in 0..plan.kernels.len() {
        let KernelKind::Column(col) = &plan.kernels[j].kind else { continue };
        let Some(reductions) = foldable_reductions(col) else { continue };
        for i in (0..j).rev() {
            let Some(row) = as_row_kernel(&plan.kernels[i].kind, col) else { continue };
            if row.rows() != col.rows() || row.cols() != col.cols() {
                continue;
            }
            if row.partials.len() + reductions.len() > RowKernel::MAX_PARTIALS {
                continue;
            }
            if let Some(fold) = Transplant::plan(plan, i, &row, j, &reductions) {
                tracing::trace!(
                    target: "braze::plan",
                    row = plan.kernels[i].name.as_str(),
                    column = plan.kernels[j].name.as_str(),
                    "column reductions folded into a row kernel's partials"
                );
                let rk = &mut plan.kernels[i];
                if !matches!(rk.kind, KernelKind::Row(_)) {
                    rk.name = format!("row_{}", rk.name.strip_prefix("pointwise_").unwrap_or(&rk.name));
                }
                rk.kind = KernelKind::Row(row);
                fold.apply(plan, i, j, &reductions);
                folded_into.push(i);
                break;
            }
        }
    }
    folded_into.sort_unstable();
    folded_into.dedup();
    for &i in &folded_into {
        drop_unread_outputs(plan, i);
    }
    if !folded_into.is_empty() {
        plan.remove_unused_intermediates();
    }
}

/// A row kernel that partials can be added to: a row kernel as it is, or a pointwise kernel over
/// exactly the column kernel's domain (`reduced ++ kept`) as a row kernel without reductions
/// over the same rows (the GELU backward that writes the `dh` whose column sums are a bias's
/// grad). Pointwise bodies with gathers or element indices stay pointwise.
fn as_row_kernel(kind: &KernelKind, col: &ColumnKernel) -> Option<RowKernel> {
    match kind {
        KernelKind::Row(row) => Some(row.clone()),
        KernelKind::Pointwise(pw) => {
            let domain = col.domain();
            let plain = pw.body.values.iter().all(|v| !matches!(v.expr, Expr::Gather { .. } | Expr::Index));
            (plain && pw.shape == domain)
                .then(|| RowKernel::new(col.reduced.clone(), col.kept.clone(), pw.body.clone()))
        }
        _ => None,
    }
}

/// Removes kernel `k`'s stores of intermediates that no kernel reads.
fn drop_unread_outputs(plan: &mut Plan, k: usize) {
    let read = |b: BufferId, plan: &Plan| {
        plan.kernels.iter().any(|kernel| kernel.inputs.contains(&b)) || plan.outputs.iter().any(|o| o.buffer == b)
    };
    let kernel = &plan.kernels[k];
    let keep: Vec<bool> =
        kernel.outputs.iter().map(|&b| plan.buffer(b).role != BufferRole::Intermediate || read(b, plan)).collect();
    if keep.iter().all(|&k| k) {
        return;
    }
    let mut slot = vec![usize::MAX; keep.len()];
    let mut next = 0;
    for (old, &kept) in keep.iter().enumerate() {
        if kept {
            slot[old] = next;
            next += 1;
        }
    }
    let kernel = &mut plan.kernels[k];
    kernel.outputs = kernel.outputs.iter().zip(&keep).filter(|(_, &kept)| kept).map(|(&b, _)| b).collect();
    let KernelKind::Row(row) = &mut kernel.kind else { unreachable!("only row kernels get partials") };
    row.body.stores.retain(|s| keep[s.output]);
    for store in &mut row.body.stores {
        store.output = slot[store.output];
    }
    for partial in &mut row.partials {
        partial.output = slot[partial.output];
    }
}

/// The column kernel's reductions, `(value, op, operand)`, when every one can be folded from
/// partials: a float operand, an f32 result, no value of their operands also needed by the
/// epilogue except loads (a computed value would be computed twice), and rows and columns to
/// fold.
fn foldable_reductions(col: &ColumnKernel) -> Option<Vec<(ValueId, ReduceOp, ValueId)>> {
    let (rows, cols) = (col.rows(), col.cols());
    if cols == 0 || cols > RowKernel::MAX_PARTIAL_COLS || rows < 2 * MIN_PARTIAL_ROWS {
        return None;
    }
    let body = &col.body;
    let mut reductions = Vec::new();
    for (id, value) in body.values.iter().enumerate() {
        if let Expr::Reduce { op, x } = value.expr {
            if value.dtype != DType::F32 || !body.values[x.0].dtype.is_float() {
                return None;
            }
            reductions.push((ValueId(id), op, x));
        }
    }
    if reductions.is_empty() || reductions.len() > RowKernel::MAX_PARTIALS {
        return None;
    }
    let operands = operand_values(body, &reductions);
    for (id, value) in body.values.iter().enumerate() {
        if operands[id] {
            if matches!(value.expr, Expr::Gather { .. } | Expr::Index | Expr::Reduce { .. }) {
                return None;
            }
            continue;
        }
        // An epilogue value reading a computed operand value would need it computed twice.
        let reads_computed = value
            .expr
            .operands()
            .iter()
            .any(|o| operands[o.0] && !matches!(body.values[o.0].expr, Expr::Load { .. } | Expr::Const { .. }));
        if reads_computed && !matches!(value.expr, Expr::Reduce { .. }) {
            return None;
        }
    }
    Some(reductions)
}

/// The values the reductions' operands are computed from (the operands among them).
fn operand_values(body: &Body, reductions: &[(ValueId, ReduceOp, ValueId)]) -> Vec<bool> {
    let mut needed = vec![false; body.values.len()];
    for &(_, _, x) in reductions {
        needed[x.0] = true;
    }
    for id in (0..body.values.len()).rev() {
        if needed[id] {
            for o in body.values[id].expr.operands() {
                needed[o.0] = true;
            }
        }
    }
    needed
}

/// Strides of a view over `from` (one per dim) as strides over `to` (the same element count),
/// when the view is linear in the flat index of `from`: `flat * step` (a contiguous run, or a
/// broadcast with step 0).
fn restride(from: &[usize], strides: &[usize], to: &[usize]) -> Option<Vec<usize>> {
    if from == to {
        return Some(strides.to_vec());
    }
    // The step is the stride of the innermost dim of extent > 1; every outer one must be the
    // step times the extents inside it.
    let mut step = None;
    let mut inside = 1usize;
    for d in (0..from.len()).rev() {
        if from[d] != 1 {
            match step {
                None => step = Some(strides[d]),
                Some(st) if strides[d] == st * inside => {}
                Some(_) => return None,
            }
        }
        inside *= from[d];
    }
    let step = step.unwrap_or(0);
    let mut out = vec![0; to.len()];
    let mut inside = 1usize;
    for d in (0..to.len()).rev() {
        out[d] = step * inside;
        inside *= to[d];
    }
    Some(out)
}

/// How one column kernel's operand values move into one row kernel's body.
struct Transplant {
    /// The row kernel's body and inputs after the move.
    body: Body,
    inputs: Vec<BufferId>,
    /// Each reduction's operand in the new body.
    operands: Vec<ValueId>,
}

impl Transplant {
    /// The move of column kernel `j`'s operand values into row kernel `i`, if every load can
    /// be read there: a buffer the row kernel writes, read back exactly where it stores it (its
    /// stored value, rounded to the buffer's dtype as a load would see it), or one written
    /// before it runs; an element load (varying along both rows and columns) only of a buffer
    /// the row kernel reads or writes already.
    fn plan(
        plan: &Plan,
        i: usize,
        row: &RowKernel,
        j: usize,
        reductions: &[(ValueId, ReduceOp, ValueId)],
    ) -> Option<Transplant> {
        let (rk, ck) = (&plan.kernels[i], &plan.kernels[j]);
        let KernelKind::Column(col) = &ck.kind else { return None };
        let written_before: std::collections::HashSet<BufferId> =
            plan.kernels[..i].iter().flat_map(|k| k.outputs.iter().copied()).collect();
        let available =
            |b: BufferId| matches!(plan.buffer(b).role, BufferRole::Input(_)) || written_before.contains(&b);
        let (rank_r, rank_k) = (col.reduced.len(), row.outer.len());
        let operands = operand_values(&col.body, reductions);
        let mut body = row.body.clone();
        let mut inputs = rk.inputs.clone();
        let mut moved: HashMap<usize, ValueId> = HashMap::new();
        for (id, value) in col.body.values.iter().enumerate() {
            if !operands[id] {
                continue;
            }
            let expr = match &value.expr {
                Expr::Load { input, offset, strides } => {
                    let b = ck.inputs[*input];
                    let row_strides = restride(&col.reduced, &strides[..rank_r], &row.outer)?;
                    let col_strides = restride(&col.kept, &strides[rank_r..], &row.inner)?;
                    let new_strides: Vec<usize> = row_strides.iter().chain(&col_strides).copied().collect();
                    if let Some(slot) = rk.outputs.iter().position(|&o| o == b) {
                        let stored = stored_value(row, slot, *offset, &new_strides, rank_k)?;
                        // An f16/bf16 value is read back rounded, as the load would see it.
                        let read_back = if body.values[stored.0].dtype == value.dtype && value.dtype == DType::F32 {
                            stored
                        } else {
                            intern(&mut body, Expr::Cast { x: stored }, value.dtype)
                        };
                        moved.insert(id, read_back);
                        continue;
                    }
                    let varies_along_rows = new_strides[..rank_k].iter().any(|&s| s != 0);
                    let varies_along_cols = new_strides[rank_k..].iter().any(|&s| s != 0);
                    if !available(b) || (varies_along_rows && varies_along_cols && !rk.inputs.contains(&b)) {
                        return None;
                    }
                    let slot = match inputs.iter().position(|&x| x == b) {
                        Some(slot) => slot,
                        None => {
                            inputs.push(b);
                            inputs.len() - 1
                        }
                    };
                    Expr::Load { input: slot, offset: *offset, strides: new_strides }
                }
                Expr::Const { value } => Expr::Const { value: *value },
                expr => remap(expr, &moved),
            };
            moved.insert(id, intern(&mut body, expr, value.dtype));
        }
        let operands = reductions.iter().map(|&(_, _, x)| moved[&x.0]).collect();
        Some(Transplant { body, inputs, operands })
    }

    /// Row kernel `i` gets the partials, column kernel `j` reduces them.
    fn apply(self, plan: &mut Plan, i: usize, j: usize, reductions: &[(ValueId, ReduceOp, ValueId)]) {
        let (rows, cols) = match &plan.kernels[j].kind {
            KernelKind::Column(col) => (col.rows(), col.cols()),
            _ => unreachable!("kernel {j} is the column kernel being folded"),
        };
        let group_rows = partial_rows(rows);
        let groups = rows.div_ceil(group_rows);
        let mut partial_buffers = Vec::new();
        for _ in reductions {
            plan.buffers.push(Buffer { dtype: DType::F32, numel: groups * cols, role: BufferRole::Intermediate });
            partial_buffers.push(BufferId(plan.buffers.len() - 1));
        }
        let rk = &mut plan.kernels[i];
        rk.inputs = self.inputs;
        let KernelKind::Row(row) = &mut rk.kind else { unreachable!("kernel {i} is the row kernel folded into") };
        row.body = self.body;
        row.partial_rows = group_rows;
        for ((&(_, op, _), operand), &b) in reductions.iter().zip(self.operands).zip(&partial_buffers) {
            rk.outputs.push(b);
            let op = if op == ReduceOp::Mean { ReduceOp::Sum } else { op };
            row.partials.push(ColumnPartial { op, value: operand, output: rk.outputs.len() - 1 });
        }
        let ck = &mut plan.kernels[j];
        reduce_partials(ck, reductions, &partial_buffers, groups);
    }
}

/// The value row kernel `row` stores to output `slot`, when a load at `offset` with `strides`
/// (over the row kernel's domain) reads back exactly the element it stores there.
fn stored_value(row: &RowKernel, slot: usize, offset: usize, strides: &[usize], outer_rank: usize) -> Option<ValueId> {
    let store = row.body.stores.iter().find(|s| s.output == slot)?;
    let per_row = row.body.row_values(outer_rank)[store.value.0];
    let (outer, inner) = (&row.outer, &row.inner);
    let contiguous = |dims: &[usize], scale: usize| {
        let mut inner = scale;
        let mut out = vec![0; dims.len()];
        for d in (0..dims.len()).rev() {
            out[d] = inner;
            inner *= dims[d];
        }
        out
    };
    let wanted: Vec<usize> = if per_row {
        contiguous(outer, 1).into_iter().chain(std::iter::repeat_n(0, inner.len())).collect()
    } else {
        contiguous(outer, row.cols()).into_iter().chain(contiguous(inner, 1)).collect()
    };
    let same =
        |a: &[usize], b: &[usize], dims: &[usize]| a.iter().zip(b).zip(dims).all(|((x, y), &d)| d == 1 || x == y);
    let domain: Vec<usize> = outer.iter().chain(inner).copied().collect();
    (offset == 0 && same(strides, &wanted, &domain)).then_some(store.value)
}

/// `expr` with its operands renamed by `moved`.
fn remap(expr: &Expr, moved: &HashMap<usize, ValueId>) -> Expr {
    let m = |v: &ValueId| moved[&v.0];
    match expr {
        Expr::Cast { x } => Expr::Cast { x: m(x) },
        Expr::Unary { op, x } => Expr::Unary { op: *op, x: m(x) },
        Expr::Binary { op, a, b } => Expr::Binary { op: *op, a: m(a), b: m(b) },
        Expr::Where { cond, a, b } => Expr::Where { cond: m(cond), a: m(a), b: m(b) },
        other => unreachable!("operand values hold no {other:?}"),
    }
}

/// The id of a value `expr` of `dtype` in `body`: an equal one already there, else a new one.
fn intern(body: &mut Body, expr: Expr, dtype: DType) -> ValueId {
    let value = Value { expr, dtype };
    match body.values.iter().position(|v| *v == value) {
        Some(id) => ValueId(id),
        None => body.push(value.expr, value.dtype),
    }
}

/// Rewrites column kernel `kernel` to reduce the partials in `buffers` (one per reduction, each
/// `[groups, cols]` f32) over `groups` rows: each reduction folds its partials (a mean's sum is
/// divided by the rows it had), the per-column values stay, the operand values go.
fn reduce_partials(
    kernel: &mut Kernel,
    reductions: &[(ValueId, ReduceOp, ValueId)],
    buffers: &[BufferId],
    groups: usize,
) {
    let KernelKind::Column(col) = &mut kernel.kind else { unreachable!("only column kernels are rewritten") };
    let rows = col.rows();
    let reduced_rank = col.reduced.len();
    // What the stores need, up to the reductions (which read the partials now).
    let mut needed = vec![false; col.body.values.len()];
    for s in &col.body.stores {
        needed[s.value.0] = true;
    }
    for id in (0..col.body.values.len()).rev() {
        if needed[id] && !matches!(col.body.values[id].expr, Expr::Reduce { .. }) {
            for o in col.body.values[id].expr.operands() {
                needed[o.0] = true;
            }
        }
    }
    let kept_strides = {
        let mut inner = 1;
        let mut strides = vec![0; col.kept.len()];
        for d in (0..col.kept.len()).rev() {
            strides[d] = inner;
            inner *= col.kept[d];
        }
        strides
    };
    let cols = col.cols();
    let mut inputs: Vec<BufferId> = Vec::new();
    let slot_of = |b: BufferId, inputs: &mut Vec<BufferId>| match inputs.iter().position(|&x| x == b) {
        Some(slot) => slot,
        None => {
            inputs.push(b);
            inputs.len() - 1
        }
    };
    let mut body = Body::default();
    let mut moved: HashMap<usize, ValueId> = HashMap::new();
    for (id, value) in col.body.values.iter().enumerate() {
        if !needed[id] {
            continue;
        }
        let new = match &value.expr {
            Expr::Reduce { op, .. } => {
                let k = reductions.iter().position(|r| r.0 .0 == id).expect("every reduction is folded");
                let slot = slot_of(buffers[k], &mut inputs);
                let strides: Vec<usize> = std::iter::once(cols).chain(kept_strides.iter().copied()).collect();
                let partial = body.push(Expr::Load { input: slot, offset: 0, strides }, DType::F32);
                let fold = if *op == ReduceOp::Mean { ReduceOp::Sum } else { *op };
                let folded = body.push(Expr::Reduce { op: fold, x: partial }, DType::F32);
                if *op == ReduceOp::Mean {
                    let count = body.push(Expr::Const { value: Literal::Float(rows as f64) }, DType::F32);
                    body.push(Expr::Binary { op: BinaryOp::Div, a: folded, b: count }, DType::F32)
                } else {
                    folded
                }
            }
            Expr::Load { input, offset, strides } => {
                let slot = slot_of(kernel.inputs[*input], &mut inputs);
                let strides: Vec<usize> = std::iter::once(0).chain(strides[reduced_rank..].iter().copied()).collect();
                body.push(Expr::Load { input: slot, offset: *offset, strides }, value.dtype)
            }
            Expr::Const { value: c } => body.push(Expr::Const { value: *c }, value.dtype),
            expr => body.push(remap(expr, &moved), value.dtype),
        };
        moved.insert(id, new);
    }
    body.stores =
        col.body.stores.iter().map(|s| braze_plan::Store { value: moved[&s.value.0], output: s.output }).collect();
    col.body = body;
    col.reduced = vec![groups];
    kernel.inputs = inputs;
}

#[cfg(test)]
mod tests {
    use super::restride;

    #[test]
    fn restride_moves_linear_views_between_shapes() {
        assert_eq!(restride(&[16, 64], &[64, 1], &[1024]), Some(vec![1]));
        assert_eq!(restride(&[1024], &[3], &[16, 64]), Some(vec![192, 3]));
        assert_eq!(restride(&[16, 64], &[0, 0], &[1024]), Some(vec![0]));
        assert_eq!(restride(&[16, 1, 64], &[64, 7, 1], &[1024]), Some(vec![1]));
        // A transposed view is no run of one stride.
        assert_eq!(restride(&[16, 64], &[1, 16], &[1024]), None);
        // Broadcast along one dim only.
        assert_eq!(restride(&[16, 64], &[0, 1], &[1024]), None);
    }
}
