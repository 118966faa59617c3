//! Result dtype and shape of every op: the one place that knows the typing rules, used both when
//! a graph is built and when the verifier re-checks it.

use crate::{DType, IrError, Op, ReduceOp, Result, Shape};

/// What a node declares for itself, needed by ops whose result is not implied by the operands
/// (input, constant, cast, reshape, broadcast_to).
#[derive(Clone, Debug)]
pub struct Declared<'a> {
    pub dtype: DType,
    pub shape: &'a Shape,
}

/// Checks the operands of `op` and returns the result dtype and shape.
pub fn infer(op: &Op, operands: &[(DType, &Shape)], declared: Option<Declared<'_>>) -> Result<(DType, Shape)> {
    let name = op.name();
    check_arity(op, operands.len())?;
    let need_declared = || {
        declared.clone().ok_or_else(|| IrError::ShapeMismatch {
            op: name.into(),
            detail: "result dtype and shape must be given".into(),
        })
    };
    match op {
        Op::Input { .. } => {
            let d = need_declared()?;
            Ok((d.dtype, d.shape.clone()))
        }
        Op::Constant { value } => {
            let d = need_declared()?;
            if d.shape.rank() != 0 {
                return Err(IrError::ShapeMismatch {
                    op: name.into(),
                    detail: format!("a constant is a scalar, got shape {}", d.shape),
                });
            }
            if !value.fits(d.dtype) {
                return Err(IrError::ConstantKind { value: value.to_string(), dtype: d.dtype });
            }
            Ok((d.dtype, Shape::scalar()))
        }
        Op::Arange => {
            let d = need_declared()?;
            if d.shape.rank() != 1 {
                return Err(IrError::ShapeMismatch {
                    op: name.into(),
                    detail: format!("an arange is rank 1, got shape {}", d.shape),
                });
            }
            if d.dtype == DType::Bool {
                return Err(IrError::UnsupportedDType { op: name.into(), dtype: d.dtype });
            }
            Ok((d.dtype, d.shape.clone()))
        }
        Op::Cast => {
            let d = need_declared()?;
            Ok((d.dtype, operands[0].1.clone()))
        }
        Op::Unary { op: u } => {
            let (dt, shape) = operands[0];
            let def = u.def();
            if !def.accepts.allows(dt) {
                return Err(IrError::UnsupportedDType { op: name.into(), dtype: dt });
            }
            Ok((def.yields.dtype(dt), shape.clone()))
        }
        Op::Binary { op: b } => {
            let (dl, sl) = operands[0];
            let (dr, sr) = operands[1];
            if dl != dr {
                return Err(IrError::DTypeMismatch {
                    op: name.into(),
                    operand: 1,
                    expected: dl.to_string(),
                    actual: dr,
                });
            }
            let def = b.def();
            if !def.accepts.allows(dl) {
                return Err(IrError::UnsupportedDType { op: name.into(), dtype: dl });
            }
            let shape = Shape::broadcast(sl, sr).ok_or_else(|| IrError::Broadcast {
                op: name.into(),
                lhs: sl.clone(),
                rhs: sr.clone(),
            })?;
            Ok((def.yields.dtype(dl), shape))
        }
        Op::Where => {
            let (dc, sc) = operands[0];
            let (da, sa) = operands[1];
            let (db, sb) = operands[2];
            if dc != DType::Bool {
                return Err(IrError::DTypeMismatch {
                    op: name.into(),
                    operand: 0,
                    expected: "bool".into(),
                    actual: dc,
                });
            }
            if da != db {
                return Err(IrError::DTypeMismatch {
                    op: name.into(),
                    operand: 2,
                    expected: da.to_string(),
                    actual: db,
                });
            }
            let ab = Shape::broadcast(sa, sb).ok_or_else(|| IrError::Broadcast {
                op: name.into(),
                lhs: sa.clone(),
                rhs: sb.clone(),
            })?;
            let shape = Shape::broadcast(sc, &ab).ok_or_else(|| IrError::Broadcast {
                op: name.into(),
                lhs: sc.clone(),
                rhs: ab.clone(),
            })?;
            Ok((da, shape))
        }
        Op::Reduce { op: r, axes, keepdim } => {
            let (dt, shape) = operands[0];
            check_axes(name, axes, shape.rank())?;
            let result = match r {
                // As PyTorch: an integer mean has no dtype to give (`mean(): could not infer
                // output dtype`); cast to a float first.
                ReduceOp::Mean if !dt.is_float() => {
                    return Err(IrError::UnsupportedDType { op: name.into(), dtype: dt })
                }
                // As PyTorch: bool and integer sums accumulate and return i64 (true counts 1).
                ReduceOp::Sum if !dt.is_float() => DType::I64,
                _ => dt,
            };
            Ok((result, reduced_shape(shape, axes, *keepdim)))
        }
        Op::Reshape => {
            let d = need_declared()?;
            let (dt, shape) = operands[0];
            if d.shape.numel() != shape.numel() {
                return Err(IrError::ShapeMismatch {
                    op: name.into(),
                    detail: format!(
                        "cannot reshape {} ({} elements) to {} ({} elements)",
                        shape,
                        shape.numel(),
                        d.shape,
                        d.shape.numel()
                    ),
                });
            }
            Ok((dt, d.shape.clone()))
        }
        Op::BroadcastTo => {
            let d = need_declared()?;
            let (dt, shape) = operands[0];
            if !shape.broadcasts_to(d.shape) {
                return Err(IrError::ShapeMismatch {
                    op: name.into(),
                    detail: format!("cannot broadcast {} to {}", shape, d.shape),
                });
            }
            Ok((dt, d.shape.clone()))
        }
        Op::Permute { perm } => {
            let (dt, shape) = operands[0];
            let mut seen = vec![false; shape.rank()];
            if perm.len() != shape.rank()
                || perm.iter().any(|&p| p >= shape.rank() || std::mem::replace(&mut seen[p], true))
            {
                return Err(IrError::ShapeMismatch {
                    op: name.into(),
                    detail: format!("{perm:?} is not a permutation of the {} axes of {}", shape.rank(), shape),
                });
            }
            Ok((dt, Shape(perm.iter().map(|&p| shape.0[p]).collect())))
        }
        Op::Slice { axis, start, end, step } => {
            let (dt, shape) = operands[0];
            check_axis(name, *axis, shape.rank())?;
            let dim = shape.0[*axis];
            if *step == 0 || start > end || *end > dim {
                return Err(IrError::ShapeMismatch {
                    op: name.into(),
                    detail: format!("range {start}:{end}:{step} is invalid for axis {axis} of size {dim}"),
                });
            }
            let mut out = shape.clone();
            out.0[*axis] = (end - start).div_ceil(*step);
            Ok((dt, out))
        }
        Op::Concat { axis } => {
            let (dt, first) = operands[0];
            check_axis(name, *axis, first.rank())?;
            let mut out = first.clone();
            out.0[*axis] = 0;
            for (i, (d, s)) in operands.iter().enumerate() {
                if *d != dt {
                    return Err(IrError::DTypeMismatch {
                        op: name.into(),
                        operand: i,
                        expected: dt.to_string(),
                        actual: *d,
                    });
                }
                let same_elsewhere =
                    s.rank() == first.rank() && (0..s.rank()).all(|k| k == *axis || s.0[k] == first.0[k]);
                if !same_elsewhere {
                    return Err(IrError::ShapeMismatch {
                        op: name.into(),
                        detail: format!("operand {i} has shape {s}, which differs from {first} outside axis {axis}"),
                    });
                }
                out.0[*axis] += s.0[*axis];
            }
            Ok((dt, out))
        }
        Op::Stack { axis } => {
            let (dt, first) = operands[0];
            check_axis(name, *axis, first.rank() + 1)?;
            for (i, (d, s)) in operands.iter().enumerate() {
                if *d != dt {
                    return Err(IrError::DTypeMismatch {
                        op: name.into(),
                        operand: i,
                        expected: dt.to_string(),
                        actual: *d,
                    });
                }
                if *s != first {
                    return Err(IrError::ShapeMismatch {
                        op: name.into(),
                        detail: format!("operand {i} has shape {s}, expected {first}"),
                    });
                }
            }
            let mut out = first.0.clone();
            out.insert(*axis, operands.len());
            Ok((dt, Shape(out)))
        }
        Op::MatMul => {
            let (da, sa) = operands[0];
            let (db, sb) = operands[1];
            if da != db {
                return Err(IrError::DTypeMismatch {
                    op: name.into(),
                    operand: 1,
                    expected: da.to_string(),
                    actual: db,
                });
            }
            if !da.is_float() {
                return Err(IrError::UnsupportedDType { op: name.into(), dtype: da });
            }
            if sa.rank() < 2 || sb.rank() < 2 {
                return Err(IrError::ShapeMismatch {
                    op: name.into(),
                    detail: format!("operands must have rank >= 2, got {sa} and {sb}"),
                });
            }
            let (m, k) = (sa.0[sa.rank() - 2], sa.0[sa.rank() - 1]);
            let (k2, n) = (sb.0[sb.rank() - 2], sb.0[sb.rank() - 1]);
            if k != k2 {
                return Err(IrError::ShapeMismatch {
                    op: name.into(),
                    detail: format!("inner dimensions differ: {sa} @ {sb}"),
                });
            }
            let ba = Shape(sa.0[..sa.rank() - 2].to_vec());
            let bb = Shape(sb.0[..sb.rank() - 2].to_vec());
            let batch = Shape::broadcast(&ba, &bb).ok_or_else(|| IrError::Broadcast {
                op: name.into(),
                lhs: sa.clone(),
                rhs: sb.clone(),
            })?;
            let mut out = batch.0;
            out.extend([m, n]);
            Ok((da, Shape(out)))
        }
        Op::LayerNorm { .. } | Op::RmsNorm { .. } => {
            let (dt, shape) = operands[0];
            if !dt.is_float() {
                return Err(IrError::UnsupportedDType { op: name.into(), dtype: dt });
            }
            if shape.rank() == 0 {
                return Err(IrError::ShapeMismatch { op: name.into(), detail: "input must have rank >= 1".into() });
            }
            let affine = Shape(vec![shape.last()]);
            for (i, (d, s)) in operands.iter().enumerate().skip(1) {
                if *d != dt {
                    return Err(IrError::DTypeMismatch {
                        op: name.into(),
                        operand: i,
                        expected: dt.to_string(),
                        actual: *d,
                    });
                }
                if **s != affine {
                    return Err(IrError::ShapeMismatch {
                        op: name.into(),
                        detail: format!("operand {i} has shape {s}, expected {affine}"),
                    });
                }
            }
            Ok((dt, shape.clone()))
        }
        Op::CrossEntropy { .. } => {
            let [(dl, sl), (dt, st), (dc, sc)] = [operands[0], operands[1], operands[2]];
            if !dl.is_float() {
                return Err(IrError::UnsupportedDType { op: name.into(), dtype: dl });
            }
            if sl.rank() != 2 {
                return Err(IrError::ShapeMismatch {
                    op: name.into(),
                    detail: format!("logits must be [rows, classes], got shape {sl}"),
                });
            }
            if !dt.is_int() {
                return Err(IrError::DTypeMismatch {
                    op: name.into(),
                    operand: 1,
                    expected: "i32 or i64".into(),
                    actual: dt,
                });
            }
            // i32 classes beside i64 targets halve what a row kernel reads beside each logit.
            if dc != dt && !(dt == DType::I64 && dc == DType::I32) {
                return Err(IrError::DTypeMismatch {
                    op: name.into(),
                    operand: 2,
                    expected: if dt == DType::I64 { "i64 or i32".into() } else { dt.to_string() },
                    actual: dc,
                });
            }
            let (rows, classes) = (Shape(vec![sl.dims()[0]]), Shape(vec![sl.dims()[1]]));
            if *st != rows {
                return Err(IrError::ShapeMismatch {
                    op: name.into(),
                    detail: format!("targets have shape {st}, expected {rows} (one per row of logits {sl})"),
                });
            }
            if *sc != classes {
                return Err(IrError::ShapeMismatch {
                    op: name.into(),
                    detail: format!("classes have shape {sc}, expected {classes} (one per column of logits {sl})"),
                });
            }
            Ok((dl, Shape::scalar()))
        }
        Op::IndexSelect { axis } => {
            let [(dx, sx), (di, si)] = [operands[0], operands[1]];
            check_axis(name, *axis, sx.rank())?;
            check_indices(name, di)?;
            Ok((dx, indexed_shape(sx, *axis, si)))
        }
        Op::IndexAdd { axis, size } => {
            let [(ds, ss), (di, si)] = [operands[0], operands[1]];
            check_indices(name, di)?;
            let fits = *axis + si.rank() <= ss.rank() && ss.dims()[*axis..*axis + si.rank()] == *si.dims();
            if !fits {
                return Err(IrError::ShapeMismatch {
                    op: name.into(),
                    detail: format!("source {ss} does not hold the indices' shape {si} at axis {axis}"),
                });
            }
            if ds == DType::Bool {
                return Err(IrError::UnsupportedDType { op: name.into(), dtype: ds });
            }
            let dims = ss.dims();
            let mut out = dims[..*axis].to_vec();
            out.push(*size);
            out.extend_from_slice(&dims[*axis + si.rank()..]);
            Ok((ds, Shape(out)))
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            let (dt, shape) = operands[0];
            if !dt.is_float() {
                return Err(IrError::UnsupportedDType { op: name.into(), dtype: dt });
            }
            check_axis(name, *axis, shape.rank())?;
            Ok((dt, shape.clone()))
        }
        Op::Attention { scale, .. } => {
            check_scale(name, *scale)?;
            let (dt, shape) = check_attention_operands(name, &operands[..3])?;
            Ok((dt, shape))
        }
        Op::AttentionLse { scale, .. } => {
            check_scale(name, *scale)?;
            let (_, shape) = check_attention_operands(name, &operands[..2])?;
            Ok((DType::F32, attention_rows(&shape)))
        }
        Op::AttentionGrad { scale, .. } => {
            check_scale(name, *scale)?;
            let (dt, shape) = check_attention_operands(name, &[operands[0], operands[1], operands[2], operands[5]])?;
            let rows = attention_rows(&shape);
            for (i, what) in [(3, "lse"), (4, "delta")] {
                let (d, s) = operands[i];
                if d != DType::F32 {
                    return Err(IrError::DTypeMismatch {
                        op: name.into(),
                        operand: i,
                        expected: "f32".into(),
                        actual: d,
                    });
                }
                if *s != rows {
                    return Err(IrError::ShapeMismatch {
                        op: name.into(),
                        detail: format!("operand {i} ({what}) has shape {s}, expected {rows}"),
                    });
                }
            }
            Ok((dt, shape))
        }
    }
}

