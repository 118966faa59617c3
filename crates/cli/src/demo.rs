//! `braze demo`: each workload traced, fused, timed eager against compiled, and checked against
//! the CPU reference on fresh inputs; then graph breaks and the cost of a cached call.

use crate::busy;
use crate::common::{check_outputs, print_graph, resolve_device, Pair};
use crate::timing::{fmt_us, host_median, GpuTimer};
use anyhow::{bail, Result};
use braze::backend::{self, Target};
use braze::{DType, Device, Explanation, Mode, Tensor};
use braze_workloads::Sizes;
use std::time::Instant;

/// Sizes per workload: seconds in all on either device.
fn cases(on_gpu: bool) -> Vec<(&'static str, Sizes)> {
    let base = Sizes::default();
    if on_gpu {
        vec![
            ("ln_relu_res", Sizes { rows: 4096, hidden: 1024, ..base.clone() }),
            ("ew_chain", Sizes { n: 1 << 22, ..base.clone() }),
            // Eager runs one kernel per distinct tensor size, each compiled once: keep K small.
            ("multisum", Sizes { k: 32, lo: 1000, hi: 100_000, ..base.clone() }),
            ("tiny_block", Sizes { rows: 64, hidden: 256, layers: 16, ..base.clone() }),
            ("mlp_block", Sizes { rows: 256, hidden: 512, ..base }),
        ]
    } else {
        let small = Sizes { rows: 32, hidden: 64, n: 4096, k: 64, lo: 10, hi: 1000, layers: 16, ..base };
        ["ln_relu_res", "ew_chain", "multisum", "tiny_block", "mlp_block"]
            .into_iter()
            .map(|n| (n, small.clone()))
            .collect()
    }
}

pub fn run(asked: Option<Device>) -> Result<()> {
    let device = resolve_device(asked)?;
    let timer = match device {
        Device::Cuda(ordinal) => {
            let timer = GpuTimer::new(ordinal)?;
            println!("braze demo on {device} ({}), times are CUDA-event medians", timer.device.name());
            Some(timer)
        }
        Device::Cpu => {
            println!("braze demo on the CPU (no CUDA device here): small sizes, host-clock medians.");
            println!(
                "The CPU plan executor runs each fused kernel with the GPU kernel's loop structure, to check fusion; \
                 its times say nothing about GPU speed."
            );
            None
        }
    };
    println!();
    for (name, sizes) in cases(timer.is_some()) {
        workload(name, &sizes, device, timer.as_ref())?;
        println!();
    }
    let small = Sizes { rows: 32, hidden: 64, ..Sizes::default() };
    sync_demo(&small, device)?;
    println!();
    multisum_call_cost(device, timer.as_ref())?;
    println!();
    keeping_busy(device)
}

/// A training loop written the naive way beside the same loop with braze, each with a timeline.
fn keeping_busy(device: Device) -> Result<()> {
    let sizes = match device {
        Device::Cuda(_) => (1024, 512, 200),
        Device::Cpu => (8, 16, 100),
    };
    let (rows, hidden, steps) = sizes;
    let sizes =
        busy::LoopSizes { model: busy::LoopModel::Mlp { rows, hidden, dtype: DType::F32 }, steps, read_every: 50 };
    println!("== keeping the GPU busy: mlp_step [{rows}, {hidden}] x {steps} steps on {device} ==");
    println!(
        "naive: a metric read with a host copy every step, a NaN check in an `if`, pageable batches, eager launches"
    );
    println!(
        "braze: a strict compiled step in reduce-overhead mode (CUDA graphs), device metrics read every {} steps, \
         pinned prefetch",
        sizes.read_every
    );
    if device == Device::Cpu {
        println!("(on the CPU backend the \"GPU\" is the CPU executor's kernel runs)");
    }
    let naive = busy::naive_loop(device, &sizes, true)?;
    let fast = busy::braze_loop(device, &sizes, true)?;
    print!("{}", busy::report(&naive, &fast));
    if (naive.mean_loss - fast.mean_loss).abs() > 1e-2 * naive.mean_loss.abs().max(1.0) {
        bail!("the two loops trained differently: mean loss {} vs {}", naive.mean_loss, fast.mean_loss);
    }
    Ok(())
}

/// Drops a call's outputs and keeps its error.
fn ran(outputs: braze::Result<Vec<Tensor>>) -> Result<()> {
    outputs?;
    Ok(())
}

fn sync(timer: Option<&GpuTimer>) -> Result<()> {
    timer.map_or(Ok(()), GpuTimer::sync)
}

/// Median time of `f`: CUDA events on the GPU, host clock on the CPU.
fn time_us(timer: Option<&GpuTimer>, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    match timer {
        Some(t) => Ok(t.do_bench(f, 5.0, 25.0)?.median_us),
        None => Ok(host_median(5, f)?.as_secs_f64() * 1e6),
    }
}

