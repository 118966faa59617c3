//! matmul, layer_norm, rms_norm and softmax against plain loops written in the tests.

mod common;

use braze_cpu::assert_close_with;
use braze_ir::{DType, HostTensor, Op};
use common::*;

/// Evaluates `op` on `inputs` and compares with `expected` to 1e-6 relative (the loops below
/// may order f64 operations differently from the reference, which can move the f32 rounding by
/// one ulp).
fn check(op: Op, inputs: &[HostTensor], expected: HostTensor) {
    let what = format!("{op:?} on {:?}", inputs.iter().map(|x| x.shape()).collect::<Vec<_>>());
    let actual = run(|g, ids| g.add(op, ids, None).expect("op type-checks"), inputs);
    if let Err(e) = assert_close_with(&actual, &expected, 1e-6, 1e-7) {
        panic!("{what}: {e}");
    }
}

/// `[..., rows, cols]` values of a tensor as f64.
fn vals(x: &HostTensor) -> Vec<f64> {
    x.to_f64_vec()
}

#[test]
fn matmul_two_by_three_times_three_by_two() {
    let a = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = f32s(&[3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
    let expected = f32s(&[2, 2], &[58.0, 64.0, 139.0, 154.0]);
    let actual = run(|g, ids| g.add(Op::MatMul, ids, None).unwrap(), &[a, b]);
    assert_identical(&actual, &expected, "2x3 @ 3x2");
}

#[test]
fn batched_matmul_broadcasts_batch_dims() {
    // a [2,1,2,3] @ b [3,3,2] -> [2,3,2,2]: out[i,j] = a[i,0] @ b[j].
    let a = arange(&[2, 1, 2, 3]);
    let b = f32s(&[3, 3, 2], &(0..18).map(|v| v as f64 - 9.0).collect::<Vec<_>>());
    let (av, bv) = (vals(&a), vals(&b));
    let mut expected = Vec::new();
    for i in 0..2 {
        for j in 0..3 {
            for r in 0..2 {
                for c in 0..2 {
                    expected.push((0..3).map(|p| av[i * 6 + r * 3 + p] * bv[j * 6 + p * 2 + c]).sum::<f64>());
                }
            }
        }
    }
    check(Op::MatMul, &[a, b.clone()], f32s(&[2, 3, 2, 2], &expected));

    // A rank-2 left operand is shared by every batch of the right one.
    let a = f32s(&[2, 3], &[1.0, 0.0, -1.0, 2.0, 1.0, 0.5]);
    let av = vals(&a);
    let mut expected = Vec::new();
    for j in 0..3 {
        for r in 0..2 {
            for c in 0..2 {
                expected.push((0..3).map(|p| av[r * 3 + p] * bv[j * 6 + p * 2 + c]).sum::<f64>());
            }
        }
    }
    check(Op::MatMul, &[a, b], f32s(&[3, 2, 2], &expected));
}

#[test]
fn matmul_accumulates_in_f64_and_rounds_once() {
    let a = f32s(&[1, 3], &[16_777_216.0, 1.0, 1.0]);
    let b = f32s(&[3, 1], &[1.0, 1.0, 1.0]);
    check(Op::MatMul, &[a, b], f32s(&[1, 1], &[16_777_218.0]));
    // bf16: 1 + 2^-9 + 2^-9 = 1 + 2^-8, a tie that rounds to 1 only at the end.
    let a = t(DType::BF16, &[1, 3], &[1.0, 2f64.powi(-9), 2f64.powi(-9)]);
    let b = t(DType::BF16, &[3, 1], &[1.0, 1.0, 1.0]);
    let actual = run(|g, ids| g.add(Op::MatMul, ids, None).unwrap(), &[a, b]);
    assert_identical(&actual, &t(DType::BF16, &[1, 1], &[1.0]), "bf16 matmul");
}

#[test]
fn matmul_with_zero_sizes() {
    let mm = |a: HostTensor, b: HostTensor| run(|g, ids| g.add(Op::MatMul, ids, None).unwrap(), &[a, b]);
    assert_identical(&mm(f32s(&[2, 0], &[]), f32s(&[0, 3], &[])), &f32s(&[2, 3], &[0.0; 6]), "k = 0");
    assert_identical(&mm(f32s(&[0, 3], &[]), arange(&[3, 2])), &f32s(&[0, 2], &[]), "m = 0");
    assert_identical(&mm(arange(&[2, 3]), f32s(&[3, 0], &[])), &f32s(&[2, 0], &[]), "n = 0");
    assert_identical(&mm(f32s(&[0, 2, 3], &[]), arange(&[3, 2])), &f32s(&[0, 2, 2], &[]), "batch 0");
}

/// Layer norm of each row of `x` (`cols` wide) by the textbook loop.
fn layer_norm_loop(x: &[f64], cols: usize, w: &[f64], b: &[f64], eps: f64) -> Vec<f64> {
    let mut out = Vec::new();
    for row in x.chunks(cols) {
        let mean = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / cols as f64;
        for c in 0..cols {
            out.push((row[c] - mean) / (var + eps).sqrt() * w[c] + b[c]);
        }
    }
    out
}

#[test]
fn layer_norm_matches_the_loop() {
    let xv = [1.0, 2.0, 4.0, 7.0, -3.0, 0.5, 0.25, 10.0, 5.0, 5.0, 5.0, 5.0];
    let (wv, bv) = ([1.0, 0.5, -2.0, 1.5], [0.0, 1.0, -1.0, 0.25]);
    let expected = layer_norm_loop(&xv, 4, &wv, &bv, 1e-5);
    let inputs = [f32s(&[3, 4], &xv), f32s(&[4], &wv), f32s(&[4], &bv)];
    check(Op::LayerNorm { eps: 1e-5 }, &inputs, f32s(&[3, 4], &expected));
    let inputs = [f32s(&[3, 1, 4], &xv), f32s(&[4], &wv), f32s(&[4], &bv)];
    check(Op::LayerNorm { eps: 1e-5 }, &inputs, f32s(&[3, 1, 4], &expected));
    let inputs = [f32s(&[0, 4], &[]), f32s(&[4], &wv), f32s(&[4], &bv)];
    check(Op::LayerNorm { eps: 1e-5 }, &inputs, f32s(&[0, 4], &[]));
}

#[test]
fn rms_norm_matches_the_loop() {
    let xv = [1.0, -2.0, 3.0, 0.5, 0.0, 0.0];
    let wv = [2.0, 1.0, -1.0];
    let mut expected = Vec::new();
    for row in xv.chunks(3) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 3.0;
        expected.extend((0..3).map(|c| row[c] / (ms + 1e-6).sqrt() * wv[c]));
    }
    check(Op::RmsNorm { eps: 1e-6 }, &[f32s(&[2, 3], &xv), f32s(&[3], &wv)], f32s(&[2, 3], &expected));
}

#[test]
fn softmax_along_each_axis() {
    let xv = [1.0, 2.0, 3.0, -1.0, 0.0, 1000.0];
    // Along axis 1 (rows of 3).
    let mut along_rows = Vec::new();
    for row in xv.chunks(3) {
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
        along_rows.extend(row.iter().map(|v| (v - max).exp() / sum));
    }
    check(Op::Softmax { axis: 1 }, &[f32s(&[2, 3], &xv)], f32s(&[2, 3], &along_rows));
    // Along axis 0 (columns of 2).
    let mut along_cols = [0.0; 6];
    for c in 0..3 {
        let (a, b) = (xv[c], xv[3 + c]);
        let max = a.max(b);
        let sum = (a - max).exp() + (b - max).exp();
        along_cols[c] = (a - max).exp() / sum;
        along_cols[3 + c] = (b - max).exp() / sum;
    }
    check(Op::Softmax { axis: 0 }, &[f32s(&[2, 3], &xv)], f32s(&[2, 3], &along_cols));
}

#[test]
fn log_softmax_keeps_the_digits_softmax_underflows() {
    // exp(-1000 - 1000) underflows to 0 in a softmax; its log is still -2000.
    let xv = [1.0, 2.0, 3.0, -1000.0, 0.0, 1000.0];
    let mut expected = Vec::new();
    for row in xv.chunks(3) {
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
        expected.extend(row.iter().map(|v| v - max - sum.ln()));
    }
    assert_eq!(expected[3], -2000.0);
    check(Op::LogSoftmax { axis: 1 }, &[f32s(&[2, 3], &xv)], f32s(&[2, 3], &expected));
    let x = f32s(&[3, 2], &[-INF, 0.0, NAN, 1.0, INF, 1.0]);
    let actual = run(|g, ids| g.add(Op::LogSoftmax { axis: 1 }, ids, None).unwrap(), &[x]);
    assert_identical(&actual, &f32s(&[3, 2], &[-INF, 0.0, NAN, NAN, NAN, NAN]), "log_softmax special rows");
}

#[test]
fn cross_entropy_is_the_mean_over_counted_rows() {
    let logits = [1.0, 2.0, 3.0, 0.5, -0.5, 0.0, 7.0, 7.0, 7.0];
    let lse = |row: &[f64]| {
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln()
    };
    // Row 1 is ignored; rows 0 and 2 pick classes 2 and 0.
    let want = ((lse(&logits[0..3]) - 3.0) + (lse(&logits[6..9]) - 7.0)) / 2.0;
    let op = Op::CrossEntropy { ignore_index: -1 };
    let classes = i64s(&[3], &[0, 1, 2]);
    check(op.clone(), &[f32s(&[3, 3], &logits), i64s(&[3], &[2, -1, 0]), classes.clone()], f32s(&[], &[want]));
    // Every row ignored: a mean over nothing. A target that is no class: NaN.
    check(op.clone(), &[f32s(&[3, 3], &logits), i64s(&[3], &[-1, -1, -1]), classes.clone()], f32s(&[], &[NAN]));
    check(op, &[f32s(&[3, 3], &logits), i64s(&[3], &[2, 3, 0]), classes], f32s(&[], &[NAN]));
}

#[test]
fn softmax_special_rows() {
    let x = f32s(&[4, 2], &[-INF, 0.0, -INF, -INF, NAN, 1.0, INF, 1.0]);
    let expected = f32s(&[4, 2], &[0.0, 1.0, NAN, NAN, NAN, NAN, NAN, NAN]);
    let actual = run(|g, ids| g.add(Op::Softmax { axis: 1 }, ids, None).unwrap(), &[x]);
    assert_identical(&actual, &expected, "softmax special rows");
    let actual = run(|g, ids| g.add(Op::Softmax { axis: 1 }, ids, None).unwrap(), &[f32s(&[3, 0], &[])]);
    assert_identical(&actual, &f32s(&[3, 0], &[]), "softmax over empty rows");
}

/// `softmax(q k^T scale) v` written as loops (keys after the query left out when causal), and
/// the rows' logsumexp.
fn attention_loops(q: &HostTensor, k: &HostTensor, v: &HostTensor, causal: bool, scale: f64) -> (Vec<f64>, Vec<f64>) {
    let d = q.shape().dims();
    let (bh, t, dim) = (d[0] * d[1], d[2], d[3]);
    let (q, k, v) = (vals(q), vals(k), vals(v));
    let (mut out, mut lse) = (vec![0.0; bh * t * dim], vec![0.0; bh * t]);
    for b in 0..bh {
        for i in 0..t {
            let allowed = if causal { i + 1 } else { t };
            let s: Vec<f64> = (0..allowed)
                .map(|j| scale * (0..dim).map(|c| q[(b * t + i) * dim + c] * k[(b * t + j) * dim + c]).sum::<f64>())
                .collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = s.iter().map(|x| (x - max).exp()).sum();
            lse[b * t + i] = max + total.ln();
            for (j, sj) in s.iter().enumerate() {
                for c in 0..dim {
                    out[(b * t + i) * dim + c] += (sj - max).exp() / total * v[(b * t + j) * dim + c];
                }
            }
        }
    }
    (out, lse)
}

#[test]
fn attention_and_its_logsumexp_against_loops() {
    for (shape, causal) in [([1, 1, 1, 4], true), ([2, 3, 5, 4], false), ([1, 2, 9, 3], true), ([1, 1, 0, 2], true)] {
        let q = braze_cpu::random_tensor(DType::F32, shape, 1);
        let k = braze_cpu::random_tensor(DType::F32, shape, 2);
        let v = braze_cpu::random_tensor(DType::F32, shape, 3);
        let (out, lse) = attention_loops(&q, &k, &v, causal, 0.4);
        let inputs = [q.clone(), k.clone(), v];
        check(Op::Attention { causal, scale: 0.4 }, &inputs, f32s(&shape, &out));
        check(Op::AttentionLse { causal, scale: 0.4 }, &inputs[..2], f32s(&shape[..3], &lse));
    }
}

#[test]
fn attention_propagates_nan_through_its_row() {
    let mut qv = vec![0.5f64; 2 * 3];
    qv[3] = f64::NAN; // query row 1
    let q = f32s(&[1, 1, 2, 3], &qv);
    let k = f32s(&[1, 1, 2, 3], &[0.1, 0.2, 0.3, 0.4, 0.5, 0.6]);
    let out = run(|g, ids| g.add(Op::Attention { causal: true, scale: 1.0 }, ids, None).unwrap(), &[q, k.clone(), k]);
    let got = vals(&out);
    assert!(got[..3].iter().all(|x| x.is_finite()), "row 0 is finite: {got:?}");
    assert!(got[3..].iter().all(|x| x.is_nan()), "row 1 is NaN: {got:?}");
}
