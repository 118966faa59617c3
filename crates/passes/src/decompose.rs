//! Composites to primitives, so fusion sees through them: layer_norm, rms_norm, (log_)softmax and mean
//! become sums, maxima and elementwise ops, and an integer or bool sum (an i64) becomes a sum of
//! its operand cast to i64, so every reduction after this pass reduces values of its own dtype.
//! Every node a decomposition creates carries the composite's source location. f16/bf16
//! composites compute in f32: the decomposition casts to f32 first and back at the end, so a
//! fused kernel does not round every intermediate.

use crate::{Pass, PassError, Result};
use braze_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, Shape, SourceLoc, UnaryOp};
use std::collections::HashMap;

/// For each node a decomposition created, the composite it came from (`"layer_norm"`, ...). Kernel
/// names are built from it.
pub(crate) type Origins = HashMap<NodeId, &'static str>;

#[derive(Clone, Copy, Debug, Default)]
pub struct Decompose;

impl Pass for Decompose {
    fn name(&self) -> &'static str {
        "decompose"
    }

    fn run(&self, g: &mut Graph) -> Result<bool> {
        decompose(g, &mut Origins::new())
    }
}

/// Whether the graph holds an op that [`Decompose`] rewrites.
pub(crate) fn needs_decomposition(g: &Graph) -> bool {
    g.node_ids().into_iter().any(|id| decomposed_name(g, id).is_some())
}

fn decomposed_name(g: &Graph, id: NodeId) -> Option<&'static str> {
    let node = g.node(id);
    match node.op {
        Op::LayerNorm { .. } => Some("layer_norm"),
        Op::RmsNorm { .. } => Some("rms_norm"),
        Op::Softmax { .. } => Some("softmax"),
        Op::LogSoftmax { .. } => Some("log_softmax"),
        Op::CrossEntropy { .. } => Some("cross_entropy"),
        Op::Reduce { op: ReduceOp::Mean, .. } => Some("mean"),
        Op::Reduce { op: ReduceOp::Sum, .. } if g.node(node.operands[0]).dtype != node.dtype => Some("sum"),
        _ => None,
    }
}

/// Decomposes every composite, recording where each new node came from.
pub(crate) fn decompose(g: &mut Graph, origins: &mut Origins) -> Result<bool> {
    let mut changed = false;
    for id in g.topo_order() {
        let Some(origin) = decomposed_name(g, id) else { continue };
        let node = g.node(id).clone();
        let mut b = Builder { g, loc: node.loc.clone(), origin, origins };
        let result = b.expand(&node.op, &node.operands, node.dtype)?;
        g.replace_all_uses(id, result);
        g.remove(id)?;
        changed = true;
    }
    Ok(changed)
}

/// Adds nodes that all carry one composite's location and origin.
struct Builder<'a> {
    g: &'a mut Graph,
    loc: Option<SourceLoc>,
    origin: &'static str,
    origins: &'a mut Origins,
}

