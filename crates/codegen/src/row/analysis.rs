//! Which values of a row kernel's body are per row, how deep in reductions each one is, and in
//! which passes each element value is needed (and so whether it is kept in registers).

use crate::body::{live_values, users};
use braze_plan::{Body, Expr, RowKernel};

/// Which values are per row, how deep in reductions each value is, and in which passes each
/// element value is needed.
pub(crate) struct RowAnalysis {
    pub(crate) per_row: Vec<bool>,
    /// Reductions on the longest path to the value (a reduction counts itself).
    pub(crate) depth: Vec<usize>,
    /// Passes that reduce (1..=rounds); pass `rounds + 1` stores element outputs.
    pub(crate) rounds: usize,
    pub(crate) live: Vec<bool>,
    /// For element values: the passes that evaluate them, ascending.
    pub(crate) needed: Vec<Vec<usize>>,
    /// Element values kept in registers from their first pass on.
    pub(crate) cached: Vec<bool>,
    pub(crate) has_element_stores: bool,
}

impl RowAnalysis {
    /// The analysis of `row`'s body; its partials' values are element outputs of the last pass
    /// like its element stores.
    pub(crate) fn of(row: &RowKernel, cached_mode: bool) -> RowAnalysis {
        let partials: Vec<braze_plan::ValueId> = row.partials.iter().map(|p| p.value).collect();
        RowAnalysis::new(&row.body, row.outer.len(), cached_mode, &partials)
    }

    pub(crate) fn new(
        body: &Body,
        outer_rank: usize,
        cached_mode: bool,
        partials: &[braze_plan::ValueId],
    ) -> RowAnalysis {
        let n = body.values.len();
        let per_row = body.row_values(outer_rank);
        let live = live_values(body, body.stores.iter().map(|s| s.value).chain(partials.iter().copied()));
        let mut depth = vec![0; n];
        for (id, value) in body.values.iter().enumerate() {
            let deepest = value.expr.operands().iter().map(|o| depth[o.0]).max().unwrap_or(0);
            depth[id] = if matches!(value.expr, Expr::Reduce { .. }) { deepest + 1 } else { deepest };
        }
        let rounds = (0..n)
            .filter(|&id| live[id] && matches!(body.values[id].expr, Expr::Reduce { .. }))
            .map(|id| depth[id])
            .max()
            .unwrap_or(0);
        let final_pass = rounds + 1;
        let users = users(body);
        let mut stored_elements = vec![false; n];
        for value in body.stores.iter().map(|s| s.value).chain(partials.iter().copied()) {
            if !per_row[value.0] {
                stored_elements[value.0] = true;
            }
        }
        let mut needed: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut cached = vec![false; n];
        for id in (0..n).rev() {
            if !live[id] || per_row[id] {
                continue;
            }
            let mut passes = Vec::new();
            if stored_elements[id] {
                passes.push(final_pass);
            }
            for &user in &users[id] {
                if !live[user] {
                    continue;
                }
                if matches!(body.values[user].expr, Expr::Reduce { .. }) {
                    passes.push(depth[user]);
                } else if !per_row[user] {
                    if cached[user] {
                        passes.push(needed[user][0]);
                    } else {
                        passes.extend(&needed[user]);
                    }
                }
            }
            passes.sort();
            passes.dedup();
            cached[id] = cached_mode && passes.len() >= 2;
            needed[id] = passes;
        }
        RowAnalysis {
            per_row,
            depth,
            rounds,
            live,
            needed,
            cached,
            has_element_stores: stored_elements.iter().any(|&s| s) || !partials.is_empty(),
        }
    }

    /// Most reductions any one pass folds (the accumulators a thread keeps at once).
    pub(crate) fn widest_round(&self, body: &Body) -> usize {
        (1..=self.rounds)
            .map(|round| {
                (0..body.values.len())
                    .filter(|&id| {
                        self.live[id] && self.depth[id] == round && matches!(body.values[id].expr, Expr::Reduce { .. })
                    })
                    .count()
            })
            .max()
            .unwrap_or(0)
    }

    /// Most cached arrays alive at once (between two passes): the register pressure of caching.
    pub(crate) fn peak_cached_arrays(&self) -> usize {
        (1..=self.rounds + 1)
            .map(|boundary| {
                (0..self.cached.len())
                    .filter(|&id| {
                        self.cached[id]
                            && self.needed[id][0] <= boundary
                            && boundary <= *self.needed[id].last().unwrap()
                    })
                    .count()
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braze_ir::{BinaryOp, DType, Literal, ReduceOp};

    #[test]
    fn layer_norm_caches_the_input_and_the_centred_values() {
        // mean = sum(x) * c; d = x - mean; var = sum(d * d) * c; y = d * var
        let mut body = Body::default();
        let x = body.push(Expr::Load { input: 0, offset: 0, strides: vec![8, 1] }, DType::F32);
        let s = body.push(Expr::Reduce { op: ReduceOp::Sum, x }, DType::F32);
        let c = body.push(Expr::Const { value: Literal::Float(0.125) }, DType::F32);
        let mean = body.push(Expr::Binary { op: BinaryOp::Mul, a: s, b: c }, DType::F32);
        let d = body.push(Expr::Binary { op: BinaryOp::Sub, a: x, b: mean }, DType::F32);
        let dd = body.push(Expr::Binary { op: BinaryOp::Mul, a: d, b: d }, DType::F32);
        let v = body.push(Expr::Reduce { op: ReduceOp::Sum, x: dd }, DType::F32);
        let y = body.push(Expr::Binary { op: BinaryOp::Mul, a: d, b: v }, DType::F32);
        body.stores.push(braze_plan::Store { value: y, output: 0 });
        let a = RowAnalysis::new(&body, 1, true, &[]);
        assert_eq!(a.rounds, 2);
        assert_eq!(a.needed[x.0], vec![1, 2]);
        assert_eq!(a.needed[d.0], vec![2, 3]);
        assert!(a.cached[x.0] && a.cached[d.0] && !a.cached[dd.0] && !a.cached[y.0]);
        assert_eq!(a.peak_cached_arrays(), 2);
        let uncached = RowAnalysis::new(&body, 1, false, &[]);
        assert_eq!(uncached.needed[x.0], vec![1, 2, 3]);
        assert!(!uncached.cached.iter().any(|&c| c));
    }
}
