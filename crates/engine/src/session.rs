use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lucebox_backend::{Backend, BatchCapacity, RowSampling, TokenRole};
use lucebox_model::Model;

use crate::forward_state::ForwardState;
use crate::{BlockPool, DEFAULT_BLOCK_TOKENS, Error, Sampler, SequenceBlocks};

/// The sizes of a [`Session`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionConfig {
    /// Positions the sequence may hold; capped at the model's trained context.
    pub context: usize,
    /// Positions per KV block.
    pub block_tokens: usize,
    /// The most prompt tokens one forward pass takes; longer prompts are fed in chunks.
    pub prefill_chunk: usize,
    /// The most tokens one [`Session::feed_scored`] call takes, each keeping its logits row: 1
    /// for plain decoding, k + 1 to verify k drafted tokens.
    pub scored_tokens: usize,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            context: 4096,
            block_tokens: DEFAULT_BLOCK_TOKENS,
            prefill_chunk: 512,
            scored_tokens: 1,
        }
    }
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    EndOfGeneration,
    /// `max_tokens` tokens were generated.
    MaxTokens,
    /// The context is full.
    ContextFull,
    /// The caller's callback asked to stop.
    Caller,
}

impl StopReason {
    /// Why a generation stops right after its `generated`-th token, if it does: the token is
    /// an end-of-generation token (`is_end`), or the `max_tokens` limit is reached. The one rule
    /// that sessions, speculation and the batcher share.
    pub(crate) fn after_token(is_end: bool, generated: usize, max_tokens: usize) -> Option<Self> {
        if is_end {
            Some(StopReason::EndOfGeneration)
        } else if generated >= max_tokens {
            Some(StopReason::MaxTokens)
        } else {
            None
        }
    }
}

/// What one generation did and how long it took.
#[derive(Clone, Copy, Debug)]
pub struct GenerationStats {
    /// Prompt tokens fed.
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV positions were kept from the previous sequence, not fed again.
    pub reused_tokens: usize,
    /// Tokens generated (an end-of-generation token included).
    pub generated_tokens: usize,
    /// Time to feed the prompt and sample the first token.
    pub prefill: Duration,
    /// Time for the remaining tokens.
    pub decode: Duration,
    /// Why it stopped.
    pub stop: StopReason,
}

/// One sequence on one model: its KV blocks, its token history and reusable buffers. Feeding
/// and sampling allocate nothing once the buffers have reached their sizes.
pub struct Session<B: Backend> {
    model: Arc<Model<B>>,
    config: SessionConfig,
    state: ForwardState<B>,
    sequence: SequenceBlocks,
    tokens: Vec<u32>,
    /// How many leading positions were fed in the prompt role; the others were fed as
    /// generated tokens. Where the backend gives prompt rows other arithmetic, a new prompt
    /// keeps only a shared prefix fed in its own role, so that its KV is what a fresh session
    /// would compute.
    prompt_positions: usize,
    /// The logits rows of the last forward pass, on the host once read.
    logits: Vec<f32>,
    picks: Vec<u32>,
    /// The rows drawn on the device: their requests, penalised tokens and tokens.
    requests: Vec<RowSampling>,
    penalised: Vec<(u32, u32)>,
    drawn: Vec<Option<u32>>,
}

impl<B: Backend> std::fmt::Debug for Session<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("config", &self.config)
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

impl<B: Backend> Session<B> {
    /// A session with an empty sequence.
    pub fn new(model: Arc<Model<B>>, config: SessionConfig) -> Result<Self, Error> {
        if config.block_tokens == 0
            || config.prefill_chunk == 0
            || config.context == 0
            || config.scored_tokens == 0
        {
            return Err(Error::InvalidParameter {
                name: "session",
                why: format!("{config:?} has a zero size"),
            });
        }
        let context = config.context.min(model.config().context_length);
        let config = SessionConfig { context, ..config };
        let blocks = context.div_ceil(config.block_tokens);
        let capacity = BatchCapacity {
            tokens: config.prefill_chunk.max(config.scored_tokens),
            sequences: 1,
            blocks,
            logits: config.scored_tokens,
        };
        let state = ForwardState::new(
            &model,
            BlockPool::new(blocks, config.block_tokens),
            capacity,
        )?;
        let vocab = model.config().vocab;
        Ok(Self {
            model,
            config,
            state,
            sequence: SequenceBlocks::new(),
            tokens: Vec::with_capacity(context),
            prompt_positions: 0,
            logits: vec![0.0; vocab * config.scored_tokens],
            picks: vec![0; config.scored_tokens],
            requests: Vec::with_capacity(config.scored_tokens),
            penalised: Vec::new(),
            drawn: Vec::with_capacity(config.scored_tokens),
        })
    }

