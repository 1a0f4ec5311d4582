//! `lucebox bench`: prefill and decode throughput of one model, as llama-bench measures them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use lucebox_appliance::{DEFAULT_CHIP, HostProfile};
use lucebox_backend::Backend;
use lucebox_engine::speculative::DraftPolicy;
use lucebox_engine::{Rng, Sampler, SamplingParams, Session, SessionConfig};

use crate::generate::draft_policy;
use crate::load::{Activations, Device, TuningArgs, load_model};
use crate::spec_bench::BenchPrompt;

#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// A GGUF file, or the name of a fetched catalogue model.
    #[arg(long, short, required_unless_present = "url")]
    model: Option<String>,
    /// Prompt tokens of the prefill test (one forward pass over a fresh context).
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens of the decode test (one at a time from a fresh context, greedy unless
    /// --temperature is given).
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Sample the decode test at this temperature (with --serve: every request; with --spec:
    /// every mode). Where the backend samples on the device, the decode test also runs
    /// sampling on the host, and --spec verifies n-gram drafts on the host too, to compare.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// With --temperature: keep the most likely tokens whose probabilities reach this.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// With --temperature: keep only this many most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Runs of each test (with --spec: of each prompt and mode); the median is reported.
    #[arg(long, default_value_t = 5)]
    repetitions: usize,
    /// Threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// The backend to measure.
    #[arg(long, value_enum, default_value_t)]
    device: Device,
    /// How finely the model's matmuls quantize their activations (a drafter's take the
    /// cheapest precision).
    #[arg(long, value_enum, default_value_t)]
    activations: Activations,
    /// The host profile (`hosts/<chip>.toml`) whose `[kernels]` tuning a GPU device launches
    /// its kernels with [default: none, the backend's defaults].
    #[arg(long)]
    chip: Option<String>,
    #[command(flatten)]
    tuning: TuningArgs,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Decode the project's prompt set (tests/bench/spec-prompts.toml) plain, with --draft and
    /// with n-gram lookup, and compare.
    #[arg(long)]
    spec: bool,
    /// With --spec or --serve: prompts from this file, of the form of
    /// tests/bench/spec-prompts.toml, instead of that set (tests/bench/edit-prompts.toml holds
    /// five more code edits).
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// With --spec: the drafter model (a GGUF file or a catalogue name); with --serve, what
    /// `lucebox serve --draft` gets.
    #[arg(long)]
    draft: Option<String>,
    /// With --spec: the longest draft per round [default: the `draft_tokens` of --chip's host
    /// profile, or of the CPU's]; with --serve, what `lucebox serve --draft-tokens` gets.
    #[arg(long, conflicts_with = "url")]
    draft_tokens: Option<usize>,
    /// With --spec: always draft --draft-tokens tokens instead of adapting.
    #[arg(long, requires = "spec")]
    fixed_draft: bool,
    /// With --spec: replay instead of timing. Each prompt's greedy output is generated once,
    /// then replayed against n-gram drafting at each fixed longest draft k below the number of
    /// these costs (at most 16), and with the adaptive draft length up to the longest; the
    /// costs are the milliseconds a verify pass of 1, 2, ... tokens takes (as `verify-cost`
    /// prints them): rounds, tokens a round, and the speed the costs give over plain decoding,
    /// beside that of an oracle drafting only what will be accepted.
    #[arg(
        long,
        requires = "spec",
        value_delimiter = ',',
        conflicts_with_all = ["draft", "draft_tokens", "fixed_draft", "temperature"]
    )]
    replay: Vec<f64>,
    /// With --replay: print to stderr each round of the longest fixed length that fell short,
    /// with the output around it, to see where the drafter goes wrong.
    #[arg(long, requires = "replay")]
    replay_trace: bool,
    /// Load a server through HTTP at each --concurrency level: aggregate tok/s and time to
    /// first token. It runs `lucebox serve --model M --draft D` (D: `none` unless --draft is
    /// given), or drives the server at --url.
    #[arg(long, conflicts_with = "spec")]
    serve: bool,
    /// With --serve: an OpenAI-compatible server to load instead (`http://host:port`).
    #[arg(long, requires = "serve")]
    url: Option<String>,
    /// With --serve: concurrent clients, one level after another.
    #[arg(
        long,
        requires = "serve",
        value_delimiter = ',',
        default_value = "1,4,16,64"
    )]
    concurrency: Vec<usize>,
    /// With --serve: requests per level [default: twice the level, at least 8].
    #[arg(long, requires = "serve")]
    requests: Option<usize>,
    /// With --serve: the most tokens per request (the prompt set's own limits also apply).
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// With --spec or --serve: only these prompts of the set, by name (`code-edit,prose`)
    /// [default: all of them, in turn].
    #[arg(long, value_delimiter = ',')]
    prompts: Vec<String>,
    /// Decode with this many sequences at once, one level after another, through the batch
    /// engine: each sequence's --prompt-tokens are prefilled, then --gen-tokens steps timed
    /// (aggregate tok/s, as llama.cpp's batched-bench reports).
    #[arg(
        long,
        value_delimiter = ',',
        conflicts_with_all = ["spec", "serve"]
    )]
    batch: Vec<usize>,
}

