//! The whole pipeline on a table of functions covering every kernel family: IR -> passes -> plan
//! -> CUDA C, snapshotted per case in `snapshots/pipeline/` (bless with `INSTA_UPDATE=always`),
//! every kernel compiled by NVRTC for sm_90 without spills (when NVRTC is found), and the fused
//! plan run by `eval_plan` compared with the f64 reference `eval_graph` on random inputs.
//!
//! Graphs are built directly (the benchmark workloads by `braze_workloads::graph`), without
//! source locations, so snapshots do not change when this file does. Outputs are compared with the tolerance of the narrowest float dtype the graph
//! computes in: fused kernels keep bf16 intermediates in f32 where the reference rounds every op.

mod common;

use braze_codegen::{default_config, generate, KernelCode, Target};
use braze_cpu::{eval_graph, eval_plan};
use braze_ir::{BinaryOp, DType, Graph, HostData, HostTensor, Literal, NodeId, Op, ReduceOp, UnaryOp};
use braze_passes::{compile_to_plan, optimize, FusionOptions, PassManager};
use braze_plan::Plan;
use braze_workloads::graph;
use common::{
    compare_outputs, compile_for_sm90, narrowest_float, nvrtc_enabled, projected_attention, random_inputs, wide_graph,
    Builder,
};
use std::collections::BTreeSet;
use std::fmt::Write;

/// What the case's inputs hold when the plan is run against the reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inputs {
    /// `random_tensor` data.
    Random,
    /// `random_tensor` data with NaN, +-Inf and signed zeros injected into float inputs.
    WithSpecials,
    /// Too large to evaluate: the plan and the CUDA C are checked, nothing runs.
    NotEvaluated,
}

