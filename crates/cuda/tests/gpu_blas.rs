//! cuBLASLt matmul against a CPU reference on a real GPU.

mod common;

use braze_cuda::{BlasLt, CudaDevice, CudaError, DeviceBuffer, MatmulDtype, MatmulSpec, MatrixRef};
use braze_ir::UnaryOp;
use half::{bf16, f16};

/// Host values of one operand, rounded to the operand type, plus their device bytes.
struct Operand {
    values: Vec<f64>,
    bytes: Vec<u8>,
}

fn operand(dtype: MatmulDtype, count: usize, seed: u64) -> Operand {
    let floats = common::random_floats(count, seed);
    match dtype {
        MatmulDtype::F32 => Operand {
            values: floats.iter().map(|&v| v as f64).collect(),
            bytes: braze_cuda::bytes_of(&floats).to_vec(),
        },
        MatmulDtype::BF16 => {
            let rounded: Vec<bf16> = floats.iter().map(|&v| bf16::from_f32(v)).collect();
            Operand {
                values: rounded.iter().map(|v| v.to_f64()).collect(),
                bytes: braze_cuda::bytes_of(&rounded).to_vec(),
            }
        }
        MatmulDtype::F16 => {
            let rounded: Vec<f16> = floats.iter().map(|&v| f16::from_f32(v)).collect();
            Operand {
                values: rounded.iter().map(|v| v.to_f64()).collect(),
                bytes: braze_cuda::bytes_of(&rounded).to_vec(),
            }
        }
    }
}

