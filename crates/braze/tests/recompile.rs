//! The cache per input signature: new signatures trace again with a logged reason, a signature
//! seen before never does, and the recompile limit errors (fullgraph) or falls back to eager.

use braze::{compile, DType, Error, Result, Tensor};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

fn tensor(dtype: DType, shape: &[usize]) -> Tensor {
    Tensor::randn(shape.to_vec(), dtype, shape.iter().sum::<usize>() as u64).unwrap()
}

fn double_relu(a: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![a[0].relu()?.mul_scalar(2.0)?])
}

/// Calls a compiled `double_relu` with each input list in turn and checks the traces and the
/// recompile reasons it gave.
fn check(calls: &[Vec<Tensor>], want_traces: usize, want_reasons: &[&str]) {
    let compiled = compile(double_relu).name("double_relu").input_names(&["x"]);
    let compiled_any_arity = compile(double_relu).name("double_relu");
    let use_names = calls.iter().all(|c| c.len() == 1);
    let mut last = None;
    for inputs in calls {
        let result = if use_names { compiled.explain(inputs) } else { compiled_any_arity.explain(inputs) };
        last = Some(result.unwrap());
    }
    let stats = if use_names { compiled.stats() } else { compiled_any_arity.stats() };
    assert_eq!(stats.traces, want_traces);
    assert_eq!(stats.recompiles, want_traces - 1);
    assert_eq!(stats.cache_hits, calls.len() - want_traces);
    let explanation = last.unwrap();
    assert_eq!(explanation.recompile_reasons, want_reasons);
    assert_eq!(explanation.recompiles, want_reasons.len());
}

#[test]
fn new_shape_traces_again_with_the_reason() {
    let (a, b) = (tensor(DType::F32, &[4, 8]), tensor(DType::F32, &[2, 8]));
    check(
        &[vec![a.clone()], vec![a.clone()], vec![b.clone()], vec![a], vec![b]],
        2,
        &["input 0 (x) shape changed from [4,8] to [2,8]"],
    );
}

#[test]
fn new_dtype_traces_again_with_the_reason() {
    check(
        &[vec![tensor(DType::F32, &[4])], vec![tensor(DType::BF16, &[4])], vec![tensor(DType::F16, &[4])]],
        3,
        &["input 0 (x) dtype changed from f32 to bf16", "input 0 (x) dtype changed from bf16 to f16"],
    );
}

#[test]
fn new_input_count_traces_again_with_the_reason() {
    let x = tensor(DType::F32, &[3]);
    check(&[vec![x.clone()], vec![x.clone(), x]], 2, &["number of inputs changed from 1 to 2"]);
}

#[test]
fn one_signature_called_100_times_traces_once() {
    let calls: Vec<Vec<Tensor>> =
        (0..100).map(|i| vec![tensor(DType::F32, &[3, 5]).add_scalar(i as f64).unwrap()]).collect();
    check(&calls, 1, &[]);
}

#[test]
fn recompile_limit_in_fullgraph_mode_is_an_error_naming_limit_and_signatures() {
    let compiled = compile(double_relu).name("double_relu").fullgraph(true).recompile_limit(2);
    compiled.call(&[tensor(DType::F32, &[1])]).unwrap();
    compiled.call(&[tensor(DType::F32, &[2])]).unwrap();
    let error = compiled.call(&[tensor(DType::F32, &[3])]).unwrap_err();
    assert!(matches!(error, Error::RecompileLimit { limit: 2, .. }));
    assert_eq!(
        error.to_string(),
        "`double_relu` reached its recompile limit of 2 signatures; new signature (f32[3]), cached: (f32[1]), \
         (f32[2]); raise it with recompile_limit(n) or keep input shapes fixed"
    );
    // Cached signatures still run.
    compiled.call(&[tensor(DType::F32, &[1])]).unwrap();
    assert_eq!(compiled.stats().traces, 2);
}

