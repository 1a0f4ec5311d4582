//! `lucebox bench --spec`: the project's prompt set decoded plain, with a drafter model and with
//! n-gram lookup, in one process, so that every ratio compares runs on the same machine state.

use std::borrow::Cow;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use lucebox_engine::speculative::{
    DraftPolicy, Drafter, ModelDrafter, NgramDrafter, SpecStats, Speculator,
};
use lucebox_engine::{Generator, Sampler, SamplingParams, SessionConfig};
use lucebox_tokenizer::Tokenizer;
use serde::{Deserialize, Serialize};

use crate::bench::median;
use crate::generate::{load_drafter, prompt_tokens};
use lucebox_backend::Backend;

use crate::load::Loaded;

/// The prompt set, embedded at build time.
const PROMPTS: &str = include_str!("../../../tests/bench/spec-prompts.toml");

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptSet {
    prompts: Vec<BenchPrompt>,
}

/// One prompt of the set.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BenchPrompt {
    pub name: String,
    /// Rendered with the model's chat template as a user message; else raw text.
    pub chat: bool,
    pub max_tokens: usize,
    pub text: String,
}

/// The prompts of `file`, or without one the project's (`tests/bench/spec-prompts.toml`,
/// embedded at build time).
pub(crate) fn prompt_set(file: Option<&Path>) -> anyhow::Result<Vec<BenchPrompt>> {
    let (text, origin) = match file {
        Some(path) => {
            let origin = format!("--prompt-file {}", path.display());
            let text = std::fs::read_to_string(path).with_context(|| origin.clone())?;
            (Cow::Owned(text), origin)
        }
        None => (
            Cow::Borrowed(PROMPTS),
            "tests/bench/spec-prompts.toml".to_owned(),
        ),
    };
    let set: PromptSet = crate::toml_text::parse(&text, &origin)?;
    if set.prompts.is_empty() {
        bail!("{origin}: no [[prompts]]");
    }
    if let Some(p) = set.prompts.iter().find(|p| p.max_tokens == 0) {
        bail!("{origin}: prompt {:?} has max_tokens = 0", p.name);
    }
    Ok(set.prompts)
}

/// The prompts named in `names`, in the set's order; all of them when `names` is empty.
pub(crate) fn named_prompts(
    prompts: Vec<BenchPrompt>,
    names: &[String],
) -> anyhow::Result<Vec<BenchPrompt>> {
    if let Some(missing) = names
        .iter()
        .find(|n| !prompts.iter().any(|p| &p.name == *n))
    {
        let known: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
        bail!(
            "--prompts: no prompt {missing:?} in the set ({})",
            known.join(", ")
        );
    }
    Ok(prompts
        .into_iter()
        .filter(|p| names.is_empty() || names.contains(&p.name))
        .collect())
}

#[derive(Serialize)]
struct Run {
    prompt: String,
    mode: &'static str,
    tokens: usize,
    decode_tok_s: f64,
    ratio_to_plain: f64,
    acceptance_rate: Option<f64>,
    mean_acceptance_length: Option<f64>,
    plain_steps: Option<u64>,
    /// Whether greedy decoding gave plain decoding's tokens (none when sampled: speculation
    /// takes the seed's numbers in its own order).
    same_output_as_plain: Option<bool>,
    /// Every timed run's rate, sorted.
    runs_tok_s: Vec<f64>,
}

/// The draft setting of a speculative mode.
pub(crate) struct SpecBenchArgs<'a> {
    /// Every mode's sampling (with a fixed seed, so that each run of a mode is the same).
    pub params: SamplingParams,
    pub draft: Option<&'a str>,
    pub policy: DraftPolicy,
    pub prompts: &'a [BenchPrompt],
    pub context: usize,
    /// Timed runs of each prompt and mode; the median rate is reported.
    pub repetitions: usize,
    pub json: bool,
}

