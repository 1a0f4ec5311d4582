//! The engine thread: it owns the batched engine, admits queued requests into its running
//! batch as room frees up, steps it, and sends each request's text to its connection as it is
//! produced.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};

use lucebox_engine::speculative::SpecStats;
use lucebox_engine::{
    BatchEngine, Event as EngineEvent, NewSequence, Sampler, SamplingParams, SequenceId,
    StopReason, TokenLogprobs,
};
use lucebox_tokenizer::{StreamDecoder, Tokenizer};
use tokio::sync::mpsc;

use crate::metrics::{Latency, Metrics};
use crate::notify::Watchdog;
use crate::stop::StopMatcher;

/// What the engine generates for one request.
#[derive(Debug)]
pub(crate) struct Request {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// `Some(n)`: report each token's log-probability with `n` alternatives.
    pub logprobs: Option<usize>,
}

/// A request queued for the engine, with where its events go.
#[derive(Debug)]
pub(crate) struct Job {
    pub request: Request,
    /// Unbounded: the engine never waits for one slow client while others share its batch; a
    /// request's events are bounded by its `max_tokens` anyway.
    pub events: mpsc::UnboundedSender<Event>,
    /// When the request arrived, for the latency metrics.
    pub arrived: Instant,
}

/// What the engine sends back for a job, in order: text, then one `Done` or `Failed`.
#[derive(Debug)]
pub(crate) enum Event {
    /// Text as it is released (after stop strings could no longer begin in it), with the
    /// log-probabilities of the tokens produced since the last `Text`, when requested.
    Text {
        text: String,
        logprobs: Vec<Logprob>,
    },
    Done(Finish),
    Failed(String),
}

/// One generated token's log-probabilities, spelled out for a response.
#[derive(Debug)]
pub(crate) struct Logprob {
    pub token: Spelling,
    pub logprob: f32,
    /// The most likely tokens, most likely first.
    pub top: Vec<(Spelling, f32)>,
}

/// A token as responses show it: its text (invalid UTF-8 replaced) and its bytes.
#[derive(Debug)]
pub(crate) struct Spelling {
    pub text: String,
    pub bytes: Vec<u8>,
}

impl Spelling {
    fn of(tokenizer: &Tokenizer, token: u32) -> Spelling {
        let bytes = tokenizer.token_bytes(token).unwrap_or_default().to_vec();
        Spelling {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
        }
    }
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
    jobs: Sender<(Job, Ticket)>,
    alive: Arc<AtomicBool>,
    /// Jobs submitted and not yet finished: queued, or in the engine's batch.
    outstanding: Arc<AtomicUsize>,
    /// The most outstanding jobs: a full batch and a full queue.
    limit: usize,
}

/// Counts its job as outstanding until dropped, wherever that happens: finished, cancelled,
/// or lost with a panicking engine thread.
#[derive(Debug)]
struct Ticket(Arc<AtomicUsize>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
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

    /// Queues `job`, unless the batch and the queue are full.
    pub(crate) fn submit(&self, job: Job) -> Result<(), Refused> {
        if self.outstanding.fetch_add(1, Ordering::Relaxed) >= self.limit {
            self.outstanding.fetch_sub(1, Ordering::Relaxed);
            return Err(Refused::Full);
        }
        let ticket = Ticket(Arc::clone(&self.outstanding));
        self.jobs.send((job, ticket)).map_err(|_| Refused::Stopped)
    }
}

/// Starts the engine thread with a queue of `capacity` requests waiting for room in its batch;
/// it feeds `watchdog` and records into `metrics`.
pub(crate) fn spawn(
    engine: Box<dyn BatchEngine>,
    tokenizer: Arc<Tokenizer>,
    capacity: usize,
    watchdog: Option<Watchdog>,
    metrics: Arc<Metrics>,
) -> std::io::Result<Queue> {
    let (jobs, waiting) = std::sync::mpsc::channel();
    let limit = capacity + engine.load().max_sequences;
    let alive = Arc::new(AtomicBool::new(true));
    let guard = Alive(Arc::clone(&alive));
    std::thread::Builder::new()
        .name("lucebox-engine".into())
        .spawn(move || {
            // Declared before the queue's receiver, so dropped after it: once the engine
            // counts as dead, submitting fails too.
            let _guard = guard;
            let waiting = waiting;
            Worker {
                engine,
                tokenizer,
                metrics,
                active: HashMap::new(),
            }
            .run(&waiting, watchdog);
        })?;
    Ok(Queue {
        jobs,
        alive,
        outstanding: Arc::default(),
        limit,
    })
}

