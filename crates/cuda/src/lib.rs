pub mod error;
pub mod nvrtc;
pub use error::{CudaError, Result};
