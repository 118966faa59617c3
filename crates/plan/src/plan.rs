//! The plan: what fusion produces and every backend consumes.
//!
//! A [`Plan`] is an ordered list of [`Kernel`]s over [`Buffer`]s. Every buffer is a dense,
//! contiguous, row-major array of one dtype; views (reshape, permute, slice, broadcast) never get
//! buffers of their own: they become strided [`Expr::Load`]s inside the kernels that read them, or a
//! reshape of an output is a [`PlanOutput`] with another shape over the same buffer.
//!
//! Kernel bodies are small SSA programs ([`Body`]) over an iteration domain. Float values are
//! computed in f32 whatever their storage dtype: a load of f16/bf16 widens to f32, a [`Expr::Cast`]
//! to f16/bf16 rounds (the value stays in f32 registers, rounded), a store narrows to the buffer's
//! dtype. Integers compute in their own width, bools as bools. Op semantics are those of
//! `braze-cpu`'s reference (NaN-propagating max/min, relu(-0.0) = +0.0, int x/0 = 0, ...).

use braze_ir::{AttentionInput, BinaryOp, DType, Literal, ReduceOp, Shape, SourceLoc, UnaryOp};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Index of a buffer in [`Plan::buffers`]. Prints as `b3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BufferId(pub usize);

impl fmt::Display for BufferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b{}", self.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BufferRole {
    /// Graph input number `n`; owned by the caller, never written.
    Input(usize),
    /// Written by one kernel (or, in parts, by attention gradients: [`crate::Rule::SingleWriter`])
    /// and read by later ones; a memory planner may reuse its storage once its last reader has run.
    Intermediate,
    /// Read by the caller after the plan ran (possibly also by later kernels).
    Output,
    /// An output that lives in the memory of graph input number `n` (a write-back: a captured
    /// tensor updated in place): after the plan ran, the input's memory holds it. Which kernels
    /// may write and read it is [`crate::Rule::InPlace`].
    InPlace(usize),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    pub dtype: DType,
    /// Number of elements (may exceed 2^31; may be 0).
    pub numel: usize,
    pub role: BufferRole,
}

impl Buffer {
    pub fn bytes(&self) -> usize {
        self.numel * self.dtype.size_bytes()
    }
}

/// Graph output `j` is `buffer` read with `shape` (same element count, row-major).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanOutput {
    pub buffer: BufferId,
    pub shape: Shape,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub buffers: Vec<Buffer>,
    /// Buffer of graph input `i`.
    pub inputs: Vec<BufferId>,
    pub outputs: Vec<PlanOutput>,
    /// In execution order: a kernel only reads buffers that are graph inputs or written by an
    /// earlier kernel.
    pub kernels: Vec<Kernel>,
    /// The run-time checks kernels raise ([`Expr::Gather::check`] refers to these): a backend
    /// runs the plan, then turns the first raised check into an error.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<Check>,
}

/// A condition a kernel checks while it runs and reports instead of failing: an index out of
/// range. A raised check never makes a kernel read or write out of bounds (the read is clamped);
/// the backend reports it after the plan ran (the GPU backend at a later call or host read,
/// without waiting for the run), naming the op, the index and the bound.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// The op of the graph that indexes, e.g. `embedding`.
    pub op: String,
    pub loc: Option<SourceLoc>,
    /// Indices must be in `0..bound`.
    pub bound: usize,
}

/// One op of the source graph that a kernel implements, for comments, explain and dumps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SourceOp {
    pub op: String,
    pub loc: Option<SourceLoc>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    /// Deterministic, descriptive and unique within the plan, a valid C identifier, e.g.
    /// `row_layer_norm_relu_add_f32_k0`.
    pub name: String,
    pub kind: KernelKind,
    /// Kernel input slot `i` reads `inputs[i]` ([`Expr::Load::input`] refers to these slots).
    pub inputs: Vec<BufferId>,
    /// Kernel output slot `o` writes `outputs[o]` ([`Store::output`] refers to these slots).
    pub outputs: Vec<BufferId>,
    /// The graph ops fused into this kernel, in topological order.
    pub sources: Vec<SourceOp>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum KernelKind {
    Pointwise(Pointwise),
    Row(RowKernel),
    MultiReduce(MultiReduce),
    MatMul(MatMul),
    Concat(Concat),
    Column(ColumnKernel),
    MultiPointwise(MultiPointwise),
    Attention(Attention),
    AttentionBackward(AttentionBackward),
    IndexAdd(IndexAdd),
}

impl KernelKind {
    pub fn family(&self) -> &'static str {
        match self {
            KernelKind::Pointwise(_) => "pointwise",
            KernelKind::Row(_) => "row",
            KernelKind::MultiReduce(_) => "multi_reduce",
            KernelKind::MatMul(_) => "matmul",
            KernelKind::Concat(_) => "concat",
            KernelKind::Column(_) => "column",
            KernelKind::MultiPointwise(_) => "multi_pointwise",
            KernelKind::Attention(_) => "attention",
            KernelKind::AttentionBackward(_) => "attention_backward",
            KernelKind::IndexAdd(_) => "index_add",
        }
    }
}

/// Index of a value in [`Body::values`]. Prints as `v3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ValueId(pub usize);

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// An SSA program over an iteration domain. Values only refer to earlier values.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Body {
    pub values: Vec<Value>,
    pub stores: Vec<Store>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Value {
    pub expr: Expr,
    /// The logical dtype (f16/bf16 values live in f32 registers).
    pub dtype: DType,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Expr {
    /// Reads kernel input slot `input` at element offset `offset + sum(coord[d] * strides[d])`,
    /// where `coord` is the iteration coordinate over the kernel's domain dims (one stride per
    /// domain dim; 0 on broadcast dims). Strides express broadcast, permute and slice views.
    Load {
        input: usize,
        offset: usize,
        strides: Vec<usize>,
    },
    /// Reads kernel input slot `input` at `offset + sum(coord[d] * strides[d]) + i * index_stride`,
    /// where `i` is the integer value `index` clamped to `0..bound`; an `index` outside raises
    /// check `check` of the plan ([`Plan::checks`]). The gather of an index_select: `strides`
    /// walk the dims around the indexed axis, `index` is a load of the indices.
    Gather {
        input: usize,
        offset: usize,
        strides: Vec<usize>,
        index: ValueId,
        index_stride: usize,
        bound: usize,
        check: usize,
    },
    /// A scalar of the value's dtype; the literal's kind matches it.
    Const {
        value: Literal,
    },
    /// Pointwise kernels only: the element's flat index in the kernel's domain, in the value's
    /// dtype (an arange; f16/bf16 round it as a cast would).
    Index,
    /// Converts `x` to the value's dtype.
    Cast {
        x: ValueId,
    },
    Unary {
        op: UnaryOp,
        x: ValueId,
    },
    Binary {
        op: BinaryOp,
        a: ValueId,
        b: ValueId,
    },
    Where {
        cond: ValueId,
        a: ValueId,
        b: ValueId,
    },
    /// Row kernels: reduces `x` over the inner (column) dims of the current row; the result is a
    /// per-row value. Column kernels: reduces `x` over the rows of the current column; the result
    /// is a per-column value. Only `Sum`, `Max` and `Min` appear (a mean is a sum times 1/n).
    /// Float sums accumulate in f32.
    Reduce {
        op: ReduceOp,
        x: ValueId,
    },
}

impl Expr {
    pub fn operands(&self) -> Vec<ValueId> {
        match self {
            Expr::Load { .. } | Expr::Const { .. } | Expr::Index => vec![],
            Expr::Cast { x } | Expr::Unary { x, .. } | Expr::Reduce { x, .. } => vec![*x],
            Expr::Gather { index, .. } => vec![*index],
            Expr::Binary { a, b, .. } => vec![*a, *b],
            Expr::Where { cond, a, b } => vec![*cond, *a, *b],
        }
    }

    /// Whether this value reads its f16/bf16 operands rounded to their dtype, as eager code
    /// holds them, rather than as the f32 a kernel keeps a computed narrow value in: a cast to
    /// another dtype and a discontinuous op (a comparison, a step) do, so that every kernel
    /// breaks a tie the same way (gradient fuzz seed 5,101,752: one kernel compared an f32
    /// cosine, another its stored bf16 rounding). Codegen and the CPU plan executor both follow it.
    pub fn observes_rounded_operands(&self) -> bool {
        match self {
            Expr::Cast { .. } => true,
            Expr::Unary { op, .. } => !op.def().continuous,
            Expr::Binary { op, .. } => !op.def().continuous,
            _ => false,
        }
    }
}

/// Writes `value` to kernel output slot `output`, contiguously: element values of a pointwise
/// kernel at the flat domain index; in a row kernel, element values at `row * cols + col` and
/// per-row values at `row`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Store {
    pub value: ValueId,
    pub output: usize,
}

