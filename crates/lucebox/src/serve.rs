//! `lucebox serve`: the OpenAI-compatible server on one model, or one target-drafter pair.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use lucebox_appliance::{DEFAULT_CHIP, HostProfile};
use lucebox_backend::{Backend, GpuTuning};
use lucebox_engine::speculative::{
    DraftPolicy, Drafter, DrafterConfig, ModelDrafter, NgramDrafter,
};
use lucebox_engine::{BatchConfig, Batcher, DEFAULT_BLOCK_TOKENS};
use lucebox_model::Model;
use lucebox_server::{Engine, Server, ServerConfig};
use lucebox_tokenizer::{ChatTemplate, Tokenizer};
use serde::Deserialize;
use serde_json::json;

use crate::generate::{draft_policy, load_drafter};
use crate::load::{Activations, Device, TuningArgs, load_model};

/// Flags of `lucebox serve`; each overrides the same key of the --config file.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A TOML file with any of the keys below (model, draft, host, port, ...); flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The host profile (`hosts/<chip>.toml`) whose pairs and tuned defaults to serve with;
    /// the defaults below marked "profile" come from its `[engine]` table [default: cpu].
    #[arg(long, env = "LUCEBOX_CHIP")]
    chip: Option<String>,
    /// One of the profile's pairs, by name [default: the profile's default pair].
    #[arg(long, conflicts_with = "model")]
    pair: Option<String>,
    /// The target model: a GGUF file or a catalogue name, fetched when missing, instead of a
    /// pair's [default: the pair's target].
    #[arg(long, short)]
    model: Option<String>,
    /// The drafter: a GGUF file or a catalogue name, `ngram` for prompt lookup, or `none`
    /// [default: the pair's drafter, or none with --model].
    #[arg(long)]
    draft: Option<String>,
    /// The longest draft per round [default: profile].
    #[arg(long)]
    draft_tokens: Option<usize>,
    /// Positions of context per sequence [default: profile].
    #[arg(long)]
    context: Option<usize>,
    /// Requests generating at once, in one batch; more wait [default: profile].
    #[arg(long)]
    max_sequences: Option<usize>,
    /// Tokens per forward pass: a decode row per running request, prefill chunks in the rest
    /// [default: profile].
    #[arg(long)]
    step_tokens: Option<usize>,
    /// Memory for the KV cache, shared by all requests and the prefix cache (and, with a
    /// drafter model, by its pool of as many positions), in MiB [default: profile].
    #[arg(long, value_name = "MIB")]
    kv_cache_mib: Option<u64>,
    /// Compute threads of the CPU backend [default: all cores].
    #[arg(long)]
    threads: Option<usize>,
    /// How finely the target's matmuls quantize their activations; the drafter's take the
    /// cheapest precision, which cannot change the output [default: split].
    #[arg(long, value_enum)]
    activations: Option<Activations>,
    /// The backend to serve on [default: the profile's, `[engine] backend`].
    #[arg(long, value_enum)]
    device: Option<Device>,
    #[command(flatten)]
    tuning: TuningArgs,
    /// Address to listen on [default: 127.0.0.1].
    #[arg(long)]
    host: Option<IpAddr>,
    /// Port to listen on; 0 picks a free one [default: 8080].
    #[arg(long)]
    port: Option<u16>,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long, env = "LUCEBOX_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Read the API key from the first line of this file (for systemd credentials).
    #[arg(long, value_name = "FILE", conflicts_with = "api_key")]
    api_key_file: Option<PathBuf>,
    /// The most tokens one request may generate [default: the context].
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Requests that may wait for the engine; more get 503 [default: 64].
    #[arg(long)]
    queue: Option<usize>,
    /// The longest request body in bytes [default: 8 MiB].
    #[arg(long)]
    max_body_bytes: Option<usize>,
    /// Log lines as text or as JSON objects (one per line); `RUST_LOG` sets the level
    /// [default: text].
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
}

/// How the server writes its log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for journald and log shippers.
    Json,
}

