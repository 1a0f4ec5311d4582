//! Routing, limits and the response bodies: JSON, and server-sent events for streams.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::api::{self, Generation};
use crate::error::ApiError;
use crate::worker::{self, Event, Finish, Job, Logprob};
use crate::{Ready, State};

/// A response body: whole, or streamed from a channel.
pub(crate) type ResponseBody = Either<Full<Bytes>, ChannelBody>;

/// Server-sent events waiting to be written to a slow client.
const SSE_BUFFERED: usize = 16;

/// A body whose chunks arrive on a channel; it ends when the sender is dropped, and dropping it
/// (a client that disconnects) tells the sender.
pub(crate) struct ChannelBody {
    chunks: mpsc::Receiver<Bytes>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.chunks
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}

/// Answers one request; every failure becomes an OpenAI error object.
pub(crate) async fn handle(
    state: Arc<State>,
    request: Request<Incoming>,
) -> Result<Response<ResponseBody>, Infallible> {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = route(&state, request).await.unwrap_or_else(|e| {
        if e.status.is_server_error() {
            tracing::warn!("{method} {path}: {e}");
        }
        error_response(&e)
    });
    // Probes and scrapes come every few seconds; they are logged only at debug level.
    if path == "/health" || path == "/metrics" {
        tracing::debug!("{method} {path} {}", response.status().as_u16());
    } else {
        tracing::info!(
            "{method} {path} {} {:.1} ms",
            response.status().as_u16(),
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(response)
}

async fn route(
    state: &State,
    request: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let known: &[&Method] = match path.as_str() {
        "/health" | "/metrics" | "/v1/models" | "/props" => &[&Method::GET],
        "/v1/chat/completions" | "/v1/completions" | "/tokenize" | "/detokenize" => {
            &[&Method::POST]
        }
        _ => return Err(ApiError::not_found(method.as_str(), &path)),
    };
    if !known.contains(&&method) {
        return Err(ApiError::method_not_allowed(method.as_str(), &path));
    }
    // Probes and scrapers read these without the key; they reveal no request content.
    if path != "/health" && path != "/metrics" {
        authorize(state, &request)?;
    }
    if path == "/metrics" {
        let mut response =
            Response::new(Either::Left(Full::new(Bytes::from(state.metrics.render()))));
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        return Ok(response);
    }
    if path == "/health" {
        return match state.ready.get() {
            None => Err(ApiError::unavailable("loading the model", 5)),
            Some(ready) if !ready.queue.is_alive() => {
                Err(ApiError::internal("the engine has stopped"))
            }
            Some(_) if state.is_draining() => Err(ApiError::unavailable("shutting down", 5)),
            Some(_) => Ok(json_response(StatusCode::OK, &json!({"status": "ok"}))),
        };
    }
    let ready = state
        .ready
        .get()
        .ok_or_else(|| ApiError::unavailable("loading the model", 5))?;
    if state.is_draining() {
        return Err(ApiError::unavailable("shutting down", 5));
    }
    match path.as_str() {
        "/v1/models" => Ok(json_response(StatusCode::OK, &models(ready))),
        "/props" => Ok(json_response(StatusCode::OK, &ready.props)),
        _ => {
            let body = read_body(request, state.config.max_body_bytes).await?;
            match path.as_str() {
                "/v1/chat/completions" => {
                    let generation = api::chat(&body, &ready.model())?;
                    complete(state, ready, generation, Kind::Chat).await
                }
                "/v1/completions" => {
                    let generation = api::completion(&body, &ready.model())?;
                    complete(state, ready, generation, Kind::Text).await
                }
                "/tokenize" => tokenize(ready, &body),
                _ => detokenize(ready, &body),
            }
        }
    }
}

/// Checks the bearer key, in time that does not depend on where a wrong key differs.
fn authorize(state: &State, request: &Request<Incoming>) -> Result<(), ApiError> {
    let Some(key) = &state.config.api_key else {
        return Ok(());
    };
    let given = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if constant_time_eq(given.as_bytes(), key.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let differences = a
        .iter()
        .zip(b)
        .fold(a.len() ^ b.len(), |acc, (x, y)| acc | usize::from(x ^ y));
    std::hint::black_box(differences) == 0
}

async fn read_body(request: Request<Incoming>, limit: usize) -> Result<Bytes, ApiError> {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    match Limited::new(request.into_body(), limit).collect().await {
        Ok(body) => Ok(body.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::too_large(limit)),
        Err(e) => Err(ApiError::invalid(format!("reading the request body: {e}"))),
    }
}

fn models(ready: &Ready) -> Value {
    json!({
        "object": "list",
        "data": [{
            "id": ready.model_id,
            "object": "model",
            "created": ready.created,
            "owned_by": "lucebox",
            "meta": {"n_ctx": ready.context},
        }],
    })
}

#[derive(serde::Deserialize)]
struct TokenizeRequest {
    content: String,
    #[serde(default)]
    add_special: bool,
    #[serde(default)]
    parse_special: bool,
}

fn tokenize(ready: &Ready, body: &[u8]) -> Result<Response<ResponseBody>, ApiError> {
    let request: TokenizeRequest = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("invalid request body: {e}")))?;
    let tokens = if request.add_special {
        ready
            .tokenizer
            .encode_prompt(&request.content, request.parse_special)
    } else {
        ready
            .tokenizer
            .encode(&request.content, request.parse_special)
    };
    Ok(json_response(StatusCode::OK, &json!({"tokens": tokens})))
}

#[derive(serde::Deserialize)]
struct DetokenizeRequest {
    tokens: Vec<u32>,
}

fn detokenize(ready: &Ready, body: &[u8]) -> Result<Response<ResponseBody>, ApiError> {
    let request: DetokenizeRequest = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("invalid request body: {e}")))?;
    let vocab = ready.tokenizer.vocab_size();
    if let Some(bad) = request.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid_param(
            "tokens",
            format!("token id {bad} is not below the vocabulary size {vocab}"),
        ));
    }
    let content = ready.tokenizer.decode(&request.tokens, false);
    Ok(json_response(StatusCode::OK, &json!({"content": content})))
}

