//! Parameter iteration under PyTorch's names.

use braze::Tensor;

/// A layer or model with parameters.
pub trait Module {
    /// Calls `visit` with each parameter's full name (`prefix` then the PyTorch name inside this
    /// module) in the order PyTorch's `named_parameters()` yields them.
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor));

    /// Every parameter with its name, in PyTorch's order.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        self.visit_parameters("", &mut |name, t| out.push((name, t.clone())));
        out
    }

    /// Every parameter, in PyTorch's order.
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters().into_iter().map(|(_, t)| t).collect()
    }

    /// The number of parameter elements (a tied parameter counts once).
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(Tensor::numel).sum()
    }

    /// Drops every parameter's gradient.
    fn zero_grad(&self) {
        self.parameters().iter().for_each(Tensor::zero_grad);
    }
}
