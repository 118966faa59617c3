//! The column kernel family in the plan interpreter: reductions over leading axes, folded in the
//! fixed order the GPU kernels use. Each column's rows are cut into chunks of
//! [`ROWS_PER_CHUNK`]; a chunk folds its rows in order into a partial, and the partials are
//! combined in chunk order, so the same plan gives the same bits on every run (the GPU sizes its
//! chunks by launch config, so the two agree within tolerance, not bit for bit).

use super::{compute, dot, load, reduce, store, unravel_into, Val};
use braze_ir::{HostData, ReduceOp};
use braze_plan::{ColumnKernel, Expr};

/// Rows folded into one partial before partials are combined.
const ROWS_PER_CHUNK: usize = 256;

/// For each column: the prologue over every row, each reduction folded chunk by chunk, then the
/// epilogue (the per-column values) and the stores of the column's element.
pub(super) fn run_column(column: &ColumnKernel, inputs: &[&HostData], outputs: &mut [HostData]) {
    let body = &column.body;
    let reduced_rank = column.reduced.len();
    let (rows, cols) = (column.rows(), column.cols());
    let per_column = body.column_values(reduced_rank);
    // Values computed from a reduction exist only once the rows are folded.
    let mut after_reduce = vec![false; body.values.len()];
    for (i, value) in body.values.iter().enumerate() {
        after_reduce[i] =
            matches!(value.expr, Expr::Reduce { .. }) || value.expr.operands().iter().any(|o| after_reduce[o.0]);
    }
    let reductions: Vec<(usize, ReduceOp, usize)> = body
        .values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| match v.expr {
            Expr::Reduce { op, x } => Some((i, op, x.0)),
            _ => None,
        })
        .collect();

    let mut row_coord = vec![0; reduced_rank];
    let mut col_coord = vec![0; column.kept.len()];
    let mut values: Vec<Val> = vec![Val::Bool(false); body.values.len()];
    let evaluate = |values: &mut Vec<Val>, row_coord: &[usize], col_coord: &[usize], which: &dyn Fn(usize) -> bool| {
        for (i, value) in body.values.iter().enumerate() {
            if !which(i) {
                continue;
            }
            values[i] = match &value.expr {
                Expr::Load { input, offset, strides } => load(
                    inputs[*input],
                    offset + dot(row_coord, &strides[..reduced_rank]) + dot(col_coord, &strides[reduced_rank..]),
                ),
                Expr::Reduce { .. } => values[i],
                expr => compute(body, expr, value.dtype, |id| values[id.0]),
            };
        }
    };
    for col in 0..cols {
        unravel_into(col, &column.kept, &mut col_coord);
        let mut partials: Vec<Vec<Val>> = vec![Vec::new(); reductions.len()];
        for start in (0..rows).step_by(ROWS_PER_CHUNK) {
            let end = (start + ROWS_PER_CHUNK).min(rows);
            let mut chunk: Vec<Vec<Val>> = vec![Vec::with_capacity(end - start); reductions.len()];
            for row in start..end {
                unravel_into(row, &column.reduced, &mut row_coord);
                evaluate(&mut values, &row_coord, &col_coord, &|i| !after_reduce[i]);
                for (k, &(_, _, x)) in reductions.iter().enumerate() {
                    chunk[k].push(values[x]);
                }
            }
            for (k, &(id, op, _)) in reductions.iter().enumerate() {
                // A mean's chunks are sums; the total is divided by every row once.
                let partial_op = if op == ReduceOp::Mean { ReduceOp::Sum } else { op };
                let partial = reduce(partial_op, body.values[id].dtype, end - start, chunk[k].drain(..));
                partials[k].push(partial);
            }
        }
        for (k, &(id, op, _)) in reductions.iter().enumerate() {
            values[id] = reduce(op, body.values[id].dtype, rows, partials[k].drain(..));
        }
        // Per-column values read no row: their loads have zero strides on the reduced dims.
        row_coord.fill(0);
        evaluate(&mut values, &row_coord, &col_coord, &|i| per_column[i]);
        for s in &body.stores {
            store(&mut outputs[s.output], col, values[s.value.0]);
        }
    }
}
