//! Each pass on small graphs: the IR text before and after. Every simplification rule fires on
//! its pattern, and the look-alikes that are not exact under IEEE (`x + 0.0`, `x * 0`, ...) stay.

mod support;

use braze_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, SourceLoc, UnaryOp};
use braze_passes::{
    optimize, CommonSubexpressions, DeadCode, Decompose, Pass, PassError, PassManager, Result, Simplify,
};
use support::*;

/// Runs `pass` once on the graph `build` makes and compares `before => after` with `expect`.
fn check(pass: &dyn Pass, build: impl FnOnce(&mut Graph) -> Vec<NodeId>, expect: &str) {
    let mut g = Graph::new();
    let outputs = build(&mut g);
    g.set_outputs(outputs);
    let before = g.to_text();
    let changed = pass.run(&mut g).unwrap();
    g.verify().unwrap();
    let got =
        format!("{before}=> {} ({})\n{}", pass.name(), if changed { "changed" } else { "unchanged" }, g.to_text());
    assert_eq!(got.trim(), expect.trim(), "\n{got}");
}

fn c(g: &mut Graph, value: f64) -> NodeId {
    g.constant(value, DType::F32)
}

#[test]
fn dead_code_removes_what_no_output_reads() {
    check(
        &DeadCode,
        |g| {
            let x = g.input(DType::F32, [4]);
            let _unused = g.input(DType::F32, [4]);
            let dead = un(g, UnaryOp::Exp, x);
            let _dead_too = mul(g, dead, dead);
            vec![un(g, UnaryOp::Relu, x)]
        },
        "
graph(%0: f32[4], %1: f32[4]) {
  %2 = exp %0 : f32[4]
  %3 = mul %2, %2 : f32[4]
  %4 = relu %0 : f32[4]
  return %4
}
=> dead_code (changed)
graph(%0: f32[4], %1: f32[4]) {
  %2 = relu %0 : f32[4]
  return %2
}",
    );
}

#[test]
fn common_subexpressions_merge_duplicates() {
    check(
        &CommonSubexpressions,
        |g| {
            let x = g.input(DType::F32, [4]);
            let y = g.input(DType::F32, [4]);
            let a = add(g, x, y);
            let b = add(g, y, x); // commutative: same as a
            let s1 = bin(g, BinaryOp::Sub, x, y);
            let s2 = bin(g, BinaryOp::Sub, y, x); // not commutative: stays
            let n1 = c(g, f64::NAN);
            let n2 = c(g, f64::NAN); // NaN constants with equal bits merge
            let z1 = c(g, 0.0);
            let z2 = c(g, -0.0); // 0.0 and -0.0 differ
            let p = mul(g, a, n1);
            let q = mul(g, b, n2);
            let u = add(g, s1, z1);
            let v = add(g, s2, z2);
            vec![p, q, u, v]
        },
        "
graph(%0: f32[4], %1: f32[4]) {
  %2 = add %0, %1 : f32[4]
  %3 = add %1, %0 : f32[4]
  %4 = sub %0, %1 : f32[4]
  %5 = sub %1, %0 : f32[4]
  %6 = const nan : f32[]
  %7 = const nan : f32[]
  %8 = const 0.0 : f32[]
  %9 = const -0.0 : f32[]
  %10 = mul %2, %6 : f32[4]
  %11 = mul %3, %7 : f32[4]
  %12 = add %4, %8 : f32[4]
  %13 = add %5, %9 : f32[4]
  return %10, %11, %12, %13
}
=> common_subexpressions (changed)
graph(%0: f32[4], %1: f32[4]) {
  %2 = add %0, %1 : f32[4]
  %3 = sub %0, %1 : f32[4]
  %4 = sub %1, %0 : f32[4]
  %5 = const nan : f32[]
  %6 = const 0.0 : f32[]
  %7 = const -0.0 : f32[]
  %8 = mul %2, %5 : f32[4]
  %9 = add %3, %6 : f32[4]
  %10 = add %4, %7 : f32[4]
  return %8, %8, %9, %10
}",
    );
}

