//! The engine thread: it owns the generator and runs one request at a time, in arrival order,
//! sending text to the request's connection as it is produced.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use lucebox_engine::speculative::SpecStats;
use lucebox_engine::{Generator, Sampler, SamplingParams, StopReason};
use lucebox_tokenizer::{StreamDecoder, Tokenizer};
use tokio::sync::mpsc;

use crate::metrics::{Latency, Metrics};
use crate::notify::Watchdog;
use crate::stop::StopMatcher;

/// Text events per request buffered between the engine and a slow client; beyond this the
/// engine waits for the client.
const EVENTS_BUFFERED: usize = 64;

/// What the engine generates for one request.
#[derive(Debug)]
pub(crate) struct Request {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub max_tokens: usize,
    pub stop: Vec<String>,
}

/// A request queued for the engine, with where its events go.
#[derive(Debug)]
pub(crate) struct Job {
    pub request: Request,
    pub events: mpsc::Sender<Event>,
    /// When the request arrived, for the latency metrics.
    pub arrived: Instant,
}

/// What the engine sends back for a job, in order: text, then one `Done` or `Failed`.
#[derive(Debug)]
pub(crate) enum Event {
    Text(String),
    Done(Finish),
    Failed(String),
}

/// Why a generation ended, as OpenAI names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens`, or the context is full.
    Length,
}

impl FinishReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// How a finished generation went.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Finish {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV was kept from the previous request.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub prompt_time: Duration,
    pub decode_time: Duration,
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
}

/// The sending end of the engine's queue.
#[derive(Clone, Debug)]
pub(crate) struct Queue {
    jobs: SyncSender<Job>,
}

/// Why a job was not queued.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// As many jobs wait as the queue holds.
    Full,
    /// The engine thread has ended (it panicked).
    Stopped,
}

impl Queue {
    /// Queues `job`.
    pub(crate) fn submit(&self, job: Job) -> Result<(), Refused> {
        self.jobs.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => Refused::Full,
            TrySendError::Disconnected(_) => Refused::Stopped,
        })
    }
}

/// Starts the engine thread with a queue of `capacity` waiting requests; it feeds `watchdog`
/// and records into `metrics`.
pub(crate) fn spawn(
    generator: Box<dyn Generator>,
    tokenizer: Arc<Tokenizer>,
    capacity: usize,
    watchdog: Option<Watchdog>,
    metrics: Arc<Metrics>,
) -> std::io::Result<Queue> {
    let (jobs, waiting) = std::sync::mpsc::sync_channel(capacity);
    std::thread::Builder::new()
        .name("lucebox-engine".into())
        .spawn(move || run(generator, &tokenizer, &waiting, watchdog, &metrics))?;
    Ok(Queue { jobs })
}

/// Generates one token from one token, greedily: the model runs end to end before the server
/// says it is ready.
pub(crate) fn self_test(
    generator: &mut dyn Generator,
    tokenizer: &Tokenizer,
) -> Result<(), String> {
    let prompt = [tokenizer.bos().unwrap_or(0)];
    let mut sampler = Sampler::new(SamplingParams::default());
    let (stats, _) = generator
        .generate(&prompt, &mut sampler, 1, &|_| false, &mut |_| {
            ControlFlow::Continue(())
        })
        .map_err(|e| format!("self-test: {e}"))?;
    if stats.generated_tokens != 1 {
        return Err(format!(
            "self-test: {} tokens generated instead of 1",
            stats.generated_tokens
        ));
    }
    Ok(())
}

/// A channel for one job's events.
pub(crate) fn events() -> (mpsc::Sender<Event>, mpsc::Receiver<Event>) {
    mpsc::channel(EVENTS_BUFFERED)
}