struct Case {
    name: &'static str,
    build: fn() -> Graph,
    inputs: Inputs,
    /// The family of each kernel of the plan, in order: the fusion decisions the case pins.
    kernels: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        name: "ln_relu_res_f32",
        build: || graph::ln_relu_res(DType::F32, 64, 256).unwrap(),
        inputs: Inputs::Random,
        kernels: &["row"],
    },
    Case {
        name: "ln_relu_res_bf16",
        build: || graph::ln_relu_res(DType::BF16, 64, 256).unwrap(),
        inputs: Inputs::Random,
        kernels: &["row"],
    },
    Case {
        name: "ew_chain_f32",
        build: || graph::ew_chain(DType::F32, &[4099]).unwrap(),
        inputs: Inputs::WithSpecials,
        kernels: &["pointwise"],
    },
    Case {
        name: "ew_chain_bf16",
        build: || graph::ew_chain(DType::BF16, &[4099]).unwrap(),
        inputs: Inputs::WithSpecials,
        kernels: &["pointwise"],
    },
    Case {
        name: "multisum_k6",
        build: || graph::multisum(DType::F32, &[1000, 0, 1, 37, 5000, 20_000]).unwrap(),
        inputs: Inputs::Random,
        kernels: &["multi_reduce"],
    },
    Case {
        name: "squared_norms_k5",
        build: || squared_norms(&[300, 1, 0, 4096, 77]),
        inputs: Inputs::Random,
        kernels: &["multi_reduce", "pointwise"],
    },
    Case {
        name: "grad_norm_and_clip_scale",
        build: || grad_norm(&[300, 1, 0, 40_000, 77], &[5000, 33]),
        inputs: Inputs::WithSpecials,
        kernels: &["multi_reduce"],
    },
    Case {
        name: "any_non_finite",
        build: || any_non_finite(&[300, 1, 0, 40_000, 77], &[5000, 33]),
        inputs: Inputs::WithSpecials,
        kernels: &["multi_reduce"],
    },
    Case {
        name: "reductions_scaled_and_returned",
        build: || reductions_scaled_and_returned(&[300, 1, 0, 40_000, 77, 2048]),
        inputs: Inputs::Random,
        kernels: &["multi_reduce"],
    },
    Case {
        name: "tiny_block_4_layers",
        build: || graph::tiny_block(DType::F32, 4, 16, 256).unwrap(),
        inputs: Inputs::Random,
        kernels: &["row"],
    },
    Case { name: "rms_norm", build: || rms_norm(32, 768), inputs: Inputs::Random, kernels: &["row"] },
    Case { name: "softmax_last_axis", build: || softmax(64, 1000, 1), inputs: Inputs::Random, kernels: &["row"] },
    Case {
        name: "softmax_axis_0",
        build: || softmax(100, 48, 0),
        inputs: Inputs::Random,
        // The exponentials' kernel also folds their column sums over groups of rows.
        kernels: &["column", "row", "column", "pointwise"],
    },
    Case {
        name: "broadcast_chain",
        build: || broadcast_chain(33, 130),
        inputs: Inputs::WithSpecials,
        kernels: &["pointwise"],
    },
    Case {
        name: "multi_output_pointwise",
        build: || multi_output_pointwise(1000),
        inputs: Inputs::WithSpecials,
        kernels: &["pointwise"],
    },
    Case { name: "where_masks", build: || where_masks(777), inputs: Inputs::WithSpecials, kernels: &["pointwise"] },
    // Independent casts and constants: one multi-pointwise launch. Independent integer ops and
    // comparisons over the same inputs: one pointwise kernel, reading each input once.
    Case { name: "casts", build: || casts(515), inputs: Inputs::WithSpecials, kernels: &["multi_pointwise"] },
    Case { name: "int_arithmetic", build: || int_arithmetic(1001), inputs: Inputs::Random, kernels: &["pointwise"] },
    Case {
        name: "comparisons_and_logic",
        build: || comparisons_and_logic(640),
        inputs: Inputs::WithSpecials,
        kernels: &["pointwise"],
    },
    Case {
        name: "reduce_axis_0",
        build: || reduce_axes(&[300, 70], ReduceOp::Sum, &[0]),
        inputs: Inputs::Random,
        kernels: &["column"],
    },
    Case {
        name: "reduce_leading_axes_bf16",
        build: || reduce_leading_bf16(&[40, 9, 77]),
        inputs: Inputs::Random,
        kernels: &["column"],
    },
    Case {
        name: "reduce_axis_0_many_rows",
        build: || reduce_axes(&[20_000, 7], ReduceOp::Max, &[0]),
        inputs: Inputs::WithSpecials,
        kernels: &["column"],
    },
    Case {
        name: "layer_norm_backward",
        build: || norm_backward(Op::LayerNorm { eps: 1e-5 }, 48, 96),
        inputs: Inputs::Random,
        kernels: &["row", "column"],
    },
    Case {
        name: "residual_layer_norm_backward_bf16",
        build: || residual_layer_norm_backward_bf16(48, 96),
        inputs: Inputs::Random,
        kernels: &["row", "column"],
    },
    Case {
        name: "rms_norm_backward",
        build: || norm_backward(Op::RmsNorm { eps: 1e-6 }, 48, 96),
        inputs: Inputs::Random,
        kernels: &["row", "column"],
    },
    Case { name: "softmax_backward", build: || softmax_backward(40, 72), inputs: Inputs::Random, kernels: &["row"] },
    Case {
        name: "log_softmax_last_axis",
        build: || log_softmax(DType::F32, 64, 1000),
        inputs: Inputs::WithSpecials,
        kernels: &["row"],
    },
    // Random i64 targets and classes in -8..=8: rows with one class, several or none (NaN),
    // and rows ignored (target -8).
    Case {
        name: "cross_entropy_backward",
        build: || cross_entropy_backward(DType::F32, 16, 40),
        inputs: Inputs::Random,
        kernels: &["row", "row", "row"],
    },
    Case {
        name: "cross_entropy_vocab_backward_bf16",
        build: || cross_entropy_backward(DType::BF16, 4, 50_304),
        inputs: Inputs::Random,
        kernels: &["row", "row", "row"],
    },
    // A GPT-style embedding: token rows gathered inside the kernel that adds the positions and
    // casts; the weight's gradient a scatter-add of its own.
    Case {
        name: "embedding_backward_bf16",
        build: || embedding_backward(DType::BF16, 50, 16, [4, 8]),
        inputs: Inputs::Random,
        kernels: &["multi_pointwise", "index_add", "multi_pointwise"],
    },
    Case {
        name: "dropout_backward_bf16",
        build: || dropout_backward(DType::BF16, 8, 33),
        inputs: Inputs::Random,
        kernels: &["pointwise"],
    },
    // GPT-2's vocabulary: rows longer than a block's cache, read in chunks.
    Case {
        name: "log_softmax_vocab_backward_bf16",
        build: || log_softmax_backward(DType::BF16, 4, 50_257),
        inputs: Inputs::Random,
        kernels: &["row"],
    },
    Case {
        name: "linear_backward",
        build: || linear_backward(24, 40, 56),
        inputs: Inputs::Random,
        kernels: &["column", "matmul", "matmul"],
    },
    Case {
        name: "reduce_middle_axis",
        build: || reduce_axes(&[6, 50, 9], ReduceOp::Max, &[1]),
        inputs: Inputs::WithSpecials,
        kernels: &["row"],
    },
    Case {
        name: "reduce_all_axes_small",
        build: || reduce_axes(&[7, 33, 5], ReduceOp::Sum, &[0, 1, 2]),
        inputs: Inputs::Random,
        kernels: &["row"],
    },
    Case {
        name: "reduce_all_axes_large",
        build: || reduce_axes(&[160, 130], ReduceOp::Sum, &[0, 1]),
        inputs: Inputs::Random,
        kernels: &["multi_reduce"],
    },
    Case {
        name: "mean_max_min_keepdim",
        build: || mean_max_min_keepdim(12, 40),
        inputs: Inputs::Random,
        kernels: &["row", "row", "column", "row"],
    },
    Case {
        name: "permute_slice_loads",
        build: permute_slice_loads,
        inputs: Inputs::WithSpecials,
        kernels: &["pointwise"],
    },
    Case {
        name: "concat_and_stack",
        build: concat_and_stack,
        inputs: Inputs::Random,
        kernels: &["pointwise", "concat", "concat"],
    },
    Case {
        name: "matmul_bias_relu",
        build: || matmul_bias_relu(16, 32, 24),
        inputs: Inputs::Random,
        kernels: &["matmul"],
    },
    Case {
        name: "mlp_block_bf16_small",
        build: || graph::mlp_block(DType::BF16, 8, 32, 64).unwrap(),
        inputs: Inputs::Random,
        kernels: &["matmul", "pointwise", "matmul", "row"],
    },
    Case {
        name: "output_is_reshaped_input",
        build: output_is_reshaped_input,
        inputs: Inputs::Random,
        kernels: &["pointwise"],
    },
    Case { name: "constant_output", build: constant_output, inputs: Inputs::Random, kernels: &["multi_pointwise"] },
    Case {
        name: "attention_causal_f32",
        build: || attention(DType::F32, [1, 2, 17, 64], true),
        inputs: Inputs::Random,
        kernels: &["attention"],
    },
    Case {
        name: "attention_bf16_head_dim_128",
        build: || attention(DType::BF16, [2, 1, 33, 128], false),
        inputs: Inputs::Random,
        kernels: &["attention"],
    },
    Case {
        name: "attention_backward_causal_bf16",
        build: || attention_backward(DType::BF16, [1, 2, 17, 64], true),
        inputs: Inputs::Random,
        kernels: &["attention", "row", "attention_backward", "attention_backward"],
    },
    Case {
        name: "attention_of_a_fused_projection_bf16",
        build: || projected_attention(DType::BF16, [2, 40, 3, 64], false),
        inputs: Inputs::Random,
        kernels: &["attention"],
    },
    Case {
        name: "attention_backward_of_a_fused_projection_bf16",
        build: || projected_attention(DType::BF16, [2, 40, 3, 64], true),
        inputs: Inputs::Random,
        // dq, dk and dv written straight into the columns of the projection's gradient: no concat.
        kernels: &["attention", "row", "attention_backward", "attention_backward"],
    },
    Case {
        name: "pointwise_over_2_31_elements",
        build: huge_pointwise,
        inputs: Inputs::NotEvaluated,
        kernels: &["pointwise"],
    },
];

// ---- the functions ----------------------------------------------------------------------------