/// Elementwise over `shape`: every store writes `shape.numel()` elements.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pointwise {
    pub shape: Shape,
    pub body: Body,
}

/// Reductions over rows with prologue and epilogue. The domain is `outer ++ inner`: a row is one
/// coordinate of `outer` (rows = product of `outer`), its columns range over `inner`
/// (cols = product of `inner`). Values are either per-element (vary with the column) or per-row
/// (see [`Body::row_values`]); several dependent reductions may follow each other in one body
/// (layer norm: mean, then variance), and whole chains of row-local layers may share one kernel.
///
/// A row kernel may also fold values down its columns ([`ColumnPartial`]): the rows are cut into
/// groups of `partial_rows`, and for each group and column the kernel writes the group's fold of
/// the value, so that a column kernel over the `[groups, cols]` partials finishes the reduction
/// (a layer norm's weight and bias grads from the rows its backward reads anyway).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RowKernel {
    pub outer: Vec<usize>,
    pub inner: Vec<usize>,
    pub body: Body,
    /// Values folded over each group of `partial_rows` rows, column by column.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partials: Vec<ColumnPartial>,
    /// Rows per group of the partials (0 when there are none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub partial_rows: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Output slot `output` of a row kernel holds, for each group `g` of its rows and column `c`, the
/// fold by `op` (`Sum`, `Max` or `Min`, in f32) of `value` over the group's rows at column `c`,
/// at `g * cols + c`: an f32 buffer of `groups * cols` elements.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ColumnPartial {
    pub op: ReduceOp,
    pub value: ValueId,
    pub output: usize,
}

