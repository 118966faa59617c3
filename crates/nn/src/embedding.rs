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

/// `weight[indices]`: each index's row, as PyTorch's `F.embedding(indices, weight)`. Written as
/// a one-hot matrix times the weight, whose gradient is the scatter-add of the rows' gradients.
#[track_caller]
pub(crate) fn lookup(weight: &Tensor, indices: &Tensor) -> Result<Tensor> {
    if !indices.dtype().is_int() {
        return Err(Error::invalid("embedding", format!("indices must be i32 or i64, got {}", indices.dtype())));
    }
    let dims = weight.shape().dims().to_vec();
    if dims.len() != 2 {
        return Err(Error::invalid(
            "embedding",
            format!("weight must be [num_embeddings, dim], got {}", weight.shape()),
        ));
    }
    let mut column = indices.shape().dims().to_vec();
    column.push(1);
    let classes = Tensor::arange(dims[0], indices.dtype(), indices.device())?;
    let one_hot = indices.reshape(column)?.eq(&classes)?.cast(weight.dtype())?;
    Ok(one_hot.matmul(weight)?)
}
