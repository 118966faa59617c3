//! Numerics against the f64 reference (`eval_graph`): layer_norm and rms_norm on rows that defeat a
//! plain f32 mean (means from 1e6 to 1e15 with a small spread, variances far below eps, rows of
//! one repeated value, mixed with ordinary rows), and integer and bool sums past the range of i32.
//! Every case runs compiled through braze on the CPU plan executor and, where there is a GPU, on
//! the GPU (`BRAZE_REQUIRE_CUDA=1` makes a missing GPU a failure).
//!
//! Bounds are PyTorch's own test tolerances, those of `torch.testing.assert_close`:
//! `|actual - expected| <= atol + rtol * |expected|` with atol 1e-5 and rtol 1.3e-6 for f32, rtol
//! 1.6e-2 for bf16. A row of one repeated value has no spread: layer_norm gives exactly `b` there
//! (`0 * w + b`), as the reference does. Integer sums must be exact.

use braze::{compile, DType, Device, HostTensor, Tensor};
use braze_cpu::eval_graph;
use braze_ir::{Graph, Op, ReduceOp};
use std::sync::{Mutex, MutexGuard, Once};

const EPS: f64 = 1e-5;

/// GPU cases run one at a time (one stream per device, one poisoning switch per process).
static GPU_LOCK: Mutex<()> = Mutex::new(());

/// The devices a case runs on: the CPU plan executor, and the GPU when there is one (with
/// outputs NaN-poisoned before every run, so an element no kernel wrote cannot pass).
fn devices() -> (Vec<Device>, Option<MutexGuard<'static, ()>>) {
    static POISON: Once = Once::new();
    POISON.call_once(|| std::env::set_var("BRAZE_POISON_OUTPUTS", "1"));
    if !braze_cuda::cuda_available() || !braze_cuda::nvrtc_available() {
        let required = std::env::var("BRAZE_REQUIRE_CUDA").is_ok_and(|v| v == "1");
        assert!(!required, "BRAZE_REQUIRE_CUDA=1 but no CUDA device or no NVRTC");
        println!("skipped on the GPU: no CUDA device or no NVRTC");
        return (vec![Device::Cpu], None);
    }
    let guard = GPU_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    (vec![Device::Cpu, Device::cuda(0).expect("a CUDA device is available")], Some(guard))
}

// ---------------------------------------------------------------------------------------------
// Rows

/// A deterministic stream of standard normals (xorshift and Box-Muller), so the rows do not
/// depend on another crate's generator.
struct Normals(u64);

impl Normals {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn next(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// One row's recipe: `mean + spread * z` with standard normals `z`, or one repeated value.
#[derive(Clone, Copy, Debug)]
enum Row {
    Spread { mean: f64, spread: f64 },
    Constant(f64),
}

/// A unit in the last place of `x` in `dtype` (f32 or bf16).
fn ulp(x: f64, dtype: DType) -> f64 {
    let mantissa_bits = if dtype == DType::BF16 { 7 } else { 23 };
    2f64.powi(x.abs().log2().floor() as i32 - mantissa_bits)
}

/// Ordinary rows, rows with large means and a spread of a few dozen ulps (the values stay
/// distinct after rounding to `dtype`), rows with variances far below eps, and constant rows.
fn rows(dtype: DType) -> Vec<Row> {
    let mut rows = vec![
        Row::Spread { mean: 0.0, spread: 1.0 },
        Row::Spread { mean: 3.0, spread: 2.0 },
        Row::Spread { mean: 0.0, spread: 1e-4 },
        Row::Spread { mean: -2e-3, spread: 3e-5 },
        Row::Constant(3.3),
        Row::Constant(-1e15),
        Row::Constant(7e-3),
        Row::Constant(0.0),
    ];
    for mean in [1e6, -1e9, 1e12, 1e15] {
        rows.push(Row::Spread { mean, spread: 40.0 * ulp(mean, dtype) });
        rows.push(Row::Constant(mean + ulp(mean, dtype)));
    }
    if dtype == DType::F32 {
        // Near 1, f32 still resolves a spread of 1e-4: a variance of 1e-8, far below eps.
        rows.push(Row::Spread { mean: 1.0, spread: 1e-4 });
        rows.push(Row::Spread { mean: -5.0, spread: 1e-4 });
    }
    rows
}

/// The `[rows, cols]` input, rounded to `dtype`.
fn matrix(dtype: DType, recipe: &[Row], cols: usize, seed: u64) -> HostTensor {
    let mut z = Normals(seed | 1);
    let values: Vec<f64> = recipe
        .iter()
        .flat_map(|&row| {
            (0..cols)
                .map(|_| match row {
                    Row::Spread { mean, spread } => mean + spread * z.next(),
                    Row::Constant(c) => c,
                })
                .collect::<Vec<_>>()
        })
        .collect();
    HostTensor::from_f64(dtype, [recipe.len(), cols], &values).expect("rows fit their shape")
}

fn vector(dtype: DType, cols: usize, seed: u64, mean: f64, spread: f64) -> HostTensor {
    let mut z = Normals(seed | 1);
    let values: Vec<f64> = (0..cols).map(|_| mean + spread * z.next()).collect();
    HostTensor::from_f64(dtype, [cols], &values).expect("a vector fits its shape")
}

// ---------------------------------------------------------------------------------------------
// Running and judging

/// `graph` (a norm of its inputs) on the reference, and `f` compiled by braze on every device.
fn run_everywhere(
    graph: &Graph,
    inputs: &[HostTensor],
    f: fn(&[Tensor]) -> braze::Result<Vec<Tensor>>,
) -> (HostTensor, Vec<(Device, HostTensor)>) {
    let expected = eval_graph(graph, inputs).expect("the reference runs").remove(0);
    let (devices, _gpu) = devices();
    let actual = devices
        .into_iter()
        .map(|device| {
            let args: Vec<Tensor> =
                inputs.iter().map(|t| Tensor::from_host(t.clone()).to_device(device).expect("upload")).collect();
            let out = compile(f).fullgraph(true).call(&args).expect("the compiled norm runs");
            (device, out[0].to_host().expect("download"))
        })
        .collect();
    (expected, actual)
}

/// PyTorch's `assert_close` tolerances for `dtype`: (atol, rtol).
fn torch_tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::BF16 => (1e-5, 1.6e-2),
        _ => (1e-5, 1.3e-6),
    }
}