/// Generates one token from one token, greedily: the model runs end to end before the server
/// says it is ready.
pub(crate) fn self_test(engine: &mut dyn BatchEngine, tokenizer: &Tokenizer) -> Result<(), String> {
    let prompt = vec![tokenizer.bos().unwrap_or(0)];
    let fail = |e: lucebox_engine::Error| format!("self-test: {e}");
    engine
        .add(NewSequence {
            prompt,
            sampler: Sampler::new(SamplingParams::default()),
            max_tokens: 1,
            logprobs: None,
        })
        .map_err(fail)?;
    let mut events = Vec::new();
    // One step prefills and samples; a second would mean the engine did not finish it.
    for _ in 0..2 {
        engine.step(&mut events).map_err(fail)?;
        if let Some(EngineEvent::Finished { stats, .. }) = events.last() {
            return match stats.generated_tokens {
                1 => Ok(()),
                n => Err(format!("self-test: {n} tokens generated instead of 1")),
            };
        }
    }
    Err("self-test: no token after two steps".into())
}

/// A channel for one job's events.
pub(crate) fn events() -> (mpsc::UnboundedSender<Event>, mpsc::UnboundedReceiver<Event>) {
    mpsc::unbounded_channel()
}

/// A request in the engine's batch: where its events go and the state that turns its tokens
/// into text.
struct Active {
    events: mpsc::UnboundedSender<Event>,
    arrived: Instant,
    /// Held while the request is in the batch.
    _ticket: Ticket,
    decoder: StreamDecoder<Arc<Tokenizer>>,
    stops: StopMatcher,
    stopped_by_text: bool,
    last_token: Option<Instant>,
    /// Log-probabilities of tokens whose text is not released yet.
    logprobs: Vec<Logprob>,
}

impl Active {
    /// Sends `text` with the pending log-probabilities, unless there is neither. A client that
    /// has gone is noticed before the next step, not here.
    fn send(&mut self, text: String) {
        if text.is_empty() && self.logprobs.is_empty() {
            return;
        }
        let logprobs = std::mem::take(&mut self.logprobs);
        let _ = self.events.send(Event::Text { text, logprobs });
    }
}

struct Worker {
    engine: Box<dyn BatchEngine>,
    tokenizer: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
    active: HashMap<SequenceId, Active>,
}

impl Worker {
    fn run(mut self, waiting: &Receiver<(Job, Ticket)>, mut watchdog: Option<Watchdog>) {
        let mut events = Vec::new();
        loop {
            if let Some(watchdog) = &mut watchdog {
                watchdog.pet();
            }
            if self.active.is_empty() {
                // Idle: wait for work, waking up to feed the watchdog.
                let job = match &watchdog {
                    Some(watchdog) => match waiting.recv_timeout(watchdog.interval()) {
                        Ok(job) => job,
                        Err(RecvTimeoutError::Timeout) => continue,
                        Err(RecvTimeoutError::Disconnected) => return,
                    },
                    None => match waiting.recv() {
                        Ok(job) => job,
                        Err(_) => return,
                    },
                };
                self.admit(job);
            }
            while self.has_room() {
                match waiting.try_recv() {
                    Ok(job) => self.admit(job),
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                }
            }
            self.cancel_abandoned();
            events.clear();
            if let Err(e) = self.engine.step(&mut events) {
                self.fail_all(&e.to_string());
            }
            // Before the events go out, so that a client that has seen its text reads
            // metrics at least as new.
            self.metrics.engine_load(self.engine.load());
            for event in events.drain(..) {
                self.dispatch(event);
            }
        }
    }

    /// Whether the engine would run another sequence now.
    fn has_room(&self) -> bool {
        let load = self.engine.load();
        load.running + load.waiting < load.max_sequences
    }

    /// Takes a job off the queue into the engine.
    fn admit(&mut self, (job, ticket): (Job, Ticket)) {
        self.metrics.dequeued();
        if job.events.is_closed() {
            return;
        }
        self.metrics.observe(Latency::Queue, job.arrived.elapsed());
        let Job {
            request,
            events,
            arrived,
        } = job;
        let added = self.engine.add(NewSequence {
            prompt: request.prompt,
            sampler: Sampler::new(request.params),
            max_tokens: request.max_tokens,
            logprobs: request.logprobs,
        });
        match added {
            Ok(id) => {
                self.active.insert(
                    id,
                    Active {
                        events,
                        arrived,
                        _ticket: ticket,
                        decoder: StreamDecoder::new(Arc::clone(&self.tokenizer), true),
                        stops: StopMatcher::new(request.stop),
                        stopped_by_text: false,
                        last_token: None,
                        logprobs: Vec::new(),
                    },
                );
            }
            Err(e) => {
                tracing::warn!("request refused by the engine: {e}");
                let _ = events.send(Event::Failed(e.to_string()));
            }
        }
    }

