//! Shared by the GPU test files.

use braze::{compile, DType, Device, Mode, Result, Tensor};
use braze_cpu::compare::{assert_close_bounded, Bounds};
use std::sync::Once;

/// The first CUDA device, with output poisoning on; `None` (and a note) without one, unless
/// `BRAZE_REQUIRE_CUDA=1` makes that a failure. Every GPU test calls this first: executables read
/// the poisoning setting when they are built.
pub fn gpu() -> Option<Device> {
    static POISON: Once = Once::new();
    POISON.call_once(|| std::env::set_var("BRAZE_POISON_OUTPUTS", "1"));
    if braze_cuda::cuda_available() {
        return Some(Device::cuda(0).expect("a CUDA device is available"));
    }
    assert!(std::env::var_os("BRAZE_REQUIRE_CUDA").is_none_or(|v| v != "1"), "BRAZE_REQUIRE_CUDA=1 but no CUDA device");
    println!("skipped: no CUDA device");
    None
}

/// A function a GPU test checks: inputs in, outputs out.
#[allow(dead_code)] // not every GPU test file checks functions
pub type F = fn(&[Tensor]) -> Result<Vec<Tensor>>;

/// Runs `f` eagerly on the CPU (the reference) and on the inputs widened to f32 (the wide
/// reference: kernels keep narrow intermediates in f32), then compiled in every mode (three
/// calls each) and eagerly on the GPU, each output judged with the tolerance of `narrowest`.
#[allow(dead_code)] // not every GPU test file checks functions
pub fn check(name: &str, f: F, inputs: &[Tensor], narrowest: DType) {
    let Some(gpu) = gpu() else { return };
    let want: Vec<_> = f(inputs).unwrap().iter().map(|t| t.to_host().unwrap()).collect();
    let wide_inputs: Vec<Tensor> =
        inputs.iter().map(|t| if t.dtype().is_float() { t.cast(DType::F32).unwrap() } else { t.clone() }).collect();
    let wide: Vec<_> = f(&wide_inputs)
        .unwrap()
        .iter()
        .zip(&want)
        .map(|(t, w)| t.cast(w.dtype()).unwrap().to_host().unwrap())
        .collect();
    let on_gpu: Vec<Tensor> = inputs.iter().map(|t| t.to_device(gpu).unwrap()).collect();
    let compare = |label: &str, got: Vec<Tensor>| {
        assert_eq!(got.len(), want.len(), "{name} {label}");
        for (j, ((g, w), wide)) in got.iter().zip(&want).zip(&wide).enumerate() {
            assert_eq!(g.device(), gpu, "{name} {label}: result left the GPU");
            let bounds = Bounds::for_rounding(w.dtype(), [narrowest], w.numel());
            let g = g.to_host().unwrap();
            assert_close_bounded(&g, w, Some(wide), &bounds)
                .unwrap_or_else(|e| panic!("{name} {label} output {j}: {e}"));
        }
    };
    for mode in [Mode::Default, Mode::ReduceOverhead, Mode::MaxAutotune] {
        let compiled = compile(f).fullgraph(true).mode(mode);
        for call in 0..3 {
            compare(&format!("{mode:?} call {call}"), compiled.call(&on_gpu).unwrap());
        }
    }
    compare("eager", f(&on_gpu).unwrap());
}
