/// An error reading or validating a GGUF file.
///
/// Every error names what was wrong and where: the field being read and the byte offset in the
/// file at which that field starts. The message is complete in itself (it includes the kind), so
/// the kind is not also reported as a source, which would print it twice in an error chain.
#[derive(Debug, thiserror::Error)]
#[error("gguf: {field} at byte {offset}: {kind}")]
pub struct Error {
    kind: ErrorKind,
    field: String,
    offset: u64,
}

/// What went wrong. New kinds may be added in later versions.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Opening or mapping the file failed.
    #[error("{0}")]
    Io(std::io::Error),
    /// The file does not start with the `GGUF` magic.
    #[error("not a GGUF file (magic {0:02x?})")]
    BadMagic([u8; 4]),
    /// The version is not one this reader understands (2 and 3 are).
    #[error("unsupported GGUF version {0} (2 and 3 are supported)")]
    UnsupportedVersion(u32),
    /// The file ends before the field is complete.
    #[error("file truncated: {needed} bytes needed, {left} left")]
    Truncated {
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the file at that point.
        left: u64,
    },
    /// A count or length is larger than the rest of the file could hold, or than a fixed cap.
    #[error("value {value} is too large (at most {limit})")]
    TooLarge {
        /// The value read from the file.
        value: u64,
        /// The largest value that was acceptable there.
        limit: u64,
    },
    /// A computation on sizes read from the file overflowed 64 bits.
    #[error("size computation overflows")]
    Overflow,
    /// A string is not valid UTF-8.
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    /// A metadata value type id is unknown.
    #[error("unknown metadata value type {0}")]
    UnknownValueType(u32),
    /// A tensor's ggml type id is unknown.
    #[error("unknown tensor type {0}")]
    UnknownTensorType(u32),
    /// The same metadata key or tensor name appears twice.
    #[error("appears more than once")]
    Duplicate,
    /// A value has the wrong type for its key.
    #[error("expected {expected}, found {found}")]
    WrongType {
        /// The type the key requires.
        expected: &'static str,
        /// The type found in the file.
        found: &'static str,
    },
    /// A metadata key that a consumer requires is absent.
    #[error("required key is missing")]
    Missing,
    /// A value is outside the range its field allows.
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, field: impl Into<String>, offset: u64) -> Self {
        Self {
            kind,
            field: field.into(),
            offset,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, offset: u64, why: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid(why.into()), field, offset)
    }

    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// The field being read: a metadata key, a tensor name with its part, or a header field.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The byte offset in the file at which the offending field starts.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}
