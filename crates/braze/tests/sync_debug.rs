//! The sync debug mode names the line of every host synchronization of an eager training loop
//! (warn), refuses the first one with an error naming it (error), and says nothing when off;
//! a fullgraph compiled step has no syncs in any mode.
//!
//! The mode is process-wide, so every test here holds `MODE_LOCK` while it sets one (this file is
//! its own test binary: no other test sees these modes).

use braze::{
    compile, no_grad, set_sync_debug_mode, sync_count, sync_debug_mode, BreakKind, CustomOp, DType, Device, Error,
    HostTensor, Result, SyncDebugMode, Tensor,
};
use std::sync::{Arc, Mutex, MutexGuard};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

static MODE_LOCK: Mutex<()> = Mutex::new(());

/// Holds the mode lock with `mode` set, and turns the mode off when dropped.
struct ModeGuard(#[allow(dead_code)] MutexGuard<'static, ()>);

impl Drop for ModeGuard {
    fn drop(&mut self) {
        set_sync_debug_mode(SyncDebugMode::Off);
    }
}

fn with_mode(mode: SyncDebugMode) -> ModeGuard {
    let guard = ModeGuard(MODE_LOCK.lock().unwrap_or_else(|p| p.into_inner()));
    set_sync_debug_mode(mode);
    assert_eq!(sync_debug_mode(), mode);
    guard
}

/// One warning on `braze::syncs`: its `op` and `location` fields and its message.
#[derive(Clone, Debug, Default)]
struct SyncWarning {
    op: String,
    location: String,
    message: String,
}

impl Visit for SyncWarning {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "op" {
            self.op = value.to_string();
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "op" => self.op = format!("{value:?}").trim_matches('"').to_string(),
            "location" => self.location = format!("{value:?}"),
            "message" => self.message = format!("{value:?}"),
            _ => {}
        }
    }
}

/// Collects the `braze::syncs` warnings of this thread.
struct Capture(Arc<Mutex<Vec<SyncWarning>>>);

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        if meta.target() == "braze::syncs" && *meta.level() == tracing::Level::WARN {
            let mut warning = SyncWarning::default();
            event.record(&mut warning);
            self.0.lock().unwrap().push(warning);
        }
    }
}

/// Runs `f` with the `braze::syncs` warnings of this thread captured.
fn capture_warnings<R>(f: impl FnOnce() -> R) -> (R, Vec<SyncWarning>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Capture(seen.clone()));
    let result = tracing::subscriber::with_default(subscriber, f);
    let warnings = seen.lock().unwrap().clone();
    (result, warnings)
}

/// The source lines of the loop's two syncs, written by the loop as it reaches them.
#[derive(Default, Debug)]
struct SyncLines {
    item: u32,
    nan_check: u32,
}

/// Writes `line` (the caller's `line!()`, on the line of the op) to `slot` and passes `result` on.
fn at<T>(slot: &mut u32, line: u32, result: T) -> T {
    *slot = line;
    result
}

/// An eager training loop: a linear model fit by SGD, the loss read with `item` every step and
/// an "is the loss NaN" check. Two host syncs a step, nothing else.
fn train(steps: usize, lines: &mut SyncLines) -> Result<Vec<f32>> {
    let w = Tensor::randn([4, 1], DType::F32, 0)?;
    w.set_requires_grad(true)?;
    let x = Tensor::randn([8, 4], DType::F32, 1)?;
    let y = Tensor::randn([8, 1], DType::F32, 2)?;
    let mut losses = Vec::new();
    for _ in 0..steps {
        let err = x.matmul(&w)?.sub(&y)?;
        let loss = err.mul(&err)?.mean_all()?;
        loss.backward()?;
        let grad = w.grad().expect("w has a gradient after backward");
        no_grad(|| w.assign(&w.sub(&grad.mul_scalar(0.1)?)?))?;
        w.zero_grad();
        losses.push(at(&mut lines.item, line!(), loss.item::<f32>())?);
        if at(&mut lines.nan_check, line!(), loss.any_nan()?.to_bool())? {
            break;
        }
    }
    Ok(losses)
}

const STEPS: usize = 3;

#[test]
fn warn_mode_names_the_line_of_every_sync_in_a_training_loop() {
    let _mode = with_mode(SyncDebugMode::Warn);
    let mut lines = SyncLines::default();
    let before = sync_count();
    let (losses, warnings) = capture_warnings(|| train(STEPS, &mut lines));
    let losses = losses.expect("warn mode only warns");
    assert_eq!(losses.len(), STEPS);
    assert!(losses[STEPS - 1] < losses[0], "the loop trains: {losses:?}");
    assert_eq!(sync_count() - before, 2 * STEPS as u64, "two syncs a step");

    assert!(lines.item > 0 && lines.nan_check == lines.item + 1, "{lines:?}");
    let expected: Vec<(&str, u32)> =
        (0..STEPS).flat_map(|_| [("item", lines.item), ("to_bool", lines.nan_check)]).collect();
    let found: Vec<(&str, u32)> = warnings
        .iter()
        .map(|w| {
            let (file, line_col) = w.location.split_once(':').expect("location is file:line:col");
            assert!(file.ends_with("tests/sync_debug.rs"), "{}", w.location);
            let line = line_col.split(':').next().unwrap().parse().expect("a line number");
            assert!(w.message.contains(&format!("`{}` at {}", w.op, w.location)), "{}", w.message);
            (w.op.as_str(), line)
        })
        .collect();
    assert_eq!(found, expected);
    assert!(warnings[0].message.contains(BreakKind::HostRead.hint()), "{}", warnings[0].message);
}

