//! The gradient methods of `Tensor`.

use super::tape;
use crate::tensor::{caller, Storage};
use crate::{trace, Error, Result, Tensor};

impl Tensor {
    /// Marks this tensor as a leaf whose gradient `backward()` accumulates into
    /// [`Tensor::grad`] (as PyTorch's `requires_grad_()`). Only float tensors have gradients;
    /// set it on weights before compiling the functions that use them.
    #[track_caller]
    pub fn set_requires_grad(&self, on: bool) -> Result<&Tensor> {
        let loc = caller();
        if on && !self.dtype().is_float() {
            return Err(Error::invalid(
                "set_requires_grad",
                &loc,
                format!("only float tensors have gradients, this one is {}", self.dtype()),
            ));
        }
        if self.is_traced() {
            return Err(Error::invalid(
                "set_requires_grad",
                &loc,
                "inside a compiled function; mark the weights before calling it",
            ));
        }
        self.inner.autograd.set_requires_grad(on);
        Ok(self)
    }

    /// Whether this tensor is a leaf that requires grad.
    pub fn requires_grad(&self) -> bool {
        self.inner.autograd.requires_grad()
    }

    /// The gradient accumulated into this leaf by `backward()`, if any. Inside a compiled
    /// function, the gradient as the function has computed it so far.
    pub fn grad(&self) -> Option<Tensor> {
        match trace::grad_of(self) {
            Some(in_trace) => in_trace,
            None => self.inner.autograd.grad(),
        }
    }

    /// Replaces the gradient (as assigning `param.grad` in PyTorch), e.g. with a clipped one; it
    /// must have this tensor's dtype and shape.
    #[track_caller]
    pub fn set_grad(&self, grad: Option<&Tensor>) -> Result<()> {
        let loc = caller();
        if let Some(g) = grad {
            if g.dtype() != self.dtype() || g.shape() != self.shape() {
                return Err(Error::invalid(
                    "set_grad",
                    &loc,
                    format!("the gradient must be {}{}, got {}{}", self.dtype(), self.shape(), g.dtype(), g.shape()),
                ));
            }
        }
        if trace::set_grad(self, grad).is_none() {
            self.inner.autograd.set_grad(grad.cloned());
        }
        Ok(())
    }

    /// Drops the accumulated gradient (PyTorch's `zero_grad(set_to_none=True)`): the next
    /// `backward()` sets it afresh.
    pub fn zero_grad(&self) {
        if trace::zero_grad(self).is_none() {
            self.inner.autograd.set_grad(None);
        }
    }

    /// Computes the gradient of this one-element tensor with respect to every leaf it depends
    /// on that requires grad, and adds it to their [`Tensor::grad`].
    #[track_caller]
    pub fn backward(&self) -> Result<()> {
        let loc = caller();
        match trace::backward(self, None, &loc) {
            Some(result) => result,
            None => tape::backward(self, None, loc),
        }
    }

    /// [`Tensor::backward`] with the gradient flowing into this tensor given (of its dtype and
    /// shape), for results with more than one element.
    #[track_caller]
    pub fn backward_with(&self, grad: &Tensor) -> Result<()> {
        let loc = caller();
        if grad.dtype() != self.dtype() || grad.shape() != self.shape() {
            return Err(Error::invalid(
                "backward_with",
                &loc,
                format!(
                    "the gradient must be {}{} like the tensor, got {}{}",
                    self.dtype(),
                    self.shape(),
                    grad.dtype(),
                    grad.shape()
                ),
            ));
        }
        match trace::backward(self, Some(grad), &loc) {
            Some(result) => result,
            None => tape::backward(self, Some(grad), loc),
        }
    }

    /// The same values with no gradient history: gradients do not flow through the result.
    #[track_caller]
    pub fn detach(&self) -> Result<Tensor> {
        let loc = caller();
        match trace::detach(self, &loc) {
            Some(result) => result,
            None => {
                let storage = self.storage().clone();
                if let Storage::Traced(_) = storage {
                    return Err(Error::StaleTrace { op: "detach".into(), loc: Some(loc) });
                }
                Ok(Tensor::from_storage(storage))
            }
        }
    }
}