impl RowKernel {
    /// Most columns a row kernel with partials may have (codegen folds a block's row groups
    /// through one row of f32 in shared memory).
    pub const MAX_PARTIAL_COLS: usize = 8192;
    /// Most partials one row kernel may fold (codegen keeps them in registers).
    pub const MAX_PARTIALS: usize = 4;

    /// A row kernel without partials.
    pub fn new(outer: Vec<usize>, inner: Vec<usize>, body: Body) -> RowKernel {
        RowKernel { outer, inner, body, partials: Vec::new(), partial_rows: 0 }
    }
    pub fn rows(&self) -> usize {
        self.outer.iter().product()
    }
    pub fn cols(&self) -> usize {
        self.inner.iter().product()
    }
    /// Groups of `partial_rows` rows the partials fold (0 without partials).
    pub fn partial_groups(&self) -> usize {
        if self.partials.is_empty() || self.partial_rows == 0 {
            0
        } else {
            self.rows().div_ceil(self.partial_rows)
        }
    }
    /// Domain shape `outer ++ inner`, the shape the load strides index.
    pub fn domain(&self) -> Shape {
        Shape(self.outer.iter().chain(&self.inner).copied().collect())
    }
}

/// Reductions over leading axes with prologue and epilogue. The domain is `reduced ++ kept`: a
/// column is one coordinate of `kept` (cols = product of `kept`), its rows range over `reduced`
/// (rows = product of `reduced`); both are row-major, so element (row, col) of a contiguous input
/// sits at `row * cols + col`. Values are per-element (vary with the row) or per-column (see
/// [`Body::column_values`]). Every [`Expr::Reduce`] folds its operand over the rows of one column
/// and no reduction depends on another, so one pass over the rows computes them all (the weight
/// and bias grads of a layer norm share one kernel); stores write per-column values, `cols`
/// elements each. Backends split the rows into chunks and combine the chunks' partials in chunk
/// order, so a result has the same bits on every run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ColumnKernel {
    pub reduced: Vec<usize>,
    pub kept: Vec<usize>,
    pub body: Body,
}

impl ColumnKernel {
    pub fn rows(&self) -> usize {
        self.reduced.iter().product()
    }
    pub fn cols(&self) -> usize {
        self.kept.iter().product()
    }
    /// Domain shape `reduced ++ kept`, the shape the load strides index.
    pub fn domain(&self) -> Shape {
        Shape(self.reduced.iter().chain(&self.kept).copied().collect())
    }
}

/// Independent pointwise programs, possibly of different shapes and dtypes, in one launch
/// (horizontal fusion: an optimizer's update of every parameter). Member `m` is exactly what one
/// [`Pointwise`] kernel would be, except that its loads name this kernel's input slots and its
/// stores this kernel's output slots (members may share input slots; each output slot belongs to
/// one member). No member reads what another writes: the kernel's inputs are written before it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MultiPointwise {
    pub members: Vec<Pointwise>,
}

impl MultiPointwise {
    /// Elements over all members.
    pub fn numel(&self) -> usize {
        self.members.iter().map(|m| m.shape.numel()).sum()
    }
}

