//! Host profiles: `hosts/<chip>.toml`, one per chip Lucebox is packaged for.
//!
//! A profile names the chip and its runtime, the serving defaults tuned for it, and the
//! model-drafter pairs served on it. The Nix flake reads the same files with `builtins.fromTOML`,
//! so the schema (documented at the top of `hosts/cpu.toml`) stays plain data and every rule
//! that both sides rely on is checked here, against the catalogue, when a profile is parsed.

use std::collections::HashSet;

use serde::{Deserialize, Deserializer};
use thiserror::Error;

use crate::catalogue::{TomlError, check_name, parse_toml};
use crate::{Catalogue, CatalogueError};

/// The repository's profiles, embedded so that the binary ships exactly what Nix reads. A test
/// checks that this list names every `hosts/*.toml` but the catalogue.
const EMBEDDED: [(&str, &str); 6] = [
    ("cpu", include_str!("../../../hosts/cpu.toml")),
    ("r9700", include_str!("../../../hosts/r9700.toml")),
    ("strix-halo", include_str!("../../../hosts/strix-halo.toml")),
    ("rx7900", include_str!("../../../hosts/rx7900.toml")),
    ("rtx3090", include_str!("../../../hosts/rtx3090.toml")),
    ("rtx5090", include_str!("../../../hosts/rtx5090.toml")),
];

/// The profile `lucebox serve` uses when none is named: the only engine that runs anywhere.
pub const DEFAULT_CHIP: &str = "cpu";

/// One chip's profile.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostProfile {
    chip: Chip,
    engine: EngineDefaults,
    kernels: Option<KernelTuning>,
    pairs: Vec<Pair>,
}

/// What a package is built for.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chip {
    name: String,
    description: String,
    vendor: Vendor,
    runtime: Runtime,
    runtime_version: Option<String>,
    kernel_target: Option<String>,
    memory_gib: Option<u64>,
}

/// Whose hardware the chip is; it decides the device nodes the service may open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    /// No accelerator: the CPU engine.
    Any,
    /// An NVIDIA GPU.
    Nvidia,
    /// An AMD GPU.
    Amd,
}

/// The GPU runtime the kernels are built against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// None: CPU only.
    None,
    /// NVIDIA CUDA.
    Cuda,
    /// AMD ROCm (HIP).
    Rocm,
}

/// The compute backend a package's engine runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The CPU engine.
    Cpu,
    /// The CUDA engine.
    Cuda,
    /// The HIP engine.
    Hip,
}

impl BackendKind {
    /// Its name in profiles: `cpu`, `cuda` or `hip`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Hip => "hip",
        }
    }
}

/// The serving defaults on a chip; `lucebox serve` flags of the same names override them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineDefaults {
    /// The engine the package runs.
    pub backend: BackendKind,
    /// Positions of context per sequence.
    pub context: usize,
    /// Sequences generating at once.
    pub max_sequences: usize,
    /// Tokens per forward pass.
    pub step_tokens: usize,
    /// Memory for the KV cache, in MiB: the target's pool and a drafter model's, which
    /// hold as many positions each.
    pub kv_cache_mib: u64,
    /// The longest draft per speculative round.
    pub draft_tokens: usize,
}

/// How a GPU engine launches its kernels on the chip (`[kernels]`, present exactly when the
/// engine is a GPU one); the backend checks the values' ranges when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelTuning {
    /// Weight rows per block of the matrix-vector kernels, one warp (wave) each.
    pub matvec_warps: u32,
    /// Parts of attention per token and query head, a warp (wave) each; a batch of short
    /// sequences runs fewer warps per block, each taking several parts.
    pub attention_warps: u32,
    /// Up to this many activation rows, a matvec runs its one-row kernel once per row.
    pub matvec_loop_rows: u32,
    /// The most query heads of one KV head that a block of a batch's attention takes together;
    /// absent where the backend's default serves.
    #[serde(default)]
    pub attention_group: Option<u32>,
    /// From this many activation rows, a quantized matmul runs on the tensor cores; absent on
    /// chips without a tensor-core kernel (HIP), where the backend's default goes unused.
    #[serde(default)]
    pub mmq_rows: Option<u32>,
    /// Every pass of a Q4_K or Q6_K matrix runs through the streamed tensor-core matmul; absent
    /// (off) on chips without it (HIP).
    #[serde(default)]
    pub streamed_matmul: Option<bool>,
    /// Prompt tokens' rows of the layers' matmuls run through an f16 GEMM, each matrix
    /// dequantized just before it; absent (off) on chips without it (HIP).
    #[serde(default)]
    pub prompt_gemm: Option<bool>,
    /// Prompt tokens' rows of attention run on f16 tensor-core tiles; absent (off) on chips
    /// without them (HIP).
    #[serde(default)]
    pub prompt_attention: Option<bool>,
    /// The shortest prompt whose rows take the two prompt kernels above; absent on chips
    /// without them (HIP), where the backend's default goes unused.
    #[serde(default)]
    pub prompt_rows_from: Option<u32>,
}