/// `sqrt(stack([(t * t).sum() for t in ts]))`: the L2 norms of K tensors of different ranks.
fn squared_norms(sizes: &[usize]) -> Graph {
    let mut b = Builder::new();
    let squares: Vec<NodeId> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            // Alternate ranks 1 and 2 ([n] and [1, n]), so items are not all laid out alike.
            let t = if i % 2 == 0 { b.input(DType::F32, [n]) } else { b.input(DType::F32, [1, n]) };
            let sq = b.mul(t, t);
            let axes: Vec<usize> = (0..b.g.node(sq).shape.rank()).collect();
            b.reduce(ReduceOp::Sum, sq, &axes, false)
        })
        .collect();
    let stacked = b.op(Op::Stack { axis: 0 }, &squares);
    let norms = b.un(UnaryOp::Sqrt, stacked);
    b.finish(vec![norms])
}

/// The global norm of f32 and bf16 gradients (sum of squares per gradient, folded with add) and
/// `clip_grad_norm`'s scale `min(1, 1 / (norm + 1e-6))`.
fn grad_norm(f32_sizes: &[usize], bf16_sizes: &[usize]) -> Graph {
    let mut b = Builder::new();
    let mut total: Option<NodeId> = None;
    for (dtype, sizes) in [(DType::F32, f32_sizes), (DType::BF16, bf16_sizes)] {
        for &n in sizes {
            let t = b.input(dtype, [n]);
            let t = if dtype == DType::F32 { t } else { b.cast(t, DType::F32) };
            let sq = b.mul(t, t);
            let s = b.reduce(ReduceOp::Sum, sq, &[0], false);
            total = Some(match total {
                Some(total) => b.add(total, s),
                None => s,
            });
        }
    }
    let norm = b.un(UnaryOp::Sqrt, total.expect("gradients"));
    let eps = b.constant(1e-6, DType::F32);
    let shifted = b.add(norm, eps);
    let inverse = b.un(UnaryOp::Reciprocal, shifted);
    let one = b.constant(1.0, DType::F32);
    let scale = b.bin(BinaryOp::Min, inverse, one);
    b.finish(vec![norm, scale])
}

/// `any(!isfinite(t))` per tensor folded with `logical_or`, as an optimizer step's skip check.
fn any_non_finite(f32_sizes: &[usize], f16_sizes: &[usize]) -> Graph {
    let mut b = Builder::new();
    let mut found: Option<NodeId> = None;
    for (dtype, sizes) in [(DType::F32, f32_sizes), (DType::F16, f16_sizes)] {
        for &n in sizes {
            let t = b.input(dtype, [n]);
            let finite = b.un(UnaryOp::IsFinite, t);
            let bad = b.un(UnaryOp::Not, finite);
            let any = b.reduce(ReduceOp::Max, bad, &[0], false);
            found = Some(match found {
                Some(f) => b.bin(BinaryOp::Or, f, any),
                None => any,
            });
        }
    }
    b.finish(vec![found.expect("tensors")])
}

/// Sums, maxes and means of several tensors, each scaled, returned as outputs of their own and
/// stacked.
fn reductions_scaled_and_returned(sizes: &[usize]) -> Graph {
    let mut b = Builder::new();
    let mut outputs = Vec::new();
    let mut results = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let t = b.input(DType::F32, [n]);
        let op = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Mean][i % 3];
        let r = b.reduce(op, t, &[0], false);
        let c = b.constant(0.5 + i as f64, DType::F32);
        outputs.push(b.mul(r, c));
        results.push(r);
    }
    outputs.push(b.op(Op::Stack { axis: 0 }, &results));
    b.finish(outputs)
}

/// `rms_norm(x, w)`.
fn rms_norm(rows: usize, hidden: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [rows, hidden]);
    let w = b.input(DType::F32, [hidden]);
    let y = b.op(Op::RmsNorm { eps: 1e-6 }, &[x, w]);
    b.finish(vec![y])
}

fn softmax(rows: usize, cols: usize, axis: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [rows, cols]);
    let y = b.op(Op::Softmax { axis }, &[x]);
    b.finish(vec![y])
}

fn log_softmax(dtype: DType, rows: usize, cols: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input(dtype, [rows, cols]);
    let y = b.op(Op::LogSoftmax { axis: 1 }, &[x]);
    b.finish(vec![y])
}

/// `log_softmax(x, axis=1)` and its gradient for an incoming gradient `dy`.
fn log_softmax_backward(dtype: DType, rows: usize, cols: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input(dtype, [rows, cols]);
    let y = b.op(Op::LogSoftmax { axis: 1 }, &[x]);
    let dy = b.input(dtype, [rows, cols]);
    let mut g = gradients(b, &[(y, dy)], &[x]);
    let mut outputs = vec![y];
    outputs.extend(g.outputs().iter().copied());
    g.set_outputs(outputs);
    g
}

/// `Tensor::dropout(0.25)` of `x [rows, cols]` as the frontend records it (Philox bits at counter
/// `offset + row_lane + col_lane` under `seed`, kept where at least round(0.25 * 2^32)), and its
/// gradient for an incoming `dy`.
fn dropout_backward(dtype: DType, rows: usize, cols: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input(dtype, [rows, cols]);
    let seed = b.input(DType::I64, []);
    let offset = b.input(DType::I64, []);
    let row_lane = b.input(DType::I64, [rows, 1]);
    let col_lane = b.input(DType::I64, [1, cols]);
    let counter = b.bin(BinaryOp::Add, offset, row_lane);
    let counter = b.bin(BinaryOp::Add, counter, col_lane);
    let bits = b.bin(BinaryOp::Philox, counter, seed);
    let threshold = b.constant(1_073_741_824.0, DType::I64);
    let keep = b.bin(BinaryOp::Ge, bits, threshold);
    let wide = b.cast(x, DType::F32);
    let scale = b.constant(1.0 / 0.75, DType::F32);
    let scaled = b.bin(BinaryOp::Mul, wide, scale);
    let zero = b.constant(0.0, DType::F32);
    let kept = b.op(Op::Where, &[keep, scaled, zero]);
    let y = b.cast(kept, dtype);
    let dy = b.input(dtype, [rows, cols]);
    let mut g = gradients(b, &[(y, dy)], &[x]);
    let mut outputs = vec![y];
    outputs.extend(g.outputs().iter().copied());
    g.set_outputs(outputs);
    g
}

