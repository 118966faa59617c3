//! Gradients and assignments inside a trace: `backward()` appended to the segment, each
//! parameter's gradient kept in a slot, `detach`, `assign` of captured tensors, and what a call
//! writes back after it ran.

use super::{Origin, Trace, Value, ValueState};
use crate::autograd::tape::Seed;
use crate::signature::TensorSig;
use crate::tensor::Storage;
use crate::{BreakKind, Error, Result, Tensor};
use braze_ir::{NodeId, Op, SourceLoc};
use std::sync::{Arc, Weak};

/// What a compiled function assumed about a parameter's gradient when the call began.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum GradAtEntry {
    /// Not looked at: the function dropped or replaced the gradient before reading it.
    Unread,
    Absent,
    Present(TensorSig),
}

/// A parameter whose gradient the function read, set or dropped.
pub(super) struct GradSlot {
    pub(super) param: Tensor,
    /// Its gradient so far in this call (`None` after `zero_grad`).
    pub(super) current: Option<Tensor>,
    pub(super) entry: GradAtEntry,
}

/// What a call writes besides its results: gradients and assigned tensors.
#[derive(Clone, Default)]
pub(crate) struct WriteBacks {
    pub grads: Vec<GradEffect>,
    /// `target` takes graph output `output` (an `assign` inside the function).
    pub assigns: Vec<(Tensor, usize)>,
}

impl WriteBacks {
    /// Graph outputs before the first write-back are the function's results.
    pub(crate) fn first_output(&self) -> Option<usize> {
        self.grads.iter().filter_map(|g| g.output).chain(self.assigns.iter().map(|a| a.1)).min()
    }

    /// Drops the gradients the function replaces without reading them (it called `zero_grad`
    /// first), before the call runs rather than after: their memory is free for the new
    /// gradients instead of held beside them, as `zero_grad(set_to_none=True)` frees PyTorch's.
    pub(crate) fn release_replaced_grads(&self) {
        for effect in self.grads.iter().filter(|g| matches!(g.entry, GradAtEntry::Unread)) {
            effect.param.inner.autograd.set_grad(None);
        }
    }

    /// Writes the write-back outputs to their tensors.
    pub(crate) fn apply(&self, outputs: &[Tensor]) -> Result<()> {
        for effect in &self.grads {
            effect.param.inner.autograd.set_grad(effect.output.map(|i| outputs[i].clone()));
        }
        for (target, output) in &self.assigns {
            let new_data = &outputs[*output];
            // The plan wrote it into the target's own memory (an in-place output): nothing to swap.
            if target.shares_data(new_data) {
                target.mark_written();
            } else {
                target.replace_storage(new_data.storage().clone(), crate::tensor::caller())?;
            }
        }
        Ok(())
    }

    /// `(graph output, graph input)` for each assigned tensor the graph also reads as an input:
    /// the outputs the plan may write in place ([`braze_passes::FusionOptions::in_place`]).
    pub(crate) fn in_place_requests(&self, bindings: &[super::super::Binding]) -> Vec<(usize, usize)> {
        self.assigns
            .iter()
            .filter_map(|(target, output)| {
                let input = bindings.iter().position(
                    |b| matches!(b, super::super::Binding::Captured { tensor, .. } if tensor.same_tensor(target)),
                )?;
                Some((*output, input))
            })
            .collect()
    }
}

/// A gradient to write back after each call: `param.grad` becomes graph output `output`, or
/// is dropped when `None`.
#[derive(Clone)]
pub(crate) struct GradEffect {
    pub param: Tensor,
    pub output: Option<usize>,
    pub entry: GradAtEntry,
}

impl Trace {
    /// The gradient slot of `param`, created on first use. Creating it reads the gradient the
    /// parameter has now, unless `read` is false (the caller replaces it without reading it).
    pub(super) fn grad_slot(&mut self, param: &Tensor, read: bool) -> usize {
        if let Some(i) = self.grads.iter().position(|s| s.param.same_tensor(param)) {
            return i;
        }
        let (current, entry) = match (read, param.inner.autograd.grad()) {
            (false, _) => (None, GradAtEntry::Unread),
            (true, None) => (None, GradAtEntry::Absent),
            (true, Some(grad)) => {
                // Bound to whatever gradient the parameter has at each call, not to this tensor.
                let value = self.values.len();
                self.values.push(Value {
                    dtype: grad.dtype(),
                    shape: grad.shape(),
                    state: ValueState::Concrete(grad.clone()),
                    origin: Origin::GradOf(param.clone()),
                    handle: Weak::new(),
                });
                self.captured.insert(Arc::as_ptr(&grad.inner), value);
                let sig = TensorSig::of(&grad);
                (Some(grad), GradAtEntry::Present(sig))
            }
        };
        self.grads.push(GradSlot { param: param.clone(), current, entry });
        self.grads.len() - 1
    }