/// Item `i` reduces all `items[i].len` elements of its reduction's `leaves` kernel inputs
/// (contiguous, of the reduction's `dtype`; the items' inputs follow each other in item order,
/// see [`MultiReduce::first_inputs`]) after that reduction's per-element prologue. When every
/// item is done, the `epilogue` runs once over their results and `stores` write its values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MultiReduce {
    /// What the items compute; several items usually share one.
    pub reductions: Vec<ItemReduction>,
    pub items: Vec<ReduceItem>,
    /// A scalar program: `Load { input: i, offset: 0, strides: [] }` is item `i`'s result (of
    /// [`MultiReduce::result_dtype`]), not kernel input `i`; no reductions and no `stores` of
    /// its own (see [`MultiReduce::stores`]).
    pub epilogue: Body,
    /// Every element of every kernel output is written by exactly one of these.
    pub stores: Vec<ElementStore>,
}

/// One kind of item: `op` over the last value of `prologue`, a per-element program over a 1-D
/// domain in which `Load { input: l, offset: 0, strides: [1] }` reads the current element of the
/// item's leaf `l` (of `dtype`; `l < leaves`). `Mean` divides the sum by the item's length (NaN
/// for an empty item).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ItemReduction {
    pub op: ReduceOp,
    pub dtype: DType,
    /// Tensors of the item's length the prologue reads element by element (`sum((p - q)^2)`
    /// reads two).
    #[serde(default = "one_leaf", skip_serializing_if = "is_one_leaf")]
    pub leaves: usize,
    pub prologue: Body,
}

fn one_leaf() -> usize {
    1
}

fn is_one_leaf(leaves: &usize) -> bool {
    *leaves == 1
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReduceItem {
    /// Index into [`MultiReduce::reductions`].
    pub reduction: usize,
    pub len: usize,
}

/// Writes epilogue value `value` to element `index` of kernel output `output`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElementStore {
    pub value: ValueId,
    pub output: usize,
    pub index: usize,
}

impl ItemReduction {
    /// The dtype of an item's result: that of the reduced value (the validator holds every
    /// reduction to one that keeps it).
    pub fn result_dtype(&self) -> DType {
        self.prologue.values.last().map_or(self.dtype, |v| v.dtype)
    }
}

impl MultiReduce {
    /// The dtype of item `item`'s result.
    pub fn result_dtype(&self, item: usize) -> DType {
        self.reductions[self.items[item].reduction].result_dtype()
    }

    /// The load through which the epilogue reads item `item`'s result.
    pub fn result_load(item: usize) -> Expr {
        Expr::Load { input: item, offset: 0, strides: vec![] }
    }

    /// The load through which a prologue reads the item's current element (of its first leaf).
    pub fn element_load() -> Expr {
        MultiReduce::leaf_load(0)
    }

    /// The load through which a prologue reads the current element of the item's leaf `leaf`.
    pub fn leaf_load(leaf: usize) -> Expr {
        Expr::Load { input: leaf, offset: 0, strides: vec![1] }
    }

    /// The first kernel input slot of each item (its leaves are the slots from there on), and
    /// the number of input slots all items read; `None` where an item names no reduction.
    pub fn first_inputs(&self) -> Option<(Vec<usize>, usize)> {
        let mut next = 0;
        let mut firsts = Vec::with_capacity(self.items.len());
        for item in &self.items {
            firsts.push(next);
            next += self.reductions.get(item.reduction)?.leaves;
        }
        Some((firsts, next))
    }

    /// Total elements of all items.
    pub fn elements(&self) -> usize {
        self.items.iter().map(|it| it.len).sum()
    }
}

/// `out[b] = act(A[b] @ B[b] + bias)`, with row-major A `[m, k]` and B `[k, n]` per batch
/// (or their transposes when the flags say the buffer holds `[k, m]` / `[n, k]`). Kernel inputs:
/// 0 = A, 1 = B, 2 = bias `[n]` when `bias`. Output 0 is `[batch.., m, n]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MatMul {
    pub batch: Vec<usize>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dtype: DType,
    /// Elements between consecutive batch matrices of A (0: one A broadcast over the batch).
    pub a_batch_stride: usize,
    pub b_batch_stride: usize,
    pub a_transposed: bool,
    pub b_transposed: bool,
    pub bias: bool,
    /// Applied to every element after the bias; one of [`MatMul::EPILOGUE_ACTIVATIONS`].
    pub activation: Option<UnaryOp>,
}

impl MatMul {
    /// The activations a matmul's epilogue applies: those cuBLASLt's epilogues compute (its
    /// GELU is the tanh approximation).
    pub const EPILOGUE_ACTIVATIONS: &'static [UnaryOp] = &[UnaryOp::Relu, UnaryOp::GeluTanh];
}

