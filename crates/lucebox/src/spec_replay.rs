//! `lucebox bench --spec --replay COSTS`: how fast n-gram drafting could decode the prompt set,
//! from each prompt's plain greedy output and the measured cost of verify passes.
//!
//! Each prompt's output is generated once, then replayed ([`replay`]) against [`NgramDrafter`]
//! at every fixed longest draft k the costs price, and with the engine's adaptive draft length
//! up to the longest: at each round the drafter proposes tokens for the output so far, the
//! round keeps those equal to the output and one more token, and costs a pass over the draft and
//! the pending token. Beside the speed those costs give over plain decoding stands an oracle
//! that drafts only the tokens that will be accepted: what any control of the draft length
//! could reach with those drafts. The adaptive control measures the given costs as it would the
//! target's, across the prompts in turn as one speculator does. No model runs during the
//! replay, so a change to the drafter or to the control is measured in seconds, without the
//! noise of timing.

use std::sync::Arc;

use anyhow::{Context, bail};
use lucebox_backend::Backend;
use lucebox_engine::speculative::{
    DraftPolicy, MAX_DRAFT, NgramDrafter, PairCosts, ShortRound, replay,
};
use lucebox_engine::{SamplingParams, Session, SessionConfig};
use lucebox_tokenizer::Tokenizer;
use serde::Serialize;

use crate::generate::prompt_tokens;
use crate::load::Loaded;
use crate::spec_bench::{BenchPrompt, generate};

/// The outcome of replaying one output with one draft policy.
#[derive(Serialize)]
struct Replay {
    prompt: String,
    /// `fixed` or `adaptive`.
    policy: &'static str,
    max_draft: usize,
    tokens: usize,
    rounds: u64,
    drafted: u64,
    accepted: u64,
    /// Plain decoding's cost over the rounds' passes.
    ratio_to_plain: f64,
    /// The same for an oracle that drafts only the tokens that will be accepted.
    oracle_ratio_to_plain: f64,
    /// The drafter's time a round.
    look_up_us: f64,
}

/// Checks `pass_ms`, the milliseconds a verify pass of 1, 2, ... tokens takes, before a model
/// loads.
pub(crate) fn check_costs(pass_ms: &[f64]) -> anyhow::Result<()> {
    if pass_ms.len() < 2 {
        bail!("--replay: give the milliseconds of passes of 1 and 2 tokens at least");
    }
    if let Some(ms) = pass_ms.iter().find(|ms| !(ms.is_finite() && **ms > 0.0)) {
        bail!("--replay: {ms} is not the milliseconds of a pass");
    }
    Ok(())
}

