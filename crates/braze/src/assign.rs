//! In-place assignment: how a captured weight gets new data between calls of a compiled function.

use crate::tensor::{caller, Storage};
use crate::{trace, Error, Result, Tensor};

impl Tensor {
    /// Replaces this tensor's data with `value`'s, in place: every clone of this handle, and every
    /// compiled function that captured it, sees the new data on its next call. A new dtype or
    /// shape makes those functions trace again.
    ///
    /// Not allowed inside a compiled function (in-place updates are not traced) or on a traced
    /// tensor.
    #[track_caller]
    pub fn assign(&self, value: &Tensor) -> Result<()> {
        let loc = caller();
        if trace::is_active() {
            return Err(Error::invalid(
                "assign",
                &loc,
                "cannot assign inside a compiled function (in-place updates are not traced); \
                 assign before or after the call",
            ));
        }
        let new_data = value.storage().clone();
        if let Storage::Traced(_) = new_data {
            return Err(Error::StaleTrace { op: "assign".into(), loc: Some(loc) });
        }
        self.replace_storage(new_data, loc)
    }
}
