//! Appending backward ops: small constructors over `Graph` that give every new node the source
//! location of the forward node it differentiates, marked as backward.

use crate::Result;
use braze_ir::elementwise::{DVal, DerivativeBuilder};
use braze_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, Shape, SourceLoc, UnaryOp};

pub(crate) struct Emit<'g> {
    g: &'g mut Graph,
    loc: Option<SourceLoc>,
    /// The dtype of the forward node: constants of derivative formulas take it.
    dtype: DType,
}

impl<'g> Emit<'g> {
    pub(crate) fn new(g: &'g mut Graph, forward: NodeId) -> Emit<'g> {
        let node = g.node(forward);
        let (loc, dtype) = (node.loc.as_ref().map(SourceLoc::backward_of), node.dtype);
        Emit { g, loc, dtype }
    }

    /// The dtype constants take.
    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    /// Runs `f` with constants of `dtype` (a rule computing in f32 for an f16/bf16 op).
    pub(crate) fn with_dtype<T>(&mut self, dtype: DType, f: impl FnOnce(&mut Self) -> T) -> T {
        let forward = std::mem::replace(&mut self.dtype, dtype);
        let result = f(self);
        self.dtype = forward;
        result
    }

    pub(crate) fn graph(&self) -> &Graph {
        self.g
    }

    pub(crate) fn shape(&self, x: NodeId) -> Shape {
        self.g.node(x).shape.clone()
    }

    pub(crate) fn op(&mut self, op: Op, operands: &[NodeId]) -> Result<NodeId> {
        Ok(self.g.add(op, operands, self.loc.clone())?)
    }

    /// Cross entropy's `[rows, cols]` match of targets and classes ([`braze_ir::class_onehot`]).
    pub(crate) fn class_onehot(&mut self, targets: NodeId, classes: NodeId) -> Result<NodeId> {
        let added = braze_ir::class_onehot(self.g, targets, classes, self.loc.clone())?;
        for &id in &added {
            self.g.set_loc(id, self.loc.clone());
        }
        Ok(*added.last().expect("the match is the last node"))
    }

    pub(crate) fn constant(&mut self, value: f64) -> NodeId {
        let dtype = self.dtype;
        self.constant_of(value, dtype)
    }

    pub(crate) fn constant_of(&mut self, value: f64, dtype: DType) -> NodeId {
        let c = self.g.constant(value, dtype);
        self.g.set_loc(c, self.loc.clone());
        c
    }

    pub(crate) fn unary(&mut self, op: UnaryOp, x: NodeId) -> Result<NodeId> {
        self.op(Op::Unary { op }, &[x])
    }

    pub(crate) fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.op(Op::Binary { op }, &[a, b])
    }