/// The keys a --config file may set: the flags' names, with underscores.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    chip: Option<String>,
    pair: Option<String>,
    model: Option<String>,
    draft: Option<String>,
    draft_tokens: Option<usize>,
    context: Option<usize>,
    max_sequences: Option<usize>,
    step_tokens: Option<usize>,
    kv_cache_mib: Option<u64>,
    threads: Option<usize>,
    activations: Option<Activations>,
    device: Option<Device>,
    host: Option<IpAddr>,
    port: Option<u16>,
    api_key: Option<String>,
    api_key_file: Option<PathBuf>,
    max_tokens: Option<usize>,
    queue: Option<usize>,
    max_body_bytes: Option<usize>,
    log_format: Option<LogFormat>,
}

/// The settings in force: flags over the file over the defaults.
struct Settings {
    profile: HostProfile,
    /// The profile's pair being served, when the target is not a --model of the user's.
    pair: Option<String>,
    model: String,
    draft: Option<String>,
    draft_tokens: usize,
    policy: DraftPolicy,
    context: usize,
    max_sequences: usize,
    step_tokens: usize,
    kv_cache_mib: u64,
    threads: Option<usize>,
    activations: Activations,
    device: Device,
    tuning: GpuTuning,
    log_format: LogFormat,
    server: ServerConfig,
}

impl Settings {
    fn new(args: ServeArgs) -> anyhow::Result<Settings> {
        let file = match &args.config {
            Some(path) => {
                let origin = format!("--config {}", path.display());
                let text = std::fs::read_to_string(path).with_context(|| origin.clone())?;
                crate::toml_text::parse(&text, &origin)?
            }
            None => FileConfig::default(),
        };
        let chip = args
            .chip
            .or(file.chip)
            .unwrap_or_else(|| DEFAULT_CHIP.to_owned());
        let profile = HostProfile::embedded(&chip).context("--chip")?;
        let defaults = profile.engine().clone();
        if file.model.is_some() && file.pair.is_some() {
            bail!("--config: `model` and `pair` both choose the target: give one of them");
        }
        // A flag overrides either key of the file: --model a file's pair, --pair a file's model.
        let (model, pair) = match (args.model, args.pair) {
            (None, None) => (file.model, file.pair),
            flags => flags,
        };
        let (model, pair, draft) = match model {
            Some(model) => (model, None, args.draft.or(file.draft)),
            None => {
                let pair = match &pair {
                    Some(name) => profile.pair(name).context("--pair")?,
                    None => profile.default_pair(),
                };
                let draft = args
                    .draft
                    .or(file.draft)
                    .unwrap_or_else(|| pair.drafter().as_draft_arg().to_owned());
                (
                    pair.target().to_owned(),
                    Some(pair.name().to_owned()),
                    Some(draft),
                )
            }
        };
        let draft = draft.filter(|draft| draft != "none");
        let context = args.context.or(file.context).unwrap_or(defaults.context);
        if context < 2 {
            bail!(
                "--context {context} is too small: it must hold a prompt token and a generated one"
            );
        }
        let queue = args.queue.or(file.queue).unwrap_or(64);
        if queue == 0 {
            bail!("--queue must be at least 1");
        }
        let max_sequences = args
            .max_sequences
            .or(file.max_sequences)
            .unwrap_or(defaults.max_sequences);
        if max_sequences == 0 {
            bail!("--max-sequences must be at least 1");
        }
        let draft_tokens = args
            .draft_tokens
            .or(file.draft_tokens)
            .unwrap_or(defaults.draft_tokens);
        let policy = draft_policy(draft_tokens, false)?;
        let step_tokens = args
            .step_tokens
            .or(file.step_tokens)
            .unwrap_or(defaults.step_tokens);
        if step_tokens < max_sequences.max(draft_tokens + 1) {
            bail!(
                "--step-tokens {step_tokens} is too small: one step must hold a token of each of \
                 --max-sequences {max_sequences} and a verify pass of --draft-tokens {draft_tokens} + 1"
            );
        }
        let max_tokens = args.max_tokens.or(file.max_tokens).unwrap_or(context);
        if max_tokens == 0 {
            bail!("--max-tokens must be at least 1");
        }
        let host = args
            .host
            .or(file.host)
            .unwrap_or(IpAddr::from([127, 0, 0, 1]));
        let port = args.port.or(file.port).unwrap_or(8080);
        if file.api_key.is_some() && file.api_key_file.is_some() {
            bail!("--config: `api_key` and `api_key_file` both set the key: give one of them");
        }
        let device = match args.device.or(file.device) {
            Some(device) => device,
            None => Device::of_profile(&profile),
        };
        device.ensure_built()?;
        let tuning = args.tuning.resolve(Some(&profile), device)?;
        let api_key = match (args.api_key, args.api_key_file) {
            (None, None) => (file.api_key, file.api_key_file),
            flags => flags,
        };
        let api_key = match api_key {
            (_, Some(path)) => Some(read_api_key(&path)?),
            (key, None) => key.filter(|k| !k.is_empty()),
        };
        Ok(Settings {
            profile,
            pair,
            model,
            draft,
            draft_tokens,
            policy,
            context,
            max_sequences,
            step_tokens,
            kv_cache_mib: args
                .kv_cache_mib
                .or(file.kv_cache_mib)
                .unwrap_or(defaults.kv_cache_mib),
            threads: args.threads.or(file.threads),
            activations: args.activations.or(file.activations).unwrap_or_default(),
            device,
            tuning,
            log_format: args.log_format.or(file.log_format).unwrap_or_default(),
            server: ServerConfig {
                listen: SocketAddr::new(host, port),
                api_key,
                max_body_bytes: args
                    .max_body_bytes
                    .or(file.max_body_bytes)
                    .unwrap_or(8 << 20),
                max_tokens,
                queue,
                drain: Duration::from_secs(30),
            },
        })
    }
}

