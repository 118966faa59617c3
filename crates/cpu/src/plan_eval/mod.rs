//! The plan interpreter: runs a fused [`Plan`] kernel by kernel, each family by its own loop
//! structure and with f32 float math, the way the generated GPU code does. Comparing its results
//! with [`crate::eval_graph`] tests fusion's indexing, broadcasting and reductions without a GPU.
//!
//! Values follow plan.rs: floats live in f32 whatever their dtype (f16/bf16 loads widen, a cast
//! to f16/bf16 rounds, a store narrows); integers compute in their own width (i64 wrapped to
//! i32 for i32 values); bools are bools.

mod attention;
mod column;

use crate::scalar;
use crate::{CpuError, Result};
use braze_ir::elementwise::{nan_max, nan_min, Elem};
use braze_ir::rounding::i64_to_f32_round_to_odd;
use braze_ir::{DType, HostData, HostTensor, Literal, ReduceOp};
use braze_plan::{
    Body, BufferRole, Concat, Expr, Kernel, KernelKind, MatMul, MultiReduce, Plan, Pointwise, RowKernel, ValueId,
};
use half::{bf16, f16};
use std::borrow::Cow;

/// Runs `plan` on `inputs` (graph input `i` is `inputs[i]`) and returns the plan's outputs in
/// order, each with the shape its [`braze_plan::PlanOutput`] gives.
///
/// The plan is validated first ([`Plan::validate`]); a plan that breaks a rule is a
/// [`CpuError::InvalidPlan`] naming the kernel and the rule, and the loops below rely on the
/// rules (slots, dtypes, load bounds, sizes) without checking again. Intermediate buffers are
/// dropped after their last reader. An in-place output ([`BufferRole::InPlace`]) is returned like
/// any other, for the caller to store into its input's memory: the plan's rules make that the same
/// as the GPU executor writing it there while the plan runs (no kernel reads the input after).
pub fn eval_plan(plan: &Plan, inputs: &[HostTensor]) -> Result<Vec<HostTensor>> {
    eval_plan_observed(plan, inputs, &mut |_, _, _| {})
}

/// As [`eval_plan`], telling `observe` each kernel's index and when it started and finished
/// (the CPU backend's device spans on a timeline).
pub fn eval_plan_observed(
    plan: &Plan,
    inputs: &[HostTensor],
    observe: &mut dyn FnMut(usize, std::time::Instant, std::time::Instant),
) -> Result<Vec<HostTensor>> {
    plan.validate()?;
    if inputs.len() != plan.inputs.len() {
        return Err(CpuError::Arity { expected: plan.inputs.len(), actual: inputs.len() });
    }
    let mut buffers: Vec<Option<Cow<'_, HostData>>> = vec![None; plan.buffers.len()];
    for (index, (&id, given)) in plan.inputs.iter().zip(inputs).enumerate() {
        let buffer = plan.buffer(id);
        if buffer.dtype != given.dtype() || buffer.numel != given.numel() {
            return Err(CpuError::InputMismatch {
                index,
                expected: format!("{} with {} elements", buffer.dtype, buffer.numel),
                actual: format!("{}{}", given.dtype(), given.shape()),
            });
        }
        buffers[id.0] = Some(Cow::Borrowed(given.data()));
    }

    // Kernel index after which each intermediate is no longer read.
    let mut last_reader: Vec<Option<usize>> = vec![None; plan.buffers.len()];
    for (k, kernel) in plan.kernels.iter().enumerate() {
        for &id in &kernel.inputs {
            if let Some(slot) = last_reader.get_mut(id.0) {
                *slot = Some(k);
            }
        }
    }

    // The first out-of-range index of each check, raised as the GPU's flags are.
    let mut raised: Vec<Option<i64>> = vec![None; plan.checks.len()];
    for (k, kernel) in plan.kernels.iter().enumerate() {
        let started = std::time::Instant::now();
        let outputs = {
            let reads: Vec<&HostData> = kernel
                .inputs
                .iter()
                .map(|&id| buffers[id.0].as_deref().expect("validated: read after write"))
                .collect();
            run_kernel(plan, kernel, &reads, &mut raised)
        };
        observe(k, started, std::time::Instant::now());
        for (slot, (&id, data)) in kernel.outputs.iter().zip(outputs).enumerate() {
            let buffer = plan.buffer(id);
            let Some(part) = plan.output_part(kernel, slot) else {
                buffers[id.0] = Some(Cow::Owned(data));
                continue;
            };
            // One of several writers side by side: only its columns are its own.
            let mut whole = buffers[id.0].take().map_or_else(|| zeros(buffer.dtype, buffer.numel), Cow::into_owned);
            for row in 0..part.rows {
                for column in part.first..part.first + part.width {
                    let index = row * part.row_stride + column;
                    store(&mut whole, index, load(&data, index));
                }
            }
            buffers[id.0] = Some(Cow::Owned(whole));
        }
        for (index, reader) in last_reader.iter().enumerate() {
            if *reader == Some(k) && plan.buffers[index].role == BufferRole::Intermediate {
                buffers[index] = None;
            }
        }
    }

    if let Some((check, index)) = plan.checks.iter().zip(&raised).find_map(|(c, r)| r.map(|i| (c, i))) {
        let op = match &check.loc {
            Some(loc) => format!("{} at {loc}", check.op),
            None => check.op.clone(),
        };
        return Err(CpuError::IndexOutOfRange { op, index, bound: check.bound });
    }
    let outputs = plan
        .outputs
        .iter()
        .map(|output| {
            let data = buffers[output.buffer.0].as_deref().expect("validated: outputs are written");
            HostTensor::new(output.shape.clone(), data.clone()).expect("validated: output sizes")
        })
        .collect();
    Ok(outputs)
}

