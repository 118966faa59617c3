//! Keeping the GPU busy, on the CPU backend: the pinned pool reuses its buffers, the prefetcher
//! yields batches in order and never one still being copied, device metrics are read without a
//! sync, and the timeline records host and device tracks (a valid Chrome trace) with every sync
//! named by its line, and summarizes GPU busy % and gaps.
//!
//! The timeline is process-wide and records every thread: each test holds `TIMELINE`, so no test
//! records another's work (this file is its own test binary).

use braze::timeline::{self, Span, Summary, Trace, Track};
use braze::{compile, sync_count, DType, Device, DeviceMetric, HostTensor, PinnedPool, Prefetcher, Result, Tensor};
use std::sync::{Mutex, MutexGuard};

static TIMELINE: Mutex<()> = Mutex::new(());

fn exclusive() -> MutexGuard<'static, ()> {
    TIMELINE.lock().unwrap_or_else(|p| p.into_inner())
}

fn recording() -> MutexGuard<'static, ()> {
    let guard = exclusive();
    timeline::start();
    guard
}

fn batch(index: u64) -> Vec<HostTensor> {
    vec![
        braze_cpu::random_tensor(DType::F32, [16, 8], 100 + index),
        braze_cpu::random_tensor(DType::BF16, [16], 200 + index),
    ]
}

#[test]
fn the_pool_reuses_buffers_given_back() -> Result<()> {
    let _exclusive = exclusive();
    let pool = PinnedPool::new(Device::Cpu)?;
    let a = pool.take(1000)?;
    let b = pool.take(3000)?;
    assert_eq!(pool.allocations(), 2);
    pool.give_back(a);
    pool.give_back(b);
    for _ in 0..10 {
        let mut small = pool.take(900)?;
        let large = pool.take(2500)?;
        assert_eq!((small.len(), large.len()), (900, 2500));
        small.as_mut_bytes()?.fill(7);
        pool.give_back(small);
        pool.give_back(large);
    }
    assert_eq!(pool.allocations(), 2, "every later take fits a buffer given back");
    let _bigger = pool.take(1 << 20)?;
    assert_eq!(pool.allocations(), 3, "a request no free buffer fits allocates");
    Ok(())
}

#[test]
fn the_prefetcher_yields_every_batch_in_order_and_whole() -> Result<()> {
    let _exclusive = exclusive();
    let batches = 24;
    let prefetcher = Prefetcher::new(Device::Cpu, (0..batches).map(batch))?;
    let pool = prefetcher.pool().clone();
    let mut seen = 0;
    for (index, tensors) in prefetcher.enumerate() {
        let tensors = tensors?;
        let expected = batch(index as u64);
        assert_eq!(tensors.len(), expected.len());
        for (got, want) in tensors.iter().zip(&expected) {
            assert_eq!((got.dtype(), got.shape()), (want.dtype(), want.shape().clone()));
            // A buffer still being copied into would show as a partly copied (or other) batch.
            assert_eq!(got.to_host()?.to_bytes(), want.to_bytes(), "batch {index}");
        }
        // Double-buffered: two tensors per batch, at most two batches staged at once.
        assert!(pool.allocations() <= 4, "{} pinned allocations by batch {index}", pool.allocations());
        seen += 1;
    }
    assert_eq!(seen, batches);
    Ok(())
}

/// A source that cycles over batches it prepared hands them out shared (an `Arc`): the prefetcher
/// reads them into pinned memory and leaves them as they were, for the next round.
#[test]
fn shared_batches_are_prefetched_and_left_unchanged() -> Result<()> {
    let _exclusive = exclusive();
    let prepared: Vec<std::sync::Arc<Vec<HostTensor>>> = (0..3).map(|i| std::sync::Arc::new(batch(i))).collect();
    let source = (0..9usize).map(|i| prepared[i % 3].clone());
    for (i, tensors) in Prefetcher::new(Device::Cpu, source)?.enumerate() {
        let tensors = tensors?;
        for (got, want) in tensors.iter().zip(batch(i as u64 % 3)) {
            assert_eq!(got.to_host()?.to_bytes(), want.to_bytes(), "batch {i}");
        }
    }
    for (i, shared) in prepared.iter().enumerate() {
        assert_eq!(std::sync::Arc::strong_count(shared), 1, "the prefetcher keeps no batch");
        assert_eq!(**shared, batch(i as u64));
    }
    Ok(())
}

