//! Where fetched models live, and what is there.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Neither `$LUCEBOX_MODEL_DIR`, `$XDG_CACHE_HOME` nor `$HOME` is set.
#[derive(Debug, Error)]
#[error("no model directory: set LUCEBOX_MODEL_DIR (or XDG_CACHE_HOME or HOME)")]
pub struct ModelDirError;

/// The directory holding fetched models: `$LUCEBOX_MODEL_DIR`, else
/// `$XDG_CACHE_HOME/lucebox/models`, else `$HOME/.cache/lucebox/models`. Empty variables count as
/// unset.
pub fn model_dir() -> Result<PathBuf, ModelDirError> {
    model_dir_from(|key| std::env::var_os(key)).ok_or(ModelDirError)
}

/// The cached file of the model `name` in `dir`: `<dir>/<name>.gguf`.
pub fn model_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.gguf"))
}

/// What the cache holds at a model's path, judged by size alone (hashing large files is slow).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// No file.
    Absent,
    /// A file of the expected size.
    Present,
    /// A file of another size.
    WrongSize {
        /// Its size.
        bytes: u64,
    },
}

impl Presence {
    /// Looks at `path`, expecting `bytes` bytes.
    pub fn of(path: &Path, bytes: u64) -> io::Result<Self> {
        match std::fs::metadata(path) {
            Ok(meta) if meta.len() == bytes => Ok(Self::Present),
            Ok(meta) => Ok(Self::WrongSize { bytes: meta.len() }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Self::Absent),
            Err(e) => Err(e),
        }
    }
}

fn model_dir_from(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let set = |key: &str| {
        var(key)
            .filter(|value| !value.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = set("LUCEBOX_MODEL_DIR") {
        return Some(dir);
    }
    let cache = set("XDG_CACHE_HOME").or_else(|| set("HOME").map(|home| home.join(".cache")))?;
    Some(cache.join("lucebox").join("models"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(vars: &[(&str, &str)]) -> Option<PathBuf> {
        model_dir_from(|key| {
            vars.iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| OsString::from(v))
        })
    }

    #[test]
    fn model_dir_prefers_the_explicit_variable_then_xdg_then_home() {
        let all = [
            ("LUCEBOX_MODEL_DIR", "/m"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(dir_with(&all), Some(PathBuf::from("/m")));
        assert_eq!(
            dir_with(&all[1..]),
            Some(PathBuf::from("/x/lucebox/models"))
        );
        assert_eq!(
            dir_with(&all[2..]),
            Some(PathBuf::from("/h/.cache/lucebox/models"))
        );
        assert_eq!(dir_with(&[]), None);
    }

    #[test]
    fn empty_variables_count_as_unset() {
        let vars = [
            ("LUCEBOX_MODEL_DIR", ""),
            ("XDG_CACHE_HOME", ""),
            ("HOME", "/h"),
        ];
        assert_eq!(
            dir_with(&vars),
            Some(PathBuf::from("/h/.cache/lucebox/models"))
        );
    }

    #[test]
    fn presence_compares_the_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = model_path(dir.path(), "m");
        assert_eq!(path, dir.path().join("m.gguf"));
        assert_eq!(Presence::of(&path, 3).unwrap(), Presence::Absent);
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(Presence::of(&path, 3).unwrap(), Presence::Present);
        assert_eq!(
            Presence::of(&path, 4).unwrap(),
            Presence::WrongSize { bytes: 3 }
        );
    }
}
