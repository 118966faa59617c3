//! Compiled functions and tensors shared between threads.
//!
//! One compiled function (layer norm + relu + residual, and a row sum: two fused kernels) is
//! called from 8 threads at once, every call with fresh random inputs, and every result is
//! checked against the CPU reference (the function run eagerly on the host). On the CPU backend
//! this runs everywhere (8 threads x 250 calls per mode, small enough for a debug build); on a GPU it runs
//! 8 threads x 1,000 calls in default mode and in reduce-overhead mode (CUDA graphs), with
//! outputs poisoned before every run. A last test captures CUDA graphs on one thread while
//! others run eager ops and compiled calls on the same device, and checks that each captured
//! graph holds only its own launches and replays right. GPU tests skip without a GPU (fail
//! instead when `BRAZE_REQUIRE_CUDA=1`).

mod common;

use braze::{compile, Compiled, DType, Device, Mode, Result, Tensor};
use braze_cpu::compare::{assert_close_bounded, Bounds};
use braze_cuda::{DeviceBuffer, KernelArg};
use common::gpu;
use std::sync::Barrier;

const THREADS: usize = 8;

fn assert_send_sync<T: Send + Sync>() {}

type F = fn(&[Tensor]) -> Result<Vec<Tensor>>;

/// `relu(layer_norm(x) * w + b) + r` and the row sums of `x + r`.
fn block(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let normed = a[0].layer_norm(&a[1], &a[2], 1e-5)?.relu()?.add(&a[3])?;
    let sums = a[0].add(&a[3])?.sum(&[1], false)?;
    Ok(vec![normed, sums])
}

#[test]
fn compiled_functions_and_tensors_are_send_and_sync() {
    assert_send_sync::<Tensor>();
    assert_send_sync::<Compiled<F>>();
    let closure = |a: &[Tensor]| -> Result<Vec<Tensor>> { Ok(vec![a[0].relu()?]) };
    fn of<T: Send + Sync>(_: &T) {}
    of(&compile(closure));
    assert_send_sync::<braze_cuda::CudaDevice>();
    assert_send_sync::<braze_cuda::DeviceBuffer>();
}

/// Fresh inputs of `block` for one call: `x [rows, hidden]`, `w`, `b [hidden]`, `r [rows, hidden]`.
fn inputs(rows: usize, hidden: usize, seed: u64) -> Vec<Tensor> {
    let randn = |shape: Vec<usize>, k: u64| Tensor::randn(shape, DType::F32, seed * 4 + k).unwrap();
    vec![randn(vec![rows, hidden], 0), randn(vec![hidden], 1), randn(vec![hidden], 2), randn(vec![rows, hidden], 3)]
}

/// Calls `compiled` from [`THREADS`] threads at once, `calls` times each, every call on fresh
/// inputs moved to `device`, and checks each result against `block` run eagerly on the host.
fn hammer(compiled: &Compiled<F>, device: Device, rows: usize, hidden: usize, calls: usize) {
    let start = Barrier::new(THREADS);
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let start = &start;
            scope.spawn(move || {
                start.wait();
                for call in 0..calls {
                    let seed = (thread * calls + call) as u64;
                    let host = inputs(rows, hidden, seed);
                    let want = block(&host).unwrap();
                    let args: Vec<Tensor> = host.iter().map(|t| t.to_device(device).unwrap()).collect();
                    let got = compiled.call(&args).unwrap_or_else(|e| panic!("thread {thread} call {call}: {e}"));
                    assert_eq!(got.len(), want.len());
                    for (index, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(g.device(), device);
                        check_close(g, w, &format!("thread {thread} call {call} output {index}"));
                    }
                }
            });
        }
    });
    let stats = compiled.stats();
    assert_eq!(stats.traces, 1, "one signature, traced once by whichever thread came first");
    assert_eq!(stats.cache_hits, THREADS * calls - 1);
}

#[test]
fn compiled_function_called_from_8_threads_on_the_cpu() {
    for mode in [Mode::Default, Mode::ReduceOverhead] {
        let compiled: Compiled<F> = compile(block as F).fullgraph(true).mode(mode);
        hammer(&compiled, Device::Cpu, 4, 32, 250);
    }
}

#[test]
fn gpu_compiled_function_called_from_8_threads_1000_calls_each() {
    let Some(gpu) = gpu() else { return };
    for mode in [Mode::Default, Mode::ReduceOverhead] {
        let compiled: Compiled<F> = compile(block as F).fullgraph(true).mode(mode);
        hammer(&compiled, gpu, 16, 256, 1000);
    }
}

