//! A map keyed by [`NodeId`] stored densely by node index: fusion looks nodes up millions of
//! times in its cycle checks, where hashing dominated.

use braze_ir::NodeId;

#[derive(Clone, Debug)]
pub(super) struct NodeMap<T> {
    slots: Vec<Option<T>>,
}

impl<T> NodeMap<T> {
    /// An empty map for node indices below `bound`; larger indices grow it.
    pub(super) fn with_bound(bound: usize) -> NodeMap<T> {
        NodeMap { slots: std::iter::repeat_with(|| None).take(bound).collect() }
    }

    pub(super) fn get(&self, id: &NodeId) -> Option<&T> {
        self.slots.get(id.index()).and_then(Option::as_ref)
    }

    pub(super) fn contains_key(&self, id: &NodeId) -> bool {
        self.get(id).is_some()
    }

    pub(super) fn insert(&mut self, id: NodeId, value: T) -> Option<T> {
        let i = id.index();
        if i >= self.slots.len() {
            self.slots.resize_with(i + 1, || None);
        }
        self.slots[i].replace(value)
    }
}

impl<T> std::ops::Index<&NodeId> for NodeMap<T> {
    type Output = T;

    fn index(&self, id: &NodeId) -> &T {
        self.get(id).unwrap_or_else(|| panic!("{id} is not in the map"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braze_ir::{DType, Graph};

    #[test]
    fn insert_get_and_grow() {
        let mut g = Graph::new();
        let ids: Vec<NodeId> = (0..40).map(|_| g.input(DType::F32, vec![2])).collect();
        let (a, far) = (ids[1], ids[39]);
        let mut map = NodeMap::with_bound(2);
        assert_eq!(map.get(&a), None);
        assert_eq!(map.insert(a, 7), None);
        assert_eq!(map.insert(a, 8), Some(7));
        assert!(!map.contains_key(&far));
        map.insert(far, 9);
        assert_eq!((map[&a], map[&far]), (8, 9));
        assert_eq!(map.get(&ids[20]), None);
    }
}