/// Indices are i32 or i64.
fn check_indices(op: &str, dtype: DType) -> Result<()> {
    if !dtype.is_int() {
        return Err(IrError::DTypeMismatch { op: op.into(), operand: 1, expected: "i32 or i64".into(), actual: dtype });
    }
    Ok(())
}

/// The shape of `x` indexed along `axis` by indices of shape `indices`: the axis replaced by
/// the indices' dims.
pub fn indexed_shape(x: &Shape, axis: usize, indices: &Shape) -> Shape {
    let dims = x.dims();
    let mut out = dims[..axis].to_vec();
    out.extend_from_slice(indices.dims());
    out.extend_from_slice(&dims[axis + 1..]);
    Shape(out)
}

/// A finite, positive softmax scale.
fn check_scale(op: &str, scale: f64) -> Result<()> {
    if !(scale.is_finite() && scale > 0.0) {
        return Err(IrError::ShapeMismatch {
            op: op.into(),
            detail: format!("scale must be finite and positive, got {scale}"),
        });
    }
    Ok(())
}

/// Attention operands (q, k, v, dout: as many as given) are `[B, H, T, D]` of one float dtype
/// and one shape; returns that dtype and shape.
fn check_attention_operands(op: &str, operands: &[(DType, &Shape)]) -> Result<(DType, Shape)> {
    let (dt, shape) = operands[0];
    if !dt.is_float() {
        return Err(IrError::UnsupportedDType { op: op.into(), dtype: dt });
    }
    if shape.rank() != 4 {
        return Err(IrError::ShapeMismatch {
            op: op.into(),
            detail: format!("the query must be [batch, heads, sequence, head_dim], got {shape}"),
        });
    }
    for (i, (d, s)) in operands.iter().enumerate().skip(1) {
        if *d != dt {
            return Err(IrError::DTypeMismatch { op: op.into(), operand: i, expected: dt.to_string(), actual: *d });
        }
        if *s != shape {
            return Err(IrError::ShapeMismatch {
                op: op.into(),
                detail: format!("operand {i} has shape {s}, expected the query's shape {shape}"),
            });
        }
    }
    Ok((dt, shape.clone()))
}