/// Runs kernel `k` of `plan` as [`eval_plan`] does, on the data of its input slots, returning
/// the data of its output slots (for a backend that runs the plan's other kernels elsewhere);
/// an out-of-range gather index is clamped and not reported.
///
/// # Panics
/// If `k` is not a kernel of `plan` or `inputs` does not hold one entry per input slot.
pub fn eval_kernel(plan: &Plan, k: usize, inputs: &[&HostData]) -> Vec<HostData> {
    let kernel = &plan.kernels[k];
    assert_eq!(inputs.len(), kernel.inputs.len(), "one input per slot of kernel {}", kernel.name);
    run_kernel(plan, kernel, inputs, &mut vec![None; plan.checks.len()])
}

/// Runs one kernel on the data of its input slots and returns the data of its output slots.
fn run_kernel(plan: &Plan, kernel: &Kernel, inputs: &[&HostData], raised: &mut [Option<i64>]) -> Vec<HostData> {
    let mut outputs: Vec<HostData> = kernel
        .outputs
        .iter()
        .map(|&id| {
            let buffer = plan.buffer(id);
            zeros(buffer.dtype, buffer.numel)
        })
        .collect();
    match &kernel.kind {
        KernelKind::Pointwise(pointwise) => run_pointwise(pointwise, inputs, &mut outputs, raised),
        KernelKind::Row(row) => run_row(row, inputs, &mut outputs),
        KernelKind::MultiReduce(multi) => run_multi_reduce(multi, inputs, &mut outputs),
        KernelKind::MatMul(matmul) => run_matmul(matmul, inputs, &mut outputs),
        KernelKind::Concat(concat) => run_concat(concat, inputs, &mut outputs),
        KernelKind::Column(column) => column::run_column(column, inputs, &mut outputs),
        // Members are independent and store to slots of their own: each runs as the pointwise
        // kernel it was (the GPU's tiles of a member cover the same elements in another order).
        KernelKind::MultiPointwise(multi) => {
            for member in &multi.members {
                run_pointwise(member, inputs, &mut outputs, raised);
            }
        }
        KernelKind::Attention(att) => attention::run_attention(att, inputs, &mut outputs),
        KernelKind::AttentionBackward(back) => attention::run_attention_backward(back, inputs, &mut outputs),
        KernelKind::IndexAdd(index_add) => run_index_add(index_add, inputs, &mut outputs),
    }
    outputs
}

