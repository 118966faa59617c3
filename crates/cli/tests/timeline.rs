//! `BRAZE_TRACE` writes a Chrome trace when the CLI exits, and `braze timeline` summarizes it.

use std::process::Command;

#[test]
fn braze_timeline_summarizes_a_saved_trace() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let trace = dir.path().join("trace.json");
    let explain = Command::new(env!("CARGO_BIN_EXE_braze"))
        .args(["explain", "ln_relu_res", "--device", "cpu", "--rows", "8", "--hidden", "16"])
        .env("BRAZE_TRACE", &trace)
        .env("BRAZE_CACHE_DIR", dir.path().join("cache"))
        .output()
        .expect("braze runs");
    let stderr = String::from_utf8_lossy(&explain.stderr);
    assert!(explain.status.success(), "{stderr}");
    assert!(stderr.contains("braze timeline:") && stderr.contains("GPU busy:"), "the summary at exit: {stderr}");

    let text = std::fs::read_to_string(&trace).expect("the trace was written");
    let json: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let events = json["traceEvents"].as_array().expect("traceEvents");
    assert!(events.iter().any(|e| e["ph"] == "X" && e["cat"] == "call"), "a call span");
    assert!(events.iter().any(|e| e["ph"] == "X" && e["pid"] == 2), "a device span");

    let summary = Command::new(env!("CARGO_BIN_EXE_braze")).arg("timeline").arg(&trace).output().expect("braze runs");
    let stdout = String::from_utf8_lossy(&summary.stdout);
    assert!(summary.status.success(), "{}", String::from_utf8_lossy(&summary.stderr));
    assert!(stdout.contains("spans (") && stdout.contains(" device)"), "{stdout}");
    assert!(stdout.contains("GPU busy: "), "{stdout}");

    std::fs::write(dir.path().join("bad.json"), "{\"traceEvents\": 3}").expect("written");
    let bad = Command::new(env!("CARGO_BIN_EXE_braze"))
        .arg("timeline")
        .arg(dir.path().join("bad.json"))
        .output()
        .expect("braze runs");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("traceEvents"), "a clear error");
}