/// Every dtype's bytes as the device stores them: little-endian, bool as one byte.
#[test]
fn host_bytes_are_little_endian_for_every_dtype() {
    let cases: [(DType, &[f64], &[u8]); 6] = [
        (DType::F32, &[1.0, -2.0], &[0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0]),
        (DType::F16, &[1.0, -2.0], &[0, 0x3c, 0, 0xc0]),
        (DType::BF16, &[1.0, -2.0], &[0x80, 0x3f, 0, 0xc0]),
        (DType::I32, &[1.0, -2.0], &[1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff]),
        (DType::I64, &[258.0], &[2, 1, 0, 0, 0, 0, 0, 0]),
        (DType::Bool, &[1.0, 0.0, 1.0], &[1, 0, 1]),
    ];
    for (dtype, values, bytes) in cases {
        let t = HostTensor::from_f64(dtype, [values.len()], values).unwrap();
        assert_eq!(t.byte_len(), bytes.len(), "{dtype}");
        assert_eq!(t.to_bytes(), bytes, "{dtype}");
        let mut out = vec![0xaa; bytes.len()];
        t.write_bytes(&mut out);
        assert_eq!(out, bytes, "{dtype}");
        assert_eq!(HostTensor::from_bytes(dtype, [values.len()], bytes).unwrap(), t, "{dtype}");
    }
}

#[test]
fn zero_size_tensors_are_prefetched() -> Result<()> {
    let _exclusive = exclusive();
    let source = (0..3u64).map(|i| vec![HostTensor::full(DType::F32, [0, 4], 0.0), batch(i).remove(1)]);
    for (i, tensors) in Prefetcher::new(Device::Cpu, source)?.enumerate() {
        let tensors = tensors?;
        assert_eq!(tensors[0].shape().dims(), &[0, 4]);
        assert_eq!(tensors[1].to_host()?.to_bytes(), batch(i as u64)[1].to_bytes());
    }
    Ok(())
}

#[test]
fn a_prefetched_batch_feeds_a_compiled_step() -> Result<()> {
    let _exclusive = exclusive();
    let step = compile(|a: &[Tensor]| Ok(vec![a[0].relu()?.sum_all()?])).fullgraph(true);
    let source = (0..4u64).map(|i| vec![braze_cpu::random_tensor(DType::F32, [32], i)]);
    for (i, tensors) in Prefetcher::new(Device::Cpu, source)?.enumerate() {
        let tensors = tensors?;
        let got = step.call(&tensors)?[0].item::<f32>()?;
        let want: f64 =
            braze_cpu::random_tensor(DType::F32, [32], i as u64).to_f64_vec().iter().map(|v| v.max(0.0)).sum();
        assert!((f64::from(got) - want).abs() <= 1e-4 * want.abs().max(1.0), "{got} vs {want}");
    }
    Ok(())
}

#[test]
fn a_source_error_comes_after_the_batches_before_it() -> Result<()> {
    let _exclusive = exclusive();
    let source: Vec<Result<Vec<HostTensor>>> = vec![
        Ok(batch(0)),
        Err(braze::Error::InvalidArgument { op: "loader".into(), loc: None, detail: "bad file".into() }),
        Ok(batch(2)),
    ];
    let mut prefetcher = Prefetcher::new(Device::Cpu, source)?;
    let first = prefetcher.next().expect("batch 0")?;
    assert_eq!(first[0].to_host()?.to_bytes(), batch(0)[0].to_bytes());
    let error = prefetcher.next().expect("the loader's error").expect_err("an error in batch 1's place");
    assert!(error.to_string().contains("bad file"), "{error}");
    assert!(prefetcher.next().is_none(), "nothing was in flight after the error");
    Ok(())
}

