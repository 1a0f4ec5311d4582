//! `lucebox generate`: stream a continuation of a prompt to stdout.

use std::io::Write;
use std::ops::ControlFlow;

use anyhow::{Context, bail};
use std::sync::Arc;

use lucebox_engine::speculative::{
    DraftPolicy, Drafter, MAX_DRAFT, ModelDrafter, NgramDrafter, Speculator,
};
use lucebox_engine::{Generator, Sampler, SamplingParams, Session, SessionConfig};
use lucebox_tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};

use lucebox_backend::Backend;

use crate::load::{Activations, Loaded, cpu_backend, drafter_precision, load_model};

#[derive(Debug, clap::Args)]
pub(crate) struct GenerateArgs {
    /// A GGUF file, or the name of a fetched catalogue model.
    #[arg(long, short)]
    model: String,
    /// The prompt: raw text, or with --chat the user's message.
    #[arg(long, short)]
    prompt: String,
    /// Wrap the prompt in the model's own chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// With --chat, a system message before the user's.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// The most tokens to generate.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Positions of context (capped at the model's).
    #[arg(long, default_value_t = 4096)]
    context: usize,
    /// Threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// How finely the model's matmuls quantize their activations (a drafter's take the
    /// cheapest precision: they cannot change the output).
    #[arg(long, value_enum, default_value_t)]
    activations: Activations,
    #[command(flatten)]
    speculation: SpeculationArgs,
}

/// Speculative decoding flags, shared by the commands that generate.
#[derive(Debug, clap::Args)]
pub(crate) struct SpeculationArgs {
    /// Speculate with this drafter model (a GGUF file or a catalogue name); it must pass the
    /// pair checks of `lucebox verify-pair` against --model.
    #[arg(long, conflicts_with = "ngram")]
    draft: Option<String>,
    /// Speculate with n-gram prompt lookup (no drafter model).
    #[arg(long)]
    ngram: bool,
    /// The longest draft per round; the length adapts below it to what pays.
    #[arg(long, default_value_t = 8)]
    draft_tokens: usize,
    /// Always draft --draft-tokens tokens instead of adapting.
    #[arg(long)]
    fixed_draft: bool,
}

impl SpeculationArgs {
    /// The drafter these flags ask for, checked against the target, if any; an n-gram drafter
    /// spells tokens as `tokenizer`, the target's, does.
    pub(crate) fn drafter(
        &self,
        target: &Loaded,
        tokenizer: &Arc<Tokenizer>,
        context: usize,
    ) -> anyhow::Result<Option<Box<dyn Drafter + Send>>> {
        if self.ngram {
            let ngram = NgramDrafter::with_spelling(Arc::clone(tokenizer) as _);
            return Ok(Some(Box::new(ngram)));
        }
        let Some(draft) = &self.draft else {
            return Ok(None);
        };
        let drafter = load_drafter(draft, target)?;
        Ok(Some(Box::new(ModelDrafter::new(drafter.model, context)?)))
    }

    pub(crate) fn policy(&self) -> anyhow::Result<DraftPolicy> {
        draft_policy(self.draft_tokens, self.fixed_draft)
    }
}

/// The drafter model `arg` on the target's backend at the drafter precision, refused with a
/// one-line reason when the pair fails the checks that need no model run.
pub(crate) fn load_drafter<B: Backend>(arg: &str, target: &Loaded<B>) -> anyhow::Result<Loaded<B>> {
    let drafter =
        load_model(arg, target.model.backend(), drafter_precision::<B>()).context("--draft")?;
    crate::pair::refuse_failing_pair(target, &drafter)?;
    Ok(drafter)
}

/// The policy of `--draft-tokens` and `--fixed-draft`.
pub(crate) fn draft_policy(draft_tokens: usize, fixed: bool) -> anyhow::Result<DraftPolicy> {
    if draft_tokens == 0 || draft_tokens > MAX_DRAFT {
        bail!("--draft-tokens {draft_tokens} is not between 1 and {MAX_DRAFT}");
    }
    Ok(if fixed {
        DraftPolicy::Fixed(draft_tokens)
    } else {
        DraftPolicy::Adaptive(draft_tokens)
    })
}

