//! User-defined ops: host code (a graph break inside a compiled function) or a composition of
//! braze ops (traced into the graph like any other op).

use crate::tensor::caller;
use crate::{trace, Result, Tensor};
use braze_ir::HostTensor;
use std::fmt;
use std::sync::Arc;

type HostFn = dyn Fn(&[HostTensor]) -> Result<Vec<HostTensor>> + Send + Sync;
type TraceableFn = dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync;

#[derive(Clone)]
pub struct CustomOp {
    name: String,
    implementation: Implementation,
}

#[derive(Clone)]
enum Implementation {
    Host(Arc<HostFn>),
    Traceable(Arc<TraceableFn>),
}

impl CustomOp {
    /// An op implemented by host code on host data. The compiler cannot see into it, so inside a
    /// compiled function it is a [`crate::BreakKind::OpaqueHostFn`] graph break.
    pub fn host(
        name: impl Into<String>,
        f: impl Fn(&[HostTensor]) -> Result<Vec<HostTensor>> + Send + Sync + 'static,
    ) -> CustomOp {
        CustomOp { name: name.into(), implementation: Implementation::Host(Arc::new(f)) }
    }

    /// An op implemented with braze ops: it traces into the graph and causes no break.
    pub fn traceable(
        name: impl Into<String>,
        f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    ) -> CustomOp {
        CustomOp { name: name.into(), implementation: Implementation::Traceable(Arc::new(f)) }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn is_traceable(&self) -> bool {
        matches!(self.implementation, Implementation::Traceable(_))
    }

    #[track_caller]
    pub fn call(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let loc = caller();
        match &self.implementation {
            Implementation::Host(f) => trace::host_call(&self.name, inputs, loc, f.as_ref()),
            Implementation::Traceable(f) => f(inputs),
        }
    }
}

impl fmt::Debug for CustomOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.is_traceable() { "traceable" } else { "host" };
        write!(f, "CustomOp({}, {kind})", self.name)
    }
}