/// The sizes every attention kernel shares: `batch` independent (batch, head) pairs of
/// `seq x head_dim` matrices (`[B, H, T, D]` with `batch = B H`), each operand placed in its
/// buffer by an [`OperandLayout`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionShape {
    pub batch: usize,
    /// How many of the pairs share a batch index: pair `p` is head `p % heads` of batch
    /// `p / heads` (what an operand layout's batch and head strides apply to).
    pub heads: usize,
    pub seq: usize,
    pub head_dim: usize,
    /// The storage dtype of q, k, v, the output and the gradients (a float).
    pub dtype: DType,
    /// Keys after the query are masked out (computed from the indices, never stored).
    pub causal: bool,
    /// Multiplies `q . k` before the softmax.
    pub scale: f64,
}

impl AttentionShape {
    /// Elements of one `[batch, seq, head_dim]` operand.
    pub fn operand_numel(&self) -> usize {
        self.batch * self.seq * self.head_dim
    }

    /// Query rows over all (batch, head) pairs: the elements of an lse or delta.
    pub fn rows(&self) -> usize {
        self.batch * self.seq
    }

    /// Multiply-adds of `q k^T` and `p v` (half of them for causal), for reporting FLOP rates.
    pub fn pair_count(&self) -> usize {
        let pairs = if self.causal { self.seq * (self.seq + 1) / 2 } else { self.seq * self.seq };
        self.batch * pairs
    }
}

/// Where an attention operand's `[batch, seq, head_dim]` elements lie in its buffer: row `t` of
/// pair `p` (batch `b = p / heads`, head `h = p % heads`) starts at element
/// `offset + b * batch_stride + h * head_stride + t * row_stride`, its `head_dim` elements
/// contiguous. A dense layout is `[B, H, T, D]` row-major; others let an attention kernel read
/// q, k and v straight out of a fused `[B, T, 3 H D]` projection and write its results in the
/// `[B, T, H, D]` order the next projection reads, with no copies between.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperandLayout {
    pub offset: usize,
    pub batch_stride: usize,
    pub head_stride: usize,
    pub row_stride: usize,
}

impl OperandLayout {
    /// `[B, H, T, D]` row-major.
    pub fn dense(s: &AttentionShape) -> OperandLayout {
        OperandLayout::dense_of(s.heads, s.seq, s.head_dim)
    }

    /// `[B, H, T, D]` row-major for `heads` heads of `seq x head_dim`.
    pub fn dense_of(heads: usize, seq: usize, head_dim: usize) -> OperandLayout {
        let head_stride = seq * head_dim;
        OperandLayout { offset: 0, batch_stride: heads * head_stride, head_stride, row_stride: head_dim }
    }

    /// `[B, T, H, D]` row-major (the heads of each row side by side, as one projection reads
    /// them), for `heads` heads of `seq x head_dim`.
    pub fn heads_merged(heads: usize, seq: usize, head_dim: usize) -> OperandLayout {
        let row_stride = heads * head_dim;
        OperandLayout { offset: 0, batch_stride: seq * row_stride, head_stride: head_dim, row_stride }
    }

    /// The columns of a row-major `[rows, row_stride]` buffer the layout covers for `s`, where
    /// its rows are whole buffer rows side by side: heads next to each other in a row, batches
    /// one after another. `None` for other layouts (the dense `[B, H, T, D]` one among them).
    pub fn row_part(&self, s: &AttentionShape) -> Option<RowPart> {
        // Checked: a plan read from JSON may hold any sizes, and the shape rules run later.
        let heads = s.heads.max(1);
        let width = heads.checked_mul(s.head_dim)?;
        let rows = (s.batch / heads).checked_mul(s.seq)?;
        let heads_side_by_side = heads == 1 || self.head_stride == s.head_dim;
        let fits = self.offset.checked_add(width).is_some_and(|end| end <= self.row_stride);
        let batches_in_order = s.seq.checked_mul(self.row_stride) == Some(self.batch_stride);
        (heads_side_by_side && fits && batches_in_order && s.batch.is_multiple_of(heads)).then_some(RowPart {
            rows,
            row_stride: self.row_stride,
            first: self.offset,
            width,
        })
    }

    /// The element where row `t` of pair `pair` starts.
    pub fn row_start(&self, s: &AttentionShape, pair: usize, t: usize) -> usize {
        let heads = s.heads.max(1);
        self.offset + (pair / heads) * self.batch_stride + (pair % heads) * self.head_stride + t * self.row_stride
    }

    /// One past the last element the layout reaches (`offset` when the operand is empty), or
    /// `None` when that overflows.
    pub fn extent(&self, s: &AttentionShape) -> Option<usize> {
        if s.batch == 0 || s.seq == 0 || s.head_dim == 0 {
            return Some(self.offset);
        }
        let heads = s.heads.max(1);
        let reach = |count: usize, stride: usize| (count - 1).checked_mul(stride);
        [
            reach(s.batch / heads, self.batch_stride)?,
            reach(heads, self.head_stride)?,
            reach(s.seq, self.row_stride)?,
            s.head_dim,
        ]
        .into_iter()
        .try_fold(self.offset, |sum, x| sum.checked_add(x))
    }