#[test]
fn device_metrics_are_read_without_syncs() -> Result<()> {
    let _exclusive = exclusive();
    let mut loss = DeviceMetric::new("loss", Device::Cpu).read_every(5);
    let before = sync_count();
    let mut sum = 0.0f64;
    let mut readings = Vec::new();
    for step in 0..20u64 {
        let value = Tensor::from_vec(vec![step as f32 * 0.5, 1.0], [2])?;
        sum += step as f64 * 0.5 + 1.0;
        loss.add(&value)?;
        if let Some(reading) = loss.poll()? {
            assert!((reading.sum - sum).abs() < 1e-4, "step {step}: {} vs {sum}", reading.sum);
            readings.push(reading.count);
        }
    }
    assert_eq!(sync_count(), before, "adding, requesting and polling read nothing on the host");
    assert_eq!(readings, vec![5, 10, 15, 20]);
    let last = loss.latest().expect("a reading");
    assert!((last.mean() - sum / 20.0).abs() < 1e-5);
    let on_gpu = Tensor::from_vec(vec![1.0f32], [1])?;
    let mut other = DeviceMetric::new("accuracy", Device::Cuda(0));
    let error = other.add(&on_gpu).expect_err("a tensor of another device");
    assert!(error.to_string().contains("DeviceMetric::add"), "{error}");
    Ok(())
}

fn spans<'a>(trace: &'a Trace, category: &str) -> Vec<&'a Span> {
    trace.spans.iter().filter(|s| s.category == category).collect()
}

#[test]
fn the_timeline_names_the_line_of_every_sync_of_a_loop() -> Result<()> {
    let _recording = recording();
    let mut w = Tensor::randn([8], DType::F32, 1)?;
    let mut lines = Vec::new();
    for step in 0..3u64 {
        let _step = timeline::step(step);
        w = w.mul_scalar(0.9)?;
        lines.push(line!() + 1);
        let loss = w.mul(&w)?.sum_all()?.item::<f32>()?;
        lines.push(line!() + 1);
        if w.any_nan()?.to_bool()? {
            break;
        }
        assert!(loss.is_finite());
    }
    let trace = timeline::stop()?;
    let syncs = spans(&trace, "sync");
    let found: Vec<u32> = syncs
        .iter()
        .map(|s| {
            let detail = s.detail.as_deref().unwrap_or("");
            assert!(detail.contains("busy.rs:"), "{detail}");
            detail.split(':').nth(1).and_then(|l| l.parse().ok()).unwrap_or(0)
        })
        .collect();
    assert_eq!(found, lines, "one sync span per read, in order, naming its line");
    assert_eq!(syncs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>()[..2], ["sync `item`", "sync `to_bool`"]);
    assert_eq!(spans(&trace, "step").len(), 3);
    assert!(
        trace.spans.iter().any(|s| s.track == Track::Compute && s.category == "eager"),
        "eager ops on the device track"
    );
    Ok(())
}

