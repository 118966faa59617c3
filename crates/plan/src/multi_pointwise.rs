//! Multi-tensor pointwise kernels: mutually independent pointwise programs, possibly of different
//! shapes and dtypes, run by one launch (horizontal fusion). An optimizer step over many
//! parameters is the case in point: one update program per parameter, one launch for them all.

use crate::error::Rule;
use crate::plan::{Kernel, Plan, Pointwise};
use crate::text::{fmt_body, plural};
use crate::validate::{broken, KernelResult};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Independent pointwise programs in one launch. Member `m` is exactly what one
/// [`Pointwise`] kernel would be, except that its loads name this kernel's input slots and its
/// stores this kernel's output slots (members may share input slots; each output slot belongs to
/// one member). No member reads what another writes: the kernel's inputs are written before it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MultiPointwise {
    pub members: Vec<Pointwise>,
}

impl MultiPointwise {
    /// Elements over all members.
    pub fn numel(&self) -> usize {
        self.members.iter().map(|m| m.shape.numel()).sum()
    }

    /// The kernel line's family part: `multi_pointwise: 3 members, 4200 elements`.
    pub(crate) fn summary(&self) -> String {
        format!("multi_pointwise: {}, {} elements", plural(self.members.len(), "member"), self.numel())
    }
}

/// The members' bodies, each under a `member m: shape=[..]` line.
pub(crate) fn fmt_members(f: &mut fmt::Formatter<'_>, multi: &MultiPointwise) -> fmt::Result {
    for (m, member) in multi.members.iter().enumerate() {
        writeln!(f, "  member {m}: shape={}", member.shape)?;
        fmt_body(f, &member.body, None)?;
    }
    Ok(())
}

impl Plan {
    /// [`Rule::MultiPointwise`], with each member's body held to the pointwise rules.
    pub(crate) fn validate_multi_pointwise(&self, kernel: &Kernel, multi: &MultiPointwise) -> KernelResult {
        let fail = |detail: String| Err(broken(Rule::MultiPointwise, detail));
        if multi.members.is_empty() {
            return fail("no members".into());
        }
        let mut stored_by: Vec<Option<usize>> = vec![None; kernel.outputs.len()];
        for (m, member) in multi.members.iter().enumerate() {
            let numel = member.shape.numel();
            self.validate_body(&kernel.inputs, &member.body, member.shape.dims(), false, |_| numel > 0)
                .map_err(|e| e.within(&format!("member {m}")))?;
            if member.body.stores.is_empty() {
                return fail(format!("member {m} stores nothing"));
            }
            for store in &member.body.stores {
                let Some(value) = member.body.values.get(store.value.0) else {
                    return fail(format!("member {m} stores {}, which is not a value", store.value));
                };
                let Some(owner) = stored_by.get_mut(store.output) else {
                    return fail(format!(
                        "member {m} stores to output slot {} of {}",
                        store.output,
                        kernel.outputs.len()
                    ));
                };
                if let Some(first) = owner.replace(m) {
                    return fail(format!(
                        "output slot {} is stored by member {first} and again by member {m}",
                        store.output
                    ));
                }
                let b = kernel.outputs[store.output];
                let buffer = self.buffer(b);
                if buffer.dtype != value.dtype || buffer.numel != numel {
                    return fail(format!(
                        "member {m} stores {numel} {} values into {b}, which holds {} {}",
                        value.dtype, buffer.numel, buffer.dtype
                    ));
                }
            }
        }
        match stored_by.iter().position(Option::is_none) {
            Some(slot) => fail(format!("output slot {slot} is never stored")),
            None => Ok(()),
        }
    }
}
