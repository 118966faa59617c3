//! The benchmarked workloads at their standard sizes: inputs, expected launches, tolerances.

use super::measure::{Case, Scope};
use super::Bench;
use crate::common::Pair;
use anyhow::Result;
use braze::{DType, HostTensor, Mode, Tensor};
use braze_workloads::{self as workloads, Sizes, Workload};
use serde_json::json;
use std::sync::Arc;

/// Host tensors of random normals (never all zero), each scaled by its factor; made on all cores.
pub(super) fn random_host(specs: &[(DType, Vec<usize>, u64, f64)]) -> Vec<HostTensor> {
    let make = |(dtype, shape, seed, scale): &(DType, Vec<usize>, u64, f64)| {
        let t = braze_cpu::random_tensor(*dtype, shape.clone(), *seed);
        if *scale == 1.0 {
            return t;
        }
        let values: Vec<f64> = t.to_f64_vec().into_iter().map(|v| v * scale).collect();
        HostTensor::from_f64(*dtype, shape.clone(), &values).expect("same element count")
    };
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(1, specs.len().max(1));
    let per_thread = specs.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = specs
            .chunks(per_thread)
            .map(|group| scope.spawn(move || group.iter().map(make).collect::<Vec<_>>()))
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("random data thread panicked")).collect()
    })
}

fn host_workload(name: &'static str, names: &[&str], inputs: Vec<HostTensor>, f: workloads::WorkloadFn) -> Workload {
    Workload {
        name,
        input_names: names.iter().map(|s| s.to_string()).collect(),
        inputs: inputs.into_iter().map(Tensor::from_host).collect(),
        function: f,
    }
}

impl Bench {
    pub(super) fn copy(&mut self) -> Result<()> {
        let n = 2 * 1024usize.pow(3) / 4;
        let bytes = n * 4;
        let dev = self.timer.device.clone();
        let src = dev.alloc(bytes)?;
        let dst = dev.alloc(bytes)?;
        dev.memset_d8(&src, 0x3f)?;
        let timing = self.bench(&mut || Ok(dev.copy(&src, 0, &dst, 0, bytes)?), self.rep_ms)?;
        let us = timing.median_us;
        let gbps = 2.0 * bytes as f64 / (us * 1e-6) / 1e9;
        self.copy_gbps = Some(gbps);
        self.emit(json!({
            "workload": "copy", "shape": n.to_string(), "dtype": "f32", "variant": "info braze copy",
            "us": us, "gbps": gbps, "reps": timing.reps,
            "note": "2 GiB device-to-device copy (cuMemcpyDtoDAsync) on braze's stream: the bandwidth ceiling of this run",
        }));
        Ok(())
    }

    pub(super) fn ln_relu_res(&mut self, rows: usize, hidden: usize, dtype: DType, restart: bool) -> Result<()> {
        let host = random_host(&[
            (dtype, vec![rows, hidden], 1, 1.0),
            (dtype, vec![hidden], 2, 1.0),
            (dtype, vec![hidden], 3, 1.0),
            (dtype, vec![rows, hidden], 4, 1.0),
        ]);
        let w = host_workload("ln_relu_res", &["x", "w", "b", "res"], host, Arc::new(workloads::ln_relu_res));
        let case = Case {
            workload: "ln_relu_res",
            shape: format!("{rows}x{hidden}"),
            dtype,
            pair: Pair::from_host(w, self.device())?,
            bytes: Some(3.0 * (rows * hidden * dtype.size_bytes()) as f64),
            flops: None,
            modes: vec![Mode::Default, Mode::MaxAutotune],
            eager: Ok(()),
            scope: Scope::Rows,
            launch_target: Some((1, 0)),
            rel_l2_ok: None,
            host_clock: false,
        };
        self.measure(&case)?;
        if restart {
            self.restart_in_process(&case)?;
        }
        Ok(())
    }

    pub(super) fn ew_chain(&mut self, n: usize) -> Result<()> {
        let dtype = DType::F32;
        let host = random_host(&(0..4).map(|i| (dtype, vec![n], 10 + i, 1.0)).collect::<Vec<_>>());
        let w = host_workload("ew_chain", &["x", "a", "b", "c"], host, Arc::new(workloads::ew_chain));
        self.measure(&Case {
            workload: "ew_chain",
            shape: n.to_string(),
            dtype,
            pair: Pair::from_host(w, self.device())?,
            bytes: Some(5.0 * (n * dtype.size_bytes()) as f64),
            flops: None,
            modes: vec![Mode::Default, Mode::MaxAutotune],
            eager: Ok(()),
            scope: Scope::Rows,
            launch_target: Some((1, 0)),
            rel_l2_ok: None,
            host_clock: false,
        })
    }

