//! The validator, rule by rule: a small valid plan of each kernel family passes, and each
//! mutation that breaks one rule is rejected with that rule (a test cannot pass because some
//! other rule fired first).

use braze_ir::{BinaryOp, DType, Literal, ReduceOp, Shape, UnaryOp};
use braze_plan::{
    Body, Buffer, BufferId, BufferRole, ColumnKernel, Concat, ElementStore, Expr, ItemReduction, Kernel, KernelKind,
    MatMul, MultiReduce, Plan, PlanError, PlanOutput, Pointwise, ReduceItem, RowKernel, Rule, Store, ValueId,
};

const F: DType = DType::F32;

/// Validates `plan`: `None` expects it valid, `Some(rule)` expects exactly that rule broken.
fn check(plan: &Plan, expect: Option<Rule>) {
    let got = plan.validate().err();
    assert_eq!(got.as_ref().and_then(PlanError::rule), expect, "{got:?}");
    if let Some(err) = got {
        // The message names where and which rule.
        let text = err.to_string();
        assert!(text.starts_with("invalid plan: ") && text.ends_with(&format!("[{}]", expect.unwrap())), "{text}");
    }
}

fn buffer(dtype: DType, numel: usize, role: BufferRole) -> Buffer {
    Buffer { dtype, numel, role }
}

fn ids(b: &[usize]) -> Vec<BufferId> {
    b.iter().map(|&b| BufferId(b)).collect()
}

fn kernel(name: &str, kind: KernelKind, inputs: &[usize], outputs: &[usize]) -> Kernel {
    Kernel { name: name.into(), kind, inputs: ids(inputs), outputs: ids(outputs), sources: vec![] }
}

fn output(buffer: usize, dims: &[usize]) -> PlanOutput {
    PlanOutput { buffer: BufferId(buffer), shape: Shape::new(dims.to_vec()) }
}

fn load(body: &mut Body, input: usize, offset: usize, strides: &[usize], dtype: DType) -> ValueId {
    body.push(Expr::Load { input, offset, strides: strides.to_vec() }, dtype)
}

/// `b1 = exp(b0)` over `[2, 3]`.
fn pointwise() -> Plan {
    let mut body = Body::default();
    let x = load(&mut body, 0, 0, &[3, 1], F);
    let y = body.push(Expr::Unary { op: UnaryOp::Exp, x }, F);
    body.stores.push(Store { value: y, output: 0 });
    Plan {
        checks: Vec::new(),
        buffers: vec![buffer(F, 6, BufferRole::Input(0)), buffer(F, 6, BufferRole::Output)],
        inputs: ids(&[0]),
        outputs: vec![output(1, &[2, 3])],
        kernels: vec![kernel(
            "pointwise_exp",
            KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![2, 3]), body }),
            &[0],
            &[1],
        )],
    }
}

fn pointwise_body(plan: &mut Plan) -> &mut Body {
    match &mut plan.kernels[0].kind {
        KernelKind::Pointwise(pw) => &mut pw.body,
        _ => unreachable!(),
    }
}

/// `b1 = b0.sum(1)` and `b2 = b0 - b1[:, None]` over rows of `[2, 3]`.
fn row() -> Plan {
    let mut body = Body::default();
    let x = load(&mut body, 0, 0, &[3, 1], F);
    let s = body.push(Expr::Reduce { op: ReduceOp::Sum, x }, F);
    let d = body.push(Expr::Binary { op: BinaryOp::Sub, a: x, b: s }, F);
    body.stores.push(Store { value: s, output: 0 });
    body.stores.push(Store { value: d, output: 1 });
    Plan {
        checks: Vec::new(),
        buffers: vec![
            buffer(F, 6, BufferRole::Input(0)),
            buffer(F, 2, BufferRole::Output),
            buffer(F, 6, BufferRole::Output),
        ],
        inputs: ids(&[0]),
        outputs: vec![output(1, &[2]), output(2, &[2, 3])],
        kernels: vec![kernel("row_sum", KernelKind::Row(RowKernel::new(vec![2], vec![3], body)), &[0], &[1, 2])],
    }
}

fn row_kernel(plan: &mut Plan) -> &mut RowKernel {
    match &mut plan.kernels[0].kind {
        KernelKind::Row(row) => row,
        _ => unreachable!(),
    }
}

/// `b2 = [sum(b0 * b0), sum(b1 * b1)]`: one reduction, its results stacked.
fn multi_reduce() -> Plan {
    let mut prologue = Body::default();
    let x = load(&mut prologue, 0, 0, &[1], F);
    prologue.push(Expr::Binary { op: BinaryOp::Mul, a: x, b: x }, F);
    let mut epilogue = Body::default();
    let r0 = epilogue.push(MultiReduce::result_load(0), F);
    let r1 = epilogue.push(MultiReduce::result_load(1), F);
    let mr = MultiReduce {
        reductions: vec![ItemReduction { op: ReduceOp::Sum, dtype: F, leaves: 1, prologue }],
        items: vec![ReduceItem { reduction: 0, len: 3 }, ReduceItem { reduction: 0, len: 5 }],
        epilogue,
        stores: vec![ElementStore { value: r0, output: 0, index: 0 }, ElementStore { value: r1, output: 0, index: 1 }],
    };
    Plan {
        checks: Vec::new(),
        buffers: vec![
            buffer(F, 3, BufferRole::Input(0)),
            buffer(F, 5, BufferRole::Input(1)),
            buffer(F, 2, BufferRole::Output),
        ],
        inputs: ids(&[0, 1]),
        outputs: vec![output(2, &[2])],
        kernels: vec![kernel("multi_reduce_sum", KernelKind::MultiReduce(mr), &[0, 1], &[2])],
    }
}