// ---------------------------------------------------------------------------------------------
// Values

/// A value in registers: floats in f32, integers in i64 (already wrapped to their dtype).
type Val = Elem<f32>;

/// The float inside; callers have checked the dtype is a float.
fn float_of(value: Val) -> f32 {
    match value {
        Val::Float(x) => x,
        other => unreachable!("{other:?} where the dtype check promised a float"),
    }
}

/// Storage of `dtype` holding `numel` zeros.
fn zeros(dtype: DType, numel: usize) -> HostData {
    match dtype {
        DType::F32 => HostData::F32(vec![0.0; numel]),
        DType::F16 => HostData::F16(vec![f16::ZERO; numel]),
        DType::BF16 => HostData::BF16(vec![bf16::ZERO; numel]),
        DType::I32 => HostData::I32(vec![0; numel]),
        DType::I64 => HostData::I64(vec![0; numel]),
        DType::Bool => HostData::Bool(vec![false; numel]),
    }
}

/// Loads element `i`, widening f16/bf16 to f32.
fn load(data: &HostData, i: usize) -> Val {
    match data {
        HostData::F32(v) => Val::Float(v[i]),
        HostData::F16(v) => Val::Float(v[i].to_f32()),
        HostData::BF16(v) => Val::Float(v[i].to_f32()),
        HostData::I32(v) => Val::Int(v[i] as i64),
        HostData::I64(v) => Val::Int(v[i]),
        HostData::Bool(v) => Val::Bool(v[i]),
    }
}

/// Stores `value` at element `i`, narrowing to the storage's dtype (the dtypes were checked
/// to agree).
fn store(data: &mut HostData, i: usize, value: Val) {
    match (data, value) {
        (HostData::F32(v), Val::Float(x)) => v[i] = x,
        (HostData::F16(v), Val::Float(x)) => v[i] = f16::from_f32(x),
        (HostData::BF16(v), Val::Float(x)) => v[i] = bf16::from_f32(x),
        (HostData::I32(v), Val::Int(x)) => v[i] = x as i32,
        (HostData::I64(v), Val::Int(x)) => v[i] = x,
        (HostData::Bool(v), Val::Bool(b)) => v[i] = b,
        (d, v) => unreachable!("storing {v:?} into {} storage after the dtype check", d.dtype()),
    }
}

/// Converts to `dtype` with cast semantics, in registers: f16/bf16 round but stay f32.
fn cast(value: Val, dtype: DType) -> Val {
    let as_float = match value {
        Val::Float(x) => x,
        Val::Int(x) => x as f32,
        Val::Bool(b) => b as u8 as f32,
    };
    let to_narrow = match value {
        Val::Int(x) => i64_to_f32_round_to_odd(x),
        _ => as_float,
    };
    match dtype {
        DType::F32 => Val::Float(as_float),
        DType::F16 => Val::Float(f16::from_f32(to_narrow).to_f32()),
        DType::BF16 => Val::Float(bf16::from_f32(to_narrow).to_f32()),
        DType::I32 => Val::Int(match value {
            Val::Float(x) => x as i32 as i64,
            Val::Int(x) => x as i32 as i64,
            Val::Bool(b) => b as i64,
        }),
        DType::I64 => Val::Int(match value {
            Val::Float(x) => x as i64,
            Val::Int(x) => x,
            Val::Bool(b) => b as i64,
        }),
        DType::Bool => Val::Bool(match value {
            Val::Float(x) => x != 0.0,
            Val::Int(x) => x != 0,
            Val::Bool(b) => b,
        }),
    }
}

