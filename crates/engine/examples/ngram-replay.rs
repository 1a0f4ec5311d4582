//! How fast n-gram drafting could decode a prompt set, from its plain greedy outputs and the
//! measured cost of verify passes. Each prompt's output is generated once (CPU backend, single
//! 8-bit activations, greedy), then replayed against [`NgramDrafter`]: at every round the
//! drafter proposes up to k tokens for the output so far, the round keeps those equal to the
//! output and one more token, and costs a pass over the draft and the pending token. Printed
//! per prompt and k: the rounds, the tokens a round, and the speed over plain decoding that the
//! pass costs give, beside an oracle that drafts only the tokens that will be accepted (what
//! any control of the draft length could reach with this drafter, at most k tokens a round),
//! and the drafter's time a look-up. The drafter spells tokens with the model's tokenizer, as
//! the `lucebox` binary's does.
//!
//! The costs are milliseconds per pass of 1, 2, ... tokens, as `verify-cost` prints them; k
//! runs to one less than their number. No model runs during the replay, so a change to the
//! drafter is measured in seconds, without the noise of timing it.
//!
//! ```sh
//! cargo run --release -p lucebox-engine --example ngram-replay -- MODEL.gguf \
//!     tests/bench/spec-prompts.toml 40.2,51.5,57.1,69.2,81.1,91.6,99.6,110.8,134.9
//! ```

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lucebox_backend::{ActivationPrecision, CpuBackend};
use lucebox_engine::speculative::{Draft, DraftInput, Drafter, NgramDrafter, Proposal, Spelling};
use lucebox_engine::{Sampler, SamplingParams, Session, SessionConfig};
use lucebox_gguf::GgufFile;
use lucebox_model::Model;
use lucebox_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use serde::Deserialize;

/// A prompt set, as `tests/bench/spec-prompts.toml` writes it.
#[derive(Deserialize)]
struct PromptSet {
    prompts: Vec<Prompt>,
}

#[derive(Deserialize)]
struct Prompt {
    name: String,
    #[serde(default)]
    chat: bool,
    max_tokens: usize,
    text: String,
}

/// The outcome of replaying one output at one longest draft.
#[derive(Default)]
struct Replay {
    rounds: usize,
    drafted: usize,
    accepted: usize,
    /// Milliseconds of the passes the rounds take, and of the oracle's passes.
    ms: f64,
    oracle_ms: f64,
    /// Time spent proposing.
    look_up: Duration,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage =
        "usage: ngram-replay MODEL.gguf PROMPTS.toml MS_1,MS_2,... (ms a pass of 1, 2, ...)";
    let mut args = std::env::args().skip(1);
    let (Some(model_path), Some(prompts_path), Some(costs)) =
        (args.next(), args.next(), args.next())
    else {
        return Err(usage.into());
    };
    let costs = costs
        .split(',')
        .map(str::parse::<f64>)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{usage}: the costs: {e}"))?;
    if costs.len() < 2 {
        return Err(format!("{usage}: at least the costs of passes of 1 and 2 tokens").into());
    }
    let prompts =
        std::fs::read_to_string(&prompts_path).map_err(|e| format!("{prompts_path}: {e}"))?;
    let prompts: PromptSet =
        toml::from_str(&prompts).map_err(|e| format!("{prompts_path}: {e}"))?;
    let file = Arc::new(GgufFile::open(&model_path).map_err(|e| format!("{model_path}: {e}"))?);
    let tokenizer = Arc::new(Tokenizer::from_gguf(file.metadata())?);
    let template = ChatTemplate::from_gguf(file.metadata())?;
    let backend = Arc::new(CpuBackend::new(None)?);
    let model =
        Model::load_with_precision(backend, Arc::clone(&file), ActivationPrecision::Single)?;
    let mut session = Session::new(Arc::new(model), SessionConfig::default())?;
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
    for prompt in &prompts.prompts {
        let text = if prompt.chat {
            let template = template
                .as_ref()
                .ok_or("the model has no chat template for a chat prompt")?;
            template.render(&[ChatMessage::new("user", prompt.text.as_str())], true)?
        } else {
            prompt.text.clone()
        };
        let input = tokenizer.encode_prompt(&text, prompt.chat);
        let mut output = Vec::new();
        // The default parameters are greedy.
        let mut sampler = Sampler::new(SamplingParams::default());
        session.generate(
            &input,
            &mut sampler,
            prompt.max_tokens,
            |t| tokenizer.is_end_of_generation(t),
            |t| {
                output.push(t);
                ControlFlow::Continue(())
            },
        )?;
        for k in 1..costs.len() {
            let r = replay(&input, &output, k, &costs, Arc::clone(&tokenizer) as _)?;
            let plain_ms = output.len() as f64 * costs[0];
            println!(
                "{:<16} {k:>3} {:>7} {:>7} {:>8.2} {:>8} {:>8} {:>7.2} {:>7.2} {:>8.1}",
                prompt.name,
                output.len(),
                r.rounds,
                output.len() as f64 / r.rounds as f64,
                r.drafted,
                r.accepted,
                plain_ms / r.ms,
                plain_ms / r.oracle_ms,
                r.look_up.as_secs_f64() * 1e6 / r.rounds as f64,
            );
        }
    }
    Ok(())
}

/// Replays `output`, generated after `input`, against the n-gram drafter drafting at most `k`
/// tokens a round.
fn replay(
    input: &[u32],
    output: &[u32],
    k: usize,
    costs: &[f64],
    spelling: Arc<dyn Spelling>,
) -> Result<Replay, Box<dyn std::error::Error>> {
    let mut drafter = NgramDrafter::with_spelling(spelling);
    let mut sequence = input.to_vec();
    let mut r = Replay::default();
    let mut at = 0;
    while at < output.len() {
        sequence.truncate(input.len());
        sequence.extend_from_slice(&output[..at]);
        let mut draft = Draft::default();
        let started = Instant::now();
        drafter.propose(&mut [Proposal {
            input: DraftInput::new(0, &sequence),
            max: k,
            draft: &mut draft,
        }])?;
        r.look_up += started.elapsed();
        let drafted = draft.tokens();
        let accepted = drafted
            .iter()
            .zip(&output[at..])
            .take_while(|(drafted, wanted)| drafted == wanted)
            .count();
        r.rounds += 1;
        r.drafted += drafted.len();
        r.accepted += accepted;
        r.ms += costs[drafted.len()];
        r.oracle_ms += costs[accepted];
        at += accepted + 1;
    }
    Ok(r)
}
