//! Loading compiled modules and launching their kernels with mixed argument lists.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use crate::buffer::DeviceBuffer;
use crate::capture_gate::{outside_capture, DropOutsideCapture};
use crate::device::{lock, CudaDevice};
use crate::error::{CudaError, Result};
use crate::kernel::{Kernel, LoadedModule};
use crate::nvrtc::{CompiledModule, ImageKind};

/// Dynamic shared memory a kernel may use without opting in, in bytes.
const DEFAULT_DYNAMIC_SHARED_LIMIT: u32 = 48 * 1024;

/// One kernel argument. Buffers are passed as device pointers; scalars by value, and must match
/// the kernel parameter's C type exactly.
#[derive(Debug, Clone, Copy)]
pub enum KernelArg<'a> {
    /// Pointer to the start of a buffer.
    Buffer(&'a DeviceBuffer),
    /// Pointer `offset_bytes` into a buffer (may equal its length: a one-past-the-end pointer).
    BufferAt(&'a DeviceBuffer, usize),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
    F64(f64),
}

/// Argument values materialised before the launch, so the launch builder can borrow them.
enum ArgValue {
    Pointer(u64),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
    F64(f64),
}

impl CudaDevice {
    /// Function `entry` of `compiled`, loaded on this device once for every executable that
    /// runs it while any of them holds it: an eager op met at a thousand sizes loads its code
    /// once, not once per size.
    pub fn shared_function(&self, compiled: &Arc<CompiledModule>, entry: &str) -> Result<Kernel> {
        let module = {
            let loaded = lock(&self.loaded);
            if let Some(kernel) = loaded.function(compiled, entry) {
                return Ok(kernel);
            }
            loaded.module(compiled, &self.ctx)
        };
        let kernel = match module {
            Some(module) => module.get_function(entry)?,
            None => self.load_module(compiled)?.get_function(entry)?,
        };
        let mut loaded = lock(&self.loaded);
        // Another thread may have loaded it meanwhile: keep one.
        if let Some(kernel) = loaded.function(compiled, entry) {
            return Ok(kernel);
        }
        loaded.insert(compiled, entry, &kernel);
        Ok(kernel)
    }

    /// Loads a compiled module: CUBIN directly, PTX through the driver's JIT.
    pub fn load_module(&self, compiled: &CompiledModule) -> Result<LoadedModule> {
        let image = match compiled.kind {
            ImageKind::Cubin => {
                if compiled.image.is_empty() {
                    return Err(CudaError::InvalidArgument("empty CUBIN image".into()));
                }
                Ptx::from_binary(compiled.image.clone())
            }
            ImageKind::Ptx => {
                let text = String::from_utf8(compiled.image.clone())
                    .map_err(|_| CudaError::InvalidArgument("PTX image is not UTF-8".into()))?;
                if text.contains('\0') {
                    return Err(CudaError::InvalidArgument("PTX image contains a NUL byte".into()));
                }
                Ptx::from_src(text)
            }
        };
        let module = outside_capture(|| self.ctx.load_module(image)).map_err(|err| {
            CudaError::Driver(format!(
                "loading a {:?} module on {} ({}): {err}",
                compiled.kind,
                self.name(),
                self.arch()
            ))
        })?;
        self.module_loads.fetch_add(1, Ordering::Relaxed);
        Ok(LoadedModule { module: Arc::new(DropOutsideCapture::new(module)), context: self.ctx.clone() })
    }

    /// Launches `kernel` on the device's stream. Validates the configuration and arguments
    /// first, opts the kernel in to more than 48 KiB of dynamic shared memory when asked, and
    /// reports launch errors. In debug builds it also waits for the kernel and reports faults
    /// it raised (except while capturing a graph, where waiting is not allowed).
    pub fn launch(
        &self,
        kernel: &Kernel,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        dynamic_shared_bytes: u32,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        self.gate.shared(|| self.launch_on_stream(kernel, grid, block, dynamic_shared_bytes, args))
    }

    /// [`CudaDevice::launch`] past the capture gate.
    fn launch_on_stream(
        &self,
        kernel: &Kernel,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        dynamic_shared_bytes: u32,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        let fail = |reason: String| CudaError::Launch { kernel: kernel.name().to_string(), reason };
        if kernel.inner.context.cu_ctx() != self.ctx.cu_ctx() {
            return Err(fail("kernel was loaded on another device".into()));
        }
        validate_dims(kernel, grid, block).map_err(fail)?;
        self.ensure_dynamic_shared(kernel, dynamic_shared_bytes).map_err(fail)?;

        let mut values = Vec::with_capacity(args.len());
        for (index, arg) in args.iter().enumerate() {
            values.push(match *arg {
                // The argument's label is only formatted when the check fails: launches are on
                // the per-call hot path.
                KernelArg::Buffer(buffer) => {
                    ArgValue::Pointer(self.checked_range(buffer, 0, 0, "").map_err(|e| fail(argument_error(index, e)))?)
                }
                KernelArg::BufferAt(buffer, offset) => ArgValue::Pointer(
                    self.checked_range(buffer, offset, 0, "").map_err(|e| fail(argument_error(index, e)))?,
                ),
                KernelArg::I32(v) => ArgValue::I32(v),
                KernelArg::U32(v) => ArgValue::U32(v),
                KernelArg::I64(v) => ArgValue::I64(v),
                KernelArg::U64(v) => ArgValue::U64(v),
                KernelArg::F32(v) => ArgValue::F32(v),
                KernelArg::F64(v) => ArgValue::F64(v),
            });
        }

        let mut builder = self.stream.launch_builder(&kernel.inner.function);
        for value in &values {
            match value {
                ArgValue::Pointer(v) | ArgValue::U64(v) => builder.arg(v),
                ArgValue::I32(v) => builder.arg(v),
                ArgValue::U32(v) => builder.arg(v),
                ArgValue::I64(v) => builder.arg(v),
                ArgValue::F32(v) => builder.arg(v),
                ArgValue::F64(v) => builder.arg(v),
            };
        }
        let config = LaunchConfig { grid_dim: grid, block_dim: block, shared_mem_bytes: dynamic_shared_bytes };
        // SAFETY: every pushed argument points into `values`, which outlives the launch call
        // (the driver copies parameter values at launch). Pointer arguments address live
        // allocations of this device (checked above) that are ordered on this stream; if they
        // are freed later, the free is stream-ordered after the kernel. Matching the kernel's
        // parameter list and staying within the buffers is the contract of generated code, as
        // with any CUDA launch; the dimensions and shared memory were validated above.
        unsafe { builder.launch(config) }.map_err(|err| fail(err.to_string()))?;

        if let Some(record) = lock(&self.capture).as_mut() {
            record.keep_kernel(kernel);
            for arg in args {
                if let KernelArg::Buffer(buffer) | KernelArg::BufferAt(buffer, _) = arg {
                    record.keep_buffer(buffer);
                }
            }
        } else if cfg!(debug_assertions) {
            self.stream.synchronize().map_err(|err| fail(format!("kernel faulted: {err}")))?;
        }
        Ok(())
    }

    /// Raises the kernel's dynamic shared memory limit when a launch needs more than 48 KiB.
    fn ensure_dynamic_shared(&self, kernel: &Kernel, bytes: u32) -> std::result::Result<(), String> {
        let available = self.max_shared_per_block_optin().saturating_sub(kernel.static_shared_bytes());
        if bytes > available {
            return Err(format!(
                "{bytes} bytes of dynamic shared memory requested, at most {available} available \
                 ({} static)",
                kernel.static_shared_bytes()
            ));
        }
        if bytes <= DEFAULT_DYNAMIC_SHARED_LIMIT {
            return Ok(());
        }
        let mut limit = lock(&kernel.inner.dynamic_shared_limit);
        if bytes > *limit {
            self.ctx.bind_to_thread().map_err(|e| e.to_string())?;
            kernel
                .inner
                .function
                .set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32)
                .map_err(|e| format!("setting the dynamic shared memory limit: {e}"))?;
            *limit = bytes;
        }
        Ok(())
    }
}

