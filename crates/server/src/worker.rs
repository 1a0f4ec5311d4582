//! The engine thread: it owns the generator and runs one request at a time, in arrival order,
//! sending text to the request's connection as it is produced.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
    alive: Arc<AtomicBool>,
}

/// Marks the engine dead when its thread ends, by a return or a panic.
struct Alive(Arc<AtomicBool>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
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
    /// Whether the engine thread still runs.
    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

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
    let alive = Arc::new(AtomicBool::new(true));
    let guard = Alive(Arc::clone(&alive));
    std::thread::Builder::new()
        .name("lucebox-engine".into())
        .spawn(move || {
            // Declared before the queue's receiver, so dropped after it: once the engine
            // counts as dead, submitting fails too.
            let _guard = guard;
            let waiting = waiting;
            run(generator, &tokenizer, &waiting, watchdog, &metrics);
        })?;
    Ok(Queue { jobs, alive })
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
        let outcome = generate(generator.as_mut(), tokenizer, &job, on_token);
        metrics.stopped_running();
        metrics.kv_usage(generator.held_tokens(), context);
        let event = match outcome {
            Ok(Some((finish, spec))) => {
                metrics.observe(Latency::EndToEnd, job.arrived.elapsed());
                metrics.finished(
                    finish.prompt_tokens,
                    finish.cached_tokens,
                    finish.completion_tokens,
                    finish.reason == FinishReason::Stop,
                    spec.as_ref(),
                );
                Event::Done(finish)
            }
            Ok(None) => {
                tracing::debug!("client went away; generation cancelled");
                continue;
            }
            Err(message) => {
                tracing::warn!("generation failed: {message}");
                Event::Failed(message)
            }
        };
        // A client that has gone no longer needs the result.
        let _ = job.events.blocking_send(event);
    }
}

fn generate(
    generator: &mut dyn Generator,
    tokenizer: &Arc<Tokenizer>,
    job: &Job,
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
        cached_tokens: stats.reused_tokens,
        completion_tokens: stats.generated_tokens,
        prompt_time: stats.prefill,
        decode_time: stats.decode,
        drafted_tokens: spec.as_ref().map_or(0, |s| s.drafted_tokens()),
        accepted_tokens: spec.as_ref().map_or(0, |s| s.accepted_tokens()),
    };
    Ok(Some((finish, spec)))
}

#[cfg(test)]
mod tests {
    use lucebox_engine::{Error, GenerationStats};

    use super::*;

    fn tokenizer() -> Arc<Tokenizer> {
        let path = lucebox_testkit::model("smollm2-135m-instruct-q4_1");
        let file = lucebox_gguf::GgufFile::open(&path).unwrap();
        Arc::new(Tokenizer::from_gguf(file.metadata()).unwrap())
    }

    fn job(max_tokens: usize, stop: &[&str]) -> (Job, mpsc::Receiver<Event>) {
        let (events, received) = events();
        let request = Request {
            prompt: vec![1, 2, 3],
            params: SamplingParams::default(),
            max_tokens,
            stop: stop.iter().map(|s| s.to_string()).collect(),
        };
        let job = Job {
            request,
            events,
            arrived: Instant::now(),
        };
        (job, received)
    }

    /// Generates a fixed list of tokens, as a model would, honouring the caller's stop.
    struct Scripted(Vec<u32>);

    impl Generator for Scripted {
        fn generate(
            &mut self,
            prompt: &[u32],
            _: &mut Sampler,
            max_tokens: usize,
            is_end: &dyn Fn(u32) -> bool,
            on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
        ) -> Result<(GenerationStats, Option<SpecStats>), Error> {
            let mut stats = GenerationStats {
                prompt_tokens: prompt.len(),
                reused_tokens: 0,
                generated_tokens: 0,
                prefill: Duration::ZERO,
                decode: Duration::ZERO,
                stop: StopReason::MaxTokens,
            };
            for &token in self.0.iter().take(max_tokens) {
                stats.generated_tokens += 1;
                if on_token(token).is_break() {
                    stats.stop = StopReason::Caller;
                    break;
                }
                if is_end(token) {
                    stats.stop = StopReason::EndOfGeneration;
                    break;
                }
            }
            Ok((stats, None))
        }

        fn context(&self) -> usize {
            64
        }

        fn held_tokens(&self) -> usize {
            0
        }
    }

    struct Panicking;

    impl Generator for Panicking {
        fn generate(
            &mut self,
            _: &[u32],
            _: &mut Sampler,
            _: usize,
            _: &dyn Fn(u32) -> bool,
            _: &mut dyn FnMut(u32) -> ControlFlow<()>,
        ) -> Result<(GenerationStats, Option<SpecStats>), Error> {
            panic!("a wedged kernel");
        }

        fn context(&self) -> usize {
            64
        }

        fn held_tokens(&self) -> usize {
            0
        }
    }

    fn collect(received: &mut mpsc::Receiver<Event>) -> (String, Option<Finish>) {
        let mut text = String::new();
        while let Some(event) = received.blocking_recv() {
            match event {
                Event::Text(piece) => text.push_str(&piece),
                Event::Done(finish) => return (text, Some(finish)),
                Event::Failed(message) => panic!("failed: {message}"),
            }
        }
        (text, None)
    }

    #[test]
    fn a_stop_string_ends_generation_and_the_text_before_it_is_sent() {
        let tokenizer = tokenizer();
        let tokens = tokenizer.encode("The answer is 42. END of story, and more.", false);
        let queue = spawn(
            Box::new(Scripted(tokens)),
            Arc::clone(&tokenizer),
            2,
            None,
            Arc::default(),
        )
        .unwrap();
        let (job, mut received) = job(100, &["END"]);
        queue.submit(job).unwrap();
        let (text, finish) = collect(&mut received);
        let finish = finish.unwrap();
        assert_eq!(text, "The answer is 42. ");
        assert_eq!(finish.reason, FinishReason::Stop);
        // Generation stopped at the stop string, not at the end of the script.
        assert!(
            finish.completion_tokens < 12,
            "{}",
            finish.completion_tokens
        );
    }

    #[test]
    fn an_end_of_generation_token_is_not_sent_as_text() {
        let tokenizer = tokenizer();
        let mut tokens = tokenizer.encode("Done.", false);
        tokens.push(tokenizer.eos().unwrap());
        tokens.extend(tokenizer.encode(" never", false));
        let queue = spawn(
            Box::new(Scripted(tokens)),
            Arc::clone(&tokenizer),
            2,
            None,
            Arc::default(),
        )
        .unwrap();
        let (job, mut received) = job(100, &[]);
        queue.submit(job).unwrap();
        let (text, finish) = collect(&mut received);
        assert_eq!(text, "Done.");
        assert_eq!(finish.unwrap().reason, FinishReason::Stop);
    }

    #[test]
    fn a_panicking_engine_is_reported_dead_and_refuses_work() {
        let tokenizer = tokenizer();
        let queue = spawn(Box::new(Panicking), tokenizer, 2, None, Arc::default()).unwrap();
        let (job_1, mut received) = job(4, &[]);
        queue.submit(job_1).unwrap();
        // The job's sender goes down with the thread: no Done, no Failed.
        assert!(received.blocking_recv().is_none());
        let deadline = Instant::now() + Duration::from_secs(10);
        while queue.is_alive() {
            assert!(
                Instant::now() < deadline,
                "the engine still counts as alive"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let (job_2, _) = job(4, &[]);
        assert_eq!(queue.submit(job_2), Err(Refused::Stopped));
    }
}
