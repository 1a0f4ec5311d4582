//! GGUF model files: a validating, zero-copy reader and a small writer.
//!
//! [`GgufFile::open`] maps a file, checks every count, length, offset and size read from it
//! against what the file can hold (with checked arithmetic), and gives typed access to its
//! [`Metadata`] and to each tensor as a [`TensorView`] borrowed from the map. A malformed file
//! yields an [`Error`] that names the field and the byte offset at which it starts.
//!
//! ```no_run
//! let file = lucebox_gguf::GgufFile::open("model.gguf")?;
//! let arch = file.metadata().str("general.architecture")?;
//! let embedding = file.tensor("token_embd.weight").expect("has embeddings");
//! println!("{arch}: {:?} {}", embedding.dims(), embedding.ggml_type());
//! # Ok::<(), lucebox_gguf::Error>(())
//! ```
#![deny(missing_docs)]

mod cursor;
mod error;
mod file;
mod ggml_type;
mod known_keys;
mod metadata;
mod value;
mod writer;

pub use cursor::{MAX_ARRAY_DEPTH, MAX_ARRAY_LEN, MAX_STRING_BYTES};
pub use error::{Error, ErrorKind};
pub use file::{
    DEFAULT_ALIGNMENT, GgufFile, MAX_ALIGNMENT, MAX_DIMS, MAX_TENSOR_NAME_BYTES, TensorInfo,
    TensorView,
};
pub use ggml_type::GgmlType;
pub use known_keys::MAX_BLOCK_COUNT;
pub use metadata::Metadata;
pub use value::{Array, Value, ValueType};
pub use writer::GgufWriter;