    /// `param.grad()`: the gradient so far in this call.
    pub(in crate::trace) fn grad_of(&mut self, param: &Tensor) -> Option<Tensor> {
        let slot = self.grad_slot(param, true);
        self.grads[slot].current.clone()
    }

    /// `param.set_grad(grad)` (`zero_grad` when `None`): the gradient from here on, without
    /// reading the one before.
    pub(in crate::trace) fn set_grad(&mut self, param: &Tensor, grad: Option<&Tensor>) {
        let slot = self.grad_slot(param, false);
        self.grads[slot].current = grad.cloned();
    }

    /// `target.assign(value)` inside the function: later ops read the new value, and the target
    /// holds it after the call.
    pub(in crate::trace) fn assign(&mut self, target: &Tensor, value: &Tensor, loc: &SourceLoc) -> Result<()> {
        const OP: &str = "assign";
        self.check_aborted()?;
        if target.is_traced() {
            return Err(Error::invalid(
                OP,
                loc,
                "only tensors the function captures (weights, optimizer state) can be assigned inside it; \
                 this one is an argument or a value computed in the call",
            ));
        }
        if target.dtype() != value.dtype() || target.shape() != value.shape() {
            return Err(Error::invalid(
                OP,
                loc,
                format!(
                    "inside a compiled function the new value must keep the type {}{}, got {}{}",
                    target.dtype(),
                    target.shape(),
                    value.dtype(),
                    value.shape()
                ),
            ));
        }
        // The target's value as the function saw it so far is registered first, so the graph
        // still reads the old data where it was used before the assignment.
        self.value_of(target, OP, Some(loc))?;
        let new_value = self.value_of(value, OP, Some(loc))?;
        self.captured.insert(Arc::as_ptr(&target.inner), new_value);
        self.assigns.retain(|(t, _)| !t.same_tensor(target));
        self.assigns.push((target.clone(), value.clone()));
        Ok(())
    }

    /// `t.detach()`: the same values as a new node gradients do not flow through.
    pub(in crate::trace) fn detach(&mut self, t: &Tensor, loc: &SourceLoc) -> Result<Tensor> {
        let shape = t.shape();
        let handle = self.record("detach", &[t], loc, &|b, ids| b.reshape(ids[0], shape.clone()))?;
        if let Storage::Traced(r) = &*handle.storage() {
            if let ValueState::Pending(node) = self.values[r.value].state {
                self.segment.stopped.insert(node);
            }
        }
        Ok(handle)
    }

    /// Gradients of the one-element `root` with respect to the values of `wrt` (the functional
    /// form: no slots, no write-backs).
    pub(in crate::trace) fn gradients(
        &mut self,
        root: &Tensor,
        wrt: &[Tensor],
        loc: &SourceLoc,
    ) -> Result<Vec<Option<Tensor>>> {
        const OP: &str = "value_and_grad";
        self.check_aborted()?;
        let (root_node, seed_node) = self.root_and_seed(root, None, OP, loc)?;
        // The functional form differentiates this segment only: its arguments are not leaves on
        // the tape, so no gradient could reach them through graphs that already ran.
        if self.segment.bindings.iter().any(|&v| matches!(self.values[v].origin, Origin::Computed)) {
            return Err(Error::invalid(
                OP,
                loc,
                "a graph break before value_and_grad() split this function, and the functional form does \
                 not follow gradients across a break; call it outside the compiled function, or use \
                 set_requires_grad and backward()",
            ));
        }
        let mut nodes = Vec::with_capacity(wrt.len());
        for t in wrt {
            let value = self.value_of(t, OP, Some(loc))?;
            nodes.push(self.node_for(value, OP, Some(loc))?);
        }
        let stopped = self.segment.stopped.clone();
        let grads =
            braze_autodiff::backward_stopping(&mut self.segment.graph, &[(root_node, seed_node)], &nodes, &stopped)
                .map_err(|e| Error::Gradient { op: OP.into(), loc: Some(loc.clone()), autodiff: Box::new(e) })?;
        Ok(grads.into_iter().map(|g| g.map(|node| self.pending_value(node))).collect())
    }