/// Chat or text completion: the two differ only in the shape of their choices.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Text,
}

impl Kind {
    fn object(self, stream: bool) -> &'static str {
        match (self, stream) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text, _) => "text_completion",
        }
    }

    fn id_prefix(self) -> &'static str {
        match self {
            Kind::Chat => "chatcmpl",
            Kind::Text => "cmpl",
        }
    }

    /// One choice carrying `text` (a delta when streaming) and its tokens' `logprobs`.
    fn choice(
        self,
        text: Option<&str>,
        finish: Option<&str>,
        stream: bool,
        logprobs: Option<Value>,
    ) -> Value {
        let logprobs = logprobs.unwrap_or(Value::Null);
        match (self, stream) {
            (Kind::Chat, false) => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text.unwrap_or("")},
                "finish_reason": finish,
                "logprobs": logprobs,
            }),
            (Kind::Chat, true) => json!({
                "index": 0,
                "delta": text.map_or(json!({}), |t| json!({"content": t})),
                "finish_reason": finish,
                "logprobs": logprobs,
            }),
            (Kind::Text, _) => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "finish_reason": finish,
                "logprobs": logprobs,
            }),
        }
    }
}

/// Renders log-probabilities in the shape of the request's API: chat's `content` entries, or
/// the completions API's parallel lists with each token's offset in the generated text.
struct LogprobsWriter {
    kind: Kind,
    /// Characters of generated text before the next token.
    offset: usize,
}

impl LogprobsWriter {
    fn render(&mut self, entries: &[Logprob]) -> Value {
        match self.kind {
            Kind::Chat => {
                let content: Vec<Value> = entries
                    .iter()
                    .map(|e| {
                        let top: Vec<Value> = e
                            .top
                            .iter()
                            .map(|(t, l)| json!({"token": t.text, "logprob": l, "bytes": t.bytes}))
                            .collect();
                        json!({
                            "token": e.token.text,
                            "logprob": e.logprob,
                            "bytes": e.token.bytes,
                            "top_logprobs": top,
                        })
                    })
                    .collect();
                json!({"content": content})
            }
            Kind::Text => {
                let mut offsets = Vec::with_capacity(entries.len());
                for e in entries {
                    offsets.push(self.offset);
                    self.offset += e.token.text.chars().count();
                }
                let top: Vec<Value> = entries
                    .iter()
                    .map(|e| {
                        let map: serde_json::Map<String, Value> = e
                            .top
                            .iter()
                            .map(|(t, l)| (t.text.clone(), json!(l)))
                            .collect();
                        Value::Object(map)
                    })
                    .collect();
                json!({
                    "tokens": entries.iter().map(|e| &e.token.text).collect::<Vec<_>>(),
                    "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
                    "top_logprobs": top,
                    "text_offset": offsets,
                })
            }
        }
    }
}

/// The identity every chunk or response of one request carries.
struct Envelope {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
}

impl Envelope {
    fn wrap(&self, stream: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.kind.object(stream),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }
}