/// `b2 = sum(b0 * b0) + f32(any(b1))`, `b3 = any(b1)`: two reductions, a computing epilogue.
fn multi_reduce_epilogue() -> Plan {
    let mut squares = Body::default();
    let x = load(&mut squares, 0, 0, &[1], F);
    squares.push(Expr::Binary { op: BinaryOp::Mul, a: x, b: x }, F);
    let mut any = Body::default();
    load(&mut any, 0, 0, &[1], DType::Bool);
    let mut epilogue = Body::default();
    let s = epilogue.push(MultiReduce::result_load(0), F);
    let b = epilogue.push(MultiReduce::result_load(1), DType::Bool);
    let bf = epilogue.push(Expr::Cast { x: b }, F);
    let total = epilogue.push(Expr::Binary { op: BinaryOp::Add, a: s, b: bf }, F);
    let mr = MultiReduce {
        reductions: vec![
            ItemReduction { op: ReduceOp::Sum, dtype: F, leaves: 1, prologue: squares },
            ItemReduction { op: ReduceOp::Max, dtype: DType::Bool, leaves: 1, prologue: any },
        ],
        items: vec![ReduceItem { reduction: 0, len: 3 }, ReduceItem { reduction: 1, len: 0 }],
        epilogue,
        stores: vec![
            ElementStore { value: total, output: 0, index: 0 },
            ElementStore { value: b, output: 1, index: 0 },
        ],
    };
    Plan {
        checks: Vec::new(),
        buffers: vec![
            buffer(F, 3, BufferRole::Input(0)),
            buffer(DType::Bool, 0, BufferRole::Input(1)),
            buffer(F, 1, BufferRole::Output),
            buffer(DType::Bool, 1, BufferRole::Output),
        ],
        inputs: ids(&[0, 1]),
        outputs: vec![output(2, &[]), output(3, &[])],
        kernels: vec![kernel("multi_reduce_sum_max", KernelKind::MultiReduce(mr), &[0, 1], &[2, 3])],
    }
}

/// `b4 = [sum(b0 * b1), sum(b2 * b3)]`: items of two leaves each.
fn multi_reduce_two_leaves() -> Plan {
    let mut prologue = Body::default();
    let x = load(&mut prologue, 0, 0, &[1], F);
    let y = load(&mut prologue, 1, 0, &[1], F);
    prologue.push(Expr::Binary { op: BinaryOp::Mul, a: x, b: y }, F);
    let mut epilogue = Body::default();
    let r0 = epilogue.push(MultiReduce::result_load(0), F);
    let r1 = epilogue.push(MultiReduce::result_load(1), F);
    let mr = MultiReduce {
        reductions: vec![ItemReduction { op: ReduceOp::Sum, dtype: F, leaves: 2, prologue }],
        items: vec![ReduceItem { reduction: 0, len: 3 }, ReduceItem { reduction: 0, len: 5 }],
        epilogue,
        stores: vec![ElementStore { value: r0, output: 0, index: 0 }, ElementStore { value: r1, output: 0, index: 1 }],
    };
    Plan {
        buffers: vec![
            buffer(F, 3, BufferRole::Input(0)),
            buffer(F, 3, BufferRole::Input(1)),
            buffer(F, 5, BufferRole::Input(2)),
            buffer(F, 5, BufferRole::Input(3)),
            buffer(F, 2, BufferRole::Output),
        ],
        inputs: ids(&[0, 1, 2, 3]),
        outputs: vec![output(4, &[2])],
        kernels: vec![kernel("multi_reduce_dot", KernelKind::MultiReduce(mr), &[0, 1, 2, 3], &[4])],
        checks: Vec::new(),
    }
}

fn prologue(plan: &mut Plan) -> &mut Body {
    &mut multi(plan).reductions[0].prologue
}

fn multi(plan: &mut Plan) -> &mut MultiReduce {
    match &mut plan.kernels[0].kind {
        KernelKind::MultiReduce(mr) => mr,
        _ => unreachable!(),
    }
}

/// `b3 = b0 [2,3] @ b1 [3,4] + b2 [4]`, two batches of A over one B.
fn matmul() -> Plan {
    Plan {
        checks: Vec::new(),
        buffers: vec![
            buffer(F, 12, BufferRole::Input(0)),
            buffer(F, 12, BufferRole::Input(1)),
            buffer(F, 4, BufferRole::Input(2)),
            buffer(F, 16, BufferRole::Output),
        ],
        inputs: ids(&[0, 1, 2]),
        outputs: vec![output(3, &[2, 2, 4])],
        kernels: vec![kernel(
            "matmul",
            KernelKind::MatMul(MatMul {
                batch: vec![2],
                m: 2,
                n: 4,
                k: 3,
                dtype: F,
                a_batch_stride: 6,
                b_batch_stride: 0,
                a_transposed: false,
                b_transposed: false,
                bias: true,
                activation: None,
            }),
            &[0, 1, 2],
            &[3],
        )],
    }
}

fn mm(plan: &mut Plan) -> &mut MatMul {
    match &mut plan.kernels[0].kind {
        KernelKind::MatMul(mm) => mm,
        _ => unreachable!(),
    }
}

/// `b2 = concat([b0 [2,2], b1 [2,3]], axis 1)`.
fn concat() -> Plan {
    Plan {
        checks: Vec::new(),
        buffers: vec![
            buffer(F, 4, BufferRole::Input(0)),
            buffer(F, 6, BufferRole::Input(1)),
            buffer(F, 10, BufferRole::Output),
        ],
        inputs: ids(&[0, 1]),
        outputs: vec![output(2, &[2, 5])],
        kernels: vec![kernel(
            "concat",
            KernelKind::Concat(Concat { shape: Shape::new(vec![2, 5]), axis: 1, extents: vec![2, 3], dtype: F }),
            &[0, 1],
            &[2],
        )],
    }
}

fn cat(plan: &mut Plan) -> &mut Concat {
    match &mut plan.kernels[0].kind {
        KernelKind::Concat(cat) => cat,
        _ => unreachable!(),
    }
}

/// `plan` changed by `f`.
/// `b1 = (b0 * w).sum(0) * 2` and `b2 = b0.max(0)` over the rows of `[4, 3]`, with `w: [3]`
/// broadcast over the rows.
fn column() -> Plan {
    let mut body = Body::default();
    let x = load(&mut body, 0, 0, &[3, 1], F);
    let w = load(&mut body, 1, 0, &[0, 1], F);
    let xw = body.push(Expr::Binary { op: BinaryOp::Mul, a: x, b: w }, F);
    let s = body.push(Expr::Reduce { op: ReduceOp::Sum, x: xw }, F);
    let two = body.push(Expr::Const { value: Literal::Float(2.0) }, F);
    let scaled = body.push(Expr::Binary { op: BinaryOp::Mul, a: s, b: two }, F);
    let m = body.push(Expr::Reduce { op: ReduceOp::Max, x }, F);
    body.stores.push(Store { value: scaled, output: 0 });
    body.stores.push(Store { value: m, output: 1 });
    Plan {
        checks: Vec::new(),
        buffers: vec![
            buffer(F, 12, BufferRole::Input(0)),
            buffer(F, 3, BufferRole::Input(1)),
            buffer(F, 3, BufferRole::Output),
            buffer(F, 3, BufferRole::Output),
        ],
        inputs: ids(&[0, 1]),
        outputs: vec![output(2, &[3]), output(3, &[1, 3])],
        kernels: vec![kernel(
            "column_sum_max",
            KernelKind::Column(ColumnKernel { reduced: vec![4], kept: vec![3], body }),
            &[0, 1],
            &[2, 3],
        )],
    }
}

