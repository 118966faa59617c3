//! The slot for each elementwise op's derivative: a formula over other elementwise ops that a
//! builder turns into whatever it builds (graph nodes for autodiff, numbers in the tests).

use super::ops::{BinaryOp, UnaryOp};

/// A value in a derivative formula, named by the builder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DVal(pub usize);

/// What a derivative formula may use. Constants take the dtype of the op being differentiated.
pub trait DerivativeBuilder {
    fn constant(&mut self, value: f64) -> DVal;
    fn unary(&mut self, op: UnaryOp, x: DVal) -> DVal;
    fn binary(&mut self, op: BinaryOp, a: DVal, b: DVal) -> DVal;
    /// `where(cond, a, b)` with a bool `cond`.
    fn select(&mut self, cond: DVal, a: DVal, b: DVal) -> DVal;
}

/// `dy/dx` of a unary op `y = f(x)`.
#[derive(Clone, Copy)]
pub enum Derivative {
    /// A formula in the operand `x` and the result `y`.
    Formula(fn(&mut dyn DerivativeBuilder, DVal, DVal) -> DVal),
    /// Zero wherever it is defined (piecewise constant: floor, sign, ...).
    Zero,
    /// No gradient: the result is not a float (predicates).
    NotDifferentiable,
}

/// `(dy/da, dy/db)` of a binary op `y = f(a, b)`.
#[derive(Clone, Copy)]
pub enum Partials {
    /// A formula in the operands `a`, `b` and the result `y`.
    Formula(fn(&mut dyn DerivativeBuilder, DVal, DVal, DVal) -> (DVal, DVal)),
    /// No gradient: the result is not a float (comparisons, logic).
    NotDifferentiable,
}

impl std::fmt::Debug for Derivative {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Derivative::Formula(_) => "Formula",
            Derivative::Zero => "Zero",
            Derivative::NotDifferentiable => "NotDifferentiable",
        })
    }
}

impl std::fmt::Debug for Partials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Partials::Formula(_) => "Formula",
            Partials::NotDifferentiable => "NotDifferentiable",
        })
    }
}