/// The first line of `path`, which must not be empty.
pub(crate) fn read_api_key(path: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--api-key-file {}", path.display()))?;
    let key = text.lines().next().unwrap_or_default().trim();
    if key.is_empty() {
        bail!("--api-key-file {}: the first line is empty", path.display());
    }
    Ok(key.to_owned())
}

/// Runs `lucebox serve` until SIGINT or SIGTERM.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let settings = Settings::new(args)?;
    init_logging(settings.log_format)?;
    if settings.profile.is_cpu_stand_in() {
        tracing::warn!(
            "chip {}: its own backend is not built yet; this package runs the CPU engine",
            settings.profile.chip().name()
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let listen = settings.server.listen;
        let server = Server::bind(settings.server.clone())
            .await
            .with_context(|| format!("listening on {listen}"))?;
        tracing::info!("listening on http://{}", server.local_addr()?);
        let handle = server.handle();
        let serving = tokio::spawn(server.serve(shutdown_signal()));
        lucebox_server::notify::status("loading the model");
        let engine = tokio::task::spawn_blocking(move || load(&settings))
            .await
            .context("loading the model")??;
        let model_id = engine.model_id.clone();
        handle.ready(engine).context("starting the engine")?;
        tracing::info!("ready: {model_id}");
        serving.await.context("the server")??;
        tracing::info!("stopped");
        Ok(())
    })
}

/// Logs to stderr: `lucebox: message` lines as text (warnings and errors with their level), or
/// JSON objects. `RUST_LOG` overrides the level, `info` by default.
fn init_logging(format: LogFormat) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // A log that cannot be written (stderr closed) must not take requests down: the
    // subscriber's own error report would panic writing to the same stderr.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    let installed = match format {
        LogFormat::Text => builder.event_format(TextLine).try_init(),
        LogFormat::Json => builder.json().with_current_span(false).try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("installing the logger: {e}"))
}

