//! The standard optimization pipeline: dead code and decomposition once, then simplification,
//! common subexpressions and dead code until nothing changes, then recomputation of cheap
//! forward activations in the backward of a joint graph and of the elementwise prologues of full
//! reductions that other kernels read too.

use crate::decompose::{self, Origins};
use crate::pass::{check, Pass, PassManager};
use crate::{CommonSubexpressions, DeadCode, Decompose, Recompute, ReductionPrologues, Result, Simplify};
use braze_ir::Graph;

impl PassManager {
    /// The standard pipeline: dead code and decomposition once, then simplification, common
    /// subexpressions and dead code until nothing changes.
    pub fn standard() -> PassManager {
        PassManager::new().once(vec![Box::new(DeadCode), Box::new(Decompose)]).until_fixed_point(cleanup())
    }
}

fn cleanup() -> Vec<Box<dyn Pass>> {
    vec![Box::new(Simplify), Box::new(CommonSubexpressions), Box::new(DeadCode)]
}

/// Runs the standard pipeline ([`PassManager::standard`]) on a copy of `graph`.
pub fn optimize(graph: &Graph) -> Result<Graph> {
    Ok(optimize_with_origins(graph)?.0)
}

/// [`optimize`], also returning which composite each decomposed node came from.
pub(crate) fn optimize_with_origins(graph: &Graph) -> Result<(Graph, Origins)> {
    if cfg!(debug_assertions) {
        graph.verify()?;
    }
    let mut g = graph.clone();
    let mut origins = Origins::new();
    DeadCode.run(&mut g)?;
    check(DeadCode.name(), &g)?;
    decompose::decompose(&mut g, &mut origins)?;
    check(Decompose.name(), &g)?;
    PassManager::new().until_fixed_point(cleanup()).run(&mut g)?;
    // After common subexpressions, which would merge a recomputed copy back into its original.
    for pass in [&Recompute as &dyn Pass, &ReductionPrologues] {
        if pass.run(&mut g)? {
            check(pass.name(), &g)?;
            DeadCode.run(&mut g)?;
        }
    }
    tracing::debug!(target: "braze::graph", "optimized graph:\n{}", g.to_text());
    Ok((g, origins))
}