pub(crate) fn run<B: Backend>(target: &Loaded<B>, args: SpecBenchArgs<'_>) -> anyhow::Result<()> {
    let policy = args.policy;
    let tokenizer = Arc::new(Tokenizer::from_gguf(target.file.metadata()).context("tokenizer")?);
    let ngram = || Box::new(NgramDrafter::with_spelling(Arc::clone(&tokenizer) as _));
    let drafter = args
        .draft
        .map(|draft| load_drafter(draft, target))
        .transpose()?;
    let config = SessionConfig {
        context: args.context,
        ..SessionConfig::default()
    };
    let speculative = |drafter: Box<dyn Drafter + Send>,
                       host_sampling: bool|
     -> anyhow::Result<Box<dyn Generator>> {
        let mut speculator = Speculator::new(Arc::clone(&target.model), config, drafter, policy)?;
        speculator.set_host_sampling(host_sampling);
        Ok(Box::new(speculator))
    };
    let mut modes: Vec<(&'static str, Box<dyn Generator>)> = vec![(
        "plain",
        Box::new(lucebox_engine::Session::new(
            Arc::clone(&target.model),
            config,
        )?),
    )];
    if let Some(drafter) = &drafter {
        let model = ModelDrafter::new(Arc::clone(&drafter.model), args.context)?;
        modes.push(("draft-model", speculative(Box::new(model), false)?));
    }
    modes.push(("ngram", speculative(ngram(), false)?));
    // Sampled where the logits are, n-gram drafts are verified there too: the same drafts
    // verified on the host, from the rows copied back, show what that saves.
    let greedy = args.params.is_plain_greedy();
    if !greedy && target.model.backend().samples_rows() {
        modes.push(("ngram-host", speculative(ngram(), true)?));
    }

    let mut runs = Vec::new();
    for prompt in args.prompts {
        let ids = prompt_tokens(target, &tokenizer, &prompt.text, prompt.chat, None)
            .with_context(|| format!("prompt {}", prompt.name))?;
        for (_, generator) in &mut modes {
            // A short untimed run first faults in this mode's weights and sizes its buffers.
            let _ = generate(generator.as_mut(), &ids, 4, &args.params, &tokenizer)?;
        }
        // Repetitions go round the modes, so that a slow spell of this shared machine falls on
        // every mode alike rather than on one.
        let mut rates = vec![Vec::new(); modes.len()];
        let mut last = Vec::new();
        for _ in 0..args.repetitions {
            last.clear();
            for ((_, generator), rates) in modes.iter_mut().zip(&mut rates) {
                let (output, seconds, spec) = generate(
                    generator.as_mut(),
                    &ids,
                    prompt.max_tokens,
                    &args.params,
                    &tokenizer,
                )?;
                rates.push(output.len().saturating_sub(1) as f64 / seconds);
                last.push((output, spec));
            }
        }
        let plain_rate = median(&mut rates[0]);
        let plain_output = last[0].0.clone();
        for (((mode, _), rates), (output, spec)) in modes.iter().zip(&mut rates).zip(&last) {
            let rate = median(rates);
            runs.push(Run {
                prompt: prompt.name.clone(),
                mode,
                tokens: output.len(),
                decode_tok_s: rate,
                ratio_to_plain: rate / plain_rate,
                acceptance_rate: spec.as_ref().map(SpecStats::acceptance_rate),
                mean_acceptance_length: spec.as_ref().map(SpecStats::mean_acceptance_length),
                plain_steps: spec.as_ref().map(|s| s.plain_steps),
                same_output_as_plain: greedy.then(|| *output == plain_output),
                runs_tok_s: rates.clone(),
            });
        }
    }
    let speculating = || {
        modes
            .iter()
            .filter_map(|(mode, generator)| Some((*mode, generator.pair_costs()?)))
    };
    if args.json {
        let costs: serde_json::Map<_, _> = speculating()
            .map(|(mode, costs)| {
                let passes: serde_json::Map<_, _> = costs
                    .measured_passes()
                    .map(|(tokens, s)| (tokens.to_string(), serde_json::json!(s * 1e3)))
                    .collect();
                let measured = serde_json::json!({
                    "acceptance": costs.acceptance(),
                    "draft_ms_per_token": costs.draft_seconds().map(|s| s * 1e3),
                    "catch_up_ms_per_token": costs.catch_up_seconds().map(|s| s * 1e3),
                    "pass_ms_by_tokens": passes,
                });
                (mode.to_string(), measured)
            })
            .collect();
        let report = serde_json::json!({
            "model": target.label,
            "draft": args.draft,
            "policy": format!("{policy:?}"),
            "sampling": format!("{:?}", args.params),
            "repetitions": args.repetitions,
            "runs": runs,
            "measured_costs": costs,
        });
        println!("{report}");
    } else {
        println!(
            "model {}, draft {}, {policy:?}, {}, median of {} runs",
            target.label,
            args.draft.unwrap_or("none"),
            if greedy {
                "greedy".to_string()
            } else {
                let p = &args.params;
                format!(
                    "sampled (temperature {}, top-p {}, top-k {})",
                    p.temperature, p.top_p, p.top_k
                )
            },
            args.repetitions
        );
        println!(
            "{:<16} {:<12} {:>6} {:>9} {:>7} {:>7} {:>8} {:>6} {:>5}",
            "prompt", "mode", "tokens", "tok/s", "ratio", "accept", "tok/rnd", "plain", "same"
        );
        for r in &runs {
            let opt =
                |v: Option<f64>, scale: f64| v.map_or("-".into(), |v| format!("{:.2}", v * scale));
            println!(
                "{:<16} {:<12} {:>6} {:>9.2} {:>7.2} {:>7} {:>8} {:>6} {:>5}",
                r.prompt,
                r.mode,
                r.tokens,
                r.decode_tok_s,
                r.ratio_to_plain,
                opt(r.acceptance_rate, 1.0),
                opt(r.mean_acceptance_length, 1.0),
                r.plain_steps.map_or("-".into(), |n| n.to_string()),
                match r.same_output_as_plain {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "-",
                },
            );
        }
        println!("what each mode's draft-length control measured, over all prompts:");
        for (mode, costs) in speculating() {
            println!("  {mode}: {costs}");
        }
    }
    if let Some(r) = runs.iter().find(|r| r.same_output_as_plain == Some(false)) {
        bail!(
            "{} with {} produced other tokens than plain greedy decoding",
            r.prompt,
            r.mode
        );
    }
    Ok(())
}

/// Generation of up to `max_tokens` with `params`; the output, the seconds after the first
/// token, and speculation's statistics.
pub(crate) fn generate(
    generator: &mut dyn Generator,
    prompt: &[u32],
    max_tokens: usize,
    params: &SamplingParams,
    tokenizer: &Tokenizer,
) -> anyhow::Result<(Vec<u32>, f64, Option<SpecStats>)> {
    let mut sampler = Sampler::new(params.clone());
    let mut output = Vec::new();
    let (stats, spec) = generator.generate(
        prompt,
        &mut sampler,
        max_tokens,
        &|t| tokenizer.is_end_of_generation(t),
        &mut |t| {
            output.push(t);
            ControlFlow::Continue(())
        },
    )?;
    Ok((output, stats.decode.as_secs_f64(), spec))
}
