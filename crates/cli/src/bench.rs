//! `braze bench`: the workloads of `benches/workloads.md` at their standard sizes on the GPU,
//! timed as `benches/torch_baseline.py` times PyTorch (do_bench medians), checked against the CPU reference, and
//! written as rows with the same workload, shape and dtype keys so `compare.py` can join them.

use crate::common::{check_host, slice_rows, Check, Pair};
use crate::timing::{fmt_us, GpuTimer, Timing};
use anyhow::{bail, Context, Result};
use braze::{compile, DType, Device, HostTensor, Mode, Tensor};
use braze_workloads::{self as workloads, Sizes, Workload};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECTIONS: [&str; 8] =
    ["copy", "ln_relu_res", "ew_chain", "multisum", "tiny_block", "mlp_block", "coldstart", "overhead"];

pub fn run(json_path: Option<&Path>, only: &[String], rep_ms: f64) -> Result<()> {
    for name in only {
        if !SECTIONS.contains(&name.as_str()) {
            bail!("--only: unknown section `{name}`; known: {}", SECTIONS.join(", "));
        }
    }
    if !braze_cuda::cuda_available() {
        bail!(
            "braze bench needs a CUDA GPU: no CUDA driver or device is usable on this machine, so nothing was measured"
        );
    }
    if !braze_cuda::nvrtc_available() {
        bail!("braze bench needs NVRTC (libnvrtc.so) to compile kernels: not found (set LD_LIBRARY_PATH); nothing was measured");
    }
    let timer = GpuTimer::new(0)?;
    let (major, minor) = timer.device.compute_capability();
    let env = json!({
        "gpu": timer.device.name(),
        "compute_capability": format!("{major}.{minor}"),
        "braze": env!("CARGO_PKG_VERSION"),
        "nvrtc": braze_cuda::nvrtc_version().map(|(a, b)| format!("{a}.{b}")).unwrap_or_default(),
        "kernel_cache_dir": braze_cuda::KernelCache::default_dir().map(|d| d.display().to_string()),
        "timing": format!("do_bench on braze's stream: 25 ms warm-up, {rep_ms} ms of repetitions, L2 flushed before each, median"),
    });
    println!("{env}");
    let mut bench = Bench { timer, rows: Vec::new(), rep_ms, copy_gbps: None, failures: Vec::new() };
    let want = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    type Section = Box<dyn Fn(&mut Bench) -> Result<()>>;
    let sections: Vec<(&str, Section)> = vec![
        ("copy", Box::new(|b| b.copy())),
        ("ln_relu_res", Box::new(|b| b.ln_relu_res(16384, 4096, DType::F32, true))),
        ("ln_relu_res", Box::new(|b| b.ln_relu_res(16384, 4096, DType::BF16, false))),
        ("ln_relu_res", Box::new(|b| b.ln_relu_res(65536, 1024, DType::F32, false))),
        ("ew_chain", Box::new(|b| b.ew_chain(1 << 26))),
        ("multisum", Box::new(|b| b.multisum(2000, 1000, 300_000, 0))),
        ("multisum", Box::new(|b| b.multisum(10_000, 100, 10_000, 0))),
        ("tiny_block", Box::new(|b| b.tiny_block(16))),
        ("mlp_block", Box::new(|b| b.mlp_block(8192, 1024))),
        ("coldstart", Box::new(|b| b.coldstart())),
        ("overhead", Box::new(|b| b.host_overhead())),
    ];
    for (name, section) in sections {
        if !want(name) {
            continue;
        }
        if let Err(e) = section(&mut bench) {
            let message = format!("{e:#}");
            eprintln!("error in {name}: {message}");
            bench.info(name, "-", "-", "info error", None, &format!("not measured (error): {message}"));
            bench.failures.push(format!("{name}: {message}"));
        }
    }
    bench.print_table();
    if let Some(path) = json_path {
        let doc = json!({ "env": env, "rows": bench.rows });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {} rows to {}", bench.rows.len(), path.display());
    }
    if !bench.failures.is_empty() {
        bail!("{} problem(s):\n  {}", bench.failures.len(), bench.failures.join("\n  "));
    }
    Ok(())
}

