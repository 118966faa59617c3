//! Cycle checks: a merge must not make a kernel write a value and read something computed from it.

use super::Fuser;
use braze_ir::NodeId;
use std::collections::HashSet;

/// One side of a merge: whole groups plus nodes not placed yet.
pub(super) struct Side<'s> {
    pub(super) groups: &'s [usize],
    pub(super) extra: &'s [NodeId],
}

impl Fuser<'_> {
    /// Whether there is a path from one side to the other that leaves both (a merge would make
    /// the kernel both write a value and read something computed from it).
    pub(super) fn outside_path(&self, a: &Side, b: &Side) -> bool {
        self.path_via_outside(a, b) || self.path_via_outside(b, a)
    }

    pub(super) fn side_contains(&self, side: &Side, id: NodeId) -> bool {
        side.extra.contains(&id) || self.group_of.get(&id).is_some_and(|g| side.groups.contains(g))
    }

    pub(super) fn side_members(&self, side: &Side) -> Vec<NodeId> {
        let mut members: Vec<NodeId> = side.extra.to_vec();
        for &gid in side.groups {
            members.extend(&self.group(gid).members);
        }
        members
    }

    fn side_len(&self, side: &Side) -> usize {
        side.extra.len() + side.groups.iter().map(|&g| self.group(g).members.len()).sum::<usize>()
    }

    /// Smallest and largest topological position of the side's members.
    fn side_span(&self, side: &Side) -> (usize, usize) {
        let groups = side.groups.iter().map(|&g| (self.group(g).min_pos, self.group(g).max_pos));
        let extra = side.extra.iter().map(|&m| (self.pos(m), self.pos(m)));
        groups.chain(extra).fold((usize::MAX, 0), |(lo, hi), (a, b)| (lo.min(a), hi.max(b)))
    }

    /// Searches from the smaller side only, bounded by the other side's topological span.
    fn path_via_outside(&self, from: &Side, to: &Side) -> bool {
        let outside = |id: NodeId| !self.side_contains(from, id) && !self.side_contains(to, id);
        let mut seen = HashSet::new();
        let mut stack = Vec::new();
        if self.side_len(to) <= self.side_len(from) {
            // Backward from `to`: only nodes after the first member of `from` can lie between.
            let lowest = self.side_span(from).0;
            let push = |x: NodeId, stack: &mut Vec<NodeId>, seen: &mut HashSet<NodeId>| {
                if outside(x) && self.pos(x) > lowest && seen.insert(x) {
                    stack.push(x);
                }
            };
            for m in self.side_members(to) {
                for &o in &self.node(m).operands {
                    push(o, &mut stack, &mut seen);
                }
            }
            while let Some(x) = stack.pop() {
                for &o in &self.node(x).operands {
                    if self.side_contains(from, o) {
                        return true;
                    }
                    push(o, &mut stack, &mut seen);
                }
            }
        } else {
            // Forward from `from`: only nodes before the last member of `to` can lie between.
            let highest = self.side_span(to).1;
            let push = |x: NodeId, stack: &mut Vec<NodeId>, seen: &mut HashSet<NodeId>| {
                if outside(x) && self.pos(x) < highest && seen.insert(x) {
                    stack.push(x);
                }
            };
            for m in self.side_members(from) {
                for &u in self.users(m) {
                    push(u, &mut stack, &mut seen);
                }
            }
            while let Some(x) = stack.pop() {
                for &u in self.users(x) {
                    if self.side_contains(to, u) {
                        return true;
                    }
                    push(u, &mut stack, &mut seen);
                }
            }
        }
        false
    }
}
