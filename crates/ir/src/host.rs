//! Plain host data of one tensor: what the CPU reference computes on and what transfers move.

use crate::{DType, IrError, Result, Shape};
use half::{bf16, f16};

#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
}

impl HostData {
    pub fn len(&self) -> usize {
        match self {
            HostData::F32(v) => v.len(),
            HostData::F16(v) => v.len(),
            HostData::BF16(v) => v.len(),
            HostData::I32(v) => v.len(),
            HostData::I64(v) => v.len(),
            HostData::Bool(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the values start in memory (identifies the allocation, e.g. to tell an update in
    /// place from a new buffer).
    pub fn address(&self) -> usize {
        match self {
            HostData::F32(v) => v.as_ptr() as usize,
            HostData::F16(v) => v.as_ptr() as usize,
            HostData::BF16(v) => v.as_ptr() as usize,
            HostData::I32(v) => v.as_ptr() as usize,
            HostData::I64(v) => v.as_ptr() as usize,
            HostData::Bool(v) => v.as_ptr() as usize,
        }
    }

    /// Overwrites the values with `other`'s (same dtype and length), keeping this allocation.
    fn copy_from(&mut self, other: &HostData) -> Result<()> {
        match (self, other) {
            (HostData::F32(a), HostData::F32(b)) if a.len() == b.len() => a.copy_from_slice(b),
            (HostData::F16(a), HostData::F16(b)) if a.len() == b.len() => a.copy_from_slice(b),
            (HostData::BF16(a), HostData::BF16(b)) if a.len() == b.len() => a.copy_from_slice(b),
            (HostData::I32(a), HostData::I32(b)) if a.len() == b.len() => a.copy_from_slice(b),
            (HostData::I64(a), HostData::I64(b)) if a.len() == b.len() => a.copy_from_slice(b),
            (HostData::Bool(a), HostData::Bool(b)) if a.len() == b.len() => a.copy_from_slice(b),
            (a, b) => {
                return Err(IrError::HostData(format!(
                    "cannot copy {} x{} values into {} x{}",
                    b.dtype(),
                    b.len(),
                    a.dtype(),
                    a.len()
                )))
            }
        }
        Ok(())
    }

    pub fn dtype(&self) -> DType {
        match self {
            HostData::F32(_) => DType::F32,
            HostData::F16(_) => DType::F16,
            HostData::BF16(_) => DType::BF16,
            HostData::I32(_) => DType::I32,
            HostData::I64(_) => DType::I64,
            HostData::Bool(_) => DType::Bool,
        }
    }
}

/// A dense row-major tensor in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    shape: Shape,
    data: HostData,
}

impl HostTensor {
    pub fn new(shape: impl Into<Shape>, data: HostData) -> Result<HostTensor> {
        let shape = shape.into();
        if shape.numel() != data.len() {
            return Err(IrError::HostData(format!(
                "shape {} holds {} elements but {} were given",
                shape,
                shape.numel(),
                data.len()
            )));
        }
        Ok(HostTensor { shape, data })
    }

    /// Values converted to `dtype` (rounded for f16/bf16, truncated toward zero for ints,
    /// `!= 0` for bool).
    pub fn from_f64(dtype: DType, shape: impl Into<Shape>, values: &[f64]) -> Result<HostTensor> {
        let data = match dtype {
            DType::F32 => HostData::F32(values.iter().map(|&v| v as f32).collect()),
            DType::F16 => HostData::F16(values.iter().map(|&v| f16::from_f64(v)).collect()),
            DType::BF16 => HostData::BF16(values.iter().map(|&v| bf16::from_f64(v)).collect()),
            DType::I32 => HostData::I32(values.iter().map(|&v| v as i32).collect()),
            DType::I64 => HostData::I64(values.iter().map(|&v| v as i64).collect()),
            DType::Bool => HostData::Bool(values.iter().map(|&v| v != 0.0).collect()),
        };
        HostTensor::new(shape, data)
    }

    /// `value` everywhere, converted to `dtype` as [`HostTensor::from_f64`] converts it (once, not
    /// once an element: optimizer states of a 124M-parameter model are a few such tensors).
    pub fn full(dtype: DType, shape: impl Into<Shape>, value: f64) -> HostTensor {
        let shape = shape.into();
        let n = shape.numel();
        let one = HostTensor::from_f64(dtype, [1], &[value]).expect("one value for one element");
        let data = match one.data {
            HostData::F32(v) => HostData::F32(vec![v[0]; n]),
            HostData::F16(v) => HostData::F16(vec![v[0]; n]),
            HostData::BF16(v) => HostData::BF16(vec![v[0]; n]),
            HostData::I32(v) => HostData::I32(vec![v[0]; n]),
            HostData::I64(v) => HostData::I64(vec![v[0]; n]),
            HostData::Bool(v) => HostData::Bool(vec![v[0]; n]),
        };
        HostTensor::new(shape, data).expect("length matches by construction")
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    pub fn data(&self) -> &HostData {
        &self.data
    }

    /// Overwrites the values with `other`'s (same dtype and element count), keeping this
    /// allocation: an update in place.
    pub fn copy_from(&mut self, other: &HostTensor) -> Result<()> {
        self.data.copy_from(&other.data)
    }

    pub fn into_data(self) -> HostData {
        self.data
    }

    /// Same elements, another shape of equal size.
    pub fn reshaped(mut self, shape: impl Into<Shape>) -> Result<HostTensor> {
        let shape = shape.into();
        if shape.numel() != self.numel() {
            return Err(IrError::HostData(format!("cannot view {} as {}", self.shape, shape)));
        }
        self.shape = shape;
        Ok(self)
    }

    /// Element `i` (row-major) as f64; bool reads as 0 or 1.
    pub fn get_f64(&self, i: usize) -> f64 {
        match &self.data {
            HostData::F32(v) => v[i] as f64,
            HostData::F16(v) => v[i].to_f64(),
            HostData::BF16(v) => v[i].to_f64(),
            HostData::I32(v) => v[i] as f64,
            HostData::I64(v) => v[i] as f64,
            HostData::Bool(v) => v[i] as u8 as f64,
        }
    }

    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.numel()).map(|i| self.get_f64(i)).collect()
    }

    /// Little-endian bytes, as the device stores them (bool as one byte 0/1).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = vec![0; self.byte_len()];
        self.write_bytes(&mut bytes);
        bytes
    }

    /// The size of [`HostTensor::to_bytes`].
    pub fn byte_len(&self) -> usize {
        self.numel() * self.dtype().size_bytes()
    }

    /// Writes [`HostTensor::to_bytes`] into `out` (of [`HostTensor::byte_len`] bytes) with no
    /// buffer of its own: fixed-size chunks, which compile to a copy loop (a batch staged into
    /// pinned memory every step took a byte iterator's time before).
    pub fn write_bytes(&self, out: &mut [u8]) {
        assert_eq!(out.len(), self.byte_len(), "write_bytes into a buffer of another size");
        fn write<T: Copy, const N: usize>(v: &[T], out: &mut [u8], f: impl Fn(T) -> [u8; N]) {
            for (chunk, &x) in out.chunks_exact_mut(N).zip(v) {
                chunk.copy_from_slice(&f(x));
            }
        }
        match &self.data {
            HostData::F32(v) => write(v, out, f32::to_le_bytes),
            HostData::F16(v) => write(v, out, |x: f16| x.to_bits().to_le_bytes()),
            HostData::BF16(v) => write(v, out, |x: bf16| x.to_bits().to_le_bytes()),
            HostData::I32(v) => write(v, out, i32::to_le_bytes),
            HostData::I64(v) => write(v, out, i64::to_le_bytes),
            HostData::Bool(v) => write(v, out, |b: bool| [b as u8]),
        }
    }

    pub fn from_bytes(dtype: DType, shape: impl Into<Shape>, bytes: &[u8]) -> Result<HostTensor> {
        let shape = shape.into();
        let want = shape.numel() * dtype.size_bytes();
        if bytes.len() != want {
            return Err(IrError::HostData(format!("{dtype}{shape} needs {want} bytes, got {}", bytes.len())));
        }
        fn chunks<const N: usize>(b: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
            b.chunks_exact(N).map(|c| c.try_into().expect("chunk has N bytes"))
        }
        let data = match dtype {
            DType::F32 => HostData::F32(chunks::<4>(bytes).map(f32::from_le_bytes).collect()),
            DType::F16 => HostData::F16(chunks::<2>(bytes).map(|c| f16::from_bits(u16::from_le_bytes(c))).collect()),
            DType::BF16 => HostData::BF16(chunks::<2>(bytes).map(|c| bf16::from_bits(u16::from_le_bytes(c))).collect()),
            DType::I32 => HostData::I32(chunks::<4>(bytes).map(i32::from_le_bytes).collect()),
            DType::I64 => HostData::I64(chunks::<8>(bytes).map(i64::from_le_bytes).collect()),
            DType::Bool => HostData::Bool(bytes.iter().map(|&b| b != 0).collect()),
        };
        HostTensor::new(shape, data)
    }
}
