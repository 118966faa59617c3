//! Every plan computes what its graph computes: each case runs through `braze-cpu`'s reference
//! as a graph (`eval_graph`, the f64 oracle) and as plans fused four ways (default, unfused,
//! with a tiny row cache so long-row splitting and multi-reduce items are exercised, and without
//! column reductions folded into row kernels' partials) through
//! `eval_plan` (f32, the GPU kernels' loop structure), on seeded random inputs; results agree
//! within each dtype's tolerance.

mod support;

use braze_cpu::{assert_close, eval_graph, eval_plan, random_tensor};
use braze_ir::{BinaryOp, DType, Graph, HostTensor, NodeId, Op, ReduceOp, UnaryOp};
use braze_passes::{compile_to_plan, FusionOptions};
use braze_workloads::graph;
use support::*;

fn check(name: &str, g: Graph) {
    let inputs: Vec<HostTensor> = g
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, &id)| random_tensor(g.node(id).dtype, g.node(id).shape.clone(), 7 + i as u64))
        .collect();
    check_on(name, g, &inputs);
}

/// [`check`] on given inputs.
fn check_on(name: &str, g: Graph, inputs: &[HostTensor]) {
    g.verify().unwrap();
    let want = eval_graph(&g, inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
    let variants = [
        ("default", FusionOptions::default()),
        ("unfused", FusionOptions { fuse: false, ..FusionOptions::default() }),
        ("short rows", FusionOptions { row_cache_limit: 8, ..FusionOptions::default() }),
        ("no column partials", FusionOptions { column_partials: false, ..FusionOptions::default() }),
    ];
    for (variant, options) in variants {
        let plan = compile_to_plan(&g, &options).unwrap_or_else(|e| panic!("{name} ({variant}): {e}"));
        plan.validate().unwrap_or_else(|e| panic!("{name} ({variant}): {e}\n{plan}"));
        let got = eval_plan(&plan, inputs).unwrap_or_else(|e| panic!("{name} ({variant}): {e}\n{plan}"));
        assert_eq!(got.len(), want.len(), "{name} ({variant}): output count");
        for (j, (actual, expected)) in got.iter().zip(&want).enumerate() {
            if let Err(e) = assert_close(actual, expected) {
                panic!("{name} ({variant}): output {j}: {e}\n{plan}");
            }
        }
    }
}

fn graph(build: impl FnOnce(&mut Graph) -> Vec<braze_ir::NodeId>) -> Graph {
    let mut g = Graph::new();
    let outs = build(&mut g);
    g.set_outputs(outs);
    g
}

#[test]
fn workloads() {
    check("ln_relu_res f32", graph::ln_relu_res(DType::F32, 8, 16).unwrap());
    check("ln_relu_res bf16", graph::ln_relu_res(DType::BF16, 4, 32).unwrap());
    check("ew_chain", graph::ew_chain(DType::F32, &[1000]).unwrap());
    check("multisum", graph::multisum(DType::F32, &[5, 17, 3, 40]).unwrap());
    check("tiny_block", graph::tiny_block(DType::F32, 4, 4, 16).unwrap());
    check("mlp_block f32", graph::mlp_block(DType::F32, 4, 8, 16).unwrap());
    check("mlp_block bf16", graph::mlp_block(DType::BF16, 4, 8, 16).unwrap());
    check("softmax last", softmax(6, 10, 1));
    check("softmax first", softmax(6, 10, 0));
}

#[test]
fn independent_chains_in_one_multi_pointwise_kernel() {
    let plan = compile_to_plan(&independent_chains(), &FusionOptions::default()).unwrap();
    let families: Vec<&str> = plan.kernels.iter().map(|k| k.kind.family()).collect();
    assert_eq!(families, ["multi_pointwise"], "{plan}");
    check("independent chains", independent_chains());
}

#[test]
fn broadcasts_and_multiple_outputs() {
    check(
        "broadcast chain",
        graph(|g| {
            let x = g.input(DType::F32, [4, 3, 6]);
            let a = g.input(DType::F32, [6]);
            let b = g.input(DType::F32, [3, 1]);
            let s = g.input(DType::F32, []);
            let c = g.constant(0.5, DType::F32);
            let xa = mul(g, x, a);
            let bs = mul(g, b, s);
            let y = add(g, xa, bs);
            vec![add(g, y, c)]
        }),
    );
    check(
        "two results used outside",
        graph(|g| {
            let x = g.input(DType::F32, [5, 7]);
            let y = g.input(DType::F32, [5, 7]);
            let a = add(g, x, y);
            let b = mul(g, a, a);
            let r = un(g, UnaryOp::Relu, b);
            vec![a, r]
        }),
    );
    check(
        "side values of a smaller shape",
        graph(|g| {
            let x = g.input(DType::F32, [6, 4]);
            let w = g.input(DType::F32, [4]);
            let e = un(g, UnaryOp::Exp, w);
            vec![mul(g, x, e)]
        }),
    );
    check(
        "where, comparisons and integer casts",
        graph(|g| {
            let x = g.input(DType::F32, [3, 5]);
            let zero = g.constant(0.0, DType::F32);
            let pos = bin(g, BinaryOp::Gt, x, zero);
            let tenth = g.constant(0.1, DType::F32);
            let leak = mul(g, x, tenth);
            let y = op(g, Op::Where, &[pos, x, leak]);
            let i = g.cast(y, DType::I32).unwrap();
            let j = g.input(DType::I32, [5]);
            let k = bin(g, BinaryOp::Div, i, j);
            vec![y, k]
        }),
    );
}

#[test]
fn reductions() {
    check(
        "sum over axis 0",
        graph(|g| {
            let x = g.input(DType::F32, [7, 5]);
            vec![sum(g, x, &[0], false)]
        }),
    );
    check(
        "sum over axes 0 and 2 with prologue and epilogue",
        graph(|g| {
            let x = g.input(DType::F32, [3, 4, 5]);
            let e = un(g, UnaryOp::Exp, x);
            let s = sum(g, e, &[0, 2], true);
            let two = g.constant(2.0, DType::F32);
            vec![mul(g, s, two)]
        }),
    );
    check(
        "full reduction of a large tensor",
        graph(|g| {
            let x = g.input(DType::F32, [100]);
            let sq = mul(g, x, x);
            vec![sum(g, sq, &[0], false)]
        }),
    );
    check(
        "mean of a large 2-D tensor",
        graph(|g| {
            let x = g.input(DType::F32, [10, 12]);
            vec![op(g, Op::Reduce { op: ReduceOp::Mean, axes: vec![0, 1], keepdim: false }, &[x])]
        }),
    );
    check(
        "small full reduction with epilogue",
        graph(|g| {
            let x = g.input(DType::F32, [2, 3]);
            let m = op(g, Op::Reduce { op: ReduceOp::Mean, axes: vec![0, 1], keepdim: true }, &[x]);
            vec![bin(g, BinaryOp::Sub, x, m)]
        }),
    );
    check(
        "per-row values without keepdim",
        graph(|g| {
            let x = g.input(DType::F32, [6, 5]);
            let z = g.input(DType::F32, [6]);
            let s = sum(g, x, &[1], false);
            let two = g.constant(2.0, DType::F32);
            let d = mul(g, s, two);
            vec![add(g, d, z)]
        }),
    );
    check(
        "element values that do not vary along the row",
        graph(|g| {
            let x = g.input(DType::F32, [4, 6]);
            let z = g.input(DType::F32, [4, 1]);
            let s = sum(g, x, &[1], true);
            let zb = g.broadcast_to(z, [4, 6]).unwrap();
            let y = add(g, s, zb);
            let r = add(g, y, x);
            vec![y, r]
        }),
    );
    check(
        "element values that stop varying once their producer joins",
        graph(|g| {
            let x = g.input(DType::F32, [4, 6]);
            let z = g.input(DType::F32, [4, 1]);
            let zb = g.broadcast_to(z, [4, 6]).unwrap();
            let o = add(g, zb, zb);
            let s = sum(g, x, &[1], true);
            let n = add(g, o, s);
            let m = mul(g, o, x);
            vec![n, m]
        }),
    );
    check(
        "stack of means and of squared norms",
        graph(|g| {
            let ts: Vec<_> = [3usize, 9, 4].iter().map(|&n| g.input(DType::F32, [n])).collect();
            let means: Vec<_> = ts
                .iter()
                .map(|&t| op(g, Op::Reduce { op: ReduceOp::Mean, axes: vec![0], keepdim: false }, &[t]))
                .collect();
            let norms: Vec<_> = ts
                .iter()
                .map(|&t| {
                    let sq = mul(g, t, t);
                    sum(g, sq, &[0], false)
                })
                .collect();
            let a = op(g, Op::Stack { axis: 0 }, &means);
            let parts: Vec<_> = norms.iter().map(|&n| g.reshape(n, [1]).unwrap()).collect();
            let b = op(g, Op::Concat { axis: 0 }, &parts);
            vec![a, b]
        }),
    );
    check("rms norm", {
        graph(|g| {
            let x = g.input(DType::F32, [3, 8]);
            let w = g.input(DType::F32, [8]);
            vec![op(g, Op::RmsNorm { eps: 1e-6 }, &[x, w])]
        })
    });
}

#[test]
fn views_matmuls_and_concat() {
    check(
        "permute and slice folded into loads",
        graph(|g| {
            let x = g.input(DType::F32, [3, 4, 5]);
            let y = g.input(DType::F32, [5, 3, 8]);
            let p = op(g, Op::Permute { perm: vec![2, 0, 1] }, &[x]);
            let r = un(g, UnaryOp::Relu, p);
            let s = op(g, Op::Slice { axis: 2, start: 1, end: 8, step: 2 }, &[y]);
            vec![add(g, r, s)]
        }),
    );
    check(
        "reshape of a transpose",
        graph(|g| {
            let x = g.input(DType::F32, [3, 4]);
            let p = op(g, Op::Permute { perm: vec![1, 0] }, &[x]);
            let r = g.reshape(p, [12]).unwrap();
            let two = g.constant(2.0, DType::F32);
            vec![mul(g, r, two)]
        }),
    );
    check(
        "cycle through a view",
        graph(|g| {
            let x = g.input(DType::F32, [4, 4]);
            let y = un(g, UnaryOp::Relu, x);
            let t = op(g, Op::Permute { perm: vec![1, 0] }, &[y]);
            vec![add(g, y, t)]
        }),
    );
    check(
        "matmul with transposed operand, bias and relu",
        graph(|g| {
            let a = g.input(DType::F32, [5, 3]);
            let b = g.input(DType::F32, [5, 4]);
            let bias = g.input(DType::F32, [4]);
            let at = op(g, Op::Permute { perm: vec![1, 0] }, &[a]);
            let mm = op(g, Op::MatMul, &[at, b]);
            let y = add(g, bias, mm);
            vec![un(g, UnaryOp::Relu, y)]
        }),
    );
    check(
        "batched matmuls with broadcast batches",
        graph(|g| {
            let a = g.input(DType::F32, [2, 3, 4]);
            let b = g.input(DType::F32, [4, 5]);
            let c = g.input(DType::F32, [2, 1, 3, 4]);
            let d = g.input(DType::F32, [3, 4, 2]);
            let ab = op(g, Op::MatMul, &[a, b]);
            let cd = op(g, Op::MatMul, &[c, d]);
            vec![un(g, UnaryOp::GeluTanh, ab), cd]
        }),
    );
    check(
        "concat and stack",
        graph(|g| {
            let x = g.input(DType::F32, [2, 3]);
            let y = g.input(DType::F32, [4, 3]);
            let r = un(g, UnaryOp::Relu, x);
            let yt = op(g, Op::Slice { axis: 0, start: 1, end: 4, step: 2 }, &[y]);
            let c = op(g, Op::Concat { axis: 0 }, &[r, y, yt]);
            let s = op(g, Op::Stack { axis: 1 }, &[x, r]);
            vec![c, s]
        }),
    );
    check(
        "outputs without kernels and constant outputs",
        graph(|g| {
            let x = g.input(DType::F32, [2, 6]);
            let r = g.reshape(x, [3, 4]).unwrap();
            let t = op(g, Op::Permute { perm: vec![1, 0] }, &[x]);
            let c = g.constant(3.0, DType::F32);
            let cb = g.broadcast_to(c, [2, 2]).unwrap();
            vec![r, x, t, c, cb, r]
        }),
    );
}

/// Independent full reductions read by a stack, a chain of adds, separate outputs, a scale per
/// result, an or of non-finite checks, and a mix of sums and maxes; items of many sizes, empty
/// ones included, and inputs holding NaN and infinities.
#[test]
fn independent_full_reductions_whatever_reads_them() {
    const SIZES: [usize; 7] = [300, 0, 7, 20_000, 1, 513, 0];
    let inputs = |g: &mut Graph, dtype: DType| -> Vec<NodeId> { SIZES.iter().map(|&n| g.input(dtype, [n])).collect() };
    let sum_sq = |g: &mut Graph, x: NodeId| {
        let sq = mul(g, x, x);
        sum(g, sq, &[0], false)
    };
    let reduce = |g: &mut Graph, op: ReduceOp, x: NodeId| {
        g.add(Op::Reduce { op, axes: vec![0], keepdim: false }, &[x], None).unwrap()
    };
    let stacked = |g: &mut Graph, xs: &[NodeId]| {
        let parts: Vec<NodeId> = xs.iter().map(|&x| g.reshape(x, [1]).unwrap()).collect();
        g.add(Op::Concat { axis: 0 }, &parts, None).unwrap()
    };
    let cases: Vec<(&str, Graph)> = vec![
        (
            "stack of sums and maxes",
            graph(|g| {
                let xs = inputs(g, DType::F32);
                let rs: Vec<NodeId> = xs
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| if i % 2 == 0 { sum_sq(g, x) } else { reduce(g, ReduceOp::Max, x) })
                    .collect();
                vec![stacked(g, &rs)]
            }),
        ),
        (
            "chain of adds",
            graph(|g| {
                let xs = inputs(g, DType::BF16);
                let mut total: Option<NodeId> = None;
                for x in xs {
                    let x32 = g.cast(x, DType::F32).unwrap();
                    let s = sum_sq(g, x32);
                    total = Some(match total {
                        Some(t) => add(g, t, s),
                        None => s,
                    });
                }
                let norm = un(g, UnaryOp::Sqrt, total.unwrap());
                let c = g.constant(1e-6, DType::F32);
                let scale = add(g, norm, c);
                vec![norm, un(g, UnaryOp::Reciprocal, scale)]
            }),
        ),
        ("separate outputs", graph(|g| inputs(g, DType::F32).into_iter().map(|x| sum_sq(g, x)).collect())),
        (
            "scale per result",
            graph(|g| {
                let xs = inputs(g, DType::F32);
                xs.into_iter()
                    .enumerate()
                    .map(|(i, x)| {
                        let m = reduce(g, ReduceOp::Min, x);
                        let c = g.constant(0.25 * (i + 1) as f64, DType::F32);
                        mul(g, m, c)
                    })
                    .collect()
            }),
        ),
        (
            "or of non-finite checks",
            graph(|g| {
                let mut xs = inputs(g, DType::F32);
                xs.extend(inputs(g, DType::F16));
                let mut found: Option<NodeId> = None;
                for x in xs {
                    let finite = un(g, UnaryOp::IsFinite, x);
                    let bad = un(g, UnaryOp::Not, finite);
                    let any = reduce(g, ReduceOp::Max, bad);
                    found = Some(match found {
                        Some(f) => bin(g, BinaryOp::Or, f, any),
                        None => any,
                    });
                }
                vec![found.unwrap()]
            }),
        ),
        (
            "prologues over several tensors",
            graph(|g| {
                // sum((p - q)^2) and dot(p, q) of f32 leaves, max(|a * b * c|) of bf16 ones.
                let (ps, qs) = (inputs(g, DType::F32), inputs(g, DType::F32));
                let narrow: Vec<Vec<NodeId>> = (0..3).map(|_| inputs(g, DType::BF16)).collect();
                let mut outs = Vec::new();
                for i in 0..SIZES.len() {
                    let (p, q) = (ps[i], qs[i]);
                    outs.push(match i % 3 {
                        0 => {
                            let d = bin(g, BinaryOp::Sub, p, q);
                            sum_sq(g, d)
                        }
                        1 => {
                            let pq = mul(g, p, q);
                            sum(g, pq, &[0], false)
                        }
                        _ => {
                            let wide: Vec<NodeId> =
                                narrow.iter().map(|xs| g.cast(xs[i], DType::F32).unwrap()).collect();
                            let ab = mul(g, wide[0], wide[1]);
                            let abc = mul(g, ab, wide[2]);
                            let a = un(g, UnaryOp::Abs, abc);
                            reduce(g, ReduceOp::Max, a)
                        }
                    });
                }
                vec![stacked(g, &outs)]
            }),
        ),
        (
            "sums, means and maxes mixed",
            graph(|g| {
                let xs = inputs(g, DType::F32);
                let s = sum_sq(g, xs[0]);
                let m = reduce(g, ReduceOp::Max, xs[3]);
                let n = g.constant(1.0 / 513.0, DType::F32);
                let total = sum(g, xs[5], &[0], false);
                let mean = mul(g, total, n);
                let ratio = bin(g, BinaryOp::Div, s, m);
                vec![ratio, add(g, mean, m), stacked(g, &[s, m, mean])]
            }),
        ),
    ];
    for (name, g) in cases {
        // Every reduction in one launch, and nothing after it but views.
        let plan = compile_to_plan(&g, &FusionOptions::default()).unwrap();
        let families: Vec<&str> = plan.kernels.iter().map(|k| k.kind.family()).collect();
        assert_eq!(families, vec!["multi_reduce"], "{name}\n{plan}");
        let random: Vec<HostTensor> = g
            .inputs()
            .iter()
            .enumerate()
            .map(|(i, &id)| random_tensor(g.node(id).dtype, g.node(id).shape.clone(), 31 + i as u64))
            .collect();
        check_on(name, g.clone(), &random);
        // NaN in one item and an infinity in another: the non-finite check flips, sums go NaN.
        let mut special = random.clone();
        for (i, value) in [(0, f64::NAN), (3, f64::NEG_INFINITY)] {
            let t = &special[i];
            let mut values = t.to_f64_vec();
            let middle = values.len() / 2;
            values[middle] = value;
            special[i] = HostTensor::from_f64(t.dtype(), t.shape().clone(), &values).unwrap();
        }
        check_on(&format!("{name} with NaN and inf"), g, &special);
    }
}

