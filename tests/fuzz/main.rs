//! Random-graph fuzzing of the whole pipeline against the reference.
//!
//! A seeded generator ([`generator`]) builds well-typed graphs of 1-32 ops drawn from the op set
//! (unary, binary with broadcasting and scalar constants, where, cast, reductions over random
//! axes with and without kept dims, reshape, permute, slice, broadcast_to, concat, stack,
//! softmax, layer_norm, rms_norm and small matmuls, plus stacks of full reductions and norms over
//! rows longer than the row cache), over f32, bf16, i32 and bool values of rank 0-4 with dims
//! from `{0, 1, 2, 3, 5, 7, 8, 16, 33}`. A draw is type-checked before it is added (`infer`, then
//! `Graph::add_declared`); one that is ill-typed or too large is not added and counts as
//! skipped. Each graph is optimized and fused, every kernel gets CUDA C with its default config
//! (every 10th graph's kernels are also compiled by NVRTC for sm_90 when it is found), and the
//! plan run by `eval_plan` is judged against `eval_graph` on `random_tensor` inputs, two graphs
//! in three with NaN, +-Inf and signed zeros injected into every float input ([`run`]).
//!
//! Numerics. Fused kernels compute in f32 and the reference in f64 rounded after every op. For
//! add, sub, mul, div, sqrt, reciprocal, max, min, neg, abs, relu, comparisons, casts, views,
//! concat, stack, where and max/min reductions both give the same bits on the same inputs (one
//! correct rounding either way). Transcendentals, pow, float sums and means, norms, softmax,
//! matmul and any arithmetic on bf16 (fused kernels keep bf16 intermediates in f32) can differ in
//! the last bits, and what follows can magnify that ([`exactness`] holds the tables). So:
//! - ops that turn a last-bit difference into a different answer (comparisons, isnan, isfinite
//!   and not of floats, casts of floats to integers or bool) are only drawn on operands whose
//!   bits agree; on other operands the draw is skipped and counted;
//! - each float output is judged with the tolerance of its own dtype and of the rounding points
//!   on its path, against the reference and a reference that keeps bf16 intermediates in f32;
//!   an element outside it still passes within 4 times the spread of perturbed references, for
//!   a bounded number of elements per output; NaN and Inf must match the reference exactly
//!   ([`judge`] says how). Integer and bool outputs must match exactly.
//!
//! Seeds. `random_graphs_match_the_reference` runs the fixed regression range: `BRAZE_FUZZ_GRAPHS`
//! graphs (default 1,000) from `BRAZE_FUZZ_SEED` (default 0). `random_graphs_from_a_fresh_seed_range`
//! runs `BRAZE_FUZZ_FRESH_GRAPHS` graphs (default 300) from a seed drawn from the clock, printed
//! with the command that reruns that range; it stands aside when `BRAZE_FUZZ_SEED` is set. A
//! failure is shrunk ([`shrink`]) and the minimal graph's text and small inputs are printed;
//! fixed failures are kept in [`regressions`].
//!
//! On the GPU. `gpu_random_graphs_match_the_reference` runs `BRAZE_FUZZ_GPU_GRAPHS` graphs
//! (default 200) from `BRAZE_FUZZ_SEED` (default 0) through the CPU pipeline and then braze-cuda
//! ([`gpu`], [`gpu_fuzz`]): every kernel compiled by NVRTC for the device (no entry may spill,
//! except the few bytes only the GPU machine's NVRTC reports, counted and printed: see
//! `tolerated_spill` in `tests/common`), the plan launched
//! directly and replayed as a CUDA graph captured on other data (so a stale replay fails), outputs poisoned with NaN before every run, both judged like the CPU plan
//! executor, and the direct launches compared with the CPU plan executor: outputs the exactness
//! tables call exact must agree exactly, other differences are counted. `BRAZE_FUZZ_THREADS`
//! threads (default: the machine's parallelism) prepare and compile the graphs; one thread runs
//! them on the device. Failures are shrunk with the GPU in the loop; every regression graph also
//! runs on the GPU when there is one. Without a GPU the test prints `skipped: no CUDA device`
//! (with `BRAZE_REQUIRE_CUDA=1` it fails instead). The documented run, 10,000 graphs on the H200
//! in one device call (`benches/RESULTS.md`):
//!
//! ```text
//! bash benches/stage-gpu.sh                  # here: builds and stages .stage/bin/fuzz
//! bash .stage/gpu-run.sh fuzz                # on the GPU machine; log in $OUT/fuzz.log
//! ```
//!
//! which runs `BRAZE_REQUIRE_CUDA=1 BRAZE_FUZZ_GPU_GRAPHS=10000 .stage/bin/fuzz --exact
//! gpu_random_graphs_match_the_reference --nocapture`.

