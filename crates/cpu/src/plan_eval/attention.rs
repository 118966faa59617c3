//! Attention kernels the way the generated ones compute them: f32 throughout, scores in the
//! base-2 domain (`q . k * scale * log2(e)`, then `exp2`), key tiles of [`KEY_TILE`] folded into
//! each query row with an online softmax (running max, rescaled sum and accumulator), the lse
//! saved as `(max + log2(sum)) * ln(2)`; the backward recomputes each probability from the lse
//! and sums every gradient element in key (dq) or query (dk, dv) order, as one thread does.

use super::{float_of, load, store, Val};
use braze_ir::{AttentionInput, HostData};
use braze_plan::{Attention, AttentionBackward, AttentionResult, AttentionShape, OperandLayout};

/// Keys one step of the forward folds in (a warp's lanes, one key each).
pub(super) const KEY_TILE: usize = 32;

/// Row `t` of (batch, head) pair `b` of an operand placed by `layout`, widened to f32.
fn row(data: &HostData, s: &AttentionShape, layout: &OperandLayout, b: usize, t: usize) -> Vec<f32> {
    let start = layout.row_start(s, b, t);
    (start..start + s.head_dim).map(|i| float_of(load(data, i))).collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0f32, |acc, (x, y)| x.mul_add(*y, acc))
}

/// Keys query `i` sees: all, or those up to `i` when causal.
fn key_end(s: &AttentionShape, i: usize) -> usize {
    if s.causal {
        i + 1
    } else {
        s.seq
    }
}

fn scale_log2(s: &AttentionShape) -> f32 {
    (s.scale * std::f64::consts::LOG2_E) as f32
}

pub(super) fn run_attention(att: &Attention, inputs: &[&HostData], outputs: &mut [HostData]) {
    let s = &att.shape;
    let c = scale_log2(s);
    for b in 0..s.batch {
        let [q_at, k_at, v_at] = &att.input_layouts;
        let keys: Vec<Vec<f32>> = (0..s.seq).map(|j| row(inputs[1], s, k_at, b, j)).collect();
        let values: Vec<Vec<f32>> = (0..s.seq).map(|j| row(inputs[2], s, v_at, b, j)).collect();
        for i in 0..s.seq {
            let q = row(inputs[0], s, q_at, b, i);
            let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
            let mut acc = vec![0.0f32; s.head_dim];
            let end = key_end(s, i);
            for tile in (0..end).step_by(KEY_TILE) {
                let tile_keys = tile..(tile + KEY_TILE).min(end);
                let scores: Vec<f32> = tile_keys.clone().map(|j| dot(&q, &keys[j]) * c).collect();
                let new_max = scores.iter().fold(max, |m, &x| m.max(x));
                // A row whose scores so far are all -inf subtracts 0, not -inf (no -inf - -inf).
                let shift = if new_max == f32::NEG_INFINITY { 0.0 } else { new_max };
                let rescale = (max - shift).exp2();
                sum *= rescale;
                acc.iter_mut().for_each(|a| *a *= rescale);
                for (j, &score) in tile_keys.zip(&scores) {
                    let p = (score - shift).exp2();
                    sum += p;
                    for (a, &v) in acc.iter_mut().zip(&values[j]) {
                        *a = p.mul_add(v, *a);
                    }
                }
                max = new_max;
            }
            for (slot, result) in att.results.iter().enumerate() {
                match result {
                    AttentionResult::Out => {
                        let base = att.out_layout.row_start(s, b, i);
                        for (d, a) in acc.iter().enumerate() {
                            store(&mut outputs[slot], base + d, Val::Float(a / sum));
                        }
                    }
                    AttentionResult::Lse => {
                        let lse = (max + sum.log2()) * std::f32::consts::LN_2;
                        store(&mut outputs[slot], b * s.seq + i, Val::Float(lse));
                    }
                }
            }
        }
    }
}

pub(super) fn run_attention_backward(back: &AttentionBackward, inputs: &[&HostData], outputs: &mut [HostData]) {
    let s = &back.shape;
    let c = scale_log2(s);
    let scale = s.scale as f32;
    for b in 0..s.batch {
        let rows = |slot: usize, layout: &OperandLayout| -> Vec<Vec<f32>> {
            (0..s.seq).map(|t| row(inputs[slot], s, layout, b, t)).collect()
        };
        let [q_at, k_at, v_at, dout_at] = &back.input_layouts;
        let (q, k, v, dout) = (rows(0, q_at), rows(1, k_at), rows(2, v_at), rows(5, dout_at));
        let lse2: Vec<f32> =
            (0..s.seq).map(|i| float_of(load(inputs[3], b * s.seq + i)) * std::f32::consts::LOG2_E).collect();
        let delta: Vec<f32> = (0..s.seq).map(|i| float_of(load(inputs[4], b * s.seq + i))).collect();
        // p and ds of query i and key j, as both backward kernels recompute them.
        let pair = |i: usize, j: usize| {
            let p = (dot(&q[i], &k[j]) * c - lse2[i]).exp2();
            let ds = p * (dot(&dout[i], &v[j]) - delta[i]);
            (p, ds)
        };
        for (slot, wrt) in back.grads.iter().enumerate() {
            for t in 0..s.seq {
                let mut acc = vec![0.0f32; s.head_dim];
                let mut fold = |factor: f32, source: &[f32]| {
                    for (a, &x) in acc.iter_mut().zip(source) {
                        *a = factor.mul_add(x, *a);
                    }
                };
                match wrt {
                    AttentionInput::Query => (0..key_end(s, t)).for_each(|j| fold(pair(t, j).1, &k[j])),
                    AttentionInput::Key => {
                        let first = if s.causal { t } else { 0 };
                        (first..s.seq).for_each(|i| fold(pair(i, t).1, &q[i]))
                    }
                    AttentionInput::Value => {
                        let first = if s.causal { t } else { 0 };
                        (first..s.seq).for_each(|i| fold(pair(i, t).0, &dout[i]))
                    }
                }
                let factor = if *wrt == AttentionInput::Value { 1.0 } else { scale };
                let base = back.grad_layouts[slot].row_start(s, b, t);
                for (d, a) in acc.iter().enumerate() {
                    store(&mut outputs[slot], base + d, Val::Float(a * factor));
                }
            }
        }
    }
}