/// Checks every element within PyTorch's tolerance, and the rows `exact_rows` bit for bit; prints
/// the largest error relative to the bound.
fn judge(what: &str, recipe: &[Row], actual: &HostTensor, expected: &HostTensor, exact_rows: impl Fn(Row) -> bool) {
    let (atol, rtol) = torch_tolerance(expected.dtype());
    let cols = expected.shape().last();
    let (a, e) = (actual.to_f64_vec(), expected.to_f64_vec());
    let mut worst = (0.0f64, 0usize);
    for (i, (&a, &e)) in a.iter().zip(&e).enumerate() {
        let row = recipe[i / cols];
        if exact_rows(row) {
            assert!(
                a.to_bits() == e.to_bits(),
                "{what}: row {} ({row:?}) column {}: {a:e}, expected exactly {e:e}",
                i / cols,
                i % cols
            );
        }
        let ratio = (a - e).abs() / (atol + rtol * e.abs());
        assert!(
            ratio <= 1.0,
            "{what}: row {} ({row:?}) column {}: {a:e}, expected {e:e} (error {:.3e}, {ratio:.1}x the bound)",
            i / cols,
            i % cols,
            (a - e).abs()
        );
        if ratio > worst.0 {
            worst = (ratio, i);
        }
    }
    println!("{what}: largest error {:.3} of the bound (element {})", worst.0, worst.1);
}

fn layer_norm_graph(dtype: DType, rows: usize, cols: usize) -> Graph {
    let mut g = Graph::new();
    let x = g.input(dtype, [rows, cols]);
    let w = g.input(dtype, [cols]);
    let b = g.input(dtype, [cols]);
    let y = g.add(Op::LayerNorm { eps: EPS }, &[x, w, b], None).expect("layer_norm type-checks");
    g.set_outputs(vec![y]);
    g
}

fn rms_norm_graph(dtype: DType, rows: usize, cols: usize) -> Graph {
    let mut g = Graph::new();
    let x = g.input(dtype, [rows, cols]);
    let w = g.input(dtype, [cols]);
    let y = g.add(Op::RmsNorm { eps: EPS }, &[x, w], None).expect("rms_norm type-checks");
    g.set_outputs(vec![y]);
    g
}

/// Row lengths: short rows, rows a warp or a block holds in registers, and a row longer than
/// the row cache (re-read for every reduction).
const COLS: &[usize] = &[7, 256, 1000, 4096, 16_411];

// ---------------------------------------------------------------------------------------------
// Norms