/// The mean cross entropy of `logits [rows, classes]` and its gradient for an incoming `dloss`.
fn cross_entropy_backward(dtype: DType, rows: usize, classes: usize) -> Graph {
    let mut b = Builder::new();
    let logits = b.input(dtype, [rows, classes]);
    let targets = b.input(DType::I64, [rows]);
    let class_ids = b.input(DType::I64, [classes]);
    let loss = b.op(Op::CrossEntropy { ignore_index: -8 }, &[logits, targets, class_ids]);
    let dloss = b.input(dtype, []);
    let mut g = gradients(b, &[(loss, dloss)], &[logits]);
    let mut outputs = vec![loss];
    outputs.extend(g.outputs().iter().copied());
    g.set_outputs(outputs);
    g
}

/// `cast(embedding(weight, clamp(idx)) + positions)` and the weight's gradient for an incoming
/// `dout`; random indices are clamped into `0..vocab` (repeats at the ends).
fn embedding_backward(dtype: DType, vocab: usize, dim: usize, tokens: [usize; 2]) -> Graph {
    let mut b = Builder::new();
    let weight = b.input(dtype, [vocab, dim]);
    let raw = b.input(DType::I32, tokens);
    let positions = b.input(DType::F32, [tokens[1], dim]);
    let high = b.g.constant((vocab - 1) as f64, DType::I32);
    let low = b.g.constant(0.0, DType::I32);
    let capped = b.op(Op::Binary { op: BinaryOp::Min }, &[raw, high]);
    let idx = b.op(Op::Binary { op: BinaryOp::Max }, &[capped, low]);
    let rows = b.op(Op::IndexSelect { axis: 0 }, &[weight, idx]);
    let wide = b.g.cast(rows, DType::F32).unwrap();
    let sum = b.op(Op::Binary { op: BinaryOp::Add }, &[wide, positions]);
    let out = b.g.cast(sum, dtype).unwrap();
    let dout = b.input(dtype, [tokens[0], tokens[1], dim]);
    let mut g = gradients(b, &[(out, dout)], &[weight]);
    let mut outputs = vec![out];
    outputs.extend(g.outputs().iter().copied());
    g.set_outputs(outputs);
    g
}

/// `relu(x * s + col * row) * 0.5`, with a scalar `s`, `col: [rows, 1]` and `row: [1, cols]`.
fn broadcast_chain(rows: usize, cols: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [rows, cols]);
    let s = b.input(DType::F32, []);
    let col = b.input(DType::F32, [rows, 1]);
    let row = b.input(DType::F32, [1, cols]);
    let xs = b.mul(x, s);
    let outer = b.mul(col, row);
    let sum = b.add(xs, outer);
    let r = b.un(UnaryOp::Relu, sum);
    let half = b.constant(0.5, DType::F32);
    let y = b.mul(r, half);
    b.finish(vec![y])
}

/// Three outputs of one elementwise group: `s = x + y`, `exp(s) * y` and `max(s, -x)`.
fn multi_output_pointwise(n: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [n]);
    let y = b.input(DType::F32, [n]);
    let s = b.add(x, y);
    let e = b.un(UnaryOp::Exp, s);
    let ey = b.mul(e, y);
    let nx = b.un(UnaryOp::Neg, x);
    let m = b.bin(BinaryOp::Max, s, nx);
    b.finish(vec![s, ey, m])
}

/// NaN and Inf masks: `where(isnan(x), 0, x)`, `where(isfinite(y), y, -1)` and the mask
/// `isnan(x) or not isfinite(y)`.
fn where_masks(n: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [n]);
    let y = b.input(DType::F32, [n]);
    let nan = b.un(UnaryOp::IsNan, x);
    let zero = b.constant(0.0, DType::F32);
    let cleaned = b.op(Op::Where, &[nan, zero, x]);
    let finite = b.un(UnaryOp::IsFinite, y);
    let minus_one = b.constant(-1.0, DType::F32);
    let kept = b.op(Op::Where, &[finite, y, minus_one]);
    let infinite = b.un(UnaryOp::Not, finite);
    let mask = b.bin(BinaryOp::Or, nan, infinite);
    b.finish(vec![cleaned, kept, mask])
}

/// Casts between every float dtype, the integers and bool, each stored as an output.
fn casts(n: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [n]);
    let h = b.input(DType::BF16, [n]);
    let i = b.input(DType::I32, [n]);
    let flag = b.input(DType::Bool, [n]);
    let mut outputs = Vec::new();
    // f32 -> bf16 -> f16 -> f32 rounds twice; bf16 -> f16 -> f32; f32 -> f16 -> bf16.
    let to_bf16 = b.cast(x, DType::BF16);
    let to_f16 = b.cast(to_bf16, DType::F16);
    outputs.push(b.cast(to_f16, DType::F32));
    let h16 = b.cast(h, DType::F16);
    outputs.push(b.cast(h16, DType::F32));
    let x16 = b.cast(x, DType::F16);
    outputs.push(b.cast(x16, DType::BF16));
    // Floats to integers truncate (NaN -> 0, Inf saturates) and to bool compare with 0.
    let ten = b.constant(10.0, DType::F32);
    let scaled = b.mul(x, ten);
    outputs.push(b.cast(scaled, DType::I32));
    outputs.push(b.cast(h, DType::I64));
    outputs.push(b.cast(x, DType::Bool));
    // Integers and bools to floats and to each other.
    outputs.push(b.cast(i, DType::F32));
    outputs.push(b.cast(i, DType::BF16));
    outputs.push(b.cast(i, DType::Bool));
    let wide = b.cast(i, DType::I64);
    outputs.push(b.cast(wide, DType::F16));
    outputs.push(b.cast(flag, DType::F32));
    outputs.push(b.cast(flag, DType::I32));
    b.finish(outputs)
}