#[test]
fn simplify_arithmetic_identities() {
    check(
        &Simplify,
        |g| {
            let x = g.input(DType::F32, [4]);
            let i = g.input(DType::I32, [4]);
            let one = c(g, 1.0);
            let pos_zero = c(g, 0.0);
            let neg_zero = c(g, -0.0);
            let int_zero = g.constant(0.0, DType::I32);
            let a = mul(g, one, x); // 1 * x == x
            let b = bin(g, BinaryOp::Div, a, one); // x / 1 == x
            let d = bin(g, BinaryOp::Sub, b, pos_zero); // x - 0.0 == x
            let e = add(g, d, neg_zero); // x + (-0.0) == x
            let f = un(g, UnaryOp::Neg, e);
            let h = un(g, UnaryOp::Neg, f); // -(-x) == x
            let j = add(g, int_zero, i); // 0 + i == i (ints)
            vec![h, j]
        },
        "
graph(%0: f32[4], %1: i32[4]) {
  %2 = const 1.0 : f32[]
  %3 = const 0.0 : f32[]
  %4 = const -0.0 : f32[]
  %5 = const 0 : i32[]
  %6 = mul %2, %0 : f32[4]
  %7 = div %6, %2 : f32[4]
  %8 = sub %7, %3 : f32[4]
  %9 = add %8, %4 : f32[4]
  %10 = neg %9 : f32[4]
  %11 = neg %10 : f32[4]
  %12 = add %5, %1 : i32[4]
  return %11, %12
}
=> simplify (changed)
graph(%0: f32[4], %1: i32[4]) {
  %2 = const 1.0 : f32[]
  %3 = const 0.0 : f32[]
  %4 = const -0.0 : f32[]
  %5 = const 0 : i32[]
  %6 = neg %0 : f32[4]
  return %0, %1
}",
    );
}

#[test]
fn simplify_leaves_inexact_look_alikes() {
    check(
        &Simplify,
        |g| {
            let x = g.input(DType::F32, [4]);
            let pos_zero = c(g, 0.0);
            let neg_zero = c(g, -0.0);
            let a = add(g, x, pos_zero); // -0.0 + 0.0 is +0.0
            let b = bin(g, BinaryOp::Sub, a, neg_zero); // -0.0 - (-0.0) is +0.0
            let d = mul(g, b, pos_zero); // NaN * 0 is NaN
            let e = bin(g, BinaryOp::Div, d, d); // 0 / 0 is NaN
            let f = g.cast(e, DType::BF16).unwrap();
            let h = g.cast(f, DType::F32).unwrap(); // rounds to bf16
            let one = c(g, 1.0);
            vec![bin(g, BinaryOp::Div, one, h)] // 1 / x is not x
        },
        "
graph(%0: f32[4]) {
  %1 = const 0.0 : f32[]
  %2 = const -0.0 : f32[]
  %3 = add %0, %1 : f32[4]
  %4 = sub %3, %2 : f32[4]
  %5 = mul %4, %1 : f32[4]
  %6 = div %5, %5 : f32[4]
  %7 = cast %6 : bf16[4]
  %8 = cast %7 : f32[4]
  %9 = const 1.0 : f32[]
  %10 = div %9, %8 : f32[4]
  return %10
}
=> simplify (unchanged)
graph(%0: f32[4]) {
  %1 = const 0.0 : f32[]
  %2 = const -0.0 : f32[]
  %3 = add %0, %1 : f32[4]
  %4 = sub %3, %2 : f32[4]
  %5 = mul %4, %1 : f32[4]
  %6 = div %5, %5 : f32[4]
  %7 = cast %6 : bf16[4]
  %8 = cast %7 : f32[4]
  %9 = const 1.0 : f32[]
  %10 = div %9, %8 : f32[4]
  return %10
}",
    );
}

