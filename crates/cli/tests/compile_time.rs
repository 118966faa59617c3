//! `braze compile-time` traces a workload without running it and times every host stage of its
//! cold compile, with no GPU.

mod common;

use common::braze_stdout;

fn stage_ms(text: &str, stage: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(stage))?.split_whitespace().nth(stage.split_whitespace().count())?.parse().ok()
}

#[test]
fn gpt2_step_small_reports_every_stage() {
    let text = braze_stdout(&["compile-time", "gpt2_step", "--small", "--no-nvrtc"]);
    for stage in ["setup", "trace", "passes", "fusion", "memory plan", "codegen", "total"] {
        assert!(stage_ms(&text, stage).is_some(), "no time for {stage}:\n{text}");
    }
    assert!(text.contains("nvrtc") && text.contains("skipped"), "{text}");
    let counts = text.lines().find(|l| l.starts_with("counts: ")).unwrap_or_else(|| panic!("{text}"));
    let kernels: usize = counts["counts: ".len()..].split_whitespace().next().unwrap().parse().unwrap();
    assert!(kernels > 10, "{counts}");
}

#[test]
fn nvrtc_compiles_each_distinct_unit_once_cold_and_none_warm() {
    if std::env::var_os("BRAZE_REQUIRE_NVRTC").is_none() && !braze_cuda::nvrtc_available() {
        return;
    }
    let text = braze_stdout(&["compile-time", "ln_relu_res"]);
    assert!(stage_ms(&text, "nvrtc").is_some(), "{text}");
    let counts = text.lines().find(|l| l.starts_with("counts: ")).unwrap_or_else(|| panic!("{text}"));
    assert!(counts.ends_with("1 kernels, 1 CUDA C, 1 distinct units, 1 NVRTC compiles"), "{counts}");
    let warm = text.lines().find(|l| l.starts_with("cache (disk)")).unwrap();
    assert!(warm.contains("warm: 0 NVRTC compiles, 1 disk hits"), "{warm}");
}

#[test]
fn memory_lists_each_kernel_and_what_is_alive_at_the_peak() {
    let args =
        ["compile-time", "mlp_step", "--no-nvrtc", "--memory", "--rows", "2048", "--hidden", "128", "--dtype", "bf16"];
    let text = braze_stdout(&args);
    assert!(text.contains("(x: bf16[2048,128]"), "the sizes given: {text}");
    let per_kernel: Vec<f64> = text
        .lines()
        .skip_while(|l| !l.contains("live MiB"))
        .skip(1)
        .take_while(|l| !l.starts_with("alive during"))
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(per_kernel.len() > 10, "{text}");
    let peak = per_kernel.iter().copied().fold(0.0, f64::max);
    let heading = text.lines().find(|l| l.starts_with("alive during kernel")).unwrap_or_else(|| panic!("{text}"));
    assert!(heading.contains(&format!("({peak:.1} MiB)")), "{heading} vs {peak}");
    // The first layer's h, [2048, 512] bf16 (2 MiB), held for the backward.
    assert!(text.contains("bf16 x1048576 written by 0 read by"), "{text}");
    let memory_plan = text.lines().find(|l| l.starts_with("memory plan")).unwrap();
    assert!(memory_plan.contains("saved for backward"), "{memory_plan}");
}