/// An f16/bf16 value as an op that [`Expr::observes_rounded_operands`] reads it: rounded to its
/// dtype.
fn observed(value: Val, dtype: DType) -> Val {
    match (value, dtype) {
        (Val::Float(x), DType::BF16) => Val::Float(bf16::from_f32(x).to_f32()),
        (Val::Float(x), DType::F16) => Val::Float(f16::from_f32(x).to_f32()),
        _ => value,
    }
}

/// Wraps an integer result to its dtype's width; other values are already in form.
fn settle(value: Val, dtype: DType) -> Val {
    match (value, dtype) {
        (Val::Int(x), DType::I32) => Val::Int(x as i32 as i64),
        _ => value,
    }
}

/// Constants, casts, unary, binary and where on already computed operands of `body` (`arg`
/// looks them up); the value's dtype was checked against its operands before the kernel ran.
/// Operands are read rounded where [`Expr::observes_rounded_operands`] says so.
fn compute(body: &Body, expr: &Expr, dtype: DType, arg: impl Fn(ValueId) -> Val) -> Val {
    let round = expr.observes_rounded_operands();
    let operand = |x: ValueId| if round { observed(arg(x), body.values[x.0].dtype) } else { arg(x) };
    let value = match expr {
        Expr::Const { value } => return cast_const(*value, dtype),
        Expr::Cast { x } => return cast(operand(*x), dtype),
        Expr::Unary { op, x } => op.eval_f32(operand(*x)),
        Expr::Binary { op, a, b } => op.eval_f32(operand(*a), operand(*b)),
        Expr::Where { cond, a, b } => match arg(*cond) {
            Val::Bool(true) => arg(*a),
            _ => arg(*b),
        },
        Expr::Load { .. } | Expr::Gather { .. } | Expr::Index | Expr::Reduce { .. } => {
            unreachable!("loads, gathers, indices and reductions are evaluated by the kernel loop")
        }
    };
    settle(value, dtype)
}

/// The constant `c` as a value of `dtype` (cast semantics from the exact f64).
fn cast_const(c: Literal, dtype: DType) -> Val {
    let mut one = crate::scalar::empty_data(dtype, 1);
    scalar::push(&mut one, c);
    load(&one, 0)
}

/// Folds `values` into a result of `dtype` with a reduction in registers: f32 sums as a tree
/// ([`tree_sum`]), NaN-propagating max/min, integer and bool sums in i64 (wrapping), any/all on
/// bools. `Mean` divides the sum by `count` (NaN when 0).
fn reduce(op: ReduceOp, dtype: DType, count: usize, values: impl Iterator<Item = Val>) -> Val {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => {
            let floats = values.map(|v| {
                let Val::Float(x) = v else { unreachable!("float reduction over {v:?}") };
                x
            });
            let total = match op {
                ReduceOp::Sum | ReduceOp::Mean => tree_sum(&floats.collect::<Vec<f32>>()),
                ReduceOp::Max => floats.fold(f32::NEG_INFINITY, nan_max),
                ReduceOp::Min => floats.fold(f32::INFINITY, nan_min),
            };
            Val::Float(if op == ReduceOp::Mean { total / count as f32 } else { total })
        }
        DType::I32 | DType::I64 => {
            let total = values.fold(op.int_identity(dtype), |acc, v| {
                let x = match v {
                    Val::Int(x) => x,
                    Val::Bool(b) => b.into(),
                    Val::Float(_) => unreachable!("integer reduction over {v:?}"),
                };
                op.combine_int(acc, x)
            });
            settle(Val::Int(total), dtype)
        }
        DType::Bool => {
            let any = op == ReduceOp::Max;
            Val::Bool(values.fold(!any, |acc, v| {
                let Val::Bool(b) = v else { unreachable!("bool reduction over {v:?}") };
                if any {
                    acc || b
                } else {
                    acc && b
                }
            }))
        }
    }
}

/// Most elements a GPU thread sums in order before its partial joins a tree.
const SUM_LEAF: usize = 8;