#[test]
fn simplify_float_sums_over_no_axes_keep_adding_zero() {
    // A sum starts from +0.0, so a float sum over no axes is `x + 0.0` (-0.0 becomes +0.0); an
    // integer sum over no axes is the operand as i64, and a max over no axes the operand itself.
    check(
        &Simplify,
        |g| {
            let x = g.input(DType::F32, [4]);
            let i = g.input(DType::I32, [4]);
            let s = op(g, Op::Reduce { op: ReduceOp::Sum, axes: vec![], keepdim: false }, &[x]);
            let m = op(g, Op::Reduce { op: ReduceOp::Max, axes: vec![], keepdim: false }, &[x]);
            let t = op(g, Op::Reduce { op: ReduceOp::Sum, axes: vec![], keepdim: true }, &[i]);
            vec![s, m, t]
        },
        "
graph(%0: f32[4], %1: i32[4]) {
  %2 = sum %0, axes=[] : f32[4]
  %3 = max %0, axes=[] : f32[4]
  %4 = sum %1, axes=[], keepdim : i64[4]
  return %2, %3, %4
}
=> simplify (changed)
graph(%0: f32[4], %1: i32[4]) {
  %2 = cast %1 : i64[4]
  %3 = const 0.0 : f32[]
  %4 = add %0, %3 : f32[4]
  return %4, %0, %2
}",
    );
}

#[test]
fn simplify_casts_and_views() {
    check(
        &Simplify,
        |g| {
            let x = g.input(DType::BF16, [2, 3, 4]);
            let same = g.cast(x, DType::BF16).unwrap(); // cast(x: T, T) == x
            let wide = g.cast(same, DType::F32).unwrap();
            let back = g.cast(wide, DType::BF16).unwrap(); // cast(cast(x, f32), bf16) == x
            let r0 = g.reshape(back, [2, 3, 4]).unwrap(); // reshape to the same shape
            let r1 = g.reshape(r0, [6, 4]).unwrap();
            let r2 = g.reshape(r1, [24]).unwrap(); // reshape of reshape
            let p0 = op(g, Op::Permute { perm: vec![0, 1, 2] }, &[back]); // identity permute
            let p1 = op(g, Op::Permute { perm: vec![2, 0, 1] }, &[p0]);
            let p2 = op(g, Op::Permute { perm: vec![1, 2, 0] }, &[p1]); // undoes p1
            let p3 = op(g, Op::Permute { perm: vec![1, 0, 2] }, &[p2]);
            let p4 = op(g, Op::Permute { perm: vec![2, 1, 0] }, &[p3]); // composes
            let s = op(g, Op::Slice { axis: 1, start: 0, end: 3, step: 1 }, &[back]); // full slice
            let b0 = g.broadcast_to(s, [2, 3, 4]).unwrap(); // same shape
            let b1 = g.broadcast_to(b0, [5, 2, 3, 4]).unwrap();
            let b2 = g.broadcast_to(b1, [6, 5, 2, 3, 4]).unwrap(); // broadcast of broadcast
            let red = op(g, Op::Reduce { op: ReduceOp::Max, axes: vec![], keepdim: true }, &[b2]); // no axes
            vec![r2, p4, red]
        },
        "
graph(%0: bf16[2,3,4]) {
  %1 = cast %0 : bf16[2,3,4]
  %2 = cast %1 : f32[2,3,4]
  %3 = cast %2 : bf16[2,3,4]
  %4 = reshape %3 : bf16[2,3,4]
  %5 = reshape %4 : bf16[6,4]
  %6 = reshape %5 : bf16[24]
  %7 = permute %3, perm=[0,1,2] : bf16[2,3,4]
  %8 = permute %7, perm=[2,0,1] : bf16[4,2,3]
  %9 = permute %8, perm=[1,2,0] : bf16[2,3,4]
  %10 = permute %9, perm=[1,0,2] : bf16[3,2,4]
  %11 = permute %10, perm=[2,1,0] : bf16[4,2,3]
  %12 = slice %3, axis=1, 0:3:1 : bf16[2,3,4]
  %13 = broadcast_to %12 : bf16[2,3,4]
  %14 = broadcast_to %13 : bf16[5,2,3,4]
  %15 = broadcast_to %14 : bf16[6,5,2,3,4]
  %16 = max %15, axes=[], keepdim : bf16[6,5,2,3,4]
  return %6, %11, %16
}
=> simplify (changed)
graph(%0: bf16[2,3,4]) {
  %1 = cast %0 : f32[2,3,4]
  %2 = reshape %0 : bf16[24]
  %3 = reshape %0 : bf16[6,4]
  %4 = permute %0, perm=[2,0,1] : bf16[4,2,3]
  %5 = permute %0, perm=[2,0,1] : bf16[4,2,3]
  %6 = permute %0, perm=[1,0,2] : bf16[3,2,4]
  %7 = broadcast_to %0 : bf16[6,5,2,3,4]
  %8 = broadcast_to %0 : bf16[5,2,3,4]
  return %2, %5, %7
}",
    );
}

