use lucebox_gguf::GgmlType;
use lucebox_quant::ActivationPrecision;

/// An error from a compute backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor's storage type has no kernels on this backend.
    #[error("tensor {tensor}: type {ty} is not supported by the {backend} backend")]
    UnsupportedType {
        /// The tensor's name.
        tensor: String,
        /// Its storage type.
        ty: GgmlType,
        /// The backend's name.
        backend: &'static str,
    },
    /// The backend has no kernels for activations of this precision.
    #[error("the {backend} backend has no kernels for {precision} activations")]
    UnsupportedPrecision {
        /// The backend's name.
        backend: &'static str,
        /// The precision asked for.
        precision: ActivationPrecision,
    },
    /// Shapes given to an operation do not fit together.
    #[error("{op}: {detail}")]
    Shape {
        /// The operation.
        op: &'static str,
        /// What does not fit, with the sizes.
        detail: String,
    },
    /// A batch description is inconsistent or exceeds the capacity it was prepared for.
    #[error("batch: {0}")]
    Batch(String),
    /// Memory for a buffer could not be had.
    #[error("cannot allocate {bytes} bytes for {what}")]
    OutOfMemory {
        /// What the memory was for.
        what: &'static str,
        /// How much was asked for.
        bytes: u64,
    },
    /// The device failed an operation.
    #[error("{backend}: {op}: {detail}")]
    Device {
        /// The backend's name.
        backend: &'static str,
        /// The operation.
        op: &'static str,
        /// What the device's driver said.
        detail: String,
    },
    /// A kernel launch shape (`[kernels]` of a host profile) is out of range.
    #[error("kernel tuning: {0}")]
    Tuning(String),
    /// The backend is not available on this machine or in this build.
    #[error("{backend} backend unavailable: {reason}")]
    Unavailable {
        /// The backend's name.
        backend: &'static str,
        /// Why, and what to do about it.
        reason: String,
    },
    /// An optional operation this backend does not do; callers ask first (such as
    /// [`Backend::samples_rows`](crate::Backend::samples_rows)).
    #[error("{op} is not done by this backend")]
    NotSupported {
        /// The operation.
        op: &'static str,
    },
}
