//! Column kernels built by hand (a norm's weight and bias grads: `sum(dy * xhat, 0)` and
//! `sum(dy, 0)` in one kernel), run by `eval_plan` and compared with `eval_graph` on the
//! equivalent graph at odd sizes, and the fixed order in which their chunk partials combine.

use braze_cpu::{assert_close, eval_graph, eval_plan, random_tensor};
use braze_ir::{BinaryOp, DType, Graph, HostData, HostTensor, Op, ReduceOp, Shape};
use braze_plan::{Body, Buffer, BufferId, BufferRole, ColumnKernel, Expr, Kernel, KernelKind, Plan, PlanOutput, Store};

/// The plan: one column kernel over `[rows, cols]` of `dtype` with the two grads as outputs.
fn grads_plan(dtype: DType, rows: usize, cols: usize) -> Plan {
    let mut body = Body::default();
    let strides = vec![cols, 1];
    let dy = body.push(Expr::Load { input: 0, offset: 0, strides: strides.clone() }, dtype);
    let xhat = body.push(Expr::Load { input: 1, offset: 0, strides }, dtype);
    let prod = body.push(Expr::Binary { op: BinaryOp::Mul, a: dy, b: xhat }, dtype);
    let dw = body.push(Expr::Reduce { op: ReduceOp::Sum, x: prod }, dtype);
    let db = body.push(Expr::Reduce { op: ReduceOp::Sum, x: dy }, dtype);
    body.stores = vec![Store { value: dw, output: 0 }, Store { value: db, output: 1 }];
    let buffer = |numel, role| Buffer { dtype, numel, role };
    Plan {
        checks: Vec::new(),
        buffers: vec![
            buffer(rows * cols, BufferRole::Input(0)),
            buffer(rows * cols, BufferRole::Input(1)),
            buffer(cols, BufferRole::Output),
            buffer(cols, BufferRole::Output),
        ],
        inputs: vec![BufferId(0), BufferId(1)],
        outputs: vec![
            PlanOutput { buffer: BufferId(2), shape: Shape::new(vec![cols]) },
            PlanOutput { buffer: BufferId(3), shape: Shape::new(vec![cols]) },
        ],
        kernels: vec![Kernel {
            name: "column_grads".into(),
            kind: KernelKind::Column(ColumnKernel { reduced: vec![rows], kept: vec![cols], body }),
            inputs: vec![BufferId(0), BufferId(1)],
            outputs: vec![BufferId(2), BufferId(3)],
            sources: vec![],
        }],
    }
}

fn grads_graph(dtype: DType, rows: usize, cols: usize) -> Graph {
    let mut g = Graph::new();
    let dy = g.input(dtype, [rows, cols]);
    let xhat = g.input(dtype, [rows, cols]);
    let prod = g.add(Op::Binary { op: BinaryOp::Mul }, &[dy, xhat], None).unwrap();
    let sum = |g: &mut Graph, x| g.add(Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdim: false }, &[x], None);
    let dw = sum(&mut g, prod).unwrap();
    let db = sum(&mut g, dy).unwrap();
    g.set_outputs(vec![dw, db]);
    g
}

fn inputs(dtype: DType, rows: usize, cols: usize, seed: u64) -> Vec<HostTensor> {
    vec![random_tensor(dtype, [rows, cols], seed), random_tensor(dtype, [rows, cols], seed + 1)]
}

#[test]
fn column_grads_match_the_reference_at_odd_sizes() {
    let shapes = [(1, 5), (7, 1), (1, 1), (33, 13), (130, 33), (257, 8), (65_536, 7)];
    for dtype in [DType::F32, DType::BF16] {
        for (seed, &(rows, cols)) in shapes.iter().enumerate() {
            let plan = grads_plan(dtype, rows, cols);
            plan.validate().unwrap();
            let data = inputs(dtype, rows, cols, seed as u64 * 7);
            let actual = eval_plan(&plan, &data).unwrap();
            let expected = eval_graph(&grads_graph(dtype, rows, cols), &data).unwrap();
            for (j, (a, e)) in actual.iter().zip(&expected).enumerate() {
                assert_close(a, e).unwrap_or_else(|err| panic!("{dtype} [{rows}, {cols}] output {j}: {err}"));
            }
        }
    }
}

#[test]
fn no_rows_give_the_identity_of_every_column() {
    let plan = grads_plan(DType::F32, 0, 6);
    let out = eval_plan(&plan, &inputs(DType::F32, 0, 6, 1)).unwrap();
    for o in &out {
        assert_eq!(o.data(), &HostData::F32(vec![0.0; 6]));
    }
}

/// An f32 sum as the plan executor forms every in-register sum: runs of up to 8 in order from
/// +0.0, then halves combined pairwise.
fn tree_sum(values: &[f32]) -> f32 {
    if values.len() <= 8 {
        return values.iter().fold(0.0f32, |acc, &x| acc + x);
    }
    let (left, right) = values.split_at(values.len() / 2);
    tree_sum(left) + tree_sum(right)
}

/// The sum of `values` folded as the column kernels fold rows: each chunk of 256 rows on its
/// own, then the chunks' partials in chunk order, in f32.
fn chunked_sum(values: &[f32]) -> f32 {
    let partials: Vec<f32> = values.chunks(256).map(tree_sum).collect();
    tree_sum(&partials)
}

#[test]
fn partials_combine_in_a_fixed_order() {
    let (rows, cols) = (1000, 3);
    let data = inputs(DType::F32, rows, cols, 99);
    let plan = grads_plan(DType::F32, rows, cols);
    let first = eval_plan(&plan, &data).unwrap();
    let HostData::F32(dy) = data[0].data() else { unreachable!() };
    let HostData::F32(db) = first[1].data() else { unreachable!() };
    for c in 0..cols {
        let column: Vec<f32> = (0..rows).map(|r| dy[r * cols + c]).collect();
        assert_eq!(db[c].to_bits(), chunked_sum(&column).to_bits(), "column {c}");
    }
    // The same plan, the same bits.
    for _ in 0..3 {
        assert_eq!(eval_plan(&plan, &data).unwrap(), first);
    }
}
