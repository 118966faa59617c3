//! Kernel bodies: checking them, finding what is live, and rendering values as C.

use crate::cuda::{cast, const_literal, value_type, Helper, Helpers};
use crate::error::{malformed, unsupported, Result};
use braze_ir::elementwise::{CType, CudaExpr};
use braze_ir::{BinaryOp, DType, UnaryOp};
use braze_plan::{Body, Expr, ValueId};

/// What a family allows in its bodies.
pub(crate) struct BodyRules {
    pub(crate) inputs: usize,
    pub(crate) outputs: usize,
    /// Strides per load: the rank of the iteration domain.
    pub(crate) rank: usize,
    pub(crate) reductions: bool,
}

/// Checks that a body is well formed: values refer only to earlier values, loads to existing
/// input slots with one stride per domain dim, stores to existing output slots.
pub(crate) fn check_body(kernel: &str, body: &Body, rules: &BodyRules) -> Result<()> {
    for (id, value) in body.values.iter().enumerate() {
        for operand in value.expr.operands() {
            if operand.0 >= id {
                return Err(malformed(kernel, format!("v{id} uses {operand}, which is not an earlier value")));
            }
        }
        match &value.expr {
            Expr::Load { input, strides, .. } => {
                if *input >= rules.inputs {
                    return Err(malformed(
                        kernel,
                        format!("v{id} loads input slot {input}, but the kernel has {}", rules.inputs),
                    ));
                }
                if strides.len() != rules.rank {
                    return Err(malformed(
                        kernel,
                        format!("v{id} has {} strides for a rank-{} domain", strides.len(), rules.rank),
                    ));
                }
            }
            Expr::Reduce { .. } if !rules.reductions => {
                return Err(malformed(kernel, format!("v{id} is a reduction outside a row kernel")));
            }
            _ => {}
        }
    }
    for store in &body.stores {
        if store.value.0 >= body.values.len() {
            return Err(malformed(kernel, format!("a store writes {}, which does not exist", store.value)));
        }
        if store.output >= rules.outputs {
            return Err(malformed(
                kernel,
                format!("a store writes output slot {}, but the kernel has {}", store.output, rules.outputs),
            ));
        }
    }
    Ok(())
}

/// Values that some root depends on.
pub(crate) fn live_values(body: &Body, roots: impl IntoIterator<Item = ValueId>) -> Vec<bool> {
    let mut live = vec![false; body.values.len()];
    for root in roots {
        live[root.0] = true;
    }
    for id in (0..body.values.len()).rev() {
        if live[id] {
            for operand in body.values[id].expr.operands() {
                live[operand.0] = true;
            }
        }
    }
    live
}

/// For each value, the values that use it (in ascending order).
pub(crate) fn users(body: &Body) -> Vec<Vec<usize>> {
    let mut users = vec![Vec::new(); body.values.len()];
    for (id, value) in body.values.iter().enumerate() {
        for operand in value.expr.operands() {
            if users[operand.0].last() != Some(&id) {
                users[operand.0].push(id);
            }
        }
    }
    users
}

/// The C name of value `id`.
pub(crate) fn value_name(id: usize) -> String {
    format!("v{id}")
}

/// `const T vN = rhs;`
pub(crate) fn declare(body: &Body, id: usize, rhs: &str) -> String {
    format!("const {} {} = {rhs};", value_type(body.values[id].dtype), value_name(id))
}