    pub(crate) fn add(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Add, a, b)
    }

    pub(crate) fn sub(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Sub, a, b)
    }

    pub(crate) fn mul(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Mul, a, b)
    }

    pub(crate) fn div(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Div, a, b)
    }

    pub(crate) fn select(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.op(Op::Where, &[cond, a, b])
    }

    pub(crate) fn cast(&mut self, x: NodeId, dtype: DType) -> Result<NodeId> {
        let shape = self.shape(x);
        Ok(self.g.add_declared(Op::Cast, &[x], dtype, shape, self.loc.clone())?)
    }

    /// `x` as `dtype`, adding a cast only when it differs.
    pub(crate) fn cast_if_needed(&mut self, x: NodeId, dtype: DType) -> Result<NodeId> {
        if self.g.node(x).dtype == dtype {
            return Ok(x);
        }
        self.cast(x, dtype)
    }

    pub(crate) fn reshape(&mut self, x: NodeId, shape: &Shape) -> Result<NodeId> {
        if &self.shape(x) == shape {
            return Ok(x);
        }
        let dtype = self.g.node(x).dtype;
        Ok(self.g.add_declared(Op::Reshape, &[x], dtype, shape.clone(), self.loc.clone())?)
    }

    pub(crate) fn broadcast(&mut self, x: NodeId, shape: &Shape) -> Result<NodeId> {
        if &self.shape(x) == shape {
            return Ok(x);
        }
        let dtype = self.g.node(x).dtype;
        Ok(self.g.add_declared(Op::BroadcastTo, &[x], dtype, shape.clone(), self.loc.clone())?)
    }

    pub(crate) fn reduce(&mut self, op: ReduceOp, x: NodeId, axes: &[usize], keepdim: bool) -> Result<NodeId> {
        self.op(Op::Reduce { op, axes: axes.to_vec(), keepdim }, &[x])
    }

    /// Zeros of the forward dtype in `shape`.
    pub(crate) fn zeros(&mut self, shape: &Shape) -> Result<NodeId> {
        let zero = self.constant(0.0);
        self.broadcast(zero, shape)
    }

    /// Sums `grad` (of a broadcast result's shape) back to `shape`, the shape of an operand that
    /// was broadcast: over the leading dims the operand lacks and over its size-1 dims.
    pub(crate) fn sum_to(&mut self, grad: NodeId, shape: &Shape) -> Result<NodeId> {
        let from = self.shape(grad);
        if &from == shape {
            return Ok(grad);
        }
        let lead = from.rank() - shape.rank();
        let axes: Vec<usize> = (0..from.rank())
            .filter(|&axis| axis < lead || (shape.dims()[axis - lead] == 1 && from.dims()[axis] != 1))
            .collect();
        let summed = if axes.is_empty() { grad } else { self.reduce(ReduceOp::Sum, grad, &axes, true)? };
        self.reshape(summed, shape)
    }

    /// `x` with its last two dims swapped.
    pub(crate) fn transpose_last(&mut self, x: NodeId) -> Result<NodeId> {
        let rank = self.shape(x).rank();
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(rank - 2, rank - 1);
        self.op(Op::Permute { perm }, &[x])
    }

    /// Runs a derivative formula of the op table on graph nodes: `f` gets `args` as values
    /// and returns the values wanted, whose nodes are returned.
    pub(crate) fn formula(
        &mut self,
        args: &[NodeId],
        f: impl FnOnce(&mut dyn DerivativeBuilder, &[DVal]) -> Vec<DVal>,
    ) -> Result<Vec<NodeId>> {
        let mut nodes = FormulaNodes { emit: self, values: args.to_vec(), error: None };
        let dvals: Vec<DVal> = (0..args.len()).map(DVal).collect();
        let wanted = f(&mut nodes, &dvals);
        match nodes.error {
            Some(error) => Err(error),
            None => Ok(wanted.iter().map(|v| nodes.values[v.0]).collect()),
        }
    }
}

/// A derivative formula being built: `DVal(i)` names `values[i]`.
struct FormulaNodes<'e, 'g> {
    emit: &'e mut Emit<'g>,
    values: Vec<NodeId>,
    /// The first failure; the formula's later steps are not built.
    error: Option<crate::AutodiffError>,
}

impl FormulaNodes<'_, '_> {
    fn push(&mut self, node: Result<NodeId>) -> DVal {
        match node {
            Ok(id) => {
                self.values.push(id);
                DVal(self.values.len() - 1)
            }
            Err(error) => {
                self.error.get_or_insert(error);
                DVal(0)
            }
        }
    }

    fn node(&self, v: DVal) -> NodeId {
        self.values[v.0]
    }
}

impl DerivativeBuilder for FormulaNodes<'_, '_> {
    fn constant(&mut self, value: f64) -> DVal {
        let c = self.emit.constant(value);
        self.push(Ok(c))
    }

    fn unary(&mut self, op: UnaryOp, x: DVal) -> DVal {
        let node = if self.error.is_some() { Ok(self.node(x)) } else { self.emit.unary(op, self.node(x)) };
        self.push(node)
    }

    fn binary(&mut self, op: BinaryOp, a: DVal, b: DVal) -> DVal {
        let node =
            if self.error.is_some() { Ok(self.node(a)) } else { self.emit.binary(op, self.node(a), self.node(b)) };
        self.push(node)
    }

    fn select(&mut self, cond: DVal, a: DVal, b: DVal) -> DVal {
        let node = if self.error.is_some() {
            Ok(self.node(a))
        } else {
            self.emit.select(self.node(cond), self.node(a), self.node(b))
        };
        self.push(node)
    }
}