/// `argument 2: buffer belongs to another device` from a range check made with an empty label.
fn argument_error(index: usize, error: CudaError) -> String {
    match error {
        CudaError::InvalidArgument(message) => format!("argument {index}{message}"),
        other => format!("argument {index}: {other}"),
    }
}

fn validate_dims(kernel: &Kernel, grid: (u32, u32, u32), block: (u32, u32, u32)) -> std::result::Result<(), String> {
    if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 || block.0 == 0 || block.1 == 0 || block.2 == 0 {
        return Err(format!("zero dimension in grid {grid:?} or block {block:?}"));
    }
    if grid.0 > i32::MAX as u32 || grid.1 > 65_535 || grid.2 > 65_535 {
        return Err(format!("grid {grid:?} exceeds (2^31-1, 65535, 65535)"));
    }
    if block.0 > 1024 || block.1 > 1024 || block.2 > 64 {
        return Err(format!("block {block:?} exceeds (1024, 1024, 64)"));
    }
    let threads = u64::from(block.0) * u64::from(block.1) * u64::from(block.2);
    if threads > u64::from(kernel.max_threads_per_block()) {
        return Err(format!(
            "block of {threads} threads exceeds this kernel's limit of {}",
            kernel.max_threads_per_block()
        ));
    }
    Ok(())
}
