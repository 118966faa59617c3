//! The crate's one error type.

use std::fmt;
use thiserror::Error;

/// Everything a plan can be rejected for: a broken [`Rule`] of the validator, or JSON that does
/// not describe a plan.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PlanError {
    /// The plan breaks `rule`; `at` names where (`plan`, `kernel 3 (row_softmax_f32_k3)`,
    /// `output 1`), `detail` what was found.
    #[error("invalid plan: {at}: {detail} [{rule}]")]
    Invalid { rule: Rule, at: String, detail: String },
    /// [`crate::Plan::from_json`] was given text that is not a plan's JSON form.
    #[error("plan JSON: {0}")]
    Json(String),
}

impl PlanError {
    /// The rule an invalid plan breaks (`None` for JSON errors).
    pub fn rule(&self) -> Option<Rule> {
        match self {
            PlanError::Invalid { rule, .. } => Some(*rule),
            PlanError::Json(_) => None,
        }
    }
}

/// The rules [`crate::Plan::validate`] enforces: the contract between fusion, which writes
/// plans, and every backend that runs them (the CPU executor, codegen, the GPU executor). A plan
/// that passes them can be run without an out-of-bounds access or a type confusion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Every buffer id (plan inputs and outputs, kernel inputs and outputs) names a buffer of
    /// the plan.
    BufferIds,
    /// `plan.inputs[i]` is the buffer whose role is `Input(i)`, and every `Input(i)` buffer is
    /// `plan.inputs[i]`.
    InputRoles,
    /// A kernel reads only graph inputs and buffers an earlier kernel wrote.
    ReadBeforeWrite,
    /// No kernel writes a graph input, and every other buffer is written by at most one kernel
    /// and at most once by it: a plan computes every value in exactly one kernel. The exception:
    /// attention gradients whose layouts are whole rows of a buffer side by side
    /// ([`crate::Plan::output_part`]) may write one buffer together, from one kernel or
    /// several, each its own columns; the buffer counts as written (readable) once their columns
    /// cover its rows, and a buffer left partly written is an error.
    SingleWriter,
    /// An `InPlace(n)` buffer names an input of the plan, has its dtype and element count, and
    /// is the only one in place of it; input `n` is not itself a plan output (the caller would
    /// get memory the plan overwrites). Once a kernel writes it, no later kernel reads input
    /// `n` (it would read the new values), and the writing kernel itself reads input `n` only at
    /// the element it stores ([`crate::Kernel::reads_only_stored_element`]); otherwise the value
    /// is computed into a temporary and copied in by a last kernel.
    InPlace,
    /// Every plan output names a buffer that is a graph input or was written, holding exactly
    /// the elements of the output's shape.
    Outputs,
    /// Kernel names are C identifiers (codegen names entry points after them) and unique in the
    /// plan.
    KernelNames,
    /// In a kernel body, values refer only to earlier values (SSA), and stores to existing ones.
    ValueOrder,
    /// Unary, binary, where and reduce values have the dtype the IR's typing rules
    /// (`braze_ir::infer`) give their operands, and a constant's value is of its dtype's kind
    /// (`Literal::fits`).
    ValueTypes,
    /// A load names an input slot of its kernel, has that buffer's dtype (or is the f32 value of
    /// an f16/bf16 buffer: a load may widen, exactly), gives one stride per
    /// domain dim, and stays inside the buffer whenever it runs (a load of an empty domain, or
    /// of the columns of rows with no columns, never runs).
    Loads,
    /// Reductions appear only in row and column kernels. A float reduction accumulates in f32 whatever its
    /// dtype; an f16/bf16 result stays unrounded, as every computed value does until a cast or a
    /// store.
    Reductions,
    /// Each output slot is stored exactly once, from a value of the buffer's dtype that fills
    /// the buffer exactly: the domain's elements for pointwise kernels; for row kernels one
    /// element per row for per-row values and `rows * cols` for the others; for column kernels
    /// one element per column.
    Stores,
    /// In a column kernel no reduction's operand is computed from another reduction (one pass
    /// over the rows computes them all), and every store writes a per-column value
    /// (`Body::column_values`): an element value varies with the row and has no place in the
    /// `[cols]` outputs.
    ColumnReduce,
    /// A row kernel's partials ([`crate::ColumnPartial`]) fold float values by sum, max or min
    /// in groups of `partial_rows` rows (at least one), at most
    /// [`crate::RowKernel::MAX_PARTIALS`] of them over rows of at most
    /// [`crate::RowKernel::MAX_PARTIAL_COLS`] columns; each writes an output slot of its own (no
    /// store writes it), an f32 buffer of `groups * cols` elements.
    ColumnPartials,
    /// A multi-reduce has one input per leaf of each item (its reduction's `leaves`, at least
    /// one), in item order, each holding the item's elements of its reduction's dtype. Each
    /// reduction's prologue computes at least one value, stores nothing, loads only the current
    /// element of a leaf (`load inL offset=0 strides=[1]`, L < leaves) as that dtype, and
    /// reducing its last value keeps the value's dtype (the item's result dtype). The epilogue
    /// loads only item results (`load inI offset=0 strides=[]`, of item I's result dtype), has no
    /// reductions and no body stores; its element stores write every element of every output
    /// exactly once, each from a value of the output's dtype; an epilogue that computes anything
    /// has an item to finish it.
    MultiReduce,
    /// A matmul has inputs A, B (and the bias when it has one) and one output, all of its float
    /// dtype; every batch of A and B lies inside its buffer, the bias holds `n` elements and the
    /// output `batch * m * n`; its activation is one of `MatMul::EPILOGUE_ACTIVATIONS`.
    MatMul,
    /// A concat's axis is a dim of its shape; it has one input per extent and one output, all
    /// of its dtype; the extents add up to the shape's extent along the axis, input `i` holds
    /// the shape with `extents[i]` along the axis, and the output holds the shape.
    Concat,
    /// A multi-pointwise kernel has at least one member; each member's body is a pointwise body
    /// over the member's shape (the [`Rule::Loads`] and [`Rule::ValueTypes`] rules, loads naming
    /// the kernel's input slots) that stores at least once; every output slot of the kernel is
    /// stored by exactly one store of one member, from a value of the buffer's dtype that fills
    /// it with that member's elements.
    MultiPointwise,
    /// An attention kernel's dtype is a float; it reads q, k, v of that dtype holding `batch *
    /// seq * head_dim` elements each; its results are `Out` and/or `Lse`, in that order, each
    /// once, one per output slot: `Out` of the dtype and the operands' size, `Lse` f32 with
    /// `batch * seq` elements; its scale is finite and positive.
    Attention,
    /// An attention backward kernel reads q, k, v (the dtype, `batch * seq * head_dim`
    /// elements), lse and delta (f32, `batch * seq`) and dout (as q); its grads are `[Query]` or
    /// a nonempty run of `Key`, `Value` in that order, one output slot each, of the dtype and
    /// q's size, each layout covering its buffer once (or, for a gradient written as columns of
    /// a shared buffer's rows, [`crate::Plan::output_part`], lying inside it); its dtype is a
    /// float and its scale finite and positive.
    AttentionBackward,
    /// A gather appears only in pointwise bodies (of pointwise and multi-pointwise kernels) and
    /// is a load (its rules) whose index is an integer value of the body, whose
    /// `check` names one of the plan's checks with the gather's bound, and which stays inside
    /// its buffer at every index of `0..bound` (with a bound of 0 it reads nothing).
    Gathers,
    /// An index value (an arange's element) appears only in pointwise bodies (of pointwise and
    /// multi-pointwise kernels), where it is the element's flat index in the domain, and is of a
    /// number dtype.
    Indices,
    /// An index-add reads a src of its dtype (`outer * indices * inner` elements) and
    /// `indices` integers of its index dtype (i32 or i64), and writes `outer * size * inner`
    /// elements of its dtype, a number (not bool).
    IndexAdd,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

pub type Result<T> = std::result::Result<T, PlanError>;
