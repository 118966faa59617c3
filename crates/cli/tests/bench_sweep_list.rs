//! `braze bench --sweep ... --list` prints the sweep's cases without a GPU; flag misuse is a
//! clear error before any device is touched.

use std::process::{Command, Output};

fn braze(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_braze")).args(args).output().expect("running braze")
}

fn stdout_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

#[test]
fn rows_list_prints_every_case_without_a_gpu() {
    let out = braze(&["bench", "--sweep", "rows", "--list"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = stdout_lines(&out);
    // 3 workloads x 3 dtypes x (8 hidden sizes + the long rows), then the total.
    assert_eq!(lines.len(), 81 + 1, "{lines:#?}");
    assert!(lines.last().unwrap().starts_with("81 cases"), "{}", lines.last().unwrap());
    let has = |workload: &str, shape: &str, dtype: &str| {
        lines.iter().any(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            fields.len() > 3 && fields[0] == workload && fields[1] == shape && fields[2] == dtype
        })
    };
    assert!(has("ln_gelu_res", "32768x768", "f32"));
    assert!(has("rms_silu_res", "1024x50257", "bf16"));
    assert!(has("softmax_mask", "64x65536", "f16"));
}

#[test]
fn pointwise_list_shrinks_with_sweep_max_mb() {
    let full = stdout_lines(&braze(&["bench", "--sweep", "pointwise", "--list"]));
    assert_eq!(full.len(), 36 + 1);
    assert!(full.iter().any(|l| l.starts_with("pw_outer") && l.contains("65536x4096")));
    let small = braze(&["bench", "--sweep", "pointwise", "--list", "--sweep-max-mb", "20"]);
    assert!(small.status.success());
    let small = stdout_lines(&small);
    assert_eq!(small.len(), 12 + 1, "{small:#?}");
    for line in &small[..12] {
        let mb: f64 = line.split_whitespace().nth(3).unwrap().parse().unwrap();
        assert!(mb <= 20.0, "{line}");
    }
}

#[test]
fn only_picks_workloads_of_the_sweep() {
    let out = braze(&["bench", "--sweep", "rows", "--only", "softmax_mask", "--list"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = stdout_lines(&out);
    assert_eq!(lines.len(), 27 + 1, "{lines:#?}");
    assert!(lines[..27].iter().all(|l| l.starts_with("softmax_mask ")));
    let out = braze(&["bench", "--sweep", "rows", "--only", "pw_row", "--list"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no workload of this sweep"));
}

#[test]
fn list_without_a_sweep_and_a_bad_sweep_name_are_errors() {
    let out = braze(&["bench", "--list"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--sweep rows|pointwise"));
    let out = braze(&["bench", "--sweep", "columns", "--list"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected rows or pointwise"));
    let out = braze(&["bench", "--sweep", "rows", "--list", "--sweep-max-mb", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("positive"));
}
