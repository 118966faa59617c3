//! safetensors checkpoints under PyTorch's names and dtypes: a file PyTorch's
//! `safetensors.torch.save_file(model.state_dict())` writes loads into the same braze model, and
//! one braze writes loads into PyTorch. Files are read whole, not memory-mapped.

use crate::{Error, Module, Result};
use braze::{DType, HostTensor, Tensor};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::Path;

/// Tensors a PyTorch state dict may hold that are not parameters here: nanoGPT's tied head (the
/// token embedding again) and the causal-mask buffers of its non-flash attention.
fn is_known_extra(name: &str) -> bool {
    name == "lm_head.weight" || name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")
}

fn braze_dtype(dtype: Dtype) -> Option<DType> {
    Some(match dtype {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

fn file_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::Bool => Dtype::BOOL,
    }
}

fn file_error(path: &Path, detail: impl std::fmt::Display) -> Error {
    Error::File { path: path.display().to_string(), detail: detail.to_string() }
}

/// A safetensors file's tensors by name and its `__metadata__` strings.
pub struct TensorFile {
    pub path: String,
    pub tensors: HashMap<String, HostTensor>,
    pub metadata: HashMap<String, String>,
}

impl TensorFile {
    pub fn read(path: &Path) -> Result<TensorFile> {
        let bytes = std::fs::read(path).map_err(|e| file_error(path, e))?;
        let file = SafeTensors::deserialize(&bytes).map_err(|e| file_error(path, format!("not safetensors: {e}")))?;
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| file_error(path, e))?;
        let mut tensors = HashMap::new();
        for (name, view) in file.iter() {
            let dtype = braze_dtype(view.dtype()).ok_or_else(|| Error::TensorMismatch {
                path: path.display().to_string(),
                name: name.to_string(),
                expected: "a dtype braze has (f32, f16, bf16, i32, i64, bool)".into(),
                actual: format!("{:?}", view.dtype()),
            })?;
            let host = HostTensor::from_bytes(dtype, view.shape().to_vec(), view.data())
                .map_err(|e| file_error(path, format!("tensor `{name}`: {e}")))?;
            tensors.insert(name.to_string(), host);
        }
        Ok(TensorFile {
            path: path.display().to_string(),
            tensors,
            metadata: header.metadata().clone().unwrap_or_default(),
        })
    }

    /// The tensor `name` with `shape` (any float dtype, cast to `dtype`), or an error naming it,
    /// what was expected and what the file holds.
    pub fn tensor(&self, name: &str, shape: &[usize], dtype: DType) -> Result<HostTensor> {
        let expected = format!("{dtype}{}", braze::Shape::from(shape.to_vec()));
        let host = self.tensors.get(name).ok_or_else(|| Error::MissingTensor {
            path: self.path.clone(),
            name: name.into(),
            expected: expected.clone(),
        })?;
        if host.shape().dims() != shape || (host.dtype().is_float() != dtype.is_float()) {
            return Err(Error::TensorMismatch {
                path: self.path.clone(),
                name: name.into(),
                expected,
                actual: format!("{}{}", host.dtype(), host.shape()),
            });
        }
        if host.dtype() == dtype {
            return Ok(host.clone());
        }
        Ok(Tensor::from_host(host.clone()).cast(dtype)?.to_host()?)
    }
}

/// Writes `tensors` (device tensors are copied to the host) with `metadata` to `path`.
pub fn save(path: &Path, tensors: &[(String, Tensor)], metadata: &HashMap<String, String>) -> Result<()> {
    let hosts: Vec<(String, HostTensor)> =
        tensors.iter().map(|(n, t)| Ok((n.clone(), t.to_host()?))).collect::<Result<_>>()?;
    let bytes: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = hosts
        .iter()
        .map(|(n, h)| (n.clone(), file_dtype(h.dtype()), h.shape().dims().to_vec(), h.to_bytes()))
        .collect();
    let views = bytes
        .iter()
        .map(|(n, d, shape, b)| {
            safetensors::tensor::TensorView::new(*d, shape.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| file_error(path, format!("tensor `{n}`: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = if metadata.is_empty() { None } else { Some(metadata.clone()) };
    safetensors::serialize_to_file(views, metadata, path).map_err(|e| file_error(path, e))
}

/// Writes every parameter of `model` under its PyTorch name.
pub fn save_model(path: &Path, model: &impl Module, metadata: &HashMap<String, String>) -> Result<()> {
    save(path, &model.named_parameters(), metadata)
}

/// Loads every parameter of `model` from `file` (assigned in place, so compiled functions that
/// captured them see the new values). A missing or mis-shaped tensor, or a tensor the model has
/// no parameter for (other than the tied head and attention-mask buffers of a PyTorch state
/// dict), is an error naming it; nothing is assigned then.
pub fn load_model(file: &TensorFile, model: &impl Module) -> Result<()> {
    let params = model.named_parameters();
    let mut values = Vec::with_capacity(params.len());
    for (name, p) in &params {
        values.push(file.tensor(name, p.shape().dims(), p.dtype())?);
    }
    let mut unexpected: Vec<&String> =
        file.tensors.keys().filter(|n| !is_known_extra(n) && !params.iter().any(|(p, _)| p == *n)).collect();
    unexpected.sort();
    if let Some(name) = unexpected.first() {
        return Err(Error::UnexpectedTensor { path: file.path.clone(), name: (*name).clone() });
    }
    for ((_, p), host) in params.iter().zip(values) {
        p.assign(&Tensor::from_host(host).to_device(p.device())?)?;
    }
    Ok(())
}