#[test]
fn widened_intermediates_stored_narrow() {
    // The row kernel stores the bf16 sum its readers widen as they load it. Small integers, so
    // that the kernel's unrounded bf16 sum and the reference's rounded one agree.
    let ints = |seed: i64| {
        let values: Vec<f64> = (0..37 * 19).map(|i| ((i * 7 + seed * 3) % 17 - 8) as f64).collect();
        HostTensor::from_f64(DType::BF16, [37, 19], &values).unwrap()
    };
    check_on(
        "widened intermediate",
        graph(|g| {
            let x = g.input(DType::BF16, [37, 19]);
            let y = g.input(DType::BF16, [37, 19]);
            let s = add(g, x, y);
            let c = g.cast(s, DType::F32).unwrap();
            let rows = sum(g, c, &[1], true);
            let centred = bin(g, BinaryOp::Sub, c, rows);
            let squares = mul(g, centred, centred);
            let exp = un(g, UnaryOp::Exp, c);
            vec![sum(g, squares, &[1], false), sum(g, c, &[0], false), exp]
        }),
        &[ints(1), ints(2)],
    );
}

/// A large full reduction with its own copy of a prologue that an update reads too (see the
/// `reduction_prologues` pass): the plan still computes what the graph computes, NaN and infinity
/// included.
#[test]
fn reductions_with_a_copied_prologue() {
    let g = graph(|g| {
        let grad = g.input(DType::F32, [300, 256]);
        let scale = g.input(DType::F32, []);
        let wide = g.broadcast_to(scale, [300, 256]).unwrap();
        let clipped = mul(g, grad, wide);
        let finite = un(g, UnaryOp::IsFinite, clipped);
        let bad = un(g, UnaryOp::Not, finite);
        let any_bad = op(g, Op::Reduce { op: ReduceOp::Max, axes: vec![0, 1], keepdim: false }, &[bad]);
        let squares = mul(g, clipped, clipped);
        let norm = sum(g, squares, &[0, 1], false);
        let three = g.constant(3.0, DType::F32);
        let update = mul(g, clipped, three);
        vec![update, norm, any_bad]
    });
    let grad = random_tensor(DType::F32, vec![300, 256], 11);
    let scale = random_tensor(DType::F32, vec![], 12);
    check_on("copied prologue", g.clone(), &[grad.clone(), scale.clone()]);
    let mut values = grad.to_f64_vec();
    values[1234] = f64::INFINITY;
    values[77] = f64::NAN;
    let non_finite = HostTensor::from_f64(DType::F32, vec![300, 256], &values).unwrap();
    check_on("copied prologue, non-finite", g, &[non_finite, scale]);
}