/// An f32 sum the way the kernels form one: short runs in order, from +0.0 (so `-0.0` sums to
/// +0.0), then partials combined pairwise (the warp butterflies and the block's warp partials).
/// The error grows with the log of the length, as on the GPU; an in-order sum of a row of
/// thousands would be less accurate than the kernels it models.
fn tree_sum(values: &[f32]) -> f32 {
    if values.len() <= SUM_LEAF {
        return values.iter().fold(0.0f32, |acc, &x| acc + x);
    }
    let (left, right) = values.split_at(values.len() / 2);
    tree_sum(left) + tree_sum(right)
}

// ---------------------------------------------------------------------------------------------
// Index math

/// Row-major coordinate of `flat` within `dims`, written into `coord`.
fn unravel_into(mut flat: usize, dims: &[usize], coord: &mut [usize]) {
    for d in (0..dims.len()).rev() {
        coord[d] = flat % dims[d];
        flat /= dims[d];
    }
}

fn dot(coord: &[usize], strides: &[usize]) -> usize {
    coord.iter().zip(strides).map(|(c, s)| c * s).sum()
}

// ---------------------------------------------------------------------------------------------
// Kernel families

/// One thread per flat index of the domain: unravel it, compute each load's offset from its
/// strides, evaluate the body, store at the flat index.
fn run_pointwise(pointwise: &Pointwise, inputs: &[&HostData], outputs: &mut [HostData], raised: &mut [Option<i64>]) {
    let dims = pointwise.shape.dims();
    let numel = pointwise.shape.numel();
    let body = &pointwise.body;
    let mut coord = vec![0; dims.len()];
    let mut values: Vec<Val> = Vec::with_capacity(body.values.len());
    for flat in 0..numel {
        unravel_into(flat, dims, &mut coord);
        values.clear();
        for value in &body.values {
            let v = match &value.expr {
                Expr::Load { input, offset, strides } => load(inputs[*input], offset + dot(&coord, strides)),
                Expr::Index => cast_const(Literal::Int(flat as i64), value.dtype),
                Expr::Gather { input, offset, strides, index, index_stride, bound, check } => {
                    let Val::Int(i) = values[index.0] else { unreachable!("validated: integer indices") };
                    if i < 0 || i as u64 >= *bound as u64 {
                        raised[*check].get_or_insert(i);
                    }
                    match (*bound as i64 - 1).max(-1) {
                        -1 => cast_const(Literal::Int(0), value.dtype),
                        last => {
                            let at = i.clamp(0, last) as usize;
                            load(inputs[*input], offset + dot(&coord, strides) + at * index_stride)
                        }
                    }
                }
                expr => compute(body, expr, value.dtype, |id| values[id.0]),
            };
            values.push(v);
        }
        for s in &body.stores {
            store(&mut outputs[s.output], flat, values[s.value.0]);
        }
    }
}

/// Slice `j` of the source added at `indices[j]`, in the order of `j`, from zero: in f32 for
/// floats and rounded to an f16/bf16 dtype once at the end, wrapping for integers, as the GPU
/// kernel's lane sums each output element in registers and stores it once; indices outside
/// `0..size` add nothing.
fn run_index_add(ia: &braze_plan::IndexAdd, inputs: &[&HostData], outputs: &mut [HostData]) {
    let (src, indices) = (inputs[0], inputs[1]);
    let mut acc: Vec<Val> = vec![cast_const(Literal::Int(0), ia.dtype); ia.outer * ia.size * ia.inner];
    for o in 0..ia.outer {
        for j in 0..ia.indices {
            let Val::Int(at) = load(indices, j) else { unreachable!("validated: integer indices") };
            if at < 0 || at as u64 >= ia.size as u64 {
                continue;
            }
            for i in 0..ia.inner {
                let slot = &mut acc[(o * ia.size + at as usize) * ia.inner + i];
                *slot = match (*slot, load(src, (o * ia.indices + j) * ia.inner + i)) {
                    // f32 addition: an f16/bf16 value widens exactly.
                    (Val::Float(a), Val::Float(b)) => Val::Float(a + b),
                    (Val::Int(a), Val::Int(b)) => settle(Val::Int(a.wrapping_add(b)), ia.dtype),
                    (a, b) => unreachable!("validated: adding {b:?} to {a:?}"),
                };
            }
        }
    }
    // `store` rounds each f32 sum to the dtype.
    for (i, v) in acc.into_iter().enumerate() {
        store(&mut outputs[0], i, v);
    }
}

