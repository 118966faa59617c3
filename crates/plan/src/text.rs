//! The plan's text form: deterministic, meant for review and snapshots.
//!
//! ```text
//! plan: 1 kernel, 5 buffers, 805339136 bytes moved
//! b0: f32 x67108864 input #0
//! ...
//! b4: f32 x67108864 output
//! kernel 0: row_layer_norm_relu_add_f32_0 (row: rows=16384 cols=4096 outer=[16384] inner=[4096]) reads b0 b1 b2 b3 writes b4 (bytes=805339136)
//!   sources: layer_norm/sum, layer_norm/mul, ..., relu, add
//!   v0 = load in0 offset=0 strides=[4096,1] : f32
//!   v1 = reduce_sum v0 : f32  (per-row)
//!   ...
//!   store v18 -> out0
//! outputs: b4 as f32[16384,4096]
//! ```
//!
//! Buffers print their element count: the plan keeps no shapes for them, only for its outputs.

use crate::plan::{Body, BufferId, BufferRole, Expr, Kernel, KernelKind, MultiReduce, Plan, RowKernel, SourceOp};
use std::fmt::{self, Write};

/// Longest list of buffers or item sizes printed in full; longer ones are elided in the middle.
const MAX_LISTED: usize = 16;

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// `items` joined by spaces, the middle elided when there are too many.
fn listed<T: fmt::Display>(items: &[T], sep: &str) -> String {
    let show = |xs: &[T]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(sep);
    if items.len() <= MAX_LISTED {
        show(items)
    } else {
        let head = &items[..MAX_LISTED / 2];
        let tail = &items[items.len() - 2..];
        format!("{}{sep}...{sep}{} ({} in all)", show(head), show(tail), items.len())
    }
}

fn dims(d: &[usize]) -> String {
    format!("[{}]", d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(","))
}

/// Runs of equal source ops as `op xN`.
fn sources_line(sources: &[SourceOp]) -> String {
    let mut runs: Vec<(String, usize)> = Vec::new();
    for s in sources {
        match runs.last_mut() {
            Some((op, n)) if *op == s.op => *n += 1,
            _ => runs.push((s.op.clone(), 1)),
        }
    }
    let parts: Vec<String> = runs.into_iter().map(|(op, n)| if n == 1 { op } else { format!("{op} x{n}") }).collect();
    listed(&parts, ", ")
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "plan: {}, {}, {} bytes moved",
            plural(self.kernels.len(), "kernel"),
            plural(self.buffers.len(), "buffer"),
            self.bytes_moved()
        )?;
        let n = self.buffers.len();
        for (i, b) in self.buffers.iter().enumerate() {
            // Long lists (one buffer per tensor of a multi-tensor reduction) keep their ends.
            if n > MAX_LISTED && (MAX_LISTED / 2..n - 2).contains(&i) {
                if i == MAX_LISTED / 2 {
                    writeln!(f, "... ({} more buffers)", n - 2 - MAX_LISTED / 2)?;
                }
                continue;
            }
            let role = match b.role {
                BufferRole::Input(n) => format!("input #{n}"),
                BufferRole::Intermediate => "intermediate".into(),
                BufferRole::Output => "output".into(),
                BufferRole::InPlace(n) => format!("output in place of input #{n}"),
            };
            writeln!(f, "b{i}: {} x{} {role}", b.dtype, b.numel)?;
        }
        for (i, k) in self.kernels.iter().enumerate() {
            self.fmt_kernel(f, i, k)?;
        }
        for (i, c) in self.checks.iter().enumerate() {
            let at = c.loc.as_ref().map(|l| format!(" at {l}")).unwrap_or_default();
            writeln!(f, "check {i}: {} index in 0..{}{at}", c.op, c.bound)?;
        }
        let outputs: Vec<String> = self
            .outputs
            .iter()
            .map(|o| format!("{} as {}{}", o.buffer, self.buffer(o.buffer).dtype, o.shape))
            .collect();
        writeln!(f, "outputs: {}", outputs.join(", "))
    }
}