#[path = "../common/mod.rs"]
mod common;
mod emulated;
#[path = "../emulator/mod.rs"]
mod emulator;
mod exactness;
mod generator;
mod gpu;
mod gpu_fuzz;
mod gradients;
mod judge;
mod regressions;
mod rng;
mod run;
mod shrink;

use braze_ir::Graph;
use common::{nvrtc_enabled, random_inputs};
use generator::{random_graph, random_model_graph, Counts};
use gpu_fuzz::gpu_fuzz;
use run::{install_quiet_panic_hook, run_graph, run_graph_on, Stage, STAGES};
use shrink::{shrink, Repro};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// Every how many graphs the kernels are also compiled with NVRTC.
const NVRTC_EVERY: u64 = 10;
/// Failures shrunk and printed per stage (the rest are counted).
const SHRUNK_PER_STAGE: usize = 3;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Runs `graphs` random graphs from seed `first` through the pipeline, prints what they produced
/// and the shrunk failures, and fails if any graph failed.
fn fuzz(first: u64, graphs: u64) {
    fuzz_with(random_graph, first, graphs);
}

/// [`fuzz`] over the graphs `generate` draws.
fn fuzz_with(generate: fn(u64, &mut Counts) -> Graph, first: u64, graphs: u64) {
    install_quiet_panic_hook();
    let nvrtc = nvrtc_enabled();
    let mut counts = Counts::default();
    let mut kernels: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut compiled = 0;
    let mut failures: BTreeMap<Stage, Vec<u64>> = BTreeMap::new();
    let mut reports = Vec::new();
    // Elements that needed the wide reference or the spread, the graphs holding the latter, and
    // the most in one output.
    let (mut wide, mut widened, mut widened_graphs, mut most_widened, mut unstable) = (0, 0, 0, 0, 0);
    for seed in first..first + graphs {
        let graph = generate(seed, &mut counts);
        let specials = seed % 3 != 0;
        let compile_this = nvrtc && seed % NVRTC_EVERY == 0;
        match run_graph(&graph, seed, specials, compile_this) {
            Ok(produced) => {
                for (family, n) in produced.kernels {
                    *kernels.entry(family).or_default() += n;
                }
                compiled += produced.compiled;
                wide += produced.verdict.wide;
                unstable += produced.verdict.unstable;
                if produced.verdict.widened > 0 {
                    widened += produced.verdict.widened;
                    widened_graphs += 1;
                    most_widened = most_widened.max(produced.verdict.most_widened);
                }
            }
            Err(failure) => {
                let seeds = failures.entry(failure.stage).or_default();
                seeds.push(seed);
                if seeds.len() <= SHRUNK_PER_STAGE {
                    let nvrtc = failure.stage == Stage::Compile;
                    let inputs = random_inputs(&graph, seed, |_| specials);
                    let run = |r: &Repro| run_graph_on(&r.graph, &r.inputs, nvrtc).err();
                    let (small, why) = shrink(Repro { graph, inputs }, failure, run);
                    reports.push(format!(
                        "seed {seed} fails at {} (specials: {specials}); shrunk to:\n{}{}{}\n",
                        why.stage,
                        small.graph.to_text(),
                        small.small_inputs(),
                        why.message
                    ));
                }
            }
        }
    }
    let total_kernels: usize = kernels.values().sum();
    let families: Vec<String> = kernels.iter().map(|(f, n)| format!("{f} {n}")).collect();
    let skipped: Vec<String> = counts.skipped.iter().map(|(why, n)| format!("{why:?} {n}")).collect();
    println!("fuzz: {graphs} graphs from seed {first}, {} ops, draws skipped: {}", counts.ops, skipped.join(", "));
    println!("kernels produced: {total_kernels} ({}); compiled with NVRTC: {compiled}", families.join(", "));
    let by_stage: Vec<String> = STAGES.iter().map(|s| format!("{s} {}", failures.get(s).map_or(0, Vec::len))).collect();
    println!("elements within tolerance of the wide reference only: {wide}");
    println!(
        "elements matched only within the spread of the perturbed references: {widened} where the reference is \
         stable, in {widened_graphs} graphs (at most {most_widened} in one output; the bound is 1 in 16); \
         {unstable} where it is unstable"
    );
    println!("failures by stage: {}", by_stage.join(", "));
    for report in &reports {
        println!("{report}");
    }
    let failed: usize = failures.values().map(Vec::len).sum();
    assert_eq!(failed, 0, "{failed} of {graphs} graphs failed: {failures:?}");
    // Reductions over random axes include leading ones: the column family is exercised.
    assert!(graphs < 200 || kernels.get("column").is_some_and(|&n| n > 0), "no column kernels: {families:?}");
}