    /// Ends the sequences whose clients have gone; their blocks go back to the pool.
    fn cancel_abandoned(&mut self) {
        let gone: Vec<SequenceId> = self
            .active
            .iter()
            .filter(|(_, a)| a.events.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            tracing::debug!("client went away; generation cancelled");
            self.engine.stop(id);
            self.active.remove(&id);
        }
    }

    /// Reports `message` to every request in the batch and drops them all.
    fn fail_all(&mut self, message: &str) {
        tracing::warn!("generation failed: {message}");
        for (id, active) in self.active.drain() {
            self.engine.stop(id);
            let _ = active.events.send(Event::Failed(message.to_owned()));
        }
    }

    fn dispatch(&mut self, event: EngineEvent) {
        match event {
            EngineEvent::Token {
                id,
                token,
                logprobs,
            } => self.token(id, token, logprobs.as_deref()),
            EngineEvent::Finished { id, stats, spec } => {
                if let Some(active) = self.active.remove(&id) {
                    self.finish(active, stats, spec.as_deref());
                }
            }
        }
    }

    fn token(&mut self, id: SequenceId, token: u32, logprobs: Option<&TokenLogprobs>) {
        // Tokens after a stop string in the same step belong to no request any more.
        let Some(active) = self.active.get_mut(&id) else {
            return;
        };
        let now = Instant::now();
        match active.last_token {
            None => self
                .metrics
                .observe(Latency::FirstToken, now - active.arrived),
            Some(last) => self.metrics.observe(Latency::InterToken, now - last),
        }
        active.last_token = Some(now);
        if self.tokenizer.is_end_of_generation(token) {
            return;
        }
        if let Some(logprobs) = logprobs {
            let spell = |t| Spelling::of(&self.tokenizer, t);
            active.logprobs.push(Logprob {
                token: spell(token),
                logprob: logprobs.logprob,
                top: logprobs.top.iter().map(|&(t, l)| (spell(t), l)).collect(),
            });
        }
        let matched = active
            .stops
            .push(&active.decoder.push(token).unwrap_or_default());
        active.send(matched.text);
        if matched.stopped {
            active.stopped_by_text = true;
            if let Some(EngineEvent::Finished { stats, spec, .. }) = self.engine.stop(id) {
                let active = self.active.remove(&id).expect("looked up above");
                self.finish(active, stats, spec.as_deref());
            }
        }
    }

    /// Sends a finished request's last text and its `Done`.
    fn finish(
        &mut self,
        mut active: Active,
        stats: lucebox_engine::GenerationStats,
        spec: Option<&SpecStats>,
    ) {
        let mut stopped_by_text = active.stopped_by_text;
        if !stopped_by_text {
            let tail = active
                .stops
                .push(&active.decoder.finish().unwrap_or_default());
            let text = if tail.stopped {
                tail.text
            } else {
                tail.text + &active.stops.finish()
            };
            stopped_by_text = tail.stopped;
            active.send(text);
        }
        let reason = match stats.stop {
            StopReason::EndOfGeneration | StopReason::Caller => FinishReason::Stop,
            StopReason::MaxTokens | StopReason::ContextFull if stopped_by_text => {
                FinishReason::Stop
            }
            StopReason::MaxTokens | StopReason::ContextFull => FinishReason::Length,
        };
        let finish = Finish {
            reason,
            prompt_tokens: stats.prompt_tokens,
            cached_tokens: stats.reused_tokens,
            completion_tokens: stats.generated_tokens,
            prompt_time: stats.prefill,
            decode_time: stats.decode,
            drafted_tokens: spec.map_or(0, |s| s.drafted_tokens()),
            accepted_tokens: spec.map_or(0, |s| s.accepted_tokens()),
        };
        self.metrics
            .observe(Latency::EndToEnd, active.arrived.elapsed());
        self.metrics.finished(
            finish.prompt_tokens,
            finish.cached_tokens,
            finish.completion_tokens,
            reason == FinishReason::Stop,
            spec,
        );
        // A client that has gone no longer needs the result.
        let _ = active.events.send(Event::Done(finish));
    }
}

#[cfg(test)]
mod tests {
    use lucebox_engine::{Error, GenerationStats, Load};

    use super::*;

