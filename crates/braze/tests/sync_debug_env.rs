//! `BRAZE_SYNC_DEBUG` gives the starting sync debug mode; `set_sync_debug_mode` replaces it. Its
//! own test binary: the variable is read once per process, on the first use of the mode.

use braze::{set_sync_debug_mode, sync_debug_mode, Error, SyncDebugMode, Tensor};

#[test]
fn braze_sync_debug_sets_the_starting_mode() {
    // The one test of this binary sets the variable before anything reads the mode.
    std::env::set_var("BRAZE_SYNC_DEBUG", "Error");
    assert_eq!(sync_debug_mode(), SyncDebugMode::Error);
    let one = Tensor::scalar(1.0f32);
    assert!(matches!(one.item::<f32>(), Err(Error::HostSync { .. })));
    set_sync_debug_mode(SyncDebugMode::Off);
    assert_eq!(sync_debug_mode(), SyncDebugMode::Off);
    assert_eq!(one.item::<f32>().unwrap(), 1.0);
}
