//! Vector accesses: moving several consecutive elements with the widest aligned loads and
//! stores (at most 16 bytes each), widening to and narrowing from registers.

use crate::cuda::{cast, load_vec_name, narrow, raw_vec_type, store_vec_name, unpack_vec_name, widen, Helper, Helpers};
use crate::index::IndexWidth;
use crate::writer::CodeWriter;
use braze_ir::DType;

/// Elements per aligned access (at most 16 bytes) of a `count`-element vector of `dtype`.
fn access_elements(dtype: DType, count: usize) -> usize {
    count.min(16 / dtype.size_bytes()).max(1)
}

/// `a + n` as C, leaving out what is zero (`a` may be empty for zero).
fn plus(a: &str, n: usize, lit: impl Fn(usize) -> String) -> String {
    match (a.is_empty() || a == "0", n) {
        (true, n) => lit(n),
        (false, 0) => a.to_string(),
        (false, n) => format!("{a} + {}", lit(n)),
    }
}

/// `(text)` when `text` is a compound expression.
fn paren(text: &str) -> String {
    if text.contains(' ') {
        format!("({text})")
    } else {
        text.to_string()
    }
}

/// `pointer + at` as C, `pointer` alone where `at` is 0.
fn element_address(pointer: &str, at: &str, width: IndexWidth) -> String {
    if at == width.lit(0) {
        pointer.to_string()
    } else {
        format!("{pointer} + {}", paren(at))
    }
}

/// Loads `count` elements of `dtype` from `pointer[offset..]` into `array[array_base..]` with
/// the widest aligned accesses (`array_base` may be empty for 0).
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit_vector_load(
    w: &mut CodeWriter,
    helpers: &mut Helpers,
    dtype: DType,
    pointer: &str,
    offset: &str,
    array: &str,
    array_base: &str,
    count: usize,
    width: IndexWidth,
) {
    let per_access = access_elements(dtype, count);
    for first in (0..count).step_by(per_access) {
        let at = plus(offset, first, |n| width.lit(n));
        let slot = plus(array_base, first, |n| format!("{n}u"));
        if per_access == 1 {
            w.line(format!("{array}[{slot}] = {};", widen(dtype, &format!("{pointer}[{at}]"))));
        } else {
            helpers.need(Helper::LoadVec(dtype, per_access as u32));
            let address = element_address(pointer, &at, width);
            let target = if slot == "0u" { array.to_string() } else { format!("{array} + {}", paren(&slot)) };
            w.line(format!("{}({address}, {target});", load_vec_name(dtype, per_access as u32)));
        }
    }
}

/// The raw accesses of a `count`-element vector of `dtype`: how many, their C type, and the
/// 32-bit registers each takes.
pub(crate) fn raw_accesses(dtype: DType, count: usize) -> (usize, &'static str, usize) {
    let per_access = access_elements(dtype, count);
    let bytes = per_access * dtype.size_bytes();
    (count.div_ceil(per_access), raw_vec_type(dtype, per_access as u32), bytes.div_ceil(4))
}

/// Loads `count` elements of `dtype` from `pointer[offset..]` as raw accesses into
/// `raw[raw_base..]` (one entry per access), to be widened later by [`emit_vector_unpack`]: the
/// load issues now, its latency hidden behind whatever runs before the values are needed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit_vector_prefetch(
    w: &mut CodeWriter,
    dtype: DType,
    pointer: &str,
    offset: &str,
    raw: &str,
    raw_base: &str,
    count: usize,
    width: IndexWidth,
) {
    let per_access = access_elements(dtype, count);
    let raw_type = raw_vec_type(dtype, per_access as u32);
    for (k, first) in (0..count).step_by(per_access).enumerate() {
        let at = plus(offset, first, |n| width.lit(n));
        let slot = plus(raw_base, k, |n| format!("{n}u"));
        let address = element_address(pointer, &at, width);
        w.line(format!("{raw}[{slot}] = *reinterpret_cast<const {raw_type}*>({address});"));
    }
}

/// Widens the raw accesses `raw[raw_base..]` that [`emit_vector_prefetch`] loaded into
/// `array[0..count]`.
pub(crate) fn emit_vector_unpack(
    w: &mut CodeWriter,
    helpers: &mut Helpers,
    dtype: DType,
    raw: &str,
    raw_base: &str,
    array: &str,
    count: usize,
) {
    let per_access = access_elements(dtype, count);
    helpers.need(Helper::UnpackVec(dtype, per_access as u32));
    for (k, first) in (0..count).step_by(per_access).enumerate() {
        let slot = plus(raw_base, k, |n| format!("{n}u"));
        let target = if first == 0 { array.to_string() } else { format!("{array} + {first}") };
        w.line(format!("{}({raw}[{slot}], {target});", unpack_vec_name(dtype, per_access as u32)));
    }
}

/// Narrows and stores `count` elements of `array` to `pointer[offset..]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit_vector_store(
    w: &mut CodeWriter,
    helpers: &mut Helpers,
    dtype: DType,
    pointer: &str,
    offset: &str,
    array: &str,
    count: usize,
    width: IndexWidth,
) {
    let per_access = access_elements(dtype, count);
    for first in (0..count).step_by(per_access) {
        let at = plus(offset, first, |n| width.lit(n));
        if per_access == 1 {
            w.line(format!("{pointer}[{at}] = {};", narrow(dtype, &format!("{array}[{first}]"))));
        } else {
            helpers.need(Helper::StoreVec(dtype, per_access as u32));
            let address = element_address(pointer, &at, width);
            let source = if first == 0 { array.to_string() } else { format!("{array} + {first}") };
            w.line(format!("{}({address}, {source});", store_vec_name(dtype, per_access as u32)));
        }
    }
}

/// The register value of a load of a `stored`-dtype element `lvalue` as a `value`-dtype value.
pub(crate) fn load_rhs(helpers: &mut Helpers, stored: DType, value: DType, lvalue: &str) -> String {
    cast(helpers, stored, value, &widen(stored, lvalue))
}