#[test]
fn the_trace_is_chrome_trace_json_with_host_and_device_tracks() -> Result<()> {
    let _recording = recording();
    let block = compile(|a: &[Tensor]| Ok(vec![a[0].layer_norm(&a[1], &a[2], 1e-5)?.relu()?.add(&a[0])?]))
        .name("block")
        .fullgraph(true);
    let x = Tensor::randn([16, 32], DType::F32, 0)?;
    let g = Tensor::ones([32], DType::F32, Device::Cpu)?;
    let b = Tensor::zeros([32], DType::F32, Device::Cpu)?;
    for step in 0..3 {
        let _step = timeline::step(step);
        block.call(&[x.clone(), g.clone(), b.clone()])?;
    }
    let trace = timeline::stop()?;
    assert_eq!(spans(&trace, "call").len(), 3);
    assert_eq!(spans(&trace, "trace").len(), 1, "traced once");
    assert_eq!(spans(&trace, "compile").len(), 1);
    let kernels: Vec<&Span> = trace.spans.iter().filter(|s| s.track == Track::Compute).collect();
    assert!(kernels.len() >= 3, "a kernel span per kernel per call: {kernels:?}");
    let calls = spans(&trace, "call");
    for kernel in &kernels {
        assert!(
            calls.iter().any(|c| c.start_us <= kernel.start_us && kernel.end_us() <= c.end_us() + 1.0),
            "the CPU backend's kernel {} runs inside a call on the same clock",
            kernel.name
        );
    }

    let json: serde_json::Value = serde_json::from_str(&trace.to_json()).expect("valid JSON");
    let events = json["traceEvents"].as_array().expect("a traceEvents array");
    let complete: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(complete.len(), trace.spans.len());
    for e in &complete {
        assert!(e["name"].is_string() && e["cat"].is_string(), "{e}");
        assert!(e["ts"].as_f64().is_some_and(|t| t >= 0.0) && e["dur"].as_f64().is_some_and(|d| d >= 0.0), "{e}");
        assert!(e["pid"].is_u64() && e["tid"].is_u64(), "{e}");
    }
    let process = |pid: u64| {
        events
            .iter()
            .find(|e| e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == pid)
            .map(|e| e["args"]["name"].as_str().unwrap_or("").to_string())
    };
    assert_eq!(process(1).as_deref(), Some("host"));
    assert_eq!(process(2).as_deref(), Some("device"));
    assert!(complete.iter().any(|e| e["pid"] == 1) && complete.iter().any(|e| e["pid"] == 2));
    let back = Trace::from_json(&trace.to_json())?;
    assert_eq!(back.spans.len(), trace.spans.len());
    for (read, written) in back.spans.iter().zip(&trace.spans) {
        assert_eq!(
            (&read.name, &read.category, read.track, &read.detail),
            (&written.name, &written.category, written.track, &written.detail)
        );
        assert!((read.start_us - written.start_us).abs() < 1e-6 && (read.dur_us - written.dur_us).abs() < 1e-6);
    }
    Ok(())
}

#[test]
fn prefetch_copies_run_on_the_copy_track_beside_the_steps() -> Result<()> {
    let _recording = recording();
    let step = compile(|a: &[Tensor]| Ok(vec![a[0].exp()?.sum_all()?])).fullgraph(true);
    for (i, tensors) in Prefetcher::new(Device::Cpu, (0..5).map(batch))?.enumerate() {
        let _step = timeline::step(i as u64);
        step.call(&tensors?[..1])?;
    }
    let trace = timeline::stop()?;
    let copies: Vec<&Span> = trace.spans.iter().filter(|s| s.track == Track::Copy).collect();
    assert_eq!(copies.len(), 10, "two tensors a batch");
    assert_eq!(copies[0].name, "copy batch 0 tensor 0");
    assert_eq!(spans(&trace, "copy").iter().filter(|s| matches!(s.track, Track::Host(_))).count(), 5, "staging spans");
    Ok(())
}

/// A span of `dur` µs at `start` on `track`.
fn span(name: &str, category: &str, track: Track, start: f64, dur: f64) -> Span {
    Span { name: name.into(), category: category.into(), track, start_us: start, dur_us: dur, detail: None }
}