/// Sampling flags, shared by the commands that generate. Negative numbers are taken as values
/// (and then refused or accepted by validation with a message), not as unknown flags.
#[derive(Debug, clap::Args)]
#[command(allow_negative_numbers = true)]
pub(crate) struct SamplingArgs {
    /// Softmax temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Keep the most likely tokens covering this probability mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Drop tokens below this fraction of the most likely one's probability.
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Penalise recently seen tokens by this factor (1: off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Subtract this from recently seen tokens' logits.
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    /// Subtract this times their count from recently seen tokens' logits.
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// How many recent tokens the penalties consider.
    #[arg(long, default_value_t = 64)]
    penalty_window: usize,
    /// Seed of the random stream (default: random).
    #[arg(long)]
    seed: Option<u64>,
}

impl SamplingArgs {
    pub(crate) fn params(&self) -> anyhow::Result<SamplingParams> {
        let params = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_window: self.penalty_window,
            seed: self.seed,
        };
        params.validate().context("sampling flags")?;
        Ok(params)
    }
}

pub(crate) fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let params = args.sampling.params()?;
    if args.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let policy = args.speculation.policy()?;
    let backend = cpu_backend(args.threads)?;
    let target = load_model(&args.model, &backend, args.activations.into()).context("--model")?;
    let tokenizer = Arc::new(Tokenizer::from_gguf(target.file.metadata()).context("tokenizer")?);
    let prompt = prompt_tokens(
        &target,
        &tokenizer,
        &args.prompt,
        args.chat,
        args.system.as_deref(),
    )?;
    let config = SessionConfig {
        context: args.context,
        ..SessionConfig::default()
    };
    let drafter = args
        .speculation
        .drafter(&target, &tokenizer, args.context)?;
    let mut generator: Box<dyn Generator> = match drafter {
        Some(drafter) => Box::new(Speculator::new(
            Arc::clone(&target.model),
            config,
            drafter,
            policy,
        )?),
        None => Box::new(Session::new(Arc::clone(&target.model), config)?),
    };
    let mut sampler = Sampler::new(params);
    let mut decoder = StreamDecoder::new(&*tokenizer, true);
    let mut stdout = std::io::stdout().lock();
    let mut write_error = None;
    let (stats, spec) = generator.generate(
        &prompt,
        &mut sampler,
        args.max_tokens,
        &|t| tokenizer.is_end_of_generation(t),
        &mut |t| {
            if tokenizer.is_end_of_generation(t) {
                return ControlFlow::Continue(());
            }
            let piece = decoder.push(t).unwrap_or_default();
            match stdout
                .write_all(piece.as_bytes())
                .and_then(|()| stdout.flush())
            {
                Ok(()) => ControlFlow::Continue(()),
                Err(e) => {
                    write_error = Some(e);
                    ControlFlow::Break(())
                }
            }
        },
    )?;
    if let Some(e) = write_error {
        return Err(e).context("writing to stdout");
    }
    stdout.write_all(decoder.finish().unwrap_or_default().as_bytes())?;
    writeln!(stdout)?;
    eprintln!(
        "prompt: {} tokens at {:.1} tok/s; generated: {} tokens at {:.1} tok/s ({:?}); seed {}",
        stats.prompt_tokens,
        stats.prompt_tokens as f64 / stats.prefill.as_secs_f64(),
        stats.generated_tokens,
        stats.generated_tokens.saturating_sub(1) as f64 / stats.decode.as_secs_f64(),
        stats.stop,
        sampler.seed(),
    );
    if let Some(spec) = spec {
        eprintln!(
            "speculation: {} drafted, {} accepted ({:.0}%), {:.2} tokens per round, {} plain steps; \
             {:.2} s drafting, {:.2} s verifying",
            spec.drafted_tokens(),
            spec.accepted_tokens(),
            100.0 * spec.acceptance_rate(),
            spec.mean_acceptance_length(),
            spec.plain_steps,
            spec.draft_time.as_secs_f64(),
            spec.verify_time.as_secs_f64(),
        );
    }
    Ok(())
}

/// The token ids of a prompt: raw text (a BOS token first exactly when the file asks for one),
/// or with `chat` the user's message, after an optional system message, rendered by the file's
/// own chat template.
pub(crate) fn prompt_tokens<B: Backend>(
    model: &Loaded<B>,
    tokenizer: &Tokenizer,
    text: &str,
    chat: bool,
    system: Option<&str>,
) -> anyhow::Result<Vec<u32>> {
    let text = if chat {
        let template = ChatTemplate::from_gguf(model.file.metadata())
            .context("chat template")?
            .with_context(|| format!("--chat: {} has no tokenizer.chat_template", model.label))?;
        let mut messages = Vec::new();
        if let Some(system) = system {
            messages.push(ChatMessage::new("system", system));
        }
        messages.push(ChatMessage::new("user", text));
        template.render(&messages, true).context("chat template")?
    } else {
        text.to_owned()
    };
    let prompt = tokenizer.encode_prompt(&text, chat);
    if prompt.is_empty() {
        bail!("the prompt is empty and the model adds no BOS token: nothing to continue");
    }
    Ok(prompt)
}
