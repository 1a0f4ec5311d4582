//! Tokenizers read from GGUF metadata, a streaming detokenizer, and chat templates.
//!
//! [`Tokenizer::from_gguf`] builds the tokenizer a model file describes in its
//! `tokenizer.ggml.*` keys: byte-level BPE (Qwen2, Llama 3, SmolLM, GPT-2 pre-tokenizers) or
//! SentencePiece. [`Tokenizer::encode`] matches Hugging Face's tokenizer for the same
//! vocabulary; [`StreamDecoder`] turns generated ids into text without ever splitting a UTF-8
//! character; [`ChatTemplate`] renders the file's own chat template as `apply_chat_template`
//! does, under fuel and output limits. [`Tokenizer::digest`] identifies a vocabulary, so that a
//! drafter model can be checked against its target.
//!
//! ```no_run
//! use lucebox_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
//!
//! let file = lucebox_gguf::GgufFile::open("model.gguf")?;
//! let tokenizer = Tokenizer::from_gguf(file.metadata())?;
//! let template = ChatTemplate::from_gguf(file.metadata())?.expect("the file has a template");
//! let prompt = template.render(&[ChatMessage::new("user", "Hello!")], true)?;
//! let mut ids = Vec::new();
//! if tokenizer.add_bos() {
//!     ids.extend(tokenizer.bos());
//! }
//! ids.extend(tokenizer.encode(&prompt, true));
//!
//! let mut stream = tokenizer.stream_decoder(true);
//! for id in [9707, 0] {
//!     if tokenizer.is_end_of_generation(id) {
//!         break;
//!     }
//!     if let Some(text) = stream.push(id) {
//!         print!("{text}");
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod bpe;
mod chat;
mod error;
mod pretokenize;
mod special;
mod spm;
mod stream;
mod tokenizer;
mod unicode;
mod vocab;

pub use chat::{ChatMessage, ChatTemplate, TemplateLimits};
pub use error::{Error, ErrorKind};
pub use stream::StreamDecoder;
pub use tokenizer::Tokenizer;
pub use vocab::TokenKind;
