//! Compute backends: the device-side half of Lucebox.
//!
//! The [`Backend`] trait is the one interface between the device-agnostic layers (model graph,
//! engine) and a device. It owns memory (weights, activations, KV cache) and runs the operations
//! of a forward pass over a [`RaggedBatch`], the single input shape shared by prefill, decode and
//! speculative verification. [`CpuBackend`] implements it on the host with SIMD kernels chosen at
//! run time. [`GpuBackend`] implements it on a GPU with the kernels of `kernels/cuda/`, over a
//! [`Runtime`]: [`CudaBackend`] (feature `cuda`) on NVIDIA GPUs, [`HipBackend`] (feature `hip`)
//! on AMD RDNA GPUs, from the same kernel sources.
//!
//! ```no_run
//! use lucebox_backend::{Backend, CpuBackend};
//! let cpu = CpuBackend::new(None)?;
//! println!("{}", cpu.describe());
//! # Ok::<(), lucebox_backend::Error>(())
//! ```
#![deny(missing_docs)]

mod backend;
mod batch;
mod checks;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod error;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod gpu;
#[cfg(feature = "hip")]
mod hip;
mod tuning;

pub use backend::{
    ActivationUse, AttentionShape, Backend, BatchCapacity, KvLayout, PassShape, Projection, Rope,
    RopeStyle, RowSampling, Rows, argmax,
};
pub use batch::{RaggedBatch, TokenRole};
pub use cpu::{CpuActivations, CpuBackend, CpuBatch, CpuKvCache, CpuMatrix, CpuVector};
#[cfg(feature = "cuda")]
pub use cuda::{Cuda, CudaBackend};
pub use error::Error;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub use gpu::{
    Buffer, GpuActivations, GpuBackend, GpuBatch, GpuKvCache, GpuMatrix, GpuRecordings, GpuVector,
    KernelArg, QuantizedOut, Runtime,
};
#[cfg(feature = "hip")]
pub use hip::{Hip, HipBackend};
pub use lucebox_quant::ActivationPrecision;
pub use tuning::GpuTuning;
