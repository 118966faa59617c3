//! `braze explain WORKLOAD --strict` on the CPU at small sizes: the training steps trace to one
//! graph with no breaks, and the report gives kernels, launches, peak memory and what is saved
//! for backward.

mod common;

/// Runs `braze explain` with `args` on the CPU and returns its stdout, failing on a non-zero exit.
fn explain(args: &[&str]) -> String {
    let args: Vec<&str> =
        ["explain"].into_iter().chain(args.iter().copied()).chain(["--strict", "--device", "cpu"]).collect();
    common::braze_stdout(&args)
}

/// The line starting with `prefix`, without it.
fn field<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines().find_map(|l| l.strip_prefix(prefix)).unwrap_or_else(|| panic!("no `{prefix}` line:\n{text}"))
}

fn count(text: &str, prefix: &str) -> usize {
    field(text, prefix).split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{text}"))
}

/// What both training steps report: one whole graph, many kernels each launched once per call,
/// and the memory lines.
fn assert_one_strict_graph(text: &str, name: &str) {
    assert!(text.contains(&format!("function: {name} (mode: default, fullgraph: true)")), "{text}");
    assert_eq!(field(text, "graphs: "), "1", "{text}");
    assert_eq!(field(text, "breaks: "), "0", "{text}");
    assert!(!text.contains("\nbreak: "), "no break listed: {text}");
    assert_eq!(field(text, "host syncs: "), "0 per step", "{text}");
    assert_eq!(field(text, "recompiles: "), "0", "{text}");
    let kernels = count(text, "kernels: ");
    assert!(kernels > 10, "a training step fuses into tens of kernels: {text}");
    assert_eq!(count(text, "launches: "), kernels, "one launch per kernel: {text}");
    let peak = field(text, "peak memory: ");
    for part in [" a call (", " inputs and captured tensors, ", " outputs, ", " intermediates)"] {
        assert!(peak.contains(part), "peak memory line: {peak}");
    }
    let saved = field(text, "saved for backward: ");
    let buffers: usize = saved
        .strip_suffix(" buffers")
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("saved for backward line: {saved}"));
    assert!(buffers > 0, "activations are saved for the backward: {saved}");
}

#[test]
fn explain_mlp_step_strict_is_one_graph_without_breaks() {
    let text = explain(&["mlp_step", "--rows", "8", "--hidden", "32"]);
    assert!(text.starts_with("mlp_step(x: f32[8,32], target: f32[8,32]) on cpu"), "the sizes given: {text}");
    assert_one_strict_graph(&text, "mlp_step");
}

#[test]
fn explain_gpt2_step_strict_is_one_graph_without_breaks() {
    // On the CPU, GPT-2's step is at its small sizes.
    let text = explain(&["gpt2_step"]);
    assert!(text.starts_with("gpt2_step(idx: i64[") && text.contains(" on cpu\n"), "{text}");
    assert_one_strict_graph(&text, "gpt2_step");
}
