//! Running the `braze` binary from a test.

use std::process::Command;

/// Runs `braze` with `args` and a kernel cache of its own, and returns its stdout; a non-zero
/// exit fails the test with both outputs.
pub fn braze_stdout(args: &[&str]) -> String {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = Command::new(env!("CARGO_BIN_EXE_braze"))
        .args(args)
        .env("BRAZE_CACHE_DIR", dir.path().join("cache"))
        .output()
        .expect("braze runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    stdout
}
