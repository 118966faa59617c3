//! Start-up and host costs: a new `compile()` in this process, cold and warm start in fresh
//! processes, and the host time of a cached call.

use super::cases::random_host;
use super::measure::Case;
use super::{dtype_name, micros, ran, with_poisoned_outputs, Bench};
use crate::common::check_host;
use anyhow::{bail, Context, Result};
use braze::{compile, DType, Device, Mode, Tensor};
use braze_workloads as workloads;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Instant;

impl Bench {
    /// A new `compile()` of the same function in this process: its kernels come from the
    /// in-memory kernel cache.
    pub(super) fn restart_in_process(&mut self, case: &Case) -> Result<()> {
        let inputs = &case.pair.dev.inputs;
        let compiled = case.pair.dev.compile().fullgraph(true);
        let before = braze::kernel_cache_stats();
        let start = Instant::now();
        ran(compiled.call(inputs))?;
        self.timer.sync()?;
        let elapsed = start.elapsed();
        let after = braze::kernel_cache_stats();
        let note = format!(
            "a new compile() of the same function in this process, first call until done: trace, fuse, codegen, \
             kernels from the in-memory cache ({} NVRTC compiles, {} memory hits), module load, run",
            after.compiles - before.compiles,
            after.memory_hits - before.memory_hits
        );
        self.info(
            case.workload,
            &case.shape,
            &dtype_name(case.dtype),
            "info restart in process",
            Some(micros(elapsed)),
            &note,
        );
        Ok(())
    }

    /// Cold and warm start in fresh processes sharing one new kernel cache directory.
    pub(super) fn coldstart(&mut self) -> Result<()> {
        let exe = std::env::current_exe().context("finding the braze executable")?;
        let dir = fresh_dir("braze-coldstart")?;
        let mut runs = Vec::new();
        for _ in 0..2 {
            let output = std::process::Command::new(&exe)
                .arg("bench-coldstart")
                .env("BRAZE_CACHE_DIR", &dir)
                .env_remove("BRAZE_DUMP")
                .env_remove("BRAZE_LOG")
                .output()
                .context("running `braze bench-coldstart`")?;
            let stdout = String::from_utf8_lossy(&output.stdout);
            if !output.status.success() {
                let _ = std::fs::remove_dir_all(&dir);
                bail!("bench-coldstart failed: {}{}", stdout, String::from_utf8_lossy(&output.stderr));
            }
            let line =
                stdout.lines().rev().find(|l| l.starts_with('{')).context("no result line from bench-coldstart")?;
            runs.push(serde_json::from_str::<Value>(line)?);
        }
        let _ = std::fs::remove_dir_all(&dir);
        let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
        let (cold, warm) = (&runs[0], &runs[1]);
        let note = format!(
            "fresh process, empty kernel cache dir, CUDA context up: trace + fuse + codegen + NVRTC + module load + first run, \
             until done ({} NVRTC compiles); loading libnvrtc took {:.1} ms more, before the timed part",
            num(cold, "nvrtc_compiles"),
            num(cold, "nvrtc_load_ms")
        );
        self.info("ln_relu_res", "16384x4096", "f32", "info cold start", Some(num(cold, "first_call_ms") * 1e3), &note);
        let note = format!(
            "a second fresh process with the same kernel cache dir: {} NVRTC compiles, {} disk hits",
            num(warm, "nvrtc_compiles"),
            num(warm, "disk_hits")
        );
        self.info("ln_relu_res", "16384x4096", "f32", "info warm start", Some(num(warm, "first_call_ms") * 1e3), &note);
        if num(warm, "nvrtc_compiles") != 0.0 {
            self.failures.push("warm start compiled kernels: the disk kernel cache missed".into());
        }
        Ok(())
    }

