//! `braze`: explain and demonstrate compiled workloads.

use anyhow::{bail, Context, Result};
use braze::workloads::{self, Sizes, Workload};
use braze::{DType, Error, GraphBreak, Mode, Tensor};
use clap::{Args, Parser, Subcommand};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "braze", version, about = "Graph capture and fusion for tensor programs in Rust")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Trace a workload and report its graphs, graph breaks (with file:line:col), host syncs and
    /// recompiles.
    Explain {
        /// One of: ln_relu_res, ew_chain, multisum, tiny_block, mlp_block, sync_demo.
        workload: String,
        /// Compile with fullgraph(true): any graph break is an error (non-zero exit).
        #[arg(long)]
        strict: bool,
        /// default, reduce-overhead or max-autotune.
        #[arg(long, default_value = "default", value_parser = parse_mode)]
        mode: Mode,
        #[command(flatten)]
        sizes: SizeArgs,
    },
    /// Show tracing, graph breaks and compiled-vs-eager results for each workload at CPU-friendly
    /// sizes.
    Demo,
}

#[derive(Args)]
struct SizeArgs {
    /// Rows of x (ln_relu_res, tiny_block, mlp_block, sync_demo).
    #[arg(long, default_value_t = Sizes::default().rows)]
    rows: usize,
    /// Last dimension of x.
    #[arg(long, default_value_t = Sizes::default().hidden)]
    hidden: usize,
    /// f32, f16 or bf16.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: DType,
    /// Elements of each ew_chain input.
    #[arg(long, default_value_t = Sizes::default().n)]
    n: usize,
    /// Number of multisum tensors.
    #[arg(long, default_value_t = Sizes::default().k)]
    k: usize,
    /// Smallest multisum tensor size.
    #[arg(long, default_value_t = Sizes::default().lo)]
    lo: usize,
    /// Largest multisum tensor size.
    #[arg(long, default_value_t = Sizes::default().hi)]
    hi: usize,
    #[arg(long, default_value_t = Sizes::default().seed)]
    seed: u64,
    /// tiny_block layers.
    #[arg(long, default_value_t = Sizes::default().layers)]
    layers: usize,
}

impl SizeArgs {
    fn sizes(&self) -> Sizes {
        Sizes {
            rows: self.rows,
            hidden: self.hidden,
            dtype: self.dtype,
            n: self.n,
            k: self.k,
            lo: self.lo,
            hi: self.hi,
            seed: self.seed,
            layers: self.layers,
        }
    }
}

fn parse_dtype(s: &str) -> std::result::Result<DType, String> {
    match DType::parse(s) {
        Some(d) if d.is_float() => Ok(d),
        _ => Err(format!("expected f32, f16 or bf16, got `{s}`")),
    }
}