fn download_as_f64(device: &CudaDevice, buffer: &DeviceBuffer, dtype: MatmulDtype) -> Vec<f64> {
    match dtype {
        MatmulDtype::F32 => device.download_values::<f32>(buffer).unwrap().into_iter().map(f64::from).collect(),
        MatmulDtype::BF16 => device.download_values::<bf16>(buffer).unwrap().into_iter().map(|v| v.to_f64()).collect(),
        MatmulDtype::F16 => device.download_values::<f16>(buffer).unwrap().into_iter().map(|v| v.to_f64()).collect(),
    }
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// Row-major reference: returns each output and the sum of the magnitudes that formed it
/// (the scale rounding errors are relative to).
fn reference(
    spec: &MatmulSpec,
    a: &[f64],
    b: &[f64],
    bias: Option<&[f64]>,
    c_before: Option<&[f64]>,
) -> (Vec<f64>, Vec<f64>) {
    let (m, n, k) = (spec.m, spec.n, spec.k);
    let mut out = vec![0.0; spec.batch * m * n];
    let mut magnitude = vec![0.0; spec.batch * m * n];
    for p in 0..spec.batch {
        for i in 0..m {
            for j in 0..n {
                let (mut sum, mut size) = (0.0, 0.0);
                for l in 0..k {
                    let a_il = if spec.transpose_a {
                        a[p * spec.stride_a + l * m + i]
                    } else {
                        a[p * spec.stride_a + i * k + l]
                    };
                    let b_lj = if spec.transpose_b {
                        b[p * spec.stride_b + j * k + l]
                    } else {
                        b[p * spec.stride_b + l * n + j]
                    };
                    sum += a_il * b_lj;
                    size += (a_il * b_lj).abs();
                }
                let at = p * m * n + i * n + j;
                if let Some(bias) = bias {
                    sum += bias[j];
                    size += bias[j].abs();
                }
                if let Some(c) = c_before {
                    sum += c[p * spec.stride_c + i * n + j];
                    size += c[p * spec.stride_c + i * n + j].abs();
                }
                out[at] = match spec.activation {
                    None => sum,
                    Some(UnaryOp::Relu) => sum.max(0.0),
                    Some(UnaryOp::GeluTanh) => gelu_tanh(sum),
                    Some(op) => unreachable!("{} is not an epilogue activation", op.name()),
                };
                magnitude[at] = size;
            }
        }
    }
    (out, magnitude)
}

/// Tolerances: `accumulate_rel` of the summed magnitudes (input rounding and accumulation
/// order) plus `output_rel` of the result (rounding to the output type).
fn check(got: &[f64], expected: &[f64], magnitude: &[f64], accumulate_rel: f64, output_rel: f64) -> f64 {
    assert_eq!(got.len(), expected.len());
    let mut worst: f64 = 0.0;
    for (index, ((g, e), size)) in got.iter().zip(expected).zip(magnitude).enumerate() {
        let error = (g - e).abs();
        let allowed = accumulate_rel * size + output_rel * e.abs() + 1e-6;
        assert!(error <= allowed, "element {index}: got {g}, expected {e} (error {error:e}, allowed {allowed:e})");
        worst = worst.max(error / (size + 1e-30));
    }
    worst
}

struct Case {
    spec: MatmulSpec,
    with_bias: bool,
    accumulate_rel: f64,
    output_rel: f64,
}

fn run_case(device: &std::sync::Arc<CudaDevice>, blas: &BlasLt, case: &Case, seed: u64) -> f64 {
    let spec = &case.spec;
    let a_len = (spec.batch - 1) * spec.stride_a + spec.m * spec.k;
    let b_len = (spec.batch - 1) * spec.stride_b + spec.k * spec.n;
    let c_len = (spec.batch - 1) * spec.stride_c + spec.m * spec.n;
    let a = operand(spec.dtype, a_len, seed);
    let b = operand(spec.dtype, b_len, seed + 1);
    let bias = operand(spec.dtype, spec.n, seed + 2);
    let c_before = operand(spec.dtype, c_len, seed + 3);
    let a_buffer = device.upload(&a.bytes).unwrap();
    let b_buffer = device.upload(&b.bytes).unwrap();
    let bias_buffer = device.upload(&bias.bytes).unwrap();
    let c_buffer = if spec.accumulate {
        device.upload(&c_before.bytes).unwrap()
    } else {
        let c = device.alloc(c_len * spec.dtype.size_bytes()).unwrap();
        device.memset_d8(&c, 0xFF).unwrap();
        c
    };
    blas.matmul(spec, &a_buffer, &b_buffer, &c_buffer, case.with_bias.then(|| MatrixRef::from(&bias_buffer))).unwrap();
    let (expected, magnitude) = reference(
        spec,
        &a.values,
        &b.values,
        case.with_bias.then_some(&bias.values[..]),
        spec.accumulate.then_some(&c_before.values[..]),
    );
    let got = download_as_f64(device, &c_buffer, spec.dtype);
    check(&got, &expected, &magnitude, case.accumulate_rel, case.output_rel)
}

fn blas() -> Option<(std::sync::Arc<CudaDevice>, BlasLt)> {
    let device = common::gpu()?;
    let blas = BlasLt::new(&device).expect("cuBLASLt (add /usr/local/cuda/lib64 to LD_LIBRARY_PATH)");
    Some((device, blas))
}

#[test]
fn f32_is_exact_without_tf32_and_close_with_it() {
    let Some((device, blas)) = blas() else { return };
    let exact = MatmulSpec::new(67, 45, 129, MatmulDtype::F32);
    let worst_exact =
        run_case(&device, &blas, &Case { spec: exact, with_bias: false, accumulate_rel: 2e-6, output_rel: 0.0 }, 1);
    let tf32 = MatmulSpec { allow_tf32: true, ..exact };
    let worst_tf32 =
        run_case(&device, &blas, &Case { spec: tf32, with_bias: false, accumulate_rel: 4e-3, output_rel: 0.0 }, 1);
    println!("worst relative error: f32 {worst_exact:e}, tf32 {worst_tf32:e}");
}

#[test]
fn f32_with_bias_relu_accumulate_and_transposes() {
    let Some((device, blas)) = blas() else { return };
    for (seed, (transpose_a, transpose_b)) in
        [(false, false), (true, false), (false, true), (true, true)].into_iter().enumerate()
    {
        let spec = MatmulSpec {
            transpose_a,
            transpose_b,
            activation: Some(UnaryOp::Relu),
            accumulate: seed % 2 == 1,
            ..MatmulSpec::new(33, 70, 48, MatmulDtype::F32)
        };
        run_case(
            &device,
            &blas,
            &Case { spec, with_bias: true, accumulate_rel: 2e-6, output_rel: 0.0 },
            10 + seed as u64,
        );
    }
}

#[test]
fn bf16_batched_with_shared_weight_bias_and_gelu() {
    let Some((device, blas)) = blas() else { return };
    let mut spec = MatmulSpec {
        transpose_b: true,
        activation: Some(UnaryOp::GeluTanh),
        ..MatmulSpec::new(64, 96, 128, MatmulDtype::BF16).batched(3)
    };
    spec.stride_b = 0; // one weight for the whole batch
    run_case(&device, &blas, &Case { spec, with_bias: true, accumulate_rel: 1e-4, output_rel: 8e-3 }, 20);
}

#[test]
fn f16_batched_with_bias_and_relu() {
    let Some((device, blas)) = blas() else { return };
    let spec =
        MatmulSpec { activation: Some(UnaryOp::Relu), ..MatmulSpec::new(40, 24, 200, MatmulDtype::F16).batched(4) };
    run_case(&device, &blas, &Case { spec, with_bias: true, accumulate_rel: 1e-4, output_rel: 2e-3 }, 30);
}

/// Max-autotune runs a matmul with any of the heuristic's first algorithms: each must give the
/// product (with its bias and activation), and a rank past those offered runs the first.
#[test]
fn every_offered_algorithm_computes_the_product() {
    let Some((device, blas)) = blas() else { return };
    let cases = [
        Case {
            spec: MatmulSpec { transpose_b: true, ..MatmulSpec::new(256, 192, 320, MatmulDtype::BF16) },
            with_bias: true,
            accumulate_rel: 1e-4,
            output_rel: 8e-3,
        },
        Case {
            spec: MatmulSpec {
                transpose_a: true,
                activation: Some(UnaryOp::GeluTanh),
                ..MatmulSpec::new(96, 128, 64, MatmulDtype::F32)
            },
            with_bias: true,
            accumulate_rel: 2e-6,
            output_rel: 0.0,
        },
    ];
    for (seed, case) in cases.iter().enumerate() {
        let spec = &case.spec;
        // Operands freshly allocated are 256-byte aligned, as run_case's are.
        let a = device.alloc(spec.m * spec.k * spec.dtype.size_bytes()).unwrap();
        let b = device.alloc(spec.k * spec.n * spec.dtype.size_bytes()).unwrap();
        let c = device.alloc(spec.m * spec.n * spec.dtype.size_bytes()).unwrap();
        let bias = device.alloc(spec.n * spec.dtype.size_bytes()).unwrap();
        let offered =
            blas.algorithm_count(spec, (&a).into(), (&b).into(), (&c).into(), Some((&bias).into()), 8).unwrap();
        assert!(offered >= 1, "{spec:?}: no algorithm offered");
        for algorithm in 0..=offered {
            let spec = MatmulSpec { algorithm, ..*spec };
            run_case(&device, &blas, &Case { spec, ..*case }, 50 + seed as u64);
        }
        println!("{:?} {}x{}x{}: {offered} algorithms checked", spec.dtype, spec.m, spec.n, spec.k);
    }
}

#[test]
fn operands_at_offsets() {
    let Some((device, blas)) = blas() else { return };
    let (m, n, k) = (16usize, 8usize, 32usize);
    let spec = MatmulSpec::new(m, n, k, MatmulDtype::F32);
    let a = operand(MatmulDtype::F32, m * k, 40);
    let b = operand(MatmulDtype::F32, k * n, 41);
    // A packed after 64 bytes of padding, C 4 bytes into its buffer (4-byte aligned only).
    let mut padded = vec![0u8; 64];
    padded.extend_from_slice(&a.bytes);
    let a_buffer = device.upload(&padded).unwrap();
    let b_buffer = device.upload(&b.bytes).unwrap();
    let c_buffer = device.alloc(4 + m * n * 4).unwrap();
    device.memset_d8(&c_buffer, 0xFF).unwrap();
    blas.matmul(&spec, MatrixRef::at(&a_buffer, 64), &b_buffer, MatrixRef::at(&c_buffer, 4), None).unwrap();
    let bytes = device.download(&c_buffer).unwrap();
    let got: Vec<f64> = braze_cuda::values_from_bytes::<f32>(&bytes[4..]).into_iter().map(f64::from).collect();
    let (expected, magnitude) = reference(&spec, &a.values, &b.values, None, None);
    check(&got, &expected, &magnitude, 2e-6, 0.0);
}

#[test]
fn shape_and_alignment_errors_are_reported() {
    let Some((device, blas)) = blas() else { return };
    let spec = MatmulSpec::new(8, 8, 8, MatmulDtype::F32);
    let full = device.alloc(8 * 8 * 4).unwrap();
    let short = device.alloc(8 * 8 * 4 - 4).unwrap();
    for (a, b, c) in [(&short, &full, &full), (&full, &short, &full), (&full, &full, &short)] {
        let err = blas.matmul(&spec, a, b, c, None).unwrap_err();
        assert!(matches!(err, CudaError::ShapeMismatch { .. }), "{err}");
    }
    let short_bias = device.alloc(7 * 4).unwrap();
    let err = blas.matmul(&spec, &full, &full, &full, Some(MatrixRef::from(&short_bias))).unwrap_err();
    assert!(matches!(err, CudaError::ShapeMismatch { .. }), "{err}");
    let batched = spec.batched(2);
    let err = blas.matmul(&batched, &full, &full, &full, None).unwrap_err();
    assert!(matches!(err, CudaError::ShapeMismatch { .. }), "{err}");
    let roomy = device.alloc(8 * 8 * 4 + 2).unwrap();
    let err = blas.matmul(&spec, MatrixRef::at(&roomy, 2), &full, &full, None).unwrap_err();
    assert!(matches!(err, CudaError::InvalidArgument(_)), "{err}");
}

#[test]
fn matmul_inside_a_captured_graph() {
    let Some((device, blas)) = blas() else { return };
    let spec = MatmulSpec { activation: Some(UnaryOp::Relu), ..MatmulSpec::new(128, 64, 96, MatmulDtype::BF16) };
    let a = operand(spec.dtype, spec.m * spec.k, 50);
    let b = operand(spec.dtype, spec.k * spec.n, 51);
    let a_buffer = device.upload(&a.bytes).unwrap();
    let b_buffer = device.upload(&b.bytes).unwrap();
    let c_buffer = device.alloc(spec.m * spec.n * 2).unwrap();
    // Warm the algorithm choice outside the capture, as a real run would.
    blas.matmul(&spec, &a_buffer, &b_buffer, &c_buffer, None).unwrap();
    device.memset_d8(&c_buffer, 0xFF).unwrap();
    let graph = device.capture_graph(|| blas.matmul(&spec, &a_buffer, &b_buffer, &c_buffer, None)).unwrap();
    let allocations = device.allocation_count();
    for seed in [52, 54] {
        let a = operand(spec.dtype, spec.m * spec.k, seed);
        device.upload_into(&a_buffer, 0, &a.bytes).unwrap();
        device.memset_d8(&c_buffer, 0xFF).unwrap();
        graph.replay().unwrap();
        let (expected, magnitude) = reference(&spec, &a.values, &b.values, None, None);
        let got = download_as_f64(&device, &c_buffer, spec.dtype);
        check(&got, &expected, &magnitude, 1e-4, 8e-3);
    }
    assert_eq!(device.allocation_count(), allocations);
}
