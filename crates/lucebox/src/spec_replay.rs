//! `lucebox bench --spec --replay COSTS`: how fast n-gram drafting could decode the prompt set,
//! from each prompt's plain greedy output and the measured cost of verify passes.
//!
//! Each prompt's output is generated once, then replayed against [`NgramDrafter`] at every
//! longest draft k the costs price: at each round the drafter proposes up to k tokens for the
//! output so far, the round keeps those equal to the output and one more token, and costs a pass
//! over the draft and the pending token. Beside the speed those costs give over plain decoding
//! stands an oracle that drafts only the tokens that will be accepted: what any control of the
//! draft length could reach with this drafter, at most k tokens a round. No model runs during
//! the replay, so a change to the drafter is measured in seconds, without the noise of timing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use lucebox_backend::Backend;
use lucebox_engine::speculative::{Draft, DraftInput, Drafter, NgramDrafter, Proposal};
use lucebox_engine::{SamplingParams, Session, SessionConfig};
use lucebox_tokenizer::Tokenizer;
use serde::Serialize;

use crate::generate::prompt_tokens;
use crate::load::Loaded;
use crate::spec_bench::{BenchPrompt, generate};

/// The outcome of replaying one output at one longest draft.
#[derive(Serialize)]
struct Replay {
    prompt: String,
    max_draft: usize,
    tokens: usize,
    rounds: usize,
    drafted: usize,
    accepted: usize,
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
/// ([`check_costs`]).
pub(crate) fn run<B: Backend>(
    target: &Loaded<B>,
    prompts: &[BenchPrompt],
    pass_ms: &[f64],
    context: usize,
    json: bool,
) -> anyhow::Result<()> {
    let tokenizer = Arc::new(Tokenizer::from_gguf(target.file.metadata()).context("tokenizer")?);
    let config = SessionConfig {
        context,
        ..SessionConfig::default()
    };
    let mut session = Session::new(Arc::clone(&target.model), config)?;
    let greedy = SamplingParams::default();
    let mut replays = Vec::new();
    for prompt in prompts {
        let input = prompt_tokens(target, &tokenizer, &prompt.text, prompt.chat, None)
            .with_context(|| format!("prompt {}", prompt.name))?;
        let (output, ..) = generate(&mut session, &input, prompt.max_tokens, &greedy, &tokenizer)?;
        for max_draft in 1..pass_ms.len() {
            let drafter = NgramDrafter::with_spelling(Arc::clone(&tokenizer) as _);
            replays.push(replay(
                drafter, prompt, &input, &output, max_draft, pass_ms,
            )?);
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
        "{:<16} {:>3} {:>7} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7} {:>8}",
        "prompt",
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
            "{:<16} {:>3} {:>7} {:>7} {:>8.2} {:>8} {:>8} {:>7.2} {:>7.2} {:>8.1}",
            r.prompt,
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

/// Replays `output`, generated after `input`, against `drafter` drafting at most `max_draft`
/// tokens a round.
fn replay(
    mut drafter: NgramDrafter,
    prompt: &BenchPrompt,
    input: &[u32],
    output: &[u32],
    max_draft: usize,
    pass_ms: &[f64],
) -> anyhow::Result<Replay> {
    let mut sequence = input.to_vec();
    let (mut rounds, mut drafted, mut accepted) = (0, 0, 0);
    let (mut ms, mut oracle_ms) = (0.0, 0.0);
    let mut look_up = Duration::ZERO;
    let mut at = 0;
    while at < output.len() {
        sequence.truncate(input.len());
        sequence.extend_from_slice(&output[..at]);
        let mut draft = Draft::default();
        let started = Instant::now();
        drafter.propose(&mut [Proposal {
            input: DraftInput::new(0, &sequence),
            max: max_draft,
            draft: &mut draft,
        }])?;
        look_up += started.elapsed();
        let proposed = draft.tokens();
        let kept = proposed
            .iter()
            .zip(&output[at..])
            .take_while(|(proposed, wanted)| proposed == wanted)
            .count();
        rounds += 1;
        drafted += proposed.len();
        accepted += kept;
        ms += pass_ms[proposed.len()];
        oracle_ms += pass_ms[kept];
        at += kept + 1;
    }
    let plain_ms = output.len() as f64 * pass_ms[0];
    Ok(Replay {
        prompt: prompt.name.clone(),
        max_draft,
        tokens: output.len(),
        rounds,
        drafted,
        accepted,
        ratio_to_plain: plain_ms / ms,
        oracle_ratio_to_plain: plain_ms / oracle_ms,
        look_up_us: look_up.as_secs_f64() * 1e6 / rounds as f64,
    })
}
