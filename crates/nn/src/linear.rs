//! `nn.Linear`: `y = x @ weight^T + bias`, the weight `[out, in]` as PyTorch stores it.

use crate::{Init, Module, Result};
use braze::Tensor;

pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A `[out, in]` weight of normals with standard deviation `std` (nanoGPT's 0.02) and, with
    /// `bias`, a zero bias of `[out]`.
    pub fn new(init: &mut Init, in_features: usize, out_features: usize, bias: bool, std: f64) -> Result<Linear> {
        Ok(Linear {
            weight: init.normal(&[out_features, in_features], std)?,
            bias: if bias { Some(init.zeros(&[out_features])?) } else { None },
        })
    }

    /// `x`: `[.., in]` to `[.., out]`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.matmul(&self.weight.transpose(0, 1)?)?;
        Ok(match &self.bias {
            // In an autocast region the bias joins the matmul's dtype, as PyTorch's `linear`
            // takes all three operands in it: the output stays 16-bit.
            Some(b) if braze::autocast_dtype().is_some() => y.add(&b.cast(y.dtype())?)?,
            Some(b) => y.add(b)?,
            None => y,
        })
    }
}

impl Module for Linear {
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        visit(format!("{prefix}weight"), &self.weight);
        if let Some(b) = &self.bias {
            visit(format!("{prefix}bias"), b);
        }
    }
}
