//! The pass interface and the pass manager.

use crate::{PassError, Result};
use braze_ir::Graph;

/// A graph rewrite. Passes are plain values; `run` reports whether it changed the graph.
pub trait Pass {
    fn name(&self) -> &'static str;
    fn run(&self, g: &mut Graph) -> Result<bool>;
}

/// The IR text before and after one pass that changed the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct PassSnapshot {
    pub pass: &'static str,
    pub before: String,
    pub after: String,
}

struct Stage {
    passes: Vec<Box<dyn Pass>>,
    fixed_point: bool,
}

/// Runs stages of passes in order: a stage runs once, or repeats until no pass changes the graph.
/// In debug builds (and tests) the graph is verified after every pass, so a pass that breaks it
/// is named where it happens.
#[derive(Default)]
pub struct PassManager {
    stages: Vec<Stage>,
    record: bool,
    snapshots: Vec<PassSnapshot>,
}

/// Rounds after which a fixed-point stage stops even if a pass still reports changes.
const MAX_ROUNDS: usize = 16;

impl PassManager {
    pub fn new() -> PassManager {
        PassManager::default()
    }

    /// Adds a stage that runs each pass once.
    pub fn once(mut self, passes: Vec<Box<dyn Pass>>) -> PassManager {
        self.stages.push(Stage { passes, fixed_point: false });
        self
    }

    /// Adds a stage that repeats its passes until none changes the graph.
    pub fn until_fixed_point(mut self, passes: Vec<Box<dyn Pass>>) -> PassManager {
        self.stages.push(Stage { passes, fixed_point: true });
        self
    }

    /// Keeps the IR text before and after every pass that changes the graph.
    pub fn recording(mut self) -> PassManager {
        self.record = true;
        self
    }

    pub fn snapshots(&self) -> &[PassSnapshot] {
        &self.snapshots
    }

    /// Runs every stage; returns whether any pass changed the graph.
    pub fn run(&mut self, g: &mut Graph) -> Result<bool> {
        let mut changed = false;
        for stage in &self.stages {
            for round in 0.. {
                let mut round_changed = false;
                for pass in &stage.passes {
                    let before = self.record.then(|| g.to_text());
                    let pass_changed = pass.run(g)?;
                    check(pass.name(), g)?;
                    if pass_changed {
                        if let Some(before) = before {
                            self.snapshots.push(PassSnapshot { pass: pass.name(), before, after: g.to_text() });
                        }
                    }
                    round_changed |= pass_changed;
                }
                changed |= round_changed;
                if !stage.fixed_point || !round_changed {
                    break;
                }
                if round + 1 == MAX_ROUNDS {
                    tracing::debug!(target: "braze::graph", "passes still changing the graph after {MAX_ROUNDS} rounds");
                    break;
                }
            }
        }
        Ok(changed)
    }
}

/// Verifies the graph after `pass` in debug builds.
pub(crate) fn check(pass: &'static str, g: &Graph) -> Result<()> {
    if cfg!(debug_assertions) {
        g.verify().map_err(|source| PassError::InvalidGraph { pass, source })?;
    }
    Ok(())
}