/// The text format: `lucebox: message`, as the other commands print, with the level for
/// anything above info.
struct TextLine;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for TextLine
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        write!(writer, "lucebox: ")?;
        let level = *event.metadata().level();
        if level < tracing::Level::INFO {
            write!(writer, "{}: ", level.as_str().to_lowercase())?;
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Loads the model (and drafter) on the chosen device.
fn load(settings: &Settings) -> anyhow::Result<Engine> {
    crate::load::on_device!(
        settings.device,
        settings.threads,
        settings.tuning,
        |backend| load_on(backend, settings)
    )
}

/// Loads the model (and drafter) on `backend` and builds the batch engine that serves them.
fn load_on<B: Backend>(backend: &Arc<B>, settings: &Settings) -> anyhow::Result<Engine> {
    lucebox_server::notify::status(&format!("loading {}", settings.model));
    let target =
        load_model(&settings.model, backend, settings.activations.into()).context("--model")?;
    let tokenizer = Arc::new(Tokenizer::from_gguf(target.file.metadata()).context("tokenizer")?);
    let template = ChatTemplate::from_gguf(target.file.metadata()).context("chat template")?;
    let model_id = target
        .catalogue_name
        .clone()
        .unwrap_or_else(|| target.label.clone());
    let drafter_model = match settings.draft.as_deref() {
        None | Some("ngram") => None,
        Some(draft) => {
            lucebox_server::notify::status(&format!("loading and checking the drafter {draft}"));
            Some(load_drafter(draft, &target)?)
        }
    };
    // The target's pool and the drafter model's, as many positions each, share the budget.
    let block_tokens = DEFAULT_BLOCK_TOKENS;
    let pools: Vec<&Model<B>> = std::iter::once(&*target.model)
        .chain(drafter_model.as_ref().map(|d| &*d.model))
        .collect();
    let kv_blocks =
        BatchConfig::kv_blocks_within(&pools, settings.kv_cache_mib << 20, block_tokens);
    if kv_blocks * block_tokens < settings.context {
        let of = if drafter_model.is_some() {
            "this model and its drafter"
        } else {
            "this model"
        };
        bail!(
            "--kv-cache-mib {} holds {} positions of {of}, fewer than --context {}",
            settings.kv_cache_mib,
            kv_blocks * block_tokens,
            settings.context
        );
    }
    let (drafter, drafter_name): (Option<Box<dyn Drafter + Send>>, String) =
        match (drafter_model, settings.draft.as_deref()) {
            (Some(drafter), _) => {
                let name = drafter
                    .catalogue_name
                    .clone()
                    .unwrap_or_else(|| drafter.label.clone());
                let config = DrafterConfig {
                    context: settings.context,
                    sequences: settings.max_sequences,
                    kv_blocks,
                    block_tokens,
                    pass_tokens: settings.step_tokens,
                };
                let model_drafter = ModelDrafter::with_config(drafter.model, config)?;
                (Some(Box::new(model_drafter)), name)
            }
            (None, Some("ngram")) => {
                let ngram = NgramDrafter::with_spelling(Arc::clone(&tokenizer) as _);
                (Some(Box::new(ngram)), "ngram".into())
            }
            (None, _) => (None, "none".into()),
        };
    let config = BatchConfig {
        context: settings.context,
        kv_blocks,
        block_tokens,
        max_sequences: settings.max_sequences,
        step_tokens: settings.step_tokens,
    };
    let is_end = {
        let tokenizer = Arc::clone(&tokenizer);
        Box::new(move |token| tokenizer.is_end_of_generation(token))
    };
    let speculation = match &drafter {
        None => json!(null),
        Some(_) => {
            let when =
                "every running request, its drafts verified in the batch's pass where they pay";
            json!({"drafter": drafter_name, "draft_tokens_max": settings.draft_tokens, "draft_length": "adaptive", "when": when})
        }
    };
    let batcher = Batcher::new(
        Arc::clone(&target.model),
        config,
        is_end,
        drafter.map(|d| (d, settings.policy)),
    )
    .context("starting the batch engine")?;
    let context = batcher.config().context;
    let props = json!({
        "model": model_id,
        "model_path": target.path,
        "speculation": speculation,
        "n_ctx": context,
        "max_sequences": settings.max_sequences,
        "kv_cache_tokens": kv_blocks * block_tokens,
        "chip": settings.profile.chip().name(),
        "pair": settings.pair,
        "backend": backend.describe(),
        "activations": target.model.activation_precision().to_string(),
        "chat_template": template.as_ref().map(|t| t.name().to_owned()),
    });
    Ok(Engine {
        batcher: Box::new(batcher),
        tokenizer,
        template,
        model_id,
        props,
    })
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(e) => {
                    tracing::warn!("cannot watch SIGTERM ({e}); stopping on SIGINT only");
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
    tracing::info!("stopping: draining requests in flight");
}
