//! `braze bench`: the workloads of `benches/workloads.md` at their standard sizes on the GPU,
//! timed as `benches/torch_baseline.py` times PyTorch (do_bench medians), checked against the CPU
//! reference (the checked call with outputs poisoned), and written as rows with the same
//! workload, shape and dtype keys so `compare.py` can join them. The training step `mlp_step`
//! (`training.rs`) is too large for the CPU reference: it is checked against PyTorch's first
//! steps instead, given `--torch-weights`. `--sweep rows|pointwise` times a sweep of sizes and
//! dtypes instead (`sweep.rs`), in default and max-autotune mode, at fewer repetitions.

mod attention;
mod busy_loops;
mod cases;
mod gpt2;
mod measure;
mod report;
mod startup;
mod sweep;
mod sweep_run;
mod training;

use crate::timing::{GpuTimer, Timing};
use anyhow::{bail, Context, Result};
use braze::optim::StateDType;
use braze::{DType, Device, Mode, Tensor};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use startup::coldstart_child;
pub use sweep::SweepKind;

/// Milliseconds of timed repetitions per measurement: the standard run, and a sweep's many cases.
pub const REP_MS: f64 = 200.0;
pub const SWEEP_REP_MS: f64 = 40.0;

const SECTIONS: [&str; 15] = [
    "copy",
    "ln_relu_res",
    "ew_chain",
    "multisum",
    "tiny_block",
    "mlp_block",
    "attention",
    "mlp_step",
    "block_fwd",
    "block_step",
    "gpt2_step",
    "busy",
    "busy_gpt2",
    "coldstart",
    "overhead",
];

/// What `braze bench` was asked to do.
pub struct Options<'a> {
    pub json: Option<&'a Path>,
    /// Sections to run (empty: all) and to leave out.
    pub only: &'a [String],
    pub skip: &'a [String],
    /// `None`: [`REP_MS`], or [`SWEEP_REP_MS`] for a sweep.
    pub rep_ms: Option<f64>,
    /// `torch_train.py --write`'s directory: check mlp_step against PyTorch's first steps.
    pub torch_weights: Option<&'a Path>,
    /// Run this sweep (after the copy anchor) instead of the standard sections.
    pub sweep: Option<SweepKind>,
    /// Cap on the bytes one sweep call moves, in MB (rows shrink to fit).
    pub sweep_max_mb: Option<f64>,
    /// Print the sweep's cases and exit: no GPU needed.
    pub list: bool,
    /// Measure the max-autotune rows too.
    pub autotune: bool,
}

/// `--list`: the cases of the sweep (those of the workloads in `only`, if any), one a line, and
/// their total bytes.
pub fn sweep_listing(kind: SweepKind, max_mb: Option<f64>, only: &[String]) -> String {
    let cases: Vec<_> = sweep::sweep_cases(kind, max_mb)
        .into_iter()
        .filter(|c| only.is_empty() || only.iter().any(|o| o == c.workload))
        .collect();
    let mut out = String::new();
    for case in &cases {
        out += &format!("{case}\n");
    }
    let total: usize = cases.iter().map(|c| c.bytes).sum();
    out += &format!("{} cases, {:.1} GB moved by one call of each\n", cases.len(), total as f64 / 1e9);
    out
}

