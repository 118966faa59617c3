//! braze: graph capture and fusion for tensor programs in Rust, as torch.compile is for PyTorch.
//!
//! ```
//! use braze::{compile, DType, Device, Tensor};
//!
//! let block = compile(|a: &[Tensor]| {
//!     let y = a[0].layer_norm(&a[1], &a[2], 1e-5)?.relu()?.add(&a[3])?;
//!     Ok(vec![y])
//! })
//! .fullgraph(true); // any graph break is an error
//!
//! let x = Tensor::randn([4, 8], DType::F32, 0)?;
//! let w = Tensor::ones([8], DType::F32, Device::Cpu)?;
//! let b = Tensor::zeros([8], DType::F32, Device::Cpu)?;
//! let out = block.call(&[x.clone(), w.clone(), b.clone(), x.clone()])?; // traces, compiles, runs
//! println!("{}", block.explain(&[x.clone(), w, b, x])?); // graphs, breaks with file:line, ...
//! # assert_eq!(out[0].shape().dims(), &[4, 8]);
//! # Ok::<(), braze::Error>(())
//! ```
//!
//! Outside `compile` the same ops run eagerly, one graph per op: on the CPU reference for CPU
//! tensors, as one cached kernel per op structure for GPU tensors.
//!
//! Code map, in the order a call goes through it:
//! - `tensor`, `ops`: the [`Tensor`] handle and every op as a method, each recording the caller's
//!   `file:line:col`; `promotion`: PyTorch's type promotion of mixed-dtype operands (casts
//!   inserted before the op, so the IR stays strictly typed); `display`: printing as PyTorch's.
//! - `trace`: the thread-local trace that ops record into inside a compiled function, and eager
//!   execution outside one.
//! - `breaks`, `custom_op`: everything that needs values on the host ([`BreakKind`]);
//!   `sync_debug`: the same reads in eager code as host synchronizations ([`SyncDebugMode`],
//!   [`sync_count`]).
//! - `compile`: [`compile`] and [`Compiled`], the cache per input signature and its guards.
//! - [`backend`]: the seam where graphs become runnable ([`backend::Executable`]): traced graphs
//!   are fused into a plan and run by the CPU plan executor or as NVRTC-compiled CUDA kernels;
//!   eager one-op graphs run on the CPU reference or as one kernel on the GPU.
//! - `explain`, [`logging`]: [`Explanation`], `BRAZE_LOG` and `BRAZE_DUMP`.
//! - `prefetch`, `metric`: keeping the GPU fed and the queue unstalled ([`Prefetcher`],
//!   [`PinnedPool`], [`DeviceMetric`]); [`timeline`]: `BRAZE_TRACE`, host and device spans on one
//!   axis as a Chrome trace, and the GPU-busy summary.
//!
//! **Invariant:** no user input makes the library panic: every op returns `Result`.

mod assign;
mod autocast;
mod autograd;
pub mod backend;
mod breaks;
mod compile;
mod cuda;
mod custom_op;
mod device;
mod display;
mod error;
mod explain;
mod fill;
mod host_reads;
pub mod logging;
mod metric;
mod mode;
mod ops;
pub mod optim;
mod prefetch;
mod profile;
mod promotion;
mod signature;
mod sync_debug;
mod tensor;
pub mod timeline;
mod trace;
mod tuning_bar;

pub use autocast::{autocast, autocast_dtype, without_autocast};
pub use autograd::{grad, is_grad_enabled, no_grad, value_and_grad};
pub use backend::{allow_tf32, set_allow_tf32};
pub use braze_cuda::KernelTime;
pub use braze_ir::{DType, Graph, HostData, HostTensor, Shape, SourceLoc};
pub use breaks::{BreakKind, GraphBreak};
pub use compile::{compile, CompileStats, Compiled, TracedGraph};
pub use cuda::{cuda_device, kernel_cache_stats};
pub use custom_op::CustomOp;
pub use device::Device;
pub use error::{Error, Result};
pub use explain::{Explanation, PeakMemory};
pub use metric::{DeviceMetric, MetricReading};
pub use mode::Mode;
pub use prefetch::{pageable_copy_count, Batch, IntoBatch, PinnedBuffer, PinnedPool, Prefetcher};
pub use sync_debug::{set_sync_debug_mode, sync_count, sync_debug_mode, SyncDebugMode};
pub use tensor::{Element, Tensor};