/// i32 arithmetic: `(a * b + c) / d` (division truncates, `x / 0 == 0`), `max(a - b, -c)`,
/// `relu(neg(abs(a)) + b)` and `a / 3` in i64.
fn int_arithmetic(n: usize) -> Graph {
    let mut b = Builder::new();
    let [a, x, c, d] = [0; 4].map(|_| b.input(DType::I32, [n]));
    let ax = b.mul(a, x);
    let axc = b.add(ax, c);
    let q = b.bin(BinaryOp::Div, axc, d);
    let diff = b.bin(BinaryOp::Sub, a, x);
    let nc = b.un(UnaryOp::Neg, c);
    let m = b.bin(BinaryOp::Max, diff, nc);
    let abs = b.un(UnaryOp::Abs, a);
    let neg = b.un(UnaryOp::Neg, abs);
    let shifted = b.add(neg, x);
    let r = b.un(UnaryOp::Relu, shifted);
    let wide = b.cast(a, DType::I64);
    let three = b.constant(3.0, DType::I64);
    let third = b.bin(BinaryOp::Div, wide, three);
    b.finish(vec![q, m, r, third])
}

/// Comparisons of floats (IEEE: NaN compares false, `ne` true) and integers, combined with
/// and/or/not, and a `where` over the result.
fn comparisons_and_logic(n: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [n]);
    let y = b.input(DType::F32, [n]);
    let i = b.input(DType::I32, [n]);
    let lt = b.bin(BinaryOp::Lt, x, y);
    let eq = b.bin(BinaryOp::Eq, x, y);
    let ne = b.bin(BinaryOp::Ne, x, y);
    let zero = b.constant(0.0, DType::F32);
    let ge = b.bin(BinaryOp::Ge, y, zero);
    let not_eq = b.un(UnaryOp::Not, eq);
    let both = b.bin(BinaryOp::And, lt, not_eq);
    let either = b.bin(BinaryOp::Or, both, ge);
    let two = b.constant(2.0, DType::I32);
    let le = b.bin(BinaryOp::Le, i, two);
    let gt = b.bin(BinaryOp::Gt, i, two);
    let ints = b.bin(BinaryOp::And, le, either);
    let picked = b.op(Op::Where, &[either, x, y]);
    b.finish(vec![either, ne, ints, gt, picked])
}

/// `sum(x, axes=[0, 1])` of a bf16 `x` (f32 accumulation), kept as bf16, times 0.5.
fn reduce_leading_bf16(shape: &[usize]) -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::BF16, shape.to_vec());
    let s = b.reduce(ReduceOp::Sum, x, &[0, 1], false);
    let half = b.constant(0.5, DType::BF16);
    let y = b.mul(s, half);
    b.finish(vec![y])
}

/// The gradients of a norm (`layer_norm(x, w, b)` or `rms_norm(x, w)`) with respect to all its
/// inputs, for an incoming gradient `dy` (an input).
fn norm_backward(norm: Op, rows: usize, hidden: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [rows, hidden]);
    let mut operands = vec![x, b.input(DType::F32, [hidden])];
    if matches!(norm, Op::LayerNorm { .. }) {
        operands.push(b.input(DType::F32, [hidden]));
    }
    let y = b.op(norm, &operands);
    let dy = b.input(DType::F32, [rows, hidden]);
    gradients(b, &[(y, dy)], &operands)
}

/// The gradients of `layer_norm(a + r, w, b)` in bf16, as a transformer block's residual add
/// and norm: the row kernel's bf16 incoming gradient is stored narrow for the column sums.
fn residual_layer_norm_backward_bf16(rows: usize, hidden: usize) -> Graph {
    let mut b = Builder::new();
    let a = b.input(DType::BF16, [rows, hidden]);
    let r = b.input(DType::BF16, [rows, hidden]);
    let w = b.input(DType::BF16, [hidden]);
    let bias = b.input(DType::BF16, [hidden]);
    let x = b.add(a, r);
    let y = b.op(Op::LayerNorm { eps: 1e-5 }, &[x, w, bias]);
    let dy = b.input(DType::BF16, [rows, hidden]);
    gradients(b, &[(y, dy)], &[a, w, bias])
}

/// The gradient of `softmax(x, axis=1)` for an incoming gradient `dy`.
fn softmax_backward(rows: usize, cols: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [rows, cols]);
    let y = b.op(Op::Softmax { axis: 1 }, &[x]);
    let dy = b.input(DType::F32, [rows, cols]);
    gradients(b, &[(y, dy)], &[x])
}

/// The gradients of `x @ w + bias` for an incoming gradient `dy`: two matmuls and the bias grad,
/// a sum over the rows.
fn linear_backward(rows: usize, k: usize, n: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [rows, k]);
    let w = b.input(DType::F32, [k, n]);
    let bias = b.input(DType::F32, [n]);
    let xw = b.op(Op::MatMul, &[x, w]);
    let y = b.add(xw, bias);
    let dy = b.input(DType::F32, [rows, n]);
    gradients(b, &[(y, dy)], &[x, w, bias])
}

/// PyTorch's default attention scale, `1 / sqrt(head_dim)` (1 for a head of no dims).
fn default_scale(head_dim: usize) -> f64 {
    if head_dim == 0 {
        1.0
    } else {
        1.0 / (head_dim as f64).sqrt()
    }
}

/// `scaled_dot_product_attention(q, k, v)` of `[B, H, T, D]` operands, default scale.
fn attention(dtype: DType, shape: [usize; 4], causal: bool) -> Graph {
    let mut b = Builder::new();
    let qkv: Vec<NodeId> = (0..3).map(|_| b.input(dtype, shape)).collect();
    let y = b.op(Op::Attention { causal, scale: default_scale(shape[3]) }, &qkv);
    b.finish(vec![y])
}

/// The gradients of q, k and v of an attention for an incoming gradient `dout`.
fn attention_backward(dtype: DType, shape: [usize; 4], causal: bool) -> Graph {
    let mut b = Builder::new();
    let qkv: Vec<NodeId> = (0..3).map(|_| b.input(dtype, shape)).collect();
    let y = b.op(Op::Attention { causal, scale: default_scale(shape[3]) }, &qkv);
    let dout = b.input(dtype, shape);
    gradients(b, &[(y, dout)], &qkv)
}

