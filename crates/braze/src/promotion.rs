//! Type promotion as PyTorch's: operands of different dtypes are cast to a common one before the
//! op is recorded, so the IR itself stays strictly typed (every binary op there has one dtype).
//!
//! Categories rank bool < integer < float. Between two tensors of the same rank class the higher
//! category wins, and within a category the wider type (f16 with bf16 gives f32, i32 with i64
//! gives i64). A rank-0 tensor beside a tensor of higher rank only decides the type when its
//! category is higher (`f32[3] + bf16[]` stays f32, `i32[3] + f16[]` is f16). A host scalar is an
//! integer when it is a whole finite number and a float otherwise (Rust's `f64` does not tell `2`
//! from `2.0`), and promotes as PyTorch's Python scalars do: it never widens a tensor of its own
//! category or above, an integer scalar turns a bool tensor into i64, a float scalar turns an
//! integer or bool tensor into f32 (the default float dtype).

use braze_ir::DType;

/// Where a dtype sits in PyTorch's ordering of kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Category {
    Bool,
    Int,
    Float,
}

fn category(dtype: DType) -> Category {
    if dtype.is_float() {
        Category::Float
    } else if dtype.is_int() {
        Category::Int
    } else {
        Category::Bool
    }
}

/// The smallest dtype holding both (`torch.promote_types`).
pub(crate) fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    match (a, b) {
        _ if a == b => a,
        (F16, BF16) | (BF16, F16) => F32,
        _ if category(a) != category(b) => {
            if category(a) > category(b) {
                a
            } else {
                b
            }
        }
        // Same category, different widths: f32 over f16/bf16, i64 over i32.
        (F32, _) | (_, F32) => F32,
        _ => I64,
    }
}

/// The common dtype of tensor operands given as `(dtype, rank)`: dimensioned tensors first, and
/// rank-0 tensors only where their category is higher than every dimensioned one's.
pub(crate) fn result_type(operands: &[(DType, usize)]) -> DType {
    let fold =
        |rank0: bool| operands.iter().filter(|(_, rank)| (*rank == 0) == rank0).map(|(d, _)| *d).reduce(promote_types);
    match (fold(false), fold(true)) {
        (Some(dims), Some(scalar)) if category(scalar) > category(dims) => promote_types(dims, scalar),
        (Some(dims), _) => dims,
        (None, Some(scalar)) => scalar,
        (None, None) => DType::F32,
    }
}

/// The dtype a tensor of `dtype` and a host scalar `value` compute in.
pub(crate) fn with_scalar(dtype: DType, value: f64) -> DType {
    let whole = value.is_finite() && value.fract() == 0.0;
    match category(dtype) {
        Category::Float => dtype,
        Category::Int if whole => dtype,
        Category::Bool if whole => DType::I64,
        _ => DType::F32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    #[test]
    fn tensor_pairs_promote_as_torch_promote_types() {
        // (a, b, torch.promote_types(a, b))
        let table = [
            (F32, BF16, F32),
            (F16, BF16, F32),
            (BF16, F16, F32),
            (F16, F32, F32),
            (I32, I64, I64),
            (I64, I32, I64),
            (Bool, I32, I32),
            (Bool, I64, I64),
            (I64, F16, F16),
            (I32, BF16, BF16),
            (Bool, F16, F16),
            (BF16, BF16, BF16),
        ];
        for (a, b, want) in table {
            assert_eq!(promote_types(a, b), want, "{a} with {b}");
            assert_eq!(result_type(&[(a, 2), (b, 1)]), want, "{a}[..] with {b}[..]");
        }
    }

    #[test]
    fn rank0_tensors_decide_only_from_a_higher_category() {
        assert_eq!(result_type(&[(F32, 1), (BF16, 0)]), F32);
        assert_eq!(result_type(&[(BF16, 1), (F32, 0)]), BF16);
        assert_eq!(result_type(&[(I32, 1), (I64, 0)]), I32);
        assert_eq!(result_type(&[(I32, 1), (F16, 0)]), F16);
        assert_eq!(result_type(&[(Bool, 1), (I64, 0)]), I64);
        assert_eq!(result_type(&[(F16, 0), (BF16, 0)]), F32);
    }

    #[test]
    fn scalars_promote_as_python_scalars() {
        assert_eq!(with_scalar(I32, 2.0), I32);
        assert_eq!(with_scalar(I32, 0.5), F32);
        assert_eq!(with_scalar(I64, f64::INFINITY), F32);
        assert_eq!(with_scalar(Bool, 1.0), I64);
        assert_eq!(with_scalar(Bool, 0.5), F32);
        assert_eq!(with_scalar(BF16, 0.5), BF16);
        assert_eq!(with_scalar(F16, 3.0), F16);
    }
}