fn col_kernel(plan: &mut Plan) -> &mut ColumnKernel {
    match &mut plan.kernels[0].kind {
        KernelKind::Column(col) => col,
        _ => unreachable!(),
    }
}

#[test]
fn column_rule() {
    check(&column(), None);
    // A store of an element value (it varies with the row).
    let element = with(column(), |p| col_kernel(p).body.stores[1].value = ValueId(2));
    check(&element, Some(Rule::ColumnReduce));
    // A reduction of a value computed from another reduction (would need a second pass).
    let dependent = with(column(), |p| {
        let body = &mut col_kernel(p).body;
        let again = body.push(Expr::Reduce { op: ReduceOp::Sum, x: ValueId(5) }, F);
        body.stores[1].value = again;
    });
    check(&dependent, Some(Rule::ColumnReduce));
    // A per-column value stored into a buffer of the wrong size.
    let short = with(column(), |p| p.buffers[3].numel = 2);
    check(&with(short, |p| p.outputs[1].shape = Shape::new(vec![2])), Some(Rule::Stores));
    // A broadcast load of `w` that reads past its 3 elements.
    check(
        &with(column(), |p| {
            col_kernel(p).body.values[1].expr = Expr::Load { input: 1, offset: 1, strides: vec![0, 1] }
        }),
        Some(Rule::Loads),
    );
    // A load with the row kernel's stride count for a rank-2 domain.
    check(
        &with(column(), |p| col_kernel(p).body.values[0].expr = Expr::Load { input: 0, offset: 0, strides: vec![1] }),
        Some(Rule::Loads),
    );
    // No rows: the element loads never run, the epilogue's do; no columns: nothing runs.
    let no_rows = with(column(), |p| {
        col_kernel(p).reduced = vec![0];
        p.buffers[0].numel = 0;
    });
    check(&no_rows, None);
    let w_past_end =
        with(no_rows, |p| col_kernel(p).body.values[1].expr = Expr::Load { input: 1, offset: 1, strides: vec![0, 1] });
    check(&w_past_end, Some(Rule::Loads));
    // A reduction keeps the IR's typing rules.
    let typed = with(column(), |p| col_kernel(p).body.values[3].dtype = DType::I32);
    check(&typed, Some(Rule::ValueTypes));
}

fn with(mut plan: Plan, f: impl FnOnce(&mut Plan)) -> Plan {
    f(&mut plan);
    plan
}

#[test]
fn valid_plans_of_every_family_pass() {
    for plan in [pointwise(), row(), column(), multi_reduce(), matmul(), concat()] {
        check(&plan, None);
    }
    // A plan with no kernels whose output is an input, reshaped.
    let passthrough = with(pointwise(), |p| {
        p.kernels.clear();
        p.buffers.truncate(1);
        p.outputs = vec![output(0, &[6])];
    });
    check(&passthrough, None);
}

#[test]
fn buffer_ids() {
    check(&with(pointwise(), |p| p.kernels[0].inputs[0] = BufferId(9)), Some(Rule::BufferIds));
    check(&with(pointwise(), |p| p.kernels[0].outputs[0] = BufferId(9)), Some(Rule::BufferIds));
    check(&with(pointwise(), |p| p.outputs[0].buffer = BufferId(9)), Some(Rule::BufferIds));
    check(&with(pointwise(), |p| p.inputs[0] = BufferId(9)), Some(Rule::BufferIds));
}

#[test]
fn input_roles() {
    check(&with(pointwise(), |p| p.inputs[0] = BufferId(1)), Some(Rule::InputRoles));
    // An input buffer the plan's input list leaves out.
    check(&with(pointwise(), |p| p.buffers.push(buffer(F, 1, BufferRole::Input(1)))), Some(Rule::InputRoles));
}

#[test]
fn read_before_write() {
    // b0 -> b1 -> b2, with the two kernels in the wrong order.
    let chain = with(pointwise(), |p| {
        p.buffers[1].role = BufferRole::Intermediate;
        p.buffers.push(buffer(F, 6, BufferRole::Output));
        let mut second = p.kernels[0].clone();
        second.name = "second".into();
        second.inputs = ids(&[1]);
        second.outputs = ids(&[2]);
        p.kernels.push(second);
        p.outputs = vec![output(2, &[2, 3])];
    });
    check(&chain, None);
    check(&with(chain, |p| p.kernels.reverse()), Some(Rule::ReadBeforeWrite));
}

#[test]
fn single_writer() {
    // Writing a graph input.
    check(
        &with(pointwise(), |p| {
            p.buffers.push(buffer(F, 6, BufferRole::Input(1)));
            p.inputs.push(BufferId(2));
            p.kernels[0].outputs = ids(&[2]);
            p.outputs = vec![output(0, &[6])];
        }),
        Some(Rule::SingleWriter),
    );
    // Two kernels writing one buffer.
    check(
        &with(pointwise(), |p| {
            let mut again = p.kernels[0].clone();
            again.name = "again".into();
            p.kernels.push(again);
        }),
        Some(Rule::SingleWriter),
    );
}

#[test]
fn outputs() {
    check(&with(pointwise(), |p| p.outputs[0].shape = Shape::new(vec![7])), Some(Rule::Outputs));
    check(
        &with(pointwise(), |p| {
            p.buffers.push(buffer(F, 6, BufferRole::Output));
            p.outputs.push(output(2, &[6]));
        }),
        Some(Rule::Outputs),
    );
}

