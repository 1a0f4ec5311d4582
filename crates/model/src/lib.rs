//! Model graphs: the `llama`, `qwen2` and `qwen3` architectures as sequences of
//! [`Backend`](lucebox_backend::Backend) operations over a ragged batch.
//!
//! [`ModelConfig::from_gguf`] reads every hyperparameter from the file's metadata (no shape is
//! hard-coded); [`Model::load`] binds each tensor after checking its shape; [`Model::forward`]
//! runs one batch of tokens from any number of sequences, each with its own positions and KV
//! blocks. The KV cache and the activation [`Workspace`] belong to the caller.
//!
//! ```no_run
//! use std::sync::Arc;
//! use lucebox_backend::{BatchCapacity, CpuBackend, Backend, RaggedBatch, TokenRole};
//! use lucebox_model::Model;
//!
//! let file = Arc::new(lucebox_gguf::GgufFile::open("model.gguf")?);
//! let model = Model::load(Arc::new(CpuBackend::new(None)?), file)?;
//! let layout = model.kv_layout(64, 16);
//! let mut kv = model.backend().kv_cache(layout)?;
//! let mut ws = model.workspace(BatchCapacity { tokens: 8, sequences: 1, blocks: 64, logits: 1 })?;
//! let mut batch = RaggedBatch::new();
//! let seq = batch.push_sequence(&[0]);
//! batch.push_token(seq, 42, 0, TokenRole::Prompt, true);
//! model.forward(&batch, &mut kv, &layout, &mut ws)?;
//! let mut next = [0u32; 1];
//! model.backend().argmax_rows(ws.logits(), &mut next)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod config;
mod error;
mod model;

pub use config::{Architecture, ModelConfig};
pub use error::Error;
pub use model::{Model, Workspace};