pub(crate) fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.prompt_tokens == 0 || args.gen_tokens == 0 || args.repetitions == 0 {
        bail!("--prompt-tokens, --gen-tokens and --repetitions must be at least 1");
    }
    if args.serve {
        return crate::serve_bench::run(crate::serve_bench::ServeBenchArgs {
            url: args.url.as_deref(),
            model: args.model.as_deref(),
            draft: args.draft.as_deref().unwrap_or("none"),
            draft_tokens: args.draft_tokens,
            threads: args.threads,
            device: args.device,
            activations: args.activations,
            chip: args.chip.as_deref(),
            tuning: &args.tuning,
            concurrency: &args.concurrency,
            requests: args.requests,
            max_tokens: args.max_tokens,
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            prompt_file: args.prompt_file.as_deref(),
            prompts: &args.prompts,
            json: args.json,
        });
    }
    if args.draft.is_some() && !args.spec {
        bail!("--draft goes with --spec or --serve");
    }
    if args.draft_tokens.is_some() && !args.spec {
        bail!("--draft-tokens goes with --spec or --serve");
    }
    if args.prompt_file.is_some() && !args.spec {
        bail!("--prompt-file goes with --spec or --serve");
    }
    if !args.prompts.is_empty() && !args.spec {
        bail!("--prompts goes with --spec or --serve");
    }
    if !args.replay.is_empty() {
        crate::spec_replay::check_costs(&args.replay)?;
    }
    let prompts = if args.spec {
        let prompts = crate::spec_bench::prompt_set(args.prompt_file.as_deref())?;
        crate::spec_bench::named_prompts(prompts, &args.prompts)?
    } else {
        Vec::new()
    };
    let model_arg = args.model.as_deref().context("--model is required")?;
    let profile = args
        .chip
        .as_deref()
        .map(HostProfile::embedded)
        .transpose()
        .context("--chip")?;
    let draft_tokens = match (args.draft_tokens, &profile) {
        (Some(tokens), _) => tokens,
        (None, Some(profile)) => profile.engine().draft_tokens,
        (None, None) => HostProfile::embedded(DEFAULT_CHIP)?.engine().draft_tokens,
    };
    let policy = draft_policy(draft_tokens, args.fixed_draft)?;
    let tuning = args.tuning.resolve(profile.as_ref(), args.device)?;
    crate::load::on_device!(args.device, args.threads, tuning, |backend| bench_on(
        backend, &args, model_arg, &prompts, policy
    ))
}

/// The context of each sequence that --spec decodes: its prompts and outputs fit.
const SPEC_CONTEXT: usize = 2048;