    /// Whether the layout places the operand's elements one to one on `0..operand_numel` (some
    /// order of the four axes, row-major): what a result's layout must be, so that its buffer is
    /// written whole and no element twice.
    pub fn covers_densely(&self, s: &AttentionShape) -> bool {
        if self.offset != 0 {
            return false;
        }
        let heads = s.heads.max(1);
        let mut axes = [
            (s.batch / heads, self.batch_stride),
            (heads, self.head_stride),
            (s.seq, self.row_stride),
            (s.head_dim, 1),
        ];
        if axes.iter().any(|&(n, _)| n == 0) {
            return true;
        }
        axes.sort_by_key(|&(n, stride)| (stride, n));
        let mut step = 1;
        for (n, stride) in axes {
            if n == 1 {
                continue;
            }
            if stride != step {
                return false;
            }
            step *= n;
        }
        true
    }

    /// Whether the offset and strides are multiples of `elements` (rows start where 16-byte
    /// copies may read them when `elements` is 16 bytes' worth).
    pub fn is_aligned_to(&self, elements: usize) -> bool {
        [self.offset, self.batch_stride, self.head_stride, self.row_stride].iter().all(|x| x.is_multiple_of(elements))
    }
}

/// What an attention kernel's output slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttentionResult {
    /// `softmax(scale q k^T) v`, `[batch, seq, head_dim]` of the dtype.
    Out,
    /// The natural logsumexp of each query row's scaled scores, f32 `[batch, seq]` (what the
    /// backward recomputes the probabilities from).
    Lse,
}

/// Flash-attention forward: inputs q, k, v (`[batch, seq, head_dim]` each); each output slot
/// holds one of `results` (`Out` before `Lse`, each at most once). No `seq x seq` matrix is
/// ever stored: a block keeps a tile of query rows and folds key tiles in with an online
/// softmax, accumulating in f32.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attention {
    pub shape: AttentionShape,
    pub results: Vec<AttentionResult>,
    /// Of q, k and v in their input slots.
    pub input_layouts: [OperandLayout; 3],
    /// Of the `Out` result (dense when there is none).
    pub out_layout: OperandLayout,
}

/// Flash-attention backward: inputs q, k, v, lse, delta (`rowsum(dout * out)`, f32 `[batch,
/// seq]`) and dout; each output slot holds the gradient of one of `grads`: either `[Query]`
/// (a kernel over query tiles) or `Key` and/or `Value` in that order (a kernel over key tiles).
/// Two kernels rather than one so that every gradient element is summed by one thread in one
/// order (no atomics: the results have the same bits on every run).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionBackward {
    pub shape: AttentionShape,
    pub grads: Vec<AttentionInput>,
    /// Of q, k, v and dout (input slots 0, 1, 2 and 5; lse and delta are dense `[batch, seq]`).
    pub input_layouts: [OperandLayout; 4],
    /// Of each gradient, in the order of `grads`.
    pub grad_layouts: Vec<OperandLayout>,
}

impl Attention {
    /// The layouts of q, k, v and the output.
    pub fn layouts(&self) -> Vec<OperandLayout> {
        let mut layouts = self.input_layouts.to_vec();
        layouts.push(self.out_layout);
        layouts
    }
}

impl AttentionBackward {
    /// The layouts of q, k, v, dout and the gradients.
    pub fn layouts(&self) -> Vec<OperandLayout> {
        let mut layouts = self.input_layouts.to_vec();
        layouts.extend(&self.grad_layouts);
        layouts
    }

    /// Kernel input slots, in order.
    pub const INPUTS: [&'static str; 6] = ["q", "k", "v", "lse", "delta", "dout"];
}

/// The scatter-add of an index_select's gradient: inputs src (`[outer, indices, inner]`,
/// contiguous, of `dtype`) and indices (`indices` integers of `index_dtype`); output 0 is
/// `[outer, size, inner]`, zero except that slice `j` of src is added at `indices[j]`. Every
/// output element sums its slices from zero in the order of the indices (in f32 for floats,
/// rounded to the dtype once at the end; wrapping for integers), so the result has the same bits
/// on every run; an index outside `0..size` adds nothing (the forward's check reports it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IndexAdd {
    pub outer: usize,
    pub indices: usize,
    pub inner: usize,
    pub size: usize,
    pub dtype: DType,
    pub index_dtype: DType,
}