async fn complete(
    state: &State,
    ready: &Ready,
    generation: Generation,
    kind: Kind,
) -> Result<Response<ResponseBody>, ApiError> {
    let (events, mut received) = worker::events();
    let mut logprobs = generation
        .request
        .logprobs
        .map(|_| LogprobsWriter { kind, offset: 0 });
    let job = Job {
        request: generation.request,
        events,
        arrived: Instant::now(),
    };
    // Counted before it can be taken, so that the gauge never goes below zero.
    state.metrics.queued();
    match ready.queue.submit(job) {
        Ok(()) => {}
        Err(worker::Refused::Full) => {
            state.metrics.dequeued();
            return Err(ApiError::unavailable(
                "the request queue is full; retry later",
                1,
            ));
        }
        Err(worker::Refused::Stopped) => {
            state.metrics.dequeued();
            return Err(ApiError::internal("the engine has stopped"));
        }
    }
    let envelope = Envelope {
        id: format!("{}-{}", kind.id_prefix(), state.next_id()),
        created: unix_seconds(),
        model: ready.model_id.clone(),
        kind,
    };
    if !generation.stream {
        let mut text = String::new();
        let mut entries = Vec::new();
        loop {
            match received.recv().await {
                Some(Event::Text {
                    text: piece,
                    logprobs: more,
                }) => {
                    text.push_str(&piece);
                    entries.extend(more);
                }
                Some(Event::Done(finish)) => {
                    let logprobs = logprobs.as_mut().map(|w| w.render(&entries));
                    let choice =
                        kind.choice(Some(&text), Some(finish.reason.as_str()), false, logprobs);
                    let mut body = envelope.wrap(false, json!([choice]));
                    body["usage"] = usage(&finish);
                    body["timings"] = timings(&finish);
                    return Ok(json_response(StatusCode::OK, &body));
                }
                Some(Event::Failed(message)) => return Err(ApiError::internal(message)),
                None => return Err(ApiError::internal("the engine stopped")),
            }
        }
    }
    let (chunks, body) = mpsc::channel(SSE_BUFFERED);
    let include_usage = generation.include_usage;
    tokio::spawn(async move {
        // Each event is one `data:` line; a failed send means the client has gone.
        let send = |payload: String| {
            let chunk = Bytes::from(format!("data: {payload}\n\n"));
            let chunks = chunks.clone();
            async move { chunks.send(chunk).await.is_ok() }
        };
        if kind == Kind::Chat {
            let first = envelope.wrap(
                true,
                json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null, "logprobs": null}]),
            );
            if !send(first.to_string()).await {
                return;
            }
        }
        let failure = loop {
            match received.recv().await {
                Some(Event::Text {
                    text: piece,
                    logprobs: entries,
                }) => {
                    let logprobs = logprobs.as_mut().map(|w| w.render(&entries));
                    let choice = kind.choice(Some(&piece), None, true, logprobs);
                    let chunk = envelope.wrap(true, json!([choice]));
                    if !send(chunk.to_string()).await {
                        return;
                    }
                }
                Some(Event::Done(finish)) => {
                    let mut last = envelope.wrap(
                        true,
                        json!([kind.choice(None, Some(finish.reason.as_str()), true, None)]),
                    );
                    last["timings"] = timings(&finish);
                    if !send(last.to_string()).await {
                        return;
                    }
                    if include_usage {
                        let mut usage_chunk = envelope.wrap(true, json!([]));
                        usage_chunk["usage"] = usage(&finish);
                        if !send(usage_chunk.to_string()).await {
                            return;
                        }
                    }
                    break None;
                }
                Some(Event::Failed(message)) => break Some(message),
                None => break Some("the engine stopped".to_owned()),
            }
        };
        if let Some(message) = failure
            && !send(ApiError::internal(message).to_json()).await
        {
            return;
        }
        send("[DONE]".to_owned()).await;
    });
    let mut response = Response::new(Either::Right(ChannelBody { chunks: body }));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    Ok(response)
}

fn usage(finish: &Finish) -> Value {
    json!({
        "prompt_tokens": finish.prompt_tokens,
        "completion_tokens": finish.completion_tokens,
        "total_tokens": finish.prompt_tokens + finish.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": finish.cached_tokens},
    })
}

/// llama.cpp's `timings` object; its speculative fields count this request's drafts.
fn timings(finish: &Finish) -> Value {
    let prompt_ms = finish.prompt_time.as_secs_f64() * 1e3;
    let predicted_ms = finish.decode_time.as_secs_f64() * 1e3;
    // As llama.cpp counts: every generated token, although the first one's time is in
    // `prompt_ms` (it comes out of the prompt's pass).
    let predicted_n = finish.completion_tokens;
    let fed = finish.prompt_tokens - finish.cached_tokens;
    json!({
        "prompt_n": fed,
        "prompt_ms": prompt_ms,
        "prompt_per_second": if prompt_ms > 0.0 { fed as f64 / prompt_ms * 1e3 } else { 0.0 },
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_second": if predicted_ms > 0.0 { predicted_n as f64 / predicted_ms * 1e3 } else { 0.0 },
        "draft_n": finish.drafted_tokens,
        "draft_n_accepted": finish.accepted_tokens,
    })
}

/// Seconds since the Unix epoch, as OpenAI's `created` fields count them.
pub(crate) fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn json_response(status: StatusCode, body: &Value) -> Response<ResponseBody> {
    let mut response = Response::new(Either::Left(Full::new(Bytes::from(body.to_string()))));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn error_response(error: &ApiError) -> Response<ResponseBody> {
    let mut response = Response::new(Either::Left(Full::new(Bytes::from(error.to_json()))));
    *response.status_mut() = error.status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(seconds) = error.retry_after {
        headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    if error.status == StatusCode::UNAUTHORIZED {
        headers.insert("www-authenticate", HeaderValue::from_static("Bearer"));
    }
    response
}
