//! The workloads as IR graphs at any shape: the definitions of [`crate::definition`] run on
//! graph nodes. No tensor data is made, so the standard benchmark sizes cost nothing, and nodes
//! carry no source location, so graph text does not change when this crate's lines move.
//!
//! The graph is the one `compile` traces from the `Tensor`-API form: inputs in the order the
//! definition declares them (a `tiny_block`'s captured weights after `x`), then the same ops.

use crate::definition::{self, Inputs, TensorOps};
use braze_ir::{BinaryOp, DType, Graph, IrError, NodeId, Op, ReduceOp, Result, UnaryOp};
use std::cell::RefCell;
use std::rc::Rc;

/// A node of the graph being built.
#[derive(Clone)]
pub struct GraphValue {
    graph: Rc<RefCell<Graph>>,
    id: NodeId,
}

impl GraphValue {
    fn op(&self, op: Op, others: &[&GraphValue]) -> Result<GraphValue> {
        let mut operands = vec![self.id];
        operands.extend(others.iter().map(|v| v.id));
        let id = self.graph.borrow_mut().add(op, &operands, None)?;
        Ok(GraphValue { graph: self.graph.clone(), id })
    }
}

impl TensorOps for GraphValue {
    type Error = IrError;

    fn add(&self, other: &Self) -> Result<Self> {
        self.op(Op::Binary { op: BinaryOp::Add }, &[other])
    }

    fn mul(&self, other: &Self) -> Result<Self> {
        self.op(Op::Binary { op: BinaryOp::Mul }, &[other])
    }

    fn relu(&self) -> Result<Self> {
        self.op(Op::Unary { op: UnaryOp::Relu }, &[])
    }

    fn gelu(&self) -> Result<Self> {
        self.op(Op::Unary { op: UnaryOp::GeluErf }, &[])
    }

    fn layer_norm(&self, weight: &Self, bias: &Self, eps: f64) -> Result<Self> {
        self.op(Op::LayerNorm { eps }, &[weight, bias])
    }

    fn matmul(&self, other: &Self) -> Result<Self> {
        self.op(Op::MatMul, &[other])
    }

    fn sum_all(&self) -> Result<Self> {
        let rank = self.graph.borrow().node(self.id).shape.rank();
        self.op(Op::Reduce { op: ReduceOp::Sum, axes: (0..rank).collect(), keepdim: false }, &[])
    }

    fn stack(values: &[Self]) -> Result<Self> {
        let Some((first, rest)) = values.split_first() else {
            return Err(IrError::Arity { op: "stack".into(), expected: "at least 1".into(), actual: 0 });
        };
        let rest: Vec<&GraphValue> = rest.iter().collect();
        first.op(Op::Stack { axis: 0 }, &rest)
    }
}

/// Graph inputs, declared in order.
#[derive(Default)]
struct GraphInputs {
    graph: Rc<RefCell<Graph>>,
}

impl Inputs for GraphInputs {
    type Error = IrError;
    type Value = GraphValue;

    fn input(&mut self, _name: &str, dtype: DType, shape: &[usize], _scale: f64) -> Result<GraphValue> {
        let id = self.graph.borrow_mut().input(dtype, shape.to_vec());
        Ok(GraphValue { graph: self.graph.clone(), id })
    }
}

/// The graph `define` builds from fresh inputs, returning its outputs.
fn build(define: impl FnOnce(&mut GraphInputs) -> Result<Vec<GraphValue>>) -> Result<Graph> {
    let mut inputs = GraphInputs::default();
    let outputs = define(&mut inputs)?;
    let mut graph = inputs.graph.take();
    graph.set_outputs(outputs.iter().map(|v| v.id).collect());
    Ok(graph)
}

/// `ln_relu_res` on `[rows, hidden]`.
pub fn ln_relu_res(dtype: DType, rows: usize, hidden: usize) -> Result<Graph> {
    build(|i| {
        let [x, w, b, res] = definition::ln_relu_res_inputs(i, dtype, rows, hidden)?;
        Ok(vec![definition::ln_relu_res(&x, &w, &b, &res)?])
    })
}

/// `ew_chain` on tensors of `shape` (the benchmark's is `[n]`).
pub fn ew_chain(dtype: DType, shape: &[usize]) -> Result<Graph> {
    build(|i| {
        let [x, a, b, c] = definition::ew_chain_inputs(i, dtype, shape)?;
        Ok(vec![definition::ew_chain(&x, &a, &b, &c)?])
    })
}

/// `multisum` of one tensor per length.
pub fn multisum(dtype: DType, lengths: &[usize]) -> Result<Graph> {
    build(|i| {
        let ts = definition::multisum_inputs(i, dtype, lengths)?;
        Ok(vec![definition::multisum(&ts)?])
    })
}

/// `tiny_block` of `layers` layers on `[rows, hidden]`; the weights are inputs after `x`.
pub fn tiny_block(dtype: DType, layers: usize, rows: usize, hidden: usize) -> Result<Graph> {
    build(|i| {
        let (x, weights) = definition::tiny_block_inputs(i, dtype, layers, rows, hidden)?;
        Ok(vec![definition::tiny_block(&x, &weights)?])
    })
}

/// `mlp_block` on `[rows, hidden]` with an `inner`-wide hidden layer (the benchmark's is
/// `4 * hidden`).
pub fn mlp_block(dtype: DType, rows: usize, hidden: usize, inner: usize) -> Result<Graph> {
    build(|i| {
        let [x, w1, b1, w2, b2, g, beta] = definition::mlp_block_inputs(i, dtype, rows, hidden, inner)?;
        Ok(vec![definition::mlp_block(&x, &w1, &b1, &w2, &b2, &g, &beta)?])
    })
}
