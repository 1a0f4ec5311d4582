//! `lucebox bench --serve`: load on an OpenAI-compatible server through HTTP, at several
//! concurrencies: aggregate generated tokens per second and time to first token. It starts
//! `lucebox serve` itself, or drives any server at `--url` (llama.cpp's, vLLM's), so that the
//! same client measures both.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::{Value, json};

use crate::load::{Activations, Device, TuningArgs};
use crate::spec_bench::{BenchPrompt, named_prompts, prompt_set};

/// What to load and how.
pub(crate) struct ServeBenchArgs<'a> {
    /// A running server's base URL (`http://host:port`); without it, `lucebox serve` runs.
    pub url: Option<&'a str>,
    pub model: Option<&'a str>,
    /// The drafter `lucebox serve` gets (`none`, `ngram`, or a model).
    pub draft: &'a str,
    /// The longest draft `lucebox serve` gets [default: its host profile's].
    pub draft_tokens: Option<usize>,
    pub threads: Option<usize>,
    /// The backend `lucebox serve` runs on.
    pub device: Device,
    /// The target's activation precision `lucebox serve` gets.
    pub activations: Activations,
    /// The host profile and kernel tuning flags `lucebox serve` gets.
    pub chip: Option<&'a str>,
    pub tuning: &'a TuningArgs,
    pub concurrency: &'a [usize],
    /// Requests per concurrency level (default: twice the level, at least 8).
    pub requests: Option<usize>,
    pub max_tokens: usize,
    /// What each request asks to sample with (temperature 0: greedy).
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    /// Another prompt set than the project's.
    pub prompt_file: Option<&'a Path>,
    /// The names of the prompts to send; empty: all of the set.
    pub prompts: &'a [String],
    pub json: bool,
}

/// One request's figures.
struct Sample {
    first_token: Duration,
    tokens: u64,
    /// Drafted and accepted tokens, from the stream's `timings` (lucebox and llama.cpp send
    /// them).
    drafted: u64,
    accepted: u64,
}

#[derive(Serialize)]
struct Level {
    concurrency: usize,
    requests: usize,
    generated_tokens: u64,
    seconds: f64,
    aggregate_tok_s: f64,
    ttft_p50_ms: f64,
    ttft_p99_ms: f64,
    drafted_tokens: u64,
    accepted_tokens: u64,
}

/// A `lucebox serve` child, stopped when dropped.
struct Spawned(Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn run(args: ServeBenchArgs<'_>) -> anyhow::Result<()> {
    if args.concurrency.is_empty() || args.concurrency.contains(&0) {
        bail!("--concurrency takes levels of at least 1");
    }
    if args.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let prompts = named_prompts(prompt_set(args.prompt_file)?, args.prompts)?;
    let (base, _server) = match args.url {
        Some(url) => (url.trim_end_matches('/').to_owned(), None),
        None => {
            let model = args.model.context("--serve needs --model or --url")?;
            let (url, child) = spawn_server(model, &args)?;
            (url, Some(child))
        }
    };
    let authority = base
        .strip_prefix("http://")
        .with_context(|| format!("--url {base}: only http:// URLs are supported"))?
        .to_owned();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let client = Arc::new(Client {
        authority,
        max_tokens: args.max_tokens,
        sampling: json!({
            "temperature": args.temperature,
            "top_p": args.top_p,
            "top_k": args.top_k,
        }),
        prompts,
    });
    // One request first, untimed: the server faults its weights in.
    runtime
        .block_on(client.request(0))
        .context("the warm-up request")?;
    let mut levels = Vec::new();
    for &concurrency in args.concurrency {
        let requests = args.requests.unwrap_or((2 * concurrency).max(8));
        let level = runtime.block_on(run_level(&client, concurrency, requests))?;
        if !args.json {
            eprintln!(
                "concurrency {concurrency:>3}: {:.1} tok/s, TTFT p50 {:.0} ms",
                level.aggregate_tok_s, level.ttft_p50_ms
            );
        }
        levels.push(level);
    }
    if args.json {
        println!(
            "{}",
            json!({"server": base, "max_tokens": args.max_tokens, "levels": levels})
        );
        return Ok(());
    }
    println!(
        "server {base}, up to {} tokens per request",
        args.max_tokens
    );
    println!(
        "{:>11} {:>8} {:>8} {:>9} {:>12} {:>14} {:>14} {:>8} {:>9}",
        "concurrency",
        "requests",
        "tokens",
        "seconds",
        "tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "drafted",
        "accepted"
    );
    for l in &levels {
        println!(
            "{:>11} {:>8} {:>8} {:>9.2} {:>12.1} {:>14.0} {:>14.0} {:>8} {:>9}",
            l.concurrency,
            l.requests,
            l.generated_tokens,
            l.seconds,
            l.aggregate_tok_s,
            l.ttft_p50_ms,
            l.ttft_p99_ms,
            l.drafted_tokens,
            l.accepted_tokens
        );
    }
    Ok(())
}

/// Starts `lucebox serve` with `model` and the settings of `args` on a free port and waits
/// until it is ready.
fn spawn_server(model: &str, args: &ServeBenchArgs<'_>) -> anyhow::Result<(String, Spawned)> {
    let exe = std::env::current_exe().context("finding the lucebox binary")?;
    let mut command = Command::new(exe);
    command.args([
        "serve", "--model", model, "--draft", args.draft, "--port", "0", "--queue", "1024",
    ]);
    if let Some(threads) = args.threads {
        command.args(["--threads", &threads.to_string()]);
    }
    if let Some(chip) = args.chip {
        command.args(["--chip", chip]);
    }
    if let Some(tokens) = args.draft_tokens {
        command.args(["--draft-tokens", &tokens.to_string()]);
    }
    command.args(args.tuning.to_args());
    for (flag, value) in [
        ("--device", clap::ValueEnum::to_possible_value(&args.device)),
        (
            "--activations",
            clap::ValueEnum::to_possible_value(&args.activations),
        ),
    ] {
        if let Some(value) = value {
            command.args([flag, value.get_name()]);
        }
    }
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting lucebox serve")?;
    let stderr = child.stderr.take().context("the server's stderr")?;
    let child = Spawned(child);
    let mut url = None;
    let mut lines = BufReader::new(stderr).lines();
    for line in lines.by_ref() {
        let line = line.context("reading the server's log")?;
        if let Some(at) = line.strip_prefix("lucebox: listening on ") {
            url = Some(at.to_owned());
        } else if line.starts_with("lucebox: ready") {
            let url = url.context("the server was ready before it listened")?;
            // The server logs every request; its log is read to the end so that it never
            // blocks on, or fails writing to, a full or closed pipe.
            std::thread::spawn(move || lines.for_each(drop));
            return Ok((url, child));
        } else {
            eprintln!("{line}");
        }
    }
    bail!("lucebox serve exited before it was ready")
}

async fn run_level(
    client: &Arc<Client>,
    concurrency: usize,
    requests: usize,
) -> anyhow::Result<Level> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (client, next) = (Arc::clone(client), Arc::clone(&next));
        workers.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= requests {
                    return Ok::<_, anyhow::Error>(samples);
                }
                samples.push(
                    client
                        .request(i)
                        .await
                        .with_context(|| format!("request {i}"))?,
                );
            }
        }));
    }
    let mut samples = Vec::new();
    for worker in workers {
        samples.extend(worker.await.context("a client task")??);
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut first_tokens: Vec<f64> = samples
        .iter()
        .map(|s| s.first_token.as_secs_f64() * 1e3)
        .collect();
    first_tokens.sort_by(f64::total_cmp);
    let percentile = |p: f64| first_tokens[((first_tokens.len() - 1) as f64 * p).round() as usize];
    let generated_tokens = samples.iter().map(|s| s.tokens).sum();
    Ok(Level {
        drafted_tokens: samples.iter().map(|s| s.drafted).sum(),
        accepted_tokens: samples.iter().map(|s| s.accepted).sum(),
        concurrency,
        requests,
        generated_tokens,
        seconds,
        aggregate_tok_s: generated_tokens as f64 / seconds,
        ttft_p50_ms: percentile(0.5),
        ttft_p99_ms: percentile(0.99),
    })
}

