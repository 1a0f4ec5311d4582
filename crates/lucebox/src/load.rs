//! Turning `--model` and `--draft` arguments into models on a backend.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use lucebox_appliance::{BackendKind, HostProfile};
use lucebox_backend::{Backend, CpuBackend};
use lucebox_gguf::GgufFile;
use lucebox_model::Model;

/// A model loaded from a `--model`-style argument, on the CPU unless said otherwise.
pub(crate) struct Loaded<B: Backend = CpuBackend> {
    /// The argument as given.
    pub label: String,
    /// The catalogue entry the argument named, or whose name the file carries.
    pub catalogue_name: Option<String>,
    pub path: PathBuf,
    pub file: Arc<GgufFile>,
    pub model: Arc<Model<B>>,
}

/// A model argument: a GGUF path, or the name of a catalogue model, fetched first when the
/// model directory does not hold it yet. Returns the path and the catalogue name, if any.
pub(crate) fn resolve_model(arg: &str) -> anyhow::Result<(PathBuf, Option<String>)> {
    let catalogue = lucebox_appliance::Catalogue::embedded()?;
    let path = PathBuf::from(arg);
    if path.is_file() {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let name = catalogue.model(stem).ok().map(|m| m.name().to_owned());
        return Ok((path, name));
    }
    let Ok(model) = catalogue.model(arg) else {
        bail!(
            "{arg}: no such file, and no catalogue model of that name (see `lucebox fetch --list`)"
        );
    };
    let cached = lucebox_appliance::model_path(&lucebox_appliance::model_dir()?, arg);
    let name = Some(model.name().to_owned());
    if lucebox_appliance::Presence::of(&cached, model.bytes())?
        == lucebox_appliance::Presence::Present
    {
        return Ok((cached, name));
    }
    Ok((crate::fetch::fetch_model(model)?, name))
}

/// Which compute backend a command runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Device {
    /// The CPU backend.
    #[default]
    Cpu,
    /// The first CUDA device (builds with the `cuda` feature).
    Cuda,
}

impl Device {
    /// The device a host profile's engine runs on (`[engine] backend`).
    pub(crate) fn of_profile(profile: &HostProfile) -> anyhow::Result<Device> {
        match profile.engine().backend {
            BackendKind::Cpu => Ok(Device::Cpu),
            BackendKind::Cuda => Ok(Device::Cuda),
            BackendKind::Hip => bail!(
                "hosts/{}.toml: [engine] backend = \"hip\", which this lucebox has no backend for",
                profile.chip().name()
            ),
        }
    }
}

/// The CUDA backend on the first device.
#[cfg(feature = "cuda")]
pub(crate) fn cuda_backend() -> anyhow::Result<Arc<lucebox_backend::CudaBackend>> {
    Ok(Arc::new(lucebox_backend::CudaBackend::new(0)?))
}

/// What a build without the CUDA backend says when asked for it.
#[cfg(not(feature = "cuda"))]
pub(crate) const NO_CUDA: &str = "the cuda device: this lucebox was built without the CUDA backend (cargo build --features cuda)";

/// The CPU backend with `threads` threads (all cores when `None`), shared by every model of a
/// command so that target and drafter do not compete with two thread pools.
pub(crate) fn cpu_backend(threads: Option<usize>) -> anyhow::Result<Arc<CpuBackend>> {
    Ok(Arc::new(CpuBackend::new(threads)?))
}

/// The model named by `arg`, on `backend`.
pub(crate) fn load_model<B: Backend>(arg: &str, backend: &Arc<B>) -> anyhow::Result<Loaded<B>> {
    let (path, catalogue_name) = resolve_model(arg)?;
    let file = Arc::new(GgufFile::open(&path).with_context(|| path.display().to_string())?);
    let model = Model::load(Arc::clone(backend), Arc::clone(&file))
        .with_context(|| path.display().to_string())?;
    Ok(Loaded {
        label: arg.to_owned(),
        catalogue_name,
        path,
        file,
        model: Arc::new(model),
    })
}