impl Plan {
    fn fmt_kernel(&self, f: &mut fmt::Formatter<'_>, index: usize, k: &Kernel) -> fmt::Result {
        let shape = match &k.kind {
            KernelKind::Pointwise(pw) => format!("pointwise: shape={}", pw.shape),
            KernelKind::Row(row) => {
                format!(
                    "row: rows={} cols={} outer={} inner={}",
                    row.rows(),
                    row.cols(),
                    dims(&row.outer),
                    dims(&row.inner)
                )
            }
            KernelKind::Column(col) => format!(
                "column: rows={} cols={} reduced={} kept={}",
                col.rows(),
                col.cols(),
                dims(&col.reduced),
                dims(&col.kept)
            ),
            KernelKind::MultiReduce(mr) => format!(
                "multi_reduce: {} of {}, {} elements",
                plural(mr.items.len(), "item"),
                plural(mr.reductions.len(), "reduction"),
                mr.elements()
            ),
            KernelKind::MatMul(mm) => {
                let mut s = format!("matmul: batch={} m={} n={} k={} {}", dims(&mm.batch), mm.m, mm.n, mm.k, mm.dtype);
                if mm.a_transposed {
                    s.push_str(" a_transposed");
                }
                if mm.b_transposed {
                    s.push_str(" b_transposed");
                }
                let _ = write!(s, " a_batch_stride={} b_batch_stride={}", mm.a_batch_stride, mm.b_batch_stride);
                if mm.bias {
                    s.push_str(" +bias");
                }
                if let Some(op) = mm.activation {
                    let _ = write!(s, " +{}", op.name());
                }
                s
            }
            KernelKind::MultiPointwise(multi) => {
                format!("multi_pointwise: {}, {} elements", plural(multi.members.len(), "member"), multi.numel())
            }
            KernelKind::Attention(att) => {
                let results: Vec<&str> =
                    att.results.iter().map(|r| if *r == crate::AttentionResult::Out { "out" } else { "lse" }).collect();
                let layouts =
                    [("q", &att.input_layouts[0]), ("k", &att.input_layouts[1]), ("v", &att.input_layouts[2])]
                        .into_iter()
                        .chain(att.results.contains(&crate::AttentionResult::Out).then_some(("out", &att.out_layout)));
                format!(
                    "attention: {}{} -> {}",
                    attention_shape(&att.shape),
                    attention_layouts(&att.shape, layouts),
                    results.join(",")
                )
            }
            KernelKind::AttentionBackward(back) => {
                let grads: Vec<String> = back.grads.iter().map(|g| format!("d{}", g.name())).collect();
                let names = ["q", "k", "v", "dout"];
                let layouts = names
                    .iter()
                    .copied()
                    .zip(&back.input_layouts)
                    .chain(grads.iter().map(String::as_str).zip(&back.grad_layouts));
                format!(
                    "attention_backward: {}{} -> {}",
                    attention_shape(&back.shape),
                    attention_layouts(&back.shape, layouts),
                    grads.join(",")
                )
            }
            KernelKind::IndexAdd(ia) => format!(
                "index_add: outer={} indices={} inner={} size={} {} by {}",
                ia.outer, ia.indices, ia.inner, ia.size, ia.dtype, ia.index_dtype
            ),
            KernelKind::Concat(cat) => {
                format!(
                    "concat: shape={} axis={} extents={} {}",
                    cat.shape,
                    cat.axis,
                    listed(&cat.extents, ","),
                    cat.dtype
                )
            }
        };
        let ids = |b: &[BufferId]| if b.is_empty() { "nothing".to_string() } else { listed(b, " ") };
        writeln!(
            f,
            "kernel {index}: {} ({shape}) reads {} writes {} (bytes={})",
            k.name,
            ids(&k.inputs),
            ids(&k.outputs),
            self.kernel_bytes(k)
        )?;
        if !k.sources.is_empty() {
            writeln!(f, "  sources: {}", sources_line(&k.sources))?;
        }
        match &k.kind {
            KernelKind::Pointwise(pw) => fmt_body(f, &pw.body, None),
            KernelKind::Row(row) => {
                let per_row = row.body.row_values(row.outer.len());
                fmt_body(f, &row.body, Some((&per_row, "per-row")))?;
                for p in &row.partials {
                    writeln!(
                        f,
                        "  partial {} {} -> out{} (groups of {} rows)",
                        p.op.name(),
                        p.value,
                        p.output,
                        row.partial_rows
                    )?;
                }
                if !row.preserves_layout_hint() {
                    writeln!(f, "  note: reduces leading axes; loads are strided")?;
                }
                Ok(())
            }
            KernelKind::Column(col) => {
                let per_column = col.body.column_values(col.reduced.len());
                fmt_body(f, &col.body, Some((&per_column, "per-column")))
            }
            KernelKind::MultiReduce(mr) => fmt_multi_reduce(f, mr),
            KernelKind::MultiPointwise(multi) => {
                for (m, member) in multi.members.iter().enumerate() {
                    writeln!(f, "  member {m}: shape={}", member.shape)?;
                    fmt_body(f, &member.body, None)?;
                }
                Ok(())
            }
            KernelKind::MatMul(_)
            | KernelKind::Concat(_)
            | KernelKind::Attention(_)
            | KernelKind::AttentionBackward(_)
            | KernelKind::IndexAdd(_) => Ok(()),
        }
    }
}