    pub(super) fn multisum(&mut self, k: usize, lo: usize, hi: usize, seed: u64) -> Result<()> {
        let dtype = DType::F32;
        let sizes = workloads::multisum_sizes(k, lo, hi, seed);
        let total: usize = sizes.iter().sum();
        let shape = format!("K={k} {lo}-{hi} s{seed}");
        println!(
            "# multisum {shape}: {total} elements, {:.1} MB (the sizes of torch_baseline.py's multisum_sizes: first {:?})",
            (total * 4) as f64 / 1e6,
            &sizes[..sizes.len().min(4)]
        );
        let specs: Vec<_> = sizes.iter().enumerate().map(|(i, &s)| (dtype, vec![s], 1000 + i as u64, 1.0)).collect();
        let host = random_host(&specs);
        let names: Vec<String> = (0..k).map(|i| format!("t{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let w = host_workload("multisum", &names, host, Arc::new(workloads::multisum));
        self.measure(&Case {
            workload: "multisum",
            shape: shape.clone(),
            dtype,
            pair: Pair::from_host(w, self.device())?,
            bytes: Some((total * dtype.size_bytes()) as f64),
            flops: None,
            modes: vec![Mode::Default, Mode::ReduceOverhead, Mode::MaxAutotune],
            // Each sum's kernel reads its size at run time: the eager loop compiles a handful of
            // kernels, not one per distinct tensor size.
            eager: Ok(()),
            scope: Scope::All,
            launch_target: Some((1, 1)),
            rel_l2_ok: Some((
                1e-5,
                "f32 sums of up to 3e5 zero-mean values: a sum can cancel to near 0, where a tolerance relative to it \
                 is below any f32 summation's error",
            )),
            host_clock: false,
        })?;
        let note = format!(
            "{total} elements in {k} tensors (torch_baseline.py prints its count as `# multisum {shape}: N elements`)"
        );
        self.info("multisum", &shape, "f32", "info elements", None, &note);
        Ok(())
    }

    pub(super) fn tiny_block(&mut self, layers: usize) -> Result<()> {
        let sizes = Sizes { rows: 64, hidden: 256, layers, dtype: DType::F32, seed: 0, ..Sizes::default() };
        self.measure(&Case {
            workload: "tiny_block",
            shape: format!("{layers}L 64x256"),
            dtype: DType::F32,
            pair: Pair::build("tiny_block", &sizes, self.device())?,
            bytes: None,
            flops: None,
            modes: vec![Mode::Default, Mode::ReduceOverhead, Mode::MaxAutotune],
            eager: Ok(()),
            scope: Scope::Rows,
            launch_target: Some((1, 0)),
            rel_l2_ok: None,
            host_clock: true,
        })
    }

    pub(super) fn mlp_block(&mut self, rows: usize, d: usize) -> Result<()> {
        let dtype = DType::BF16;
        let hid = 4 * d;
        let host = random_host(&[
            (dtype, vec![rows, d], 20, 1.0),
            (dtype, vec![d, hid], 21, 1.0 / (d as f64).sqrt()),
            (dtype, vec![hid], 22, 1.0),
            (dtype, vec![hid, d], 23, 1.0 / (hid as f64).sqrt()),
            (dtype, vec![d], 24, 1.0),
            (dtype, vec![d], 25, 1.0),
            (dtype, vec![d], 26, 1.0),
        ]);
        let names = ["x", "w1", "b1", "w2", "b2", "g", "beta"];
        let w = host_workload("mlp_block", &names, host, Arc::new(workloads::mlp_block));
        self.measure(&Case {
            workload: "mlp_block",
            shape: format!("{rows}x{d} h{hid}"),
            dtype,
            pair: Pair::from_host(w, self.device())?,
            bytes: None,
            flops: Some(2.0 * 2.0 * (rows * d * hid) as f64),
            modes: vec![Mode::Default, Mode::MaxAutotune],
            eager: Ok(()),
            scope: Scope::Rows,
            launch_target: None,
            rel_l2_ok: Some((
                1e-2,
                "cuBLASLt rounds x @ w + b once to bf16, the reference after the matmul and again after the bias add",
            )),
            host_clock: false,
        })
    }
}
