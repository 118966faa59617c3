//! Cycle checks: a merge must not make a kernel write a value and read something computed from it.

use super::Fuser;
use braze_ir::NodeId;

/// One side of a merge: whole groups plus nodes not placed yet.
pub(super) struct Side<'s> {
    pub(super) groups: &'s [usize],
    pub(super) extra: &'s [NodeId],
}

impl Fuser<'_> {
    /// Whether there is a path from one side to the other that leaves both (a merge would make
    /// the kernel both write a value and read something computed from it).
    pub(super) fn outside_path(&self, a: &Side, b: &Side) -> bool {
        // Nodes are placed in topological order, so nothing placed after both sides can lead back
        // to them, except through a multi-reduce claimed ahead: it reads leaves placed late and
        // its results may be read early, so the search covers every such kernel it can enter.
        let last = self.multi_reduce_reach(self.side_last(a).max(self.side_last(b)));
        self.path_via_outside(a, b, last) || self.path_via_outside(b, a, last)
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

    /// `last`, raised to the last member of every multi-reduce kernel with a member at or
    /// before it, until no such kernel reaches further.
    fn multi_reduce_reach(&self, mut last: usize) -> usize {
        loop {
            let reach = self
                .groups
                .iter()
                .flatten()
                .filter(|g| matches!(g.kind, super::GroupKind::MultiReduce(_)) && g.min_pos <= last)
                .map(|g| g.max_pos)
                .fold(last, usize::max);
            if reach == last {
                return last;
            }
            last = reach;
        }
    }

    /// Largest topological position of the side's members.
    fn side_last(&self, side: &Side) -> usize {
        let groups = side.groups.iter().map(|&g| self.group(g).max_pos);
        groups.chain(side.extra.iter().map(|&m| self.pos(m))).max().unwrap_or(0)
    }

    /// Searches forward from `from` through nodes up to position `last`. The search runs over
    /// kernels, not nodes: reaching one member of a kernel outside both sides reaches all of them,
    /// since the kernel runs after all it reads and before all that read any of its values (a
    /// path from a member that reads `from` to another member that `to` reads is a cycle too).
    fn path_via_outside(&self, from: &Side, to: &Side, last: usize) -> bool {
        // Marks by topological position (at most `last`) and by group id: dense, since this
        // search runs for every merge and visits hundreds of nodes each time.
        let mut seen = vec![false; last + 1];
        let mut groups_seen = vec![false; self.groups.len()];
        let mut stack: Vec<NodeId> = Vec::new();
        let mut reach = |x: NodeId, stack: &mut Vec<NodeId>| {
            if self.side_contains(from, x) || self.side_contains(to, x) {
                return;
            }
            let mut visit = |m: NodeId| {
                let p = self.pos(m);
                if p <= last && !std::mem::replace(&mut seen[p], true) {
                    stack.push(m);
                }
            };
            match self.group_of.get(&x) {
                Some(&gid) if !std::mem::replace(&mut groups_seen[gid], true) => {
                    self.group(gid).members.iter().for_each(|&m| visit(m))
                }
                Some(_) => {}
                None => visit(x),
            }
        };
        for m in self.side_members(from) {
            for &u in self.users(m) {
                reach(u, &mut stack);
            }
        }
        while let Some(x) = stack.pop() {
            for &u in self.users(x) {
                if self.side_contains(to, u) {
                    return true;
                }
                reach(u, &mut stack);
            }
        }
        false
    }
}