/// A row kernel's value within the current row: one per row, or one per column.
enum Lane {
    Row(Val),
    Cols(Vec<Val>),
}

impl Lane {
    fn at(&self, col: usize) -> Val {
        match self {
            Lane::Row(v) => *v,
            Lane::Cols(v) => v[col],
        }
    }
}

/// One block per row: per-row values are computed once, per-element values for every column,
/// and each reduction folds its operand over the row's columns in f32 (sums as trees). Partials
/// fold their values over each group's rows, column by column, in f32 (sums as trees).
fn run_row(row_kernel: &RowKernel, inputs: &[&HostData], outputs: &mut [HostData]) {
    let outer_rank = row_kernel.outer.len();
    let (rows, cols) = (row_kernel.rows(), row_kernel.cols());
    let body = &row_kernel.body;
    let per_row = body.row_values(outer_rank);
    // For each partial and column: the values of the current group's rows so far.
    let mut pending: Vec<Vec<Vec<Val>>> = vec![vec![Vec::new(); cols]; row_kernel.partials.len()];

    let mut outer_coord = vec![0; outer_rank];
    let mut inner_coord = vec![0; row_kernel.inner.len()];
    let mut lanes: Vec<Lane> = Vec::with_capacity(body.values.len());
    for row in 0..rows {
        unravel_into(row, &row_kernel.outer, &mut outer_coord);
        lanes.clear();
        for (i, value) in body.values.iter().enumerate() {
            let lane = match &value.expr {
                Expr::Load { input, offset, strides } => {
                    let row_base = offset + dot(&outer_coord, &strides[..outer_rank]);
                    if per_row[i] {
                        Lane::Row(load(inputs[*input], row_base))
                    } else {
                        Lane::Cols(
                            (0..cols)
                                .map(|col| {
                                    unravel_into(col, &row_kernel.inner, &mut inner_coord);
                                    load(inputs[*input], row_base + dot(&inner_coord, &strides[outer_rank..]))
                                })
                                .collect(),
                        )
                    }
                }
                Expr::Reduce { op, x } => {
                    let operand = &lanes[x.0];
                    Lane::Row(reduce(*op, value.dtype, cols, (0..cols).map(|col| operand.at(col))))
                }
                expr if per_row[i] => Lane::Row(compute(body, expr, value.dtype, |id| lanes[id.0].at(0))),
                expr => Lane::Cols(
                    (0..cols).map(|col| compute(body, expr, value.dtype, |id| lanes[id.0].at(col))).collect(),
                ),
            };
            lanes.push(lane);
        }
        for s in &body.stores {
            match &lanes[s.value.0] {
                Lane::Row(v) => store(&mut outputs[s.output], row, *v),
                Lane::Cols(values) => {
                    for (col, v) in values.iter().enumerate() {
                        store(&mut outputs[s.output], row * cols + col, *v);
                    }
                }
            }
        }
        for (p, partial) in row_kernel.partials.iter().enumerate() {
            for (col, held) in pending[p].iter_mut().enumerate() {
                held.push(lanes[partial.value.0].at(col));
            }
            if (row + 1) % row_kernel.partial_rows == 0 || row + 1 == rows {
                let group = row / row_kernel.partial_rows;
                for (col, held) in pending[p].iter_mut().enumerate() {
                    let folded = reduce(partial.op, DType::F32, held.len(), held.drain(..));
                    store(&mut outputs[partial.output], group * cols + col, folded);
                }
            }
        }
    }
}