/// ` q=@0[786432,64,2304] out=@0[786432,64,768]`: the operands whose layouts are not dense
/// (offset, then batch, head and row strides).
fn attention_layouts<'a>(
    s: &crate::AttentionShape,
    layouts: impl Iterator<Item = (&'a str, &'a crate::OperandLayout)>,
) -> String {
    let dense = crate::OperandLayout::dense(s);
    let mut text = String::new();
    for (name, l) in layouts.filter(|(_, l)| **l != dense) {
        let _ = write!(text, " {name}=@{}[{},{},{}]", l.offset, l.batch_stride, l.head_stride, l.row_stride);
    }
    text
}

/// `batch=24 heads=12 seq=17 head_dim=64 bf16 scale=0.125 causal`
fn attention_shape(s: &crate::AttentionShape) -> String {
    format!(
        "batch={} heads={} seq={} head_dim={} {} scale={}{}",
        s.batch,
        s.heads,
        s.seq,
        s.head_dim,
        s.dtype,
        braze_ir::format_f64(s.scale),
        if s.causal { " causal" } else { "" }
    )
}

impl RowKernel {
    /// Whether every load's innermost domain dim is its smallest nonzero stride (rows read as
    /// contiguous runs); false for reductions over leading axes.
    fn preserves_layout_hint(&self) -> bool {
        let outer_rank = self.outer.len();
        self.body.values.iter().all(|v| match &v.expr {
            Expr::Load { strides, .. } => {
                let inner_max = strides[outer_rank..].iter().copied().filter(|&s| s != 0).max();
                let outer_min = strides[..outer_rank].iter().copied().filter(|&s| s != 0).min();
                match (inner_max, outer_min) {
                    (Some(i), Some(o)) => i < o,
                    _ => true,
                }
            }
            _ => true,
        })
    }
}

/// Each reduction with its items and prologue, then the epilogue, whose `load inI` is item I's
/// result, and its element stores.
fn fmt_multi_reduce(f: &mut fmt::Formatter<'_>, mr: &MultiReduce) -> fmt::Result {
    for (r, red) in mr.reductions.iter().enumerate() {
        let items: Vec<String> = (0..mr.items.len())
            .filter(|&i| mr.items[i].reduction == r)
            .map(|i| format!("{i}:{}", mr.items[i].len))
            .collect();
        let leaves = if red.leaves == 1 { String::new() } else { format!(" ({} leaves each)", red.leaves) };
        writeln!(f, "  reduction {r} over {} items{leaves} [{}]:", red.dtype, listed(&items, ","))?;
        fmt_body(f, &red.prologue, None)?;
        writeln!(f, "  reduce_{} v{} -> item result", red.op.name(), red.prologue.values.len().saturating_sub(1))?;
    }
    writeln!(f, "  epilogue (load inI: item I's result):")?;
    // A stack of thousands of results keeps its ends.
    let mut epilogue = String::new();
    fmt_body(&mut epilogue, &mr.epilogue, None)?;
    let lines: Vec<&str> = epilogue.lines().collect();
    if !lines.is_empty() {
        writeln!(f, "{}", listed(&lines, "\n").replace("\n...\n", "\n  ...\n"))?;
    }
    let stores: Vec<String> = mr.stores.iter().map(|s| format!("out{}[{}] = {}", s.output, s.index, s.value)).collect();
    writeln!(f, "  stores: {}", listed(&stores, ", "))
}

/// The body's values and stores; `invariant` marks the values that are the same along the
/// reduced dims, with the word that says so.
fn fmt_body(f: &mut impl Write, body: &Body, invariant: Option<(&[bool], &str)>) -> fmt::Result {
    for (i, v) in body.values.iter().enumerate() {
        let expr = match &v.expr {
            Expr::Load { input, offset, strides } => {
                format!("load in{input} offset={offset} strides={}", dims(strides))
            }
            Expr::Gather { input, offset, strides, index, index_stride, bound, check } => format!(
                "gather in{input} offset={offset} strides={} at {index} clamped to 0..{bound} stride={index_stride} check={check}",
                dims(strides)
            ),
            Expr::Const { value } => format!("const {value}"),
            Expr::Index => "index".to_string(),
            Expr::Cast { x } => format!("cast {x}"),
            Expr::Unary { op, x } => format!("{} {x}", op.name()),
            Expr::Binary { op, a, b } => format!("{} {a}, {b}", op.name()),
            Expr::Where { cond, a, b } => format!("where {cond}, {a}, {b}"),
            Expr::Reduce { op, x } => format!("reduce_{} {x}", op.name()),
        };
        match invariant {
            Some((marks, word)) if marks[i] => writeln!(f, "  v{i} = {expr} : {}  ({word})", v.dtype)?,
            _ => writeln!(f, "  v{i} = {expr} : {}", v.dtype)?,
        }
    }
    for s in &body.stores {
        writeln!(f, "  store {} -> out{}", s.value, s.output)?;
    }
    Ok(())
}