/// Joins contiguous inputs along `axis`: input `i` has shape `shape` except `extents[i]` along
/// `axis`. Output 0 has `shape`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Concat {
    pub shape: Shape,
    pub axis: usize,
    pub extents: Vec<usize>,
    pub dtype: DType,
}

impl Body {
    pub fn push(&mut self, expr: Expr, dtype: DType) -> ValueId {
        self.values.push(Value { expr, dtype });
        ValueId(self.values.len() - 1)
    }

    /// For a row kernel whose domain has `outer_rank` outer dims: `true` for each value that is
    /// the same for every column of a row (a load with zero strides on every inner dim, a
    /// constant, a reduction, or an op on such values).
    pub fn row_values(&self, outer_rank: usize) -> Vec<bool> {
        self.invariant_values(|strides| &strides[outer_rank..])
    }

    /// For a column kernel whose domain has `reduced_rank` reduced dims: `true` for each value
    /// that is the same for every row of a column (a load with zero strides on every reduced
    /// dim, a constant, a reduction, or an op on such values).
    pub fn column_values(&self, reduced_rank: usize) -> Vec<bool> {
        self.invariant_values(|strides| &strides[..reduced_rank])
    }

    /// Values that do not change along the reduced dims, which `reduced` picks out of a load's
    /// strides.
    fn invariant_values(&self, reduced: impl Fn(&[usize]) -> &[usize]) -> Vec<bool> {
        let mut invariant = Vec::with_capacity(self.values.len());
        for v in &self.values {
            let r = match &v.expr {
                Expr::Load { strides, .. } => reduced(strides).iter().all(|&s| s == 0),
                Expr::Gather { strides, index, .. } => invariant[index.0] && reduced(strides).iter().all(|&s| s == 0),
                Expr::Const { .. } | Expr::Reduce { .. } => true,
                Expr::Index => false,
                e => e.operands().iter().all(|o| invariant[o.0]),
            };
            invariant.push(r);
        }
        invariant
    }
}

/// The source op of the kernel that copies a write-back into its input's memory when writing it
/// there directly is not safe (see [`crate::Rule::InPlace`]).
pub const WRITE_BACK_COPY: &str = "write_back_copy";

/// How a plan's in-place outputs are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteBackCounts {
    /// Written by the kernel that computes them.
    pub direct: usize,
    /// Computed into a temporary first, then copied in by a [`WRITE_BACK_COPY`] kernel.
    pub copied: usize,
}

/// Columns `first..first + width` of every row of a row-major `[rows, row_stride]` buffer:
/// what one kernel writes of a buffer that several write side by side (the attention gradients
/// of a fused q/k/v projection, written into their concat's rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowPart {
    pub rows: usize,
    pub row_stride: usize,
    pub first: usize,
    pub width: usize,
}

impl Kernel {
    /// Whether every load of input slot `input` reads, at each point of the domain, exactly the
    /// element the kernel stores to output slot `output` there, before storing it (so the
    /// output may overwrite the input in place). Only families whose every element is loaded,
    /// computed and stored by one thread qualify; the others answer `false`.
    pub fn reads_only_stored_element(&self, input: usize, output: usize) -> bool {
        match &self.kind {
            KernelKind::Pointwise(pw) => pointwise_reads_only_stored_element(pw, input),
            // A row kernel's thread stores the elements it loads (every pass walks the same
            // columns), so an input read only at the element stored is read before it is written.
            KernelKind::Row(row) => reads_only_at(&row.body, &row.domain(), input),
            // The member storing `output` must read `input` only there, and no other member may
            // read it at all: members run concurrently, so another's read could see a new value.
            KernelKind::MultiPointwise(multi) => multi.members.iter().all(|member| {
                let stores_output = member.body.stores.iter().any(|st| st.output == output);
                let reads_input = member
                    .body
                    .values
                    .iter()
                    .any(|v| matches!(&v.expr, Expr::Load { input: slot, .. } if *slot == input));
                if stores_output {
                    pointwise_reads_only_stored_element(member, input)
                } else {
                    !reads_input
                }
            }),
            KernelKind::Column(_)
            | KernelKind::MultiReduce(_)
            | KernelKind::MatMul(_)
            | KernelKind::Concat(_)
            | KernelKind::Attention(_)
            | KernelKind::AttentionBackward(_)
            | KernelKind::IndexAdd(_) => false,
        }
    }
}

/// Whether every load of input slot `input` in `pw` reads the element at the point being computed.
fn pointwise_reads_only_stored_element(pw: &Pointwise, input: usize) -> bool {
    reads_only_at(&pw.body, &pw.shape, input)
}