/// `[B, H, T]` of a `[B, H, T, D]` attention operand: one value per query row.
pub fn attention_rows(shape: &Shape) -> Shape {
    Shape(shape.0[..3].to_vec())
}

fn check_arity(op: &Op, n: usize) -> Result<()> {
    match op.arity() {
        Some(k) if k != n => Err(IrError::Arity { op: op.name().into(), expected: k.to_string(), actual: n }),
        None if n == 0 => Err(IrError::Arity { op: op.name().into(), expected: "at least 1".into(), actual: 0 }),
        _ => Ok(()),
    }
}

fn check_axis(op: &str, axis: usize, rank: usize) -> Result<()> {
    if axis >= rank {
        return Err(IrError::BadAxis { op: op.into(), axis: axis as i64, rank });
    }
    Ok(())
}

fn check_axes(op: &str, axes: &[usize], rank: usize) -> Result<()> {
    for &a in axes {
        check_axis(op, a, rank)?;
    }
    if axes.windows(2).any(|w| w[0] >= w[1]) {
        return Err(IrError::ShapeMismatch {
            op: op.into(),
            detail: format!("axes {axes:?} must be sorted and unique"),
        });
    }
    Ok(())
}

/// Shape after reducing `axes`; reduced dims become 1 with `keepdim`, else disappear.
pub fn reduced_shape(shape: &Shape, axes: &[usize], keepdim: bool) -> Shape {
    let mut out = Vec::new();
    for (i, &d) in shape.0.iter().enumerate() {
        if axes.contains(&i) {
            if keepdim {
                out.push(1);
            }
        } else {
            out.push(d);
        }
    }
    Shape(out)
}

/// Resolves a possibly negative axis (Python style) against `rank`.
pub fn normalize_axis(op: &str, axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r.max(0) {
        return Err(IrError::BadAxis { op: op.into(), axis, rank });
    }
    Ok(a as usize)
}