#[test]
fn decompose_layer_norm_in_f32_for_bf16() {
    check(
        &Decompose,
        |g| {
            let x = g.input(DType::BF16, [2, 8]);
            let w = g.input(DType::BF16, [8]);
            let b = g.input(DType::BF16, [8]);
            vec![op(g, Op::LayerNorm { eps: 1e-5 }, &[x, w, b])]
        },
        "
graph(%0: bf16[2,8], %1: bf16[8], %2: bf16[8]) {
  %3 = layer_norm %0, %1, %2, eps=1e-5 : bf16[2,8]
  return %3
}
=> decompose (changed)
graph(%0: bf16[2,8], %1: bf16[8], %2: bf16[8]) {
  %3 = cast %0 : f32[2,8]
  %4 = sum %3, axes=[1], keepdim : f32[2,1]
  %5 = const 0.125 : f32[]
  %6 = mul %4, %5 : f32[2,1]
  %7 = sub %3, %6 : f32[2,8]
  %8 = sum %7, axes=[1], keepdim : f32[2,1]
  %9 = mul %7, %7 : f32[2,8]
  %10 = sum %9, axes=[1], keepdim : f32[2,1]
  %11 = const 0.125 : f32[]
  %12 = mul %8, %11 : f32[2,1]
  %13 = sub %7, %12 : f32[2,8]
  %14 = mul %8, %12 : f32[2,1]
  %15 = const 3.4028234663852886e38 : f32[]
  %16 = min %14, %15 : f32[2,1]
  %17 = sub %10, %16 : f32[2,1]
  %18 = const 0.125 : f32[]
  %19 = mul %17, %18 : f32[2,1]
  %20 = const 0.0 : f32[]
  %21 = max %19, %20 : f32[2,1]
  %22 = const 1e-5 : f32[]
  %23 = add %21, %22 : f32[2,1]
  %24 = rsqrt %23 : f32[2,1]
  %25 = mul %13, %24 : f32[2,8]
  %26 = cast %1 : f32[8]
  %27 = mul %25, %26 : f32[2,8]
  %28 = cast %2 : f32[8]
  %29 = add %27, %28 : f32[2,8]
  %30 = cast %29 : bf16[2,8]
  return %30
}",
    );
}

#[test]
fn decompose_integer_and_bool_sums_into_sums_of_i64() {
    // Every reduction after decomposition reduces values of its own dtype; i64 sums and max of
    // i32 stay as they are.
    check(
        &Decompose,
        |g| {
            let i = g.input(DType::I32, [3, 5]);
            let b = g.input(DType::Bool, [5]);
            let l = g.input(DType::I64, [5]);
            let si = op(g, Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keepdim: false }, &[i]);
            let sb = op(g, Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdim: true }, &[b]);
            let sl = op(g, Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keepdim: false }, &[l]);
            let mi = op(g, Op::Reduce { op: ReduceOp::Max, axes: vec![1], keepdim: false }, &[i]);
            vec![si, sb, sl, mi]
        },
        "
graph(%0: i32[3,5], %1: bool[5], %2: i64[5]) {
  %3 = sum %0, axes=[1] : i64[3]
  %4 = sum %1, axes=[0], keepdim : i64[1]
  %5 = sum %2, axes=[0] : i64[]
  %6 = max %0, axes=[1] : i32[3]
  return %3, %4, %5, %6
}
=> decompose (changed)
graph(%0: i32[3,5], %1: bool[5], %2: i64[5]) {
  %3 = cast %1 : i64[5]
  %4 = sum %2, axes=[0] : i64[]
  %5 = max %0, axes=[1] : i32[3]
  %6 = cast %0 : i64[3,5]
  %7 = sum %6, axes=[1] : i64[3]
  %8 = sum %3, axes=[0], keepdim : i64[1]
  return %7, %8, %4, %5
}",
    );
}