#[test]
fn kernel_names() {
    check(&with(pointwise(), |p| p.kernels[0].name = "1st kernel".into()), Some(Rule::KernelNames));
    check(&with(pointwise(), |p| p.kernels[0].name = String::new()), Some(Rule::KernelNames));
    let two = with(row(), |p| {
        // A second kernel reading the row sums, named like the first.
        p.buffers[1].role = BufferRole::Intermediate;
        p.buffers.push(buffer(F, 2, BufferRole::Output));
        let mut body = Body::default();
        let x = load(&mut body, 0, 0, &[1], F);
        body.stores.push(Store { value: x, output: 0 });
        p.kernels.push(kernel(
            "row_sum",
            KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![2]), body }),
            &[1],
            &[3],
        ));
        p.outputs[0].buffer = BufferId(3);
    });
    check(&two, Some(Rule::KernelNames));
    check(&with(two, |p| p.kernels[1].name = "copy".into()), None);
}

#[test]
fn value_order() {
    check(
        &with(pointwise(), |p| {
            if let Expr::Unary { x, .. } = &mut pointwise_body(p).values[1].expr {
                *x = ValueId(1);
            }
        }),
        Some(Rule::ValueOrder),
    );
    check(&with(pointwise(), |p| pointwise_body(p).stores[0].value = ValueId(5)), Some(Rule::ValueOrder));
    // In a row kernel the order is checked before per-row analysis needs it.
    check(
        &with(row(), |p| {
            if let Expr::Binary { b, .. } = &mut row_kernel(p).body.values[2].expr {
                *b = ValueId(4);
            }
        }),
        Some(Rule::ValueOrder),
    );
}

#[test]
fn value_types() {
    check(&with(pointwise(), |p| pointwise_body(p).values[1].dtype = DType::F16), Some(Rule::ValueTypes));
    // A constant's literal is of its dtype's kind.
    check(
        &with(pointwise(), |p| {
            pointwise_body(p).push(Expr::Const { value: Literal::Float(2.0) }, F);
        }),
        None,
    );
    check(
        &with(pointwise(), |p| {
            pointwise_body(p).push(Expr::Const { value: Literal::Int(2) }, F);
        }),
        Some(Rule::ValueTypes),
    );
    check(
        &with(pointwise(), |p| {
            pointwise_body(p).push(Expr::Const { value: Literal::Int(1 << 40) }, DType::I32);
        }),
        Some(Rule::ValueTypes),
    );
    // where needs a bool condition.
    check(
        &with(pointwise(), |p| {
            let body = pointwise_body(p);
            let w = body.push(Expr::Where { cond: ValueId(0), a: ValueId(0), b: ValueId(1) }, F);
            body.stores[0].value = w;
        }),
        Some(Rule::ValueTypes),
    );
    // A cast is any dtype to any dtype.
    check(
        &with(pointwise(), |p| {
            let body = pointwise_body(p);
            let c = body.push(Expr::Cast { x: ValueId(1) }, DType::I32);
            let back = body.push(Expr::Cast { x: c }, F);
            body.stores[0].value = back;
        }),
        None,
    );
}

#[test]
fn loads() {
    let with_load = |input: usize, offset: usize, strides: &[usize], dtype: DType| {
        let strides = strides.to_vec();
        with(pointwise(), move |p| {
            pointwise_body(p).values[0] = braze_plan::Value { expr: Expr::Load { input, offset, strides }, dtype }
        })
    };
    check(&with_load(0, 0, &[3, 1], F), None);
    check(&with_load(0, 0, &[0, 1], F), None); // broadcast rows
    check(&with_load(1, 0, &[3, 1], F), Some(Rule::Loads)); // no slot 1
    check(&with_load(0, 0, &[3], F), Some(Rule::Loads)); // too few strides
    check(&with_load(0, 1, &[3, 1], F), Some(Rule::Loads)); // one past the end
    check(&with_load(0, 0, &[usize::MAX, 1], F), Some(Rule::Loads)); // overflowing offsets
    check(&with_load(0, 0, &[3, 1], DType::F16), Some(Rule::Loads)); // wrong dtype
                                                                     // An empty domain runs no loads: any offset is fine.
    let empty = with(with_load(0, 100, &[3, 1], F), |p| {
        if let KernelKind::Pointwise(pw) = &mut p.kernels[0].kind {
            pw.shape = Shape::new(vec![0, 3]);
        }
        p.buffers[1].numel = 0;
        p.outputs[0].shape = Shape::new(vec![0, 3]);
    });
    check(&empty, None);
    // Rows without columns still run their per-row loads, but not their element loads.
    let no_columns = |row_offset: usize, element_offset: usize| {
        with(row(), move |p| {
            p.buffers[2].numel = 0;
            p.outputs[1].shape = Shape::new(vec![2, 0]);
            let row = row_kernel(p);
            row.inner = vec![0];
            let per_row = load(&mut row.body, 0, row_offset, &[3, 0], F);
            let element = load(&mut row.body, 0, element_offset, &[3, 1], F);
            let sum = row.body.push(Expr::Binary { op: BinaryOp::Add, a: per_row, b: ValueId(1) }, F);
            let _ = element;
            row.body.stores[0].value = sum;
        })
    };
    check(&no_columns(0, 100), None);
    check(&no_columns(100, 0), Some(Rule::Loads));
}

#[test]
fn reductions() {
    // Not in a pointwise kernel.
    check(
        &with(pointwise(), |p| {
            let body = pointwise_body(p);
            let r = body.push(Expr::Reduce { op: ReduceOp::Sum, x: ValueId(1) }, F);
            body.stores[0].value = r;
        }),
        Some(Rule::Reductions),
    );
    // An f16 reduction has an f16 result (it accumulates in f32 and stays unrounded).
    let f16_row = with(row(), |p| {
        for b in &mut p.buffers {
            b.dtype = DType::F16;
        }
        for v in &mut row_kernel(p).body.values {
            v.dtype = DType::F16;
        }
    });
    check(&f16_row, None);
    // Its result is not another dtype.
    let mut body = Body::default();
    let x = load(&mut body, 0, 0, &[3, 1], DType::F16);
    let s = body.push(Expr::Reduce { op: ReduceOp::Sum, x }, F);
    body.stores.push(Store { value: s, output: 0 });
    let mixed = with(row(), |p| {
        p.buffers[0].dtype = DType::F16;
        p.buffers.pop();
        p.outputs.pop();
        p.kernels[0].outputs.pop();
        row_kernel(p).body = body;
    });
    check(&mixed, Some(Rule::ValueTypes));
    // Widened to f32 first, it is fine.
    let mut body = Body::default();
    let x = load(&mut body, 0, 0, &[3, 1], DType::F16);
    let wide = body.push(Expr::Cast { x }, F);
    let s = body.push(Expr::Reduce { op: ReduceOp::Max, x: wide }, F);
    body.stores.push(Store { value: s, output: 0 });
    let ordered = with(row(), |p| {
        p.buffers[0].dtype = DType::F16;
        p.buffers.pop();
        p.outputs.pop();
        p.kernels[0].outputs.pop();
        row_kernel(p).body = body;
    });
    check(&ordered, None);
}