    /// The node of `root` and of the gradient flowing into it (`seed`, or 1 for a one-element
    /// root).
    fn root_and_seed(
        &mut self,
        root: &Tensor,
        seed: Option<&Tensor>,
        op: &str,
        loc: &SourceLoc,
    ) -> Result<(NodeId, NodeId)> {
        let root_value = self.value_of(root, op, Some(loc))?;
        let root_node = self.node_for(root_value, op, Some(loc))?;
        let seed_node = match seed {
            Some(s) => {
                let v = self.value_of(s, op, Some(loc))?;
                self.node_for(v, op, Some(loc))?
            }
            None if root.numel() == 1 => {
                let c = self.segment.graph.constant(1.0, root.dtype());
                self.segment.graph.set_loc(c, Some(loc.clone()));
                c
            }
            None => {
                return Err(Error::invalid(
                    op,
                    loc,
                    format!(
                        "a gradient can be seeded implicitly only for a one-element result, this one is {}{}; \
                         use backward_with(grad)",
                        root.dtype(),
                        root.shape()
                    ),
                ))
            }
        };
        Ok((root_node, seed_node))
    }

    /// `root.backward()`: appends the backward of the current segment to it and accumulates
    /// each parameter's gradient in its slot.
    pub(in crate::trace) fn backward(&mut self, root: &Tensor, seed: Option<&Tensor>, loc: &SourceLoc) -> Result<()> {
        const OP: &str = "backward";
        self.check_aborted()?;
        let (root_node, seed_node) = self.root_and_seed(root, seed, OP, loc)?;
        // Leaves get their gradient in a slot; tensors computed outside this segment (by a piece
        // before a break, or eagerly before the call) pass theirs on through the tape.
        let mut params = Vec::new();
        let mut upstream = Vec::new();
        let mut wrt = Vec::new();
        for &value in &self.segment.bindings {
            let v = &self.values[value];
            let (ValueState::Concrete(t), false) = (&v.state, matches!(v.origin, Origin::GradOf(_))) else { continue };
            let leaf = t.requires_grad() && t.inner.autograd.tape.get().is_none();
            if leaf || t.needs_grad() {
                if leaf { &mut params } else { &mut upstream }.push((wrt.len(), t.clone()));
                wrt.push(self.segment.input_nodes[&value]);
            }
        }
        let stopped = self.segment.stopped.clone();
        let grads =
            braze_autodiff::backward_stopping(&mut self.segment.graph, &[(root_node, seed_node)], &wrt, &stopped)
                .map_err(|e| Error::Gradient { op: OP.into(), loc: Some(loc.clone()), autodiff: Box::new(e) })?;
        for (i, param) in &params {
            if let Some(grad) = grads[*i] {
                let fresh = self.pending_value(grad);
                self.add_to_slot(param, &fresh, loc)?;
            }
        }
        let flowing: Vec<(Tensor, Tensor)> =
            upstream.iter().filter_map(|(i, t)| grads[*i].map(|g| (t.clone(), self.pending_value(g)))).collect();
        if flowing.is_empty() {
            return Ok(());
        }
        // Their backwards need this segment's gradients as data: run it (a break), then follow the
        // tape from them and add what reaches the leaves to the slots.
        let reads = flowing.iter().map(|(_, g)| self.value_of(g, OP, Some(loc))).collect::<Result<Vec<_>>>()?;
        self.graph_break(BreakKind::BackwardAcrossBreak, OP, loc, &reads)?;
        let roots = reads
            .iter()
            .zip(&flowing)
            .map(|(&g, (t, _))| Ok((t.clone(), Seed::Given(self.concrete(g)?))))
            .collect::<Result<Vec<_>>>()?;
        for (leaf, grad) in crate::autograd::tape::leaf_gradients(roots, loc)? {
            self.add_to_slot(&leaf, &grad, loc)?;
        }
        Ok(())
    }

    /// Adds `grad` to the gradient `param` has so far in this call.
    fn add_to_slot(&mut self, param: &Tensor, grad: &Tensor, loc: &SourceLoc) -> Result<()> {
        let slot = self.grad_slot(param, true);
        let total = match self.grads[slot].current.clone() {
            Some(previous) => self.record("backward", &[&previous, grad], loc, &|b, ids| {
                b.op(Op::Binary { op: braze_ir::BinaryOp::Add }, ids)
            })?,
            None => grad.clone(),
        };
        self.grads[slot].current = Some(total);
        Ok(())
    }
}