#[test]
fn the_summary_measures_busy_time_and_names_the_host_work_in_each_gap() {
    let host = Track::Host(1);
    let mut sync = span("sync `item`", "sync", host, 45.0, 20.0);
    sync.detail = Some("src/main.rs:12:5".into());
    let trace = Trace {
        spans: vec![
            span("step 0", "step", host, 0.0, 50.0),
            span("step 1", "step", host, 50.0, 50.0),
            span("k0", "pointwise", Track::Compute, 0.0, 30.0),
            span("k1", "row", Track::Compute, 20.0, 20.0), // overlaps k0: counted once
            span("k2", "pointwise", Track::Compute, 70.0, 20.0),
            span("k3", "matmul", Track::Compute, 95.0, 20.0), // runs past the last step
            span("c0", "copy", Track::Copy, 10.0, 5.0),
            sync,
            span("call step", "call", host, 40.0, 40.0),
        ],
    };
    let summary = Summary::of(&trace);
    assert_eq!(summary.steps, 2);
    assert_eq!(summary.window_us, 100.0);
    assert_eq!(summary.busy_us, 40.0 + 20.0 + 5.0);
    assert_eq!(summary.copy_us, 5.0);
    assert!((summary.busy_percent() - 65.0).abs() < 1e-9);
    let gaps: Vec<(f64, f64)> = summary.gaps.iter().map(|g| (g.start_us, g.dur_us)).collect();
    assert_eq!(gaps, vec![(40.0, 30.0), (90.0, 5.0)]);
    assert_eq!(summary.gaps[0].host, vec!["sync `item` (src/main.rs:12:5)".to_string(), "call step".to_string()]);
    let text = summary.to_string();
    assert!(text.starts_with("GPU busy: 65.0% of 0.100 ms over 2 steps"), "{text}");
    assert!(text.contains("0.030 ms at +0.040 ms: host in sync `item` (src/main.rs:12:5); call step"), "{text}");
    assert_eq!(Summary::of(&Trace::default()).busy_percent(), 0.0);
}

#[test]
fn stopping_without_a_recording_is_an_error() {
    let _exclusive = exclusive();
    let error = timeline::stop().expect_err("nothing recorded");
    assert!(error.to_string().contains("timeline::start"), "{error}");
}

#[test]
fn explain_counts_the_syncs_of_one_step() -> Result<()> {
    let _exclusive = exclusive();
    let step = compile(|a: &[Tensor]| {
        let loss = a[0].mul(&a[0])?.mean_all()?;
        let scale = if loss.item::<f32>()? > 1.0 { 0.5 } else { 1.0 };
        if a[0].any_nan()?.to_bool()? {
            return Ok(vec![loss]);
        }
        Ok(vec![loss.mul_scalar(scale)?])
    });
    let x = Tensor::randn([4, 4], DType::F32, 3)?;
    let explanation = step.explain(std::slice::from_ref(&x))?;
    assert_eq!(explanation.host_syncs, 2);
    assert!(explanation.to_string().contains("host syncs: 2 per step"), "{explanation}");
    let strict = compile(|a: &[Tensor]| Ok(vec![a[0].mul(&a[0])?.mean_all()?])).fullgraph(true);
    assert_eq!(strict.explain(&[x])?.host_syncs, 0);
    Ok(())
}

#[test]
fn a_snapshot_keeps_the_recording_going() -> Result<()> {
    let _recording = recording();
    let x = Tensor::randn([4], DType::F32, 0)?;
    x.exp()?;
    let middle = timeline::now_us().expect("recording");
    x.relu()?;
    let so_far = timeline::snapshot()?.expect("recording");
    assert!(timeline::is_recording());
    let eager = |t: &Trace| t.spans.iter().filter(|s| s.category == "eager" && s.track == Track::Compute).count();
    assert_eq!(eager(&so_far), 2);
    assert_eq!(eager(&so_far.since(middle)), 1, "only the op after the mark");
    x.neg()?;
    assert_eq!(eager(&timeline::stop()?), 3);
    assert_eq!(timeline::now_us(), None);
    Ok(())
}
