/// An error building or running a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file is malformed or a metadata value is unusable.
    #[error(transparent)]
    Gguf(#[from] lucebox_gguf::Error),
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] lucebox_backend::Error),
    /// The file's `general.architecture` is not one this crate builds.
    #[error("architecture {0:?} is not supported (supported: llama, qwen2, qwen3)")]
    UnsupportedArchitecture(String),
    /// A tensor the architecture needs is absent.
    #[error("tensor {0} is missing")]
    MissingTensor(String),
    /// A tensor's shape contradicts the metadata.
    #[error("tensor {name} has dims {found:?}, expected {expected:?}")]
    TensorShape {
        /// The tensor.
        name: String,
        /// Its dims in ggml order.
        found: Vec<u64>,
        /// What the metadata implies.
        expected: Vec<u64>,
    },
}
