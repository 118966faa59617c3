//! One element at a time: reading and writing host data with the reference's rounding. The
//! semantics of the elementwise ops themselves live in braze-ir's op table.

use braze_ir::elementwise::Elem;
use braze_ir::rounding::{f64_to_bf16, f64_to_f16};
use braze_ir::{DType, HostData};

/// An element widened to its computing type: floats in f64, integers in i64.
pub(crate) type Scalar = Elem<f64>;

/// Reading elements of host data, and their numeric views.
pub(crate) trait ScalarExt {
    /// The element at flat offset `i` of `data`, widened without loss.
    fn read(data: &HostData, i: usize) -> Scalar;
    /// The value as a float (bool as 0/1); the caller knows it is numeric.
    fn to_f64(self) -> f64;
    fn to_bool(self) -> bool;
}

impl ScalarExt for Scalar {
    fn read(data: &HostData, i: usize) -> Scalar {
        match data {
            HostData::F32(v) => Scalar::Float(v[i] as f64),
            HostData::F16(v) => Scalar::Float(v[i].to_f64()),
            HostData::BF16(v) => Scalar::Float(v[i].to_f64()),
            HostData::I32(v) => Scalar::Int(v[i] as i64),
            HostData::I64(v) => Scalar::Int(v[i]),
            HostData::Bool(v) => Scalar::Bool(v[i]),
        }
    }

    fn to_f64(self) -> f64 {
        match self {
            Scalar::Float(x) => x,
            Scalar::Int(x) => x as f64,
            Scalar::Bool(b) => b as u8 as f64,
        }
    }

    fn to_bool(self) -> bool {
        match self {
            Scalar::Float(x) => x != 0.0,
            Scalar::Int(x) => x != 0,
            Scalar::Bool(b) => b,
        }
    }
}

/// Empty storage of `dtype` with room for `capacity` elements.
pub(crate) fn empty_data(dtype: DType, capacity: usize) -> HostData {
    match dtype {
        DType::F32 => HostData::F32(Vec::with_capacity(capacity)),
        DType::F16 => HostData::F16(Vec::with_capacity(capacity)),
        DType::BF16 => HostData::BF16(Vec::with_capacity(capacity)),
        DType::I32 => HostData::I32(Vec::with_capacity(capacity)),
        DType::I64 => HostData::I64(Vec::with_capacity(capacity)),
        DType::Bool => HostData::Bool(Vec::with_capacity(capacity)),
    }
}

/// Appends `value` converted to the storage's dtype with cast semantics: floats round to nearest
/// even, float -> int truncates toward zero and saturates (NaN -> 0), int -> int wraps,
/// anything -> bool is `!= 0`, bool -> number is 0/1.
pub(crate) fn push(data: &mut HostData, value: Scalar) {
    match (data, value) {
        (HostData::F32(v), Scalar::Int(x)) => v.push(x as f32),
        (HostData::F32(v), s) => v.push(s.to_f64() as f32),
        (HostData::F16(v), s) => v.push(f64_to_f16(s.to_f64())),
        (HostData::BF16(v), s) => v.push(f64_to_bf16(s.to_f64())),
        (HostData::I32(v), Scalar::Float(x)) => v.push(x as i32),
        (HostData::I32(v), Scalar::Int(x)) => v.push(x as i32),
        (HostData::I32(v), Scalar::Bool(b)) => v.push(b as i32),
        (HostData::I64(v), Scalar::Float(x)) => v.push(x as i64),
        (HostData::I64(v), Scalar::Int(x)) => v.push(x),
        (HostData::I64(v), Scalar::Bool(b)) => v.push(b as i64),
        (HostData::Bool(v), s) => v.push(s.to_bool()),
    }
}
