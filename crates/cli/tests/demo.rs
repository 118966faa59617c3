//! `braze demo` on the CPU (its small sizes there; about 15 s in a debug build): every workload's
//! trace, breaks, fused plan, timings and check against the reference, then the naive training
//! loop beside the braze one, ending with the naive loop's syncs and their source lines.

mod common;

/// The number in the column `col` (0: naive, 1: braze) of the table row starting with `row`.
fn cell(table: &str, row: &str, col: usize) -> f64 {
    let line = table.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no `{row}` row:\n{table}"));
    let value = line[row.len()..].split_whitespace().nth(col).unwrap_or_else(|| panic!("{line}"));
    value.trim_end_matches('%').parse().unwrap_or_else(|_| panic!("{line}"))
}

#[test]
fn demo_on_the_cpu_shows_every_part_and_ends_with_the_loop_table() {
    let text = common::braze_stdout(&["demo", "--device", "cpu"]);
    assert!(text.starts_with("braze demo on the CPU"), "{text}");

    // Each fused workload: trace, plan with its kernels, timings and the reference check.
    for name in ["ln_relu_res", "ew_chain", "multisum", "tiny_block", "mlp_block"] {
        let start = text.find(&format!("== {name}(")).unwrap_or_else(|| panic!("no {name} section:\n{text}"));
        let section = &text[start..start + text[start..].find("\n\n").unwrap_or(text.len() - start)];
        assert!(section.contains("traced: 1 graph(s), ") && section.contains(" 0 breaks"), "{section}");
        assert!(section.contains("  graph(%0: ") && section.contains("    return %"), "the graph: {section}");
        assert!(section.contains("\nplan: ") && section.contains("\n  kernel 0: "), "the plan: {section}");
        assert!(section.contains("\ntime: eager (CPU reference interpreter) "), "{section}");
        assert!(section.contains("compiled vs CPU reference: ") && section.contains("within tolerance"), "{section}");
    }
    // The graph breaks, lenient then strict.
    let breaks = &text[text.find("== sync_demo(").unwrap_or_else(|| panic!("no sync_demo:\n{text}"))..];
    assert!(breaks.contains("\nbreaks: 2\n"), "{breaks}");
    assert!(breaks.contains("\nbreak: host_read at ") && breaks.contains("\nbreak: bool_coercion at "), "{breaks}");
    assert!(breaks.contains("-- strict: fullgraph(true) stops at the first break --"), "{breaks}");
    assert!(breaks.contains("error: graph break in fullgraph mode: `item` at "), "{breaks}");
    assert!(text.contains("the cost of a cached call ==\n") && text.contains("\ncached call (host clock"), "{text}");

    // The loop comparison is the last section.
    let last = text.rfind("\n== ").unwrap();
    assert!(text[last..].starts_with("\n== keeping the GPU busy: mlp_step "), "{}", &text[last..]);
    let table = &text[last..];
    let header = table.lines().find(|l| l.contains("naive loop")).unwrap_or_else(|| panic!("{table}"));
    assert!(header.trim_start().starts_with("naive loop") && header.trim_end().ends_with("braze loop"), "{header}");
    for col in 0..2 {
        let busy = cell(table, "GPU busy", col);
        assert!((0.0..=100.0).contains(&busy), "GPU busy is a percentage: {table}");
        assert!(cell(table, "steps/s", col) > 0.0, "{table}");
    }
    assert!(cell(table, "host syncs per step", 0) >= 2.0, "the naive loop syncs every step: {table}");
    assert_eq!(cell(table, "host syncs per step", 1), 0.0, "the braze loop does not: {table}");

    // Then every sync of the naive loop: where it is and the source line itself.
    let syncs = &table[table.find("every sync of the naive loop (").unwrap_or_else(|| panic!("{table}"))..];
    // After its heading only (site, source line) pairs, then at most the largest gap: the end.
    let mut lines: Vec<&str> = syncs.lines().skip(1).collect();
    if lines.last().is_some_and(|l| l.starts_with("the naive loop's largest gap: ")) {
        lines.pop();
    }
    let chunks = lines.chunks_exact(2);
    assert!(lines.len() >= 4 && chunks.remainder().is_empty(), "sync sites and their source lines:\n{syncs}");
    let pairs: Vec<(&str, &str)> = chunks.map(|p| (p[0].trim(), p[1].trim())).collect();
    for (site, _) in &pairs {
        assert!(site.starts_with("crates/cli/src/busy.rs:") && site.contains(": sync `"), "{site}:\n{syncs}");
    }
    for (op, code) in [("to_host", "loss.to_host()?"), ("to_bool", ".to_bool()?")] {
        let (_, source) = pairs
            .iter()
            .find(|(site, _)| site.contains(&format!("sync `{op}` x")))
            .unwrap_or_else(|| panic!("no `{op}` sync:\n{syncs}"));
        assert!(source.contains(code), "the source line of the `{op}` sync: {source}");
    }
}
