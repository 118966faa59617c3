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

/// A binary op's operand gradients from its operands `a`, `b`, result `y` and incoming gradient
/// `g`, in that order.
pub type GradientsFormula = fn(&mut dyn DerivativeBuilder, DVal, DVal, DVal, DVal) -> (DVal, DVal);

/// How a binary op `y = f(a, b)` passes a gradient to its operands: through its partials
/// `(dy/da, dy/db)`, or, where that is not enough, by a formula for the gradients themselves.
#[derive(Clone, Copy)]
pub enum Partials {
    /// A formula in the operands `a`, `b` and the result `y`; an operand's gradient is the
    /// incoming gradient times its partial.
    Formula(fn(&mut dyn DerivativeBuilder, DVal, DVal, DVal) -> (DVal, DVal)),
    /// The operands' gradients themselves, from `a`, `b`, `y` and the incoming gradient `g`, for
    /// an op whose gradient is not `g` times a partial everywhere: PyTorch's pow gradient of the
    /// base is 0 where the exponent is 0, even where `g` is infinite or NaN.
    Gradients(GradientsFormula),
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
            Partials::Gradients(_) => "Gradients",
            Partials::NotDifferentiable => "NotDifferentiable",
        })
    }
}