/// The fixed regression range (default seeds 0..1000), or the range `BRAZE_FUZZ_SEED` and
/// `BRAZE_FUZZ_GRAPHS` name.
#[test]
fn random_graphs_match_the_reference() {
    fuzz(env_u64("BRAZE_FUZZ_SEED").unwrap_or(0), env_u64("BRAZE_FUZZ_GRAPHS").unwrap_or(1000));
}

/// Graphs that also draw the model ops (log_softmax, cross_entropy, philox), a generator mode of
/// their own: `BRAZE_FUZZ_MODEL_GRAPHS` graphs (default 200) from `BRAZE_FUZZ_SEED` (default 0).
#[test]
fn random_model_graphs_match_the_reference() {
    let graphs = env_u64("BRAZE_FUZZ_MODEL_GRAPHS").unwrap_or(200);
    fuzz_with(random_model_graph, env_u64("BRAZE_FUZZ_SEED").unwrap_or(0), graphs);
}

/// A range no run has drawn before, from the clock, so every CI run fuzzes new graphs; printed
/// with the command that reruns it.
#[test]
fn random_graphs_from_a_fresh_seed_range() {
    if env_u64("BRAZE_FUZZ_SEED").is_some() {
        println!("BRAZE_FUZZ_SEED is set: random_graphs_match_the_reference runs that range; no fresh range drawn");
        return;
    }
    let graphs = env_u64("BRAZE_FUZZ_FRESH_GRAPHS").unwrap_or(300);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    // Past the fixed range, below 2^40 so it reads and types easily.
    let first = 1_000_000 + rng::Rng::new(nanos).next_u64() % (1 << 40);
    // Straight to stderr, past the test harness's capture: CI's log shows the range of every run.
    let _ = writeln!(
        std::io::stderr(),
        "fresh seed range: {graphs} graphs from seed {first}; rerun with \
         BRAZE_FUZZ_SEED={first} BRAZE_FUZZ_GRAPHS={graphs} cargo test --release --test fuzz random_graphs"
    );
    fuzz(first, graphs);
}

/// The fixed range on the GPU (default seeds 0..200; `BRAZE_FUZZ_SEED` and
/// `BRAZE_FUZZ_GPU_GRAPHS` name another): each graph compiled by NVRTC, launched directly and
/// replayed as a CUDA graph, judged like the CPU plan executor and compared with it. Skips
/// without a GPU.
#[test]
fn gpu_random_graphs_match_the_reference() {
    gpu_fuzz(env_u64("BRAZE_FUZZ_SEED").unwrap_or(0), env_u64("BRAZE_FUZZ_GPU_GRAPHS").unwrap_or(200));
}
