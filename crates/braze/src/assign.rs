//! In-place assignment: how a captured weight gets new data between calls of a compiled function.

use crate::tensor::{caller, Storage};
use crate::{trace, Error, Result, Tensor};

impl Tensor {
    /// Replaces this tensor's data with `value`'s, in place: every clone of this handle, and every
    /// compiled function that captured it, sees the new data on its next call. A new dtype or
    /// shape makes those functions trace again.
    ///
    /// Inside a compiled function, a captured tensor (a weight, optimizer state) can be
    /// assigned a value of its own dtype and shape: later ops of the function read the new value
    /// and the tensor holds it after each call (an optimizer step written as ordinary code).
    #[track_caller]
    pub fn assign(&self, value: &Tensor) -> Result<()> {
        let loc = caller();
        if let Some(result) = trace::assign(self, value, &loc) {
            return result;
        }
        let new_data = value.storage().clone();
        if let Storage::Traced(_) = new_data {
            return Err(Error::StaleTrace { op: "assign".into(), loc: Some(loc) });
        }
        self.replace_storage(new_data, loc)
    }
}
