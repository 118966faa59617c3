//! Kernels taken from a loaded module: what a launch needs to know about them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

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
    /// The dynamic shared memory limit last set on the function, to set it only when it grows;
    /// a lock, so that executables on two threads sharing the function raise it one at a time.
    pub(crate) dynamic_shared_limit: Mutex<u32>,
    /// The loaded module, held as long as any function of it: the device's table finds it
    /// through a weak handle for the module's other entries.
    pub(crate) module: Arc<DropOutsideCapture<Arc<CudaModule>>>,
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
                dynamic_shared_limit: Mutex::new(dynamic_shared_limit),
                module: self.module.clone(),
            }),
        })
    }
}

/// Modules loaded on a device and the functions taken from them, by compiled module (its
/// address; the weak handle to it keeps the address from being reused while the entry names it).
/// Weak: a module is unloaded once no executable holds one of its functions.
#[derive(Debug, Default)]
pub(crate) struct LoadedFunctions {
    modules: HashMap<usize, LoadedEntry>,
    /// The table's size after its last sweep of dead entries.
    swept_at: usize,
}

#[derive(Debug)]
struct LoadedEntry {
    compiled: Weak<CompiledModule>,
    module: Weak<DropOutsideCapture<Arc<CudaModule>>>,
    functions: HashMap<String, Weak<KernelInner>>,
}

impl LoadedFunctions {
    /// The loaded entry of `module`, while its compiled module and a function of it live.
    fn entry(&self, module: &Arc<CompiledModule>) -> Option<&LoadedEntry> {
        let entry = self.modules.get(&(Arc::as_ptr(module) as usize))?;
        (entry.compiled.strong_count() > 0 && entry.module.strong_count() > 0).then_some(entry)
    }

    pub(crate) fn function(&self, module: &Arc<CompiledModule>, name: &str) -> Option<Kernel> {
        self.entry(module)?.functions.get(name)?.upgrade().map(|inner| Kernel { inner })
    }

    /// The module loaded from `module`, while a function of it is held.
    pub(crate) fn module(&self, module: &Arc<CompiledModule>, context: &Arc<CudaContext>) -> Option<LoadedModule> {
        let loaded = self.entry(module)?.module.upgrade()?;
        Some(LoadedModule { module: loaded, context: context.clone() })
    }

    pub(crate) fn insert(&mut self, module: &Arc<CompiledModule>, name: &str, kernel: &Kernel) {
        let live = self.entry(module).is_some();
        let entry = self.modules.entry(Arc::as_ptr(module) as usize).or_insert_with(|| LoadedEntry {
            compiled: Weak::new(),
            module: Weak::new(),
            functions: HashMap::new(),
        });
        if !live {
            *entry = LoadedEntry {
                compiled: Arc::downgrade(module),
                module: Arc::downgrade(&kernel.inner.module),
                functions: HashMap::new(),
            };
        }
        entry.functions.insert(name.to_string(), Arc::downgrade(&kernel.inner));
        if self.modules.len() > 2 * self.swept_at + 64 {
            self.modules.retain(|_, e| e.compiled.strong_count() > 0 && e.module.strong_count() > 0);
            self.swept_at = self.modules.len();
        }
    }
}