/// A target model and what drafts for it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pair {
    name: String,
    target: String,
    drafter: PairDrafter,
    #[serde(default)]
    default: bool,
    verified: Verification,
}

/// What proposes draft tokens in a pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PairDrafter {
    /// A catalogue model.
    Model(String),
    /// Prompt lookup, no drafter model (`"ngram"` in the file).
    Ngram,
}

/// Whether a pair's acceptance was measured, and where.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase", deny_unknown_fields)]
pub enum Verification {
    /// Measured: the fraction of drafted tokens accepted, and on what and how.
    Measured {
        /// Accepted / drafted, in (0, 1].
        acceptance: f64,
        /// The machine, the command and the date.
        measured_on: String,
    },
    /// Never measured; served, but its speed on this chip is not known.
    Unmeasured,
}

/// Errors reading a profile or looking one up.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum HostError {
    /// The text is not TOML of the profile's shape.
    #[error(transparent)]
    Parse(#[from] TomlError),
    /// The profile parsed but breaks a rule.
    #[error("{origin}: {field}: {why}")]
    Invalid {
        /// Where the text came from.
        origin: String,
        /// The offending field (`chip.kernel_target`, `pairs[1].drafter`, ...).
        field: String,
        /// What is wrong with it.
        why: String,
    },
    /// No profile has this name.
    #[error("unknown chip {name:?}; the profiles are: {}", known.join(", "))]
    UnknownChip {
        /// The name asked for.
        name: String,
        /// Every profile's name.
        known: Vec<String>,
    },
    /// The profile has no pair of this name.
    #[error("chip {chip} has no pair {name:?}; its pairs are: {}", known.join(", "))]
    UnknownPair {
        /// The profile.
        chip: String,
        /// The name asked for.
        name: String,
        /// The profile's pair names.
        known: Vec<String>,
    },
    /// The catalogue itself is broken.
    #[error(transparent)]
    Catalogue(#[from] CatalogueError),
}

impl HostProfile {
    /// The profile of `chip` built into this program.
    pub fn embedded(chip: &str) -> Result<Self, HostError> {
        let Some((_, text)) = EMBEDDED.iter().find(|(name, _)| *name == chip) else {
            return Err(HostError::UnknownChip {
                name: chip.to_owned(),
                known: Self::embedded_names().map(str::to_owned).collect(),
            });
        };
        Self::parse(text, chip, &Catalogue::embedded()?)
    }

    /// Every profile built into this program.
    pub fn embedded_all() -> Result<Vec<Self>, HostError> {
        Self::embedded_names().map(Self::embedded).collect()
    }

    /// The names of the profiles built into this program.
    pub fn embedded_names() -> impl Iterator<Item = &'static str> {
        EMBEDDED.iter().map(|(name, _)| *name)
    }

    /// Parses and validates `hosts/<stem>.toml` against `catalogue`.
    pub fn parse(text: &str, stem: &str, catalogue: &Catalogue) -> Result<Self, HostError> {
        let origin = format!("hosts/{stem}.toml");
        let profile: HostProfile = parse_toml(text, &origin)?;
        profile
            .validate(stem, catalogue)
            .map_err(|(field, why)| HostError::Invalid { origin, field, why })?;
        Ok(profile)
    }

    /// The chip.
    pub fn chip(&self) -> &Chip {
        &self.chip
    }

    /// The serving defaults.
    pub fn engine(&self) -> &EngineDefaults {
        &self.engine
    }

    /// The kernels' launch shapes, for a GPU engine.
    pub fn kernels(&self) -> Option<&KernelTuning> {
        self.kernels.as_ref()
    }

    /// The pairs, in file order.
    pub fn pairs(&self) -> &[Pair] {
        &self.pairs
    }

    /// The pair served when none is named.
    pub fn default_pair(&self) -> &Pair {
        // `validate` checked that exactly one pair is the default.
        self.pairs
            .iter()
            .find(|p| p.default)
            .unwrap_or(&self.pairs[0])
    }

    /// The pair called `name`.
    pub fn pair(&self, name: &str) -> Result<&Pair, HostError> {
        self.pairs
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| HostError::UnknownPair {
                chip: self.chip.name.clone(),
                name: name.to_owned(),
                known: self.pairs.iter().map(|p| p.name.clone()).collect(),
            })
    }

    /// Whether the package runs the CPU engine in place of the chip's own backend, which does
    /// not exist yet; packages and `lucebox doctor` say so.
    pub fn is_cpu_stand_in(&self) -> bool {
        self.engine.backend == BackendKind::Cpu && self.chip.vendor != Vendor::Any
    }

    fn validate(&self, stem: &str, catalogue: &Catalogue) -> Result<(), (String, String)> {
        let fail = |field: &str, why: String| Err((field.to_owned(), why));
        let chip = &self.chip;
        if chip.name != stem {
            return fail(
                "chip.name",
                format!("{:?} must equal the file's name {stem:?}", chip.name),
            );
        }
        if let Err(why) = check_name(&chip.name) {
            return fail("chip.name", why);
        }
        if chip.description.trim().is_empty() {
            return fail("chip.description", "is empty".into());
        }
        let (runtime, backend) = match chip.vendor {
            Vendor::Any => (Runtime::None, BackendKind::Cpu),
            Vendor::Nvidia => (Runtime::Cuda, BackendKind::Cuda),
            Vendor::Amd => (Runtime::Rocm, BackendKind::Hip),
        };
        if chip.runtime != runtime {
            return fail(
                "chip.runtime",
                format!("a {:?} chip needs runtime {runtime:?}", chip.vendor),
            );
        }
        let gpu = chip.vendor != Vendor::Any;
        for (field, present) in [
            ("chip.runtime_version", chip.runtime_version.is_some()),
            ("chip.kernel_target", chip.kernel_target.is_some()),
            ("chip.memory_gib", chip.memory_gib.is_some()),
        ] {
            if present != gpu {
                let why = if gpu {
                    "is required for a GPU chip"
                } else {
                    "applies only to GPU chips"
                };
                return fail(field, why.into());
            }
        }
        if let Some(version) = &chip.runtime_version {
            let numeric = version
                .split('.')
                .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()));
            if !numeric {
                return fail(
                    "chip.runtime_version",
                    format!("{version:?} is not a version like 12 or 7.2"),
                );
            }
        }
        if let Some(target) = &chip.kernel_target {
            let (prefix, example) = match chip.runtime {
                Runtime::Cuda => ("sm_", "sm_86"),
                _ => ("gfx", "gfx1201"),
            };
            let digits = target.strip_prefix(prefix).unwrap_or_default();
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return fail(
                    "chip.kernel_target",
                    format!("{target:?} is not an architecture like {example}"),
                );
            }
        }
        if self.engine.backend != BackendKind::Cpu && self.engine.backend != backend {
            return fail(
                "engine.backend",
                format!(
                    "a {:?} chip runs {backend:?} or the CPU stand-in",
                    chip.vendor
                ),
            );
        }
        let gpu_engine = self.engine.backend != BackendKind::Cpu;
        if self.kernels.is_some() != gpu_engine {
            let why = if gpu_engine {
                "is required for a GPU engine"
            } else {
                "applies only to GPU engines"
            };
            return fail("kernels", why.into());
        }
        self.validate_engine()
            .or_else(|(field, why)| fail(&format!("engine.{field}"), why))?;
        self.validate_pairs(catalogue)
    }

    fn validate_engine(&self) -> Result<(), (&'static str, String)> {
        let engine = &self.engine;
        for (field, value) in [
            ("context", engine.context),
            ("max_sequences", engine.max_sequences),
            ("step_tokens", engine.step_tokens),
            ("draft_tokens", engine.draft_tokens),
        ] {
            if value == 0 {
                return Err((field, "must be at least 1".into()));
            }
        }
        if engine.kv_cache_mib == 0 {
            return Err(("kv_cache_mib", "must be at least 1".into()));
        }
        let step_needs = engine.max_sequences.max(engine.draft_tokens + 1);
        if engine.step_tokens < step_needs {
            return Err((
                "step_tokens",
                format!(
                    "{} cannot hold a token of each of max_sequences {} and a verify pass of \
                     draft_tokens {} + 1",
                    engine.step_tokens, engine.max_sequences, engine.draft_tokens
                ),
            ));
        }
        Ok(())
    }

    fn validate_pairs(&self, catalogue: &Catalogue) -> Result<(), (String, String)> {
        if self.pairs.is_empty() {
            return Err(("pairs".into(), "the profile needs at least one pair".into()));
        }
        let defaults = self.pairs.iter().filter(|p| p.default).count();
        if defaults != 1 {
            return Err((
                "pairs".into(),
                format!("exactly one pair must have default = true, found {defaults}"),
            ));
        }
        let mut names = HashSet::new();
        for (index, pair) in self.pairs.iter().enumerate() {
            let at = |field: &str| format!("pairs[{index}].{field}");
            let name_ok =
                pair.name
                    .bytes()
                    .next()
                    .is_some_and(|b| b.is_ascii_alphanumeric())
                    && pair.name.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"._+-".contains(&b)
                    });
            if !name_ok {
                return Err((
                    at("name"),
                    format!(
                        "{:?} must be lowercase a-z, 0-9, `.`, `_`, `+`, `-`",
                        pair.name
                    ),
                ));
            }
            if !names.insert(&pair.name) {
                return Err((at("name"), format!("{:?} is used twice", pair.name)));
            }
            let target = catalogue
                .model(&pair.target)
                .map_err(|e| (at("target"), e.to_string()))?;
            let mut weights = target.bytes();
            if let PairDrafter::Model(drafter) = &pair.drafter {
                let drafter = catalogue
                    .model(drafter)
                    .map_err(|e| (at("drafter"), e.to_string()))?;
                if drafter.bytes() >= target.bytes() {
                    return Err((
                        at("drafter"),
                        format!(
                            "{} is not smaller than its target {}: it cannot pay",
                            drafter.name(),
                            target.name()
                        ),
                    ));
                }
                weights += drafter.bytes();
            }
            if let Verification::Measured {
                acceptance,
                measured_on,
            } = &pair.verified
            {
                if !(*acceptance > 0.0 && *acceptance <= 1.0) {
                    return Err((
                        at("verified.acceptance"),
                        format!("{acceptance} is not in (0, 1]"),
                    ));
                }
                if measured_on.trim().is_empty() {
                    return Err((at("verified.measured_on"), "must say where and how".into()));
                }
            }
            if let Some(memory_gib) = self.chip.memory_gib {
                let needed = weights + (self.engine.kv_cache_mib << 20);
                if needed > memory_gib << 30 {
                    return Err((
                        at("target"),
                        format!(
                            "weights ({:.1} GiB) and engine.kv_cache_mib ({} MiB) exceed \
                             chip.memory_gib ({memory_gib} GiB)",
                            weights as f64 / f64::from(1 << 30),
                            self.engine.kv_cache_mib
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

impl Chip {
    /// The profile's name (`r9700`, `cpu`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One line for humans.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Whose hardware it is.
    pub fn vendor(&self) -> Vendor {
        self.vendor
    }

    /// The GPU runtime.
    pub fn runtime(&self) -> Runtime {
        self.runtime
    }

    /// The runtime's version (`12`, `7.2`), for GPU chips.
    pub fn runtime_version(&self) -> Option<&str> {
        self.runtime_version.as_deref()
    }

    /// The GPU architecture the kernels are compiled for (`sm_86`, `gfx1201`).
    pub fn kernel_target(&self) -> Option<&str> {
        self.kernel_target.as_deref()
    }

    /// Device memory the server may fill, in GiB, for GPU chips.
    pub fn memory_gib(&self) -> Option<u64> {
        self.memory_gib
    }
}

impl Pair {
    /// The pair's name, unique in its profile.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The target's catalogue name.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// What drafts.
    pub fn drafter(&self) -> &PairDrafter {
        &self.drafter
    }

    /// Whether this is the profile's default pair.
    pub fn is_default(&self) -> bool {
        self.default
    }

    /// Whether and where its acceptance was measured.
    pub fn verified(&self) -> &Verification {
        &self.verified
    }
}

impl PairDrafter {
    /// The drafter as `lucebox serve --draft` takes it: a catalogue name or `ngram`.
    pub fn as_draft_arg(&self) -> &str {
        match self {
            PairDrafter::Model(name) => name,
            PairDrafter::Ngram => "ngram",
        }
    }
}

impl<'de> Deserialize<'de> for PairDrafter {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Ok(match name.as_str() {
            "ngram" => PairDrafter::Ngram,
            _ => PairDrafter::Model(name),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHIP_GPU: &str = "[chip]\nname = \"t\"\ndescription = \"a test GPU\"\nvendor = \"nvidia\"\n\
        runtime = \"cuda\"\nruntime_version = \"12\"\nkernel_target = \"sm_86\"\nmemory_gib = 24\n";
    const ENGINE: &str = "[engine]\nbackend = \"cpu\"\ncontext = 4096\nmax_sequences = 16\n\
        step_tokens = 256\nkv_cache_mib = 1024\ndraft_tokens = 8\n";
    const KERNELS: &str = "[kernels]\nmatvec_warps = 2\nattention_warps = 8\nmatvec_loop_rows = 4\n\
         attention_group = 2\nmmq_rows = 3\n\
         streamed_matmul = true\nprompt_gemm = true\nprompt_attention = false\n\
         prompt_rows_from = 64\n";
    const PAIR: &str = "[[pairs]]\nname = \"p\"\ntarget = \"qwen2.5-coder-1.5b-instruct-q4_k_m\"\n\
        drafter = \"qwen2.5-coder-0.5b-instruct-q4_k_m\"\ndefault = true\n\
        verified = { status = \"unmeasured\" }\n";

    fn parse(text: &str) -> Result<HostProfile, HostError> {
        HostProfile::parse(text, "t", &Catalogue::embedded().unwrap())
    }

    fn error(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn every_embedded_profile_parses_and_names_its_default_pair() {
        for name in HostProfile::embedded_names() {
            let profile = HostProfile::embedded(name).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(profile.chip().name(), name);
            assert!(profile.default_pair().is_default());
        }
        let cpu = HostProfile::embedded(DEFAULT_CHIP).unwrap();
        assert!(!cpu.is_cpu_stand_in());
        assert_eq!(
            cpu.default_pair().drafter(),
            &PairDrafter::Model("qwen2.5-coder-0.5b-instruct-q4_k_m".into())
        );
    }

    #[test]
    fn the_embedded_list_is_every_profile_in_hosts() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../hosts");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .filter_map(|file| file.strip_suffix(".toml").map(str::to_owned))
            .filter(|stem| stem != "models")
            .collect();
        on_disk.sort();
        let mut embedded: Vec<&str> = HostProfile::embedded_names().collect();
        embedded.sort();
        assert_eq!(on_disk, embedded);
        for (name, text) in EMBEDDED {
            let path = format!("{dir}/{name}.toml");
            assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "{path}");
        }
    }

    #[test]
    fn a_valid_profile_parses() {
        let profile = parse(&format!("{CHIP_GPU}{ENGINE}{PAIR}")).unwrap();
        assert!(profile.is_cpu_stand_in());
        assert_eq!(
            profile.pair("p").unwrap().target(),
            profile.default_pair().target()
        );
        let unknown = profile.pair("q").unwrap_err().to_string();
        assert!(unknown.contains("its pairs are: p"), "{unknown}");
        assert_eq!(profile.kernels(), None);
        let engine = ENGINE.replace("\"cpu\"", "\"cuda\"");
        let cuda = parse(&format!("{CHIP_GPU}{engine}{KERNELS}{PAIR}")).unwrap();
        assert!(!cuda.is_cpu_stand_in());
        assert_eq!(
            cuda.kernels(),
            Some(&KernelTuning {
                matvec_warps: 2,
                attention_warps: 8,
                matvec_loop_rows: 4,
                attention_group: Some(2),
                mmq_rows: Some(3),
                streamed_matmul: Some(true),
                prompt_gemm: Some(true),
                prompt_attention: Some(false),
                prompt_rows_from: Some(64),
            })
        );
    }

    #[test]
    fn rules_are_enforced_with_the_field_named() {
        let cases = [
            (
                CHIP_GPU.replace("name = \"t\"", "name = \"u\""),
                ENGINE.to_owned(),
                PAIR.to_owned(),
                "chip.name: \"u\" must equal the file's name \"t\"",
            ),
            (
                CHIP_GPU.replace("runtime = \"cuda\"", "runtime = \"rocm\""),
                ENGINE.to_owned(),
                PAIR.to_owned(),
                "chip.runtime: a Nvidia chip needs runtime Cuda",
            ),
            (
                CHIP_GPU.replace("sm_86", "gfx1201"),
                ENGINE.to_owned(),
                PAIR.to_owned(),
                "chip.kernel_target: \"gfx1201\" is not an architecture like sm_86",
            ),
            (
                CHIP_GPU.replace("memory_gib = 24\n", ""),
                ENGINE.to_owned(),
                PAIR.to_owned(),
                "chip.memory_gib: is required for a GPU chip",
            ),
            (
                CHIP_GPU.to_owned(),
                ENGINE.replace("\"cpu\"", "\"hip\""),
                PAIR.to_owned(),
                "engine.backend: a Nvidia chip runs Cuda or the CPU stand-in",
            ),
            (
                CHIP_GPU.to_owned(),
                ENGINE.replace("\"cpu\"", "\"cuda\""),
                PAIR.to_owned(),
                "kernels: is required for a GPU engine",
            ),
            (
                CHIP_GPU.to_owned(),
                format!("{ENGINE}{KERNELS}"),
                PAIR.to_owned(),
                "kernels: applies only to GPU engines",
            ),
            (
                CHIP_GPU.to_owned(),
                ENGINE.replace("step_tokens = 256", "step_tokens = 8"),
                PAIR.to_owned(),
                "engine.step_tokens: 8 cannot hold",
            ),
            (
                CHIP_GPU.to_owned(),
                ENGINE.to_owned(),
                PAIR.replace("default = true\n", ""),
                "pairs: exactly one pair must have default = true, found 0",
            ),
            (
                CHIP_GPU.to_owned(),
                ENGINE.to_owned(),
                format!("{PAIR}{PAIR}").replacen("default = true\n", "", 1),
                "pairs[1].name: \"p\" is used twice",
            ),
            (
                CHIP_GPU.to_owned(),
                ENGINE.to_owned(),
                PAIR.replace("0.5b-instruct", "0.5x-instruct"),
                "pairs[0].drafter: unknown model \"qwen2.5-coder-0.5x-instruct-q4_k_m\"",
            ),
            (
                CHIP_GPU.to_owned(),
                ENGINE.to_owned(),
                PAIR.replace("1.5b", "1.6b")
                    .replace("0.5b", "1.5b")
                    .replace("1.6b", "0.5b"),
                "is not smaller than its target",
            ),
            (
                CHIP_GPU.replace("memory_gib = 24", "memory_gib = 1"),
                ENGINE.to_owned(),
                PAIR.to_owned(),
                "exceed chip.memory_gib (1 GiB)",
            ),
            (
                CHIP_GPU.to_owned(),
                ENGINE.to_owned(),
                PAIR.replace(
                    "{ status = \"unmeasured\" }",
                    "{ status = \"measured\", acceptance = 1.5, measured_on = \"here\" }",
                ),
                "pairs[0].verified.acceptance: 1.5 is not in (0, 1]",
            ),
            (
                CHIP_GPU.to_owned(),
                ENGINE.to_owned(),
                PAIR.replace("{ status = \"unmeasured\" }", "{ status = \"measured\" }"),
                "missing field `acceptance`",
            ),
        ];
        for (chip, engine, pair, expected) in cases {
            let message = error(&format!("{chip}{engine}{pair}"));
            assert!(message.contains(expected), "{message:?} lacks {expected:?}");
            assert!(message.starts_with("hosts/t.toml"), "{message}");
        }
    }

    #[test]
    fn a_cpu_profile_refuses_gpu_fields_and_typos_name_the_line() {
        let cpu =
            "[chip]\nname = \"t\"\ndescription = \"cpu\"\nvendor = \"any\"\nruntime = \"none\"\n";
        parse(&format!("{cpu}{ENGINE}{PAIR}")).unwrap();
        let with_target = error(&format!("{cpu}kernel_target = \"sm_86\"\n{ENGINE}{PAIR}"));
        assert!(
            with_target.contains("chip.kernel_target: applies only to GPU chips"),
            "{with_target}"
        );
        let typo = error(&format!(
            "{cpu}{}{PAIR}",
            ENGINE.replace("context", "contxt")
        ));
        assert!(
            typo.starts_with("hosts/t.toml:8:1: unknown field `contxt`"),
            "{typo}"
        );
    }
}
