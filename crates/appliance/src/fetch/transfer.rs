//! Moving bytes: bounded, hashed copies into files, HTTP requests, and the `.part` file that
//! becomes the model only once verified.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use ureq::tls::{RootCerts, TlsConfig};

use super::error::{AttemptError, FetchError, SourceError};

const CHUNK_BYTES: usize = 1 << 20;

/// The client every request goes through: the platform's trusted roots (so a site's own CA, or a
/// proxy's, works as it does for other tools), bounded waits, no compression (model files do not
/// shrink and sizes are checked on the wire).
pub(crate) fn agent() -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .tls_config(
            TlsConfig::builder()
                .root_certs(RootCerts::PlatformVerifier)
                .build(),
        )
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .timeout_per_read(Some(Duration::from_secs(60)))
        .user_agent(concat!("lucebox/", env!("CARGO_PKG_VERSION")))
        .build();
    ureq::Agent::new_with_config(config)
}

/// GETs `url`; an error status is an error. A `Content-Length` other than `expected_bytes`
/// fails before any body is read.
pub(crate) fn get(
    agent: &ureq::Agent,
    url: &str,
    accept: Option<&str>,
    expected_bytes: Option<u64>,
) -> Result<ureq::Body, SourceError> {
    let mut request = agent.get(url);
    if let Some(accept) = accept {
        request = request.header("Accept", accept);
    }
    let response = request.call().map_err(|source| SourceError::Http {
        url: url.to_owned(),
        source,
    })?;
    let body = response.into_body();
    if let (Some(expected), Some(announced)) = (expected_bytes, body.content_length())
        && announced != expected
    {
        return Err(SourceError::LengthMismatch {
            what: url.to_owned(),
            expected,
            got: announced,
        });
    }
    Ok(body)
}

/// A file being written that hashes and counts what it is given and refuses more than its
/// expected size, so a source can never make it grow past what the catalogue or index promised.
pub(crate) struct HashingFile {
    file: File,
    path: PathBuf,
    model: String,
    what: String,
    hasher: Sha256,
    written: u64,
    expected_bytes: u64,
}

impl HashingFile {
    /// Wraps `file` (at `path`, written for `model`); `what` names the content in errors.
    pub(crate) fn new(
        file: File,
        path: &Path,
        model: &str,
        what: &str,
        expected_bytes: u64,
    ) -> Self {
        Self {
            file,
            path: path.to_owned(),
            model: model.to_owned(),
            what: what.to_owned(),
            hasher: Sha256::new(),
            written: 0,
            expected_bytes,
        }
    }

    /// The size the content must come to.
    pub(crate) fn expected_bytes(&self) -> u64 {
        self.expected_bytes
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), AttemptError> {
        let len = bytes.len() as u64;
        if len > self.expected_bytes - self.written {
            return Err(SourceError::TooLong {
                what: self.what.clone(),
                limit: self.expected_bytes,
            }
            .into());
        }
        self.file
            .write_all(bytes)
            .map_err(|source| self.local_error("writing", source))?;
        self.hasher.update(bytes);
        self.written += len;
        Ok(())
    }

    /// Checks that everything came and that it hashes to `expected_sha256`.
    pub(crate) fn verify(&self, expected_sha256: &str) -> Result<(), SourceError> {
        if self.written != self.expected_bytes {
            return Err(SourceError::LengthMismatch {
                what: self.what.clone(),
                expected: self.expected_bytes,
                got: self.written,
            });
        }
        let got = hex(&self.hasher.clone().finalize());
        if !got.eq_ignore_ascii_case(expected_sha256) {
            return Err(SourceError::HashMismatch {
                what: self.what.clone(),
                expected: expected_sha256.to_owned(),
                got,
            });
        }
        Ok(())
    }

    /// The file, flushed to disk and positioned at its start, to read back what was written.
    pub(crate) fn into_rewound(mut self) -> Result<File, FetchError> {
        use std::io::Seek;
        self.file
            .flush()
            .and_then(|()| self.file.rewind())
            .map_err(|source| self.local_error("rewinding", source))?;
        Ok(self.file)
    }

    fn local_error(&self, action: &'static str, source: io::Error) -> FetchError {
        FetchError::Io {
            model: self.model.clone(),
            action,
            path: self.path.clone(),
            source,
        }
    }
}

/// Copies `reader` (named `what` in errors) into `sink` in chunks, reporting each chunk's size.
pub(crate) fn copy(
    reader: &mut dyn Read,
    what: &str,
    sink: &mut HashingFile,
    on_bytes: &mut dyn FnMut(u64),
) -> Result<(), AttemptError> {
    let mut buffer = vec![0u8; CHUNK_BYTES];
    loop {
        let n = match reader.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(SourceError::Read {
                    what: what.to_owned(),
                    source,
                }
                .into());
            }
        };
        sink.write(&buffer[..n])?;
        on_bytes(n as u64);
    }
}

/// The `.part` file a model is assembled in. It takes the model's name only through
/// [`PartFile::persist`]; dropped before that, it removes itself, so no partial or unverified
/// data is ever left behind.
pub(crate) struct PartFile {
    sink: HashingFile,
    persisted: bool,
}

impl PartFile {
    /// Creates (or truncates) `path` for `model`, which must come to `bytes` bytes.
    pub(crate) fn create(path: &Path, model: &str, bytes: u64) -> Result<Self, FetchError> {
        let file = File::create(path).map_err(|source| FetchError::Io {
            model: model.to_owned(),
            action: "creating",
            path: path.to_owned(),
            source,
        })?;
        let what = path
            .file_name()
            .map_or_else(|| model.to_owned(), |n| n.to_string_lossy().into_owned());
        Ok(Self {
            sink: HashingFile::new(file, path, model, &what, bytes),
            persisted: false,
        })
    }

    /// The writer of the file's content.
    pub(crate) fn sink(&mut self) -> &mut HashingFile {
        &mut self.sink
    }

    /// Syncs the file, renames it to `final_path` and syncs the directory, so that after a crash
    /// the final name holds either nothing or the whole verified file.
    pub(crate) fn persist(mut self, final_path: &Path) -> Result<(), FetchError> {
        let sink = &self.sink;
        sink.file
            .sync_all()
            .map_err(|source| sink.local_error("syncing", source))?;
        fs::rename(&sink.path, final_path)
            .map_err(|source| sink.local_error("renaming", source))?;
        self.persisted = true;
        let dir = final_path
            .parent()
            .filter(|dir| !dir.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| FetchError::Io {
                model: self.sink.model.clone(),
                action: "syncing directory",
                path: dir.to_owned(),
                source,
            })
    }
}

impl Drop for PartFile {
    fn drop(&mut self) {
        if !self.persisted {
            // Best effort: the failure that brought us here is the one worth reporting.
            let _ = fs::remove_file(&self.sink.path);
        }
    }
}

/// The sha256 of the file at `path`, as lowercase hex.
pub fn sha256_file(path: &Path) -> io::Result<String> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; CHUNK_BYTES];
    loop {
        match file.read(&mut buffer) {
            Ok(0) => return Ok(hex(&hasher.finalize())),
            Ok(n) => hasher.update(&buffer[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