#[test]
fn stores() {
    check(&with(pointwise(), |p| pointwise_body(p).stores[0].output = 1), Some(Rule::Stores));
    check(
        &with(pointwise(), |p| {
            let body = pointwise_body(p);
            body.stores.push(body.stores[0].clone());
        }),
        Some(Rule::Stores),
    );
    check(&with(pointwise(), |p| pointwise_body(p).stores.clear()), Some(Rule::Stores));
    check(
        &with(pointwise(), |p| {
            p.buffers[1].dtype = DType::F16;
        }),
        Some(Rule::Stores),
    );
    check(
        &with(pointwise(), |p| {
            p.buffers[1].numel = 3;
            p.outputs[0].shape = Shape::new(vec![3]);
        }),
        Some(Rule::Stores),
    );
    // A per-row value fills one element per row, an element value rows * cols.
    check(
        &with(row(), |p| {
            let body = &mut row_kernel(p).body;
            body.stores.swap(0, 1);
            body.stores[0].output = 0;
            body.stores[1].output = 1;
        }),
        Some(Rule::Stores),
    );
}

#[test]
fn multi_reduce_rule() {
    check(&multi_reduce_epilogue(), None);
    check(&with(multi_reduce(), |p| multi(p).items.pop().map(drop).unwrap()), Some(Rule::MultiReduce));
    check(&with(multi_reduce(), |p| multi(p).items[1].len = 4), Some(Rule::MultiReduce));
    check(&with(multi_reduce(), |p| multi(p).items[1].reduction = 1), Some(Rule::MultiReduce));
    check(&with(multi_reduce(), |p| multi(p).reductions[0].dtype = DType::F16), Some(Rule::MultiReduce));
    check(
        &with(multi_reduce(), |p| prologue(p).values[0].expr = Expr::Load { input: 0, offset: 1, strides: vec![1] }),
        Some(Rule::MultiReduce),
    );
    check(
        &with(multi_reduce(), |p| prologue(p).stores.push(Store { value: ValueId(1), output: 0 })),
        Some(Rule::MultiReduce),
    );
    check(&with(multi_reduce(), |p| *prologue(p) = Body::default()), Some(Rule::MultiReduce));
    // Reducing the last value must keep its dtype (a sum of i32 values would give i64).
    check(
        &with(multi_reduce(), |p| {
            prologue(p).push(Expr::Cast { x: ValueId(1) }, DType::I32);
        }),
        Some(Rule::MultiReduce),
    );
    // A mean of integers does not type.
    check(
        &with(multi_reduce(), |p| {
            for b in &mut p.buffers {
                b.dtype = DType::I32;
            }
            let mr = multi(p);
            mr.reductions[0].op = ReduceOp::Mean;
            mr.reductions[0].dtype = DType::I32;
            for v in mr.reductions[0].prologue.values.iter_mut().chain(&mut mr.epilogue.values) {
                v.dtype = DType::I32;
            }
        }),
        Some(Rule::MultiReduce),
    );
    // The prologue's values are typed like any body.
    check(&with(multi_reduce(), |p| prologue(p).values[1].dtype = DType::Bool), Some(Rule::ValueTypes));
}

#[test]
fn multi_reduce_leaves_rule() {
    check(&multi_reduce_two_leaves(), None);
    // One input per leaf of each item, in item order, each of the item's length.
    check(&with(multi_reduce_two_leaves(), |p| p.kernels[0].inputs.truncate(3)), Some(Rule::MultiReduce));
    check(&with(multi_reduce_two_leaves(), |p| p.kernels[0].inputs.swap(1, 2)), Some(Rule::MultiReduce));
    check(&with(multi_reduce_two_leaves(), |p| multi(p).reductions[0].leaves = 3), Some(Rule::MultiReduce));
    // A prologue loads only leaves it has.
    check(&with(multi_reduce_two_leaves(), |p| multi(p).reductions[0].leaves = 1), Some(Rule::MultiReduce));
    check(&with(multi_reduce(), |p| multi(p).reductions[0].leaves = 0), Some(Rule::MultiReduce));
}

#[test]
fn multi_reduce_epilogue_rule() {
    // Element stores: each element of each output once, of the output's dtype.
    check(
        &with(multi_reduce(), |p| {
            p.buffers[2].numel = 3;
            p.outputs[0].shape = Shape::new(vec![3]);
        }),
        Some(Rule::MultiReduce),
    );
    check(&with(multi_reduce(), |p| multi(p).stores[1].index = 0), Some(Rule::MultiReduce));
    check(&with(multi_reduce(), |p| multi(p).stores[1].index = 2), Some(Rule::MultiReduce));
    check(&with(multi_reduce(), |p| multi(p).stores[1].output = 1), Some(Rule::MultiReduce));
    check(&with(multi_reduce(), |p| multi(p).stores[1].value = ValueId(7)), Some(Rule::MultiReduce));
    check(&with(multi_reduce_epilogue(), |p| multi(p).stores[1].value = ValueId(0)), Some(Rule::MultiReduce));
    check(
        &with(multi_reduce(), |p| multi(p).epilogue.stores.push(Store { value: ValueId(0), output: 0 })),
        Some(Rule::MultiReduce),
    );
    // Loads read item results, as their dtypes.
    check(
        &with(multi_reduce(), |p| multi(p).epilogue.values[1].expr = MultiReduce::result_load(2)),
        Some(Rule::MultiReduce),
    );
    check(
        &with(multi_reduce(), |p| {
            multi(p).epilogue.values[1].expr = Expr::Load { input: 1, offset: 0, strides: vec![1] }
        }),
        Some(Rule::MultiReduce),
    );
    check(
        &with(multi_reduce_epilogue(), |p| {
            let epilogue = &mut multi(p).epilogue;
            epilogue.values[1].dtype = F;
            epilogue.values[2].dtype = F;
        }),
        Some(Rule::MultiReduce),
    );
    // Values are typed, and reductions belong in row kernels.
    check(&with(multi_reduce_epilogue(), |p| multi(p).epilogue.values[3].dtype = DType::I32), Some(Rule::ValueTypes));
    check(
        &with(multi_reduce_epilogue(), |p| {
            multi(p).epilogue.values[3].expr = Expr::Reduce { op: ReduceOp::Sum, x: ValueId(0) }
        }),
        Some(Rule::Reductions),
    );
    // A computed value needs an item whose finish runs the epilogue.
    check(
        &with(multi_reduce_epilogue(), |p| {
            let mr = multi(p);
            mr.items.clear();
            mr.epilogue.values = vec![braze_plan::Value { expr: Expr::Const { value: Literal::Float(1.0) }, dtype: F }];
            mr.stores = vec![ElementStore { value: ValueId(0), output: 0, index: 0 }];
            p.outputs.truncate(1);
            p.kernels[0].inputs.clear();
            p.kernels[0].outputs.truncate(1);
            p.inputs.clear();
            p.buffers.drain(..2);
            p.buffers.truncate(1);
            p.kernels[0].outputs = vec![BufferId(0)];
            p.outputs[0].buffer = BufferId(0);
        }),
        Some(Rule::MultiReduce),
    );
}

