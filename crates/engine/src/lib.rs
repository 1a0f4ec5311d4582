//! The engine: everything between a model and a request that is not a kernel.
//!
//! [`BlockPool`] and [`SequenceBlocks`] manage the fixed-size blocks of a paged KV cache and
//! its prefix cache;
//! [`Sampler`] turns logits into tokens (greedy, temperature, top-k, top-p, min-p, penalties)
//! reproducibly from a seed; [`Session`] runs one sequence on one model: chunked prefill, then
//! decoding, without allocating in the loop; [`speculative`] runs a session with a drafter
//! and produces exactly what the session alone would, faster. [`Generator`] puts the two behind
//! one interface for callers that choose at run time. [`Batcher`] runs many sequences at once
//! (continuous batching over a shared, prefix-cached block pool), as a server does; each gets
//! exactly the output it would get alone.
//!
//! ```no_run
//! use std::sync::Arc;
//! use lucebox_backend::CpuBackend;
//! use lucebox_engine::{Sampler, SamplingParams, Session, SessionConfig};
//!
//! let file = Arc::new(lucebox_gguf::GgufFile::open("model.gguf")?);
//! let model = Arc::new(lucebox_model::Model::load(Arc::new(CpuBackend::new(None)?), file)?);
//! let mut session = Session::new(model, SessionConfig::default())?;
//! let mut sampler = Sampler::new(SamplingParams::default());
//! let stats = session.generate(&[1, 2, 3], &mut sampler, 16, |t| t == 2, |t| {
//!     println!("{t}");
//!     std::ops::ControlFlow::Continue(())
//! })?;
//! println!("{} tokens", stats.generated_tokens);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod batcher;
mod error;
mod forward_state;
mod generator;
mod kv;
mod logprobs;
mod rng;
mod sampling;
mod session;
pub mod speculative;

pub use batcher::{BatchConfig, BatchEngine, Batcher, Event, Load, NewSequence, SequenceId};
pub use error::Error;
pub use generator::Generator;
pub use kv::{BlockPool, DEFAULT_BLOCK_TOKENS, SequenceBlocks};
pub use logprobs::{MAX_TOP_LOGPROBS, TokenLogprobs};
pub use rng::Rng;
pub use sampling::{Distribution, MAX_PENALTY_WINDOW, Sampler, SamplingParams};
pub use session::{GenerationStats, Session, SessionConfig, StopReason};