fn parse_mode(s: &str) -> std::result::Result<Mode, String> {
    match s {
        "default" => Ok(Mode::Default),
        "reduce-overhead" => Ok(Mode::ReduceOverhead),
        "max-autotune" => Ok(Mode::MaxAutotune),
        _ => Err(format!("expected default, reduce-overhead or max-autotune, got `{s}`")),
    }
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Explain { workload, strict, mode, sizes } => explain(&workload, strict, mode, &sizes.sizes()),
        Command::Demo => demo(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn explain(name: &str, strict: bool, mode: Mode, sizes: &Sizes) -> Result<()> {
    let workload = workloads::build(name, sizes)?;
    println!("{}", workload.signature());
    let compiled = workload.compile().fullgraph(strict).mode(mode);
    match compiled.explain(&workload.inputs) {
        Ok(explanation) => {
            print!("{explanation}");
            Ok(())
        }
        Err(Error::GraphBreak { kind, op, loc, hint }) => {
            // Tracing stopped at the first break: report it in the same form as lenient mode.
            println!("break: {}", GraphBreak { kind, op: op.clone(), loc: loc.clone(), hint });
            bail!(Error::GraphBreak { kind, op, loc, hint })
        }
        Err(e) => Err(e.into()),
    }
}

/// The demo's sizes: small enough for the CPU reference in a debug build.
fn demo_sizes() -> Sizes {
    Sizes { rows: 32, hidden: 64, n: 4096, k: 64, lo: 10, hi: 1000, layers: 16, ..Sizes::default() }
}

fn demo() -> Result<()> {
    let sizes = demo_sizes();
    for name in ["ln_relu_res", "ew_chain", "multisum", "tiny_block", "mlp_block"] {
        let workload = workloads::build(name, &sizes)?;
        println!("== {} ==", workload.signature());
        let compiled = workload.compile().fullgraph(true);
        let explanation = compiled.explain(&workload.inputs)?;
        for (i, graph) in explanation.graphs.iter().enumerate() {
            println!("graph {i} ({} ops):", graph.op_count());
            print_graph(&graph.to_text());
        }
        println!("breaks: {}, kernels: n/a (no fusion backend yet)", explanation.breaks.len());
        compare_and_time(&workload, |inputs| compiled.call(inputs))?;
        println!();
    }
    sync_demo(&sizes)?;
    println!();
    multisum_call_cost()
}

/// Prints a graph's text indented, long lines cut and long graphs shortened to their first ops
/// and the return.
fn print_graph(text: &str) {
    const MAX_WIDTH: usize = 110;
    const MAX_OPS: usize = 8;
    let lines: Vec<&str> = text.lines().collect();
    let cut = |line: &str| match line.char_indices().nth(MAX_WIDTH) {
        Some((end, _)) => format!("{} ...", &line[..end]),
        None => line.to_string(),
    };
    let ops = lines.len().saturating_sub(3);
    for (i, line) in lines.iter().enumerate() {
        let is_op = i > 0 && i + 2 < lines.len();
        if is_op && i > MAX_OPS {
            if i == MAX_OPS + 1 {
                println!("    ... {} more ops", ops - MAX_OPS);
            }
            continue;
        }
        println!("  {}", cut(line));
    }
}

/// Compiled against eager: the largest difference, and median times of each.
fn compare_and_time(workload: &Workload, compiled: impl Fn(&[Tensor]) -> braze::Result<Vec<Tensor>>) -> Result<()> {
    let got = compiled(&workload.inputs)?;
    let want = workload.eager()?;
    let error = max_abs_error(&got, &want)?;
    let elements: usize = want.iter().map(Tensor::numel).sum();
    println!("compiled vs eager: max abs error {error:e} over {elements} elements");
    let compiled_time = median_time(5, || compiled(&workload.inputs).map(drop))?;
    let eager_time = median_time(5, || workload.eager().map(drop))?;
    println!("time (CPU reference, median of 5): compiled call {compiled_time:.2?}, eager {eager_time:.2?}");
    Ok(())
}

fn sync_demo(sizes: &Sizes) -> Result<()> {
    let workload = workloads::build("sync_demo", sizes)?;
    println!("== {} ==", workload.signature());
    println!("-- lenient: split at the breaks, results equal to eager --");
    let lenient = workload.compile();
    print!("{}", lenient.explain(&workload.inputs)?);
    compare_and_time(&workload, |inputs| lenient.call(inputs))?;

    // The same function on an input holding a NaN takes the other branch of its `if`.
    let mut with_nan = workload.inputs[0].to_vec::<f32>()?;
    with_nan[0] = f32::NAN;
    let nan_inputs = vec![Tensor::from_vec(with_nan, workload.inputs[0].shape())?, workload.inputs[1].clone()];
    let got = lenient.call(&nan_inputs)?;
    let want = (workload.function)(&nan_inputs)?;
    println!("input with a NaN (the other branch): max abs error {:e} against eager", max_abs_error(&got, &want)?);

    println!("-- strict: fullgraph(true) stops at the first break --");
    let strict = workload.compile().fullgraph(true);
    match strict.call(&workload.inputs) {
        Ok(_) => bail!("sync_demo compiled in fullgraph mode without a break"),
        Err(e) => println!("error: {e}"),
    }
    Ok(())
}

/// A compiled call with 2,000 inputs: trace once, then check signatures and bind inputs per call.
fn multisum_call_cost() -> Result<()> {
    let sizes = Sizes { k: 2000, lo: 1, hi: 8, ..Sizes::default() };
    let workload = workloads::build("multisum", &sizes)?;
    println!("== multisum with K=2000 small tensors ==");
    let compiled = workload.compile().fullgraph(true);
    let start = Instant::now();
    let got = compiled.call(&workload.inputs)?;
    let first = start.elapsed();
    let cached = median_time(5, || compiled.call(&workload.inputs).map(drop))?;
    let guard_runs = 1000;
    let start = Instant::now();
    for _ in 0..guard_runs {
        if !compiled.is_cached(&workload.inputs) {
            bail!("the signature fell out of the cache");
        }
    }
    let guard = start.elapsed() / guard_runs;
    let eager = median_time(3, || workload.eager().map(drop))?;
    println!("first call (trace + compile + run): {first:.2?}");
    println!("cached call: {cached:.2?}, of which the signature check of all 2000 inputs: {guard:.2?}");
    println!("eager: {eager:.2?}");
    println!("compiled vs eager: max abs error {:e}", max_abs_error(&got, &workload.eager()?)?);
    let stats = compiled.stats();
    println!("traces: {}, cache hits: {}", stats.traces, stats.cache_hits);
    Ok(())
}

fn median_time(runs: usize, mut f: impl FnMut() -> braze::Result<()>) -> Result<Duration> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        f()?;
        times.push(start.elapsed());
    }
    times.sort();
    times.get(runs / 2).copied().context("no runs")
}

/// Largest `|a - b|` over all outputs, read as f64; NaN in the same place counts as equal.
fn max_abs_error(got: &[Tensor], want: &[Tensor]) -> Result<f64> {
    if got.len() != want.len() {
        bail!("{} outputs, expected {}", got.len(), want.len());
    }
    let mut worst = 0.0f64;
    for (g, w) in got.iter().zip(want) {
        let (g, w) = (g.to_host()?, w.to_host()?);
        if g.shape() != w.shape() || g.dtype() != w.dtype() {
            bail!("output {}{} differs from eager {}{}", g.dtype(), g.shape(), w.dtype(), w.shape());
        }
        for (a, b) in g.to_f64_vec().into_iter().zip(w.to_f64_vec()) {
            let error = if a.is_nan() && b.is_nan() || a == b { 0.0 } else { (a - b).abs() };
            worst = worst.max(if error.is_nan() { f64::INFINITY } else { error });
        }
    }
    Ok(worst)
}