#[test]
fn layer_norm_stays_accurate_on_large_means_tiny_variances_and_constant_rows() {
    for dtype in [DType::F32, DType::BF16] {
        let recipe = rows(dtype);
        for (k, &cols) in COLS.iter().enumerate() {
            let x = matrix(dtype, &recipe, cols, 11 + k as u64);
            let w = vector(dtype, cols, 23 + k as u64, 1.0, 0.5);
            let b = vector(dtype, cols, 37 + k as u64, 0.0, 1.0);
            let graph = layer_norm_graph(dtype, recipe.len(), cols);
            let (expected, actual) =
                run_everywhere(&graph, &[x, w, b], |a| Ok(vec![a[0].layer_norm(&a[1], &a[2], EPS)?]));
            for (device, actual) in actual {
                let what = format!("layer_norm {dtype}[{}, {cols}] on {device:?}", recipe.len());
                judge(&what, &recipe, &actual, &expected, |row| matches!(row, Row::Constant(_)));
            }
        }
    }
}

#[test]
fn rms_norm_stays_accurate_on_large_means_tiny_variances_and_constant_rows() {
    for dtype in [DType::F32, DType::BF16] {
        let recipe = rows(dtype);
        for (k, &cols) in COLS.iter().enumerate() {
            let x = matrix(dtype, &recipe, cols, 41 + k as u64);
            let w = vector(dtype, cols, 53 + k as u64, 1.0, 0.5);
            let graph = rms_norm_graph(dtype, recipe.len(), cols);
            let (expected, actual) = run_everywhere(&graph, &[x, w], |a| Ok(vec![a[0].rms_norm(&a[1], EPS)?]));
            for (device, actual) in actual {
                let what = format!("rms_norm {dtype}[{}, {cols}] on {device:?}", recipe.len());
                // A row of zeros normalizes to exactly 0 * w.
                judge(&what, &recipe, &actual, &expected, |row| matches!(row, Row::Constant(c) if c == 0.0));
            }
        }
    }
}

