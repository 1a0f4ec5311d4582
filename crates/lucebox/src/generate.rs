//! `lucebox generate`: stream a continuation of a prompt to stdout.

use std::io::Write;
use std::ops::ControlFlow;

use anyhow::{Context, bail};
use lucebox_engine::{Sampler, SamplingParams, Session, SessionConfig};
use lucebox_tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};

use crate::load::load_cpu_model;

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
    let (file, model) = load_cpu_model(&args.model, args.threads)?;
    let tokenizer = Tokenizer::from_gguf(file.metadata()).context("tokenizer")?;
    let text = if args.chat {
        let template = ChatTemplate::from_gguf(file.metadata())
            .context("chat template")?
            .with_context(|| format!("--chat: {} has no tokenizer.chat_template", args.model))?;
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new("system", system));
        }
        messages.push(ChatMessage::new("user", &args.prompt));
        template.render(&messages, true).context("chat template")?
    } else {
        args.prompt.clone()
    };
    let mut prompt = Vec::new();
    if tokenizer.add_bos()
        && let Some(bos) = tokenizer.bos()
    {
        prompt.push(bos);
    }
    // A chat template writes its special tokens as text; raw prompts are taken literally.
    prompt.extend(tokenizer.encode(&text, args.chat));
    if prompt.is_empty() {
        bail!("--prompt is empty and the model adds no BOS token: nothing to continue");
    }

    let mut session = Session::new(
        model,
        SessionConfig {
            context: args.context,
            ..SessionConfig::default()
        },
    )?;
    let mut sampler = Sampler::new(params);
    let mut decoder = StreamDecoder::new(&tokenizer, true);
    let mut stdout = std::io::stdout().lock();
    let mut write_error = None;
    let stats = session.generate(
        &prompt,
        &mut sampler,
        args.max_tokens,
        |t| tokenizer.is_end_of_generation(t),
        |t| {
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
    Ok(())
}
