//! Reviewable output: `tracing` events with one target per topic, the `BRAZE_LOG` shorthand, and
//! the `BRAZE_DUMP` directory.
//!
//! `BRAZE_LOG=graph,breaks,recompiles` (or `all`) installs a `tracing-subscriber` fmt subscriber
//! on stderr with those topics at debug level (and every braze warning), unless the application
//! installed a subscriber first; then the application's filters decide, as for any other crate.
//! `BRAZE_SYNC_DEBUG=warn` without `BRAZE_LOG` installs it with warnings only.
//!
//! `BRAZE_DUMP=<dir>` writes every compiled graph as `graph-<n>.txt` (with source locations) and
//! `graph-<n>.json`, every fused plan as `plan-<n>.txt` (all of them also in `plan.txt`), every
//! kernel as `kernels/<name>.cu`, and appends each traced signature's break report to
//! `breaks.txt`. Failing to write is a warning, never an error.

use crate::GraphBreak;
use braze_ir::Graph;
use std::fs::{self, OpenOptions};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The `tracing` targets, one per topic.
pub mod targets {
    /// Every traced graph, as text with source locations.
    pub const GRAPH: &str = "braze::graph";
    /// Every graph break: kind, op, location, hint.
    pub const BREAKS: &str = "braze::breaks";
    /// Why a compiled function traced again, and recompile-limit fallbacks.
    pub const RECOMPILES: &str = "braze::recompiles";
    /// Fusion plans.
    pub const PLAN: &str = "braze::plan";
    /// Generated kernels.
    pub const KERNELS: &str = "braze::kernels";
    /// Autotuning candidates and choices.
    pub const AUTOTUNE: &str = "braze::autotune";
    /// Host synchronizations in eager code, warned in [`crate::SyncDebugMode::Warn`].
    pub const SYNCS: &str = "braze::syncs";

    /// Topic names as `BRAZE_LOG` spells them, with their targets.
    pub const TOPICS: [(&str, &str); 7] = [
        ("graph", GRAPH),
        ("breaks", BREAKS),
        ("recompiles", RECOMPILES),
        ("plan", PLAN),
        ("kernels", KERNELS),
        ("autotune", AUTOTUNE),
        ("syncs", SYNCS),
    ];
}

/// Installs the `BRAZE_LOG` subscriber once per process, if asked for (`BRAZE_SYNC_DEBUG=warn`
/// asks for it too, showing warnings only, so its warnings are seen).
pub(crate) fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        if let Ok(spec) = std::env::var("BRAZE_LOG") {
            install(&spec);
        } else if std::env::var("BRAZE_SYNC_DEBUG").is_ok_and(|v| v.trim().eq_ignore_ascii_case("warn")) {
            install("");
        }
    });
}

fn install(spec: &str) {
    let (topics, unknown) = parse_topics(spec);
    // Warnings from any braze target always show; the chosen topics show at debug level.
    let mut filter = Targets::new().with_target("braze", Level::WARN);
    for target in topics {
        filter = filter.with_target(target, Level::DEBUG);
    }
    let installed = tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal()))
        .with(filter)
        .try_init()
        .is_ok();
    if installed && !unknown.is_empty() {
        let known: Vec<&str> = targets::TOPICS.iter().map(|(name, _)| *name).collect();
        tracing::warn!(
            target: "braze",
            "BRAZE_LOG: unknown topic(s) {}; known: {}, all",
            unknown.join(", "),
            known.join(", ")
        );
    }
}

/// Splits a `BRAZE_LOG` value into targets and unknown names.
pub fn parse_topics(spec: &str) -> (Vec<&'static str>, Vec<String>) {
    let mut chosen = Vec::new();
    let mut unknown = Vec::new();
    for name in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if name == "all" {
            chosen.extend(targets::TOPICS.iter().map(|(_, target)| *target));
        } else if let Some((_, target)) = targets::TOPICS.iter().find(|(topic, _)| *topic == name) {
            chosen.push(*target);
        } else {
            unknown.push(name.to_string());
        }
    }
    chosen.sort_unstable();
    chosen.dedup();
    (chosen, unknown)
}

fn dump_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| std::env::var_os("BRAZE_DUMP").filter(|d| !d.is_empty()).map(PathBuf::from)).as_deref()
}

/// Logs and dumps a graph about to be compiled for `function`.
pub(crate) fn graph_compiled(graph: &Graph, function: &str) {
    tracing::debug!(
        target: targets::GRAPH,
        "compiling a graph of `{function}` ({} ops):\n{}",
        graph.op_count(),
        graph.to_text_with_locations()
    );
    let Some(dir) = dump_dir() else { return };
    static NEXT_GRAPH: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT_GRAPH.fetch_add(1, Ordering::Relaxed);
    let written = fs::create_dir_all(dir)
        .and_then(|_| fs::write(dir.join(format!("graph-{n}.txt")), graph.to_text_with_locations()))
        .and_then(|_| fs::write(dir.join(format!("graph-{n}.json")), graph.to_json()));
    if let Err(e) = written {
        tracing::warn!(target: "braze", "BRAZE_DUMP: cannot write graph-{n} into {}: {e}", dir.display());
    }
}

/// Appends the break report of one traced signature to `breaks.txt`.
pub(crate) fn breaks_traced(function: &str, signature: &str, breaks: &[GraphBreak]) {
    let Some(dir) = dump_dir() else { return };
    let mut report = format!("`{function}` {signature}: {} break(s)\n", breaks.len());
    for b in breaks {
        report.push_str(&format!("  break: {b}\n"));
    }
    let written = fs::create_dir_all(dir).and_then(|_| {
        let mut file = OpenOptions::new().create(true).append(true).open(dir.join("breaks.txt"))?;
        file.write_all(report.as_bytes())
    });
    if let Err(e) = written {
        tracing::warn!(target: "braze", "BRAZE_DUMP: cannot write breaks.txt into {}: {e}", dir.display());
    }
}

/// Logs a fused plan and its kernels, and dumps them as `plan-<n>.txt` (also appended to
/// `plan.txt`) and `kernels/<name>.cu`.
pub(crate) fn plan_compiled(plan: &braze_plan::Plan, kernels: &[(String, String)]) {
    tracing::debug!(target: targets::PLAN, "fused plan:\n{plan}");
    for (name, source) in kernels {
        tracing::debug!(target: targets::KERNELS, "kernel `{name}`:\n{source}");
    }
    let Some(dir) = dump_dir() else { return };
    static NEXT_PLAN: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT_PLAN.fetch_add(1, Ordering::Relaxed);
    let kernel_dir = dir.join("kernels");
    let mut written = fs::create_dir_all(&kernel_dir)
        .and_then(|_| fs::write(dir.join(format!("plan-{n}.txt")), plan.to_string()))
        .and_then(|_| {
            // plan.txt collects every plan of the process in order, for a quick read.
            let mut all = OpenOptions::new().create(true).append(true).open(dir.join("plan.txt"))?;
            writeln!(all, "# plan {n}\n{plan}")
        });
    for (name, source) in kernels {
        written = written.and_then(|_| fs::write(kernel_dir.join(format!("{name}.cu")), source));
    }
    if let Err(e) = written {
        tracing::warn!(target: "braze", "BRAZE_DUMP: cannot write plan-{n} into {}: {e}", dir.display());
    }
}