#[test]
fn decompose_softmax_rms_norm_and_mean() {
    check(
        &Decompose,
        |g| {
            let x = g.input(DType::F32, [3, 5]);
            let w = g.input(DType::F32, [5]);
            let s = op(g, Op::Softmax { axis: 0 }, &[x]);
            let r = op(g, Op::RmsNorm { eps: 1e-6 }, &[x, w]);
            let m = op(g, Op::Reduce { op: ReduceOp::Mean, axes: vec![1], keepdim: false }, &[x]);
            vec![s, r, m]
        },
        "
graph(%0: f32[3,5], %1: f32[5]) {
  %2 = softmax %0, axis=0 : f32[3,5]
  %3 = rms_norm %0, %1, eps=1e-6 : f32[3,5]
  %4 = mean %0, axes=[1] : f32[3]
  return %2, %3, %4
}
=> decompose (changed)
graph(%0: f32[3,5], %1: f32[5]) {
  %2 = mul %0, %0 : f32[3,5]
  %3 = sum %0, axes=[1] : f32[3]
  %4 = max %0, axes=[0], keepdim : f32[1,5]
  %5 = sub %0, %4 : f32[3,5]
  %6 = exp %5 : f32[3,5]
  %7 = sum %6, axes=[0], keepdim : f32[1,5]
  %8 = reciprocal %7 : f32[1,5]
  %9 = mul %6, %8 : f32[3,5]
  %10 = sum %2, axes=[1], keepdim : f32[3,1]
  %11 = const 0.2 : f32[]
  %12 = mul %10, %11 : f32[3,1]
  %13 = const 1e-6 : f32[]
  %14 = add %12, %13 : f32[3,1]
  %15 = rsqrt %14 : f32[3,1]
  %16 = mul %0, %15 : f32[3,5]
  %17 = mul %16, %1 : f32[3,5]
  %18 = const 0.2 : f32[]
  %19 = mul %3, %18 : f32[3]
  return %9, %17, %19
}",
    );
}

#[test]
fn decompose_keeps_the_composite_location() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [2, 4]);
    let loc = SourceLoc { file: "model.rs".into(), line: 7, col: 13, backward: false, recomputed: false };
    let s = g.add(Op::Softmax { axis: 1 }, &[x], Some(loc)).unwrap();
    g.set_outputs(vec![s]);
    Decompose.run(&mut g).unwrap();
    let text = g.to_text_with_locations();
    let ops: Vec<&str> = text.lines().filter(|l| l.contains(" = ")).collect();
    // max, sub, exp, sum, reciprocal, mul
    assert_eq!(ops.len(), 6, "{text}");
    assert!(ops.iter().all(|l| l.ends_with("@ model.rs:7:13")), "{text}");
}

struct BreakTypes;

impl Pass for BreakTypes {
    fn name(&self) -> &'static str {
        "break_types"
    }

    fn run(&self, g: &mut Graph) -> Result<bool> {
        let out = g.outputs()[0];
        let wrong = g.constant(1.0, DType::I32);
        let user = g.add(Op::Unary { op: UnaryOp::Neg }, &[out], None)?;
        g.replace_all_uses(out, wrong);
        g.set_outputs(vec![user]);
        Ok(true)
    }
}

#[test]
fn pass_manager_verifies_and_records() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [4]);
    let one = c(&mut g, 1.0);
    let a = mul(&mut g, x, one);
    let b = mul(&mut g, x, one);
    let s = add(&mut g, a, b);
    g.set_outputs(vec![s]);

    let mut manager = PassManager::standard().recording();
    assert!(manager.run(&mut g.clone()).unwrap());
    let passes: Vec<&str> = manager.snapshots().iter().map(|s| s.pass).collect();
    assert_eq!(passes, ["simplify", "dead_code"]);
    assert_eq!(manager.snapshots()[1].after, "graph(%0: f32[4]) {\n  %1 = add %0, %0 : f32[4]\n  return %1\n}\n");

    let optimized = optimize(&g).unwrap();
    assert_eq!(optimized.to_text(), manager.snapshots()[1].after);

    // Passes are verified in debug builds (release builds, the fuzz's among them, skip the cost).
    let run = PassManager::new().once(vec![Box::new(BreakTypes)]).run(&mut g);
    if cfg!(debug_assertions) {
        let err = run.unwrap_err();
        assert!(matches!(err, PassError::InvalidGraph { pass: "break_types", .. }), "{err}");
    } else {
        assert!(run.unwrap());
    }
}

