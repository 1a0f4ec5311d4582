use lucebox_gguf::GgmlType;

use crate::isa::Isa;

/// Why a [`WeightFormat`](crate::WeightFormat) cannot be built for a weight type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnsupportedType {
    /// No kernels exist for this storage type.
    #[error("weight type {ty} has no kernels")]
    NoKernels {
        /// The type asked for.
        ty: GgmlType,
    },
    /// The kernels asked for need instructions this CPU lacks.
    #[error("weight type {ty}: instruction set {isa} is not available on this cpu")]
    IsaUnavailable {
        /// The type asked for.
        ty: GgmlType,
        /// The instruction-set level asked for.
        isa: Isa,
    },
}
