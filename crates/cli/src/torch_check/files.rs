//! safetensors files as braze host tensors.

use anyhow::{bail, Context, Result};
use braze::{DType, HostTensor};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::Path;

/// The tensors of a safetensors file, by name, and its `__metadata__` strings.
pub struct TensorFile {
    pub metadata: HashMap<String, String>,
    pub tensors: HashMap<String, HostTensor>,
}

fn dtype_of(dtype: Dtype) -> Option<DType> {
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

impl TensorFile {
    pub fn read(path: &Path) -> Result<TensorFile> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let file = SafeTensors::deserialize(&bytes)
            .map_err(|e| anyhow::anyhow!("{}: not a valid safetensors file: {e}", path.display()))?;
        let (_, header) = SafeTensors::read_metadata(&bytes)
            .map_err(|e| anyhow::anyhow!("{}: unreadable safetensors header: {e}", path.display()))?;
        let metadata = header.metadata().clone().unwrap_or_default();
        let mut tensors = HashMap::new();
        for (name, view) in file.iter() {
            let Some(dtype) = dtype_of(view.dtype()) else {
                bail!("{}: tensor `{name}` has dtype {:?}, which braze does not have", path.display(), view.dtype());
            };
            let tensor = HostTensor::from_bytes(dtype, view.shape().to_vec(), view.data())
                .with_context(|| format!("{}: tensor `{name}`", path.display()))?;
            tensors.insert(name.to_string(), tensor);
        }
        Ok(TensorFile { metadata, tensors })
    }

    /// The tensor `name`, or an error naming the file and what it holds.
    pub fn take(&mut self, name: &str, path: &Path) -> Result<HostTensor> {
        self.tensors.remove(name).with_context(|| {
            let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
            names.sort_unstable();
            names.truncate(8);
            format!("{}: no tensor `{name}` (it has {}, ...)", path.display(), names.join(", "))
        })
    }

    /// Metadata `key` parsed, or an error naming the file.
    pub fn meta<T: std::str::FromStr>(&self, key: &str, path: &Path) -> Result<T> {
        let value =
            self.metadata.get(key).with_context(|| format!("{}: no `{key}` in its metadata", path.display()))?;
        value.parse().map_err(|_| anyhow::anyhow!("{}: metadata `{key}` = `{value}` is not valid", path.display()))
    }
}

/// Writes `tensors` with `metadata` as a safetensors file.
#[cfg(test)]
pub fn write(path: &Path, tensors: &[(String, HostTensor)], metadata: HashMap<String, String>) -> Result<()> {
    let dtype = |d: DType| match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::Bool => Dtype::BOOL,
    };
    let bytes: Vec<(String, DType, Vec<usize>, Vec<u8>)> =
        tensors.iter().map(|(n, t)| (n.clone(), t.dtype(), t.shape().dims().to_vec(), t.to_bytes())).collect();
    let views = bytes
        .iter()
        .map(|(n, d, shape, b)| Ok((n.clone(), safetensors::tensor::TensorView::new(dtype(*d), shape.clone(), b)?)))
        .collect::<std::result::Result<Vec<_>, safetensors::SafeTensorError>>()?;
    safetensors::serialize_to_file(views, Some(metadata), path)?;
    Ok(())
}