    /// The effective configuration (context capped at the model's).
    pub fn config(&self) -> SessionConfig {
        self.config
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model<B>> {
        &self.model
    }

    /// Every token fed so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Forgets the sequence, keeping the buffers.
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// Forgets every token from `len` on, and their KV positions; nothing is recomputed, so
    /// dropping rejected draft tokens costs nothing. A no-op when `len` is not shorter.
    pub fn truncate(&mut self, len: usize) {
        self.sequence.truncate(&mut self.state.pool, len);
        self.tokens.truncate(len);
        self.prompt_positions = self.prompt_positions.min(len);
    }

    /// Makes the sequence the prompt `tokens`, keeping the KV positions of the prefix it
    /// shares with the current one and feeding the rest as prompt tokens. The last token is
    /// always fed again, so its logits are ready for [`sample`](Self::sample). A prompt that
    /// extends the previous one costs only the new tokens (where the backend gives prompt rows
    /// other arithmetic, the previous generated tokens are fed again as prompt tokens, and
    /// nothing is kept that was fed in the other role). Returns how many positions were kept.
    pub fn feed_reusing(&mut self, tokens: &[u32]) -> Result<usize, Error> {
        let backend = self.model.backend();
        let role = backend.prompt_role(tokens.len());
        let mut shared = self
            .shared_prefix(tokens)
            .min(tokens.len().saturating_sub(1));
        if backend.prompt_rows_from().is_some() {
            shared = match role {
                TokenRole::Prompt => shared.min(self.prompt_positions),
                TokenRole::Generated if self.prompt_positions > 0 => 0,
                TokenRole::Generated => shared,
            };
        }
        self.truncate(shared);
        self.feed_as(&tokens[shared..], role)?;
        Ok(shared)
    }

    /// How many leading tokens `tokens` shares with the sequence.
    fn shared_prefix(&self, tokens: &[u32]) -> usize {
        self.tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// Appends generated `tokens` to the sequence, in chunks of at most `prefill_chunk`, and
    /// keeps the logits of the last one for [`sample`](Self::sample).
    pub fn feed(&mut self, tokens: &[u32]) -> Result<(), Error> {
        self.feed_as(tokens, TokenRole::Generated)
    }

    /// [`feed`](Self::feed) for a whole prompt, `tokens`, in the role a prompt of their length
    /// takes on this backend (`Backend::prompt_role`).
    pub fn feed_prompt(&mut self, tokens: &[u32]) -> Result<(), Error> {
        self.feed_as(tokens, self.model.backend().prompt_role(tokens.len()))
    }

    fn feed_as(&mut self, tokens: &[u32], role: TokenRole) -> Result<(), Error> {
        // Checked for the whole input first, so a prompt that does not fit changes nothing.
        self.check_room(tokens.len())?;
        for chunk in tokens.chunks(self.config.prefill_chunk) {
            self.forward_chunk(chunk, role, false)?;
        }
        Ok(())
    }

    /// Refuses `extra` more tokens when the context cannot hold them.
    fn check_room(&self, extra: usize) -> Result<(), Error> {
        let total = self.tokens.len() + extra;
        if total > self.config.context {
            return Err(Error::ContextFull {
                tokens: total,
                context: self.config.context,
            });
        }
        Ok(())
    }

    /// One forward pass over `chunk`, tokens in `role`, which must fit in the context, keeping
    /// the logits of every token when `score_all`, else of the last one.
    fn forward_chunk(
        &mut self,
        chunk: &[u32],
        role: TokenRole,
        score_all: bool,
    ) -> Result<(), Error> {
        let reserved = self.sequence.reserve(&mut self.state.pool, chunk.len());
        assert!(reserved, "the pool holds the whole context");
        self.state.batch.clear();
        let seq = self.state.batch.push_sequence(self.sequence.table());
        let start = self.sequence.len();
        for (j, &token) in chunk.iter().enumerate() {
            let scored = score_all || j + 1 == chunk.len();
            self.state
                .batch
                .push_token(seq, token, (start + j) as u32, role, scored);
        }
        self.state.forward(&self.model)?;
        self.sequence.advance(&self.state.pool, chunk.len());
        if role == TokenRole::Prompt && self.prompt_positions == self.tokens.len() {
            self.prompt_positions += chunk.len();
        }
        self.tokens.extend_from_slice(chunk);
        Ok(())
    }

    /// Appends `tokens` (at most `scored_tokens` of them) in one forward pass that keeps every
    /// token's logits row: row `i` predicts the token after `tokens[i]`. Speculative decoding
    /// verifies drafts this way; each row equals what feeding one token at a time would give.
    pub fn feed_scored(&mut self, tokens: &[u32]) -> Result<(), Error> {
        if tokens.is_empty() || tokens.len() > self.config.scored_tokens {
            return Err(Error::InvalidParameter {
                name: "feed_scored",
                why: format!(
                    "{} tokens, expected 1 to {}",
                    tokens.len(),
                    self.config.scored_tokens
                ),
            });
        }
        self.check_room(tokens.len())?;
        self.forward_chunk(tokens, TokenRole::Generated, true)
    }

    /// The number of logits rows the last forward pass kept.
    pub fn logits_rows(&self) -> usize {
        self.state.workspace.logits_rows()
    }

    /// Copies the logits rows of the last forward pass to the host and returns them, row after
    /// row of vocabulary size, with every token fed so far (the history penalties look at).
    pub fn read_logits(&mut self) -> Result<(&mut [f32], &[u32]), Error> {
        let rows = self.logits_rows();
        let out = &mut self.logits[..rows * self.model.config().vocab];
        self.model
            .backend()
            .read_rows(self.state.workspace.logits(), rows, out)?;
        Ok((out, &self.tokens))
    }

    /// The most likely token of each logits row of the last forward pass, computed where the
    /// logits are (on the device for a GPU backend), with ties going to the lowest id.
    pub fn argmax_rows(&mut self) -> Result<&[u32], Error> {
        let picks = &mut self.picks[..self.state.workspace.logits_rows()];
        self.model
            .backend()
            .argmax_rows(self.state.workspace.logits(), picks)?;
        Ok(picks)
    }

    /// Copies the logits of the last token fed into `out` (one vocabulary-sized row).
    pub fn last_logits(&mut self, out: &mut [f32]) -> Result<(), Error> {
        let vocab = self.model.config().vocab;
        let (rows, _) = self.read_logits()?;
        out.copy_from_slice(&rows[rows.len() - vocab..]);
        Ok(())
    }

    /// Chooses the next token from the logits of the last token fed. A backend that samples
    /// where the logits are does ([`Backend::sample_rows`]; greedy sampling without penalties
    /// through its argmax), which spares copying the logits to the host.
    pub fn sample(&mut self, sampler: &mut Sampler) -> Result<u32, Error> {
        if sampler.params().is_plain_greedy() {
            return Ok(*self
                .argmax_rows()?
                .last()
                .expect("a forward pass keeps a row"));
        }
        if self.model.backend().samples_rows() {
            let last = self.logits_rows() - 1;
            self.draw_on_device(sampler, last)?;
            return Ok(self.picks[last]);
        }
        self.sample_on_host(sampler)
    }

    /// The token `sampler` draws from each logits row of the last forward pass, each row's
    /// history being the tokens fed up to its own, drawn where the logits are: what verifying
    /// a certain draft takes ([`Backend::sample_rows`], which the backend must offer). The
    /// rows' uniform numbers are taken in row order, as drawing them one by one would.
    pub fn draw_rows(&mut self, sampler: &mut Sampler) -> Result<&[u32], Error> {
        self.draw_on_device(sampler, 0)?;
        Ok(&self.picks[..self.logits_rows()])
    }

    /// Draws logits rows `first..` into `self.picks` on the device; rows its sampler leaves to
    /// the host are copied back and drawn there with their requests' uniform numbers.
    fn draw_on_device(&mut self, sampler: &mut Sampler, first: usize) -> Result<(), Error> {
        let rows = self.logits_rows();
        let fed_before = self.tokens.len() - rows;
        self.requests.clear();
        self.penalised.clear();
        for row in first..rows {
            let history = &self.tokens[..fed_before + row + 1];
            let request = sampler.row_sampling(row, history, &[], &mut self.penalised);
            self.requests.push(request);
        }
        self.drawn.clear();
        self.drawn.resize(self.requests.len(), None);
        let backend = self.model.backend();
        backend.sample_rows(
            self.state.workspace.logits_mut(),
            &self.requests,
            &self.penalised,
            &mut self.drawn,
        )?;
        for (request, drawn) in self.requests.iter().zip(&self.drawn) {
            self.picks[request.row] = drawn.unwrap_or(0);
        }
        if self.drawn.iter().all(Option::is_some) {
            return Ok(());
        }
        let vocab = self.model.config().vocab;
        let logits = &mut self.logits[..rows * vocab];
        backend.read_rows(self.state.workspace.logits(), rows, logits)?;
        for (request, drawn) in self.requests.iter().zip(&self.drawn) {
            if drawn.is_none() {
                let row = &logits[request.row * vocab..(request.row + 1) * vocab];
                self.picks[request.row] = sampler.sample_penalised(row, request.uniform);
            }
        }
        Ok(())
    }

    /// Chooses the next token on the host from the logits of the last token fed, copied back,
    /// whatever the backend can do: what [`sample`](Self::sample) does without a device
    /// sampler, and the baseline to measure one against.
    pub fn sample_on_host(&mut self, sampler: &mut Sampler) -> Result<u32, Error> {
        let vocab = self.model.config().vocab;
        let (rows, history) = self.read_logits()?;
        let last = rows.len() - vocab;
        Ok(sampler.sample(&mut rows[last..], history))
    }

    /// Makes the sequence `prompt` (the KV positions of a prefix it shares with the current
    /// sequence are kept, as by [`feed_reusing`](Self::feed_reusing)), then samples and feeds
    /// tokens until `max_tokens`, an end-of-generation token (`is_end`), a full context, or
    /// `on_token` returning `Break`. Every generated token is passed to `on_token`, an
    /// end-of-generation token included.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        max_tokens: usize,
        is_end: impl Fn(u32) -> bool,
        on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> Result<GenerationStats, Error> {
        if prompt.is_empty() {
            return Err(Error::InvalidParameter {
                name: "prompt",
                why: "is empty".into(),
            });
        }
        let mut out = TokenSink::new(prompt.len(), max_tokens, is_end, on_token);
        if max_tokens == 0 {
            return Ok(out.finish());
        }
        let reused = self.feed_reusing(prompt)?;
        let mut token = self.sample(sampler)?;
        out.prefill_done(reused);
        while out.push(token) {
            if self.tokens.len() == self.config.context {
                return Ok(out.stop(StopReason::ContextFull));
            }
            self.feed(&[token])?;
            token = self.sample(sampler)?;
        }
        Ok(out.finish())
    }
}

/// Where generated tokens go: it passes them to the caller, counts and times them, and says
/// when generation must stop. Plain and speculative generation share it, so they stop alike.
pub(crate) struct TokenSink<E, F> {
    stats: GenerationStats,
    max_tokens: usize,
    started: Instant,
    decode_started: Option<Instant>,
    is_end: E,
    on_token: F,
}

impl<E: Fn(u32) -> bool, F: FnMut(u32) -> ControlFlow<()>> TokenSink<E, F> {
    /// A sink for a generation of up to `max_tokens` after a prompt of `prompt_tokens`,
    /// starting its clock now.
    pub(crate) fn new(prompt_tokens: usize, max_tokens: usize, is_end: E, on_token: F) -> Self {
        Self {
            stats: GenerationStats {
                prompt_tokens,
                reused_tokens: 0,
                generated_tokens: 0,
                prefill: Duration::ZERO,
                decode: Duration::ZERO,
                stop: StopReason::MaxTokens,
            },
            max_tokens,
            started: Instant::now(),
            decode_started: None,
            is_end,
            on_token,
        }
    }

    /// Marks the end of the prefill: the first token is chosen.
    /// The prompt is fed (`reused` of its tokens kept from before) and the first token sampled.
    pub(crate) fn prefill_done(&mut self, reused: usize) {
        self.stats.reused_tokens = reused;
        self.stats.prefill = self.started.elapsed();
        self.decode_started = Some(Instant::now());
    }

    /// Tokens that may still be generated.
    pub(crate) fn remaining(&self) -> usize {
        self.max_tokens - self.stats.generated_tokens
    }

    /// Passes `token` to the caller; `false` when generation must stop after it.
    pub(crate) fn push(&mut self, token: u32) -> bool {
        self.stats.generated_tokens += 1;
        if (self.on_token)(token).is_break() {
            self.stats.stop = StopReason::Caller;
            return false;
        }
        let generated = self.stats.generated_tokens;
        match StopReason::after_token((self.is_end)(token), generated, self.max_tokens) {
            Some(reason) => {
                self.stats.stop = reason;
                false
            }
            None => true,
        }
    }

    /// The statistics of a generation stopped for `reason`.
    pub(crate) fn stop(mut self, reason: StopReason) -> GenerationStats {
        self.stats.stop = reason;
        self.finish()
    }

    /// The statistics, with the decode time up to now.
    pub(crate) fn finish(mut self) -> GenerationStats {
        self.stats.decode = self.decode_started.map_or(Duration::ZERO, |t| t.elapsed());
        self.stats
    }
}
