//! GPU conformance: every workload and kernel family compiled (default and reduce-overhead mode)
//! and eager on the GPU, compared with the CPU reference on fresh random inputs, with outputs
//! poisoned (`BRAZE_POISON_OUTPUTS=1`: NaN-filled before every run) so an element no kernel wrote
//! cannot pass. Also CUDA-graph replay against direct launches, outputs never overwritten behind
//! the caller's back, flat device allocations, one compile per signature and the disk kernel cache
//! across processes.
//!
//! Without a CUDA device each test prints `skipped: no CUDA device` and passes, unless
//! `BRAZE_REQUIRE_CUDA=1`. Tests named `sanitizer_*` are small and quick: compute-sanitizer
//! (memcheck, racecheck) runs only those.

use braze::{compile, DType, Device, HostTensor, Mode, Tensor};
use braze_cpu::{assert_close_bounded, Bounds};
use braze_workloads::{self as workloads, Sizes};
use std::sync::{Arc, Mutex, MutexGuard, Once};

const GPU: Device = Device::Cuda(0);
const BOTH_MODES: &[Mode] = &[Mode::Default, Mode::ReduceOverhead];

// ---------------------------------------------------------------------------------------------
// Setup and skipping

/// GPU tests run one at a time: all of braze's work on a device goes through one stream, and a
/// CUDA graph being captured there (reduce-overhead mode) would also record another thread's
/// launches and make its uploads fail; the allocation and compile counters are per process too.
static GPU_LOCK: Mutex<()> = Mutex::new(());

fn required() -> bool {
    std::env::var("BRAZE_REQUIRE_CUDA").is_ok_and(|v| v == "1")
}

/// Whether GPU tests can run here; prints why not (or panics under `BRAZE_REQUIRE_CUDA=1`).
fn gpu_ready() -> bool {
    static SETUP: Once = Once::new();
    // Before any executable is built (they read it when built), and before any other test of
    // this process reads the environment (each calls this first).
    SETUP.call_once(|| std::env::set_var("BRAZE_POISON_OUTPUTS", "1"));
    if !braze_cuda::cuda_available() {
        assert!(!required(), "BRAZE_REQUIRE_CUDA=1 but no CUDA device is usable");
        println!("skipped: no CUDA device");
        return false;
    }
    if !braze_cuda::nvrtc_available() {
        assert!(!required(), "BRAZE_REQUIRE_CUDA=1 but NVRTC (libnvrtc) was not found");
        println!("skipped: NVRTC not found (set LD_LIBRARY_PATH to the directory holding libnvrtc)");
        return false;
    }
    true
}

fn gpu() -> Option<MutexGuard<'static, ()>> {
    gpu_ready().then(|| GPU_LOCK.lock().unwrap_or_else(|p| p.into_inner()))
}

// ---------------------------------------------------------------------------------------------
// Inputs

/// One random input: standard normals (ints in [-8, 8], bools), optionally with NaN, +-Inf and
/// signed zeros injected, optionally scaled and shifted.
#[derive(Clone, Debug)]
struct In {
    dtype: DType,
    shape: Vec<usize>,
    specials: bool,
    scale: f64,
    shift: f64,
}

fn t(dtype: DType, shape: &[usize]) -> In {
    In { dtype, shape: shape.to_vec(), specials: false, scale: 1.0, shift: 0.0 }
}

fn f32s(shape: &[usize]) -> In {
    t(DType::F32, shape)
}

impl In {
    fn specials(mut self) -> In {
        self.specials = true;
        self
    }

    fn scaled(mut self, scale: f64) -> In {
        self.scale = scale;
        self
    }

    /// Values around `shift` instead of 0. Inputs of sums: a sum of zero-mean values can cancel
    /// to nearly 0, where a relative tolerance is meaningless; around 1 the sum's own size bounds
    /// the error of any f32 summation order.
    fn shifted(mut self, shift: f64) -> In {
        self.shift = shift;
        self
    }
}

fn make_inputs(specs: &[In], seed: u64) -> Vec<HostTensor> {
    specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let s = seed.wrapping_mul(7919).wrapping_add(i as u64);
            let mut h = braze_cpu::random_tensor(spec.dtype, spec.shape.clone(), s);
            if spec.specials {
                braze_cpu::inject_specials(&mut h, s);
            }
            if spec.scale != 1.0 || spec.shift != 0.0 {
                let values: Vec<f64> = h.to_f64_vec().into_iter().map(|v| v * spec.scale + spec.shift).collect();
                h = HostTensor::from_f64(spec.dtype, spec.shape.clone(), &values).unwrap();
            }
            h
        })
        .collect()
}

fn on_gpu(host: &[HostTensor]) -> Vec<Tensor> {
    host.iter().map(|h| Tensor::from_host(h.clone()).to_device(GPU).expect("upload")).collect()
}

fn on_cpu(host: &[HostTensor]) -> Vec<Tensor> {
    host.iter().cloned().map(Tensor::from_host).collect()
}

// ---------------------------------------------------------------------------------------------
// Comparison

type Func = Arc<dyn Fn(&[Tensor]) -> braze::Result<Vec<Tensor>> + Send + Sync>;

fn func(f: impl Fn(&[Tensor]) -> braze::Result<Vec<Tensor>> + Send + Sync + 'static) -> Func {
    Arc::new(f)
}