#[test]
fn error_mode_refuses_the_first_sync_naming_op_and_line() {
    let _mode = with_mode(SyncDebugMode::Error);
    let mut lines = SyncLines::default();
    let before = sync_count();
    match train(STEPS, &mut lines) {
        Err(Error::HostSync { kind, op, loc, hint }) => {
            assert_eq!((kind, op.as_str(), loc.line), (BreakKind::HostRead, "item", lines.item));
            assert!(loc.file.ends_with("tests/sync_debug.rs"), "{}", loc.file);
            assert_eq!(hint, BreakKind::HostRead.hint());
            let message = Error::HostSync { kind, op, loc: loc.clone(), hint }.to_string();
            assert!(message.contains(&format!("`item` at {loc}")), "{message}");
            assert!(message.contains("sync debug mode `error`"), "{message}");
        }
        other => panic!("expected a host sync error, got {other:?}"),
    }
    assert_eq!(sync_count(), before, "a refused sync did not happen");
}

#[test]
fn off_mode_warns_of_nothing_and_still_counts() {
    let _mode = with_mode(SyncDebugMode::Off);
    let mut lines = SyncLines::default();
    let before = sync_count();
    let (losses, warnings) = capture_warnings(|| train(STEPS, &mut lines));
    assert_eq!(losses.expect("off mode").len(), STEPS);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(sync_count() - before, 2 * STEPS as u64);
}

/// Every eager host read is a sync in error mode, with its own op name and the caller's line.
#[test]
fn every_host_read_is_a_sync() {
    let _mode = with_mode(SyncDebugMode::Error);
    let x = Tensor::from_vec(vec![1.0f32, 0.0, 2.0], [3]).unwrap();
    let one = Tensor::scalar(1.0f32);
    let host_op = CustomOp::host("identity_on_host", |inputs: &[HostTensor]| Ok(inputs.to_vec()));
    let mut line = 0;
    let refused: Vec<(&str, Result<()>)> = vec![
        ("to_vec", at(&mut line, line!(), x.to_vec::<f32>().map(drop))),
        ("item", at(&mut line, line!(), one.item::<f32>().map(drop))),
        ("to_bool", at(&mut line, line!(), one.to_bool().map(drop))),
        ("to_host", at(&mut line, line!(), x.to_host().map(drop))),
        ("to_device", at(&mut line, line!(), x.to_device(Device::Cpu).map(drop))),
        ("nonzero", at(&mut line, line!(), x.nonzero().map(drop))),
        ("identity_on_host", at(&mut line, line!(), host_op.call(std::slice::from_ref(&x)).map(drop))),
    ];
    let first_line = line + 1 - refused.len() as u32;
    for (i, (name, result)) in refused.into_iter().enumerate() {
        match result {
            Err(Error::HostSync { op, loc, .. }) => assert_eq!((op.as_str(), loc.line), (name, first_line + i as u32)),
            other => panic!("{name}: expected a host sync error, got {other:?}"),
        }
    }
    // Ops that stay on the device are no syncs; an invalid read fails as before, not as a sync.
    x.mul_scalar(2.0).unwrap().sum_all().unwrap();
    assert!(matches!(x.item::<f32>(), Err(Error::InvalidArgument { .. })));
}

fn fullgraph_step(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let err = a[1].matmul(&a[0])?.sub(&a[2])?;
    Ok(vec![err.mul(&err)?.mean_all()?])
}

#[test]
fn a_fullgraph_compiled_step_has_no_syncs() {
    let _mode = with_mode(SyncDebugMode::Error);
    let inputs = [
        Tensor::randn([4, 1], DType::F32, 0).unwrap(),
        Tensor::randn([8, 4], DType::F32, 1).unwrap(),
        Tensor::randn([8, 1], DType::F32, 2).unwrap(),
    ];
    let step = compile(fullgraph_step).fullgraph(true);
    let before = sync_count();
    let explanation = step.explain(&inputs).expect("a fullgraph step runs in error mode");
    let loss = step.call(&inputs).expect("and again from the cache");
    assert_eq!(explanation.host_syncs, 0);
    assert_eq!(sync_count(), before);
    // Reading its result on the host afterwards is the step's one sync.
    let line = line!() + 1;
    match loss[0].item::<f32>() {
        Err(Error::HostSync { op, loc, .. }) => assert_eq!((op.as_str(), loc.line), ("item", line)),
        other => panic!("expected a host sync error, got {other:?}"),
    }
}

fn lenient_step(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let loss = a[0].mul(&a[0])?.mean_all()?;
    let value = loss.item::<f32>()?;
    Ok(vec![a[0].mul_scalar(value as f64)?])
}

/// A lenient compiled function split at a host read waits there: warned at the user's line,
/// counted, and reported by `explain` as before.
#[test]
fn a_break_of_a_lenient_compiled_call_is_a_sync() {
    let _mode = with_mode(SyncDebugMode::Warn);
    let inputs = [Tensor::randn([2, 3], DType::F32, 3).unwrap()];
    let step = compile(lenient_step);
    let before = sync_count();
    let (explanation, warnings) = capture_warnings(|| step.explain(&inputs));
    let explanation = explanation.expect("lenient call");
    assert_eq!(explanation.host_syncs, 1);
    assert_eq!(explanation.breaks.len(), 1);
    assert_eq!(sync_count() - before, 1);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].op, "item");
    assert_eq!(warnings[0].location, explanation.breaks[0].loc.to_string());
}