struct Bench {
    timer: GpuTimer,
    rows: Vec<Value>,
    rep_ms: f64,
    copy_gbps: Option<f64>,
    /// Wrong results, missed launch counts and errors: the run exits non-zero.
    failures: Vec<String>,
}

/// Which part of the output is checked against the CPU reference.
enum Scope {
    All,
    /// Row-wise (or elementwise) workloads: every row, the reference computed in chunks of rows
    /// from the same rows of the inputs shaped like the output.
    Rows,
}

/// One workload at one size, with everything measured about it.
struct Case {
    workload: &'static str,
    shape: String,
    dtype: DType,
    pair: Pair,
    bytes: Option<f64>,
    flops: Option<f64>,
    modes: Vec<Mode>,
    /// `Err(reason)` when eager is not measured.
    eager: std::result::Result<(), String>,
    scope: Scope,
    /// Launches per call expected, and how many more are allowed.
    launch_target: Option<(usize, usize)>,
    /// Where elementwise tolerance is the wrong yardstick: the relative L2 error that passes
    /// instead, and why.
    rel_l2_ok: Option<(f64, &'static str)>,
    /// Also time per call on the host clock (launch-bound workloads).
    host_clock: bool,
}

fn mode_variant(mode: Mode) -> &'static str {
    match mode {
        Mode::Default => "braze compiled",
        Mode::ReduceOverhead => "braze compiled+graphs",
        Mode::MaxAutotune => "braze compiled+autotune",
    }
}

fn dtype_name(dtype: DType) -> String {
    dtype.to_string()
}

