//! Row-major traversal of a shape while tracking element offsets into strided views of it: the
//! one indexing primitive behind broadcasting, permutes, slices and reductions.

use braze_ir::{HostData, Shape};

/// Visits every position of `dims` in row-major order and passes, for each of the `N` views,
/// the offset `sum(coord[d] * strides[k][d])`. Each view needs one stride per dim. Nothing is
/// visited when a dim is 0; a rank-0 shape is visited once.
pub(crate) fn walk<const N: usize>(dims: &[usize], strides: [&[usize]; N], mut visit: impl FnMut([usize; N])) {
    for s in &strides {
        assert_eq!(s.len(), dims.len(), "one stride per dim");
    }
    let numel: usize = dims.iter().product();
    let mut coord = vec![0usize; dims.len()];
    let mut offsets = [0usize; N];
    for _ in 0..numel {
        visit(offsets);
        for d in (0..dims.len()).rev() {
            coord[d] += 1;
            for k in 0..N {
                offsets[k] += strides[k][d];
            }
            if coord[d] < dims[d] {
                break;
            }
            for k in 0..N {
                offsets[k] -= strides[k][d] * dims[d];
            }
            coord[d] = 0;
        }
    }
}

/// The elements of `src` at `base + sum(coord[d] * strides[d])` for every row-major `coord` of
/// `shape`, in the same dtype: broadcast, permute and slice are all such gathers.
pub(crate) fn gather(src: &HostData, shape: &Shape, base: usize, strides: &[usize]) -> HostData {
    fn pick<T: Copy>(v: &[T], shape: &Shape, base: usize, strides: &[usize]) -> Vec<T> {
        let mut out = Vec::with_capacity(shape.numel());
        walk(shape.dims(), [strides], |[o]| out.push(v[base + o]));
        out
    }
    match src {
        HostData::F32(v) => HostData::F32(pick(v, shape, base, strides)),
        HostData::F16(v) => HostData::F16(pick(v, shape, base, strides)),
        HostData::BF16(v) => HostData::BF16(pick(v, shape, base, strides)),
        HostData::I32(v) => HostData::I32(pick(v, shape, base, strides)),
        HostData::I64(v) => HostData::I64(pick(v, shape, base, strides)),
        HostData::Bool(v) => HostData::Bool(pick(v, shape, base, strides)),
    }
}

/// Appends `src[range]` to `dst`; both hold one dtype.
pub(crate) fn extend_range(dst: &mut HostData, src: &HostData, range: std::ops::Range<usize>) {
    match (dst, src) {
        (HostData::F32(d), HostData::F32(s)) => d.extend_from_slice(&s[range]),
        (HostData::F16(d), HostData::F16(s)) => d.extend_from_slice(&s[range]),
        (HostData::BF16(d), HostData::BF16(s)) => d.extend_from_slice(&s[range]),
        (HostData::I32(d), HostData::I32(s)) => d.extend_from_slice(&s[range]),
        (HostData::I64(d), HostData::I64(s)) => d.extend_from_slice(&s[range]),
        (HostData::Bool(d), HostData::Bool(s)) => d.extend_from_slice(&s[range]),
        (d, s) => unreachable!("copying {} data into {} storage", s.dtype(), d.dtype()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_tracks_each_view() {
        let mut seen = Vec::new();
        walk(&[2, 3], [&[3, 1], &[1, 0]], |o| seen.push(o));
        assert_eq!(seen, vec![[0, 0], [1, 0], [2, 0], [3, 1], [4, 1], [5, 1]]);
    }

    #[test]
    fn walk_visits_rank0_once_and_empty_never() {
        let mut count = 0;
        walk(&[], [], |_: [usize; 0]| count += 1);
        assert_eq!(count, 1);
        walk(&[3, 0], [&[0, 1]], |_| count += 1);
        assert_eq!(count, 1);
    }
}