/// The graph of the gradients of `seeds` with respect to `wrt`.
fn gradients(mut b: Builder, seeds: &[(NodeId, NodeId)], wrt: &[NodeId]) -> Graph {
    let grads = braze_autodiff::backward(&mut b.g, seeds, wrt).expect("float inputs");
    b.finish(grads.into_iter().map(|g| g.expect("every input gets a gradient")).collect())
}

/// `op(x, axes)` without kept dims.
fn reduce_axes(shape: &[usize], op: ReduceOp, axes: &[usize]) -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, shape.to_vec());
    let y = b.reduce(op, x, axes, false);
    b.finish(vec![y])
}

/// `x - mean(x, 1, keepdim)`, `max(x, 1, keepdim)` and `min(x, 1, keepdim)` and a max over axis 0
/// kept as `[1, cols]`.
fn mean_max_min_keepdim(rows: usize, cols: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [rows, cols]);
    let mean = b.reduce(ReduceOp::Mean, x, &[1], true);
    let centered = b.bin(BinaryOp::Sub, x, mean);
    let max = b.reduce(ReduceOp::Max, x, &[1], true);
    let min = b.reduce(ReduceOp::Min, x, &[1], true);
    let col_max = b.reduce(ReduceOp::Max, x, &[0], true);
    b.finish(vec![centered, max, min, col_max])
}

/// `relu(permute(x, [2, 0, 1])) + y[:, :, 1::2]`: both views fold into the loads.
fn permute_slice_loads() -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [5, 12, 7]);
    let y = b.input(DType::F32, [7, 5, 25]);
    let p = b.op(Op::Permute { perm: vec![2, 0, 1] }, &[x]);
    let r = b.un(UnaryOp::Relu, p);
    let s = b.op(Op::Slice { axis: 2, start: 1, end: 25, step: 2 }, &[y]);
    let z = b.add(r, s);
    b.finish(vec![z])
}

/// `concat([a, b, c], axis=1)` of computed and input tensors, and `stack([x, y], axis=1)`.
fn concat_and_stack() -> Graph {
    let mut b = Builder::new();
    let a = b.input(DType::F32, [6, 3]);
    let c = b.input(DType::F32, [6, 0]);
    let d = b.input(DType::F32, [6, 5]);
    let ra = b.un(UnaryOp::Relu, a);
    let cat = b.op(Op::Concat { axis: 1 }, &[ra, c, d]);
    let x = b.input(DType::BF16, [4, 9]);
    let y = b.input(DType::BF16, [4, 9]);
    let stacked = b.op(Op::Stack { axis: 1 }, &[x, y]);
    b.finish(vec![cat, stacked])
}

/// `relu(x @ w + bias)`, folded into one library call.
fn matmul_bias_relu(m: usize, k: usize, n: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [m, k]);
    let w = b.input(DType::F32, [k, n]);
    let bias = b.input(DType::F32, [n]);
    let mm = b.op(Op::MatMul, &[x, w]);
    let biased = b.add(mm, bias);
    let y = b.un(UnaryOp::Relu, biased);
    b.finish(vec![y])
}

/// Outputs `reshape(x, [4, 2, 3])` (the input's own buffer, no kernel) and `tanh(x)`.
fn output_is_reshaped_input() -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [8, 3]);
    let reshaped = b.reshape(x, [4, 2, 3]);
    let t = b.un(UnaryOp::Tanh, x);
    b.finish(vec![reshaped, t])
}

/// Outputs a scalar constant and that constant broadcast to `[3, 4]`, next to `x + 2.5`.
fn constant_output() -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [3, 4]);
    let c = b.constant(2.5, DType::F32);
    let filled = b.broadcast_to(c, [3, 4]);
    let shifted = b.add(x, c);
    b.finish(vec![c, filled, shifted])
}

/// `relu(x + bias)` over `[3, 2^30]`: 3 * 2^30 elements need 64-bit indices.
fn huge_pointwise() -> Graph {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [3, 1 << 30]);
    let bias = b.input(DType::F32, [1 << 30]);
    let s = b.add(x, bias);
    let y = b.un(UnaryOp::Relu, s);
    b.finish(vec![y])
}

// ---- the check --------------------------------------------------------------------------------

fn settings() -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots/pipeline"));
    settings.set_prepend_module_to_snapshot(false);
    settings
}

/// The optimized IR of every pass that changed the graph, after the IR as built.
fn pass_history(graph: &Graph) -> String {
    let mut manager = PassManager::standard().recording();
    let mut optimized = graph.clone();
    manager.run(&mut optimized).expect("the standard passes run");
    assert_eq!(
        optimized.to_text(),
        optimize(graph).expect("optimize").to_text(),
        "the recorded pipeline and optimize() disagree"
    );
    let mut text = format!("== ir ==\n{}", graph.to_text());
    for snapshot in manager.snapshots() {
        let _ = write!(text, "\n== after {} ==\n{}", snapshot.pass, snapshot.after);
    }
    text
}

/// Source of every kernel with its default config; CUDA kernels are compiled when `nvrtc` is set.
fn kernel_sources(plan: &Plan, nvrtc: bool) -> String {
    let mut text = String::new();
    for (i, kernel) in plan.kernels.iter().enumerate() {
        let config = default_config(plan, i, &Target::h200());
        let code =
            generate(plan, i, &config, &Target::h200()).unwrap_or_else(|e| panic!("codegen of {}: {e}", kernel.name));
        let _ = write!(text, "\n== kernel {i}: {} ({config}) ==\n", kernel.name);
        match code {
            KernelCode::Cuda(generated) => {
                if nvrtc {
                    compile_for_sm90(&generated).unwrap_or_else(|e| panic!("{e}"));
                }
                text.push_str(&generated.source);
            }
            KernelCode::CuBlasLt(mm) => {
                let _ = writeln!(text, "cuBLASLt call: {mm:?}");
            }
        }
    }
    text
}

/// Seed of a case's inputs: the same on every run, different between cases.
fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3))
}

/// The checked plan of `graph`.
fn fuse(what: &str, graph: &Graph) -> Plan {
    graph.verify().unwrap_or_else(|e| panic!("{what}: {e}"));
    let plan = compile_to_plan(graph, &FusionOptions::default()).unwrap_or_else(|e| panic!("{what}: {e}"));
    plan.validate().unwrap_or_else(|e| panic!("{what}: {e}\n{plan}"));
    plan
}