/// Replays greedy outputs of `prompts` against the n-gram drafter, priced by `pass_ms`
/// ([`check_costs`]); with `trace`, prints to stderr each round of the longest fixed length that
/// fell short.
pub(crate) fn run<B: Backend>(
    target: &Loaded<B>,
    prompts: &[BenchPrompt],
    pass_ms: &[f64],
    context: usize,
    trace: bool,
    json: bool,
) -> anyhow::Result<()> {
    let tokenizer = Arc::new(Tokenizer::from_gguf(target.file.metadata()).context("tokenizer")?);
    let config = SessionConfig {
        context,
        ..SessionConfig::default()
    };
    let mut session = Session::new(Arc::clone(&target.model), config)?;
    let greedy = SamplingParams::default();
    let pass_seconds: Vec<f64> = pass_ms.iter().map(|ms| ms / 1e3).collect();
    let longest = (pass_ms.len() - 1).min(MAX_DRAFT);
    let mut adaptive_costs = PairCosts::with_passes(&pass_seconds);
    let mut replays = Vec::new();
    for prompt in prompts {
        let input = prompt_tokens(target, &tokenizer, &prompt.text, prompt.chat, None)
            .with_context(|| format!("prompt {}", prompt.name))?;
        let (output, ..) = generate(&mut session, &input, prompt.max_tokens, &greedy, &tokenizer)?;
        let policies = (1..=longest)
            .map(|k| ("fixed", k, DraftPolicy::Fixed(k)))
            .chain([("adaptive", longest, DraftPolicy::Adaptive(longest))]);
        for (policy_name, max_draft, policy) in policies {
            let mut fixed_costs = PairCosts::with_passes(&pass_seconds);
            let costs = match policy {
                DraftPolicy::Fixed(_) => &mut fixed_costs,
                DraftPolicy::Adaptive(_) => &mut adaptive_costs,
            };
            let mut drafter = NgramDrafter::with_spelling(Arc::clone(&tokenizer) as _);
            let r = replay(&mut drafter, policy, costs, &input, &output, &pass_seconds)?;
            if trace && policy == DraftPolicy::Fixed(longest) {
                print_short_rounds(&prompt.name, &r.short_rounds, &output, &tokenizer);
            }
            let plain = output.len() as f64 * pass_seconds[0];
            replays.push(Replay {
                prompt: prompt.name.clone(),
                policy: policy_name,
                max_draft,
                tokens: output.len(),
                rounds: r.rounds(),
                drafted: r.stats.drafted_tokens(),
                accepted: r.stats.accepted_tokens(),
                ratio_to_plain: plain / r.seconds(),
                oracle_ratio_to_plain: plain / r.oracle_seconds,
                look_up_us: r.stats.draft_time.as_secs_f64() * 1e6 / r.rounds() as f64,
            });
        }
    }
    if json {
        let report = serde_json::json!({
            "model": target.label,
            "pass_ms": pass_ms,
            "replays": replays,
        });
        println!("{report}");
        return Ok(());
    }
    println!(
        "model {}, greedy outputs replayed against n-gram drafting, passes of 1.. tokens \
         priced {pass_ms:?} ms",
        target.label
    );
    println!(
        "{:<16} {:<8} {:>3} {:>7} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7} {:>8}",
        "prompt",
        "policy",
        "k",
        "tokens",
        "rounds",
        "tok/rnd",
        "drafted",
        "accepted",
        "ratio",
        "oracle",
        "µs/look"
    );
    for r in &replays {
        println!(
            "{:<16} {:<8} {:>3} {:>7} {:>7} {:>8.2} {:>8} {:>8} {:>7.2} {:>7.2} {:>8.1}",
            r.prompt,
            r.policy,
            r.max_draft,
            r.tokens,
            r.rounds,
            r.tokens as f64 / r.rounds as f64,
            r.drafted,
            r.accepted,
            r.ratio_to_plain,
            r.oracle_ratio_to_plain,
            r.look_up_us,
        );
    }
    Ok(())
}

/// Prints `rounds` of the replay of `prompt`'s `output`, each with the output's tokens before
/// it and after it beside the draft.
fn print_short_rounds(prompt: &str, rounds: &[ShortRound], output: &[u32], tokenizer: &Tokenizer) {
    let spell = |tokens: &[u32]| {
        let spelled: Vec<String> = tokens
            .iter()
            .map(|&t| {
                format!(
                    "{:?}",
                    String::from_utf8_lossy(tokenizer.token_bytes(t).unwrap_or_default())
                )
            })
            .collect();
        spelled.join("|")
    };
    for r in rounds {
        let before = &output[r.at.saturating_sub(SHOWN_BEFORE)..r.at];
        let after = &output[r.at..(r.at + r.asked + 1).min(output.len())];
        eprintln!(
            "{prompt} @{}: after [{}] drafted {} of {} [{}], {} accepted; the output [{}]",
            r.at,
            spell(before),
            r.drafted.len(),
            r.asked,
            spell(&r.drafted),
            r.accepted,
            spell(after),
        );
    }
}

/// The output tokens a traced round shows before itself.
const SHOWN_BEFORE: usize = 6;