#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn recompile_limit_in_lenient_mode_runs_eagerly_with_one_warning() {
    let log = LogBuffer::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let compiled = compile(double_relu).name("double_relu").recompile_limit(2);
        for size in [1, 2, 3, 4, 1] {
            let x = tensor(DType::F32, &[size]);
            let got = compiled.call(std::slice::from_ref(&x)).unwrap();
            let want = double_relu(&[x]).unwrap();
            braze_cpu::compare::assert_close(&got[0].to_host().unwrap(), &want[0].to_host().unwrap()).unwrap();
        }
        let stats = compiled.stats();
        assert_eq!((stats.traces, stats.eager_fallbacks, stats.cache_hits), (2, 2, 1));
        let explanation = compiled.explain(&[tensor(DType::F32, &[5])]).unwrap();
        assert!(explanation.eager_fallback);
        // The reason is kept with the function (the debug log line that also says it can be
        // missed here: tracing caches per call site whether any subscriber wants it, and tests
        // on other threads of this binary install their own).
        assert_eq!(explanation.recompile_reasons, vec!["input 0 shape changed from [1] to [2]".to_string()]);
    });
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert_eq!(text.matches("WARN").count(), 1, "{text}");
    assert!(text.contains("double_relu reached its recompile limit of 2"), "{text}");
}

#[test]
fn two_thousand_inputs_trace_fast_and_stay_cached() {
    let inputs: Vec<Tensor> = (0..2000).map(|i| tensor(DType::F32, &[1 + i % 7])).collect();
    let compiled = compile(|a: &[Tensor]| {
        let sums = a.iter().map(|t| t.sum_all()).collect::<Result<Vec<_>>>()?;
        Ok(vec![Tensor::stack(&sums, 0)?])
    })
    .fullgraph(true);
    let start = Instant::now();
    let explanation = compiled.explain(&inputs).unwrap();
    let first_call = start.elapsed();
    assert_eq!(explanation.graphs[0].op_count(), 2001);
    // A complexity guard, not a timing test (timings live in `braze bench`): a quadratic trace
    // of 2,000 inputs would take minutes.
    assert!(first_call.as_secs_f64() < 20.0, "first call took {first_call:?}");
    for _ in 0..10 {
        compiled.call(&inputs).unwrap();
    }
    assert_eq!((compiled.stats().traces, compiled.stats().cache_hits), (1, 10));
    // The guard check a cached call makes is O(K); the bound only catches a quadratic check.
    let checks = 200;
    let start = Instant::now();
    for _ in 0..checks {
        assert!(compiled.is_cached(&inputs));
    }
    let per_check = start.elapsed() / checks;
    assert!(per_check.as_millis() < 50, "signature check of 2000 inputs took {per_check:?}");
    assert!(!compiled.is_cached(&inputs[1..]));
}

#[test]
fn a_function_without_breaks_runs_once_and_one_with_breaks_runs_every_call() {
    for (with_break, want_runs) in [(false, 1), (true, 5)] {
        let runs = std::sync::atomic::AtomicUsize::new(0);
        let compiled = compile(|a: &[Tensor]| {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let y = a[0].exp()?;
            if with_break {
                y.sum_all()?.item::<f32>()?;
            }
            Ok(vec![y])
        });
        let x = tensor(DType::F32, &[3]);
        for _ in 0..5 {
            compiled.call(std::slice::from_ref(&x)).unwrap();
        }
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), want_runs, "with_break: {with_break}");
        assert_eq!(compiled.stats().traces, 1);
    }
}

/// Calls with the very same argument tensors skip the per-argument signature check; an `assign`
/// in between (new data, possibly a new shape) must still be seen.
#[test]
fn same_arguments_fast_path_sees_assign() {
    let compiled = compile(|a: &[Tensor]| Ok(vec![a[0].mul_scalar(2.0)?]));
    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    let args = [x.clone()];
    assert_eq!(compiled.call(&args).unwrap()[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    assert_eq!(compiled.call(&args).unwrap()[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    x.assign(&Tensor::from_vec(vec![5.0f32], [1]).unwrap()).unwrap();
    assert_eq!(compiled.call(&args).unwrap()[0].to_vec::<f32>().unwrap(), vec![10.0]);
    x.assign(&Tensor::from_vec(vec![7.0f32, 8.0], [2]).unwrap()).unwrap();
    assert_eq!(compiled.call(&args).unwrap()[0].to_vec::<f32>().unwrap(), vec![14.0, 16.0]);
    assert_eq!(compiled.stats().traces, 2, "one trace per shape");
}