/// K full reductions: item `i` runs its reduction's prologue on each element of its leaves (the
/// kernel inputs from its first one on) and folds the last prologue value in f32 for floats
/// (sums as trees, as the kernels form them); then the epilogue runs once over the K results and
/// its element stores write the outputs.
fn run_multi_reduce(multi: &MultiReduce, inputs: &[&HostData], outputs: &mut [HostData]) {
    let mut results: Vec<Val> = Vec::with_capacity(multi.items.len());
    let (firsts, _) = multi.first_inputs().expect("validated: every item runs a reduction");
    for (item, &first) in multi.items.iter().zip(&firsts) {
        let reduction = &multi.reductions[item.reduction];
        let leaves = &inputs[first..first + reduction.leaves];
        let prologue = &reduction.prologue;
        let mut values: Vec<Val> = Vec::with_capacity(prologue.values.len());
        let element = |index: usize, values: &mut Vec<Val>| {
            values.clear();
            for value in &prologue.values {
                let v = match &value.expr {
                    Expr::Load { input, offset, strides } => load(leaves[*input], offset + index * strides[0]),
                    expr => compute(prologue, expr, value.dtype, |id| values[id.0]),
                };
                values.push(v);
            }
            *values.last().expect("validated: the prologue has values")
        };
        let elements = (0..item.len).map(|index| element(index, &mut values));
        results.push(reduce(reduction.op, reduction.result_dtype(), item.len, elements));
    }
    let mut values: Vec<Val> = Vec::with_capacity(multi.epilogue.values.len());
    for value in &multi.epilogue.values {
        let v = match &value.expr {
            Expr::Load { input, .. } => results[*input],
            expr => compute(&multi.epilogue, expr, value.dtype, |id| values[id.0]),
        };
        values.push(v);
    }
    for s in &multi.stores {
        store(&mut outputs[s.output], s.index, values[s.value.0]);
    }
}

/// `out[b] = act(A[b] @ B[b] + bias)`: every dot product accumulates in f32 over k in order.
fn run_matmul(mm: &MatMul, inputs: &[&HostData], outputs: &mut [HostData]) {
    let batches: usize = mm.batch.iter().product();
    let (m, n, k) = (mm.m, mm.n, mm.k);
    let (a, b) = (inputs[0], inputs[1]);
    let bias = if mm.bias { Some(inputs[2]) } else { None };
    let a_at = |batch: usize, i: usize, p: usize| {
        let within = if mm.a_transposed { p * m + i } else { i * k + p };
        load(a, batch * mm.a_batch_stride + within)
    };
    let b_at = |batch: usize, p: usize, j: usize| {
        let within = if mm.b_transposed { j * k + p } else { p * n + j };
        load(b, batch * mm.b_batch_stride + within)
    };
    for batch in 0..batches {
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0f32;
                for p in 0..k {
                    acc += float_of(a_at(batch, i, p)) * float_of(b_at(batch, p, j));
                }
                if let Some(bias) = bias {
                    acc += float_of(load(bias, j));
                }
                let y = match mm.activation {
                    None => acc,
                    Some(op) => float_of(op.eval_f32(Val::Float(acc))),
                };
                store(&mut outputs[0], (batch * m + i) * n + j, Val::Float(y));
            }
        }
    }
}

/// Copies each input's block along `axis` into place, for every position before the axis.
fn run_concat(concat: &Concat, inputs: &[&HostData], outputs: &mut [HostData]) {
    let dims = concat.shape.dims();
    let outer: usize = dims[..concat.axis].iter().product();
    let inner: usize = dims[concat.axis + 1..].iter().product();
    let out = &mut outputs[0];
    let mut position = 0;
    for o in 0..outer {
        for (data, &extent) in inputs.iter().zip(&concat.extents) {
            let block = extent * inner;
            for e in 0..block {
                store(out, position, load(data, o * block + e));
                position += 1;
            }
        }
    }
}