pub fn run(options: &Options) -> Result<()> {
    let Options { json: json_path, only, skip, rep_ms, torch_weights, sweep, sweep_max_mb, list, autotune } = *options;
    if let Some(mb) = sweep_max_mb {
        if sweep.is_none() {
            bail!("--sweep-max-mb sizes a sweep: give --sweep rows|pointwise");
        }
        if !(mb.is_finite() && mb > 0.0) {
            bail!("--sweep-max-mb must be a positive number of MB, got {mb}");
        }
    }
    if let Some(kind) = sweep {
        if !skip.is_empty() || torch_weights.is_some() {
            bail!("--sweep runs the sweep alone: --skip and --torch-weights choose parts of the standard run");
        }
        let known = sweep::sweep_workloads(kind);
        if let Some(name) = only.iter().find(|n| !known.contains(&n.as_str())) {
            bail!("--only: `{name}` is no workload of this sweep; known: {}", known.join(", "));
        }
    }
    if list {
        let Some(kind) = sweep else { bail!("--list prints a sweep's cases: give --sweep rows|pointwise") };
        print!("{}", sweep_listing(kind, sweep_max_mb, only));
        return Ok(());
    }
    let rep_ms = rep_ms.unwrap_or(if sweep.is_some() { SWEEP_REP_MS } else { REP_MS });
    if !(rep_ms.is_finite() && rep_ms > 0.0) {
        bail!("--rep-ms must be a positive number of milliseconds, got {rep_ms}");
    }
    for (flag, names) in [("--only", only), ("--skip", skip)].into_iter().filter(|_| sweep.is_none()) {
        if let Some(name) = names.iter().find(|n| !SECTIONS.contains(&n.as_str())) {
            bail!("{flag}: unknown section `{name}`; known: {}", SECTIONS.join(", "));
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
        "sizes": match sweep {
            Some(kind) => format!("sweep {}", kind.name()),
            None => "standard".to_string(),
        },
        "sweep_max_mb": sweep_max_mb,
    });
    println!("{env}");
    let save_to = json_path.map(|path| (path.to_path_buf(), env));
    let mut bench = Bench { timer, rows: Vec::new(), rep_ms, copy_gbps: None, failures: Vec::new(), save_to, autotune };
    let want = |name: &str| (only.is_empty() || only.iter().any(|o| o == name)) && !skip.iter().any(|s| s == name);
    if torch_weights.is_some() && !want("mlp_step") {
        bail!("--torch-weights checks mlp_step, which --only/--skip leave out");
    }
    type Section<'a> = Box<dyn Fn(&mut Bench) -> Result<()> + 'a>;
    let sections: Vec<(&str, Section)> = match sweep {
        Some(kind) => {
            vec![("copy", Box::new(|b| b.copy())), ("sweep", Box::new(move |b| b.sweep(kind, sweep_max_mb, only)))]
        }
        None => vec![
            ("copy", Box::new(|b| b.copy())),
            ("ln_relu_res", Box::new(|b| b.ln_relu_res(16384, 4096, DType::F32, true))),
            ("ln_relu_res", Box::new(|b| b.ln_relu_res(16384, 4096, DType::BF16, false))),
            ("ln_relu_res", Box::new(|b| b.ln_relu_res(65536, 1024, DType::F32, false))),
            ("ew_chain", Box::new(|b| b.ew_chain(1 << 26))),
            ("multisum", Box::new(|b| b.multisum(2000, 1000, 300_000, 0))),
            ("multisum", Box::new(|b| b.multisum(10_000, 100, 10_000, 0))),
            ("tiny_block", Box::new(|b| b.tiny_block(16))),
            ("mlp_block", Box::new(|b| b.mlp_block(8192, 1024))),
            ("attention", Box::new(|b| b.attention(16, 12, 1024, 64))),
            ("mlp_step", Box::new(move |b| b.mlp_step(8192, 1024, StateDType::F32, torch_weights))),
            ("mlp_step", Box::new(move |b| b.mlp_step(8192, 1024, StateDType::OfParams, torch_weights))),
            ("block_fwd", Box::new(|b| b.gpt2_workload("block_fwd"))),
            ("block_step", Box::new(|b| b.gpt2_workload("block_step"))),
            ("gpt2_step", Box::new(|b| b.gpt2_workload("gpt2_step"))),
            ("busy", Box::new(|b| b.busy(&busy_loops::busy_sizes()))),
            ("busy_gpt2", Box::new(|b| b.busy(&busy_loops::busy_gpt2_sizes()))),
            ("coldstart", Box::new(|b| b.coldstart())),
            ("overhead", Box::new(|b| b.host_overhead())),
        ],
    };
    for (name, section) in sections {
        if sweep.is_none() && !want(name) {
            continue;
        }
        if let Err(e) = section(&mut bench) {
            let message = format!("{e:#}");
            eprintln!("error in {name}: {message}");
            bench.info(name, "-", "-", "info error", None, &format!("not measured (error): {message}"));
            bench.failures.push(format!("{name}: {message}"));
        }
        bench.save()?;
    }
    bench.print_table();
    if let Some((path, _)) = &bench.save_to {
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
    /// `--json`'s file and the run's environment: rewritten after each section (and sweep
    /// case), so a run stopped by a time limit keeps the rows it measured.
    save_to: Option<(PathBuf, Value)>,
    /// Measure the max-autotune rows (`--no-autotune` leaves them out).
    autotune: bool,
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

impl Bench {
    fn device(&self) -> Device {
        Device::Cuda(self.timer.device.ordinal())
    }

    /// Writes the rows so far to `--json`'s file, if given.
    fn save(&self) -> Result<()> {
        if let Some((path, env)) = &self.save_to {
            let doc = json!({ "env": env, "rows": self.rows });
            std::fs::write(path, serde_json::to_string_pretty(&doc)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }

    /// `modes` less max-autotune where the run leaves it out.
    fn modes(&self, modes: &[Mode]) -> Vec<Mode> {
        modes.iter().copied().filter(|&m| self.autotune || m != Mode::MaxAutotune).collect()
    }

    fn bench(&self, f: &mut dyn FnMut() -> Result<()>, rep_ms: f64) -> Result<Timing> {
        self.timer.do_bench(f, 25.0, rep_ms)
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

/// Runs `f` with `BRAZE_POISON_OUTPUTS=1`: GPU executables built inside it fill their outputs
/// with NaN before every run. The variable is read when an executable is built and is restored
/// afterwards; no other thread runs while it is changed (the reference threads run inside `f`).
pub(super) fn with_poisoned_outputs<R>(f: impl FnOnce() -> R) -> R {
    const POISON: &str = "BRAZE_POISON_OUTPUTS";
    let previous = std::env::var_os(POISON);
    std::env::set_var(POISON, "1");
    let result = f();
    match previous {
        Some(value) => std::env::set_var(POISON, value),
        None => std::env::remove_var(POISON),
    }
    result
}