/// Loads the model on `backend` and runs the benchmark `args` ask for (with --spec, over
/// `prompts`, drafting as `policy` says).
fn bench_on<B: Backend>(
    backend: &Arc<B>,
    args: &BenchArgs,
    model_arg: &str,
    prompts: &[BenchPrompt],
    policy: DraftPolicy,
) -> anyhow::Result<()> {
    let target = load_model(model_arg, backend, args.activations.into()).context("--model")?;
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        seed: Some(0),
        ..SamplingParams::default()
    };
    params
        .validate()
        .context("--temperature, --top-p, --top-k")?;
    if !args.replay.is_empty() {
        return crate::spec_replay::run(
            &target,
            prompts,
            &args.replay,
            SPEC_CONTEXT,
            args.replay_trace,
            args.json,
        );
    }
    if args.spec {
        return crate::spec_bench::run(
            &target,
            crate::spec_bench::SpecBenchArgs {
                params,
                draft: args.draft.as_deref(),
                policy,
                prompts,
                context: SPEC_CONTEXT,
                repetitions: args.repetitions,
                json: args.json,
            },
        );
    }
    if !args.batch.is_empty() {
        return crate::batch_bench::run(
            &target,
            &args.batch,
            args.prompt_tokens,
            args.gen_tokens,
            args.repetitions,
            args.json,
        );
    }
    // A decode step reads every weight once (the embedding table too, where the output shares it).
    let weight_bytes: u64 = target
        .file
        .tensor_infos()
        .iter()
        .map(|t| t.byte_len())
        .sum();
    let model = target.model;
    let vocab = model.config().vocab as u64;
    let describe = crate::load::describe(&model);
    let peak_bandwidth = model.backend().peak_bandwidth();
    let config = SessionConfig {
        context: args.prompt_tokens.max(args.gen_tokens),
        prefill_chunk: args.prompt_tokens,
        ..SessionConfig::default()
    };
    let mut session = Session::new(model, config)?;
    // Random token ids, as llama-bench uses: throughput must not depend on the text.
    let mut rng = Rng::seeded(0);
    let prompt: Vec<u32> = (0..args.prompt_tokens)
        .map(|_| (rng.next_u64() % vocab) as u32)
        .collect();
    // Sampled on the device, the same decode also runs with the host's sampler, to compare.
    let host_too = !params.is_plain_greedy() && session.model().backend().samples_rows();
    let mut sampler = Sampler::new(params);

    // One untimed run of each test warms the caches and faults the mapped weights in.
    let mut prefill_runs = Vec::new();
    let mut decode_runs = Vec::new();
    let mut host_decode_runs = Vec::new();
    for run in 0..=args.repetitions {
        session.reset();
        let started = Instant::now();
        session.feed_prompt(&prompt)?;
        session.sample(&mut sampler)?;
        let prefill = args.prompt_tokens as f64 / started.elapsed().as_secs_f64();
        let decode = decode_rate(
            &mut session,
            &mut sampler,
            prompt[0],
            args.gen_tokens,
            false,
        )?;
        if host_too {
            let host = decode_rate(&mut session, &mut sampler, prompt[0], args.gen_tokens, true)?;
            if run > 0 {
                host_decode_runs.push(host);
            }
        }
        if run > 0 {
            prefill_runs.push(prefill);
            decode_runs.push(decode);
        }
    }
    let prefill = median(&mut prefill_runs);
    let decode = median(&mut decode_runs);
    let host_decode = (!host_decode_runs.is_empty()).then(|| median(&mut host_decode_runs));
    let bandwidth = decode * weight_bytes as f64;
    let share_of_peak = peak_bandwidth.map(|peak| bandwidth / peak);
    if args.json {
        let report = serde_json::json!({
            "model": model_arg,
            "backend": describe,
            "prompt_tokens": args.prompt_tokens,
            "gen_tokens": args.gen_tokens,
            "repetitions": args.repetitions,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "top_k": args.top_k,
            "prefill_tok_s": prefill,
            "decode_tok_s": decode,
            "decode_host_sampling_tok_s": host_decode,
            "weight_bytes": weight_bytes,
            "decode_weight_bandwidth_gb_s": bandwidth / 1e9,
            "peak_bandwidth_gb_s": peak_bandwidth.map(|peak| peak / 1e9),
            "decode_share_of_peak_bandwidth": share_of_peak,
            "prefill_runs_tok_s": prefill_runs,
            "decode_runs_tok_s": decode_runs,
            "decode_host_sampling_runs_tok_s": host_decode_runs,
        });
        println!("{report}");
    } else {
        println!("model    {model_arg}");
        println!("backend  {describe}");
        let of_peak = match (share_of_peak, peak_bandwidth) {
            (Some(share), Some(peak)) => format!(
                " ({:.1}% of the {:.0} GB/s the driver reports)",
                100.0 * share,
                peak / 1e9
            ),
            _ => String::new(),
        };
        println!(
            "weights  {:.2} GiB, read once per decode step: {:.1} GB/s at the median decode \
             rate{of_peak}",
            weight_bytes as f64 / f64::from(1 << 30),
            bandwidth / 1e9
        );
        println!(
            "{:<10} {:>8} {:>12} {:>12} {:>12}",
            "test", "tokens", "median t/s", "min t/s", "max t/s"
        );
        let mut tests = vec![
            ("prefill", args.prompt_tokens, &prefill_runs, prefill),
            ("decode", args.gen_tokens, &decode_runs, decode),
        ];
        if let Some(host) = host_decode {
            tests.push(("host-drawn", args.gen_tokens, &host_decode_runs, host));
        }
        for (name, tokens, runs, value) in tests {
            println!(
                "{name:<10} {tokens:>8} {value:>12.2} {:>12.2} {:>12.2}",
                runs[0],
                runs[runs.len() - 1]
            );
        }
    }
    Ok(())
}

/// Tokens per second decoding `tokens` tokens one at a time from a fresh context after
/// `first`, each drawn by `sampler` where the backend samples, or on the host (`on_host`: the
/// logits copied back and drawn there).
fn decode_rate<B: Backend>(
    session: &mut Session<B>,
    sampler: &mut Sampler,
    first: u32,
    tokens: usize,
    on_host: bool,
) -> anyhow::Result<f64> {
    session.reset();
    let started = Instant::now();
    let mut token = first;
    for _ in 0..tokens {
        session.feed(&[token])?;
        token = if on_host {
            session.sample_on_host(sampler)?
        } else {
            session.sample(sampler)?
        };
    }
    Ok(tokens as f64 / started.elapsed().as_secs_f64())
}

/// Sorts `runs` and returns their median.
pub(crate) fn median(runs: &mut [f64]) -> f64 {
    runs.sort_by(f64::total_cmp);
    let n = runs.len();
    if n % 2 == 1 {
        runs[n / 2]
    } else {
        (runs[n / 2 - 1] + runs[n / 2]) / 2.0
    }
}