/// Runs `plan` and the reference on inputs from `seed` (NaN and Inf in the float inputs
/// `specials` accepts) and compares every output.
fn matches_reference(what: &str, graph: &Graph, plan: &Plan, seed: u64, specials: impl Fn(usize) -> bool) {
    let inputs = random_inputs(graph, seed, specials);
    let expected = eval_graph(graph, &inputs).unwrap_or_else(|e| panic!("{what}: eval_graph: {e}"));
    // Fused kernels keep bf16/f16 intermediates in f32, which the wide reference models.
    let wide = wide_graph(graph)
        .and_then(|wide| eval_graph(&wide, &inputs))
        .unwrap_or_else(|e| panic!("{what}: eval_graph (wide): {e}"));
    let actual = eval_plan(plan, &inputs).unwrap_or_else(|e| panic!("{what}: eval_plan: {e}\n{plan}"));
    compare_outputs(&actual, &expected, Some(&wide), narrowest_float(graph))
        .unwrap_or_else(|e| panic!("{what}: {e}\n{plan}"));
}

/// Runs one case through the whole pipeline.
fn check(case: &Case, nvrtc: bool) {
    let graph = (case.build)();
    let passes = pass_history(&graph);
    let plan = fuse(case.name, &graph);
    let kernels = kernel_sources(&plan, nvrtc);
    let snapshot = format!("{passes}\n== plan ==\n{plan}{kernels}");
    settings().bind(|| insta::assert_snapshot!(case.name, snapshot));
    let families: Vec<&str> = plan.kernels.iter().map(|k| k.kind.family()).collect();
    assert_eq!(families, case.kernels, "{}: kernel families\n{plan}", case.name);
    if case.inputs != Inputs::NotEvaluated {
        let specials = case.inputs == Inputs::WithSpecials;
        matches_reference(case.name, &graph, &plan, seed_of(case.name), |_| specials);
    }
}

#[test]
fn every_case_through_the_whole_pipeline() {
    let nvrtc = nvrtc_enabled();
    let mut failed = Vec::new();
    for case in CASES {
        if std::panic::catch_unwind(|| check(case, nvrtc)).is_err() {
            failed.push(case.name);
        }
    }
    assert!(failed.is_empty(), "{} of {} cases failed: {}", failed.len(), CASES.len(), failed.join(", "));
}

// ---- random shapes ----------------------------------------------------------------------------

/// Row counts that are no multiple of any block or warp, one and none.
const ROWS: [usize; 6] = [0, 1, 3, 7, 33, 130];
/// Hidden sizes around the warp, block and vector widths, one and none.
const HIDDEN: [usize; 8] = [0, 1, 3, 31, 33, 768, 1000, 4097];
/// Largest `rows * hidden` evaluated, so the debug build stays within seconds.
const SWEEP_ELEMENTS: usize = 140_000;

/// A function swept over `[rows, hidden]` shapes.
struct Sweep {
    name: &'static str,
    build: fn(usize, usize) -> Graph,
    /// Float inputs get NaN, +-Inf and signed zeros.
    specials: bool,
}

const SWEEP: &[Sweep] = &[
    Sweep { name: "ln_relu_res", build: |r, h| graph::ln_relu_res(DType::F32, r, h).unwrap(), specials: false },
    Sweep { name: "softmax", build: |r, h| softmax(r, h, 1), specials: false },
    Sweep { name: "rms_norm", build: rms_norm, specials: false },
    Sweep { name: "ew_chain", build: |r, h| graph::ew_chain(DType::F32, &[r, h]).unwrap(), specials: true },
    Sweep { name: "reduce_axis_0", build: |r, h| reduce_axes(&[r, h], ReduceOp::Sum, &[0]), specials: false },
    Sweep {
        name: "layer_norm_backward",
        build: |r, h| norm_backward(Op::LayerNorm { eps: 1e-5 }, r, h),
        specials: false,
    },
    Sweep { name: "broadcast_chain", build: broadcast_chain, specials: true },
];

#[test]
fn random_shapes_match_the_reference() {
    let mut checked = 0;
    for &Sweep { name, build, specials } in SWEEP {
        for rows in ROWS {
            for hidden in HIDDEN {
                if rows * hidden > SWEEP_ELEMENTS {
                    continue;
                }
                let what = format!("{name} [{rows}, {hidden}]");
                let graph = build(rows, hidden);
                let plan = fuse(&what, &graph);
                for i in 0..plan.kernels.len() {
                    generate(&plan, i, &default_config(&plan, i, &Target::h200()), &Target::h200())
                        .unwrap_or_else(|e| panic!("{what}: {e}\n{plan}"));
                }
                matches_reference(&what, &graph, &plan, seed_of(&what), |_| specials);
                checked += 1;
            }
        }
    }
    assert!(checked >= 200, "only {checked} shapes checked");
}

#[test]
fn cases_cover_every_kernel_family() {
    let seen: BTreeSet<&str> = CASES.iter().flat_map(|c| c.kernels.iter().copied()).collect();
    let all: BTreeSet<&str> = [
        "pointwise",
        "row",
        "column",
        "multi_reduce",
        "matmul",
        "concat",
        "multi_pointwise",
        "attention",
        "attention_backward",
        "index_add",
    ]
    .into();
    assert_eq!(seen, all);
    let names: BTreeSet<&str> = CASES.iter().map(|c| c.name).collect();
    assert_eq!(names.len(), CASES.len(), "case names are snapshot names and must be unique");
}

// ---- exact integer constants ------------------------------------------------------------------

