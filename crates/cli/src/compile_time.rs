//! `braze compile-time`: every host stage of a workload's cold compile, timed on this machine
//! with no GPU: trace, graph passes, fusion, memory planning, codegen of every kernel and the
//! NVRTC compiles of its sources into an empty kernel cache, as the GPU path runs them. The
//! workload is traced, never run, so the standard sizes cost no CPU execution.

use crate::common::build_workload;
use anyhow::{bail, Context, Result};
use braze::Device;
use braze_codegen::KernelCode;
use braze_cuda::{CompileOptions, KernelCache};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What `braze compile-time` is asked for.
pub struct Options<'a> {
    pub workload: &'a str,
    /// GPT-2 workloads at `Gpt2Sizes::small()` instead of the standard size.
    pub small: bool,
    /// Skip the NVRTC stage (for machines without NVRTC).
    pub no_nvrtc: bool,
    /// Compile into this kernel cache directory instead of a new empty one (kept afterwards).
    pub cache_dir: Option<&'a Path>,
}

/// Stages shown but not part of a cold compile.
const NOT_IN_TOTAL: [&str; 2] = ["setup", "cache (disk)"];

/// One stage of the table.
struct Stage {
    name: &'static str,
    time: Option<Duration>,
    note: String,
}

/// What one measurement found, for the table and for tests.
pub struct Report {
    stages: Vec<Stage>,
    pub kernels: usize,
    pub generated: usize,
    pub distinct_sources: usize,
    pub nvrtc_compiles: u64,
}

impl Report {
    /// The cold compile's host time: every stage but the setup and the warm cache pass.
    pub fn total(&self) -> Duration {
        self.stages.iter().filter(|s| !NOT_IN_TOTAL.contains(&s.name)).filter_map(|s| s.time).sum()
    }

    pub fn print(&self) {
        println!("{:<14} {:>10}  note", "stage", "ms");
        for stage in &self.stages {
            let ms = stage.time.map_or("-".to_string(), |t| format!("{:.1}", t.as_secs_f64() * 1e3));
            println!("{:<14} {ms:>10}  {}", stage.name, stage.note);
        }
        println!(
            "{:<14} {:>10.1}  trace to compiled kernels (setup and the warm pass excluded)",
            "total",
            self.total().as_secs_f64() * 1e3
        );
    }
}

pub fn run(options: &Options) -> Result<()> {
    let report = measure(options)?;
    report.print();
    Ok(())
}

pub fn measure(options: &Options) -> Result<Report> {
    let mut stages = Vec::new();
    let mut stage = |name, time, note: String| stages.push(Stage { name, time: Some(time), note });

    let started = Instant::now();
    let (workload, shape) = build_workload(options.workload, options.small, Device::Cpu)?;
    stage("setup", started.elapsed(), format!("{shape}: model and inputs on the CPU (not part of the compile)"));
    println!(
        "{} {shape}: cold compile for {} (traced, not run)",
        options.workload,
        braze::backend::assumed_gpu_target()
    );

    let compiled = workload.compile().fullgraph(true).name(options.workload);
    let started = Instant::now();
    let traced = compiled.trace_graph(&workload.inputs)?;
    stage(
        "trace",
        started.elapsed(),
        format!("{} ops, {} in-place write-backs", traced.graph.op_count(), traced.in_place.len()),
    );

    let fusion = braze_passes::FusionOptions { in_place: traced.in_place.clone(), ..Default::default() };
    let (plan, times) = braze_passes::compile_to_plan_timed(&traced.graph, &fusion).context("fusing")?;
    stage("passes", times.optimize, "optimize: dead code, decompose, simplify, CSE, recompute".into());
    stage("fusion", times.fuse, format!("{} kernels", plan.kernels.len()));

    let started = Instant::now();
    let memory = braze_plan::MemoryPlan::for_plan(&plan);
    stage("memory plan", started.elapsed(), format!("arena {:.1} MiB", memory.arena_bytes as f64 / (1 << 20) as f64));

    let target = braze::backend::assumed_gpu_target();
    let started = Instant::now();
    let configs: Vec<_> = (0..plan.kernels.len()).map(|k| braze_codegen::default_config(&plan, k, &target)).collect();
    let codes = braze_codegen::plan_sources(&plan, &configs, &target).context("generating kernels")?;
    let generated: Vec<_> = codes
        .iter()
        .filter_map(|c| match c {
            KernelCode::Cuda(g) if !g.launches.is_empty() => Some(g),
            _ => None,
        })
        .collect();
    let distinct_sources = generated.iter().map(|g| g.source.as_str()).collect::<HashSet<_>>().len();
    let source_bytes: usize = generated.iter().map(|g| g.source.len()).sum();
    stage(
        "codegen",
        started.elapsed(),
        format!(
            "{} CUDA C kernels ({} distinct sources, {:.1} KiB), {} library calls",
            generated.len(),
            distinct_sources,
            source_bytes as f64 / 1024.0,
            codes.iter().filter(|c| matches!(c, KernelCode::CuBlasLt(_))).count()
        ),
    );

    let mut nvrtc_compiles = 0;
    if options.no_nvrtc {
        stages.push(Stage { name: "nvrtc", time: None, note: "skipped (--no-nvrtc)".into() });
    } else {
        if !braze_cuda::nvrtc_available() {
            bail!("NVRTC is not available (see .ci/install-nvrtc.sh), or pass --no-nvrtc");
        }
        let (dir, fresh) = match options.cache_dir {
            Some(dir) => (dir.to_path_buf(), false),
            None => (fresh_dir()?, true),
        };
        let result = nvrtc_stages(&codes, &dir, &target, &mut stages);
        if fresh {
            let _ = std::fs::remove_dir_all(&dir);
        }
        nvrtc_compiles = result?;
    }
    stages.push(Stage {
        name: "module load",
        time: None,
        note: "needs a GPU (cuModuleLoadData per kernel): not measured".into(),
    });
    Ok(Report { stages, kernels: plan.kernels.len(), generated: generated.len(), distinct_sources, nvrtc_compiles })
}

/// The NVRTC compiles into an empty cache at `dir`, then the same lookups from a new process's
/// view of it (disk hits). Returns the compiles of the cold pass.
fn nvrtc_stages(
    codes: &[KernelCode],
    dir: &Path,
    target: &braze_codegen::Target,
    stages: &mut Vec<Stage>,
) -> Result<u64> {
    let options = CompileOptions { arch: target.arch(), ..CompileOptions::default() };
    braze_cuda::nvrtc_version().context("loading NVRTC")?;
    let mut cold = 0;
    for (name, what) in [("nvrtc", "cold"), ("cache (disk)", "warm")] {
        let cache = KernelCache::with_dir(dir).context("opening the kernel cache")?;
        let started = Instant::now();
        for module in braze_cuda::compile_kernels(codes, &cache, &options) {
            module?;
        }
        let elapsed = started.elapsed();
        let stats = cache.stats();
        if what == "cold" {
            cold = stats.compiles;
        }
        stages.push(Stage {
            name,
            time: Some(elapsed),
            note: format!(
                "{what}: {} NVRTC compiles, {} disk hits, {} memory hits, for {}, {} threads available",
                stats.compiles,
                stats.disk_hits,
                stats.memory_hits,
                options.arch,
                std::thread::available_parallelism().map_or(1, |n| n.get())
            ),
        });
    }
    Ok(cold)
}

fn fresh_dir() -> Result<PathBuf> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("braze-compile-time-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}
