//! The random-graph fuzz on the GPU: a pool of threads generates each graph, computes its
//! references, fuses, runs the CPU plan executor and compiles the kernels with NVRTC; one thread
//! (the test's own) takes the graphs from a channel and runs them on the device, so no two
//! threads launch on it at once. Failures are shrunk afterwards with the whole pipeline, GPU
//! included.

use crate::common::random_inputs;
use crate::generator::{random_graph, Counts};
use crate::gpu::{capture_data, compile_plan, gpu, run_everywhere, run_on_gpu, Agreement, Compiled, GpuProduced};
use crate::run::{install_quiet_panic_hook, run_on_cpu, CpuRun, Failure, Stage, GPU_STAGES};
use crate::shrink::{shrink, Repro};
use braze_codegen::Target;
use braze_ir::{Graph, HostTensor};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::sync_channel;
use std::time::{Duration, Instant};

/// Graphs between progress lines (a run stopped by its time limit still shows how far it got).
const PROGRESS_EVERY: usize = 1000;
/// Failures shrunk and printed per stage (the rest are counted).
const SHRUNK_PER_STAGE: usize = 2;
/// Time all shrinking may take (each step compiles its kernels again); past it, a failure is
/// printed as far as it was shrunk.
const SHRINK_BUDGET: Duration = Duration::from_secs(90);

/// One graph made ready on a worker thread.
struct Prepared {
    seed: u64,
    graph: Graph,
    inputs: Vec<HostTensor>,
    counts: Counts,
    ready: Result<(CpuRun, Compiled), Failure>,
}

/// Everything up to the GPU: the CPU pipeline (its own NVRTC stage off: [`compile_plan`]
/// compiles every kernel for the device) and the device's kernels.
fn prepare(seed: u64, target: &Target) -> Prepared {
    let mut counts = Counts::default();
    let graph = random_graph(seed, &mut counts);
    let inputs = random_inputs(&graph, seed, |_| !seed.is_multiple_of(3));
    let ready = run_on_cpu(&graph, &inputs, false).and_then(|cpu| compile_plan(&cpu.plan, target).map(|c| (cpu, c)));
    Prepared { seed, graph, inputs, counts, ready }
}