/// A bf16 value computed in a kernel lives in registers as f32, but a comparison and a cast
/// observe it rounded, as the reference holds it: `cos(x) == b`, with `b` the bf16 rounding of
/// the cosine, holds everywhere, also read through casts to f32 (gradient fuzz seed 5,101,752:
/// one kernel compared the f32 cosine, another its stored rounding).
#[test]
fn comparisons_and_casts_observe_computed_bf16_values_rounded() {
    let x = random_tensor(DType::BF16, vec![64], 3);
    let cosines: Vec<f64> = x.to_f64_vec().iter().map(|v| v.cos()).collect();
    let b = HostTensor::from_f64(DType::BF16, [64], &cosines).unwrap();
    let g = graph(|g| {
        let x = g.input(DType::BF16, [64]);
        let b = g.input(DType::BF16, [64]);
        let c = g.add(Op::Unary { op: UnaryOp::Cos }, &[x], None).unwrap();
        let direct = g.add(Op::Binary { op: BinaryOp::Eq }, &[c, b], None).unwrap();
        let (c32, b32) = (g.cast(c, DType::F32).unwrap(), g.cast(b, DType::F32).unwrap());
        let widened = g.add(Op::Binary { op: BinaryOp::Eq }, &[c32, b32], None).unwrap();
        vec![direct, widened]
    });
    let inputs = [x, b];
    for out in eval_graph(&g, &inputs).unwrap() {
        assert!(out.to_f64_vec().iter().all(|&v| v == 1.0), "the reference sees every tie");
    }
    check_on("bf16 ties", g, &inputs);
}

