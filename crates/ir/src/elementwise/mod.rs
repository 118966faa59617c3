//! The elementwise op table: every unary and binary op defined once, with everything the
//! pipeline needs to know about it.
//!
//! An op's entry ([`UnaryDef`], [`BinaryDef`]) holds its name, the dtypes it accepts and its
//! result type (read by `infer`, the typing rules' one home), its properties, its scalar
//! semantics written once generic over [`Real`] (so the f64 reference and the f32 plan executor
//! run the same definition), its CUDA C expression (text, with the device helper it calls) and
//! its derivative. `UnaryOp::def` and `BinaryOp::def` match every variant, and every field of an
//! entry must be given, so a new op with a missing piece does not compile.
//!
//! Adding an op: a line in its list in `ops.rs`, which also names its `Tensor` method, and its
//! entry in `unary.rs` (or `binary.rs`) with its semantics; then its tests.

mod binary;
mod derivative;
mod ops;
mod philox;
mod real;
mod unary;

pub use derivative::{DVal, Derivative, DerivativeBuilder, GradientsFormula, Partials};
pub use ops::{BinaryOp, UnaryOp};
pub use philox::{philox4x32_10, philox_word};
pub use real::{nan_max, nan_min, Real};

use crate::DType;

pub use binary::BinaryDef;
pub use unary::UnaryDef;

/// One element widened to its computing type: floats in `R`, integers in i64, bools.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Elem<R> {
    Float(R),
    Int(i64),
    Bool(bool),
}

/// Which operand dtypes an op accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepts {
    /// f32, f16, bf16.
    Float,
    /// Floats and integers.
    Numeric,
    /// i32 and i64.
    Integer,
    /// Bool only.
    Bool,
    /// Every dtype.
    Any,
}

impl Accepts {
    pub fn allows(self, dtype: DType) -> bool {
        match self {
            Accepts::Float => dtype.is_float(),
            Accepts::Numeric => dtype != DType::Bool,
            Accepts::Integer => dtype.is_int(),
            Accepts::Bool => dtype == DType::Bool,
            Accepts::Any => true,
        }
    }
}

/// The result dtype of an op given its operands'.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Yields {
    /// The operands' dtype.
    Same,
    /// Bool (predicates, comparisons).
    Bool,
}

impl Yields {
    pub fn dtype(self, operand: DType) -> DType {
        match self {
            Yields::Same => operand,
            Yields::Bool => DType::Bool,
        }
    }
}

/// How the f32 result of a fused kernel relates to the f64 reference rounded to the same dtype,
/// given operands with the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exactness {
    /// No rounding at all (sign changes, selections, comparisons, integer-valued results): the
    /// same bits in every float dtype.
    Exact,
    /// One correctly rounded IEEE operation: the same bits in f32; in f16/bf16 the kernel keeps
    /// the f32 result where the reference rounds after every op.
    CorrectlyRounded,
    /// A math-library function within a few ulps.
    Approximate,
}

impl Exactness {
    /// Whether the op's result has the reference's bits in `dtype`.
    pub fn exact_in(self, dtype: DType) -> bool {
        match self {
            Exactness::Exact => true,
            Exactness::CorrectlyRounded => !dtype.is_narrow_float(),
            Exactness::Approximate => !dtype.is_float(),
        }
    }
}

/// The C type an operand has in a kernel's registers (f16/bf16 compute in float).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CType {
    Float,
    I32,
    I64,
    Bool,
}

impl CType {
    pub fn of(dtype: DType) -> CType {
        match dtype {
            DType::F32 | DType::F16 | DType::BF16 => CType::Float,
            DType::I32 => CType::I32,
            DType::I64 => CType::I64,
            DType::Bool => CType::Bool,
        }
    }

    /// The signed C type of an integer.
    pub fn signed(self) -> &'static str {
        if self == CType::I32 {
            "int"
        } else {
            "long long"
        }
    }

    /// The unsigned C type of an integer, for wrapping arithmetic (signed overflow is undefined
    /// in C++).
    pub fn unsigned(self) -> &'static str {
        if self == CType::I32 {
            "unsigned"
        } else {
            "unsigned long long"
        }
    }

    /// Unsigned zero of the integer's width.
    pub fn unsigned_zero(self) -> &'static str {
        if self == CType::I32 {
            "0u"
        } else {
            "0ull"
        }
    }
}

/// A device function that an op's CUDA expression calls, emitted once per translation unit,
/// after the helpers it calls (`requires`).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaHelper {
    pub name: &'static str,
    pub source: &'static [&'static str],
    pub requires: &'static [&'static CudaHelper],
}

/// An op's CUDA C expression and the helper it needs, if any.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaExpr {
    pub text: String,
    pub helper: Option<&'static CudaHelper>,
}

impl CudaExpr {
    fn plain(text: String) -> CudaExpr {
        CudaExpr { text, helper: None }
    }

    fn with_helper(self, helper: &'static CudaHelper) -> CudaExpr {
        CudaExpr { helper: Some(helper), ..self }
    }

    fn call(helper: &'static CudaHelper, args: &[&str]) -> CudaExpr {
        CudaExpr { text: format!("{}({})", helper.name, args.join(", ")), helper: Some(helper) }
    }
}