#[test]
fn matmul_rule() {
    check(&with(matmul(), |p| mm(p).bias = false), Some(Rule::MatMul));
    check(&with(matmul(), |p| mm(p).b_batch_stride = 12), Some(Rule::MatMul)); // B's second batch leaves it
    check(&with(matmul(), |p| mm(p).a_batch_stride = usize::MAX), Some(Rule::MatMul));
    check(&with(matmul(), |p| mm(p).n = 3), Some(Rule::MatMul)); // bias and output sizes
    check(
        &with(matmul(), |p| {
            for b in &mut p.buffers {
                b.dtype = DType::I32;
            }
            mm(p).dtype = DType::I32;
        }),
        Some(Rule::MatMul),
    );
    check(&with(matmul(), |p| p.buffers[1].dtype = DType::BF16), Some(Rule::MatMul));
    // Only the activations cuBLASLt's epilogues compute.
    check(&with(matmul(), |p| mm(p).activation = Some(UnaryOp::GeluTanh)), None);
    check(&with(matmul(), |p| mm(p).activation = Some(UnaryOp::Exp)), Some(Rule::MatMul));
    // Transposed operands need the same sizes.
    check(
        &with(matmul(), |p| {
            let m = mm(p);
            m.a_transposed = true;
            m.b_transposed = true;
        }),
        None,
    );
}

#[test]
fn concat_rule() {
    check(&with(concat(), |p| cat(p).axis = 2), Some(Rule::Concat));
    check(&with(concat(), |p| cat(p).extents = vec![2, 2]), Some(Rule::Concat));
    check(&with(concat(), |p| cat(p).extents = vec![3, 2]), Some(Rule::Concat)); // input sizes
    check(&with(concat(), |p| cat(p).extents = vec![5]), Some(Rule::Concat));
    check(&with(concat(), |p| p.buffers[2].dtype = DType::F16), Some(Rule::Concat));
}

#[test]
fn json_round_trips_and_validates() {
    for plan in [pointwise(), row(), column(), multi_reduce(), matmul(), concat()] {
        assert_eq!(Plan::from_json(&plan.to_json()).unwrap(), plan);
    }
    let broken = with(pointwise(), |p| p.kernels[0].name = "no good".into());
    assert_eq!(Plan::from_json(&broken.to_json()).unwrap_err().rule(), Some(Rule::KernelNames));
    assert!(matches!(Plan::from_json("{\"buffers\": 3}"), Err(PlanError::Json(_))));
}

/// `pointwise()` with its output written in place of its input.
fn in_place() -> Plan {
    let mut plan = pointwise();
    plan.buffers[1].role = BufferRole::InPlace(0);
    plan
}

#[test]
fn in_place_output_read_only_at_the_stored_element_is_valid() {
    check(&in_place(), None);
    assert_eq!(in_place().write_backs(), braze_plan::WriteBackCounts { direct: 1, copied: 0 });
}

#[test]
fn in_place_output_whose_writer_reads_other_elements_breaks_in_place() {
    // Reads the input transposed: element (i, j) of the output would overwrite an element a
    // later thread still reads.
    let mut plan = in_place();
    if let Expr::Load { strides, .. } = &mut pointwise_body(&mut plan).values[0].expr {
        *strides = vec![1, 2];
    }
    check(&plan, Some(Rule::InPlace));
}

#[test]
fn in_place_input_read_after_the_write_breaks_in_place() {
    let mut plan = in_place();
    let mut body = Body::default();
    let x = load(&mut body, 0, 0, &[1], F);
    body.stores.push(Store { value: x, output: 0 });
    plan.buffers.push(buffer(F, 6, BufferRole::Output));
    plan.kernels.push(kernel(
        "pointwise_copy",
        KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![6]), body }),
        &[0],
        &[2],
    ));
    plan.outputs.push(output(2, &[6]));
    check(&plan, Some(Rule::InPlace));
    // Reading the new values through the in-place buffer is fine.
    plan.kernels[1].inputs = ids(&[1]);
    check(&plan, None);
}

#[test]
fn in_place_of_a_missing_input_of_another_type_or_twice_breaks_in_place() {
    let mut missing = in_place();
    missing.buffers[1].role = BufferRole::InPlace(3);
    check(&missing, Some(Rule::InPlace));
    let mut returned = in_place();
    returned.outputs.push(output(0, &[2, 3]));
    check(&returned, Some(Rule::InPlace));
}

