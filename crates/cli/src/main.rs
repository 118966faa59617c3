//! `braze`: explain, show, demonstrate and benchmark compiled workloads.

mod bench;
mod busy;
mod common;
mod compile_time;
mod demo;
mod gpt2_check;
mod timing;
mod torch_check;
mod train;

use anyhow::{bail, Context, Result};
use braze::backend::{self, Target};
use braze::optim::StateDType;
use braze::{DType, Device, Error, GraphBreak, Mode};
use braze_workloads::Sizes;
use clap::{Args, Parser, Subcommand};
use common::{parse_device, parse_dtype, parse_mode, resolve_device, Pair};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "braze", version, about = "Graph capture and fusion for tensor programs in Rust")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Trace a workload and report its graphs, graph breaks (with file:line:col), host syncs,
    /// recompiles, kernels and launches per call.
    Explain {
        /// One of: ln_relu_res, ew_chain, multisum, tiny_block, mlp_block, sync_demo, mlp_step,
        /// block_fwd, block_step, gpt2_step.
        workload: String,
        /// Compile with fullgraph(true): any graph break is an error (non-zero exit).
        #[arg(long)]
        strict: bool,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Print the fused plan of a workload and the CUDA C of each generated kernel (on a machine
    /// without a GPU, the kernels codegen would compile with its default configurations).
    Kernels {
        /// One of: ln_relu_res, ew_chain, multisum, tiny_block, mlp_block, sync_demo, mlp_step,
        /// block_fwd, block_step, gpt2_step.
        workload: String,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// The showcase: for each workload the trace, breaks, fused plan, eager-vs-compiled time and
    /// the compiled result checked against the CPU reference on fresh inputs; then a training loop
    /// written the naive way beside the same loop with braze (GPU busy %, steps/s, every sync).
    /// On the GPU when there is one, else on the CPU at small sizes.
    Demo {
        /// cpu or cuda (default: the best available).
        #[arg(long, value_parser = parse_device)]
        device: Option<Device>,
    },
    /// Summarize a saved timeline (a `BRAZE_TRACE` file): GPU busy % over the steps, the largest
    /// gaps and what the host was doing in each.
    Timeline {
        /// The Chrome trace JSON file.
        trace: std::path::PathBuf,
    },
    /// The GPU benchmark at the standard sizes of benches/workloads.md, in the row format of
    /// benches/torch_baseline.py (needs a CUDA GPU).
    Bench {
        /// Write the rows as JSON here (`{"env": {...}, "rows": [...]}`).
        #[arg(long)]
        json: Option<std::path::PathBuf>,
        /// Comma-separated subset: copy, ln_relu_res, ew_chain, multisum, tiny_block, mlp_block,
        /// attention, mlp_step, block_fwd, block_step, gpt2_step, busy, busy_gpt2, coldstart,
        /// overhead. With --sweep: workloads of the sweep (ln_gelu_res, rms_silu_res,
        /// softmax_mask; pw_row, pw_col, pw_outer, pw_scalar).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Comma-separated sections to leave out.
        #[arg(long, value_delimiter = ',')]
        skip: Vec<String>,
        /// The directory `benches/torch_train.py --write` wrote: mlp_step also runs PyTorch's
        /// first steps from its weights and compares the losses and gradients.
        #[arg(long)]
        torch_weights: Option<std::path::PathBuf>,
        /// Milliseconds of timed repetitions per measurement (do_bench's `rep`; default 200, or
        /// 40 for a sweep).
        #[arg(long)]
        rep_ms: Option<f64>,
        /// Instead of the standard run, a sweep (benches/workloads.md, "Sweeps"): `rows` (norms
        /// with epilogues and masked softmax over hidden sizes and dtypes) or `pointwise`
        /// (broadcast chains through exp, tanh, gelu, sigmoid).
        #[arg(long, value_parser = parse_sweep)]
        sweep: Option<bench::SweepKind>,
        /// Cap on the bytes one sweep call moves, in MB: rows shrink to fit.
        #[arg(long)]
        sweep_max_mb: Option<f64>,
        /// Print the sweep's cases (shapes, dtypes, bytes) and exit; needs no GPU.
        #[arg(long)]
        list: bool,
        /// Leave out the max-autotune rows (tuning every kernel of gpt2_step takes minutes).
        #[arg(long)]
        no_autotune: bool,
    },
    /// braze's mlp_step from PyTorch's initial weights (`benches/torch_train.py --write DIR`),
    /// compiled and run on PyTorch's inputs; each step's loss and gradients compared with
    /// PyTorch's within the bf16 tolerance. Non-zero exit on a mismatch, naming the tensor.
    TrainCheck {
        /// The directory torch_train.py --write wrote.
        #[arg(long)]
        torch_weights: std::path::PathBuf,
        /// cpu or cuda (default: the best available).
        #[arg(long, value_parser = parse_device)]
        device: Option<Device>,
        /// default, reduce-overhead or max-autotune.
        #[arg(long, default_value = "default", value_parser = parse_mode)]
        mode: Mode,
        /// Write the per-tensor results as JSON here.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
    /// braze-nn's GPT-2 from PyTorch's initial weights (`benches/torch_gpt2.py --write DIR`),
    /// trained with the compiled step (clip and AdamW) on PyTorch's batches: the first steps'
    /// logits and losses compared with PyTorch's, then the loss curves side by side (every 5th
    /// step) against a tolerance that grows with the steps. Non-zero exit on a mismatch, naming
    /// the step.
    Gpt2Check {
        /// The directory torch_gpt2.py --write wrote.
        #[arg(long)]
        torch_weights: std::path::PathBuf,
        /// cpu or cuda (default: the best available).
        #[arg(long, value_parser = parse_device)]
        device: Option<Device>,
        /// none (f32) or bf16 (the forward and loss under bf16 autocast): must be what
        /// torch_gpt2.py --autocast wrote the files with, which is the default.
        #[arg(long, value_parser = gpt2_check::Precision::parse)]
        autocast: Option<gpt2_check::Precision>,
    },
    /// Train a small GPT (braze-nn's GPT-2) on a synthetic language of additions written as
    /// characters: the whole step (forward, cross-entropy, backward, gradient clipping, AdamW)
    /// compiled fullgraph, a progress bar with the loss and tokens/s on stderr, an evaluation on
    /// held-out text, a safetensors checkpoint (`--out DIR`), and resuming from one (`--resume`).
    Train {
        #[arg(long, default_value_t = train::TrainOptions::default().n_layer)]
        n_layer: usize,
        #[arg(long, default_value_t = train::TrainOptions::default().n_head)]
        n_head: usize,
        #[arg(long, default_value_t = train::TrainOptions::default().n_embd)]
        n_embd: usize,
        /// Context length of the model and of each training sequence.
        #[arg(long, default_value_t = train::TrainOptions::default().block_size)]
        block_size: usize,
        #[arg(long, default_value_t = train::TrainOptions::default().batch)]
        batch: usize,
        #[arg(long, default_value_t = train::TrainOptions::default().steps)]
        steps: usize,
        /// Peak learning rate (cosine schedule with warm-up).
        #[arg(long, default_value_t = train::TrainOptions::default().lr)]
        lr: f64,
        /// f32 or bf16 parameters.
        #[arg(long, default_value = "f32", value_parser = parse_dtype)]
        dtype: DType,
        /// Mixed precision: the forward and loss in an autocast region of bf16 or f16 (with f32
        /// parameters, nanoGPT's way).
        #[arg(long, value_parser = parse_dtype)]
        autocast: Option<DType>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Read the loss back every this many steps (each read waits for the device).
        #[arg(long, default_value_t = train::TrainOptions::default().log_every)]
        log_every: usize,
        /// Write the checkpoint (model.safetensors with PyTorch's names, optimizer.safetensors)
        /// into this directory.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// Resume from a checkpoint directory written by --out.
        #[arg(long)]
        resume: Option<std::path::PathBuf>,
        /// cpu or cuda (default: the best available).
        #[arg(long, value_parser = parse_device)]
        device: Option<Device>,
    },
    /// Times every host stage of a workload's cold compile without running it and without a GPU:
    /// trace, passes, fusion, memory plan, codegen of every kernel, NVRTC compiles of its sources
    /// (for the assumed H200, into a new empty kernel cache), then the same lookups warm.
    CompileTime {
        /// gpt2_step, block_step, block_fwd (standard sizes), or any workload of `explain`.
        workload: String,
        /// The GPT-2 workloads at their small, CPU-sized configuration.
        #[arg(long)]
        small: bool,
        /// Skip the NVRTC compiles.
        #[arg(long)]
        no_nvrtc: bool,
        /// Use (and keep) this kernel cache directory instead of a new empty one.
        #[arg(long)]
        cache_dir: Option<std::path::PathBuf>,
        /// Write the CUDA C of every generated kernel into this directory.
        #[arg(long)]
        dump: Option<std::path::PathBuf>,
        /// Print the intermediate memory alive during each kernel and what is alive at the peak.
        #[arg(long)]
        memory: bool,
        /// NVRTC threads (default: BRAZE_COMPILE_THREADS, else one per core).
        #[arg(long)]
        threads: Option<usize>,
        /// Sizes of the workloads other than GPT-2's (mlp_step at its bench size: --rows 8192
        /// --hidden 1024 --dtype bf16).
        #[command(flatten)]
        sizes: SizeArgs,
    },
    /// One cold (or warm) compile of ln_relu_res in a fresh process, for `bench`: prints one
    /// JSON line. The kernel cache directory comes from BRAZE_CACHE_DIR.
    #[command(hide = true)]
    BenchColdstart {
        #[arg(long, default_value_t = 16384)]
        rows: usize,
        #[arg(long, default_value_t = 4096)]
        hidden: usize,
        #[arg(long, default_value = "f32", value_parser = parse_dtype)]
        dtype: DType,
    },
}

#[derive(Args)]
struct CommonArgs {
    /// default, reduce-overhead or max-autotune.
    #[arg(long, default_value = "default", value_parser = parse_mode)]
    mode: Mode,
    /// cpu or cuda (default: the best available).
    #[arg(long, value_parser = parse_device)]
    device: Option<Device>,
    #[command(flatten)]
    sizes: SizeArgs,
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
    /// mlp_step: keep AdamW's moments in the parameters' dtype, as torch.optim does (f32 when
    /// not given).
    #[arg(long)]
    state_of_params: bool,
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
            optimizer_state: if self.state_of_params { StateDType::OfParams } else { StateDType::F32 },
        }
    }
}

fn parse_sweep(s: &str) -> std::result::Result<bench::SweepKind, String> {
    bench::SweepKind::parse(s).ok_or_else(|| format!("expected rows or pointwise, got `{s}`"))
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Explain { workload, strict, common } => explain(&workload, strict, &common),
        Command::Kernels { workload, common } => kernels(&workload, &common),
        Command::Demo { device } => demo::run(device),
        Command::Timeline { trace } => timeline(&trace),
        Command::Bench { json, only, skip, rep_ms, torch_weights, sweep, sweep_max_mb, list, no_autotune } => {
            bench::run(&bench::Options {
                json: json.as_deref(),
                only: &only,
                skip: &skip,
                rep_ms,
                torch_weights: torch_weights.as_deref(),
                sweep,
                sweep_max_mb,
                list,
                autotune: !no_autotune,
            })
        }
        Command::TrainCheck { torch_weights, device, mode, json } => {
            train_check(&torch_weights, device, mode, json.as_deref())
        }
        Command::Gpt2Check { torch_weights, device, autocast } => resolve_device(device).and_then(|device| {
            let report = gpt2_check::check(&torch_weights, device, autocast)?;
            for line in &report.lines {
                println!("{line}");
            }
            report.verdict()
        }),
        Command::Train {
            n_layer,
            n_head,
            n_embd,
            block_size,
            batch,
            steps,
            lr,
            dtype,
            autocast,
            seed,
            log_every,
            out,
            resume,
            device,
        } => {
            let options = train::TrainOptions {
                n_layer,
                n_head,
                n_embd,
                block_size,
                batch,
                steps,
                lr,
                dtype,
                autocast,
                seed,
                log_every,
                out,
                resume,
                ..train::TrainOptions::default()
            };
            run_train(&options, device)
        }
        Command::CompileTime { workload, small, no_nvrtc, cache_dir, dump, memory, threads, sizes } => {
            compile_time::run(&compile_time::Options {
                workload: &workload,
                small,
                sizes: sizes.sizes(),
                no_nvrtc,
                cache_dir: cache_dir.as_deref(),
                dump: dump.as_deref(),
                memory,
                threads,
            })
        }
        Command::BenchColdstart { rows, hidden, dtype } => bench::coldstart_child(rows, hidden, dtype),
    };
    // Writes the BRAZE_TRACE timeline, if one is being recorded, and prints its summary.
    let result = result.and_then(|()| braze::timeline::finish().map(|_| ()).map_err(Into::into));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn explain(name: &str, strict: bool, args: &CommonArgs) -> Result<()> {
    let device = resolve_device(args.device)?;
    let pair = Pair::build(name, &args.sizes.sizes(), device)?;
    println!("{} on {device}", pair.dev.signature());
    print_assumed_target(device);
    let compiled = pair.dev.compile().fullgraph(strict).mode(args.mode);
    match compiled.explain(&pair.dev.inputs) {
        Ok(explanation) => {
            // Display prints graphs, breaks (`break: <kind> at <file>:<line>:<col>: <hint>`),
            // host syncs, recompiles, `kernels: N` and `launches: N`.
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

/// Without a GPU, kernels and launch counts are codegen's for an assumed GPU: say which.
fn timeline(path: &std::path::Path) -> Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let trace = braze::timeline::Trace::from_json(&text).with_context(|| format!("reading {}", path.display()))?;
    let device = trace.spans.iter().filter(|s| !matches!(s.track, braze::timeline::Track::Host(_))).count();
    println!("{}: {} spans ({} host, {device} device)", path.display(), trace.spans.len(), trace.spans.len() - device);
    print!("{}", braze::timeline::Summary::of(&trace));
    Ok(())
}

fn print_assumed_target(device: Device) {
    if device == Device::Cpu {
        println!("no GPU in use: kernels and launches are generated for {} (assumed)", backend::assumed_gpu_target());
    }
}

fn kernels(name: &str, args: &CommonArgs) -> Result<()> {
    let device = resolve_device(args.device)?;
    let pair = Pair::build(name, &args.sizes.sizes(), device)?;
    let compiled = pair.dev.compile().mode(args.mode);
    let explanation = compiled.explain(&pair.dev.inputs)?;
    println!("{} on {device}, mode {}", pair.dev.signature(), args.mode);
    print_assumed_target(device);
    println!("graphs: {}, breaks: {}", explanation.graphs.len(), explanation.breaks.len());
    for b in &explanation.breaks {
        println!("break: {b}");
    }
    for (g, graph) in explanation.graphs.iter().enumerate() {
        let exe = backend::compile_fused(graph, Target { device, mode: args.mode })?;
        println!("\n==== graph {g}: {} ops ====", graph.op_count());
        let Some(plan) = exe.plan() else {
            println!("(this backend runs no fused plan)");
            continue;
        };
        print!("{plan}");
        let sources = exe.kernel_sources();
        for (k, kernel) in plan.kernels.iter().enumerate() {
            println!("\n---- kernel {k}: {} ({}) ----", kernel.name, kernel.kind.family());
            match sources.iter().find(|(name, _)| *name == kernel.name) {
                Some((_, source)) => print!("{source}"),
                None if kernel.kind.family() == "matmul" => println!("(cuBLASLt matmul: no generated CUDA C)"),
                None => println!("(no CUDA C: the kernel has nothing to do, e.g. zero elements)"),
            }
        }
    }
    Ok(())
}

fn run_train(options: &train::TrainOptions, device: Option<Device>) -> Result<()> {
    let device = resolve_device(device)?;
    println!(
        "training GPT n_layer={} n_head={} n_embd={} block_size={} batch={} on {device} ({} steps, {})",
        options.n_layer,
        options.n_head,
        options.n_embd,
        options.block_size,
        options.batch,
        options.steps,
        options.dtype
    );
    let report = train::train(options, device)?;
    println!(
        "step {}: train loss {:.4} (first {:.4}), eval loss {:.4}, {:.0} tokens/s",
        report.steps_done, report.last_loss, report.first_loss, report.eval_loss, report.tokens_per_s
    );
    let curve: Vec<String> = report.curve.iter().map(|(step, loss)| format!("{step} {loss:.4}")).collect();
    println!("loss curve (step loss): {}", curve.join(", "));
    if let Some(dir) = &options.out {
        println!("checkpoint written to {}", dir.display());
    }
    Ok(())
}

fn train_check(
    dir: &std::path::Path,
    device: Option<Device>,
    mode: Mode,
    json: Option<&std::path::Path>,
) -> Result<()> {
    let device = resolve_device(device)?;
    let run = torch_check::TorchRun::open(dir)?;
    println!(
        "mlp_step {} {}: {} steps of PyTorch's run in {} on {device}",
        run.shape(),
        run.sizes.dtype,
        run.steps,
        dir.display()
    );
    let report = torch_check::check_steps(&run, device, mode)?;
    report.print();
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(&report.to_json())?)?;
    }
    let failures = report.failures();
    if !failures.is_empty() {
        bail!("{} mismatch(es) with PyTorch:\n  {}", failures.len(), failures.join("\n  "));
    }
    Ok(())
}
