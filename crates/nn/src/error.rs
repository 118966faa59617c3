//! The one error type of braze-nn.

/// What a layer, the model or a checkpoint can report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An op of a forward pass or an update failed.
    #[error(transparent)]
    Tensor(#[from] braze::Error),

    /// An argument a layer cannot take.
    #[error("{op}: {detail}")]
    InvalidArgument { op: String, detail: String },

    /// A tensor the model needs is not in the checkpoint.
    #[error("{path}: no tensor `{name}` (expected {expected})")]
    MissingTensor { path: String, name: String, expected: String },

    /// A checkpoint tensor of another shape or of a dtype braze does not have.
    #[error("{path}: tensor `{name}`: expected {expected}, got {actual}")]
    TensorMismatch { path: String, name: String, expected: String, actual: String },

    /// A checkpoint tensor the model has no parameter for.
    #[error("{path}: tensor `{name}` is not a parameter of the model")]
    UnexpectedTensor { path: String, name: String },

    /// A file that cannot be read, written or parsed as safetensors.
    #[error("{path}: {detail}")]
    File { path: String, detail: String },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn invalid(op: &str, detail: impl Into<String>) -> Error {
        Error::InvalidArgument { op: op.into(), detail: detail.into() }
    }
}

/// Layers are called inside compiled functions, whose closures return braze's errors.
impl From<Error> for braze::Error {
    fn from(e: Error) -> braze::Error {
        match e {
            Error::Tensor(e) => e,
            other => braze::Error::InvalidArgument { op: "braze-nn".into(), loc: None, detail: other.to_string() },
        }
    }
}