/// A bf16 attention over 2 (batch, head) pairs of `[3, 4]`: q, k, v in, out and lse out; then
/// its dk/dv backward reading q, k, v, lse, delta (an input here) and dout.
fn attention() -> Plan {
    use braze_plan::{Attention, AttentionBackward, AttentionResult, AttentionShape, OperandLayout};
    let bf = DType::BF16;
    let shape = AttentionShape { batch: 2, heads: 2, seq: 3, head_dim: 4, dtype: bf, causal: true, scale: 0.5 };
    let dense = OperandLayout::dense(&shape);
    Plan {
        checks: Vec::new(),
        buffers: vec![
            buffer(bf, 24, BufferRole::Input(0)),
            buffer(bf, 24, BufferRole::Input(1)),
            buffer(bf, 24, BufferRole::Input(2)),
            buffer(F, 6, BufferRole::Input(3)),
            buffer(bf, 24, BufferRole::Input(4)),
            buffer(bf, 24, BufferRole::Output),
            buffer(F, 6, BufferRole::Intermediate),
            buffer(bf, 24, BufferRole::Output),
            buffer(bf, 24, BufferRole::Output),
        ],
        inputs: ids(&[0, 1, 2, 3, 4]),
        outputs: vec![output(5, &[2, 3, 4]), output(7, &[2, 3, 4]), output(8, &[2, 3, 4])],
        kernels: vec![
            kernel(
                "attention",
                KernelKind::Attention(Attention {
                    shape,
                    results: vec![AttentionResult::Out, AttentionResult::Lse],
                    input_layouts: [dense; 3],
                    out_layout: dense,
                }),
                &[0, 1, 2],
                &[5, 6],
            ),
            kernel(
                "attention_backward",
                KernelKind::AttentionBackward(AttentionBackward {
                    shape,
                    grads: vec![braze_ir::AttentionInput::Key, braze_ir::AttentionInput::Value],
                    input_layouts: [dense; 4],
                    grad_layouts: vec![dense; 2],
                }),
                &[0, 1, 2, 6, 3, 4],
                &[7, 8],
            ),
        ],
    }
}

fn attention_shape(plan: &mut Plan, kernel: usize) -> &mut braze_plan::AttentionShape {
    match &mut plan.kernels[kernel].kind {
        KernelKind::Attention(att) => &mut att.shape,
        KernelKind::AttentionBackward(back) => &mut back.shape,
        _ => unreachable!(),
    }
}

#[test]
fn attention_rules() {
    use braze_ir::AttentionInput::{Key, Query, Value};
    use braze_plan::AttentionResult::{Lse, Out};
    let set_results = |p: &mut Plan, results: Vec<braze_plan::AttentionResult>| {
        if let KernelKind::Attention(att) = &mut p.kernels[0].kind {
            att.results = results;
        }
    };
    let set_grads = |p: &mut Plan, grads: Vec<braze_ir::AttentionInput>| {
        if let KernelKind::AttentionBackward(back) = &mut p.kernels[1].kind {
            back.grad_layouts.resize(grads.len(), back.grad_layouts[0]);
            back.grads = grads;
        }
    };
    check(&attention(), None);
    // Results in order, each once, matching the output slots.
    check(&with(attention(), |p| set_results(p, vec![Lse, Out])), Some(Rule::Attention));
    check(&with(attention(), |p| set_results(p, vec![Out, Out])), Some(Rule::Attention));
    check(&with(attention(), |p| set_results(p, vec![Out])), Some(Rule::Attention));
    // Operand sizes and dtypes follow the shape.
    check(&with(attention(), |p| attention_shape(p, 0).seq = 4), Some(Rule::Attention));
    check(&with(attention(), |p| p.buffers[2].dtype = F), Some(Rule::Attention));
    check(&with(attention(), |p| p.buffers[6].dtype = DType::BF16), Some(Rule::Attention));
    check(&with(attention(), |p| attention_shape(p, 0).scale = f64::NAN), Some(Rule::Attention));
    check(&with(attention(), |p| attention_shape(p, 0).scale = 0.0), Some(Rule::Attention));
    // The backward: dq alone, or dk and/or dv in that order.
    check(&with(attention(), |p| set_grads(p, vec![Value, Key])), Some(Rule::AttentionBackward));
    check(&with(attention(), |p| set_grads(p, vec![Query, Key])), Some(Rule::AttentionBackward));
    check(&with(attention(), |p| set_grads(p, vec![Key])), Some(Rule::AttentionBackward));
    check(
        &with(attention(), |p| {
            set_grads(p, vec![Value]);
            p.kernels[1].outputs.pop();
            p.outputs.pop();
            p.buffers.pop();
        }),
        None,
    );
    check(&with(attention(), |p| p.kernels[1].inputs.swap(3, 5)), Some(Rule::AttentionBackward));
    check(&with(attention(), |p| attention_shape(p, 1).dtype = DType::I32), Some(Rule::AttentionBackward));
    check(&with(attention(), |p| attention_shape(p, 0).heads = 0), Some(Rule::Attention));
    check(&with(attention(), |p| attention_shape(p, 1).heads = 3), Some(Rule::AttentionBackward));
}

#[test]
fn attention_layouts_stay_in_their_buffers_and_results_cover_theirs() {
    use braze_plan::OperandLayout;
    let edit_forward = |edit: fn(&mut braze_plan::Attention)| {
        with(attention(), move |p| {
            if let KernelKind::Attention(att) = &mut p.kernels[0].kind {
                edit(att)
            }
        })
    };
    // q read out of a wider buffer: rows 8 apart, heads 24 apart, from element 4.
    let strided_q = OperandLayout { offset: 4, batch_stride: 0, head_stride: 24, row_stride: 8 };
    let mut wide = edit_forward(|att| {
        att.input_layouts[0] = OperandLayout { offset: 4, batch_stride: 0, head_stride: 24, row_stride: 8 }
    });
    wide.buffers[0].numel = 48;
    check(&wide, None);
    assert_eq!(strided_q.extent(attention_shape(&mut wide, 0)), Some(48));
    // One element further reaches past the buffer.
    check(&with(wide, |p| p.buffers[0].numel = 47), Some(Rule::Attention));
    // Results in `[B, T, H, D]` order cover their buffer once; rows spread apart do not.
    check(
        &edit_forward(|att| {
            att.out_layout = OperandLayout { offset: 0, batch_stride: 24, head_stride: 4, row_stride: 8 }
        }),
        None,
    );
    check(
        &edit_forward(|att| {
            att.out_layout = OperandLayout { offset: 0, batch_stride: 24, head_stride: 12, row_stride: 8 }
        }),
        Some(Rule::Attention),
    );
    check(
        &with(attention(), |p| {
            if let KernelKind::AttentionBackward(back) = &mut p.kernels[1].kind {
                back.grad_layouts[1].offset = 1;
            }
        }),
        Some(Rule::AttentionBackward),
    );
}

