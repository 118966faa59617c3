//! The one error type of this crate.
//!
//! Every fallible call returns [`CudaError`]; missing libraries, missing devices and bad input are
//! reported as values, never as panics, so callers can fall back to the CPU path.

use braze_codegen::CodegenError;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Everything that can go wrong between CUDA C source and a finished kernel run.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// `libnvrtc` could not be opened, so nothing can be compiled.
    #[error(
        "NVRTC not found: libnvrtc.so could not be loaded (add its directory to LD_LIBRARY_PATH, \
         e.g. /usr/local/cuda/lib64 or the pip wheel's nvidia/cu13/lib)"
    )]
    NvrtcUnavailable,

    /// `libcuda` (the driver) could not be opened: no NVIDIA driver on this machine.
    #[error("CUDA driver not found: libcuda.so could not be loaded")]
    DriverUnavailable,

    /// `libcublasLt` could not be opened.
    #[error(
        "cuBLASLt not found: libcublasLt.so could not be loaded (add /usr/local/cuda/lib64 to \
         LD_LIBRARY_PATH)"
    )]
    CublasLtUnavailable,

    /// A kernel met an index outside `0..bound` (an index_select's check, raised on the device;
    /// the read itself was clamped). The check is read without a host wait, so it is reported at
    /// a later call: the next run of the same executable that finds the copy of the check words
    /// complete, or at the latest the next host read or synchronization of the device.
    #[error(
        "{op}: index {index} is out of range for a dimension of size {bound} (a device-side check, \
         reported at a later call or host read)"
    )]
    IndexOutOfRange { op: String, index: i64, bound: usize },

    /// The driver loaded but the requested device does not exist.
    #[error("no CUDA device with ordinal {ordinal} ({count} device(s) visible)")]
    NoDevice { ordinal: usize, count: usize },

    /// An NVRTC API call failed for a reason other than a compile error in the source.
    #[error("NVRTC call {call} failed: {reason}")]
    Nvrtc { call: &'static str, reason: String },

    /// The CUDA C source did not compile. Carries the compiler log and the source so the
    /// message alone is enough to find the offending line.
    #[error("{}", format_compile_error(name, log, source_code))]
    Compile {
        name: String,
        log: String,
        /// The CUDA C that was compiled (named so because `source` means the error cause).
        source_code: String,
    },

    /// A CUDA driver call failed.
    #[error("CUDA driver error: {0}")]
    Driver(String),

    /// The on-disk kernel cache could not be used at `path`.
    #[error("kernel cache error at {}: {reason}", path.display())]
    Cache { path: PathBuf, reason: String },

    /// A kernel launch was rejected, either by validation here or by the driver.
    #[error("launch of kernel `{kernel}` failed: {reason}")]
    Launch { kernel: String, reason: String },

    /// A cuBLASLt call failed.
    #[error("cuBLASLt error: {0}")]
    Blas(String),

    /// Operand shapes or sizes do not fit together.
    #[error("shape mismatch in {op}: {detail}")]
    ShapeMismatch { op: &'static str, detail: String },

    /// An argument is out of range or malformed (offsets past the end, NUL bytes in names, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// Generating the CUDA C of a plan kernel failed.
    #[error("code generation failed: {0}")]
    Codegen(CodegenError),

    /// Something was attempted that a CUDA graph capture cannot record, or the capture failed.
    #[error("CUDA graph capture: {0}")]
    Capture(String),
}

/// Crate-wide result alias.
pub type Result<T> = std::result::Result<T, CudaError>;

// The wrapped errors of other crates are part of the message (unchanged for users), so they are
// not also reported as `source()`: an error chain printer would print them twice.
impl From<CodegenError> for CudaError {
    fn from(err: CodegenError) -> Self {
        CudaError::Codegen(err)
    }
}

impl From<cudarc::driver::DriverError> for CudaError {
    fn from(err: cudarc::driver::DriverError) -> Self {
        CudaError::Driver(err.to_string())
    }
}

impl From<cudarc::cublaslt::result::CublasError> for CudaError {
    fn from(err: cudarc::cublaslt::result::CublasError) -> Self {
        CudaError::Blas(format!("{:?}", err.0))
    }
}

/// Renders a compile failure as the log followed by the source with line numbers, matching the
/// `name(line): error` references NVRTC prints.
fn format_compile_error(name: &str, log: &str, source: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "NVRTC failed to compile `{name}`:");
    let _ = writeln!(out, "{}", log.trim_end());
    let _ = writeln!(out, "--- source ---");
    let width = source.lines().count().max(1).to_string().len();
    for (index, line) in source.lines().enumerate() {
        let _ = writeln!(out, "{:>width$} | {line}", index + 1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codegen_errors_stay_typed_and_keep_their_message() {
        let inner = CodegenError::NoSuchKernel { index: 3, count: 2 };
        let text = format!("code generation failed: {inner}");
        let err = CudaError::from(inner);
        assert!(matches!(err, CudaError::Codegen(CodegenError::NoSuchKernel { index: 3, count: 2 })), "{err:?}");
        assert_eq!(err.to_string(), text);
    }
}