fn run(
    mut generator: Box<dyn Generator>,
    tokenizer: &Arc<Tokenizer>,
    waiting: &Receiver<Job>,
    mut watchdog: Option<Watchdog>,
    metrics: &Metrics,
) {
    let context = generator.context();
    // The sequence the generator holds, to tell how much of the next prompt it reuses.
    let mut held: Vec<u32> = Vec::new();
    loop {
        let job = match &mut watchdog {
            Some(watchdog) => {
                watchdog.pet();
                match waiting.recv_timeout(watchdog.interval()) {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            None => match waiting.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        let gone = job.events.is_closed();
        metrics.dequeued(!gone);
        if gone {
            continue;
        }
        metrics.observe(Latency::Queue, job.arrived.elapsed());
        let cached = shared_prefix(&held, &job.request.prompt);
        held.clone_from(&job.request.prompt);
        let mut last_token: Option<Instant> = None;
        let on_token = || {
            if let Some(watchdog) = &mut watchdog {
                watchdog.pet();
            }
            let now = Instant::now();
            match last_token {
                None => metrics.observe(Latency::FirstToken, now - job.arrived),
                Some(last) => metrics.observe(Latency::InterToken, now - last),
            }
            last_token = Some(now);
        };
        let outcome = generate(generator.as_mut(), tokenizer, &job, &mut held, on_token);
        metrics.stopped_running();
        let event = match outcome {
            Ok(Some((mut finish, spec))) => {
                finish.cached_tokens = cached;
                // The last token was sampled, not fed: the generator does not hold it.
                if finish.completion_tokens > 0 {
                    held.pop();
                }
                metrics.observe(Latency::EndToEnd, job.arrived.elapsed());
                metrics.finished(
                    finish.prompt_tokens,
                    cached,
                    finish.completion_tokens,
                    finish.reason == FinishReason::Stop,
                    spec.as_ref(),
                );
                Event::Done(finish)
            }
            Ok(None) => {
                tracing::debug!("client went away; generation cancelled");
                held.pop();
                metrics.kv_usage(held.len(), context);
                continue;
            }
            Err(message) => {
                tracing::warn!("generation failed: {message}");
                held.clear();
                Event::Failed(message)
            }
        };
        metrics.kv_usage(held.len(), context);
        // A client that has gone no longer needs the result.
        let _ = job.events.blocking_send(event);
    }
}

/// The prefix the engine reuses: the tokens shared with what it holds, less the last prompt
/// token, which is always fed again.
fn shared_prefix(held: &[u32], prompt: &[u32]) -> usize {
    let shared = held.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    shared.min(prompt.len().saturating_sub(1))
}

fn generate(
    generator: &mut dyn Generator,
    tokenizer: &Arc<Tokenizer>,
    job: &Job,
    held: &mut Vec<u32>,
    mut on_token: impl FnMut(),
) -> Result<Option<(Finish, Option<SpecStats>)>, String> {
    let mut sampler = Sampler::new(job.request.params.clone());
    let mut decoder = StreamDecoder::new(Arc::clone(tokenizer), true);
    let mut stops = StopMatcher::new(job.request.stop.clone());
    let mut stopped_by_text = false;
    let mut gone = false;
    let send =
        |text: String| text.is_empty() || job.events.blocking_send(Event::Text(text)).is_ok();
    let (stats, spec) = generator
        .generate(
            &job.request.prompt,
            &mut sampler,
            job.request.max_tokens,
            &|t| tokenizer.is_end_of_generation(t),
            &mut |t| {
                on_token();
                held.push(t);
                if tokenizer.is_end_of_generation(t) {
                    return ControlFlow::Continue(());
                }
                let matched = stops.push(&decoder.push(t).unwrap_or_default());
                if !send(matched.text) {
                    gone = true;
                    return ControlFlow::Break(());
                }
                if matched.stopped {
                    stopped_by_text = true;
                    return ControlFlow::Break(());
                }
                ControlFlow::Continue(())
            },
        )
        .map_err(|e| e.to_string())?;
    if gone {
        return Ok(None);
    }
    if !stopped_by_text {
        let tail = stops.push(&decoder.finish().unwrap_or_default());
        let text = if tail.stopped {
            tail.text
        } else {
            tail.text + &stops.finish()
        };
        stopped_by_text = tail.stopped;
        if !send(text) {
            return Ok(None);
        }
    }
    let reason = match stats.stop {
        StopReason::EndOfGeneration | StopReason::Caller => FinishReason::Stop,
        StopReason::MaxTokens | StopReason::ContextFull if stopped_by_text => FinishReason::Stop,
        StopReason::MaxTokens | StopReason::ContextFull => FinishReason::Length,
    };
    let finish = Finish {
        reason,
        prompt_tokens: stats.prompt_tokens,
        cached_tokens: 0,
        completion_tokens: stats.generated_tokens,
        prompt_time: stats.prefill,
        decode_time: stats.decode,
        drafted_tokens: spec.as_ref().map_or(0, |s| s.drafted_tokens()),
        accepted_tokens: spec.as_ref().map_or(0, |s| s.accepted_tokens()),
    };
    Ok(Some((finish, spec)))
}