/// Every output that differs from the reference, judged by `braze_cpu::assert_close_bounded`:
/// float outputs within the tolerance of the narrowest float dtype among `rounding` (the
/// function's input and output dtypes), against the reference or, where the inputs are f16/bf16,
/// against `wide` (the function on the inputs widened to f32, each output rounded once to its
/// dtype, as compiled kernels keep narrow intermediates in f32), with at most a few elements a
/// few ulps beyond it; NaN and Inf in the same places; integer and bool outputs exact.
fn mismatches(
    what: &str,
    got: &[Tensor],
    want: &[HostTensor],
    rounding: &[DType],
    wide: Option<&[HostTensor]>,
) -> Vec<String> {
    if got.len() != want.len() {
        return vec![format!("{what}: {} outputs, the reference has {}", got.len(), want.len())];
    }
    let mut found = Vec::new();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = match g.to_host() {
            Ok(g) => g,
            Err(e) => {
                found.push(format!("{what}: output {i}: reading it back: {e}"));
                continue;
            }
        };
        let bounds = Bounds::for_rounding(w.dtype(), rounding.iter().copied(), w.numel());
        if let Err(e) = assert_close_bounded(&g, w, wide.and_then(|wide| wide.get(i)), &bounds) {
            found.push(format!("{what}: output {i} ({}{}): {e}", w.dtype(), w.shape()));
        }
    }
    found
}

/// The function on the inputs widened to f32, each output rounded to the reference's dtype, when
/// some inputs are f16/bf16 (see [`mismatches`]).
fn wide_outputs(f: &Func, host: &[HostTensor], want: &[HostTensor]) -> Option<Vec<HostTensor>> {
    if !host.iter().any(|h| h.dtype().is_narrow_float()) {
        return None;
    }
    let wide: Vec<Tensor> = host
        .iter()
        .map(|h| {
            let t = Tensor::from_host(h.clone());
            if h.dtype().is_float() {
                t.cast(DType::F32)
            } else {
                Ok(t)
            }
        })
        .collect::<braze::Result<_>>()
        .ok()?;
    let outputs = f(&wide).ok()?;
    outputs.iter().zip(want).map(|(t, w)| t.cast(w.dtype()).ok()?.to_host().ok()).collect()
}

fn assert_outputs(what: &str, got: &[Tensor], want: &[HostTensor], rounding: &[DType]) {
    let found = mismatches(what, got, want, rounding, None);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Every output bit for bit equal to `want` (NaN where it has NaN).
fn assert_identical(what: &str, got: &[Tensor], want: &[HostTensor]) {
    assert_eq!(got.len(), want.len(), "{what}: outputs");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.to_host().unwrap_or_else(|e| panic!("{what}: output {i}: reading it back: {e}"));
        braze_cpu::assert_close_with(&g, w, 0.0, 0.0).unwrap_or_else(|e| panic!("{what}: output {i}: {e}"));
    }
}

fn host_outputs(outputs: braze::Result<Vec<Tensor>>, what: &str) -> Vec<HostTensor> {
    outputs
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .iter()
        .map(|t| t.to_host().unwrap_or_else(|e| panic!("{what}: {e}")))
        .collect()
}

/// A function checked on the GPU against the CPU reference.
struct Case {
    name: String,
    /// Runs on CPU tensors: the reference (eager, op by op, on the CPU reference backend).
    host: Func,
    /// The same function for GPU tensors (differs only when it captures tensors).
    dev: Func,
    inputs: Vec<In>,
    modes: &'static [Mode],
    eager: bool,
    fullgraph: bool,
    seeds: Vec<u64>,
}

impl Case {
    fn new(name: impl Into<String>, f: Func, inputs: Vec<In>) -> Case {
        Case {
            name: name.into(),
            host: f.clone(),
            dev: f,
            inputs,
            modes: BOTH_MODES,
            eager: true,
            fullgraph: true,
            seeds: vec![1, 2],
        }
    }

    fn pair(name: impl Into<String>, host: Func, dev: Func, inputs: Vec<In>) -> Case {
        Case { host, dev, ..Case::new(name, func(|_| Ok(vec![])), inputs) }
    }

    fn no_eager(mut self) -> Case {
        self.eager = false;
        self
    }

    fn modes(mut self, modes: &'static [Mode]) -> Case {
        self.modes = modes;
        self
    }

    fn lenient(mut self) -> Case {
        self.fullgraph = false;
        self
    }

    fn seeds(mut self, seeds: &[u64]) -> Case {
        self.seeds = seeds.to_vec();
        self
    }