/// Column reductions folded into a row kernel's partials: sums, a mean and a max of values the
/// row kernel stores or computes, over rows that groups divide and rows that they do not, f32
/// and bf16, next to a per-column epilogue.
#[test]
fn column_reductions_from_row_kernel_partials() {
    for (dtype, rows, cols) in [(DType::F32, 256, 64), (DType::F32, 100, 48), (DType::BF16, 77, 40)] {
        let name = format!("partials {dtype} {rows}x{cols}");
        let g = graph(|g| {
            let x = g.input(dtype, [rows, cols]);
            let w = g.input(DType::F32, [cols]);
            let xf = g.cast(x, DType::F32).unwrap();
            let mean = op(g, Op::Reduce { op: ReduceOp::Mean, axes: vec![1], keepdim: true }, &[xf]);
            let centred = bin(g, BinaryOp::Sub, xf, mean);
            let y = g.cast(centred, dtype).unwrap();
            let yf = g.cast(y, DType::F32).unwrap();
            let product = mul(g, xf, yf);
            let sum_y = sum(g, yf, &[0], false);
            let sum_xy = sum(g, product, &[0], false);
            let mean_x = op(g, Op::Reduce { op: ReduceOp::Mean, axes: vec![0], keepdim: false }, &[xf]);
            let max_y = op(g, Op::Reduce { op: ReduceOp::Max, axes: vec![0], keepdim: false }, &[yf]);
            let scaled = mul(g, sum_xy, w);
            vec![y, sum_y, scaled, mean_x, max_y]
        });
        let plan = compile_to_plan(&g, &FusionOptions::default()).unwrap();
        let partials: usize = plan
            .kernels
            .iter()
            .map(|k| match &k.kind {
                braze_plan::KernelKind::Row(row) => row.partials.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(partials, 4, "{name}: every column reduction folds\n{plan}");
        check(&name, g);
    }
}
