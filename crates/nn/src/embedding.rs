//! `nn.Embedding`: rows of a `[num_embeddings, dim]` weight picked by integer indices.

use crate::{Error, Init, Module, Result};
use braze::Tensor;

pub struct Embedding {
    pub weight: Tensor,
}

impl Embedding {
    /// A `[num_embeddings, dim]` weight of normals with standard deviation `std`.
    pub fn new(init: &mut Init, num_embeddings: usize, dim: usize, std: f64) -> Result<Embedding> {
        Ok(Embedding { weight: init.normal(&[num_embeddings, dim], std)? })
    }

    /// `indices` (any shape, i32 or i64) to `[.., dim]`.
    #[track_caller]
    pub fn forward(&self, indices: &Tensor) -> Result<Tensor> {
        lookup(&self.weight, indices)
    }
}

impl Module for Embedding {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        visit(format!("{prefix}weight"), &self.weight);
    }
}

/// `weight[indices]`: each index's row, as PyTorch's `F.embedding(indices, weight)`; its
/// gradient is a deterministic scatter-add of the rows' gradients, summed with any other use
/// of the weight (the tied head).
#[track_caller]
pub(crate) fn lookup(weight: &Tensor, indices: &Tensor) -> Result<Tensor> {
    if !indices.dtype().is_int() {
        return Err(Error::invalid("embedding", format!("indices must be i32 or i64, got {}", indices.dtype())));
    }
    Ok(weight.embedding(indices)?)
}
