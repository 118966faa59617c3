//! Reshape, broadcast_to, permute, slice, concat and stack, against index formulas written out
//! by hand.

mod common;

use braze_ir::{Graph, HostTensor, NodeId, Op};
use common::*;

/// Builds one layout op with `build` on `inputs` and compares exactly with `expected`.
fn check(what: &str, build: impl FnOnce(&mut Graph, &[NodeId]) -> NodeId, inputs: &[HostTensor], expected: HostTensor) {
    let actual = run(build, inputs);
    assert_identical(&actual, &expected, what);
}

fn values(n: usize, f: impl Fn(usize) -> f64) -> Vec<f64> {
    (0..n).map(f).collect()
}

#[test]
fn reshape_keeps_row_major_order() {
    check("reshape", |g, x| g.reshape(x[0], [3, 2]).unwrap(), &[arange(&[2, 3])], arange(&[3, 2]));
    check("reshape to scalar", |g, x| g.reshape(x[0], []).unwrap(), &[arange(&[1, 1])], arange(&[]));
    check("reshape empty", |g, x| g.reshape(x[0], [4, 0]).unwrap(), &[arange(&[0, 4])], arange(&[4, 0]));
}

#[test]
fn broadcast_to_repeats_size_one_dims() {
    // [3,1] -> [2,3,4]: out[a,b,c] = x[b].
    let expected = f32s(&[2, 3, 4], &values(24, |i| ((i / 4) % 3) as f64));
    check("broadcast_to", |g, x| g.broadcast_to(x[0], [2, 3, 4]).unwrap(), &[arange(&[3, 1])], expected);
    let expected = f32s(&[2, 2], &[7.0; 4]);
    check("broadcast scalar", |g, x| g.broadcast_to(x[0], [2, 2]).unwrap(), &[f32s(&[], &[7.0])], expected);
    let expected = f32s(&[0, 3], &[]);
    check("broadcast to empty", |g, x| g.broadcast_to(x[0], [0, 3]).unwrap(), &[arange(&[3])], expected);
}

#[test]
fn permute_moves_dims() {
    // x[a,b,c] = 12a + 4b + c over [2,3,4]; perm [2,0,1] gives out[c,a,b] of shape [4,2,3].
    let expected = f32s(&[4, 2, 3], &values(24, |i| (12 * ((i / 3) % 2) + 4 * (i % 3) + i / 6) as f64));
    let permute = Op::Permute { perm: vec![2, 0, 1] };
    check("permute", |g, x| g.add(permute, x, None).unwrap(), &[arange(&[2, 3, 4])], expected);
    let transpose = Op::Permute { perm: vec![1, 0] };
    let expected = f32s(&[3, 2], &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    check("transpose", |g, x| g.add(transpose, x, None).unwrap(), &[arange(&[2, 3])], expected);
}

#[test]
fn slice_with_steps() {
    // Columns 1, 3 of a [2,5] arange: out[r, j] = 5r + 1 + 2j.
    let slice = Op::Slice { axis: 1, start: 1, end: 5, step: 2 };
    let expected = f32s(&[2, 2], &[1.0, 3.0, 6.0, 8.0]);
    check("slice step 2", |g, x| g.add(slice, x, None).unwrap(), &[arange(&[2, 5])], expected);
    // Rows 0, 2, 4 of a [5,2] arange (end not a multiple of the step from start).
    let slice = Op::Slice { axis: 0, start: 0, end: 5, step: 2 };
    let expected = f32s(&[3, 2], &[0.0, 1.0, 4.0, 5.0, 8.0, 9.0]);
    check("slice rows", |g, x| g.add(slice, x, None).unwrap(), &[arange(&[5, 2])], expected);
    let slice = Op::Slice { axis: 1, start: 2, end: 2, step: 1 };
    check("empty slice", |g, x| g.add(slice, x, None).unwrap(), &[arange(&[2, 5])], f32s(&[2, 0], &[]));
}

#[test]
fn concat_and_stack_interleave_blocks() {
    let a = f32s(&[2, 1], &[1.0, 2.0]);
    let b = f32s(&[2, 3], &[3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let empty = f32s(&[2, 0], &[]);
    let expected = f32s(&[2, 4], &[1.0, 3.0, 4.0, 5.0, 2.0, 6.0, 7.0, 8.0]);
    let concat = Op::Concat { axis: 1 };
    check("concat axis 1", |g, x| g.add(concat, x, None).unwrap(), &[a.clone(), empty, b.clone()], expected);
    let expected = f32s(&[4, 1], &[1.0, 2.0, 1.0, 2.0]);
    let concat = Op::Concat { axis: 0 };
    check("concat axis 0", |g, x| g.add(concat, x, None).unwrap(), &[a.clone(), a], expected);

    let c = f32s(&[2, 3], &[10.0, 20.0, 30.0, 40.0, 50.0, 60.0]);
    let stack = |axis| Op::Stack { axis };
    let expected = f32s(&[2, 2, 3], &[3.0, 4.0, 5.0, 10.0, 20.0, 30.0, 6.0, 7.0, 8.0, 40.0, 50.0, 60.0]);
    check("stack axis 1", |g, x| g.add(stack(1), x, None).unwrap(), &[b.clone(), c.clone()], expected);
    let expected = f32s(&[2, 3, 2], &[3.0, 10.0, 4.0, 20.0, 5.0, 30.0, 6.0, 40.0, 7.0, 50.0, 8.0, 60.0]);
    check("stack last axis", |g, x| g.add(stack(2), x, None).unwrap(), &[b.clone(), c.clone()], expected);
    let expected = f32s(&[2, 2, 3], &[3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0]);
    check("stack axis 0", |g, x| g.add(stack(0), x, None).unwrap(), &[b, c], expected);
    let expected = i32s(&[2, 0], &[]);
    check("stack empty", |g, x| g.add(stack(0), x, None).unwrap(), &[i32s(&[0], &[]), i32s(&[0], &[])], expected);
}

#[test]
fn views_compose_in_one_graph() {
    // slice -> permute -> reshape -> broadcast, then add: exercises value lifetimes across nodes.
    let build = |g: &mut Graph, x: &[NodeId]| {
        let s = g.add(Op::Slice { axis: 0, start: 1, end: 3, step: 1 }, &[x[0]], None).unwrap();
        let p = g.add(Op::Permute { perm: vec![1, 0] }, &[s], None).unwrap();
        let r = g.reshape(p, [1, 6]).unwrap();
        let b = g.broadcast_to(r, [2, 6]).unwrap();
        g.add(Op::Binary { op: braze_ir::BinaryOp::Add }, &[b, x[1]], None).unwrap()
    };
    // rows 1..3 of a [3,3] arange: [[3,4,5],[6,7,8]]; transposed: [[3,6],[4,7],[5,8]].
    let row = [3.0, 6.0, 4.0, 7.0, 5.0, 8.0];
    let bias = f32s(&[2, 1], &[0.0, 100.0]);
    let expected: Vec<f64> = row.iter().copied().chain(row.iter().map(|v| v + 100.0)).collect();
    check("view chain", build, &[arange(&[3, 3]), bias], f32s(&[2, 6], &expected));
}
