//! Shared by the GPU test files.

use braze::Device;
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