/// [`attention`] with dk and dv written side by side into one `[3, 16]` buffer (rows of 16,
/// each gradient 2 heads x 4 columns wide), dk at column `dk_at` and dv at `dv_at`.
fn side_by_side(dk_at: usize, dv_at: usize) -> Plan {
    with(attention(), |p| {
        if let KernelKind::AttentionBackward(back) = &mut p.kernels[1].kind {
            for (layout, first) in back.grad_layouts.iter_mut().zip([dk_at, dv_at]) {
                *layout = braze_plan::OperandLayout { offset: first, batch_stride: 48, head_stride: 4, row_stride: 16 };
            }
        }
        p.buffers[7].numel = 48;
        p.buffers.pop();
        p.outputs = vec![output(5, &[2, 3, 4]), output(7, &[3, 16])];
        p.kernels[1].outputs = ids(&[7, 7]);
    })
}

#[test]
fn attention_gradients_may_write_one_buffer_side_by_side() {
    let plan = side_by_side(0, 8);
    check(&plan, None);
    let part = plan.output_part(&plan.kernels[1], 1).expect("dv writes a part");
    assert_eq!((part.rows, part.row_stride, part.first, part.width), (3, 16, 8, 8));
    // The kernel moves each part once, not the whole buffer twice.
    assert_eq!(plan.kernel_bytes(&plan.kernels[1]), 4 * 24 * 2 + 2 * 6 * 4 + 2 * (3 * 8) * 2);
    // Overlapping columns, and columns that leave part of the rows unwritten, break the rule.
    check(&side_by_side(0, 4), Some(Rule::SingleWriter));
    // Rows that do not fill the buffer: each gradient would write all of it.
    check(&with(side_by_side(0, 8), |p| p.buffers[7].numel = 64), Some(Rule::SingleWriter));
    let half = with(side_by_side(0, 8), |p| {
        if let KernelKind::AttentionBackward(back) = &mut p.kernels[1].kind {
            back.grads.pop();
            back.grad_layouts.pop();
        }
        p.kernels[1].outputs.pop();
    });
    check(&half, Some(Rule::SingleWriter));
    // A reader of the buffer before every part is written reads unwritten columns.
    let early = with(half, |p| {
        let reader = p.kernels[0].clone();
        p.kernels.push(braze_plan::Kernel {
            name: "reader".into(),
            inputs: ids(&[7, 7, 7]),
            outputs: ids(&[]),
            ..reader
        });
    });
    check(&early, Some(Rule::ReadBeforeWrite));
}

/// `b3[i, c] = b0[clamp(b1[i]), c]` over `[3, 4]`: an embedding of a `[5, 4]` table.
fn gather() -> Plan {
    let mut body = Body::default();
    let index = load(&mut body, 1, 0, &[1, 0], DType::I64);
    let row = body
        .push(Expr::Gather { input: 0, offset: 0, strides: vec![0, 1], index, index_stride: 4, bound: 5, check: 0 }, F);
    body.stores.push(Store { value: row, output: 0 });
    Plan {
        checks: vec![braze_plan::Check { op: "index_select".into(), loc: None, bound: 5 }],
        buffers: vec![
            buffer(F, 20, BufferRole::Input(0)),
            buffer(DType::I64, 3, BufferRole::Input(1)),
            buffer(F, 12, BufferRole::Output),
        ],
        inputs: ids(&[0, 1]),
        outputs: vec![output(2, &[3, 4])],
        kernels: vec![kernel(
            "pointwise_index_select",
            KernelKind::Pointwise(Pointwise { shape: Shape::new(vec![3, 4]), body }),
            &[0, 1],
            &[2],
        )],
    }
}

#[test]
fn gathers() {
    check(&gather(), None);
    let with = |f: &dyn Fn(&mut Plan)| {
        let mut plan = gather();
        f(&mut plan);
        plan
    };
    let set = |plan: &mut Plan, stride: usize, bound: usize, check_index: usize| {
        if let Expr::Gather { index_stride, bound: b, check, .. } = &mut pointwise_body(plan).values[1].expr {
            *index_stride = stride;
            *b = bound;
            *check = check_index;
        }
    };
    check(&with(&|p| set(p, 5, 5, 0)), Some(Rule::Gathers)); // the last row leaves the table
    check(&with(&|p| set(p, 4, 5, 1)), Some(Rule::Gathers)); // no check 1
    check(&with(&|p| p.checks[0].bound = 6), Some(Rule::Gathers)); // the check's bound differs
    check(&with(&|p| pointwise_body(p).values[0].dtype = F), Some(Rule::Loads)); // i64 data loaded as f32
    check(
        &with(&|p| {
            p.buffers[1].dtype = F;
            pointwise_body(p).values[0].dtype = F;
        }),
        Some(Rule::Gathers),
    ); // a float index
       // A zero-row table reads nothing: any stride is fine.
    check(
        &with(&|p| {
            set(p, 1000, 0, 0);
            p.checks[0].bound = 0;
        }),
        None,
    );
}

fn index_add(dtype: DType, index: DType, src: usize, out: usize) -> Plan {
    let ia = braze_plan::IndexAdd { outer: 2, indices: 3, inner: 4, size: 5, dtype, index_dtype: index };
    Plan {
        checks: Vec::new(),
        buffers: vec![
            buffer(dtype, src, BufferRole::Input(0)),
            buffer(index, 3, BufferRole::Input(1)),
            buffer(dtype, out, BufferRole::Output),
        ],
        inputs: ids(&[0, 1]),
        outputs: vec![output(2, &[out])],
        kernels: vec![kernel("index_add", KernelKind::IndexAdd(ia), &[0, 1], &[2])],
    }
}

#[test]
fn index_adds() {
    check(&index_add(F, DType::I64, 24, 40), None);
    check(&index_add(DType::I32, DType::I32, 24, 40), None);
    check(&index_add(F, DType::I64, 23, 40), Some(Rule::IndexAdd)); // src too short
    check(&index_add(F, DType::I64, 24, 41), Some(Rule::IndexAdd)); // output too long
    check(&index_add(F, F, 24, 40), Some(Rule::IndexAdd)); // float indices
    check(&index_add(DType::Bool, DType::I64, 24, 40), Some(Rule::IndexAdd)); // bools do not add
}
