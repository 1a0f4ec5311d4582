//! Compute backends: the device-side half of Lucebox.
//!
//! The [`Backend`] trait is the one interface between the device-agnostic layers (model graph,
//! engine) and a device. It owns memory (weights, activations, KV cache) and runs the operations
//! of a forward pass over a [`RaggedBatch`], the single input shape shared by prefill, decode and
//! speculative verification. [`CpuBackend`] implements it on the host with SIMD kernels chosen at
//! run time; [`CudaBackend`] (feature `cuda`) implements it on an NVIDIA GPU with the kernels of
//! `kernels/cuda/`, and a HIP backend will implement the same trait.
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

pub use backend::{
    AttentionShape, Backend, BatchCapacity, KvLayout, PassShape, Rope, RopeStyle, argmax,
};
pub use batch::RaggedBatch;
pub use cpu::{CpuActivations, CpuBackend, CpuBatch, CpuKvCache, CpuMatrix, CpuVector};
#[cfg(feature = "cuda")]
pub use cuda::{
    CudaActivations, CudaBackend, CudaBatch, CudaKvCache, CudaMatrix, CudaRecordings, CudaVector,
};
pub use error::Error;
