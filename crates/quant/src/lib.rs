//! GGML block formats on the host: dequantization to `f32` and fast dot products.
//!
//! A matmul quantizes each activation row once, in the [`ActivationFormat`] its weights' format
//! asks for, then takes dot products of raw weight rows (GGUF block bytes) with it:
//! [`WeightFormat::dot`] for one activation row (decode), [`WeightFormat::dot_rows`] for several
//! (prefill). [`WeightFormat`] holds the kernels for one weight type, chosen once for an
//! instruction-set level ([`Isa`], detected at run time): AVX2 and AVX-512 kernels on x86-64,
//! portable Rust everywhere (also the reference the SIMD kernels are tested against).
//!
//! The SIMD kernels prefetch the 8 KiB that follow the weights they multiply: a matmul that
//! takes the rows of a matrix in order streams its weights from memory with the transfers
//! overlapping the arithmetic.
//!
//! Supported weight types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, IQ4_XS.
//!
//! ```
//! use lucebox_quant::{GgmlType, Isa, WeightFormat};
//!
//! let format = WeightFormat::new(GgmlType::F16, Isa::detect())?;
//! let weights: Vec<u8> = [1.0f32, 2.0, 3.0]
//!     .iter()
//!     .flat_map(|&w| half::f16::from_f32(w).to_le_bytes())
//!     .collect();
//! let x = [0.5f32, 0.25, 2.0];
//! let mut activation = vec![0; format.activation_format().row_bytes(x.len())];
//! format.quantize_activation(&x, &mut activation);
//! assert_eq!(format.dot(&weights, &activation), 7.0);
//! # Ok::<(), lucebox_quant::UnsupportedType>(())
//! ```
#![deny(missing_docs)]

mod activation;
mod bytes;
mod error;
mod float;
mod format;
mod iq4_xs;
mod isa;
mod kquants;
mod legacy;
#[cfg(target_arch = "x86_64")]
mod repacked;
#[cfg(target_arch = "x86_64")]
mod simd;

pub use activation::{ActivationFormat, ActivationPrecision};
pub use error::UnsupportedType;
pub use format::WeightFormat;
pub use isa::Isa;
pub use lucebox_gguf::GgmlType;
