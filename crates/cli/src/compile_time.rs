//! `braze compile-time`: every host stage of a workload's cold compile, timed on this machine
//! with no GPU: trace, graph passes, fusion, memory planning, codegen of every kernel and the
//! NVRTC compiles of its sources into an empty kernel cache, as the GPU path runs them. The
//! workload is traced, never run, so the standard sizes cost no CPU execution.

use crate::common::build_workload;
use anyhow::{bail, Context, Result};
use braze::Device;
use braze_codegen::KernelCode;
use braze_cuda::{CompileOptions, KernelCache};
use braze_workloads::Sizes;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What `braze compile-time` is asked for.
pub struct Options<'a> {
    pub workload: &'a str,
    /// GPT-2 workloads at `Gpt2Sizes::small()` instead of the standard size.
    pub small: bool,
    /// The sizes of every other workload.
    pub sizes: Sizes,
    /// Skip the NVRTC stage (for machines without NVRTC).
    pub no_nvrtc: bool,
    /// Compile into this kernel cache directory instead of a new empty one (kept afterwards).
    pub cache_dir: Option<&'a Path>,
    /// NVRTC threads (default: `braze_cuda::compile_threads`, one per core).
    pub threads: Option<usize>,
    /// Write each generated kernel's CUDA C here as `<name>.cu`.
    pub dump: Option<&'a Path>,
    /// Print the intermediates alive during each kernel.
    pub memory: bool,
}

/// Stages shown but not part of a cold compile.
const NOT_IN_TOTAL: [&str; 2] = ["setup", "cache (disk)"];

/// One stage of the table.
struct Stage {
    name: &'static str,
    time: Option<Duration>,
    note: String,
}

/// What one measurement found.
struct Report {
    stages: Vec<Stage>,
    kernels: usize,
    generated: usize,
    distinct_units: usize,
    nvrtc_compiles: Option<u64>,
}

impl Report {
    /// The cold compile's host time: every stage but the setup and the warm cache pass.
    fn total(&self) -> Duration {
        self.stages.iter().filter(|s| !NOT_IN_TOTAL.contains(&s.name)).filter_map(|s| s.time).sum()
    }

    fn print(&self) {
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
        let compiles = self.nvrtc_compiles.map_or("-".to_string(), |n| n.to_string());
        println!(
            "counts: {} kernels, {} CUDA C, {} distinct units, {compiles} NVRTC compiles",
            self.kernels, self.generated, self.distinct_units
        );
    }
}

pub fn run(options: &Options) -> Result<()> {
    let report = measure(options)?;
    report.print();
    Ok(())
}

fn measure(options: &Options) -> Result<Report> {
    let mut stages = Vec::new();
    let mut stage = |name, time, note: String| stages.push(Stage { name, time: Some(time), note });

    let started = Instant::now();
    let (workload, shape) = build_workload(options.workload, options.small, &options.sizes, Device::Cpu)?;
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
    let saved = braze_plan::saved_for_backward(&plan)
        .map_or(String::new(), |s| format!(", {:.1} MiB saved for backward in {} buffers", mib(s.bytes), s.buffers));
    stage("memory plan", started.elapsed(), format!("arena {:.1} MiB{saved}", mib(memory.arena_bytes)));
    if options.memory {
        print_live_memory(&plan);
    }

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
    if let Some(dir) = options.dump {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for g in &generated {
            let path = dir.join(format!("{}.cu", g.name));
            std::fs::write(&path, &g.source).with_context(|| format!("writing {}", path.display()))?;
        }
        // The fused plan beside its kernels: which graph ops each kernel holds and its buffers.
        let path = dir.join("plan.txt");
        std::fs::write(&path, plan.to_string()).with_context(|| format!("writing {}", path.display()))?;
    }
    let distinct_sources = generated.iter().map(|g| g.source.as_str()).collect::<HashSet<_>>().len();
    let distinct_units =
        generated.iter().map(|g| braze_cuda::unit::unit_source(&g.name, &g.source)).collect::<HashSet<_>>().len();
    let source_bytes: usize = generated.iter().map(|g| g.source.len()).sum();
    stage(
        "codegen",
        started.elapsed(),
        format!(
            "{} CUDA C kernels ({} distinct sources, {} distinct units, {:.1} KiB, {:.1} MiB of scratch), {} library calls",
            generated.len(),
            distinct_sources,
            distinct_units,
            source_bytes as f64 / 1024.0,
            mib(generated.iter().flat_map(|g| &g.scratch).map(|s| s.bytes).sum()),
            codes.iter().filter(|c| matches!(c, KernelCode::CuBlasLt(_))).count()
        ),
    );

    let mut nvrtc_compiles = None;
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
        let threads = options.threads.unwrap_or_else(braze_cuda::compile_threads);
        let result = nvrtc_stages(&codes, &dir, &target, threads, &mut stages);
        if fresh {
            let _ = std::fs::remove_dir_all(&dir);
        }
        nvrtc_compiles = Some(result?);
    }
    stages.push(Stage {
        name: "module load",
        time: None,
        note: "needs a GPU (cuModuleLoadData per kernel): not measured".into(),
    });
    Ok(Report { stages, kernels: plan.kernels.len(), generated: generated.len(), distinct_units, nvrtc_compiles })
}