/// The right-hand side of a computed value (not a load or a reduction), given the C names of
/// the values so far.
pub(crate) fn render_value(
    kernel: &str,
    helpers: &mut Helpers,
    body: &Body,
    id: usize,
    names: &[String],
) -> Result<String> {
    let value = &body.values[id];
    let operand_dtype = |v: &ValueId| body.values[v.0].dtype;
    // A computed f16/bf16 value lives in registers as f32; the ops that observe it rounded
    // (`Expr::observes_rounded_operands`) round it here. A load, and a cast into the narrow
    // dtype (which rounds), hold exact values already.
    let round = value.expr.observes_rounded_operands();
    let operand = |helpers: &mut Helpers, v: &ValueId| -> String {
        let (dtype, name) = (operand_dtype(v), &names[v.0]);
        let exact =
            matches!(body.values[v.0].expr, Expr::Load { .. } | Expr::Gather { .. } | Expr::Index | Expr::Cast { .. });
        match dtype {
            DType::BF16 | DType::F16 if round && !exact => cast(helpers, DType::F32, dtype, name),
            _ => name.clone(),
        }
    };
    match &value.expr {
        Expr::Const { value: c } => Ok(const_literal(*c, value.dtype)),
        Expr::Cast { x } => {
            let x_name = operand(helpers, x);
            Ok(cast(helpers, operand_dtype(x), value.dtype, &x_name))
        }
        Expr::Unary { op, x } => {
            let x_name = operand(helpers, x);
            // An op's narrow form (16-bit values) only where no op of the body takes the exact
            // form of such an op anyway: GELU(h) in bf16 beside its f32 derivative computes one
            // Gaussian for both in the exact form, two with a narrow one beside it.
            let is_narrow = |dtype: DType| matches!(dtype, DType::BF16 | DType::F16);
            let narrow = op.def().narrow_cuda.is_some()
                && is_narrow(operand_dtype(x))
                && !body.values.iter().any(|v| {
                    matches!(&v.expr, Expr::Unary { op, x } if op.def().narrow_cuda.is_some() && !is_narrow(operand_dtype(x)))
                });
            render_unary(kernel, helpers, *op, operand_dtype(x), &x_name, narrow)
        }
        Expr::Binary { op, a, b } => {
            let (da, db) = (operand_dtype(a), operand_dtype(b));
            if da != db {
                return Err(malformed(kernel, format!("v{id}: {} of {da} and {db}", op.name())));
            }
            let (a_name, b_name) = (operand(helpers, a), operand(helpers, b));
            render_binary(kernel, helpers, *op, da, &a_name, &b_name)
        }
        Expr::Where { cond, a, b } => {
            let (da, db) = (operand_dtype(a), operand_dtype(b));
            if da != db {
                return Err(malformed(kernel, format!("v{id}: where of {da} and {db}")));
            }
            let cond = cast(helpers, operand_dtype(cond), DType::Bool, &names[cond.0]);
            Ok(format!("{cond} ? {} : {}", names[a.0], names[b.0]))
        }
        Expr::Gather { .. } => Err(unsupported(kernel, "gathers".to_string())),
        Expr::Index => Err(unsupported(kernel, "element indices".to_string())),
        Expr::Load { .. } | Expr::Reduce { .. } => unreachable!("loads and reductions are rendered by the family"),
    }
}

/// `op` on `x`, a value of `dtype`: in the op's narrow form when `narrow` (the caller checked
/// that the op has one and `dtype` is 16 bits wide).
pub(crate) fn render_unary(
    kernel: &str,
    helpers: &mut Helpers,
    op: UnaryOp,
    dtype: DType,
    x: &str,
    narrow: bool,
) -> Result<String> {
    let def = op.def();
    let expr = match def.narrow_cuda {
        Some(narrow_form) if narrow => Some(narrow_form(x)),
        _ => (def.cuda)(x, CType::of(dtype)),
    };
    emit_op(kernel, helpers, expr, || format!("{} on {dtype}", op.name()))
}

pub(crate) fn render_binary(
    kernel: &str,
    helpers: &mut Helpers,
    op: BinaryOp,
    dtype: DType,
    a: &str,
    b: &str,
) -> Result<String> {
    let expr = (op.def().cuda)(a, b, CType::of(dtype));
    emit_op(kernel, helpers, expr, || format!("{} on {dtype}", op.name()))
}

/// The text of an op's CUDA expression, noting the helper it calls.
fn emit_op(
    kernel: &str,
    helpers: &mut Helpers,
    expr: Option<CudaExpr>,
    what: impl FnOnce() -> String,
) -> Result<String> {
    let expr = expr.ok_or_else(|| unsupported(kernel, what()))?;
    if let Some(helper) = expr.helper {
        helpers.need(Helper::Op(helper));
    }
    Ok(expr.text)
}

/// Declares the values `ids` (in order) as C constants. `source` gives a value's right-hand side
/// where the caller knows it (every load, values held in registers); otherwise a value is
/// rendered from the names of its operands, and a load is taken as declared already.
/// `names[id]` becomes each value's C name.
pub(crate) fn emit_values(
    w: &mut crate::writer::CodeWriter,
    kernel: &str,
    helpers: &mut Helpers,
    body: &Body,
    ids: impl IntoIterator<Item = usize>,
    names: &mut [String],
    mut source: impl FnMut(usize, &mut Helpers) -> Option<String>,
) -> Result<()> {
    for id in ids {
        let rhs = match (source(id, helpers), &body.values[id].expr) {
            (Some(rhs), _) => rhs,
            (None, Expr::Load { .. }) => continue,
            (None, Expr::Reduce { .. }) => unreachable!("reductions are declared by the row kernel"),
            (None, _) => render_value(kernel, helpers, body, id, names)?,
        };
        w.line(declare(body, id, &rhs));
        names[id] = value_name(id);
    }
    Ok(())
}