/// A joint graph in miniature: `a = tanh(x)` read by the forward (`a @ w`, summed) and, through
/// ops autodiff marked as backward, by the backward after its matmul, which reads `x` too. The
/// backward gets its own `tanh(x)`, marked as backward; the forward's dies at its forward reader.
/// Unmarked graphs, and activations whose operand the backward does not hold (a matmul's `x` only
/// the forward reads: holding it instead would save nothing), keep one `tanh`.
#[test]
fn recompute_gives_the_backward_its_own_copy_of_a_cheap_activation() {
    let fwd = SourceLoc { file: "model.rs".into(), line: 3, col: 9, backward: false, recomputed: false };
    let bwd = fwd.backward_of();
    let build = |mark: bool, backward_reads_x: bool| {
        let mut g = Graph::new();
        let input = g.input(DType::F32, [4, 8]);
        let dy = g.input(DType::F32, [4, 8]);
        let w = g.input(DType::F32, [8, 8]);
        let x = g.add(Op::MatMul, &[input, w], Some(fwd.clone())).unwrap();
        let a = g.add(Op::Unary { op: UnaryOp::Tanh }, &[x], Some(fwd.clone())).unwrap();
        let y = g.add(Op::MatMul, &[a, w], Some(fwd.clone())).unwrap();
        let loss = g.add(Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1], keepdim: false }, &[y], Some(fwd.clone()));
        let loc = Some(if mark { bwd.clone() } else { fwd.clone() });
        // The backward's gradient of `a` comes out of a matmul: it reads `a` after the gap.
        let scaled = g.add(Op::Binary { op: BinaryOp::Mul }, &[dy, y], loc.clone()).unwrap();
        let grad_a = g.add(Op::MatMul, &[scaled, w], loc.clone()).unwrap();
        let uses_a = g.add(Op::Binary { op: BinaryOp::Mul }, &[grad_a, a], loc.clone()).unwrap();
        let other = if backward_reads_x { x } else { dy };
        let grad = g.add(Op::Binary { op: BinaryOp::Add }, &[uses_a, other], loc).unwrap();
        g.set_outputs(vec![loss.unwrap(), grad]);
        g
    };
    let tanhs = |g: &Graph| -> Vec<bool> {
        g.topo_order()
            .into_iter()
            .filter(|&id| matches!(g.node(id).op, Op::Unary { op: UnaryOp::Tanh }))
            .map(|id| g.node(id).loc.as_ref().is_some_and(|l| l.backward))
            .collect()
    };
    let joint = optimize(&build(true, true)).unwrap();
    assert_eq!(tanhs(&joint), [false, true], "{}", joint.to_text());
    // The forward's tanh is read by the forward alone now.
    let is_forward_tanh = |id: NodeId| {
        matches!(joint.node(id).op, Op::Unary { op: UnaryOp::Tanh }) && !joint.node(id).loc.as_ref().unwrap().backward
    };
    let forward_tanh = joint.topo_order().into_iter().find(|&id| is_forward_tanh(id)).unwrap();
    assert!(joint.users(forward_tanh).iter().all(|&u| !joint.node(u).loc.as_ref().unwrap().backward));
    assert_eq!(tanhs(&optimize(&build(false, true)).unwrap()), [false], "nothing marked backward");
    assert_eq!(tanhs(&optimize(&build(true, false)).unwrap()), [false], "x is not held for the backward");
}

#[test]
fn simplify_drops_kept_dims_a_reshape_drops() {
    check(
        &Simplify,
        |g| {
            let x = g.input(DType::F32, [4, 3, 5]);
            let kept = op(g, Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 2], keepdim: true }, &[x]);
            let dropped = g.reshape(kept, [3]).unwrap(); // == sum(x, [0, 2])
                                                         // Left alone: a reshape to another shape, and a kept reduction read twice.
            let other = op(g, Op::Reduce { op: ReduceOp::Max, axes: vec![1], keepdim: true }, &[x]);
            let flat = g.reshape(other, [20]).unwrap();
            let twice = op(g, Op::Reduce { op: ReduceOp::Min, axes: vec![0], keepdim: true }, &[x]);
            let r = g.reshape(twice, [3, 5]).unwrap();
            vec![dropped, flat, r, twice]
        },
        "