/// Rows whose sums pass f32's largest (values near bf16's top, or whose squares are): the norms
/// accumulate in f32, as PyTorch's do, so an infinite variance normalizes the row to `0 * w + b`
/// and an infinite mean to NaN, on the reference and compiled alike (where the f64 value of the
/// row is out of reach of any f32 computation).
#[test]
fn norms_of_rows_past_the_f32_range_are_what_f32_accumulators_give() {
    let cols = 3;
    // Squares past f32's largest; a mean past it too (three values near bf16's largest); a row of
    // one huge value, whose rounding residual `x - mean` (about 3e21) squares past it, so that the
    // corrected two-pass variance meets `inf - inf`; and such a row with a spread.
    #[rustfmt::skip]
    let values = [
        3e19, 1.0, -2.0,
        3e38, 3e38, 3e38,
        4.9e28, 4.9e28, 4.9e28,
        4.9e28, 5.1e28, 4.7e28,
    ];
    let rows = values.len() / cols;
    let x = HostTensor::from_f64(DType::BF16, [rows, cols], &values).unwrap();
    let w = HostTensor::from_f64(DType::BF16, [cols], &[0.5625, 0.75, -1.0]).unwrap();
    let b = HostTensor::from_f64(DType::BF16, [cols], &[0.25, -0.5, 2.0]).unwrap();
    let graph = rms_norm_graph(DType::BF16, rows, cols);
    let (expected, actual) = run_everywhere(&graph, &[x.clone(), w.clone()], |a| Ok(vec![a[0].rms_norm(&a[1], EPS)?]));
    // Every row's squares overflow: x / inf = 0 for each finite x (signed as x times w).
    assert_eq!(expected.to_f64_vec(), vec![0.0; values.len()]);
    for (device, actual) in actual {
        assert_eq!(actual.to_f64_vec(), expected.to_f64_vec(), "rms_norm on {device:?}");
    }
    let graph = layer_norm_graph(DType::BF16, rows, cols);
    let (expected, actual) = run_everywhere(&graph, &[x, w, b], |a| Ok(vec![a[0].layer_norm(&a[1], &a[2], EPS)?]));
    let want = expected.to_f64_vec();
    // Row 1's mean overflows, so NaN; the others are the bias (an infinite variance, or none).
    let bias = [0.25, -0.5, 2.0];
    let row = |v: &[f64], r: usize| v[r * cols..(r + 1) * cols].to_vec();
    for r in [0, 2, 3] {
        assert_eq!(row(&want, r), bias, "reference row {r}");
    }
    assert!(row(&want, 1).iter().all(|v| v.is_nan()), "{want:?}");
    for (device, actual) in actual {
        let got = actual.to_f64_vec();
        for r in [0, 2, 3] {
            assert_eq!(row(&got, r), bias, "layer_norm on {device:?}, row {r}: {got:?}");
        }
        assert!(row(&got, 1).iter().all(|v| v.is_nan()), "layer_norm on {device:?}: {got:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Integer sums

/// `sum` of `x` over `axes` on the reference and compiled on every device; all must equal
/// `expected` (i64) exactly.
fn check_sum(x: HostTensor, axes: &[usize], expected: &[i64]) {
    let mut g = Graph::new();
    let input = g.input(x.dtype(), x.shape().clone());
    let sum = g.add(Op::Reduce { op: ReduceOp::Sum, axes: axes.to_vec(), keepdim: false }, &[input], None).unwrap();
    g.set_outputs(vec![sum]);
    let what = format!("sum over {axes:?} of {}{}", x.dtype(), x.shape());
    let reference = eval_graph(&g, std::slice::from_ref(&x)).expect("the reference runs").remove(0);
    assert_eq!(reference.dtype(), DType::I64, "{what}: the reference's dtype");
    assert_eq!(reference.to_f64_vec(), expected.iter().map(|&v| v as f64).collect::<Vec<_>>(), "{what}: reference");
    let axes: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
    let (devices, _gpu) = devices();
    for device in devices {
        let t = Tensor::from_host(x.clone()).to_device(device).unwrap();
        let axes = axes.clone();
        let out = compile(move |a: &[Tensor]| Ok(vec![a[0].sum(&axes, false)?])).fullgraph(true).call(&[t]).unwrap();
        assert_eq!(out[0].dtype(), DType::I64, "{what} on {device:?}: dtype");
        assert_eq!(out[0].to_vec::<i64>().unwrap(), expected, "{what} on {device:?}");
    }
}

#[test]
fn i32_sums_past_the_i32_range_are_exact_i64() {
    let big = i32::MAX;
    // Rows of [big, big, big, -1]: 3 * (2^31 - 1) - 1 wraps in i32 but not in i64.
    let values: Vec<i32> = (0..6).flat_map(|r| [big, big, big, -1 - r]).collect();
    let x = HostTensor::from_f64(DType::I32, [6, 4], &values.iter().map(|&v| v as f64).collect::<Vec<_>>()).unwrap();
    let rows: Vec<i64> = (0..6).map(|r| 3 * big as i64 - 1 - r).collect();
    check_sum(x.clone(), &[1], &rows);
    check_sum(x.clone(), &[0], &[6 * big as i64, 6 * big as i64, 6 * big as i64, -21]);
    check_sum(x, &[0, 1], &[rows.iter().sum()]);
    // A full reduction longer than the row cache (a multi-reduce kernel): 20,000 * i32::MIN.
    let n = 20_000;
    let long = HostTensor::from_f64(DType::I32, [n], &vec![i32::MIN as f64; n]).unwrap();
    check_sum(long, &[0], &[n as i64 * i32::MIN as i64]);
}

#[test]
fn bool_sums_count_the_true_values_as_i64() {
    let values: Vec<f64> = (0..3 * 5).map(|i| f64::from(i % 3 != 0)).collect();
    let x = HostTensor::from_f64(DType::Bool, [3, 5], &values).unwrap();
    check_sum(x.clone(), &[1], &[3, 3, 4]);
    check_sum(x, &[0, 1], &[10]);
    let n = 20_000;
    let long = HostTensor::from_f64(DType::Bool, [n], &vec![1.0; n]).unwrap();
    check_sum(long, &[0], &[n as i64]);
}

#[test]
fn i64_sums_stay_i64() {
    let values = [1i64 << 40, 1 << 41, -(1 << 50), 7];
    let x = HostTensor::from_f64(DType::I64, [2, 2], &values.map(|v| v as f64)).unwrap();
    check_sum(x.clone(), &[1], &[(1 << 40) + (1 << 41), 7 - (1 << 50)]);
    check_sum(x, &[0, 1], &[values.iter().sum()]);
}

#[test]
fn an_integer_mean_is_an_error_that_names_the_op_and_dtype() {
    let x = Tensor::from_host(HostTensor::from_f64(DType::I32, [3], &[1.0, 2.0, 3.0]).unwrap());
    let err = x.mean(&[0], false).unwrap_err().to_string();
    assert!(err.contains("mean") && err.contains("i32"), "{err}");
}
