//! Test support shared by the crates' integration tests.
//!
//! Tests that need real models find them where `lucebox fetch` puts them, and tests that compare
//! against the independent Python references run the interpreter that the test runner prepared.
//! Both fail with a message that says how to provide what is missing: a test that needs a model
//! never passes silently without it.
#![deny(missing_docs)]

use std::path::PathBuf;
use std::process::Command;

/// The directory holding fetched models, by the rule `lucebox fetch` uses
/// ([`lucebox_appliance::model_dir`]).
///
/// # Panics
/// When none of the variables that rule reads is set.
pub fn model_dir() -> PathBuf {
    lucebox_appliance::model_dir().unwrap_or_else(|e| panic!("{e}"))
}

/// The path of the catalogue model `name`, which must have been fetched.
///
/// # Panics
/// When the file is absent, with the command that fetches it.
pub fn model(name: &str) -> PathBuf {
    let path = lucebox_appliance::model_path(&model_dir(), name);
    assert!(
        path.is_file(),
        "model {name} not found at {}: run `cargo run --release -p lucebox -- fetch {name}` \
         (or tests/run-all, which fetches every model the tests use)",
        path.display()
    );
    path
}

/// A command running the Python interpreter prepared for the reference tools:
/// `$LUCEBOX_PYTHON`, else `python3`.
pub fn python() -> Command {
    Command::new(std::env::var_os("LUCEBOX_PYTHON").unwrap_or_else(|| "python3".into()))
}

/// The repository's root directory.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}