/// Streams requests, one connection each, built from the prompt set in turn.
struct Client {
    authority: String,
    max_tokens: usize,
    /// The sampling fields of every request.
    sampling: serde_json::Value,
    prompts: Vec<BenchPrompt>,
}

impl Client {
    async fn request(&self, i: usize) -> anyhow::Result<Sample> {
        let prompt = &self.prompts[i % self.prompts.len()];
        let max_tokens = self.max_tokens.min(prompt.max_tokens);
        let mut common = json!({
            "max_tokens": max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let (Some(common), Some(sampling)) = (common.as_object_mut(), self.sampling.as_object())
        {
            common.extend(sampling.clone());
        }
        let (path, mut body) = if prompt.chat {
            let messages = json!([{"role": "user", "content": prompt.text}]);
            ("/v1/chat/completions", json!({"messages": messages}))
        } else {
            ("/v1/completions", json!({"prompt": prompt.text}))
        };
        if let (Some(body), Some(common)) = (body.as_object_mut(), common.as_object()) {
            body.extend(common.clone());
        }
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .with_context(|| format!("connecting to {}", self.authority))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake")?;
        tokio::spawn(connection);
        let request = Request::post(path)
            .header("host", &self.authority)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))?;
        let sent = Instant::now();
        let mut response = sender.send_request(request).await.context("sending")?;
        if !response.status().is_success() {
            let body = response.into_body().collect().await?.to_bytes();
            bail!("{path}: {}", String::from_utf8_lossy(&body));
        }
        let mut pending = Vec::new();
        let mut first_token = None;
        let mut tokens = None;
        let mut pieces = 0u64;
        let (mut drafted, mut accepted) = (0, 0);
        while let Some(frame) = response.body_mut().frame().await {
            let Ok(data) = frame.context("reading the stream")?.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = pending.drain(..end + 2).collect();
                let Some(payload) = std::str::from_utf8(&event)?
                    .trim_end()
                    .strip_prefix("data: ")
                    .map(str::to_owned)
                else {
                    continue;
                };
                if payload == "[DONE]" {
                    break;
                }
                let chunk: Value = serde_json::from_str(&payload).context("a stream chunk")?;
                if let Some(error) = chunk.get("error") {
                    bail!("{path}: the stream failed: {error}");
                }
                let choice = &chunk["choices"][0];
                let text = choice["delta"]["content"]
                    .as_str()
                    .or(choice["text"].as_str())
                    .unwrap_or("");
                if !text.is_empty() {
                    pieces += 1;
                    first_token.get_or_insert_with(|| sent.elapsed());
                }
                // `stream_options.include_usage` asks for the count (lucebox, llama.cpp and vLLM
                // honour it); a server that ignores it is counted by its text chunks.
                if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
                    tokens = Some(n);
                }
                let timings = &chunk["timings"];
                if let Some(n) = timings["draft_n"].as_u64() {
                    drafted = n;
                    accepted = timings["draft_n_accepted"].as_u64().unwrap_or(0);
                }
            }
        }
        Ok(Sample {
            first_token: first_token.unwrap_or_else(|| sent.elapsed()),
            tokens: tokens.unwrap_or(pieces),
            drafted,
            accepted,
        })
    }
}