graph(%0: f32[4,3,5]) {
  %1 = sum %0, axes=[0,2], keepdim : f32[1,3,1]
  %2 = reshape %1 : f32[3]
  %3 = max %0, axes=[1], keepdim : f32[4,1,5]
  %4 = reshape %3 : f32[20]
  %5 = min %0, axes=[0], keepdim : f32[1,3,5]
  %6 = reshape %5 : f32[3,5]
  return %2, %4, %6, %5
}
=> simplify (changed)
graph(%0: f32[4,3,5]) {
  %1 = sum %0, axes=[0,2], keepdim : f32[1,3,1]
  %2 = max %0, axes=[1], keepdim : f32[4,1,5]
  %3 = reshape %2 : f32[20]
  %4 = min %0, axes=[0], keepdim : f32[1,3,5]
  %5 = reshape %4 : f32[3,5]
  %6 = sum %0, axes=[0,2] : f32[3]
  return %6, %3, %5, %4
}",
    );
}

/// `c = g * scale` read by a later elementwise use and by a large full reduction (an optimizer's
/// clipped gradient, read by its update and by the non-finite check): the reduction gets its own
/// copy of the chain, reading `g` and the scalar; the copy is left out for bf16 chains (a kernel
/// keeps their values in f32 until it stores them) and for small reductions (a row kernel fuses
/// their producers).
#[test]
fn large_reductions_get_their_own_copy_of_a_shared_prologue() {
    let build = |dtype: DType, rows: usize| {
        let mut g = Graph::new();
        let grad = g.input(dtype, [rows, 256]);
        let scale = g.input(dtype, []);
        let wide = g.broadcast_to(scale, [rows, 256]).unwrap();
        let clipped = mul(&mut g, grad, wide);
        let three = g.constant(3.0, dtype);
        let update = mul(&mut g, clipped, three);
        let squares = mul(&mut g, clipped, clipped);
        let norm = sum(&mut g, squares, &[0, 1], false);
        g.set_outputs(vec![update, norm]);
        g
    };
    let muls =
        |g: &Graph| g.node_ids().into_iter().filter(|&id| g.node(id).op == Op::Binary { op: BinaryOp::Mul }).count();
    let copied = optimize(&build(DType::F32, 512)).unwrap();
    assert_eq!(muls(&copied), 4, "{}", copied.to_text());
    let reduce = copied.node_ids().into_iter().find(|&id| matches!(copied.node(id).op, Op::Reduce { .. })).unwrap();
    let reduced = copied.node(reduce).operands[0];
    let copy_of_clipped = copied.node(reduced).operands[0];
    assert!(copied.users(copy_of_clipped).iter().all(|&u| u == reduced), "{}", copied.to_text());
    assert_eq!(muls(&optimize(&build(DType::BF16, 512)).unwrap()), 3, "bf16 values are not copied");
    assert_eq!(muls(&optimize(&build(DType::F32, 4)).unwrap()), 3, "small reductions are not copied");
}

