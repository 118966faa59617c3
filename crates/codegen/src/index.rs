//! Index math: the index width of a kernel and element offsets of strided views as C
//! expressions with compile-time divisors.

/// Whether a kernel indexes with 32-bit or 64-bit unsigned integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IndexWidth {
    U32,
    U64,
}

impl IndexWidth {
    /// 32-bit when every extent and offset is below 2^31. Unsigned 32-bit math then also has
    /// room for a grid-stride step past the end (below 2^31 + 2^31).
    pub(crate) fn for_largest(largest: usize) -> IndexWidth {
        if largest < (1usize << 31) {
            IndexWidth::U32
        } else {
            IndexWidth::U64
        }
    }

    /// An index literal of this width.
    pub(crate) fn lit(self, n: usize) -> String {
        match self {
            IndexWidth::U32 => format!("{n}u"),
            IndexWidth::U64 => format!("{n}ull"),
        }
    }

    /// The `typedef` that names the index type `idx_t`, with the reason for its width.
    pub(crate) fn typedef(self) -> &'static str {
        match self {
            IndexWidth::U32 => "typedef unsigned idx_t;  // 32-bit index math: every extent and offset is below 2^31",
            IndexWidth::U64 => {
                "typedef unsigned long long idx_t;  // 64-bit index math: some extent or offset reaches 2^31"
            }
        }
    }
}

/// One dim of a strided view after dropping unit dims and merging dims that are contiguous with
/// each other: coordinate `(flat / inner) % extent` advances the offset by `stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ViewDim {
    pub(crate) extent: usize,
    pub(crate) stride: usize,
    /// Product of the extents of the dims after this one.
    pub(crate) inner: usize,
}

/// The simplest equivalent of the view `strides` over a row-major domain `dims`.
pub(crate) fn merge_view(dims: &[usize], strides: &[usize]) -> Vec<ViewDim> {
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (&extent, &stride) in dims.iter().zip(strides) {
        if extent == 1 {
            continue;
        }
        match merged.last_mut() {
            // The previous dim steps exactly over this one: one dim of the product extent.
            Some((outer_extent, outer_stride)) if *outer_stride == stride * extent => {
                *outer_extent *= extent;
                *outer_stride = stride;
            }
            _ => merged.push((extent, stride)),
        }
    }
    let mut inner = 1;
    let mut view: Vec<ViewDim> = merged
        .iter()
        .rev()
        .map(|&(extent, stride)| {
            let dim = ViewDim { extent, stride, inner };
            inner *= extent;
            dim
        })
        .collect();
    view.reverse();
    view
}

/// Whether the view reads the same element everywhere.
pub(crate) fn is_constant(view: &[ViewDim]) -> bool {
    view.iter().all(|d| d.stride == 0)
}

/// The C expression `base + sum(((flat / inner) % extent) * stride)` for the view, where `flat`
/// (an identifier) ranges over the view's domain.
pub(crate) fn offset_expr(base: usize, view: &[ViewDim], flat: &str, width: IndexWidth) -> String {
    let mut terms = Vec::new();
    if base != 0 {
        terms.push(width.lit(base));
    }
    for (position, dim) in view.iter().enumerate() {
        if dim.stride == 0 {
            continue;
        }
        let mut coord = flat.to_string();
        if dim.inner != 1 {
            coord = format!("{coord} / {}", width.lit(dim.inner));
        }
        // The outermost coordinate is below its extent already.
        if position != 0 {
            coord = format!("{coord} % {}", width.lit(dim.extent));
        }
        let term = if dim.stride == 1 {
            coord
        } else if dim.inner == 1 && position == 0 {
            format!("{coord} * {}", width.lit(dim.stride))
        } else {
            format!("({coord}) * {}", width.lit(dim.stride))
        };
        terms.push(term);
    }
    if terms.is_empty() {
        width.lit(0)
    } else {
        terms.join(" + ")
    }
}

/// How `vec` consecutive domain elements starting at a multiple of `vec` read a view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VectorAccess {
    /// Consecutive elements from an offset that is a multiple of `vec`: one aligned vector load.
    Contiguous,
    /// The same element for the whole vector: one scalar load.
    Uniform,
    /// Anything else: one scalar load per element.
    Gather,
}

pub(crate) fn classify(base: usize, view: &[ViewDim], vec: usize) -> VectorAccess {
    let moving: Vec<&ViewDim> = view.iter().filter(|d| d.stride != 0).collect();
    if moving.iter().all(|d| d.inner % vec == 0) {
        return VectorAccess::Uniform;
    }
    if let Some(last) = view.last() {
        let aligned = base.is_multiple_of(vec) && moving.iter().all(|d| d.inner == 1 || d.stride % vec == 0);
        // A vector never wraps the innermost dim if its extent is a multiple of `vec`, or if it
        // is the only dim (vectors stay inside the domain).
        let no_wrap = last.extent % vec == 0 || view.len() == 1;
        if last.stride == 1 && no_wrap && aligned {
            return VectorAccess::Contiguous;
        }
    }
    VectorAccess::Gather
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_contiguous_dims_and_drops_unit_dims() {
        let view = merge_view(&[4, 1, 8, 16], &[128, 7, 16, 1]);
        assert_eq!(view, vec![ViewDim { extent: 512, stride: 1, inner: 1 }]);
        // A bias broadcast over rows.
        let view = merge_view(&[64, 256], &[0, 1]);
        assert_eq!(offset_expr(0, &view, "i", IndexWidth::U32), "i % 256u");
        // A per-row value broadcast over columns.
        let view = merge_view(&[64, 256], &[1, 0]);
        assert_eq!(offset_expr(3, &view, "i", IndexWidth::U64), "3ull + i / 256ull");
        // A transpose.
        let view = merge_view(&[3, 5], &[1, 3]);
        assert_eq!(offset_expr(0, &view, "i", IndexWidth::U32), "i / 5u + (i % 5u) * 3u");
    }

    #[test]
    fn classifies_vector_accesses() {
        assert_eq!(classify(0, &merge_view(&[64, 256], &[256, 1]), 4), VectorAccess::Contiguous);
        assert_eq!(classify(0, &merge_view(&[64, 256], &[0, 1]), 4), VectorAccess::Contiguous);
        assert_eq!(classify(0, &merge_view(&[64, 256], &[1, 0]), 4), VectorAccess::Uniform);
        assert_eq!(classify(0, &merge_view(&[64, 256], &[0, 0]), 4), VectorAccess::Uniform);
        assert_eq!(classify(1, &merge_view(&[64, 256], &[256, 1]), 4), VectorAccess::Gather);
        assert_eq!(classify(0, &merge_view(&[3, 5], &[1, 3]), 4), VectorAccess::Gather);
        assert_eq!(classify(0, &merge_view(&[64, 6], &[6, 1]), 4), VectorAccess::Contiguous);
        assert_eq!(classify(0, &merge_view(&[64, 6], &[8, 1]), 4), VectorAccess::Gather);
        assert_eq!(classify(0, &merge_view(&[64, 8], &[12, 1]), 4), VectorAccess::Contiguous);
        assert_eq!(classify(0, &merge_view(&[64, 8], &[10, 1]), 4), VectorAccess::Gather);
        assert_eq!(classify(0, &merge_view(&[1_000_003], &[1]), 8), VectorAccess::Contiguous);
    }
}