/// Whether every load of input slot `input` in `body` over `domain` reads the element at the
/// point being computed.
fn reads_only_at(body: &Body, domain: &Shape, input: usize) -> bool {
    let contiguous = domain.strides();
    body.values.iter().all(|v| match &v.expr {
        Expr::Load { input: slot, offset, strides } if *slot == input => {
            *offset == 0 && strides.iter().zip(&contiguous).zip(domain.dims()).all(|((s, c), &d)| d == 1 || s == c)
        }
        Expr::Gather { input: slot, .. } => *slot != input,
        _ => true,
    })
}

impl Plan {
    pub fn buffer(&self, id: BufferId) -> &Buffer {
        &self.buffers[id.0]
    }

    /// Removes the intermediates no kernel writes or reads (left behind by a rewrite that
    /// stopped storing them), renumbering the buffers after them.
    pub fn remove_unused_intermediates(&mut self) {
        let mut used = vec![false; self.buffers.len()];
        for k in &self.kernels {
            for b in k.inputs.iter().chain(&k.outputs) {
                used[b.0] = true;
            }
        }
        for o in &self.outputs {
            used[o.buffer.0] = true;
        }
        for (b, buffer) in self.buffers.iter().enumerate() {
            used[b] |= buffer.role != BufferRole::Intermediate;
        }
        if used.iter().all(|&u| u) {
            return;
        }
        let mut renumbered = vec![BufferId(usize::MAX); self.buffers.len()];
        let mut next = 0;
        for (b, &u) in used.iter().enumerate() {
            if u {
                renumbered[b] = BufferId(next);
                next += 1;
            }
        }
        let mut b = 0;
        self.buffers.retain(|_| {
            b += 1;
            used[b - 1]
        });
        let map = |id: &mut BufferId| *id = renumbered[id.0];
        self.inputs.iter_mut().for_each(map);
        self.outputs.iter_mut().for_each(|o| map(&mut o.buffer));
        for k in &mut self.kernels {
            k.inputs.iter_mut().for_each(map);
            k.outputs.iter_mut().for_each(map);
        }
    }

    /// The inputs some output is written in place of.
    pub fn in_place_inputs(&self) -> Vec<usize> {
        self.buffers.iter().filter_map(|b| if let BufferRole::InPlace(n) = b.role { Some(n) } else { None }).collect()
    }

    /// How the in-place outputs are written: directly, or through a copy.
    pub fn write_backs(&self) -> WriteBackCounts {
        let mut counts = WriteBackCounts::default();
        for kernel in &self.kernels {
            for &b in &kernel.outputs {
                if let BufferRole::InPlace(_) = self.buffer(b).role {
                    if kernel.sources.iter().any(|s| s.op == WRITE_BACK_COPY) {
                        counts.copied += 1;
                    } else {
                        counts.direct += 1;
                    }
                }
            }
        }
        counts
    }

    /// Kernels that launch device code (all families; a matmul is one library call).
    pub fn kernel_count(&self) -> usize {
        self.kernels.len()
    }

    /// The part of output slot `slot`'s buffer that `kernel` writes, where it writes only part of
    /// it (the rest is written by other kernels or slots: [`crate::Rule::SingleWriter`]); `None`
    /// where it writes the whole buffer.
    pub fn output_part(&self, kernel: &Kernel, slot: usize) -> Option<RowPart> {
        let KernelKind::AttentionBackward(back) = &kernel.kind else { return None };
        let part = back.grad_layouts.get(slot)?.row_part(&back.shape)?;
        let numel = self.buffer(*kernel.outputs.get(slot)?).numel;
        (part.width < part.row_stride && part.rows.checked_mul(part.row_stride) == Some(numel)).then_some(part)
    }

    /// Fewest bytes one kernel must move: each input buffer read once, each output written once
    /// (of a buffer it writes part of, that part).
    pub fn kernel_bytes(&self, kernel: &Kernel) -> usize {
        let mut whole: Vec<BufferId> = kernel.inputs.clone();
        let mut parts = 0;
        for (slot, &b) in kernel.outputs.iter().enumerate() {
            match self.output_part(kernel, slot) {
                Some(part) => parts += part.rows * part.width * self.buffer(b).dtype.size_bytes(),
                None => whole.push(b),
            }
        }
        whole.sort();
        whole.dedup();
        parts + whole.iter().map(|&b| self.buffer(b).bytes()).sum::<usize>()
    }

    /// Bytes all kernels move at the least (each kernel reads its inputs and writes its outputs once).
    pub fn bytes_moved(&self) -> usize {
        self.kernels.iter().map(|k| self.kernel_bytes(k)).sum()
    }
}
