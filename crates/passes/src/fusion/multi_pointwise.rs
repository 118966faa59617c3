//! Horizontal fusion: mutually independent pointwise kernels become one multi-pointwise kernel,
//! so that many small launches (an optimizer's update of each parameter, each a kernel of a few
//! thousand elements) become one. Each member stays exactly the pointwise kernel it was.
//!
//! Which kernels are grouped: pointwise kernels of at most
//! [`FusionOptions::multi_pointwise_limit`] elements with the same *height*, the longest path
//! (in kernels) from the kernel to a kernel nothing reads. Kernels of equal height are
//! independent (a path from one to the other would make the first one higher), and every edge
//! between two groups runs from a higher one to a lower one, so merging all of them at once
//! cannot close a cycle through other kernels. Grouping by height rather than by depth puts the
//! last kernels of a step together: every parameter update of an optimizer has height 0.
//! A group is cut where its kernel would take more than [`MAX_SLOTS`] buffer parameters or
//! cover more than [`MAX_GROUP_ELEMENTS`] elements (which bounds its work list).

use super::FusionOptions;
use crate::{PassError, Result};
use braze_plan::{BufferId, Expr, Kernel, KernelKind, MultiPointwise, Plan, Pointwise};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

/// Most buffer parameters (input plus output slots) of one multi-pointwise kernel: 8 bytes
/// each, well inside the 4 KiB of parameters every CUDA device accepts.
pub(super) const MAX_SLOTS: usize = 480;
/// Most elements over all members of one multi-pointwise kernel.
pub(super) const MAX_GROUP_ELEMENTS: usize = 1 << 26;

/// Groups independent pointwise kernels of `plan` (see the module docs). A plan with nothing to
/// group is returned as it was.
pub(super) fn group_independent_pointwise(plan: Plan, options: &FusionOptions) -> Result<Plan> {
    let groups = independent_groups(&plan, options);
    if groups.iter().all(|g| g.len() < 2) {
        return Ok(plan);
    }
    // Every kernel belongs to one unit: a group of several, or itself.
    let mut unit_of: Vec<usize> = (0..plan.kernels.len()).collect();
    let mut units: Vec<Vec<usize>> = (0..plan.kernels.len()).map(|k| vec![k]).collect();
    for group in groups.iter().filter(|g| g.len() >= 2) {
        let u = units.len();
        for &k in group {
            unit_of[k] = u;
            units[k].clear();
        }
        units.push(group.clone());
    }
    let order = unit_order(&plan, &unit_of, &units)?;
    let mut kernels = Vec::with_capacity(order.len());
    for (index, &u) in order.iter().enumerate() {
        let mut kernel = match units[u].as_slice() {
            [k] => plan.kernels[*k].clone(),
            members => merge(&plan, members),
        };
        kernel.name = renumbered(&kernel.name, index);
        kernels.push(kernel);
    }
    Ok(Plan { kernels, ..plan })
}

/// The groups of kernel indices (each in plan order, groups ordered by their first kernel).
fn independent_groups(plan: &Plan, options: &FusionOptions) -> Vec<Vec<usize>> {
    let height = heights(plan);
    let mut by_height: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
    // The open group of each height: its key, its slots and elements so far.
    let mut open: HashMap<usize, ((usize, usize), usize, usize)> = HashMap::new();
    for (k, kernel) in plan.kernels.iter().enumerate() {
        let KernelKind::Pointwise(pw) = &kernel.kind else { continue };
        let numel = pw.shape.numel();
        if numel > options.multi_pointwise_limit {
            continue;
        }
        // Slots shared between members count once per member: an upper bound.
        let slots = kernel.inputs.len() + kernel.outputs.len();
        let h = height[k];
        let (key, used_slots, used_elements) = match open.get(&h) {
            Some(&(key, s, e)) if s + slots <= MAX_SLOTS && e + numel <= MAX_GROUP_ELEMENTS => (key, s, e),
            _ => ((k, h), 0, 0),
        };
        by_height.entry(key).or_default().push(k);
        open.insert(h, (key, used_slots + slots, used_elements + numel));
    }
    by_height.into_values().collect()
}

/// Longest path (in kernels) from each kernel to one that no kernel reads.
fn heights(plan: &Plan) -> Vec<usize> {
    let mut writer: HashMap<BufferId, usize> = HashMap::new();
    for (k, kernel) in plan.kernels.iter().enumerate() {
        for &b in &kernel.outputs {
            writer.insert(b, k);
        }
    }
    let mut height = vec![0usize; plan.kernels.len()];
    // Kernels run in plan order, so every reader of a kernel comes after it.
    for (k, kernel) in plan.kernels.iter().enumerate().rev() {
        for b in &kernel.inputs {
            if let Some(&w) = writer.get(b) {
                height[w] = height[w].max(height[k] + 1);
            }
        }
    }
    height
}