impl Builder<'_> {
    fn tag(&mut self, id: NodeId) -> NodeId {
        self.g.set_loc(id, self.loc.clone());
        self.origins.insert(id, self.origin);
        id
    }

    fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId> {
        let id = self.g.add(Op::Binary { op }, &[a, b], self.loc.clone())?;
        Ok(self.tag(id))
    }

    fn unary(&mut self, op: UnaryOp, x: NodeId) -> Result<NodeId> {
        let id = self.g.add(Op::Unary { op }, &[x], self.loc.clone())?;
        Ok(self.tag(id))
    }

    fn constant(&mut self, value: f64, dtype: DType) -> NodeId {
        let id = self.g.constant(value, dtype);
        self.tag(id)
    }

    fn reduce(&mut self, op: ReduceOp, x: NodeId, axes: Vec<usize>, keepdim: bool) -> Result<NodeId> {
        let id = self.g.add(Op::Reduce { op, axes, keepdim }, &[x], self.loc.clone())?;
        Ok(self.tag(id))
    }

    /// `x` as `dtype`, adding a cast only when it differs.
    fn cast(&mut self, x: NodeId, dtype: DType) -> Result<NodeId> {
        if self.g.node(x).dtype == dtype {
            return Ok(x);
        }
        let id = self.g.cast(x, dtype)?;
        Ok(self.tag(id))
    }

    fn shape(&self, x: NodeId) -> Shape {
        self.g.node(x).shape.clone()
    }

    fn expand(&mut self, op: &Op, operands: &[NodeId], dtype: DType) -> Result<NodeId> {
        // f16/bf16 are storage types: compute in f32 and round once at the end.
        let compute = if dtype.is_narrow_float() { DType::F32 } else { dtype };
        let x = self.cast(operands[0], compute)?;
        let shape = self.shape(x);
        let last = vec![shape.rank().saturating_sub(1)];
        let result = match op {
            Op::LayerNorm { eps } => {
                let (centered, var) = self.centered_and_variance(x, &last, compute)?;
                let scale = self.inverse_root(var, *eps, compute)?;
                let normed = self.binary(BinaryOp::Mul, centered, scale)?;
                let w = self.cast(operands[1], compute)?;
                let scaled = self.binary(BinaryOp::Mul, normed, w)?;
                let b = self.cast(operands[2], compute)?;
                self.binary(BinaryOp::Add, scaled, b)?
            }
            Op::RmsNorm { eps } => {
                let square = self.binary(BinaryOp::Mul, x, x)?;
                let mean_square = self.mean(square, &last, compute)?;
                let scale = self.inverse_root(mean_square, *eps, compute)?;
                let normed = self.binary(BinaryOp::Mul, x, scale)?;
                let w = self.cast(operands[1], compute)?;
                self.binary(BinaryOp::Mul, normed, w)?
            }
            Op::Softmax { axis } => {
                let axes = vec![*axis];
                let max = self.reduce(ReduceOp::Max, x, axes.clone(), true)?;
                let shifted = self.binary(BinaryOp::Sub, x, max)?;
                let exp = self.unary(UnaryOp::Exp, shifted)?;
                let sum = self.reduce(ReduceOp::Sum, exp, axes, true)?;
                // One division a row, not one an element: within an ulp of `exp / sum` (what
                // torch.compile's generated kernels compute is no closer), and an element's
                // division costs a row kernel over short 16-bit rows more than its loads.
                let inverse = self.unary(UnaryOp::Reciprocal, sum)?;
                self.binary(BinaryOp::Mul, exp, inverse)?
            }
            Op::LogSoftmax { axis } => {
                let axes = vec![*axis];
                let max = self.reduce(ReduceOp::Max, x, axes.clone(), true)?;
                let shifted = self.binary(BinaryOp::Sub, x, max)?;
                let exp = self.unary(UnaryOp::Exp, shifted)?;
                let sum = self.reduce(ReduceOp::Sum, exp, axes, true)?;
                let log_sum = self.unary(UnaryOp::Log, sum)?;
                self.binary(BinaryOp::Sub, shifted, log_sum)?
            }
            Op::CrossEntropy { ignore_index } => self.cross_entropy(x, operands[1], operands[2], *ignore_index)?,
            // `x` was cast to the i64 of the result.
            Op::Reduce { op: ReduceOp::Sum, axes, keepdim } => self.reduce(ReduceOp::Sum, x, axes.clone(), *keepdim)?,
            Op::Reduce { axes, keepdim, .. } => {
                let sum = self.reduce(ReduceOp::Sum, x, axes.clone(), *keepdim)?;
                let inv_n = self.constant(1.0 / reduced_count(&shape, axes) as f64, compute);
                self.binary(BinaryOp::Mul, sum, inv_n)?
            }
            other => {
                return Err(PassError::Lowering {
                    node: other.name().into(),
                    op: self.origin.into(),
                    detail: "not a composite".into(),
                })
            }
        };
        self.cast(result, dtype)
    }

    /// `x - mean(x)` and the biased variance over `axes`, keeping dims, by the corrected two-pass
    /// algorithm: `d = x - m` with `m = sum(x) * (1/n)`, then in one more pass over the row both
    /// `s = sum(d)` and `q = sum(d * d)`; the centred value is `d - s / n` and the variance
    /// `max((q - s * (s / n)) * (1/n), 0)`. The rounding of `m` is taken back out by `s / n`, so
    /// rows with large means and a small spread keep their digits, and on a row of one value `d`
    /// is one residual `r`, `s` is exactly `n * r` and `s / n` (a division, exact where `* (1/n)`
    /// is not, unless n is a power of two) exactly `r`: the centred row is exactly 0 and `rsqrt(var + eps)` has nothing to
    /// magnify. Two dependent reductions, as a plain two-pass layer norm has.
    fn centered_and_variance(&mut self, x: NodeId, axes: &[usize], dtype: DType) -> Result<(NodeId, NodeId)> {
        let n = reduced_count(&self.shape(x), axes);
        let rough_mean = self.mean(x, axes, dtype)?;
        let d = self.binary(BinaryOp::Sub, x, rough_mean)?;
        let s = self.reduce(ReduceOp::Sum, d, axes.to_vec(), true)?;
        let square = self.binary(BinaryOp::Mul, d, d)?;
        let q = self.reduce(ReduceOp::Sum, square, axes.to_vec(), true)?;
        // `s * (1/n)` is the same exact value when n is a power of two, and cheaper than a division.
        let residual = if n.is_power_of_two() {
            let inv_n = self.constant(1.0 / n as f64, dtype);
            self.binary(BinaryOp::Mul, s, inv_n)?
        } else {
            let count = self.constant(n as f64, dtype);
            self.binary(BinaryOp::Div, s, count)?
        };
        let centered = self.binary(BinaryOp::Sub, d, residual)?;
        let correction = self.binary(BinaryOp::Mul, s, residual)?;
        // A row whose squares overflow has `q` and `s * (s / n)` both infinite; capping the
        // correction at the largest finite value keeps its variance infinite (normalizing to the
        // bias, as the f32 accumulators of PyTorch do) rather than `inf - inf`. Finite rows have
        // `s * (s / n) <= q` (Cauchy-Schwarz) and are untouched.
        let largest = self.constant(f32::MAX as f64, dtype);
        let correction = self.binary(BinaryOp::Min, correction, largest)?;
        let spread = self.binary(BinaryOp::Sub, q, correction)?;
        let inv_n = self.constant(1.0 / n as f64, dtype);
        let var = self.binary(BinaryOp::Mul, spread, inv_n)?;
        let zero = self.constant(0.0, dtype);
        let var = self.binary(BinaryOp::Max, var, zero)?;
        Ok((centered, var))
    }

    /// Per row `hits * log(sum(exp(x - max))) - sum(where(class == target, x - max, 0))` (NaN where
    /// no class is the target; `hits` is how many are, 1 for classes `0..V`), summed over the rows
    /// whose target is not `ignore_index` and divided by their count: a row kernel and a
    /// reduction over the rows. The target logit is taken relative to the max, as a log-softmax
    /// would (`max + log(sum) - x` loses the loss to rounding where logits are large).
    fn cross_entropy(&mut self, x: NodeId, targets: NodeId, classes: NodeId, ignore_index: i64) -> Result<NodeId> {
        let dims = self.shape(x).dims().to_vec();
        let rows = dims[0];
        let compute = self.g.node(x).dtype;
        let max = self.reduce(ReduceOp::Max, x, vec![1], true)?;
        let shifted = self.binary(BinaryOp::Sub, x, max)?;
        let exp = self.unary(UnaryOp::Exp, shifted)?;
        let sum = self.reduce(ReduceOp::Sum, exp, vec![1], true)?;
        let log_sum = self.unary(UnaryOp::Log, sum)?;
        let target_dtype = self.g.node(targets).dtype;
        let column_of = self.reshape(targets, Shape(vec![rows, 1]))?;
        let matched = braze_ir::class_onehot(self.g, targets, classes, self.loc.clone())?;
        let onehot = matched.iter().map(|&id| self.tag(id)).last().expect("the match is the last node");
        let zero = self.constant(0.0, compute);
        let picked = self.where_(onehot, shifted, zero)?;
        let target_logit = self.reduce(ReduceOp::Sum, picked, vec![1], true)?;
        let hot = self.cast(onehot, compute)?;
        let hits = self.reduce(ReduceOp::Sum, hot, vec![1], true)?;
        // Whether any class is the target, from the count (exact: a sum of ones and zeros stays at
        // least one once it is), rather than another reduction per logit.
        let none = self.constant(0.0, compute);
        let hit = self.binary(BinaryOp::Gt, hits, none)?;
        let scaled_log_sum = self.binary(BinaryOp::Mul, hits, log_sum)?;
        let row_loss = self.binary(BinaryOp::Sub, scaled_log_sum, target_logit)?;
        let nan = self.constant(f64::NAN, compute);
        let row_loss = self.where_(hit, row_loss, nan)?;
        let ignored = self.constant(ignore_index as f64, target_dtype);
        let valid = self.binary(BinaryOp::Ne, column_of, ignored)?;
        let zero = self.constant(0.0, compute);
        let counted_loss = self.where_(valid, row_loss, zero)?;
        let total = self.reduce(ReduceOp::Sum, counted_loss, vec![0, 1], false)?;
        let counted = self.cast(valid, compute)?;
        let count = self.reduce(ReduceOp::Sum, counted, vec![0, 1], false)?;
        self.binary(BinaryOp::Div, total, count)
    }

    fn where_(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> Result<NodeId> {
        let id = self.g.add(Op::Where, &[cond, a, b], self.loc.clone())?;
        Ok(self.tag(id))
    }

    fn reshape(&mut self, x: NodeId, shape: Shape) -> Result<NodeId> {
        if self.shape(x) == shape {
            return Ok(x);
        }
        let id = self.g.reshape(x, shape)?;
        Ok(self.tag(id))
    }

    /// `sum(x, axes, keepdim) * (1/n)`.
    fn mean(&mut self, x: NodeId, axes: &[usize], dtype: DType) -> Result<NodeId> {
        let n = reduced_count(&self.shape(x), axes);
        let sum = self.reduce(ReduceOp::Sum, x, axes.to_vec(), true)?;
        let inv_n = self.constant(1.0 / n as f64, dtype);
        self.binary(BinaryOp::Mul, sum, inv_n)
    }

    /// `rsqrt(v + eps)`.
    fn inverse_root(&mut self, v: NodeId, eps: f64, dtype: DType) -> Result<NodeId> {
        let eps = self.constant(eps, dtype);
        let shifted = self.binary(BinaryOp::Add, v, eps)?;
        self.unary(UnaryOp::Rsqrt, shifted)
    }
}

fn reduced_count(shape: &Shape, axes: &[usize]) -> usize {
    axes.iter().map(|&a| shape.dims()[a]).product()
}