/// An i64 constant above 2^53 (not an f64) keeps every bit through the IR's text and JSON, the
/// plan, the reference, the plan executor and the generated CUDA C.
#[test]
fn i64_constants_above_2_pow_53_are_exact() {
    const BIG: i64 = (1 << 62) + 1;
    let mut b = Builder::new();
    let x = b.input(DType::I64, [5]);
    let c = b.g.literal(Literal::Int(BIG), DType::I64);
    let sum = b.add(x, c);
    let graph = b.finish(vec![sum]);
    assert!(graph.to_text().contains(&format!("const {BIG} : i64")), "{}", graph.to_text());
    assert_eq!(Graph::from_json(&graph.to_json()).unwrap().to_text(), graph.to_text());

    let plan = fuse("i64 + 2^62 + 1", &graph);
    assert!(plan.to_string().contains(&format!("const {BIG}")), "{plan}");
    assert_eq!(Plan::from_json(&plan.to_json()).unwrap(), plan);

    let xs = [0, 1, -1, 3 << 60, i64::MAX - BIG + 1];
    let input = HostTensor::new([5], HostData::I64(xs.to_vec())).unwrap();
    let expected: Vec<i64> = xs.iter().map(|v| v.wrapping_add(BIG)).collect();
    assert_eq!(expected[1], BIG + 1, "the sum is not an f64");
    let reference = eval_graph(&graph, std::slice::from_ref(&input)).unwrap();
    let fused = eval_plan(&plan, &[input]).unwrap();
    assert_eq!(reference[0].data(), &HostData::I64(expected.clone()));
    assert_eq!(fused[0].data(), &HostData::I64(expected));

    let sources = kernel_sources(&plan, nvrtc_enabled());
    assert!(sources.contains(&format!("{BIG}LL")), "{sources}");
}

// ---- pow's gradients at a zero base -----------------------------------------------------------

/// Pow's gradients at a zero base are PyTorch's (`pow_backward_self`, `pow_backward_exponent`)
/// in the reference, in the fused plan and in CUDA C that NVRTC compiles, all from the one
/// formula of the op table: the base's `where(b == 0, 0, g b 0^(b-1))`, the exponent's
/// `g where(b >= 0, 0, y ln 0)`, for negative, zero, positive and non-integer exponents.
#[test]
fn pow_gradients_at_a_zero_base_are_pytorchs() {
    let inf = f64::INFINITY;
    let exponents = [-2.0, -0.5, 0.0, 0.5, 1.0, 2.0, 2.5, 0.0, 0.0, 3.0];
    let upstream = [1.0, 1.0, 1.0, 1.0, -3.0, 1.0, 1.0, inf, f64::NAN, 2.0];
    let base = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.0];
    // Worked by hand: 0^b is inf for b < 0, 1 for b == 0, 0 for b > 0; ln 0 = -inf.
    let d_base = [-inf, -inf, 0.0, inf, -3.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    let d_exponent = [-inf, -inf, 0.0, 0.0, 0.0, 0.0, 0.0, f64::NAN, f64::NAN, 0.0];

    let n = exponents.len();
    let mut b = Builder::new();
    let a = b.input(DType::F32, [n]);
    let e = b.input(DType::F32, [n]);
    let y = b.bin(BinaryOp::Pow, a, e);
    let g = b.input(DType::F32, [n]);
    let graph = gradients(b, &[(y, g)], &[a, e]);
    let plan = fuse("pow backward at a zero base", &graph);
    let tensor = |values: &[f64]| HostTensor::from_f64(DType::F32, [n], values).unwrap();
    let inputs = [tensor(&base), tensor(&exponents), tensor(&upstream)];
    let same = |got: &[f64], want: &[f64]| got.iter().zip(want).all(|(g, w)| g == w || (g.is_nan() && w.is_nan()));
    for (what, outputs) in
        [("reference", eval_graph(&graph, &inputs).unwrap()), ("plan", eval_plan(&plan, &inputs).unwrap())]
    {
        let (got_base, got_exponent) = (outputs[0].to_f64_vec(), outputs[1].to_f64_vec());
        assert!(same(&got_base, &d_base), "{what}: d/d base {got_base:?}, want {d_base:?}");
        assert!(same(&got_exponent, &d_exponent), "{what}: d/d exponent {got_exponent:?}, want {d_exponent:?}");
    }
    let sources = kernel_sources(&plan, nvrtc_enabled());
    assert!(sources.contains("powf("), "{sources}");
}

// ---- attention at odd sizes -------------------------------------------------------------------

/// Attention forward and backward through fusion and the plan executor against the reference,
/// at sequence lengths that are no multiple of any tile (1, 17, 70), head dims 64 and 128,
/// causal and not, in every float dtype; and one long causal sequence (1000) forward.
#[test]
fn attention_at_odd_sizes_matches_the_reference() {
    let mut checked = 0;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for head_dim in [64, 128] {
            for (seq, heads) in [(1, 3), (17, 2), (70, 1)] {
                for causal in [false, true] {
                    let shape = [1, heads, seq, head_dim];
                    for (kind, graph) in [
                        ("forward", attention(dtype, shape, causal)),
                        ("backward", attention_backward(dtype, shape, causal)),
                    ] {
                        let what = format!("attention {kind} {dtype} {shape:?} causal={causal}");
                        let plan = fuse(&what, &graph);
                        let families = plan.kernels.iter().filter(|k| k.kind.family().starts_with("attention")).count();
                        assert_eq!(families, if kind == "forward" { 1 } else { 3 }, "{what}\n{plan}");
                        matches_reference(&what, &graph, &plan, seed_of(&what), |_| false);
                        checked += 1;
                    }
                }
            }
        }
    }
    // Empty batches, sequences and heads of no dims.
    for shape in [[0, 2, 5, 8], [1, 1, 0, 8], [1, 2, 3, 0]] {
        for (kind, graph) in [
            ("forward", attention(DType::BF16, shape, true)),
            ("backward", attention_backward(DType::F32, shape, true)),
        ] {
            let what = format!("attention {kind} {shape:?}");
            let plan = fuse(&what, &graph);
            for i in 0..plan.kernels.len() {
                generate(&plan, i, &default_config(&plan, i, &Target::h200()), &Target::h200())
                    .unwrap_or_else(|e| panic!("{what}: {e}\n{plan}"));
            }
            matches_reference(&what, &graph, &plan, seed_of(&what), |_| false);
        }
    }
    let what = "attention forward f32 [1, 1, 1000, 64] causal";
    let graph = attention(DType::F32, [1, 1, 1000, 64], true);
    matches_reference(what, &graph, &fuse(what, &graph), seed_of(what), |_| false);
    assert_eq!(checked, 72);
}
