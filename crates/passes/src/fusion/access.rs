//! View folding: a chain of reshape, permute, slice and broadcast_to over a buffer becomes one
//! strided access (an offset and one stride per dim of the viewed shape).
//!
//! Strides of size-1 dims are always 0, so equal accesses compare equal and a load's strides say
//! plainly which dims it broadcasts over.

use braze_ir::{Literal, NodeId, Shape};

/// How a kernel reads a value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Access {
    /// A scalar constant, whatever the shape of the view of it.
    Const { value: Literal },
    /// Element `i` of the value is element `offset + sum(i[d] * strides[d])` of `base`'s buffer.
    Strided { base: NodeId, offset: usize, strides: Vec<usize> },
}

impl Access {
    /// Reading all of `base` (of `shape`) in row-major order.
    pub(crate) fn whole(base: NodeId, shape: &Shape) -> Access {
        Access::Strided { base, offset: 0, strides: contiguous_strides(shape.dims()) }
    }
}

/// Row-major strides, 0 on size-1 dims.
pub(crate) fn contiguous_strides(dims: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; dims.len()];
    let mut step = 1;
    for d in (0..dims.len()).rev() {
        strides[d] = if dims[d] == 1 { 0 } else { step };
        step *= dims[d];
    }
    strides
}

/// Sets the strides of size-1 dims to 0.
pub(crate) fn zero_unit_dims(dims: &[usize], strides: &mut [usize]) {
    for (s, &d) in strides.iter_mut().zip(dims) {
        if d == 1 {
            *s = 0;
        }
    }
}

/// Strides for reading a value of shape `from` (with `strides`) broadcast to `to`, NumPy style:
/// dims are aligned on the right; new and stretched dims get stride 0.
pub(crate) fn broadcast_strides(strides: &[usize], from: &[usize], to: &[usize]) -> Vec<usize> {
    (0..to.len())
        .map(|i| {
            let from_end = from.len() as isize - (to.len() - i) as isize;
            if from_end < 0 {
                return 0;
            }
            let j = from_end as usize;
            if from[j] == to[i] && to[i] != 1 {
                strides[j]
            } else {
                0
            }
        })
        .collect()
}

pub(crate) fn permute_strides(strides: &[usize], perm: &[usize]) -> Vec<usize> {
    perm.iter().map(|&p| strides[p]).collect()
}

/// Strides of a reshape of a strided view, or `None` when the new shape would have to split or
/// merge dims that are not laid out contiguously relative to each other (then the view must be
/// materialized first). The algorithm is PyTorch's `computeStride`.
pub(crate) fn reshape_strides(from: &[usize], strides: &[usize], to: &[usize]) -> Option<Vec<usize>> {
    let numel: usize = from.iter().product();
    if numel == 0 || from.is_empty() {
        return Some(contiguous_strides(to));
    }
    let mut out = vec![0usize; to.len()];
    let mut view_d = to.len() as isize - 1;
    let mut chunk_base_stride = *strides.last().unwrap_or(&1);
    let mut tensor_numel = 1usize;
    let mut view_numel = 1usize;
    for tensor_d in (0..from.len()).rev() {
        tensor_numel *= from[tensor_d];
        let chunk_ends =
            tensor_d == 0 || (from[tensor_d - 1] != 1 && strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
        if chunk_ends {
            while view_d >= 0 && (view_numel < tensor_numel || to[view_d as usize] == 1) {
                out[view_d as usize] = view_numel * chunk_base_stride;
                view_numel *= to[view_d as usize];
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if tensor_d > 0 {
                chunk_base_stride = strides[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    if view_d != -1 {
        return None;
    }
    zero_unit_dims(to, &mut out);
    Some(out)
}

/// Whether the access reads all of a buffer of `base_numel` elements in row-major order.
pub(crate) fn is_contiguous(dims: &[usize], offset: usize, strides: &[usize], base_numel: usize) -> bool {
    offset == 0 && dims.iter().product::<usize>() == base_numel && strides == contiguous_strides(dims).as_slice()
}

/// Whether the access reads every element of a buffer of `base_numel` elements exactly once, in
/// some order (a permutation of a contiguous layout). A full reduction may read such a view as the
/// plain buffer.
pub(crate) fn is_dense_permutation(dims: &[usize], offset: usize, strides: &[usize], base_numel: usize) -> bool {
    if offset != 0 || dims.iter().product::<usize>() != base_numel {
        return false;
    }
    if base_numel == 0 {
        // No elements: any order reads all of them.
        return true;
    }
    let mut laid: Vec<(usize, usize)> =
        dims.iter().zip(strides).filter(|(&d, _)| d != 1).map(|(&d, &s)| (s, d)).collect();
    laid.sort();
    let mut expected = 1;
    for (stride, dim) in laid {
        if stride != expected {
            return false;
        }
        expected *= dim;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_folds_where_pytorch_views() {
        // Contiguous: always.
        assert_eq!(reshape_strides(&[4, 6], &[6, 1], &[2, 12]), Some(vec![12, 1]));
        // A transpose cannot be flattened...
        assert_eq!(reshape_strides(&[6, 4], &[1, 6], &[24]), None);
        // ...but its dims can be split.
        assert_eq!(reshape_strides(&[6, 4], &[1, 6], &[2, 3, 4]), Some(vec![3, 1, 6]));
        // Broadcast dims split into more broadcast dims.
        assert_eq!(reshape_strides(&[4, 6], &[0, 1], &[2, 2, 6]), Some(vec![0, 0, 1]));
        // Unit dims come and go freely.
        assert_eq!(reshape_strides(&[3, 1, 5], &[5, 0, 1], &[3, 5, 1]), Some(vec![5, 1, 0]));
    }

    #[test]
    fn broadcast_aligns_right() {
        assert_eq!(broadcast_strides(&[1], &[4], &[3, 4]), vec![0, 1]);
        assert_eq!(broadcast_strides(&[1, 0], &[3, 1], &[2, 3, 5]), vec![0, 1, 0]);
    }

    #[test]
    fn dense_permutations() {
        assert!(is_dense_permutation(&[4, 6], 0, &[1, 4], 24));
        assert!(!is_dense_permutation(&[4, 6], 0, &[0, 1], 6));
        assert!(!is_dense_permutation(&[2, 6], 6, &[6, 1], 24));
        // An empty buffer, whatever the strides of its empty dims.
        assert!(is_dense_permutation(&[16, 0], 0, &[0, 1], 0));
        assert!(!is_dense_permutation(&[2, 0], 0, &[0, 1], 6));
    }
}
