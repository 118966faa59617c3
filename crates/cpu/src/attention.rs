//! The reference of the attention ops, in f64 and rounded once per result: the scaled scores
//! `s_ij = scale * q_i . k_j` (keys `j > i` left out when causal), `p_ij = exp(s_ij - lse_i)`
//! with `lse_i = ln sum_j exp(s_ij)`, `out_i = sum_j p_ij v_j`; the gradients are those of that
//! formula, with the `lse` and `delta = rowsum(dout * out)` operands taken as given:
//! `ds_ij = p_ij (dout_i . v_j - delta_i)`, `dq_i = scale sum_j ds_ij k_j`,
//! `dk_j = scale sum_i ds_ij q_i`, `dv_j = sum_i p_ij dout_i`.

use crate::scalar::{empty_data, push, Scalar};
use braze_ir::elementwise::nan_max;
use braze_ir::{AttentionInput, DType, HostData, HostTensor};

/// One `[B, H, T, D]` operand as f64 rows: `rows[(bh * T + t) * D + d]`.
fn values(t: &HostTensor) -> Vec<f64> {
    t.to_f64_vec()
}

/// `(batch * heads, sequence, head_dim)` of a `[B, H, T, D]` operand.
fn extents(t: &HostTensor) -> (usize, usize, usize) {
    let d = t.shape().dims();
    (d[0] * d[1], d[2], d[3])
}

/// Keys query `i` attends to: `0..T`, or `0..=i` when causal.
fn keys(i: usize, seq: usize, causal: bool) -> std::ops::Range<usize> {
    0..if causal { i + 1 } else { seq }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Scaled scores of query row `i` against its keys.
fn scores(q: &[f64], k: &[f64], i: usize, seq: usize, dim: usize, causal: bool, scale: f64) -> Vec<f64> {
    keys(i, seq, causal).map(|j| scale * dot(&q[i * dim..(i + 1) * dim], &k[j * dim..(j + 1) * dim])).collect()
}

/// `ln sum exp(s)`, NaN-propagating through the max.
fn logsumexp(s: &[f64]) -> f64 {
    let max = s.iter().fold(f64::NEG_INFINITY, |m, &x| nan_max(m, x));
    if max == f64::NEG_INFINITY {
        return max;
    }
    max + s.iter().map(|&x| (x - max).exp()).sum::<f64>().ln()
}

/// `attention(q, k, v)` of `dtype`, or with `lse_only` the f32 logsumexp rows of `(q, k)`.
pub(crate) fn attention(dtype: DType, operands: &[&HostTensor], causal: bool, scale: f64, lse_only: bool) -> HostData {
    let (bh, seq, dim) = extents(operands[0]);
    let q = values(operands[0]);
    let k = values(operands[1]);
    let v = if lse_only { Vec::new() } else { values(operands[2]) };
    let mut out = empty_data(dtype, if lse_only { bh * seq } else { bh * seq * dim });
    let mut row = vec![0.0f64; dim];
    for b in 0..bh {
        let base = b * seq * dim;
        let (qb, kb) = (&q[base..base + seq * dim], &k[base..base + seq * dim]);
        for i in 0..seq {
            let s = scores(qb, kb, i, seq, dim, causal, scale);
            let lse = logsumexp(&s);
            if lse_only {
                push(&mut out, Scalar::Float(lse));
                continue;
            }
            row.fill(0.0);
            for (j, &sj) in keys(i, seq, causal).zip(&s) {
                let p = (sj - lse).exp();
                for (acc, &vj) in row.iter_mut().zip(&v[base + j * dim..base + (j + 1) * dim]) {
                    *acc += p * vj;
                }
            }
            for &y in &row {
                push(&mut out, Scalar::Float(y));
            }
        }
    }
    out
}

/// `attention_grad {wrt}(q, k, v, lse, delta, dout)` of `dtype`.
pub(crate) fn attention_grad(
    dtype: DType,
    operands: &[&HostTensor],
    causal: bool,
    scale: f64,
    wrt: AttentionInput,
) -> HostData {
    let (bh, seq, dim) = extents(operands[0]);
    let [q, k, v, lse, delta, dout] = std::array::from_fn(|i| values(operands[i]));
    let mut grad = vec![0.0f64; bh * seq * dim];
    for b in 0..bh {
        let base = b * seq * dim;
        let rows = |t: usize| base + t * dim..base + (t + 1) * dim;
        for i in 0..seq {
            let s = scores(&q[base..base + seq * dim], &k[base..base + seq * dim], i, seq, dim, causal, scale);
            let (lse_i, delta_i) = (lse[b * seq + i], delta[b * seq + i]);
            for (j, &sj) in keys(i, seq, causal).zip(&s) {
                let p = (sj - lse_i).exp();
                let dp = dot(&dout[rows(i)], &v[rows(j)]);
                let ds = p * (dp - delta_i);
                let (target, source, factor) = match wrt {
                    AttentionInput::Query => (i, &k[rows(j)], scale * ds),
                    AttentionInput::Key => (j, &q[rows(i)], scale * ds),
                    AttentionInput::Value => (j, &dout[rows(i)], p),
                };
                for (g, &x) in grad[base + target * dim..base + (target + 1) * dim].iter_mut().zip(source) {
                    *g += factor * x;
                }
            }
        }
    }
    let mut out = empty_data(dtype, grad.len());
    for g in grad {
        push(&mut out, Scalar::Float(g));
    }
    out
}