/// `y = 2 x + 1`, elementwise.
const SCALE_ADD: &str = r#"
extern "C" __global__ void scale_add(float* y, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i] + 1.0f;
}
"#;

fn scale_add_args<'a>(y: &'a DeviceBuffer, x: &'a DeviceBuffer, n: usize) -> [KernelArg<'a>; 3] {
    [KernelArg::Buffer(y), KernelArg::Buffer(x), KernelArg::I32(n as i32)]
}

/// Checks `got` against `want` within the f32 tolerance.
fn check_close(got: &Tensor, want: &Tensor, what: &str) {
    let (got, want) = (got.to_host().unwrap(), want.to_host().unwrap());
    let bounds = Bounds::for_rounding(DType::F32, [DType::F32], want.numel());
    assert_close_bounded(&got, &want, None, &bounds).unwrap_or_else(|e| panic!("{what}: {e}"));
}

#[test]
fn gpu_capture_on_one_thread_while_others_launch() {
    let Some(gpu) = gpu() else { return };
    let device = braze::cuda_device(0).unwrap();
    let opts = braze_cuda::CompileOptions { arch: device.arch(), ..braze_cuda::CompileOptions::default() };
    let module = braze_cuda::compile(SCALE_ADD, "scale_add.cu", &opts).unwrap();
    let kernel = device.load_module(&module).unwrap().get_function("scale_add").unwrap();
    let compiled: Compiled<F> = compile(block as F).fullgraph(true);
    let n = 4096usize;
    let grid = ((n as u32).div_ceil(256), 1, 1);
    let launches_per_graph = 3;
    let captures = 200;
    let workers = 4;
    let start = Barrier::new(workers + 1);
    std::thread::scope(|scope| {
        let (device, kernel, start) = (&device, &kernel, &start);
        scope.spawn(move || {
            start.wait();
            for capture in 0..captures {
                let values: Vec<f32> = (0..n).map(|i| (i + capture) as f32 * 0.25).collect();
                let x = device.upload_values(&values).unwrap();
                let a = device.alloc(n * 4).unwrap();
                let b = device.alloc(n * 4).unwrap();
                device.memset_d8(&b, 0xFF).unwrap();
                let graph = device
                    .capture_graph(|| {
                        device.launch(kernel, grid, (256, 1, 1), 0, &scale_add_args(&a, &x, n))?;
                        device.launch(kernel, grid, (256, 1, 1), 0, &scale_add_args(&b, &a, n))?;
                        device.launch(kernel, grid, (256, 1, 1), 0, &scale_add_args(&a, &b, n))
                    })
                    .unwrap();
                // Another thread's launch inside the capture would be recorded (and counted) here.
                assert_eq!(graph.kernel_launches(), launches_per_graph, "capture {capture}");
                assert_eq!(graph.retained_buffers(), 3, "capture {capture}");
                graph.replay().unwrap();
                let got: Vec<f32> = device.download_values(&a).unwrap();
                for (i, (&g, &v)) in got.iter().zip(&values).enumerate() {
                    let want = 2.0 * (2.0 * (2.0 * v + 1.0) + 1.0) + 1.0;
                    assert_eq!(g, want, "capture {capture}, element {i}");
                }
            }
        });
        for worker in 0..workers {
            let compiled = &compiled;
            scope.spawn(move || {
                start.wait();
                for call in 0..250 {
                    let seed = 1_000_000 + (worker * 1000 + call) as u64;
                    let host = inputs(8, 128, seed);
                    let args: Vec<Tensor> = host.iter().map(|t| t.to_device(gpu).unwrap()).collect();
                    // Eager ops on the GPU, against the same ops on the host.
                    let eager = args[0].mul(&args[3]).unwrap().add(&args[1]).unwrap().relu().unwrap();
                    let eager_want = host[0].mul(&host[3]).unwrap().add(&host[1]).unwrap().relu().unwrap();
                    check_close(&eager, &eager_want, &format!("worker {worker} call {call}: eager"));
                    let got = compiled.call(&args).unwrap();
                    for (index, (g, w)) in got.iter().zip(block(&host).unwrap()).enumerate() {
                        check_close(g, &w, &format!("worker {worker} call {call} output {index}"));
                    }
                }
            });
        }
    });
}