    /// Host time of a cached call of a 50-op elementwise function on a tiny tensor.
    pub(super) fn host_overhead(&mut self) -> Result<()> {
        let host = random_host(&[(DType::F32, vec![256], 30, 1.0), (DType::F32, vec![256], 31, 0.5)]);
        let host: Vec<Tensor> = host.into_iter().map(Tensor::from_host).collect();
        let dev: Vec<Tensor> = host.iter().map(|t| t.to_device(self.device())).collect::<braze::Result<_>>()?;
        let fifty_ops = |a: &[Tensor]| -> braze::Result<Vec<Tensor>> {
            let mut x = a[0].clone();
            for _ in 0..25 {
                x = x.mul(&a[1])?.tanh()?;
            }
            Ok(vec![x])
        };
        let want = fifty_ops(&host)?;
        for mode in [Mode::Default, Mode::ReduceOverhead] {
            // Checked on its own instance with poisoned outputs; timed on one without the memsets.
            let check = with_poisoned_outputs(|| -> Result<_> {
                let got = compile(fifty_ops).fullgraph(true).mode(mode).call(&dev)?;
                check_host(&got[0].to_host()?, &want[0].to_host()?)
            })?;
            let compiled = compile(fifty_ops).fullgraph(true).mode(mode);
            let explanation = compiled.explain(&dev)?;
            let ops: usize = explanation.graphs.iter().map(|g| g.op_count()).sum();
            let (enqueue, total) = self.timer.host_per_call(&mut || ran(compiled.call(&dev)), 1000)?;
            let note = format!(
                "host clock per cached call over 1000 calls (signature check, binding, {}): {ops} ops fused into {} kernel(s), \
                 {} launch(es); until the device finished: {:.2} us/call; result vs CPU reference: {}",
                if mode == Mode::ReduceOverhead { "graph replay" } else { "launch" },
                explanation.kernels.unwrap_or(0),
                explanation.launches.unwrap_or(0),
                micros(total),
                check.summary()
            );
            let variant = format!("info host overhead{}", if mode == Mode::ReduceOverhead { "+graphs" } else { "" });
            self.info("host_overhead", "50 ops f32[256]", "f32", &variant, Some(micros(enqueue)), &note);
            if !check.passed() {
                self.failures.push(format!("host_overhead {mode}: wrong result: {}", check.summary()));
            }
        }
        Ok(())
    }
}

/// A new, empty directory under the system temp dir.
fn fresh_dir(prefix: &str) -> Result<PathBuf> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// `braze bench-coldstart`: in a fresh process with the CUDA context up and the inputs on the
/// device, the first call of a newly compiled ln_relu_res until the device finished.
pub fn coldstart_child(rows: usize, hidden: usize, dtype: DType) -> Result<()> {
    if !braze_cuda::cuda_available() {
        bail!("bench-coldstart needs a CUDA GPU");
    }
    let device = braze::cuda_device(0)?;
    let start = Instant::now();
    braze_cuda::nvrtc_version().context("loading NVRTC")?;
    let nvrtc_load = start.elapsed();
    let host = random_host(&[
        (dtype, vec![rows, hidden], 1, 1.0),
        (dtype, vec![hidden], 2, 1.0),
        (dtype, vec![hidden], 3, 1.0),
        (dtype, vec![rows, hidden], 4, 1.0),
    ]);
    let inputs: Vec<Tensor> =
        host.into_iter().map(|h| Tensor::from_host(h).to_device(Device::Cuda(0))).collect::<braze::Result<_>>()?;
    device.synchronize()?;
    let before = braze::kernel_cache_stats();
    let start = Instant::now();
    let compiled = compile(workloads::ln_relu_res).fullgraph(true);
    let out = compiled.call(&inputs)?;
    device.synchronize()?;
    let first_call = start.elapsed();
    let after = braze::kernel_cache_stats();
    drop(out);
    let explanation = compiled.explain(&inputs)?;
    println!(
        "{}",
        json!({
            "first_call_ms": first_call.as_secs_f64() * 1e3,
            "nvrtc_load_ms": nvrtc_load.as_secs_f64() * 1e3,
            "nvrtc_compiles": after.compiles - before.compiles,
            "disk_hits": after.disk_hits - before.disk_hits,
            "memory_hits": after.memory_hits - before.memory_hits,
            "kernels": explanation.kernels,
            "launches": explanation.launches,
            "cache_dir": braze_cuda::KernelCache::default_dir().map(|d| d.display().to_string()),
        })
    );
    Ok(())
}
