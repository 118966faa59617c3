//! `--only attention`: causal scaled dot-product attention at GPT-2 small's shape (B=16, H=12,
//! T=1024, D=64, bf16), forward and forward+backward, as `torch_baseline.py`'s `attention`
//! rows time PyTorch's `scaled_dot_product_attention` (flash backend).

use super::cases::random_host;
use super::measure::{Case, Scope};
use super::Bench;
use crate::common::Pair;
use anyhow::Result;
use braze::{value_and_grad, DType, Mode, Tensor};
use braze_workloads::Workload;
use std::sync::Arc;

/// The shape key both baselines print.
fn shape(b: usize, h: usize, t: usize, d: usize) -> String {
    format!("B{b} H{h} T{t} D{d} causal")
}

/// FLOPs of a causal forward as FlashAttention counts them: two matmuls of `T x T x D` per
/// (batch, head), halved by the mask; a backward is 2.5 forwards (five matmuls to two).
fn forward_flops(b: usize, h: usize, t: usize, d: usize) -> f64 {
    4.0 * (b * h * t * t * d) as f64 / 2.0
}

impl Bench {
    pub(super) fn attention(&mut self, b: usize, h: usize, t: usize, d: usize) -> Result<()> {
        let dtype = DType::BF16;
        let dims = vec![b, h, t, d];
        let host = random_host(&(0..4).map(|i| (dtype, dims.clone(), 40 + i, 1.0)).collect::<Vec<_>>());
        let fwd = Workload {
            name: "attention_fwd",
            input_names: ["q", "k", "v"].iter().map(|s| s.to_string()).collect(),
            inputs: host[..3].iter().cloned().map(Tensor::from_host).collect(),
            function: Arc::new(|a: &[Tensor]| Ok(vec![a[0].scaled_dot_product_attention(&a[1], &a[2], true, None)?])),
        };
        // The gradients of sum(out * dout): what `out.backward(dout)` computes, plus one
        // product-sum over the output.
        let fwd_bwd = Workload {
            name: "attention_fwd_bwd",
            input_names: ["q", "k", "v", "dout"].iter().map(|s| s.to_string()).collect(),
            inputs: host.into_iter().map(Tensor::from_host).collect(),
            function: Arc::new(|a: &[Tensor]| {
                let dout = a[3].clone();
                let (_, grads) = value_and_grad(
                    |x| x[0].scaled_dot_product_attention(&x[1], &x[2], true, None)?.mul(&dout)?.sum_all(),
                    &a[..3],
                )?;
                Ok(grads)
            }),
        };
        let flops = forward_flops(b, h, t, d);
        let rel_l2 = Some((
            1e-2,
            "bf16 outputs of sums over up to 1024 keys, against the f64 reference rounded once: a few elements near \
             zero differ by more than bf16's relative tolerance",
        ));
        for (workload, pair, flops, launches) in [
            ("attention_fwd", Pair::from_host(fwd, self.device())?, flops, Some((1, 0))),
            ("attention_fwd_bwd", Pair::from_host(fwd_bwd, self.device())?, 3.5 * flops, None),
        ] {
            self.measure(&Case {
                workload,
                shape: shape(b, h, t, d),
                dtype,
                pair,
                bytes: None,
                flops: Some(flops),
                modes: vec![Mode::Default, Mode::MaxAutotune],
                eager: Ok(()),
                scope: Scope::Rows,
                launch_target: launches,
                rel_l2_ok: rel_l2,
                host_clock: false,
            })?;
        }
        Ok(())
    }
}
