//! Every kernel snapshot in the top-level `snapshots/kernels/` (written by braze-codegen's tests)
//! compiles through NVRTC for sm_90 with no register spills and no local-memory stack, and so
//! does every other autotune candidate config of the same fixture plans.
//!
//! Without NVRTC the test prints `skipped: NVRTC not found` and passes, unless
//! `BRAZE_REQUIRE_NVRTC=1` asks for a hard failure.

#[path = "../../codegen/tests/plans/mod.rs"]
mod plans;

use braze_codegen::{candidate_configs, generate, KernelCode, Target};
use braze_cuda::nvrtc::{compile, nvrtc_available, CompileOptions};
use std::path::{Path, PathBuf};

fn snapshot_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../snapshots/kernels")
}

/// The snapshotted text of an insta `.snap` file: everything after its `---` header block.
fn snapshot_body(text: &str) -> Option<&str> {
    let header = text.strip_prefix("---\n")?;
    let end = header.find("\n---\n")?;
    Some(&header[end + "\n---\n".len()..])
}

/// Local-memory stack a kernel may have: none, except the few words that `sinf`/`cosf` keep for
/// the argument reduction of huge inputs (Payne-Hanek, on a cold path), as every CUDA kernel
/// that calls them does.
fn allowed_stack(source: &str) -> u32 {
    if source.contains("sinf(") || source.contains("cosf(") {
        32
    } else {
        0
    }
}

/// Whether NVRTC is here: if not, a skip is printed, or a failure under `BRAZE_REQUIRE_NVRTC=1`.
fn nvrtc_enabled() -> bool {
    if nvrtc_available() {
        return true;
    }
    assert!(
        std::env::var("BRAZE_REQUIRE_NVRTC").as_deref() != Ok("1"),
        "NVRTC not found, and BRAZE_REQUIRE_NVRTC=1 requires it (set LD_LIBRARY_PATH to its lib folder)"
    );
    println!("skipped: NVRTC not found");
    false
}

#[test]
fn every_kernel_snapshot_compiles_without_spills() {
    if !nvrtc_enabled() {
        return;
    }
    let mut paths: Vec<PathBuf> = std::fs::read_dir(snapshot_dir())
        .expect("snapshots/kernels exists")
        .map(|entry| entry.expect("readable directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "snap"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no kernel snapshots in {}", snapshot_dir().display());

    let options = CompileOptions::default();
    let mut failures = Vec::new();
    for path in &paths {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(path).expect("readable snapshot");
        let Some(source) = snapshot_body(&text) else {
            failures.push(format!("{file}: not an insta snapshot"));
            continue;
        };
        failures.extend(compile_checked(&file, source, &file.replace(".snap", ".cu"), &options));
    }
    assert!(failures.is_empty(), "{} of {} snapshots failed:\n{}", failures.len(), paths.len(), failures.join("\n"));
}

/// Compiles `source` and returns what is wrong with it: a compile error, no kernels, or a kernel
/// that spills or keeps more stack than [`allowed_stack`].
fn compile_checked(what: &str, source: &str, file_name: &str, options: &CompileOptions) -> Vec<String> {
    let module = match compile(source, file_name, options) {
        Ok(module) => module,
        Err(err) => return vec![format!("{what}: {err}")],
    };
    if module.resources.is_empty() {
        return vec![format!("{what}: ptxas reported no kernels")];
    }
    let mut failures = Vec::new();
    for kernel in &module.resources {
        println!(
            "{what:40} {:45} {:>3} registers, {:>4} B smem, {} B spill stores, {} B spill loads, {} B stack ({:.0} ms)",
            kernel.kernel,
            kernel.registers,
            kernel.shared_bytes,
            kernel.spill_stores,
            kernel.spill_loads,
            kernel.stack_bytes,
            module.compile_ms
        );
        if kernel.spill_stores > 0 || kernel.spill_loads > 0 || kernel.stack_bytes > allowed_stack(source) {
            failures.push(format!(
                "{what}: `{}` spills ({} B stored, {} B loaded, {} B stack)",
                kernel.kernel, kernel.spill_stores, kernel.spill_loads, kernel.stack_bytes
            ));
        }
    }
    failures
}

/// The snapshots hold each fixture's default config; the autotuner also times the others, so
/// every one of them must compile without spills too.
#[test]
fn every_candidate_config_of_the_fixture_plans_compiles_without_spills() {
    if !nvrtc_enabled() {
        return;
    }
    let target = Target::h200();
    let options = CompileOptions::default();
    let (mut compiled, mut failures) = (0, Vec::new());
    for (name, plan) in plans::all_plans() {
        for (i, config) in candidate_configs(&plan, 0, &target).into_iter().enumerate().skip(1) {
            let what = format!("{name} candidate {i} ({config})");
            match generate(&plan, 0, &config, &target) {
                Ok(KernelCode::Cuda(kernel)) => {
                    failures.extend(compile_checked(&what, &kernel.source, &format!("{}.cu", kernel.name), &options));
                    compiled += 1;
                }
                Ok(KernelCode::CuBlasLt(_)) => {}
                Err(err) => failures.push(format!("{what}: {err}")),
            }
        }
    }
    assert!(compiled >= 20, "only {compiled} non-default candidates compiled");
    assert!(failures.is_empty(), "{} candidate kernels failed:\n{}", failures.len(), failures.join("\n"));
}