    fn tokenizer() -> Arc<Tokenizer> {
        let path = lucebox_testkit::model("smollm2-135m-instruct-q4_1");
        let file = lucebox_gguf::GgufFile::open(&path).unwrap();
        Arc::new(Tokenizer::from_gguf(file.metadata()).unwrap())
    }

    fn job(max_tokens: usize, stop: &[&str]) -> (Job, mpsc::UnboundedReceiver<Event>) {
        let (events, received) = events();
        let request = Request {
            prompt: vec![1, 2, 3],
            params: SamplingParams::default(),
            max_tokens,
            stop: stop.iter().map(|s| s.to_string()).collect(),
            logprobs: None,
        };
        let job = Job {
            request,
            events,
            arrived: Instant::now(),
        };
        (job, received)
    }

    /// Generates a fixed list of tokens for every sequence, one per step, as a batched model
    /// would, ending at `end` or `max_tokens`.
    struct Scripted {
        script: Vec<u32>,
        end: Option<u32>,
        /// Running sequences: id, prompt length, max tokens, tokens generated.
        running: Vec<(SequenceId, usize, usize, usize)>,
        next_id: u64,
    }

    impl Scripted {
        fn new(script: Vec<u32>, end: Option<u32>) -> Box<Self> {
            Box::new(Self {
                script,
                end,
                running: Vec::new(),
                next_id: 0,
            })
        }

        fn finished(&self, index: usize, stop: StopReason) -> EngineEvent {
            let (id, prompt_tokens, _, generated) = self.running[index];
            EngineEvent::Finished {
                id,
                stats: GenerationStats {
                    prompt_tokens,
                    reused_tokens: 0,
                    generated_tokens: generated,
                    prefill: Duration::ZERO,
                    decode: Duration::ZERO,
                    stop,
                },
                spec: None,
            }
        }
    }

    impl BatchEngine for Scripted {
        fn add(&mut self, sequence: NewSequence) -> Result<SequenceId, Error> {
            let id = SequenceId(self.next_id);
            self.next_id += 1;
            let prompt_tokens = sequence.prompt.len();
            self.running
                .push((id, prompt_tokens, sequence.max_tokens, 0));
            Ok(id)
        }

        fn stop(&mut self, id: SequenceId) -> Option<EngineEvent> {
            let index = self.running.iter().position(|s| s.0 == id)?;
            let event = self.finished(index, StopReason::Caller);
            self.running.remove(index);
            Some(event)
        }

        fn step(&mut self, events: &mut Vec<EngineEvent>) -> Result<(), Error> {
            let mut index = 0;
            while index < self.running.len() {
                let (id, _, max, generated) = &mut self.running[index];
                let token = self.script[*generated % self.script.len()];
                *generated += 1;
                events.push(EngineEvent::Token {
                    id: *id,
                    token,
                    logprobs: None,
                });
                let stop = if Some(token) == self.end {
                    Some(StopReason::EndOfGeneration)
                } else if generated == max {
                    Some(StopReason::MaxTokens)
                } else {
                    None
                };
                match stop {
                    Some(stop) => {
                        events.push(self.finished(index, stop));
                        self.running.remove(index);
                    }
                    None => index += 1,
                }
            }
            Ok(())
        }

        fn load(&self) -> Load {
            Load {
                running: self.running.len(),
                max_sequences: 4,
                ..Load::default()
            }
        }

        fn context(&self) -> usize {
            64
        }
    }

    /// An engine whose first step panics, as a wedged kernel would.
    struct Panicking(Box<Scripted>);

    impl BatchEngine for Panicking {
        fn add(&mut self, sequence: NewSequence) -> Result<SequenceId, Error> {
            self.0.add(sequence)
        }

        fn stop(&mut self, id: SequenceId) -> Option<EngineEvent> {
            self.0.stop(id)
        }

        fn step(&mut self, _: &mut Vec<EngineEvent>) -> Result<(), Error> {
            panic!("a wedged kernel");
        }

        fn load(&self) -> Load {
            self.0.load()
        }

        fn context(&self) -> usize {
            64
        }
    }

    fn collect(received: &mut mpsc::UnboundedReceiver<Event>) -> (String, Option<Finish>) {
        let mut text = String::new();
        while let Some(event) = received.blocking_recv() {
            match event {
                Event::Text { text: piece, .. } => text.push_str(&piece),
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
            Scripted::new(tokens, tokenizer.eos()),
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
            Scripted::new(tokens, tokenizer.eos()),
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
        let engine = Box::new(Panicking(Scripted::new(vec![1], None)));
        let queue = spawn(engine, tokenizer, 2, None, Arc::default()).unwrap();
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
