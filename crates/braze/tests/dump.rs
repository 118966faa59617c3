//! `BRAZE_DUMP` writes every compiled graph, plan, kernel and the break reports; `BRAZE_LOG`
//! topics parse.
//! The dump directory is read once per process, so this file holds the only test that sets it.

use braze::logging::{parse_topics, targets};
use braze_workloads::{self as workloads, Sizes};
use std::fs;
use std::path::Path;

/// `files` must exist in `dir`, each containing every listed fragment.
fn check(dir: &Path, files: &[(&str, &[&str])]) {
    for (name, fragments) in files {
        let text = fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        for fragment in *fragments {
            assert!(text.contains(fragment), "{name} lacks `{fragment}`:\n{text}");
        }
    }
}

#[test]
fn dump_writes_graphs_and_break_reports() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("braze-dump-test");
    let _ = fs::remove_dir_all(&dir);
    std::env::set_var("BRAZE_DUMP", &dir);

    let sizes = Sizes { rows: 2, hidden: 4, ..Sizes::default() };
    let ln = workloads::build("ln_relu_res", &sizes).unwrap();
    ln.compile().fullgraph(true).call(&ln.inputs).unwrap();
    let demo = workloads::build("sync_demo", &sizes).unwrap();
    demo.compile().call(&demo.inputs).unwrap();

    let kernel_files: Vec<String> = fs::read_dir(dir.join("kernels"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let row_kernel =
        kernel_files.iter().find(|f| f.starts_with("row_layer_norm") && f.ends_with(".cu")).expect("a row kernel file");
    check(&dir.join("kernels"), &[(row_kernel.as_str(), &["extern \"C\" __global__", "layer_norm"])]);
    check(
        &dir,
        &[
            ("graph-0.txt", &["layer_norm %0, %1, %2, eps=1e-5 : f32[2,4]  @ crates/workloads/src/definition.rs:"]),
            ("graph-0.json", &["\"kind\": \"layer_norm\"", "\"line\":"]),
            ("graph-1.txt", &["matmul"]),
            ("graph-3.json", &["\"op\": \"sub\""]),
            ("plan-0.txt", &["plan: 1 kernel", "kernel 0: row_"]),
            ("plan.txt", &["# plan 0", "# plan 1", "matmul"]),
            (
                "breaks.txt",
                &[
                    "`ln_relu_res` (f32[2,4], f32[4], f32[4], f32[2,4]): 0 break(s)",
                    "`sync_demo` (f32[2,4], f32[4,4]): 2 break(s)",
                    "break: host_read at crates/workloads/src/workload.rs:",
                    "break: bool_coercion at crates/workloads/src/workload.rs:",
                ],
            ),
        ],
    );
}

#[test]
fn log_topics() {
    assert_eq!(parse_topics("graph, breaks"), (vec![targets::BREAKS, targets::GRAPH], vec![]));
    let (all, unknown) = parse_topics("all,nope");
    assert_eq!(all.len(), 7);
    assert!(all.contains(&targets::SYNCS));
    assert_eq!(unknown, vec!["nope".to_string()]);
}
