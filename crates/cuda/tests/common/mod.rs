//! Skip-or-fail logic shared by the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use braze_cuda::{cuda_available, nvrtc_available, CudaDevice};

fn required(variable: &str) -> bool {
    std::env::var(variable).is_ok_and(|v| v == "1")
}

/// Whether NVRTC tests can run. Prints why not and returns false, unless
/// `BRAZE_REQUIRE_NVRTC=1` (set in CI), in which case a missing NVRTC fails the test.
pub fn nvrtc_ready() -> bool {
    if nvrtc_available() {
        return true;
    }
    let message = "NVRTC not found (set LD_LIBRARY_PATH to the directory holding \
                   libnvrtc.so.13, e.g. `source .ci/install-nvrtc.sh`)";
    if required("BRAZE_REQUIRE_NVRTC") {
        panic!("BRAZE_REQUIRE_NVRTC=1 but {message}");
    }
    println!("skipped: {message}");
    false
}

/// The GPU to test on, or `None` (after printing why) when there is none. With
/// `BRAZE_REQUIRE_CUDA=1` a missing GPU fails the test instead. GPU tests compile their kernels,
/// so NVRTC is required too.
pub fn gpu() -> Option<Arc<CudaDevice>> {
    if !cuda_available() {
        if required("BRAZE_REQUIRE_CUDA") {
            panic!("BRAZE_REQUIRE_CUDA=1 but no CUDA device is usable");
        }
        println!("skipped: no CUDA device");
        return None;
    }
    if !nvrtc_ready() {
        return None;
    }
    Some(CudaDevice::new(0).expect("opening CUDA device 0"))
}

/// Compiles `source` for `device`'s architecture and returns kernel `name` from it.
pub fn load_kernel(device: &CudaDevice, source: &str, name: &str) -> braze_cuda::Kernel {
    let opts = braze_cuda::CompileOptions { arch: device.arch(), ..braze_cuda::CompileOptions::default() };
    let compiled = braze_cuda::compile(source, &format!("{name}.cu"), &opts).unwrap_or_else(|err| panic!("{err}"));
    device.load_module(&compiled).expect("loading module").get_function(name).expect("kernel in module")
}

/// Deterministic pseudo-random floats in `[-1, 1)`, none of them zero.
pub fn random_floats(count: usize, seed: u64) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            let v: f32 = rng.random_range(-1.0..1.0);
            if v.abs() < 1e-3 {
                0.5
            } else {
                v
            }
        })
        .collect()
}

/// Asserts two float slices agree within `abs + rel * |expected|`, reporting the worst index.
pub fn assert_close(got: &[f32], expected: &[f32], abs: f32, rel: f32) {
    assert_eq!(got.len(), expected.len(), "length");
    for (index, (&g, &e)) in got.iter().zip(expected).enumerate() {
        assert!((g - e).abs() <= abs + rel * e.abs(), "element {index}: got {g}, expected {e}");
    }
}