/// Threads for the CPU half: `BRAZE_FUZZ_THREADS`, else the machine's parallelism.
fn threads() -> usize {
    std::env::var("BRAZE_FUZZ_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(4, |n| n.get()))
}

/// Sums over the graphs run.
#[derive(Default)]
struct Totals {
    counts: Counts,
    kernels: usize,
    wide: usize,
    widened: usize,
    unstable: usize,
    agreement: Agreement,
    compiled_on_device_thread: u64,
    device_busy: Duration,
}

impl Totals {
    fn add(&mut self, produced: &GpuProduced, cpu_unstable: usize) {
        for v in [&produced.direct, &produced.replay] {
            self.wide += v.wide;
            self.widened += v.widened;
            self.unstable += v.unstable;
        }
        self.unstable += cpu_unstable;
        self.agreement.add(produced.agreement);
        self.compiled_on_device_thread += produced.compiled_on_device_thread;
    }
}

/// Runs `graphs` random graphs from seed `first` on the CPU and on the GPU; prints what they
/// produced, graphs per second and the shrunk failures, and fails if any graph failed. Skips
/// (printing why) without a GPU.
pub fn gpu_fuzz(first: u64, graphs: u64) {
    let Some(device) = gpu() else { return };
    let target = device.target().clone();
    println!("gpu fuzz on {}: {graphs} graphs from seed {first}", device.name());
    drop(device);
    install_quiet_panic_hook();
    let threads = threads();
    let started = Instant::now();
    let next = AtomicU64::new(first);
    let mut totals = Totals::default();
    let mut failures: BTreeMap<Stage, Vec<u64>> = BTreeMap::new();
    let mut to_shrink: Vec<(Repro, u64, Failure)> = Vec::new();
    std::thread::scope(|scope| {
        let (sender, receiver) = sync_channel::<Prepared>(2 * threads);
        for _ in 0..threads {
            let (sender, next, target) = (sender.clone(), &next, &target);
            scope.spawn(move || loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= first + graphs || sender.send(prepare(seed, target)).is_err() {
                    break;
                }
            });
        }
        drop(sender);
        for (done, prepared) in receiver.into_iter().enumerate() {
            if done > 0 && done % PROGRESS_EVERY == 0 {
                println!(
                    "{done} graphs in {:.1} s (device thread busy {:.1} s, {} failed)",
                    started.elapsed().as_secs_f64(),
                    totals.device_busy.as_secs_f64(),
                    failures.values().map(Vec::len).sum::<usize>()
                );
            }
            let Prepared { seed, graph, inputs, counts, ready } = prepared;
            totals.counts.merge(counts);
            let result = ready.and_then(|(cpu, compiled)| {
                totals.kernels += compiled.kernels;
                let busy = Instant::now();
                let device = gpu().expect("the GPU was there when the fuzz started");
                let result = run_on_gpu(&device, &graph, &cpu, &compiled, &inputs, &capture_data(&graph, seed));
                totals.device_busy += busy.elapsed();
                result.map(|produced| (produced, cpu.produced.verdict.unstable))
            });
            match result {
                Ok((produced, cpu_unstable)) => totals.add(&produced, cpu_unstable),
                Err(failure) => {
                    let seeds = failures.entry(failure.stage).or_default();
                    seeds.push(seed);
                    if seeds.len() <= SHRUNK_PER_STAGE {
                        to_shrink.push((Repro { graph, inputs }, seed, failure));
                    } else {
                        // Not shrunk, but what failed is still worth a line.
                        let first_line = failure.message.lines().next().unwrap_or_default();
                        println!("seed {seed} fails at {} (not shrunk): {first_line}", failure.stage);
                    }
                }
            }
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    let skipped: Vec<String> = totals.counts.skipped.iter().map(|(why, n)| format!("{why:?} {n}")).collect();
    println!(
        "{graphs} graphs in {elapsed:.1} s on {threads} threads: {:.1} graphs/s; the device thread was busy {:.1} s",
        graphs as f64 / elapsed,
        totals.device_busy.as_secs_f64()
    );
    println!("{} ops, draws skipped: {}", totals.counts.ops, skipped.join(", "));
    println!(
        "CUDA kernels compiled with NVRTC: {} (and {} more by PlanExecutable::new, which should find them all compiled)",
        totals.kernels, totals.compiled_on_device_thread
    );
    println!(
        "GPU elements within tolerance of the wide reference only: {}; within the spread where the reference is \
         stable: {}; where it is unstable: {} (direct launches and replays, and the CPU plan executor's unstable)",
        totals.wide, totals.widened, totals.unstable
    );
    let a = totals.agreement;
    println!(
        "GPU vs CPU plan executor: {} elements equal, {} different within the output's tolerance, {} further apart \
         (each accepted by the judge)",
        a.identical, a.within_tolerance, a.beyond_tolerance
    );
    let by_stage: Vec<String> =
        GPU_STAGES.iter().map(|s| format!("{s} {}", failures.get(s).map_or(0, Vec::len))).collect();
    println!(
        "kernels whose NVRTC log had no ptxas report (spills unread here; CI reads them): {}",
        crate::common::KERNELS_WITHOUT_PTXAS_REPORT.load(std::sync::atomic::Ordering::Relaxed)
    );
    println!(
        "entries with a spill only the GPU machine's NVRTC reports (<= 8 B at a 1024-thread block's register cap, \
         <= 32 B in sinf/cosf kernels; CI fails on any spill): {}",
        crate::common::TOLERATED_SPILLS.load(std::sync::atomic::Ordering::Relaxed)
    );
    println!("failures by stage: {}", by_stage.join(", "));

    let deadline = Instant::now() + SHRINK_BUDGET;
    for (repro, seed, failure) in to_shrink {
        let stage = failure.stage;
        // Past the deadline every candidate counts as passing, which ends the shrinking.
        let run = |r: &Repro| {
            (Instant::now() < deadline).then(|| run_everywhere(&r.graph, &r.inputs, seed, &target).err()).flatten()
        };
        let (small, why) = shrink(repro, failure, run);
        println!(
            "seed {seed} fails at {stage} (specials: {}); shrunk to:\n{}{}{}\n",
            !seed.is_multiple_of(3),
            small.graph.to_text(),
            small.small_inputs(),
            why.message
        );
    }
    let failed: usize = failures.values().map(Vec::len).sum();
    assert_eq!(failed, 0, "{failed} of {graphs} graphs failed: {failures:?}");
    // The compiles belong on the worker threads; any on the device thread means the fuzz and
    // the executor key kernels differently and the device thread compiles serially.
    assert_eq!(
        totals.compiled_on_device_thread, 0,
        "PlanExecutable::new compiled kernels the worker threads had compiled"
    );
}
