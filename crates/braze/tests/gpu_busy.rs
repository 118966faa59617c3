//! Keeping the GPU busy, on a GPU: the pinned pool reuses page-locked buffers, the prefetcher's
//! batches arrive whole and in order through the copy stream and feed a compiled step, device
//! metrics arrive without a sync, and the timeline's GPU spans (kernels, graph replays, copies)
//! lie on the host clock inside the calls that enqueued them. Skips without a GPU (fails instead
//! when `BRAZE_REQUIRE_CUDA=1`).
//!
//! The timeline is process-wide: every test holds `TIMELINE` (this file is its own test binary).

mod common;

use braze::timeline::{self, Span, Track};
use braze::{
    compile, sync_count, DType, Device, DeviceMetric, HostTensor, Mode, PinnedPool, Prefetcher, Result, Tensor,
};
use common::gpu;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

static TIMELINE: Mutex<()> = Mutex::new(());

/// A log writer appending to a shared buffer.
struct CapturedLog(std::sync::Arc<Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLog {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn exclusive() -> MutexGuard<'static, ()> {
    TIMELINE.lock().unwrap_or_else(|p| p.into_inner())
}

fn batch(index: u64) -> Vec<HostTensor> {
    vec![
        braze_cpu::random_tensor(DType::F32, [256, 512], 100 + index),
        braze_cpu::random_tensor(DType::BF16, [1000], 200 + index),
        HostTensor::full(DType::F32, [0, 4], 0.0),
    ]
}

#[test]
fn the_pinned_pool_reuses_page_locked_buffers() -> Result<()> {
    let Some(device) = gpu() else { return Ok(()) };
    let _exclusive = exclusive();
    let pool = PinnedPool::new(device)?;
    let mut a = pool.take(1 << 20)?;
    a.as_mut_bytes()?.fill(3);
    let b = pool.take(100)?;
    assert_eq!(pool.allocations(), 2);
    pool.give_back(a);
    pool.give_back(b);
    for _ in 0..8 {
        let x = pool.take(1 << 19)?;
        let y = pool.take(64)?;
        pool.give_back(x);
        pool.give_back(y);
    }
    assert_eq!(pool.allocations(), 2);
    Ok(())
}

#[test]
fn prefetched_batches_arrive_whole_in_order_and_feed_a_compiled_step() -> Result<()> {
    let Some(device) = gpu() else { return Ok(()) };
    let _exclusive = exclusive();
    let step = compile(|a: &[Tensor]| Ok(vec![a[0].mul_scalar(2.0)?.sum(&[1], false)?])).fullgraph(true);
    let batches = 16;
    let prefetcher = Prefetcher::new(device, (0..batches).map(batch))?;
    let pool = prefetcher.pool().clone();
    let mut seen = 0;
    for (index, tensors) in prefetcher.enumerate() {
        let tensors = tensors?;
        let want = batch(index as u64);
        for (got, want) in tensors.iter().zip(&want) {
            assert_eq!(got.device(), device);
            assert_eq!(got.to_host()?.to_bytes(), want.to_bytes(), "batch {index}: a whole copy");
        }
        // The step reads the prefetched tensor where it is.
        let sums = step.call(&tensors[..1])?[0].to_host()?;
        let x = want[0].to_f64_vec();
        for (row, got) in sums.to_f64_vec().iter().enumerate() {
            let exact: f64 = x[row * 512..(row + 1) * 512].iter().map(|v| 2.0 * v).sum();
            assert!((got - exact).abs() <= 1e-4 * exact.abs().max(1.0), "batch {index} row {row}: {got} vs {exact}");
        }
        assert!(pool.allocations() <= 6, "double-buffered: {} pinned allocations", pool.allocations());
        seen += 1;
    }
    assert_eq!(seen, batches);
    Ok(())
}

#[test]
fn device_metrics_arrive_without_a_sync() -> Result<()> {
    let Some(device) = gpu() else { return Ok(()) };
    let _exclusive = exclusive();
    let mut metric = DeviceMetric::new("loss", device).read_every(10);
    let mut want = 0.0f64;
    let values: Vec<Tensor> = (0..30)
        .map(|i| Tensor::from_vec(vec![i as f32 * 0.25, -1.0], [2]).and_then(|t| t.to_device(device)))
        .collect::<Result<_>>()?;
    let before = sync_count();
    for (i, value) in values.iter().enumerate() {
        want += i as f64 * 0.25 - 1.0;
        metric.add(value)?;
        metric.poll()?;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric.latest().is_none_or(|r| r.count < 30) {
        assert!(Instant::now() < deadline, "the reading of step 30 never arrived");
        metric.poll()?;
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(sync_count(), before, "no host sync");
    let reading = metric.latest().expect("arrived");
    assert!((reading.sum - want).abs() < 1e-3, "{} vs {want}", reading.sum);
    Ok(())
}

/// An optimizer's count of skipped steps (a device scalar) read through a metric: it arrives
/// without a host sync, and says how many steps a NaN gradient skipped.
#[test]
fn skipped_steps_are_read_without_a_sync() -> Result<()> {
    let Some(device) = gpu() else { return Ok(()) };
    let _exclusive = exclusive();
    let w = Tensor::randn([6], DType::F32, 5)?.to_device(device)?;
    w.set_requires_grad(true)?;
    let opt = std::sync::Arc::new(braze::optim::AdamW::new(std::slice::from_ref(&w), 1e-2)?);
    let (inner, wc) = (opt.clone(), w.clone());
    let step = compile(move |a: &[Tensor]| {
        use braze::optim::Optimizer;
        inner.zero_grad();
        wc.mul(&a[0])?.sum_all()?.backward()?;
        inner.step()?;
        Ok(vec![])
    })
    .fullgraph(true);
    let finite = Tensor::ones([6], DType::F32, device)?;
    let poisoned = Tensor::from_vec(vec![1.0f32, f32::NAN, 0.0, 1.0, 2.0, 3.0], [6])?.to_device(device)?;
    let mut skipped = DeviceMetric::new("skipped steps", device);
    step.call(std::slice::from_ref(&finite))?;
    let before = sync_count();
    for batch in [&poisoned, &finite, &poisoned] {
        step.call(std::slice::from_ref(batch))?;
    }
    use braze::optim::Optimizer;
    skipped.set(opt.skipped_steps())?;
    skipped.request()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while skipped.latest().is_none() {
        assert!(Instant::now() < deadline, "the reading never arrived");
        skipped.poll()?;
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(sync_count(), before, "no host sync");
    assert_eq!(skipped.latest().map(|r| r.sum), Some(2.0), "two steps skipped");
    Ok(())
}

#[test]
fn gpu_spans_lie_inside_the_calls_that_enqueued_them() -> Result<()> {
    let Some(device) = gpu() else { return Ok(()) };
    let _exclusive = exclusive();
    let f = |a: &[Tensor]| Ok(vec![a[0].layer_norm(&a[1], &a[2], 1e-5)?.relu()?.matmul(&a[3])?]);
    let x = Tensor::randn([512, 256], DType::F32, 0)?.to_device(device)?;
    let g = Tensor::ones([256], DType::F32, device)?;
    let b = Tensor::zeros([256], DType::F32, device)?;
    let w = Tensor::randn([256, 128], DType::F32, 1)?.to_device(device)?;
    let args = [x, g, b, w];
    let direct = compile(f).fullgraph(true).name("direct");
    let graphs = compile(f).fullgraph(true).mode(Mode::ReduceOverhead).name("graphs");
    direct.call(&args)?;
    for _ in 0..3 {
        graphs.call(&args)?;
    }
    timeline::start();
    for step in 0..3 {
        let _step = timeline::step(step);
        direct.call(&args)?;
        graphs.call(&args)?;
    }
    for batch in Prefetcher::new(device, (0..3).map(batch))? {
        batch?;
    }
    let trace = timeline::stop()?;
    let on = |track: Track| -> Vec<&Span> { trace.spans.iter().filter(|s| s.track == track).collect() };
    let compute = on(Track::Compute);
    let kernels: Vec<&&Span> = compute.iter().filter(|s| s.category != "graph").collect();
    let replays: Vec<&&Span> = compute.iter().filter(|s| s.category == "graph").collect();
    assert!(kernels.len() >= 6, "each kernel of each direct call: {compute:?}");
    assert_eq!(replays.len(), 3, "one span per graph replay: {compute:?}");
    assert!(replays[0].name.starts_with("graph replay"));
    assert!(kernels.iter().any(|s| s.category == "matmul"), "the cuBLASLt call is a span");
    assert!(kernels.iter().chain(&replays).all(|s| s.dur_us > 0.0), "GPU work takes time: {compute:?}");
    assert_eq!(on(Track::Copy).len(), 9, "three prefetched tensors a batch (one of zero size)");
    let first_call =
        trace.spans.iter().filter(|s| s.category == "call").map(|s| s.start_us).fold(f64::INFINITY, f64::min);
    let last_host =
        trace.spans.iter().filter(|s| matches!(s.track, Track::Host(_))).map(Span::end_us).fold(0.0, f64::max);
    for span in compute.iter().chain(on(Track::Copy).iter()) {
        // A zero-byte copy may take no measurable time; nothing takes a second.
        assert!(span.dur_us >= 0.0 && span.dur_us < 1e6, "{span:?}");
        // GPU work starts after the host enqueued it (the clocks agree within the anchor's
        // uncertainty, a few microseconds) and before the recording stopped.
        assert!(span.start_us >= first_call - 50.0, "{span:?} before the first call at {first_call}");
        assert!(span.start_us <= last_host + 1e5, "{span:?}");
    }
    Ok(())
}

#[test]
fn a_pageable_upload_is_counted() -> Result<()> {
    let Some(device) = gpu() else { return Ok(()) };
    let _exclusive = exclusive();
    let before = braze::pageable_copy_count();
    // What `BRAZE_LOG=syncs` shows, captured by a subscriber of this thread's.
    let log = std::sync::Arc::new(Mutex::new(Vec::<u8>::new()));
    let sink = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || CapturedLog(sink.clone()))
        .finish();
    let (uploaded, line) = tracing::subscriber::with_default(subscriber, || {
        (Tensor::randn([64], DType::F32, 0).and_then(|t| t.to_device(device)), line!())
    });
    let _x = uploaded?;
    assert_eq!(braze::pageable_copy_count(), before + 1);
    let text = String::from_utf8_lossy(&log.lock().unwrap()).to_string();
    let want = format!("pageable host-to-device copy of 256 B at {}:{line}:", file!());
    assert!(text.contains(&want), "`{want}` not in the log:\n{text}");
    let _same = Tensor::randn([64], DType::F32, 0)?.to_device(Device::Cpu)?;
    assert_eq!(braze::pageable_copy_count(), before + 1, "no copy to the device");
    Ok(())
}

/// Inputs alternating between two buffers (a double-buffered prefetcher's batches) replay as
/// CUDA graphs too: each buffer set's graph is captured when it comes back, and every call
/// computes on the buffers it was given.
#[test]
fn gpu_alternating_input_buffers_replay_as_graphs() -> Result<()> {
    let Some(device) = gpu() else { return Ok(()) };
    let _exclusive = exclusive();
    let f = |a: &[Tensor]| Ok(vec![a[0].mul_scalar(2.0)?.add(&a[1])?]);
    let xs = [
        Tensor::randn([256, 256], DType::F32, 0)?.to_device(device)?,
        Tensor::randn([256, 256], DType::F32, 1)?.to_device(device)?,
    ];
    let y = Tensor::randn([256, 256], DType::F32, 2)?.to_device(device)?;
    let want: Vec<Vec<f32>> = xs.iter().map(|x| x.mul_scalar(2.0)?.add(&y)?.to_vec::<f32>()).collect::<Result<_>>()?;
    let graphs = compile(f).fullgraph(true).mode(Mode::ReduceOverhead).name("alternating");
    timeline::start();
    for step in 0..8 {
        let out = graphs.call(&[xs[step % 2].clone(), y.clone()])?;
        assert_eq!(out[0].to_vec::<f32>()?, want[step % 2], "step {step}");
    }
    let trace = timeline::stop()?;
    let graph_spans = trace.spans.iter().filter(|s| s.track == Track::Compute && s.category == "graph").count();
    // Calls 0 and 1 launch directly; 2 and 3 capture and replay; 4..7 replay.
    assert_eq!(graph_spans, 6, "{:?}", trace.spans);
    Ok(())
}

/// Staging the next batch never waits for the queued steps: a pinned buffer whose copy is ordered
/// after them is not taken back while the pool may pin another, so the host enqueues a loop's
/// steps far ahead of the GPU (a prefetcher that waited would drain the queue every step).
#[test]
fn prefetching_never_waits_for_the_queued_steps() -> Result<()> {
    let Some(device) = gpu() else { return Ok(()) };
    let _exclusive = exclusive();
    let slow = compile(|a: &[Tensor]| {
        let mut w = a[2].clone();
        // A few long kernels: the stream's queue of pending launches (about a thousand) must
        // not be what stops the host.
        for _ in 0..4 {
            w = w.matmul(&a[2])?.mul_scalar(0.01)?;
        }
        Ok(vec![w, a[0].mul_scalar(2.0)?, a[1].sum(&[0], false)?])
    })
    .fullgraph(true)
    .name("slow_step");
    let w = Tensor::randn([4096, 4096], DType::F32, 7)?.to_device(device)?;
    let two = |index: u64| {
        vec![
            braze_cpu::random_tensor(DType::F32, [256, 512], 300 + index),
            braze_cpu::random_tensor(DType::F32, [512, 64], 400 + index),
        ]
    };
    // One step alone, compiled and warm, timed to its end.
    let warm: Vec<Tensor> =
        two(0).into_iter().map(|h| Tensor::from_host(h).to_device(device)).collect::<Result<_>>()?;
    slow.call(&[warm[0].clone(), warm[1].clone(), w.clone()])?[0].to_host()?;
    let started = Instant::now();
    slow.call(&[warm[0].clone(), warm[1].clone(), w.clone()])?[0].to_host()?;
    let one_step = started.elapsed();

    // A first pass pins the pool's buffers (pinning takes milliseconds each): the loop that is
    // timed reuses them, as every loop after its first steps does.
    let steps = 10;
    // Made before the loops: making random tensors takes the host about as long as a step.
    let batches: Vec<std::sync::Arc<Vec<HostTensor>>> = (0..steps).map(|i| std::sync::Arc::new(two(i))).collect();
    let pool = std::sync::Arc::new(PinnedPool::new(device)?);
    for batch in Prefetcher::with_pool(pool.clone(), batches.clone())? {
        slow.call(&[batch?[0].clone(), warm[1].clone(), w.clone()])?;
    }
    slow.call(&[warm[0].clone(), warm[1].clone(), w.clone()])?[0].to_host()?;
    let started = Instant::now();
    let mut last = None;
    // Host milliseconds of each step: getting the batch, then enqueueing the step.
    let mut host_ms: Vec<(f64, f64)> = Vec::new();
    let mut prefetcher = Prefetcher::with_pool(pool, batches.clone())?;
    loop {
        let asked = Instant::now();
        let Some(batch) = prefetcher.next() else { break };
        let batch = batch?;
        let got = Instant::now();
        last = Some(slow.call(&[batch[0].clone(), batch[1].clone(), w.clone()])?);
        host_ms.push(((got - asked).as_secs_f64() * 1e3, got.elapsed().as_secs_f64() * 1e3));
    }
    let enqueued = started.elapsed();
    let out = last.expect("ten steps");
    let want = batches[steps as usize - 1][0].to_f64_vec();
    let doubled = out[1].to_host()?.to_f64_vec();
    assert!(doubled.iter().zip(&want).all(|(g, w)| (g - 2.0 * w).abs() <= 1e-6 * w.abs().max(1.0)), "the last batch");
    let finished = started.elapsed();
    assert!(
        enqueued.as_secs_f64() < 0.5 * finished.as_secs_f64(),
        "the host enqueued {steps} steps of {one_step:?} each in {enqueued:?}; the GPU finished them in \
         {finished:?}; host ms per step (batch, enqueue): {host_ms:.2?}"
    );
    Ok(())
}

/// A loop's batches land in the same few device buffers once the step is done with them, so a
/// step replayed as a CUDA graph finds graphs for their addresses after its first steps instead
/// of capturing one for each new address (a capture of a large step takes milliseconds).
#[test]
fn prefetched_batches_land_at_a_few_addresses_and_replay_as_graphs() -> Result<()> {
    let Some(device) = gpu() else { return Ok(()) };
    let _exclusive = exclusive();
    let steps = 24u64;
    let batches: Vec<std::sync::Arc<Vec<HostTensor>>> = (0..steps).map(|i| std::sync::Arc::new(batch(i))).collect();
    let step =
        compile(|a: &[Tensor]| Ok(vec![a[0].mul_scalar(2.0)?.sum(&[1], false)?, a[1].cast(DType::F32)?.sum_all()?]))
            .fullgraph(true)
            .mode(Mode::ReduceOverhead)
            .name("landing");
    let mut addresses = std::collections::BTreeSet::new();
    timeline::start();
    for (index, tensors) in Prefetcher::new(device, batches.clone())?.enumerate() {
        let tensors = tensors?;
        addresses.insert((tensors[0].data_ptr(), tensors[1].data_ptr()));
        let out = step.call(&tensors[..2])?;
        if index as u64 == steps - 1 {
            let want: f64 = batches[index][0].to_f64_vec()[..512].iter().map(|v| 2.0 * v).sum();
            let got = out[0].to_host()?.get_f64(0);
            assert!((got - want).abs() <= 1e-3 * want.abs().max(1.0), "the last batch: {got} vs {want}");
        }
    }
    let trace = timeline::stop()?;
    assert!(addresses.len() <= 4, "{} address sets over {steps} batches", addresses.len());
    let replays = trace.spans.iter().filter(|s| s.track == Track::Compute && s.category == "graph").count();
    assert!(replays as u64 >= steps - 2 * addresses.len() as u64, "{replays} replays of {steps} steps");
    Ok(())
}