/// The units in an order where each runs after the units writing what it reads; among ready
/// units, the one holding the earliest kernel first (a plan without groups keeps its order).
fn unit_order(plan: &Plan, unit_of: &[usize], units: &[Vec<usize>]) -> Result<Vec<usize>> {
    let mut writer: HashMap<BufferId, usize> = HashMap::new();
    for (k, kernel) in plan.kernels.iter().enumerate() {
        for &b in &kernel.outputs {
            writer.insert(b, unit_of[k]);
        }
    }
    let mut waiting = vec![0usize; units.len()];
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); units.len()];
    for (u, members) in units.iter().enumerate() {
        let mut deps: Vec<usize> = members
            .iter()
            .flat_map(|&k| &plan.kernels[k].inputs)
            .filter_map(|b| writer.get(b).copied())
            .filter(|&w| w != u)
            .collect();
        deps.sort();
        deps.dedup();
        waiting[u] = deps.len();
        for w in deps {
            readers[w].push(u);
        }
    }
    let live: Vec<usize> = (0..units.len()).filter(|&u| !units[u].is_empty()).collect();
    let mut ready: BinaryHeap<Reverse<(usize, usize)>> =
        live.iter().filter(|&&u| waiting[u] == 0).map(|&u| Reverse((units[u][0], u))).collect();
    let mut order = Vec::with_capacity(live.len());
    while let Some(Reverse((_, u))) = ready.pop() {
        order.push(u);
        for &r in &readers[u] {
            waiting[r] -= 1;
            if waiting[r] == 0 {
                ready.push(Reverse((units[r][0], r)));
            }
        }
    }
    if order.len() != live.len() {
        // Grouping by height cannot close a cycle; reaching this is a bug in the grouping.
        let stuck = live.iter().find(|u| !order.contains(u)).map_or(0, |&u| units[u][0]);
        return Err(PassError::Lowering {
            node: plan.kernels[stuck].name.clone(),
            op: "multi_pointwise".into(),
            detail: "grouped kernels depend on each other in a cycle".into(),
        });
    }
    Ok(order)
}

/// One multi-pointwise kernel of the pointwise kernels `members` (in plan order): their input
/// slots merged (a buffer read by several members gets one slot), their output slots in order.
fn merge(plan: &Plan, members: &[usize]) -> Kernel {
    let mut inputs: Vec<BufferId> = Vec::new();
    let mut outputs: Vec<BufferId> = Vec::new();
    let mut sources = Vec::new();
    let mut programs = Vec::with_capacity(members.len());
    for &k in members {
        let kernel = &plan.kernels[k];
        let KernelKind::Pointwise(pw) = &kernel.kind else { unreachable!("only pointwise kernels are grouped") };
        let slot_of: Vec<usize> = kernel
            .inputs
            .iter()
            .map(|&b| match inputs.iter().position(|&x| x == b) {
                Some(slot) => slot,
                None => {
                    inputs.push(b);
                    inputs.len() - 1
                }
            })
            .collect();
        let first_output = outputs.len();
        outputs.extend(&kernel.outputs);
        let mut body = pw.body.clone();
        for value in &mut body.values {
            if let Expr::Load { input, .. } | Expr::Gather { input, .. } = &mut value.expr {
                *input = slot_of[*input];
            }
        }
        for store in &mut body.stores {
            store.output += first_output;
        }
        programs.push(Pointwise { shape: pw.shape.clone(), body });
        sources.extend(kernel.sources.iter().cloned());
    }
    let first = &plan.kernels[members[0]].name;
    let stem = stem_of(first).strip_prefix("pointwise").unwrap_or(stem_of(first));
    Kernel {
        name: format!("multi_pointwise{stem}"),
        kind: KernelKind::MultiPointwise(MultiPointwise { members: programs }),
        inputs,
        outputs,
        sources,
    }
}

/// A kernel name without fusion's `_<index>` suffix.
fn stem_of(name: &str) -> &str {
    match name.rsplit_once('_') {
        Some((stem, index)) if !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()) => stem,
        _ => name,
    }
}

/// `name` with the index suffix of kernel `index`.
fn renumbered(name: &str, index: usize) -> String {
    format!("{}_{index}", stem_of(name))
}