    /// For each seed: the reference on the CPU, eager on the GPU (first seed), and each mode's
    /// compiled function (3 calls on the first seed, so reduce-overhead captures and then replays
    /// a CUDA graph; then the cached signature on the next seeds' new data).
    fn run(self) {
        let compiled: Vec<_> = self
            .modes
            .iter()
            .map(|&mode| {
                let dev = self.dev.clone();
                (mode, compile(move |a: &[Tensor]| dev(a)).fullgraph(self.fullgraph).mode(mode))
            })
            .collect();
        let mut failures = Vec::new();
        for (n, &seed) in self.seeds.iter().enumerate() {
            let host = make_inputs(&self.inputs, seed);
            let what = format!("{} (seed {seed})", self.name);
            let want = host_outputs((self.host)(&on_cpu(&host)), &format!("{what}: CPU reference"));
            let rounding: Vec<DType> =
                self.inputs.iter().map(|i| i.dtype).chain(want.iter().map(HostTensor::dtype)).collect();
            let wide = wide_outputs(&self.host, &host, &want);
            let wide = wide.as_deref();
            let inputs = on_gpu(&host);
            if self.eager && n == 0 {
                let label = format!("{what}: eager on the GPU");
                match (self.dev)(&inputs) {
                    Ok(got) => failures.extend(mismatches(&label, &got, &want, &rounding, wide)),
                    Err(e) => failures.push(format!("{label}: {e}")),
                }
            }
            for (mode, f) in &compiled {
                for call in 0..if n == 0 { 3 } else { 2 } {
                    let label = format!("{what}: compiled ({mode}), call {call}");
                    match f.call(&inputs) {
                        Ok(got) => failures.extend(mismatches(&label, &got, &want, &rounding, wide)),
                        Err(e) => failures.push(format!("{label}: {e}")),
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n"));
        for (mode, f) in &compiled {
            let stats = f.stats();
            assert_eq!(stats.traces, 1, "{} ({mode}): one signature traced once", self.name);
        }
    }
}

fn check(name: &str, f: Func, inputs: Vec<In>) {
    Case::new(name, f, inputs).run();
}

// ---------------------------------------------------------------------------------------------
// Workloads

/// `workloads::build(name, sizes)` as a case: inputs of the same shapes, fresh values.
fn workload_case(name: &str, sizes: &Sizes) -> Case {
    let w = workloads::build(name, sizes).unwrap();
    let inputs: Vec<In> = w
        .inputs
        .iter()
        .map(|x| {
            let shape = x.shape().dims().to_vec();
            // mlp_block and sync_demo scale their weights by 1/sqrt(fan in).
            let scale = match (name, x.shape().rank()) {
                ("mlp_block" | "sync_demo", 2) if shape != w.inputs[0].shape().dims() => 1.0 / (shape[0] as f64).sqrt(),
                _ => 1.0,
            };
            // Sums of values around 1 (see `In::shifted`).
            let shift = if name == "multisum" { 1.0 } else { 0.0 };
            t(x.dtype(), &shape).scaled(scale).shifted(shift)
        })
        .collect();
    let label = format!("{} {}", name, w.signature());
    Case::new(label, w.function.clone(), inputs)
}

/// `tiny_block` captures its weights, so the GPU function captures GPU copies of them.
fn tiny_block_case(rows: usize, hidden: usize, layers: usize, dtype: DType) -> Case {
    let weights = make_inputs(&vec![t(dtype, &[hidden]); 2 * layers], 77);
    let host_w: Vec<(Tensor, Tensor)> =
        weights.chunks(2).map(|p| (Tensor::from_host(p[0].clone()), Tensor::from_host(p[1].clone()))).collect();
    let dev_w: Vec<(Tensor, Tensor)> =
        host_w.iter().map(|(w, b)| (w.to_device(GPU).unwrap(), b.to_device(GPU).unwrap())).collect();
    let host = Arc::new(workloads::tiny_block(host_w));
    let dev = Arc::new(workloads::tiny_block(dev_w));
    Case::pair(
        format!("tiny_block {layers}L {rows}x{hidden} {dtype}"),
        func(move |a| host(a)),
        func(move |a| dev(a)),
        vec![t(dtype, &[rows, hidden])],
    )
}

#[test]
fn sanitizer_workloads_small() {
    let Some(_gpu) = gpu() else { return };
    let small = Sizes { rows: 3, hidden: 33, n: 1000, k: 20, lo: 1, hi: 500, layers: 4, ..Sizes::default() };
    workload_case("ln_relu_res", &small).run();
    workload_case("ln_relu_res", &Sizes { dtype: DType::BF16, ..small.clone() }).run();
    workload_case("ew_chain", &small).run();
    workload_case("ew_chain", &Sizes { dtype: DType::F16, ..small.clone() }).run();
    workload_case("multisum", &small).run();
    workload_case("mlp_block", &Sizes { rows: 3, hidden: 16, ..small.clone() }).run();
    tiny_block_case(5, 33, 16, DType::F32).run();
    // Split at its item() and to_bool(): lenient mode, three graphs.
    workload_case("sync_demo", &Sizes { rows: 3, hidden: 16, ..small }).lenient().modes(&[Mode::Default]).run();
}

#[test]
fn workloads_standard_ish_sizes() {
    let Some(_gpu) = gpu() else { return };
    let base = Sizes::default();
    workload_case("ln_relu_res", &Sizes { rows: 2048, hidden: 4096, ..base.clone() }).run();
    workload_case("ln_relu_res", &Sizes { rows: 2048, hidden: 4096, dtype: DType::BF16, ..base.clone() }).run();
    workload_case("ln_relu_res", &Sizes { rows: 4096, hidden: 1024, ..base.clone() }).run();
    workload_case("ew_chain", &Sizes { n: (1 << 22) + 7, ..base.clone() }).run();
    // Eager runs one kernel per distinct tensor size (thousands here): compiled only.
    workload_case("multisum", &Sizes { k: 2000, lo: 1000, hi: 30_000, ..base.clone() }).no_eager().run();
    workload_case("multisum", &Sizes { k: 10_000, lo: 100, hi: 1000, ..base.clone() }).no_eager().run();
    tiny_block_case(64, 256, 16, DType::F32).run();
    workload_case("mlp_block", &Sizes { rows: 64, hidden: 256, ..base.clone() }).run();
    // bf16 with hidden 1024 (inner 4096): cuBLASLt rounds `x @ w + b` once, the reference after
    // the matmul and again after the bias add, and the final layer norm scales such differences;
    // such elements are judged against the wide reference as well (see `mismatches`).
    workload_case("mlp_block", &Sizes { rows: 256, hidden: 1024, dtype: DType::BF16, ..base }).run();
}

#[test]
fn max_autotune_matches_reference() {
    let Some(_gpu) = gpu() else { return };
    let sizes = Sizes { rows: 33, hidden: 1000, n: 100_003, ..Sizes::default() };
    for name in ["ln_relu_res", "ew_chain"] {
        workload_case(name, &sizes).modes(&[Mode::MaxAutotune]).seeds(&[5]).run();
    }
}

// ---------------------------------------------------------------------------------------------
// Kernel families

#[test]
fn sanitizer_pointwise_broadcast_nan_inf() {
    let Some(_gpu) = gpu() else { return };
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let inputs = vec![t(dtype, &[3, 33]).specials(), t(dtype, &[33]).specials(), t(dtype, &[3, 1]).specials()];
        // In f16 and bf16 every op rounds, and a chain that cancels (a - b with a close to b)
        // turns one rounding step of difference into a large relative error: chains only in
        // f32, single ops on rounded operands otherwise.
        if dtype == DType::F32 {
            check(
                "arithmetic chain with broadcast f32",
                func(|a| {
                    let (x, y, z) = (&a[0], &a[1], &a[2]);
                    Ok(vec![x.add(y)?.mul(z)?.sub(&x.div(y)?)?, x.maximum(y)?.minimum(z)?])
                }),
                inputs.clone(),
            );
        }
        check(
            &format!("arithmetic with broadcast {dtype}"),
            func(|a| {
                let (x, y, z) = (&a[0], &a[1], &a[2]);
                let s = x.add(y)?;
                Ok(vec![s.clone(), s.mul(z)?, x.sub(z)?, x.div(y)?, x.maximum(y)?, x.minimum(z)?])
            }),
            inputs.clone(),
        );
        check(
            &format!("unary ops {dtype}"),
            func(|a| {
                let x = &a[0];
                Ok(vec![
                    x.exp()?.tanh()?,
                    x.abs()?.sqrt()?,
                    x.sigmoid()?,
                    x.silu()?,
                    x.gelu()?,
                    x.gelu_tanh()?,
                    x.neg()?.relu()?.add_scalar(1.0)?.rsqrt()?,
                    x.reciprocal()?,
                    x.abs()?.add_scalar(0.5)?.log()?,
                    x.pow_scalar(2.0)?,
                ])
            }),
            inputs[..1].to_vec(),
        );
    }
}

#[test]
fn sanitizer_multi_output_pointwise() {
    let Some(_gpu) = gpu() else { return };
    check(
        "three outputs sharing a subexpression, and a reshaped input",
        func(|a| {
            let s = a[0].add(&a[1])?;
            Ok(vec![s.mul(&a[0])?, s.relu()?, s.clone(), a[0].reshape([99])?])
        }),
        vec![f32s(&[3, 33]).specials(), f32s(&[3, 33]).specials()],
    );
}

fn ln_relu_res_inputs(rows: usize, hidden: usize, dtype: DType) -> Vec<In> {
    vec![t(dtype, &[rows, hidden]), t(dtype, &[hidden]), t(dtype, &[hidden]), t(dtype, &[rows, hidden])]
}

fn row_functions(rows: usize, hidden: usize, dtype: DType) {
    let shape = format!("{rows}x{hidden} {dtype}");
    check(
        &format!("layer_norm relu residual {shape}"),
        func(workloads::ln_relu_res),
        ln_relu_res_inputs(rows, hidden, dtype),
    );
    check(
        &format!("softmax last axis {shape}"),
        func(|a| Ok(vec![a[0].softmax(-1)?])),
        vec![t(dtype, &[rows, hidden]).scaled(3.0)],
    );
    check(
        &format!("rms_norm silu {shape}"),
        func(|a| Ok(vec![a[0].rms_norm(&a[1], 1e-6)?.silu()?])),
        vec![t(dtype, &[rows, hidden]), t(dtype, &[hidden])],
    );
}

#[test]
fn sanitizer_row_kernels_odd_sizes() {
    let Some(_gpu) = gpu() else { return };
    for (rows, hidden) in [(1, 1), (3, 31), (33, 768), (1, 1000), (3, 4097)] {
        row_functions(rows, hidden, DType::F32);
    }
    row_functions(3, 1000, DType::BF16);
    check("softmax over axis 0", func(|a| Ok(vec![a[0].softmax(0)?])), vec![f32s(&[33, 31])]);
    check("mean over the middle axis", func(|a| Ok(vec![a[0].mean(&[1], true)?.mul(&a[0])?])), vec![f32s(&[3, 33, 5])]);
}

#[test]
fn row_kernels_standard_sizes() {
    let Some(_gpu) = gpu() else { return };
    for (rows, hidden) in [(1000, 768), (33, 4096), (65, 4097), (8, 8192)] {
        row_functions(rows, hidden, DType::F32);
    }
    row_functions(1000, 1024, DType::BF16);
    row_functions(3, 4097, DType::F16);
}

fn reduction_functions(shape: &[usize], specials: bool) {
    let x = if specials { f32s(shape).specials() } else { f32s(shape) }.shifted(1.0);
    let name = format!("reductions of {shape:?}{}", if specials { " with NaN/Inf" } else { "" });
    check(
        &name,
        func(|a| {
            let x = &a[0];
            Ok(vec![
                x.sum(&[0], false)?,
                x.mean(&[-1], true)?,
                x.max_all()?,
                x.min(&[0, 1], false)?,
                x.sum_all()?,
                x.max(&[0], true)?,
            ])
        }),
        vec![x],
    );
}

#[test]
fn sanitizer_reductions() {
    let Some(_gpu) = gpu() else { return };
    for shape in [[1, 1], [33, 31], [1, 1000], [3, 4097], [1000, 3]] {
        reduction_functions(&shape, false);
    }
    reduction_functions(&[33, 31], true);
    check(
        "reductions over a 3-d tensor",
        func(|a| Ok(vec![a[0].sum(&[1], false)?, a[0].max(&[0, 2], true)?, a[0].mean(&[0, 1], false)?])),
        vec![f32s(&[3, 33, 5]).shifted(1.0)],
    );
    check(
        "bf16 sum and f16 mean",
        func(|a| Ok(vec![a[0].sum(&[0], false)?, a[1].mean_all()?])),
        vec![t(DType::BF16, &[33, 31]).scaled(0.1).shifted(0.5), t(DType::F16, &[3, 100]).shifted(1.0)],
    );
}

#[test]
fn reductions_large() {
    let Some(_gpu) = gpu() else { return };
    for shape in [[4097, 1000], [1, 1 << 20], [1 << 16, 7]] {
        reduction_functions(&shape, false);
    }
}

/// `stack([op(t) for t in ts])` over tensors of the given sizes, as one multi-reduce kernel.
fn multi_reduce(sizes: &[usize]) {
    let inputs: Vec<In> = sizes.iter().map(|&n| f32s(&[n]).shifted(1.0)).collect();
    check(
        &format!("sums of {} tensors of sizes {sizes:?}", sizes.len()),
        func(|a| {
            let sums = a.iter().map(Tensor::sum_all).collect::<braze::Result<Vec<_>>>()?;
            Ok(vec![Tensor::stack(&sums, 0)?])
        }),
        inputs.clone(),
    );
    check(
        &format!("squared norms and maxima of {} tensors", sizes.len()),
        func(|a| {
            let norms = a.iter().map(|t| t.mul(t)?.sum_all()).collect::<braze::Result<Vec<_>>>()?;
            let maxima = a.iter().map(Tensor::max_all).collect::<braze::Result<Vec<_>>>()?;
            Ok(vec![Tensor::stack(&norms, 0)?, Tensor::stack(&maxima, 0)?])
        }),
        inputs,
    );
}

#[test]
fn sanitizer_multi_reduce_with_empty_items() {
    let Some(_gpu) = gpu() else { return };
    multi_reduce(&[0, 1, 3, 33, 1000, 0, 4097]);
    multi_reduce(&[0]);
    multi_reduce(&[5; 40]);
}

#[test]
fn sanitizer_concat_stack() {
    let Some(_gpu) = gpu() else { return };
    check(
        "concat along axis 0",
        func(|a| Ok(vec![Tensor::concat(a, 0)?])),
        vec![f32s(&[3, 31]), f32s(&[1, 31]), f32s(&[33, 31])],
    );
    check("concat along axis 1", func(|a| Ok(vec![Tensor::concat(a, -1)?])), vec![f32s(&[3, 1]), f32s(&[3, 31])]);
    check("stack along axis 1", func(|a| Ok(vec![Tensor::stack(a, 1)?])), vec![f32s(&[5, 7]); 3]);
    check(
        "concat of computed parts, then an elementwise op",
        func(|a| Ok(vec![Tensor::concat(&[a[0].relu()?, a[1].exp()?], 0)?.mul_scalar(2.0)?])),
        vec![f32s(&[3, 33]).specials(), f32s(&[5, 33]).specials()],
    );
    check("concat of 20 bf16 pieces", func(|a| Ok(vec![Tensor::concat(a, 0)?])), vec![t(DType::BF16, &[3, 17]); 20]);
}

#[test]
fn sanitizer_permute_slice_loads() {
    let Some(_gpu) = gpu() else { return };
    check(
        "permute then add",
        func(|a| Ok(vec![a[0].permute(&[2, 0, 1])?.add(&a[1])?])),
        vec![f32s(&[3, 5, 7]), f32s(&[7, 3, 5])],
    );
    check("transpose then exp", func(|a| Ok(vec![a[0].transpose(0, 1)?.exp()?])), vec![f32s(&[33, 31])]);
    check(
        "strided slices",
        func(|a| Ok(vec![a[0].slice(1, 1, 31, 3)?.add_scalar(1.0)?, a[0].slice(0, 2, 33, 2)?.sum(&[1], false)?])),
        vec![f32s(&[33, 31])],
    );
    check(
        "broadcast_to and reshape of a permute",
        func(|a| {
            let b = a[1].broadcast_to([33, 31])?.mul(&a[0])?;
            let p = a[0].transpose(0, 1)?.reshape([31 * 33])?.tanh()?;
            Ok(vec![b, p])
        }),
        vec![f32s(&[33, 31]), f32s(&[1, 31])],
    );
}

fn matmul_bias_relu(a: &[Tensor]) -> braze::Result<Vec<Tensor>> {
    Ok(vec![a[0].matmul(&a[1])?.add(&a[2])?.relu()?])
}

#[test]
fn sanitizer_matmul_bias_relu() {
    let Some(_gpu) = gpu() else { return };
    check("matmul bias relu f32", func(matmul_bias_relu), vec![f32s(&[3, 31]), f32s(&[31, 33]), f32s(&[33])]);
    check("matmul 1x1", func(|a| Ok(vec![a[0].matmul(&a[1])?])), vec![f32s(&[1, 1]), f32s(&[1, 1])]);
    check("batched matmul", func(|a| Ok(vec![a[0].matmul(&a[1])?])), vec![f32s(&[2, 3, 31]), f32s(&[31, 5])]);
    check(
        "matmul with a transposed operand",
        func(|a| Ok(vec![a[0].matmul(&a[1].transpose(0, 1)?)?.add(&a[2])?.relu()?])),
        vec![f32s(&[3, 31]), f32s(&[33, 31]), f32s(&[33])],
    );
    // Weights scaled by 1/sqrt(k) keep the products near 1, where rounding the matmul before the
    // bias add (the reference) and after it (cuBLASLt's epilogue) differ by less than atol.
    check(
        "matmul bias relu bf16",
        func(matmul_bias_relu),
        vec![t(DType::BF16, &[33, 64]), t(DType::BF16, &[64, 31]).scaled(0.125), t(DType::BF16, &[31])],
    );
}

#[test]
fn matmul_standard_sizes() {
    let Some(_gpu) = gpu() else { return };
    check(
        "matmul bias gelu_tanh f32 1000x768x1000",
        func(|a| Ok(vec![a[0].matmul(&a[1])?.add(&a[2])?.gelu_tanh()?])),
        vec![f32s(&[1000, 768]), f32s(&[768, 1000]).scaled(1.0 / 768f64.sqrt()), f32s(&[1000])],
    );
    check(
        "matmul bias relu bf16 1024x1024x4096",
        func(matmul_bias_relu),
        vec![t(DType::BF16, &[1024, 1024]), t(DType::BF16, &[1024, 4096]).scaled(1.0 / 32.0), t(DType::BF16, &[4096])],
    );
}

#[test]
fn sanitizer_casts_int_ops_where_isnan() {
    let Some(_gpu) = gpu() else { return };
    check(
        "casts of floats with NaN/Inf",
        func(|a| {
            let x = &a[0];
            Ok(vec![
                x.cast(DType::I32)?,
                x.cast(DType::I64)?,
                x.cast(DType::Bool)?,
                x.cast(DType::F16)?,
                x.cast(DType::BF16)?.cast(DType::F32)?,
                x.isnan()?.cast(DType::F32)?,
            ])
        }),
        vec![f32s(&[3, 33]).specials().scaled(1e5)],
    );
    for dtype in [DType::I32, DType::I64] {
        check(
            &format!("integer ops {dtype}"),
            func(|a| {
                let (x, y) = (&a[0], &a[1]);
                Ok(vec![
                    x.add(y)?.mul(y)?.sub(x)?,
                    x.div(y)?,
                    x.maximum(y)?.minimum(&x.neg()?)?,
                    x.abs()?.relu()?,
                    x.lt(y)?,
                    x.eq(y)?,
                    x.add_scalar(3.0)?.cast(DType::F32)?.mul_scalar(0.5)?,
                    x.sum(&[1], false)?,
                    x.max(&[0], false)?,
                ])
            }),
            vec![t(dtype, &[3, 33]), t(dtype, &[33])],
        );
    }
    check(
        "where, isnan, isfinite, comparisons",
        func(|a| {
            let (x, y) = (&a[0], &a[1]);
            Ok(vec![
                Tensor::where_(&x.isnan()?, y, x)?,
                x.isfinite()?,
                x.isnan()?.logical_not()?,
                Tensor::where_(&x.gt(y)?, x, &y.mul_scalar(2.0)?)?,
                x.cast(DType::Bool)?.cast(DType::BF16)?,
            ])
        }),
        vec![f32s(&[3, 33]).specials(), f32s(&[3, 1]).specials()],
    );
}

#[test]
fn sanitizer_zero_size_tensors() {
    let Some(_gpu) = gpu() else { return };
    check("pointwise on [0, 31]", func(|a| Ok(vec![a[0].add(&a[1])?.exp()?])), vec![f32s(&[0, 31]), f32s(&[31])]);
    check(
        "reductions over empty axes",
        func(|a| {
            Ok(vec![
                a[0].sum(&[1], false)?,
                a[0].mean(&[1], false)?,
                a[0].max(&[1], true)?,
                a[1].sum_all()?,
                a[1].min_all()?,
            ])
        }),
        vec![f32s(&[3, 0]), f32s(&[0, 31])],
    );
    check(
        "layer_norm and softmax of zero rows",
        func(|a| Ok(vec![a[0].layer_norm(&a[1], &a[2], 1e-5)?.relu()?, a[3].softmax(-1)?])),
        vec![f32s(&[0, 64]), f32s(&[64]), f32s(&[64]), f32s(&[0, 5])],
    );
    check("matmul with k = 0", func(|a| Ok(vec![a[0].matmul(&a[1])?])), vec![f32s(&[3, 0]), f32s(&[0, 4])]);
    check(
        "concat with an empty part",
        func(|a| Ok(vec![Tensor::concat(a, 0)?.mul_scalar(3.0)?])),
        vec![f32s(&[0, 31]), f32s(&[3, 31])],
    );
}

// ---------------------------------------------------------------------------------------------
// Runtime behaviour

/// Writes new values into a GPU tensor's own buffer: same address, new data.
fn refill(tensor: &Tensor, host: &HostTensor) {
    let device = braze::cuda_device(0).unwrap();
    let buffer = tensor.cuda_buffer().expect("a CUDA tensor");
    device.upload_into(&buffer, 0, &host.to_bytes()).unwrap();
}

/// Reduce-overhead (CUDA graph replay) against the same function with direct launches, over
/// `steps` calls with new values in the same input buffers each time; the previous call's outputs
/// are held and checked after the next call.
fn replay_against_direct(name: &str, f: Func, specs: &[In], steps: u64) {
    let ro = {
        let f = f.clone();
        compile(move |a: &[Tensor]| f(a)).fullgraph(true).mode(Mode::ReduceOverhead)
    };
    let direct = {
        let f = f.clone();
        compile(move |a: &[Tensor]| f(a)).fullgraph(true).mode(Mode::Default)
    };
    let first = make_inputs(specs, 1000);
    let inputs = on_gpu(&first);
    let addresses: Vec<u64> = inputs.iter().map(|t| t.cuda_buffer().unwrap().device_address()).collect();
    let rounding: Vec<DType> = specs.iter().map(|s| s.dtype).collect();
    let mut previous: Option<(Vec<Tensor>, Vec<HostTensor>)> = None;
    for step in 0..steps {
        let host = make_inputs(specs, 1000 + step);
        for (tensor, values) in inputs.iter().zip(&host) {
            refill(tensor, values);
        }
        let got = ro.call(&inputs).unwrap_or_else(|e| panic!("{name} step {step}: {e}"));
        let want = host_outputs(direct.call(&inputs), &format!("{name} step {step}: direct"));
        assert_identical(&format!("{name} step {step}: graph replay vs direct launches"), &got, &want);
        if step % 40 == 0 || step + 1 == steps {
            let reference = host_outputs(f(&on_cpu(&host)), "CPU reference");
            assert_outputs(&format!("{name} step {step}: graph replay vs CPU reference"), &got, &reference, &rounding);
        }
        if let Some((old, old_values)) = previous.take() {
            assert_identical(
                &format!("{name} step {step}: outputs of step {} after this call", step - 1),
                &old,
                &old_values,
            );
        }
        previous = Some((got, want));
    }
    let now: Vec<u64> = inputs.iter().map(|t| t.cuda_buffer().unwrap().device_address()).collect();
    assert_eq!(addresses, now, "the inputs kept their buffers");
    assert_eq!(ro.stats().traces, 1);
    assert_eq!(ro.stats().cache_hits as u64, steps - 1, "every call after the first was served by the cache");
}

#[test]
fn cuda_graph_replay_matches_direct_launches() {
    let Some(_gpu) = gpu() else { return };
    replay_against_direct(
        "layer norm chain with two outputs",
        func(|a| {
            let y = a[0].layer_norm(&a[1], &a[2], 1e-5)?.relu()?.add(&a[0])?;
            Ok(vec![y.sum(&[0], false)?, y.tanh()?])
        }),
        &[f32s(&[33, 1000]), f32s(&[1000]), f32s(&[1000])],
        200,
    );
    let sizes = [1usize, 7, 100, 1000, 0, 4097, 33, 2, 250, 3];
    let specs: Vec<In> = sizes.iter().cycle().take(50).map(|&n| f32s(&[n])).collect();
    replay_against_direct(
        "multisum of 50 tensors",
        func(|a| {
            let sums = a.iter().map(Tensor::sum_all).collect::<braze::Result<Vec<_>>>()?;
            Ok(vec![Tensor::stack(&sums, 0)?])
        }),
        &specs,
        200,
    );
}

#[test]
fn sanitizer_cuda_graph_replay_short() {
    let Some(_gpu) = gpu() else { return };
    replay_against_direct("ln_relu_res 3x33", func(workloads::ln_relu_res), &ln_relu_res_inputs(3, 33, DType::F32), 6);
}

#[test]
fn outputs_are_never_overwritten_by_later_calls() {
    let Some(_gpu) = gpu() else { return };
    let specs = [f32s(&[33, 100]), f32s(&[100])];
    let function = |a: &[Tensor]| Ok(vec![a[0].mul(&a[1])?.exp()?, a[0].sum(&[1], false)?]);
    for mode in [Mode::Default, Mode::ReduceOverhead] {
        let f = compile(function).fullgraph(true).mode(mode);
        // More results held at once than the executable keeps output sets for; half of the calls
        // reuse one set of input tensors (so reduce-overhead replays a graph).
        let fixed = on_gpu(&make_inputs(&specs, 499));
        let mut held = Vec::new();
        for seed in 0..10u64 {
            let host = make_inputs(&specs, 500 + seed);
            let want = host_outputs(function(&on_cpu(&host)), "CPU reference");
            let got = if seed % 2 == 0 {
                f.call(&on_gpu(&host)).unwrap()
            } else {
                for (tensor, values) in fixed.iter().zip(&host) {
                    refill(tensor, values);
                }
                f.call(&fixed).unwrap()
            };
            held.push((seed, got, want));
        }
        for (seed, got, want) in &held {
            assert_outputs(&format!("{mode}: result of call {seed} after all 10 calls"), got, want, &[DType::F32]);
        }
    }
}

#[test]
fn device_allocations_flat_after_warmup() {
    let Some(_gpu) = gpu() else { return };
    let device = braze::cuda_device(0).unwrap();
    let inputs = on_gpu(&make_inputs(&ln_relu_res_inputs(64, 256, DType::F32), 9));
    for mode in [Mode::Default, Mode::ReduceOverhead] {
        let f = compile(workloads::ln_relu_res).fullgraph(true).mode(mode);
        for _ in 0..5 {
            drop(f.call(&inputs).unwrap());
        }
        device.synchronize().unwrap();
        let before = device.allocation_count();
        for _ in 0..100 {
            drop(f.call(&inputs).unwrap());
        }
        device.synchronize().unwrap();
        assert_eq!(device.allocation_count(), before, "{mode}: device allocations over 100 calls after warm-up");
    }
}

#[test]
fn one_signature_compiles_once() {
    let Some(_gpu) = gpu() else { return };
    let inputs = on_gpu(&make_inputs(&ln_relu_res_inputs(33, 100, DType::F32), 10));
    let f = compile(workloads::ln_relu_res).fullgraph(true);
    drop(f.call(&inputs).unwrap());
    let kernels = braze::kernel_cache_stats();
    for _ in 1..100 {
        drop(f.call(&inputs).unwrap());
    }
    let stats = f.stats();
    assert_eq!((stats.traces, stats.graphs_compiled, stats.cache_hits), (1, 1, 99), "{stats:?}");
    let after = braze::kernel_cache_stats();
    assert_eq!(after.compiles, kernels.compiles, "no NVRTC compile after the first call");
    assert_eq!(
        (after.memory_hits, after.disk_hits),
        (kernels.memory_hits, kernels.disk_hits),
        "no kernel cache lookup after the first call"
    );
}

/// Set in the child processes of `disk_kernel_cache_second_process_compiles_nothing`.
const CHILD_FLAG: &str = "BRAZE_CONFORMANCE_CACHE_CHILD";

/// The child's work: compile and run a function of two kernels, print the kernel cache counters.
#[test]
fn disk_cache_child() {
    if std::env::var_os(CHILD_FLAG).is_none() {
        println!("runs only as a child process of disk_kernel_cache_second_process_compiles_nothing");
        return;
    }
    let Some(_gpu) = gpu() else { return };
    let inputs = on_gpu(&make_inputs(&[f32s(&[33, 100]), f32s(&[100]), f32s(&[100])], 11));
    let f = compile(|a: &[Tensor]| {
        let y = a[0].layer_norm(&a[1], &a[2], 1e-5)?.relu()?;
        Ok(vec![y.sum(&[0], false)?, a[0].mul_scalar(2.0)?.exp()?])
    })
    .fullgraph(true);
    let out = f.call(&inputs).unwrap();
    for o in &out {
        o.to_host().unwrap();
    }
    let stats = braze::kernel_cache_stats();
    println!("child-cache-stats compiles={} disk_hits={}", stats.compiles, stats.disk_hits);
}

#[test]
fn disk_kernel_cache_second_process_compiles_nothing() {
    let Some(_gpu) = gpu() else { return };
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let dir = std::env::temp_dir().join(format!("braze-conformance-cache-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let run_child = || -> (u64, u64) {
        let output = std::process::Command::new(&exe)
            .args(["--exact", "disk_cache_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_FLAG, "1")
            .env("BRAZE_CACHE_DIR", &dir)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(output.status.success(), "child failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
        let line = stdout
            .lines()
            .find_map(|l| l.split("child-cache-stats ").nth(1))
            .unwrap_or_else(|| panic!("no counters in the child's output:\n{stdout}"));
        let field = |name: &str| -> u64 {
            line.split_whitespace().find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok()).unwrap()
        };
        (field("compiles"), field("disk_hits"))
    };
    let (first_compiles, first_hits) = run_child();
    let (second_compiles, second_hits) = run_child();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        first_compiles >= 1 && first_hits == 0,
        "first process, empty cache: {first_compiles} compiles, {first_hits} disk hits"
    );
    assert_eq!(second_compiles, 0, "second process compiled kernels again");
    assert_eq!(second_hits, first_compiles, "second process loaded every kernel from disk");
}