/// A linear layer's weight gradient and its autocast weight copy, laid out for their readers:
/// `transpose(cast(matmul(a, b)))` becomes `cast(matmul(transpose(b), transpose(a)))` (so the
/// optimizer reads the gradient contiguously) and `cast(transpose(w))` read by matmuls becomes
/// `transpose(cast(w))` (so the cast reads and writes contiguously and the transpose is the
/// matmul's layout). A product read another way too keeps its layout.
#[test]
fn simplify_lays_out_matmul_results_and_weight_casts_for_their_readers() {
    let mut g = Graph::new();
    let x = g.input(DType::BF16, [64, 32]);
    let dy = g.input(DType::BF16, [64, 16]);
    let w = g.input(DType::F32, [16, 32]);
    let w_t = op(&mut g, Op::Permute { perm: vec![1, 0] }, &[w]);
    let w_bf16 = g.cast(w_t, DType::BF16).unwrap();
    let y = op(&mut g, Op::MatMul, &[x, w_bf16]);
    let x_t = op(&mut g, Op::Permute { perm: vec![1, 0] }, &[x]);
    let grad_t = op(&mut g, Op::MatMul, &[x_t, dy]);
    let grad_t32 = g.cast(grad_t, DType::F32).unwrap();
    let grad = op(&mut g, Op::Permute { perm: vec![1, 0] }, &[grad_t32]);
    let dz = g.input(DType::BF16, [64, 16]);
    let shared = op(&mut g, Op::MatMul, &[x_t, dz]);
    let shared_t = op(&mut g, Op::Permute { perm: vec![1, 0] }, &[shared]);
    let twice = op(&mut g, Op::Unary { op: UnaryOp::Neg }, &[shared]);
    g.set_outputs(vec![y, grad, shared_t, twice]);
    let opt = optimize(&g).unwrap();
    let text = opt.to_text();
    let out = |i: usize| opt.outputs()[i];
    // The gradient: a cast of a [16, 32] product of dy^T and x.
    let grad = opt.node(out(1));
    assert_eq!(grad.op, Op::Cast, "{text}");
    let product = opt.node(grad.operands[0]);
    assert_eq!((product.op.clone(), product.shape.dims()), (Op::MatMul, &[16, 32][..]), "{text}");
    // The weight copy: cast in w's layout, transposed as the matmul's operand.
    let operand = opt.node(opt.node(out(0)).operands[1]);
    assert_eq!(operand.op, Op::Permute { perm: vec![1, 0] }, "{text}");
    assert_eq!(opt.node(operand.operands[0]).op, Op::Cast, "{text}");
    assert_eq!(opt.node(operand.operands[0]).operands[0], w, "{text}");
    // Read transposed and negated: still one [32, 16] product.
    assert_eq!(opt.node(out(2)).op, Op::Permute { perm: vec![1, 0] }, "{text}");
}

/// An autocast copy of a weight that the backward reads only as a matmul operand is held from
/// the forward, not cast again: the copy would be a kernel of its own.
#[test]
fn recompute_holds_a_cast_only_matmuls_read_in_the_backward() {
    let fwd = SourceLoc { file: "model.rs".into(), line: 3, col: 9, backward: false, recomputed: false };
    let bwd = fwd.backward_of();
    let mut g = Graph::new();
    let x = g.input(DType::BF16, [8, 4]);
    let dy = g.input(DType::BF16, [8, 6]);
    let w = g.input(DType::F32, [4, 6]);
    let w16 = g.cast(w, DType::BF16).unwrap();
    g.set_loc(w16, Some(fwd.clone()));
    let y = g.add(Op::MatMul, &[x, w16], Some(fwd.clone())).unwrap();
    let w16_t = g.add(Op::Permute { perm: vec![1, 0] }, &[w16], Some(bwd.clone())).unwrap();
    let dx = g.add(Op::MatMul, &[dy, w16_t], Some(bwd)).unwrap();
    g.set_outputs(vec![y, dx]);
    let opt = optimize(&g).unwrap();
    let casts = opt.node_ids().into_iter().filter(|&id| opt.node(id).op == Op::Cast).count();
    assert_eq!(casts, 1, "{}", opt.to_text());
}

/// A value the forward and the backward both compute is forward work once merged: the backward's
/// cast of a weight met first in topological order does not make the forward's reader of the
/// merged cast (and so the forward's loss) look like backward work.
#[test]
fn common_subexpressions_keep_the_forward_location_of_a_value_both_passes_compute() {
    let fwd = SourceLoc { file: "model.rs".into(), line: 3, col: 9, backward: false, recomputed: false };
    let mut g = Graph::new();
    let w = g.input(DType::BF16, [4]);
    let backward_cast = g.cast(w, DType::F32).unwrap();
    g.set_loc(backward_cast, Some(fwd.backward_of()));
    let forward_cast = g.cast(w, DType::F32).unwrap();
    g.set_loc(forward_cast, Some(fwd.clone()));
    g.set_outputs(vec![backward_cast, forward_cast]);
    let mut merged = g.clone();
    assert!(CommonSubexpressions.run(&mut merged).unwrap());
    let casts: Vec<NodeId> = merged.node_ids().into_iter().filter(|&id| merged.node(id).op == Op::Cast).collect();
    assert_eq!(casts.len(), 1, "{}", merged.to_text());
    assert_eq!(merged.node(casts[0]).loc.as_ref(), Some(&fwd));
}
