//! Shapes: row-major, contiguous, with NumPy broadcasting.

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    pub fn new(dims: impl Into<Vec<usize>>) -> Shape {
        Shape(dims.into())
    }

    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements; a rank-0 shape holds one.
    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        let mut strides = vec![1; self.0.len()];
        for i in (0..self.0.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.0[i + 1];
        }
        strides
    }

    /// The last dimension, 1 for a scalar.
    pub fn last(&self) -> usize {
        self.0.last().copied().unwrap_or(1)
    }

    /// NumPy broadcast of two shapes, `None` when they are incompatible.
    pub fn broadcast(a: &Shape, b: &Shape) -> Option<Shape> {
        let rank = a.rank().max(b.rank());
        let mut out = vec![0; rank];
        for (i, slot) in out.iter_mut().enumerate() {
            let da = if i + a.rank() >= rank { a.0[i + a.rank() - rank] } else { 1 };
            let db = if i + b.rank() >= rank { b.0[i + b.rank() - rank] } else { 1 };
            *slot = if da == db {
                da
            } else if da == 1 {
                db
            } else if db == 1 {
                da
            } else {
                return None;
            };
        }
        Some(Shape(out))
    }

    /// Whether `self` broadcasts to `target` under NumPy rules.
    pub fn broadcasts_to(&self, target: &Shape) -> bool {
        if self.rank() > target.rank() {
            return false;
        }
        let offset = target.rank() - self.rank();
        self.0.iter().enumerate().all(|(i, &d)| d == 1 || d == target.0[i + offset])
    }

    /// Element strides for reading `self` as if broadcast to `target`: 0 on broadcast dims.
    /// The result has `target.rank()` entries. Caller must ensure `broadcasts_to(target)`.
    pub fn broadcast_strides(&self, target: &Shape) -> Vec<usize> {
        let own = self.strides();
        let offset = target.rank() - self.rank();
        (0..target.rank())
            .map(|i| {
                if i < offset {
                    0
                } else {
                    let d = self.0[i - offset];
                    if d == 1 && target.0[i] != 1 {
                        0
                    } else {
                        own[i - offset]
                    }
                }
            })
            .collect()
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Shape {
        Shape(d.to_vec())
    }
}

impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Shape {
        Shape(d)
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Shape {
        Shape(d.to_vec())
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ",")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_follows_numpy() {
        let s = |d: &[usize]| Shape::new(d.to_vec());
        assert_eq!(Shape::broadcast(&s(&[64, 256]), &s(&[256])), Some(s(&[64, 256])));
        assert_eq!(Shape::broadcast(&s(&[3, 1]), &s(&[1, 4])), Some(s(&[3, 4])));
        assert_eq!(Shape::broadcast(&s(&[]), &s(&[2, 0])), Some(s(&[2, 0])));
        assert_eq!(Shape::broadcast(&s(&[3]), &s(&[4])), None);
        assert_eq!(s(&[1, 4]).broadcast_strides(&s(&[2, 3, 4])), vec![0, 0, 1]);
        assert_eq!(s(&[3, 1]).broadcast_strides(&s(&[3, 5])), vec![1, 0]);
        assert_eq!(s(&[2, 3, 4]).strides(), vec![12, 4, 1]);
    }
}
