//! Kernels taken from a loaded module: what a launch needs to know about them.

use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Weak};

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};

use crate::capture_gate::DropOutsideCapture;
use crate::error::{CudaError, Result};
use crate::nvrtc::CompiledModule;

/// A module loaded into a device's context; kernels taken from it keep it loaded.
#[derive(Debug, Clone)]
pub struct LoadedModule {
    pub(crate) module: Arc<DropOutsideCapture<Arc<CudaModule>>>,
    pub(crate) context: Arc<CudaContext>,
}

/// A kernel ready to launch. Cloning is cheap and shares the module.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub(crate) inner: Arc<KernelInner>,
}

#[derive(Debug)]
pub(crate) struct KernelInner {
    pub(crate) name: String,
    /// Holds the module loaded; unloading it must not overlap a capture on another thread.
    pub(crate) function: DropOutsideCapture<CudaFunction>,
    pub(crate) context: Arc<CudaContext>,
    pub(crate) max_threads_per_block: u32,
    pub(crate) static_shared_bytes: u32,
    /// The dynamic shared memory limit last set on the function, to set it only when it grows.
    pub(crate) dynamic_shared_limit: AtomicU32,
}

impl Kernel {
    /// The kernel's name in its module.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Most threads per block this kernel can be launched with (register use limits it).
    pub fn max_threads_per_block(&self) -> u32 {
        self.inner.max_threads_per_block
    }

    /// Static shared memory per block, in bytes.
    pub fn static_shared_bytes(&self) -> u32 {
        self.inner.static_shared_bytes
    }

    /// The underlying cudarc function, for interop.
    pub fn function(&self) -> &CudaFunction {
        &self.inner.function
    }
}

impl LoadedModule {
    /// Looks up a kernel by name (the mangled name unless declared `extern "C"`).
    pub fn get_function(&self, name: &str) -> Result<Kernel> {
        if name.contains('\0') {
            return Err(CudaError::InvalidArgument(format!("kernel name {name:?} contains a NUL byte")));
        }
        let function = self
            .module
            .load_function(name)
            .map_err(|err| CudaError::Driver(format!("kernel `{name}` not in module: {err}")))?;
        let attribute = |attr| function.get_attribute(attr).map(|v| u32::try_from(v).unwrap_or(0));
        let max_threads_per_block = attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
        let static_shared_bytes = attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?;
        let dynamic_shared_limit =
            attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?;
        Ok(Kernel {
            inner: Arc::new(KernelInner {
                name: name.to_string(),
                context: self.context.clone(),
                function: DropOutsideCapture::new(function),
                max_threads_per_block,
                static_shared_bytes,
                dynamic_shared_limit: AtomicU32::new(dynamic_shared_limit),
            }),
        })
    }
}

/// Functions loaded on a device, by compiled module (its address, with a weak handle that tells
/// a dropped module from a new one at the same address) and entry name. Weak: a module is
/// unloaded once no executable holds one of its functions.
#[derive(Debug, Default)]
pub(crate) struct LoadedFunctions {
    functions: HashMap<(usize, String), (Weak<CompiledModule>, Weak<KernelInner>)>,
    /// The table's size after its last sweep of dead entries.
    swept_at: usize,
}

impl LoadedFunctions {
    pub(crate) fn get(&self, module: &Arc<CompiledModule>, entry: &str) -> Option<Kernel> {
        let (compiled, function) = self.functions.get(&(Arc::as_ptr(module) as usize, entry.to_string()))?;
        let same_module = compiled.upgrade().is_some_and(|c| Arc::ptr_eq(&c, module));
        same_module.then(|| function.upgrade().map(|inner| Kernel { inner })).flatten()
    }

    pub(crate) fn insert(&mut self, module: &Arc<CompiledModule>, entry: &str, kernel: &Kernel) {
        let key = (Arc::as_ptr(module) as usize, entry.to_string());
        self.functions.insert(key, (Arc::downgrade(module), Arc::downgrade(&kernel.inner)));
        if self.functions.len() > 2 * self.swept_at + 64 {
            self.functions.retain(|_, (compiled, function)| compiled.strong_count() > 0 && function.strong_count() > 0);
            self.swept_at = self.functions.len();
        }
    }
}
