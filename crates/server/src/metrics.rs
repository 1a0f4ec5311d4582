//! Prometheus metrics in the text exposition format, under vLLM's names with a `lucebox:`
//! prefix, so that dashboards written for vLLM read them.

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lucebox_engine::Load;
use lucebox_engine::speculative::{MAX_DRAFT, SpecStats};

/// Latency buckets in seconds, as vLLM's for time to first token and end-to-end latency.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0,
];

#[derive(Debug)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new() -> Self {
        Self {
            counts: vec![0; LATENCY_BUCKETS.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, value: Duration) {
        let seconds = value.as_secs_f64();
        for (count, &bound) in self.counts.iter_mut().zip(LATENCY_BUCKETS) {
            if seconds <= bound {
                *count += 1;
            }
        }
        self.sum += seconds;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(
            out,
            "# HELP lucebox:{name} {help}\n# TYPE lucebox:{name} histogram"
        );
        for (count, bound) in self.counts.iter().zip(LATENCY_BUCKETS) {
            let _ = writeln!(out, "lucebox:{name}_bucket{{le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "lucebox:{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "lucebox:{name}_sum {}", self.sum);
        let _ = writeln!(out, "lucebox:{name}_count {}", self.count);
    }
}

/// Every metric the server keeps.
#[derive(Debug)]
pub(crate) struct Metrics {
    /// Requests queued for the engine thread, not yet taken.
    queued: AtomicU64,
    /// The engine's own figures, as of its last step.
    running: AtomicU64,
    engine_waiting: AtomicU64,
    kv_blocks_used: AtomicU64,
    kv_blocks: AtomicU64,
    preemptions: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    finished_stop: AtomicU64,
    finished_length: AtomicU64,
    prefix_queries: AtomicU64,
    prefix_hits: AtomicU64,
    spec_drafts: AtomicU64,
    spec_draft_tokens: AtomicU64,
    spec_accepted: AtomicU64,
    spec_accepted_per_position: [AtomicU64; MAX_DRAFT],
    latencies: Mutex<Latencies>,
}

#[derive(Debug)]
struct Latencies {
    first_token: Histogram,
    inter_token: Histogram,
    end_to_end: Histogram,
    queue: Histogram,
}

/// Which latency a measurement belongs to.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Latency {
    FirstToken,
    InterToken,
    EndToEnd,
    Queue,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            queued: AtomicU64::new(0),
            running: AtomicU64::new(0),
            engine_waiting: AtomicU64::new(0),
            kv_blocks_used: AtomicU64::new(0),
            kv_blocks: AtomicU64::new(0),
            preemptions: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            finished_stop: AtomicU64::new(0),
            finished_length: AtomicU64::new(0),
            prefix_queries: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            spec_drafts: AtomicU64::new(0),
            spec_draft_tokens: AtomicU64::new(0),
            spec_accepted: AtomicU64::new(0),
            spec_accepted_per_position: std::array::from_fn(|_| AtomicU64::new(0)),
            latencies: Mutex::new(Latencies {
                first_token: Histogram::new(),
                inter_token: Histogram::new(),
                end_to_end: Histogram::new(),
                queue: Histogram::new(),
            }),
        }
    }
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Metrics {
    pub(crate) fn queued(&self) {
        add(&self.queued, 1);
    }

    /// A queued request left the queue: taken by the engine thread, or refused.
    pub(crate) fn dequeued(&self) {
        self.queued.fetch_sub(1, Ordering::Relaxed);
    }

    /// The engine's load after a step.
    pub(crate) fn engine_load(&self, load: Load) {
        let set = |gauge: &AtomicU64, value: usize| gauge.store(value as u64, Ordering::Relaxed);
        set(&self.running, load.running);
        set(&self.engine_waiting, load.waiting);
        set(&self.kv_blocks_used, load.kv_blocks_used);
        set(&self.kv_blocks, load.kv_blocks);
        self.preemptions.store(load.preemptions, Ordering::Relaxed);
    }

    pub(crate) fn observe(&self, latency: Latency, value: Duration) {
        let mut latencies = self.latencies.lock().unwrap_or_else(|e| e.into_inner());
        let histogram = match latency {
            Latency::FirstToken => &mut latencies.first_token,
            Latency::InterToken => &mut latencies.inter_token,
            Latency::EndToEnd => &mut latencies.end_to_end,
            Latency::Queue => &mut latencies.queue,
        };
        histogram.observe(value);
    }

    /// A request finished: its tokens, why it stopped (`true`: a stop; `false`: its length),
    /// and what speculation did.
    pub(crate) fn finished(
        &self,
        prompt_tokens: usize,
        cached_tokens: usize,
        generated_tokens: usize,
        stop: bool,
        spec: Option<&SpecStats>,
    ) {
        add(&self.prompt_tokens, prompt_tokens as u64);
        add(&self.generation_tokens, generated_tokens as u64);
        add(&self.prefix_queries, prompt_tokens as u64);
        add(&self.prefix_hits, cached_tokens as u64);
        add(
            if stop {
                &self.finished_stop
            } else {
                &self.finished_length
            },
            1,
        );
        if let Some(spec) = spec {
            add(&self.spec_drafts, spec.speculative_rounds);
            add(&self.spec_draft_tokens, spec.drafted_tokens());
            add(&self.spec_accepted, spec.accepted_tokens());
            for (total, &accepted) in self.spec_accepted_per_position.iter().zip(&spec.accepted) {
                add(total, accepted);
            }
        }
    }

    /// The exposition text.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let kv_usage = get(&self.kv_blocks_used) as f64 / get(&self.kv_blocks).max(1) as f64;
        let single: [(&str, &str, &str, f64); 13] = [
            (
                "num_requests_running",
                "gauge",
                "Requests generating.",
                get(&self.running) as f64,
            ),
            (
                "num_requests_waiting",
                "gauge",
                "Requests waiting: queued, or preempted.",
                (get(&self.queued) + get(&self.engine_waiting)) as f64,
            ),
            (
                "kv_cache_usage_perc",
                "gauge",
                "Fraction of the KV cache's blocks held by requests (1 is full; cached prefixes \
                 nobody holds count as free).",
                kv_usage,
            ),
            (
                "num_preemptions_total",
                "counter",
                "Requests preempted because the KV cache was full; they are recomputed later.",
                get(&self.preemptions) as f64,
            ),
            (
                "prompt_tokens_total",
                "counter",
                "Prompt tokens of finished requests.",
                get(&self.prompt_tokens) as f64,
            ),
            (
                "generation_tokens_total",
                "counter",
                "Tokens generated by finished requests.",
                get(&self.generation_tokens) as f64,
            ),
            (
                "prefix_cache_queries_total",
                "counter",
                "Prompt tokens looked up in the prefix cache.",
                get(&self.prefix_queries) as f64,
            ),
            (
                "prefix_cache_hits_total",
                "counter",
                "Prompt tokens whose KV the prefix cache held.",
                get(&self.prefix_hits) as f64,
            ),
            (
                "spec_decode_num_drafts_total",
                "counter",
                "Speculative rounds.",
                get(&self.spec_drafts) as f64,
            ),
            (
                "spec_decode_num_draft_tokens_total",
                "counter",
                "Tokens drafted.",
                get(&self.spec_draft_tokens) as f64,
            ),
            (
                "spec_decode_num_accepted_tokens_total",
                "counter",
                "Drafted tokens the target accepted.",
                get(&self.spec_accepted) as f64,
            ),
            (
                "request_success_total{finished_reason=\"stop\"}",
                "counter",
                "Finished requests, by why they finished.",
                get(&self.finished_stop) as f64,
            ),
            (
                "request_success_total{finished_reason=\"length\"}",
                "",
                "",
                get(&self.finished_length) as f64,
            ),
        ];
        for (name, kind, help, value) in single {
            // A labelled series after the first of its family carries no header.
            if !kind.is_empty() {
                let family = name.split('{').next().unwrap_or(name);
                let _ = writeln!(
                    out,
                    "# HELP lucebox:{family} {help}\n# TYPE lucebox:{family} {kind}"
                );
            }
            let _ = writeln!(out, "lucebox:{name} {value}");
        }
        let _ = writeln!(
            out,
            "# HELP lucebox:spec_decode_num_accepted_tokens_per_pos_total Accepted drafted tokens, by position in the draft.\n\
             # TYPE lucebox:spec_decode_num_accepted_tokens_per_pos_total counter"
        );
        for (position, accepted) in self.spec_accepted_per_position.iter().enumerate() {
            let _ = writeln!(
                out,
                "lucebox:spec_decode_num_accepted_tokens_per_pos_total{{position=\"{position}\"}} {}",
                get(accepted)
            );
        }
        let latencies = self.latencies.lock().unwrap_or_else(|e| e.into_inner());
        latencies.first_token.render(
            &mut out,
            "time_to_first_token_seconds",
            "Time from arrival to the first token.",
        );
        latencies.inter_token.render(
            &mut out,
            "inter_token_latency_seconds",
            "Time between consecutive tokens.",
        );
        latencies.end_to_end.render(
            &mut out,
            "e2e_request_latency_seconds",
            "Time from arrival to the last token.",
        );
        latencies.queue.render(
            &mut out,
            "request_queue_time_seconds",
            "Time spent waiting in the queue.",
        );
        out
    }
}
