//! Turning a `--model` argument into a model on a backend.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use lucebox_backend::CpuBackend;
use lucebox_gguf::GgufFile;
use lucebox_model::Model;

/// A `--model` value: a GGUF path, or the name of a catalogue model, fetched first when the
/// model directory does not hold it yet.
pub(crate) fn resolve_model(arg: &str) -> anyhow::Result<PathBuf> {
    let path = PathBuf::from(arg);
    if path.is_file() {
        return Ok(path);
    }
    let catalogue = lucebox_appliance::Catalogue::embedded()?;
    let Ok(model) = catalogue.model(arg) else {
        bail!(
            "--model {arg}: no such file, and no catalogue model of that name (see `lucebox fetch --list`)"
        );
    };
    let cached = lucebox_appliance::model_path(&lucebox_appliance::model_dir()?, arg);
    if lucebox_appliance::Presence::of(&cached, model.bytes())?
        == lucebox_appliance::Presence::Present
    {
        return Ok(cached);
    }
    crate::fetch::fetch_model(model)
}

/// The open file and its model on the CPU backend.
pub(crate) fn load_cpu_model(
    arg: &str,
    threads: Option<usize>,
) -> anyhow::Result<(Arc<GgufFile>, Arc<Model<CpuBackend>>)> {
    let path = resolve_model(arg)?;
    let file =
        Arc::new(GgufFile::open(&path).with_context(|| format!("--model {}", path.display()))?);
    let backend = Arc::new(CpuBackend::new(threads)?);
    let model = Model::load(backend, Arc::clone(&file))
        .with_context(|| format!("--model {}", path.display()))?;
    Ok((file, Arc::new(model)))
}