/// The NVRTC compiles into an empty cache at `dir`, then the same lookups from a new process's
/// view of it (disk hits). Returns the compiles of the cold pass.
fn nvrtc_stages(
    codes: &[KernelCode],
    dir: &Path,
    target: &braze_codegen::Target,
    threads: usize,
    stages: &mut Vec<Stage>,
) -> Result<u64> {
    let options = CompileOptions { arch: target.arch(), ..CompileOptions::default() };
    braze_cuda::nvrtc_version().context("loading NVRTC")?;
    let mut cold = 0;
    for (name, what) in [("nvrtc", "cold"), ("cache (disk)", "warm")] {
        let cache = KernelCache::with_dir(dir).context("opening the kernel cache")?;
        let started = Instant::now();
        let modules = braze_cuda::compile_kernels_on(codes, &cache, &options, threads)?;
        let elapsed = started.elapsed();
        if what == "cold" {
            print_slowest(codes, &modules);
        }
        let stats = cache.stats();
        if what == "cold" {
            cold = stats.compiles;
        }
        stages.push(Stage {
            name,
            time: Some(elapsed),
            note: format!(
                "{what}: {} NVRTC compiles, {} disk hits, {} memory hits, for {}, on {threads} thread(s) \
                 ({cores} cores here)",
                stats.compiles,
                stats.disk_hits,
                stats.memory_hits,
                options.arch,
                cores = std::thread::available_parallelism().map_or(1, |n| n.get())
            ),
        });
    }
    Ok(cold)
}

/// The units that took NVRTC longest (the last of them bounds a parallel compile from below),
/// with the kernels sharing each, and the sum of all compile times (the work to spread).
fn print_slowest(codes: &[KernelCode], modules: &[Option<std::sync::Arc<braze_cuda::CompiledModule>>]) {
    let mut units: Vec<(f64, Vec<&str>)> = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for (code, module) in codes.iter().zip(modules) {
        let (KernelCode::Cuda(g), Some(module)) = (code, module) else { continue };
        let at = *seen.entry(std::sync::Arc::as_ptr(module)).or_insert_with(|| {
            units.push((module.compile_ms, Vec::new()));
            units.len() - 1
        });
        units[at].1.push(&g.name);
    }
    units.sort_by(|a, b| b.0.total_cmp(&a.0));
    let sum: f64 = units.iter().map(|u| u.0).sum();
    println!("NVRTC: {} units, {sum:.0} ms of compile time in all; the slowest:", units.len());
    for (ms, names) in units.iter().take(8) {
        println!("  {ms:>8.0} ms  {} (x{})", names[0], names.len());
    }
}

fn fresh_dir() -> Result<PathBuf> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("braze-compile-time-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// The intermediate bytes alive during each kernel, then the placements alive at the peak (1 MiB
/// or more) with the kernels that write and read them: where a step's memory goes.
fn print_live_memory(plan: &braze_plan::Plan) {
    let live = braze_plan::memory::live_during_kernels(plan);
    let totals: Vec<usize> = live.iter().map(|slots| slots.iter().map(|s| s.bytes).sum()).collect();
    println!("{:>6} {:>10}  kernel", "kernel", "live MiB");
    for (k, kernel) in plan.kernels.iter().enumerate() {
        println!("{k:>6} {:>10.1}  {}", mib(totals[k]), kernel.name);
    }
    let Some(peak) = (0..totals.len()).max_by_key(|&k| (totals[k], std::cmp::Reverse(k))) else { return };
    println!("alive during kernel {peak} ({:.1} MiB):", mib(totals[peak]));
    let touching = |b: braze_plan::BufferId, writes: bool| -> Vec<String> {
        let kernels = plan.kernels.iter().enumerate();
        kernels
            .filter(|(_, k)| if writes { k.outputs.contains(&b) } else { k.inputs.contains(&b) })
            .map(|(i, _)| i.to_string())
            .collect()
    };
    for slot in live[peak].iter().filter(|s| s.bytes >= 1 << 20) {
        let chain: Vec<String> = slot
            .buffers
            .iter()
            .map(|&b| {
                let buffer = plan.buffer(b);
                format!(
                    "{b} {} x{} written by {} read by {}",
                    buffer.dtype,
                    buffer.numel,
                    touching(b, true).join(","),
                    touching(b, false).join(",")
                )
            })
            .collect();
        println!("  {:>8.1} MiB  {}", mib(slot.bytes), chain.join("; then "));
    }
}

/// Bytes in MiB, for the stage notes.
fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}
