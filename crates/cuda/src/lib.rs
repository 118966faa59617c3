//! CUDA backend of braze: compiles generated CUDA C with NVRTC, caches the results, and runs
//! kernels, CUDA graphs and cuBLASLt matmuls on a GPU.
//!
//! This is the only crate of the workspace that talks to CUDA (through `cudarc`) and the only
//! one with `unsafe` code. Libraries are loaded at run time, so it builds and its NVRTC half
//! works on machines without a GPU; [`nvrtc_available`] and [`cuda_available`] say what is
//! usable, and every entry point returns an error rather than panicking when something is
//! missing.

pub mod autotune;
pub mod blas;
pub mod buffer;
pub mod cache;
mod capture_gate;
mod checks;
pub mod device;
pub mod error;
pub mod executor;
pub mod graph;
pub mod kernel;
pub mod launch;
pub mod nvrtc;
pub mod pinned;
pub mod spans;
pub mod unit;

pub use autotune::{AutotuneRecord, AutotuneStore};
pub use blas::{BlasLt, MatmulDtype, MatmulSpec, MatrixRef};
pub use buffer::{bytes_of, values_from_bytes, DeviceBuffer, PodScalar};
pub use cache::{CacheKey, CacheStats, KernelCache};
pub use checks::CHECK_SLOTS;
pub use device::{cuda_available, device_count, driver_available, CudaDevice, EventTimer};
pub use error::{CudaError, Result};
pub use executor::{
    compile_kernels, compile_kernels_on, compile_threads, BuildReport, ExecOptions, KernelTime, PlanExecutable,
    TuningProgress,
};
pub use graph::CapturedGraph;
pub use kernel::{Kernel, LoadedModule};
pub use launch::KernelArg;
pub use nvrtc::{
    compile, default_include_dirs, nvrtc_available, nvrtc_version, parse_ptxas_resources, CompileOptions,
    CompiledModule, ImageKind, KernelResources,
};
pub use pinned::{PinnedBuffer, PinnedPool, StreamMark};
pub use spans::{DeviceClock, PendingSpan, SpanStream};
