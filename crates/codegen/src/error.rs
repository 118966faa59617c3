//! The one error type of code generation.

/// Why a kernel could not be turned into source. Every variant names the kernel, so a message
/// read in a log or a test failure says which one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodegenError {
    #[error("kernel {index} does not exist: the plan has {count} kernels")]
    NoSuchKernel { index: usize, count: usize },
    #[error("kernel `{kernel}` is a {family} kernel but was given a {config} config")]
    ConfigMismatch { kernel: String, family: &'static str, config: &'static str },
    #[error("kernel `{kernel}`: invalid launch config: {reason}")]
    InvalidConfig { kernel: String, reason: String },
    #[error("kernel `{kernel}` is malformed: {reason}")]
    MalformedKernel { kernel: String, reason: String },
    #[error("kernel `{kernel}`: {reason} is not supported")]
    Unsupported { kernel: String, reason: String },
    #[error("{configs} launch configs were given for a plan of {kernels} kernels")]
    ConfigCount { configs: usize, kernels: usize },
}

pub type Result<T, E = CodegenError> = std::result::Result<T, E>;

/// Shorthands for building errors that name a kernel.
pub(crate) fn malformed(kernel: &str, reason: impl Into<String>) -> CodegenError {
    CodegenError::MalformedKernel { kernel: kernel.to_string(), reason: reason.into() }
}

pub(crate) fn unsupported(kernel: &str, reason: impl Into<String>) -> CodegenError {
    CodegenError::Unsupported { kernel: kernel.to_string(), reason: reason.into() }
}

pub(crate) fn invalid_config(kernel: &str, reason: impl Into<String>) -> CodegenError {
    CodegenError::InvalidConfig { kernel: kernel.to_string(), reason: reason.into() }
}
