//! The HTTP API of lucebox: OpenAI's chat and text completions (streamed as server-sent events
//! or not), models, health, and llama.cpp's tokenize, detokenize and props, over HTTP/1.1 on
//! tokio and hyper, and Prometheus metrics under vLLM's names.
//!
//! One engine thread owns the model and runs requests as one continuously batched set: queued
//! requests (a bounded queue; a full one answers 503 with `Retry-After`) join the running batch
//! whenever it has room, text reaches each connection as it is generated, and a client that
//! disconnects cancels its sequence and frees its KV blocks. The server listens
//! before the model is loaded, so that `/health` can say 503 while loading:
//!
//! ```no_run
//! # async fn run(engine: lucebox_server::Engine) -> std::io::Result<()> {
//! use lucebox_server::{Server, ServerConfig};
//!
//! let server = Server::bind(ServerConfig::default()).await?;
//! server.handle().ready(engine)?; // once the model is loaded
//! server.serve(std::future::pending()).await
//! # }
//! ```
#![deny(missing_docs)]

mod api;
mod error;
mod http;
mod metrics;
pub mod notify;
mod stop;
mod worker;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use lucebox_engine::BatchEngine;
use lucebox_tokenizer::{ChatTemplate, Tokenizer};
use tokio::net::TcpListener;

pub use error::ApiError;

/// How the server listens and what it allows.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The address to listen on.
    pub listen: SocketAddr,
    /// When set, every route but `/health` requires `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// The longest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// The most tokens one request may generate; requests asking for more get a 400.
    pub max_tokens: usize,
    /// Requests waiting for room in the engine's batch; more get a 503.
    pub queue: usize,
    /// How long a shutdown waits for requests in flight.
    pub drain: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            api_key: None,
            max_body_bytes: 8 << 20,
            max_tokens: 4096,
            queue: 64,
            drain: Duration::from_secs(30),
        }
    }
}

/// A loaded model, ready to serve.
pub struct Engine {
    /// The model's batched engine (speculating when a drafter is set).
    pub batcher: Box<dyn BatchEngine>,
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The model's chat template, if it has one (without, only text completions work).
    pub template: Option<ChatTemplate>,
    /// The id `/v1/models` lists and responses carry.
    pub model_id: String,
    /// What `/props` answers: the model, the pair, the chip, speculation settings.
    pub props: serde_json::Value,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model_id", &self.model_id)
            .field("context", &self.batcher.context())
            .finish_non_exhaustive()
    }
}

/// The engine as requests see it.
struct Ready {
    queue: worker::Queue,
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    model_id: String,
    context: usize,
    /// The most tokens one request may ask for: the configured cap, within the context.
    max_tokens: usize,
    props: serde_json::Value,
    created: u64,
}

impl Ready {
    fn model(&self) -> api::Model<'_> {
        api::Model {
            tokenizer: &self.tokenizer,
            template: self.template.as_ref(),
            context: self.context,
            max_tokens: self.max_tokens,
        }
    }
}

struct State {
    config: ServerConfig,
    metrics: Arc<metrics::Metrics>,
    ready: OnceLock<Ready>,
    draining: AtomicBool,
    requests: AtomicU64,
}

impl State {
    fn next_id(&self) -> u64 {
        self.requests.fetch_add(1, Ordering::Relaxed)
    }

    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}

/// A listening server.
#[derive(Debug)]
pub struct Server {
    state: Arc<State>,
    listener: TcpListener,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("config", &self.config)
            .field("ready", &self.ready.get().is_some())
            .finish_non_exhaustive()
    }
}

/// Makes a listening server ready once its model is loaded.
#[derive(Clone, Debug)]
pub struct Handle {
    state: Arc<State>,
}

impl Handle {
    /// Checks that `engine` generates a token, starts the engine thread on it, and tells
    /// systemd the service is ready; requests are served from now on.
    ///
    /// # Errors
    /// When the self-test fails, the thread cannot be started, or the server already has an
    /// engine.
    pub fn ready(&self, mut engine: Engine) -> std::io::Result<()> {
        if self.state.ready.get().is_some() {
            return Err(std::io::Error::other("the server already has an engine"));
        }
        notify::status("self-test: generating one token");
        worker::self_test(engine.batcher.as_mut(), &engine.tokenizer)
            .map_err(std::io::Error::other)?;
        let context = engine.batcher.context();
        let queue = worker::spawn(
            engine.batcher,
            Arc::clone(&engine.tokenizer),
            self.state.config.queue,
            notify::Watchdog::from_env(),
            Arc::clone(&self.state.metrics),
        )?;
        let model_id = engine.model_id.clone();
        let ready = Ready {
            queue,
            tokenizer: engine.tokenizer,
            template: engine.template,
            model_id: engine.model_id,
            context,
            max_tokens: self.state.config.max_tokens.min(context),
            props: engine.props,
            created: http::unix_seconds(),
        };
        self.state
            .ready
            .set(ready)
            .map_err(|_| std::io::Error::other("the server already has an engine"))?;
        notify::ready(&format!("serving {model_id}"));
        Ok(())
    }
}

impl Server {
    /// Listens on `config.listen` (port 0 picks a free port; see [`local_addr`](Self::local_addr)).
    ///
    /// # Errors
    /// When the address cannot be bound.
    pub async fn bind(config: ServerConfig) -> std::io::Result<Server> {
        let listener = TcpListener::bind(config.listen).await?;
        Ok(Server {
            state: Arc::new(State {
                config,
                metrics: Arc::default(),
                ready: OnceLock::new(),
                draining: AtomicBool::new(false),
                requests: AtomicU64::new(0),
            }),
            listener,
        })
    }

    /// The address the server listens on.
    ///
    /// # Errors
    /// As [`TcpListener::local_addr`].
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// A handle to make the server ready.
    pub fn handle(&self) -> Handle {
        Handle {
            state: Arc::clone(&self.state),
        }
    }

    /// Serves connections until `shutdown` completes, then stops accepting, answers new
    /// requests on open connections with 503, and waits up to `config.drain` for requests in
    /// flight.
    ///
    /// # Errors
    /// When accepting fails for a reason other than a transient one.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> std::io::Result<()> {
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        tokio::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like pass; keep serving.
                        tracing::warn!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let state = Arc::clone(&self.state);
            let service = service_fn(move |request| http::handle(Arc::clone(&state), request));
            // The timer arms hyper's 30 s limit on reading a request's head: a client that
            // trickles headers cannot hold a connection open for ever.
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            let connection = graceful.watch(connection);
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!("connection from {peer}: {e}");
                }
            });
        }
        self.state.draining.store(true, Ordering::Relaxed);
        notify::stopping();
        drop(self.listener);
        tracing::info!(
            "draining requests in flight (up to {:?})",
            self.state.config.drain
        );
        if tokio::time::timeout(self.state.config.drain, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                "requests still in flight after {:?}; stopping anyway",
                self.state.config.drain
            );
        }
        Ok(())
    }
}