fn workload(name: &str, sizes: &Sizes, device: Device, timer: Option<&GpuTimer>) -> Result<()> {
    let pair = Pair::build(name, sizes, device)?;
    println!("== {} on {device} ==", pair.dev.signature());
    let compiled = pair.dev.compile().fullgraph(true);
    let start = Instant::now();
    let explanation = compiled.explain(&pair.dev.inputs)?;
    sync(timer)?;
    let first = start.elapsed();
    let ops: usize = explanation.graphs.iter().map(|g| g.op_count()).sum();
    println!(
        "traced: {} graph(s), {ops} ops, {} breaks; first call (trace, fuse, codegen{}, run): {first:.1?}",
        explanation.graphs.len(),
        explanation.breaks.len(),
        if timer.is_some() { ", NVRTC or kernel cache" } else { "" }
    );
    for graph in &explanation.graphs {
        print_graph(&graph.to_text());
    }
    print_plan(&explanation)?;

    let eager_us = time_us(timer, &mut || ran((pair.dev.function)(&pair.dev.inputs)))?;
    let compiled_us = time_us(timer, &mut || ran(compiled.call(&pair.dev.inputs)))?;
    let (eager, compiled_label) = match timer {
        Some(_) => ("eager (one kernel per op)", "compiled"),
        None => ("eager (CPU reference interpreter)", "compiled (CPU plan executor)"),
    };
    println!(
        "time: {eager} {}, {compiled_label} {}: {:.2}x",
        fmt_us(eager_us),
        fmt_us(compiled_us),
        eager_us / compiled_us
    );

    let (host, dev) = pair.fresh_inputs(sizes.seed + 1000)?;
    let reference = (pair.host.function)(&host)?;
    let got = compiled.call(&dev)?;
    let check = check_outputs(&got, &reference)?;
    print!("fresh inputs: compiled vs CPU reference: {}", check.summary());
    if timer.is_some() {
        let eager = check_outputs(&(pair.dev.function)(&dev)?, &reference)?;
        print!("; eager on {device}: max abs error {:.3e}", eager.max_abs_error);
    }
    println!();
    if !check.passed() {
        bail!("{name}: compiled result out of tolerance ({})", check.first_mismatch.unwrap_or_default());
    }
    Ok(())
}

/// Kernels and launches per call, and each kernel's name and family.
fn print_plan(explanation: &Explanation) -> Result<()> {
    let na = |v: Option<usize>| v.map_or_else(|| "n/a".to_string(), |v| v.to_string());
    println!("plan: {} kernel(s), {} launch(es) per call", na(explanation.kernels), na(explanation.launches));
    for graph in &explanation.graphs {
        // The plan is the same on every device; fusing again on the CPU just to list it is cheap.
        let exe = backend::compile_fused(graph, Target { device: Device::Cpu, mode: Mode::Default })?;
        if let Some(plan) = exe.plan() {
            for (k, kernel) in plan.kernels.iter().enumerate() {
                println!("  kernel {k}: {} ({})", kernel.name, kernel.kind.family());
            }
        }
    }
    Ok(())
}

fn sync_demo(sizes: &Sizes, device: Device) -> Result<()> {
    let pair = Pair::build("sync_demo", sizes, device)?;
    println!("== {} on {device}: graph breaks ==", pair.dev.signature());
    println!("-- lenient: split at the breaks, results equal to eager --");
    let lenient = pair.dev.compile();
    print!("{}", lenient.explain(&pair.dev.inputs)?);
    let want = pair.host.eager()?;
    let check = check_outputs(&lenient.call(&pair.dev.inputs)?, &want)?;
    println!("compiled (split) vs CPU reference: {}", check.summary());

    // The same function on an input holding a NaN takes the other branch of its `if`.
    let mut with_nan = pair.host.inputs[0].to_vec::<f32>()?;
    with_nan[0] = f32::NAN;
    let host_nan = vec![Tensor::from_vec(with_nan, pair.host.inputs[0].shape())?, pair.host.inputs[1].clone()];
    let dev_nan = vec![host_nan[0].to_device(device)?, pair.dev.inputs[1].clone()];
    let got = lenient.call(&dev_nan)?;
    let check = check_outputs(&got, &(pair.host.function)(&host_nan)?)?;
    println!("input with a NaN (the other branch): {}", check.summary());

    println!("-- strict: fullgraph(true) stops at the first break --");
    let strict = pair.dev.compile().fullgraph(true);
    match strict.call(&pair.dev.inputs) {
        Ok(_) => bail!("sync_demo compiled in fullgraph mode without a break"),
        Err(e) => println!("error: {e}"),
    }
    Ok(())
}

/// A compiled call with 2,000 inputs: trace once, then check signatures and bind inputs per call.
fn multisum_call_cost(device: Device, timer: Option<&GpuTimer>) -> Result<()> {
    let sizes = Sizes { k: 2000, lo: 1, hi: 8, dtype: DType::F32, ..Sizes::default() };
    let pair = Pair::build("multisum", &sizes, device)?;
    let inputs = &pair.dev.inputs;
    println!("== multisum with K=2000 small tensors on {device}: the cost of a cached call ==");
    let compiled = pair.dev.compile().fullgraph(true);
    let start = Instant::now();
    let got = compiled.call(inputs)?;
    sync(timer)?;
    let first = start.elapsed();
    let cached = host_median(21, &mut || {
        drop(compiled.call(inputs)?);
        sync(timer)
    })?;
    let guard_runs = 1000;
    let start = Instant::now();
    for _ in 0..guard_runs {
        if !compiled.is_cached(inputs) {
            bail!("the signature fell out of the cache");
        }
    }
    let guard = start.elapsed() / guard_runs;
    let eager = host_median(3, &mut || {
        drop((pair.dev.function)(inputs)?);
        sync(timer)
    })?;
    println!("first call (trace + compile + run): {first:.2?}");
    println!("cached call (host clock, until done): {cached:.2?}, of which the signature check of all 2000 inputs: {guard:.2?}");
    println!("eager (2000 sums and a stack, op by op): {eager:.2?}");
    println!("compiled vs CPU reference: {}", check_outputs(&got, &pair.host.eager()?)?.summary());
    let stats = compiled.stats();
    println!("traces: {}, cache hits: {}", stats.traces, stats.cache_hits);
    Ok(())
}