/// Host tensors of random normals (never all zero), each scaled by its factor; made on all cores.
fn random_host(specs: &[(DType, Vec<usize>, u64, f64)]) -> Vec<HostTensor> {
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
    fn device(&self) -> Device {
        Device::Cuda(self.timer.device.ordinal())
    }

    fn print_row(row: &Value) {
        let s = |k: &str| row.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let us = row.get("us").and_then(Value::as_f64);
        let time = us.map_or_else(|| "-".to_string(), fmt_us);
        let gbps = row.get("gbps").and_then(Value::as_f64).map_or(String::new(), |g| format!("{g:8.0} GB/s"));
        let mut extra = String::new();
        if let Some(l) = row.get("launches").and_then(Value::as_u64) {
            extra += &format!("  launches={l}");
        }
        if let Some(c) = row.get("check").and_then(Value::as_str) {
            extra += &format!("  check={c}");
        }
        if let Some(n) = row.get("note").and_then(Value::as_str) {
            extra += &format!("  {n}");
        }
        println!(
            "{:12} {:22} {:5} {:28} {:>12} {gbps}{extra}",
            s("workload"),
            s("shape"),
            s("dtype"),
            s("variant"),
            time
        );
    }

    fn emit(&mut self, row: Value) {
        Self::print_row(&row);
        self.rows.push(row);
    }

    /// An informational row (`variant` starts with `info`). Its note starts with the measured
    /// time, so readers that print only notes (compare.py) show it; `us` is `None` where the row
    /// holds no time, and a note starting `not measured:` says why.
    fn info(&mut self, workload: &str, shape: &str, dtype: &str, variant: &str, us: Option<f64>, note: &str) {
        let note = match us {
            Some(us) => format!("{}: {note}", fmt_us(us)),
            None => note.to_string(),
        };
        self.emit(json!({
            "workload": workload, "shape": shape, "dtype": dtype, "variant": variant,
            "us": us, "gbps": null, "note": note,
        }));
    }

    fn bench(&self, f: &mut dyn FnMut() -> Result<()>, rep_ms: f64) -> Result<Timing> {
        self.timer.do_bench(f, 25.0, rep_ms)
    }

    fn copy(&mut self) -> Result<()> {
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

    fn ln_relu_res(&mut self, rows: usize, hidden: usize, dtype: DType, restart: bool) -> Result<()> {
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
            modes: vec![Mode::Default],
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

    fn ew_chain(&mut self, n: usize) -> Result<()> {
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
            modes: vec![Mode::Default],
            eager: Ok(()),
            scope: Scope::Rows,
            launch_target: Some((1, 0)),
            rel_l2_ok: None,
            host_clock: false,
        })
    }

    fn multisum(&mut self, k: usize, lo: usize, hi: usize, seed: u64) -> Result<()> {
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
            modes: vec![Mode::Default, Mode::ReduceOverhead],
            eager: Err(format!(
                "not measured: braze eager compiles one kernel per distinct op shape, and there are {} distinct tensor \
                 sizes here",
                {
                    let mut distinct = sizes.clone();
                    distinct.sort_unstable();
                    distinct.dedup();
                    distinct.len()
                }
            )),
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

    fn tiny_block(&mut self, layers: usize) -> Result<()> {
        let sizes = Sizes { rows: 64, hidden: 256, layers, dtype: DType::F32, seed: 0, ..Sizes::default() };
        self.measure(&Case {
            workload: "tiny_block",
            shape: format!("{layers}L 64x256"),
            dtype: DType::F32,
            pair: Pair::build("tiny_block", &sizes, self.device())?,
            bytes: None,
            flops: None,
            modes: vec![Mode::Default, Mode::ReduceOverhead],
            eager: Ok(()),
            scope: Scope::Rows,
            launch_target: Some((1, 0)),
            rel_l2_ok: None,
            host_clock: true,
        })
    }

    fn mlp_block(&mut self, rows: usize, d: usize) -> Result<()> {
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
            modes: vec![Mode::Default],
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

    /// Compiles, checks and times one case in each mode, then eager.
    fn measure(&mut self, case: &Case) -> Result<()> {
        let inputs = &case.pair.dev.inputs;
        let dtype = dtype_name(case.dtype);
        let reference = Reference::new(case)?;
        for &mode in &case.modes {
            let variant = mode_variant(mode);
            let compiled = case.pair.dev.compile().fullgraph(true).mode(mode);
            let before = braze::kernel_cache_stats();
            let start = Instant::now();
            let out = compiled.call(inputs)?;
            self.timer.sync()?;
            let first_call = start.elapsed();
            let after = braze::kernel_cache_stats();
            let check = reference.check(&out)?;
            drop(out);
            let explanation = compiled.explain(inputs)?;
            let timing = self.bench(&mut || ran(compiled.call(inputs)), self.rep_ms)?;
            let us = timing.median_us;
            let mut row = Map::new();
            row.insert("workload".into(), json!(case.workload));
            row.insert("shape".into(), json!(case.shape));
            row.insert("dtype".into(), json!(dtype));
            row.insert("variant".into(), json!(variant));
            row.insert("us".into(), json!(us));
            row.insert("gbps".into(), json!(case.bytes.map(|b| b / (us * 1e-6) / 1e9)));
            row.insert("reps".into(), json!(timing.reps));
            if let (Some(b), Some(copy)) = (case.bytes, self.copy_gbps) {
                row.insert("pct_copy".into(), json!(100.0 * b / (us * 1e-6) / 1e9 / copy));
            }
            if let Some(flops) = case.flops {
                row.insert("tflops".into(), json!(flops / (us * 1e-6) / 1e12));
            }
            row.insert("kernels".into(), json!(explanation.kernels));
            row.insert("launches".into(), json!(explanation.launches));
            if let Some((target, extra)) = case.launch_target {
                let met = explanation.launches.is_some_and(|l| l <= target + extra && l >= target.min(1));
                row.insert(
                    "launch_target".into(),
                    json!(if extra > 0 { format!("{target}+{extra}") } else { target.to_string() }),
                );
                row.insert("launch_target_met".into(), json!(met));
                if !met {
                    self.failures.push(format!(
                        "{} {} {variant}: {:?} launches per call, target {target} (+{extra})",
                        case.workload, case.shape, explanation.launches
                    ));
                }
            }
            row.insert("first_call_s".into(), json!(first_call.as_secs_f64()));
            row.insert("first_call_nvrtc_compiles".into(), json!(after.compiles - before.compiles));
            let verdict = verdict(&check, case.rel_l2_ok);
            if let (Some((limit, why)), false) = (case.rel_l2_ok, check.passed()) {
                row.insert("check_note".into(), json!(format!("judged on rel L2 error < {limit:e}: {why}")));
            }
            row.insert("check".into(), json!(verdict));
            row.insert("checked".into(), json!(format!("all {} output elements", check.numel)));
            row.insert("max_abs_err".into(), json!(check.max_abs_error));
            row.insert("rel_err".into(), json!(check.rel_l2_error()));
            row.insert("mismatches".into(), json!(check.mismatches));
            if verdict == "FAIL" {
                self.failures.push(format!(
                    "{} {} {dtype} {variant}: wrong result: {} ({})",
                    case.workload,
                    case.shape,
                    check.summary(),
                    check.first_mismatch.clone().unwrap_or_default()
                ));
            }
            self.emit(Value::Object(row));
            if case.host_clock {
                let (enqueue, total) = self.timer.host_per_call(&mut || ran(compiled.call(inputs)), 1000)?;
                let note = format!(
                    "host clock per call over 1000 back-to-back cached calls, until the device finished; \
                     returning from the call alone: {:.2} us",
                    micros(enqueue)
                );
                let v = format!("info host per call{}", if mode == Mode::ReduceOverhead { "+graphs" } else { "" });
                self.info(case.workload, &case.shape, &dtype, &v, Some(micros(total)), &note);
            }
        }
        match &case.eager {
            Ok(()) => {
                let f = &case.pair.dev.function;
                let timing = self.bench(&mut || ran(f(inputs)), self.rep_ms)?;
                let us = timing.median_us;
                let ops: usize = {
                    let compiled = case.pair.dev.compile();
                    compiled.explain(inputs)?.graphs.iter().map(|g| g.op_count()).sum()
                };
                let mut row = json!({
                    "workload": case.workload, "shape": case.shape, "dtype": dtype, "variant": "braze eager",
                    "us": us, "gbps": case.bytes.map(|b| b / (us * 1e-6) / 1e9), "ops": ops,
                    "reps": timing.reps,
                });
                if let Some(flops) = case.flops {
                    row["tflops"] = json!(flops / (us * 1e-6) / 1e12);
                }
                self.emit(row);
            }
            Err(reason) => self.info(case.workload, &case.shape, &dtype, "info braze eager", None, reason),
        }
        Ok(())
    }

    /// A new `compile()` of the same function in this process: its kernels come from the
    /// in-memory kernel cache.
    fn restart_in_process(&mut self, case: &Case) -> Result<()> {
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
    fn coldstart(&mut self) -> Result<()> {
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
    fn host_overhead(&mut self) -> Result<()> {
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
            let compiled = compile(fifty_ops).fullgraph(true).mode(mode);
            let got = compiled.call(&dev)?;
            let check = check_host(&got[0].to_host()?, &want[0].to_host()?)?;
            drop(got);
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

    fn print_table(&self) {
        println!();
        println!(
            "{:12} {:22} {:5} {:28} {:>12} {:>9} {:>6} {:>9} {:>6}",
            "workload", "shape", "dtype", "variant", "time", "GB/s", "%copy", "launches", "check"
        );
        for row in &self.rows {
            let s = |k: &str| row.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            let variant = s("variant");
            if variant.starts_with("info") && variant != "info braze copy" {
                continue;
            }
            let us = row.get("us").and_then(Value::as_f64);
            let gbps = row.get("gbps").and_then(Value::as_f64);
            let pct = match (gbps, self.copy_gbps) {
                (Some(g), Some(c)) => format!("{:.1}", 100.0 * g / c),
                _ => "-".into(),
            };
            let launches = match (row.get("launches").and_then(Value::as_u64), row.get("launch_target_met")) {
                (Some(l), Some(Value::Bool(false))) => format!("{l} (!)"),
                (Some(l), _) => l.to_string(),
                _ => "-".into(),
            };
            println!(
                "{:12} {:22} {:5} {:28} {:>12} {:>9} {:>6} {:>9} {:>6}",
                s("workload"),
                s("shape"),
                s("dtype"),
                variant,
                us.map_or_else(|| "-".to_string(), fmt_us),
                gbps.map_or_else(|| "-".to_string(), |g| format!("{g:.0}")),
                pct,
                launches,
                row.get("check").and_then(Value::as_str).unwrap_or("-")
            );
        }
        let infos: Vec<&Value> = self
            .rows
            .iter()
            .filter(|r| r["variant"].as_str().is_some_and(|v| v.starts_with("info") && v != "info braze copy"))
            .collect();
        if !infos.is_empty() {
            println!();
            for row in infos {
                println!(
                    "{:12} {:22} {:5} {:26} {}",
                    row["workload"].as_str().unwrap_or(""),
                    row["shape"].as_str().unwrap_or(""),
                    row["dtype"].as_str().unwrap_or(""),
                    row["variant"].as_str().unwrap_or(""),
                    row["note"].as_str().unwrap_or("")
                );
            }
        }
    }
}

/// Drops a call's outputs (so the executable can reuse their buffers) and keeps its error.
fn ran(outputs: braze::Result<Vec<Tensor>>) -> Result<()> {
    outputs?;
    Ok(())
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `pass` within the elementwise tolerance of the dtype; `pass (rel L2)` where the case allows it
/// and the relative L2 error is below its limit; else `FAIL`.
fn verdict(check: &Check, rel_l2_ok: Option<(f64, &str)>) -> &'static str {
    if check.passed() {
        "pass"
    } else if rel_l2_ok.is_some_and(|(limit, _)| check.rel_l2_error() < limit) {
        "pass (rel L2)"
    } else {
        "FAIL"
    }
}

/// Reference outputs for the rows `start..end` of every output (`None`: all rows).
type Part = (Option<(usize, usize)>, Vec<HostTensor>);

/// The CPU reference outputs for a case, computed once; row-wise workloads in row chunks on all
/// cores (rows are independent, so a chunk's reference is the function on those input rows).
struct Reference {
    /// `(rows, outputs)`: the rows of every output these reference outputs cover, `None` for all.
    parts: Vec<Part>,
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(1, 32)
}

fn outputs_to_host(outputs: Vec<Tensor>) -> Result<Vec<HostTensor>> {
    Ok(outputs.iter().map(Tensor::to_host).collect::<braze::Result<_>>()?)
}

impl Reference {
    fn new(case: &Case) -> Result<Reference> {
        let host = &case.pair.host;
        if let Scope::All = case.scope {
            return Ok(Reference { parts: vec![(None, outputs_to_host(host.eager()?)?)] });
        }
        let inputs: Vec<HostTensor> = host.inputs.iter().map(Tensor::to_host).collect::<braze::Result<_>>()?;
        let out_shape = inputs[0].shape().clone();
        let rows = out_shape.dims().first().copied().unwrap_or(1);
        let per_chunk = rows.div_ceil(cores()).max(1);
        let ranges: Vec<(usize, usize)> =
            (0..rows).step_by(per_chunk).map(|a| (a, (a + per_chunk).min(rows))).collect();
        let function = &host.function;
        let inputs = &inputs;
        let out_shape = &out_shape;
        let parts: Result<Vec<_>> = std::thread::scope(|scope| {
            let handles: Vec<_> = ranges
                .iter()
                .map(|&(start, end)| {
                    scope.spawn(move || -> Result<Part> {
                        let chunk: Vec<Tensor> = inputs
                            .iter()
                            .map(|t| {
                                let t = if t.shape() == out_shape { slice_rows(t, start, end)? } else { t.clone() };
                                Ok(Tensor::from_host(t))
                            })
                            .collect::<Result<_>>()?;
                        Ok((Some((start, end)), outputs_to_host(function(&chunk)?)?))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().map_err(|_| anyhow::anyhow!("reference thread panicked"))?).collect()
        });
        Ok(Reference { parts: parts? })
    }

    fn check(&self, got: &[Tensor]) -> Result<Check> {
        let got: Vec<HostTensor> = got.iter().map(Tensor::to_host).collect::<braze::Result<_>>()?;
        let got = &got;
        let checks: Vec<Result<Check>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .parts
                .iter()
                .map(|(rows, want)| {
                    scope.spawn(move || -> Result<Check> {
                        if want.len() != got.len() {
                            bail!("{} outputs, the reference has {}", got.len(), want.len());
                        }
                        let mut check = Check::empty();
                        for (g, w) in got.iter().zip(want) {
                            let part;
                            let g = match rows {
                                Some((start, end)) => {
                                    part = slice_rows(g, *start, *end)?;
                                    &part
                                }
                                None => g,
                            };
                            check.merge(check_host(g, w)?);
                        }
                        Ok(check)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().map_err(|_| anyhow::anyhow!("check thread panicked"))?).collect()
        });
        let mut total = Check::empty();
        for c in checks {
            total.merge(c?);
        }
        Ok(total)
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
