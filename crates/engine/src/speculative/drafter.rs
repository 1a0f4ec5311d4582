//! What a drafter is, and the two the engine ships: a smaller model, and n-gram lookup.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use lucebox_backend::{Backend, BatchCapacity, TokenRole};
use lucebox_model::Model;

use super::renames::{Renames, Spelling, is_name_char};
use crate::forward_state::ForwardState;
use crate::{
    BlockPool, DEFAULT_BLOCK_TOKENS, Distribution, Error, Sampler, SamplingParams, SequenceBlocks,
    SessionConfig,
};

/// Proposed tokens, each with the distribution it was drawn from. Buffers are kept across
/// rounds, so proposing allocates nothing once warm.
#[derive(Debug, Default)]
pub struct Draft {
    tokens: Vec<u32>,
    /// `from[i]` is the distribution `tokens[i]` was drawn from; slots beyond `tokens.len()`
    /// are spare buffers.
    from: Vec<Distribution>,
}

impl Draft {
    /// Forgets the proposed tokens.
    pub(crate) fn clear(&mut self) {
        self.tokens.clear();
    }

    /// Keeps the first `len` tokens.
    pub(crate) fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
    }

    /// Proposes `token` with certainty (a greedy or a lookup drafter).
    pub fn push_certain(&mut self, token: u32) {
        self.slot().set_certain(token);
        self.tokens.push(token);
    }

    /// Proposes `token`, drawn from `from`.
    pub fn push_drawn(&mut self, token: u32, from: &Distribution) {
        self.slot().copy_from(from);
        self.tokens.push(token);
    }

    fn slot(&mut self) -> &mut Distribution {
        if self.from.len() == self.tokens.len() {
            self.from.push(Distribution::default());
        }
        &mut self.from[self.tokens.len()]
    }

    /// The proposed tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The number of proposed tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether nothing was proposed.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Whether every token was proposed with certainty: then the target's own draw at each
    /// row decides (`accept`).
    pub fn is_certain(&self) -> bool {
        self.from[..self.tokens.len()]
            .iter()
            .all(Distribution::is_certain)
    }

    /// The distribution the `i`-th token was drawn from.
    pub fn distribution(&self, i: usize) -> &Distribution {
        &self.from[..self.tokens.len()][i]
    }
}

/// What a drafter sees of a sequence when it proposes.
///
/// The struct is open to new fields: a block drafter conditioned on the target's hidden states
/// (DFlash-style) gets them here, as a field filled by the engine's verify pass, without any
/// change to the drafters that ignore it.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct DraftInput<'a> {
    /// Which sequence this is, as given to [`Drafter::start`]: a drafter that keeps state
    /// keeps it per sequence.
    pub sequence: u64,
    /// Every token of the sequence so far, prompt included; the last one has not yet been fed
    /// to the target.
    pub tokens: &'a [u32],
}

impl<'a> DraftInput<'a> {
    /// The input for `sequence`, whose tokens so far are `tokens`.
    pub fn new(sequence: u64, tokens: &'a [u32]) -> Self {
        Self { sequence, tokens }
    }
}

/// One sequence's part of a [`Drafter::propose`] call.
#[derive(Debug)]
pub struct Proposal<'a> {
    /// The sequence.
    pub input: DraftInput<'a>,
    /// The most tokens to add to `draft` in this call.
    pub max: usize,
    /// The round's draft so far: tokens an earlier call proposed, which continue
    /// `input.tokens`. New tokens are pushed after them.
    pub draft: &'a mut Draft,
}

/// Proposes the tokens a target model is likely to produce next.
///
/// A proposal is only ever a guess: the verifier accepts a drafted token with probability
/// min(1, p/q), where q is the distribution the drafter drew it from, so any drafter keeps the
/// output exact. Better guesses only make it faster. Drafters keep whatever state they like
/// between calls (a KV cache, an index), per sequence, and must cope with a sequence having
/// changed since the last call: tokens rejected, others appended. Every call takes many
/// sequences at once, so that a batch's drafts cost one drafter pass per drafted position, not
/// one per sequence; a lone sequence is a call of one.
pub trait Drafter {
    /// A short name for statistics and logs.
    fn kind(&self) -> &'static str;

    /// Starts following `sequence`, sampled with `params`. A sequence started before may keep
    /// what the drafter holds for it: a model drafter's next proposal reuses whatever prefix
    /// it shares, while the n-gram drafter forgets what it learned from the old text.
    fn start(&mut self, sequence: u64, params: &SamplingParams) -> Result<(), Error>;

    /// Forgets `sequence`, which has ended, and frees what the drafter kept for it.
    fn finish(&mut self, sequence: u64) {
        let _ = sequence;
    }

    /// Whether the drafter needs no catch-up (its `catch_up` does nothing) and proposes at a
    /// cost not worth pricing, as a look-up in the sequence does. A batch has such a drafter
    /// propose for every sequence before choosing the rows its pass verifies; a drafter that
    /// runs a model is told how many tokens each sequence gets first.
    fn proposes_first(&self) -> bool {
        false
    }

    /// Brings whatever state the drafter keeps for each input's sequence up to date with its
    /// tokens except the last one; called before [`propose`](Self::propose) and timed apart
    /// from it, so it returns once that work has run (a drafter on a device waits for it).
    /// Between drafting rounds it feeds a round's last token, part of the price of drafting.
    /// After a new prompt, or plain steps with speculation off, it is a prefill: the engine
    /// prices it per token and drafts only when what drafting saves can repay it.
    fn catch_up(&mut self, inputs: &[DraftInput<'_>]) -> Result<(), Error> {
        let _ = inputs;
        Ok(())
    }

    /// How many tokens [`catch_up`](Self::catch_up) would feed for `input`: the price of
    /// drafting now beyond the proposal itself, which the draft-length control weighs.
    fn unseen(&self, input: &DraftInput<'_>) -> usize {
        let _ = input;
        0
    }

    /// Proposes up to `max` more tokens for each proposal's sequence, continuing its draft.
    /// Proposing fewer, or none, is always allowed.
    fn propose(&mut self, proposals: &mut [Proposal<'_>]) -> Result<(), Error>;
}

/// The sizes of a [`ModelDrafter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrafterConfig {
    /// Positions one sequence may hold; capped at the model's trained context.
    pub context: usize,
    /// The most sequences one forward pass drafts for.
    pub sequences: usize,
    /// Blocks in the KV pool, shared by the sequences followed and its prefix cache.
    pub kv_blocks: usize,
    /// Positions per KV block.
    pub block_tokens: usize,
    /// The most tokens one forward pass takes: a longer catch-up is fed in chunks.
    pub pass_tokens: usize,
}

impl DrafterConfig {
    /// Room for one sequence of `context` positions: the drafter of a lone session.
    pub fn one_sequence(context: usize) -> Self {
        Self {
            context,
            sequences: 1,
            kv_blocks: context.div_ceil(DEFAULT_BLOCK_TOKENS),
            block_tokens: DEFAULT_BLOCK_TOKENS,
            pass_tokens: SessionConfig::default().prefill_chunk,
        }
    }
}

/// A smaller model with the target's tokenizer, sampled with each sequence's own parameters
/// so that its proposals follow the same transforms as the target's choices.
///
/// It follows many sequences in one pool of KV blocks, as the target's batch engine does, and
/// drafts a position of every sequence of a call in one forward pass. Full blocks of the
/// sequences' tokens (drafts never) go to a prefix cache, so a prompt another sequence shares
/// is not fed again. When the pool runs out, the sequences least recently drafted for lose
/// their blocks, and a sequence that still finds no room drafts nothing.
pub struct ModelDrafter<B: Backend> {
    model: Arc<Model<B>>,
    config: DrafterConfig,
    state: ForwardState<B>,
    followed: Vec<Followed>,
    /// Counts the calls that feed the model; each followed sequence notes the last one it was
    /// part of, which decides whose blocks go first.
    calls: u64,
    /// This pass's sequences, in batch order: their index in the call and the tokens each is
    /// fed.
    rows: Vec<(usize, usize)>,
    /// The logits rows of the last pass, on the host once read.
    logits: Vec<f32>,
    picks: Vec<u32>,
}

/// What the drafter holds for one sequence.
struct Followed {
    sequence: u64,
    sampler: Sampler,
    /// The tokens its KV positions hold.
    tokens: Vec<u32>,
    blocks: SequenceBlocks,
    last_call: u64,
}

/// A sequence as a drafter call sees it: its tokens, then its draft so far.
#[derive(Clone, Copy)]
struct Sequence<'a> {
    followed: usize,
    tokens: &'a [u32],
    draft: &'a [u32],
}

impl Sequence<'_> {
    fn len(&self) -> usize {
        self.tokens.len() + self.draft.len()
    }

    fn token(&self, i: usize) -> u32 {
        match i.checked_sub(self.tokens.len()) {
            None => self.tokens[i],
            Some(d) => self.draft[d],
        }
    }

    /// How many leading tokens `held` shares with the sequence.
    fn shared_with(&self, held: &[u32]) -> usize {
        let in_tokens = common_prefix(held, self.tokens);
        if in_tokens < self.tokens.len() {
            return in_tokens;
        }
        in_tokens + common_prefix(&held[in_tokens..], self.draft)
    }
}

/// How many leading elements `a` and `b` share. Every step asks this of each sequence's whole
/// history, so whole chunks are compared first, as slices (a `memcmp`).
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    const CHUNK: usize = 64;
    let len = a.len().min(b.len());
    let equal_chunks = a[..len]
        .chunks(CHUNK)
        .zip(b[..len].chunks(CHUNK))
        .take_while(|(x, y)| x == y)
        .count();
    let start = (equal_chunks * CHUNK).min(len);
    start
        + a[start..len]
            .iter()
            .zip(&b[start..len])
            .take_while(|(x, y)| x == y)
            .count()
}

impl<B: Backend> std::fmt::Debug for ModelDrafter<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelDrafter")
            .field("config", &self.config)
            .field("followed", &self.followed.len())
            .finish()
    }
}

/// Whether a sequence of `len` tokens leaves room in `context` positions to draft after them.
fn fits(len: usize, context: usize) -> bool {
    len > 0 && len < context
}

/// Mixed into the request's seed for the drafter's own random stream, so that the drafter's
/// draws do not repeat the verifier's.
const DRAFTER_SEED_SALT: u64 = 0x6472_6166_7465_7221;

impl<B: Backend> ModelDrafter<B> {
    /// A drafter running `model` for one sequence of up to `context` positions.
    pub fn new(model: Arc<Model<B>>, context: usize) -> Result<Self, Error> {
        Self::with_config(model, DrafterConfig::one_sequence(context))
    }

    /// A drafter running `model` with the sizes of `config`.
    pub fn with_config(model: Arc<Model<B>>, config: DrafterConfig) -> Result<Self, Error> {
        if config.context == 0
            || config.sequences == 0
            || config.kv_blocks == 0
            || config.block_tokens == 0
            || config.pass_tokens < config.sequences
        {
            return Err(Error::InvalidParameter {
                name: "drafter",
                why: format!("{config:?} has a zero size or passes too short for its sequences"),
            });
        }
        let context = config.context.min(model.config().context_length);
        let config = DrafterConfig { context, ..config };
        let state = ForwardState::new(
            &model,
            // Every position is fed as generated (`catch_up_on`): one role, no role keys.
            BlockPool::with_prefix_cache(config.kv_blocks, config.block_tokens, false),
            BatchCapacity {
                tokens: config.pass_tokens,
                sequences: config.sequences,
                blocks: config.sequences * context.div_ceil(config.block_tokens),
                logits: config.sequences,
            },
        )?;
        let vocab = model.config().vocab;
        Ok(Self {
            model,
            config,
            state,
            followed: Vec::new(),
            calls: 0,
            rows: Vec::with_capacity(config.sequences),
            logits: vec![0.0; vocab * config.sequences],
            picks: vec![0; config.sequences],
        })
    }

    /// The index of `sequence` in `followed`, following it from now on if it was not.
    fn follow_index(&mut self, sequence: u64) -> usize {
        match self.followed.iter().position(|f| f.sequence == sequence) {
            Some(i) => i,
            None => {
                self.followed.push(Followed {
                    sequence,
                    sampler: Sampler::new(SamplingParams::default()),
                    tokens: Vec::new(),
                    blocks: SequenceBlocks::new(),
                    last_call: 0,
                });
                self.followed.len() - 1
            }
        }
    }

    /// Reserves room for `count` more positions of `followed[index]`, taking the blocks of
    /// sequences outside this call, least recently drafted for first, while the pool is short;
    /// `false` when even that leaves too little.
    fn reserve(&mut self, index: usize, count: usize) -> bool {
        loop {
            if self.followed[index]
                .blocks
                .reserve(&mut self.state.pool, count)
            {
                return true;
            }
            let victim = self
                .followed
                .iter()
                .enumerate()
                .filter(|(i, f)| {
                    *i != index && f.last_call < self.calls && !f.blocks.table().is_empty()
                })
                .min_by_key(|(_, f)| f.last_call)
                .map(|(i, _)| i);
            let Some(victim) = victim else {
                return false;
            };
            let victim = &mut self.followed[victim];
            victim.blocks.release(&mut self.state.pool);
            victim.tokens.clear();
        }
    }

    /// Brings each sequence's cache to hold its first `len() - 1` tokens, keeping the prefix
    /// it shares with what the cache holds (or, past that, with the prefix cache), in passes
    /// of at most `pass_tokens` tokens that keep no logits. A sequence the pool has no room
    /// for is left out of `ready`.
    fn catch_up_on(
        &mut self,
        sequences: &[Sequence<'_>],
        ready: &mut Vec<bool>,
    ) -> Result<(), Error> {
        ready.clear();
        for s in sequences {
            let hold = s.len() - 1;
            let f = &mut self.followed[s.followed];
            f.last_call = self.calls;
            let shared = s.shared_with(&f.tokens).min(hold);
            if shared < f.blocks.final_len(&self.state.pool) {
                f.blocks.release(&mut self.state.pool);
            } else {
                f.blocks.truncate(&mut self.state.pool, shared);
            }
            f.tokens.truncate(f.blocks.len());
            if f.tokens.is_empty() {
                // Only the sequence's own tokens were cached, never drafts.
                let own = &s.tokens[..hold.min(s.tokens.len())];
                let reused = f.blocks.share_cached_prefix(&mut self.state.pool, own, 0);
                f.tokens.extend_from_slice(&own[..reused]);
            }
            ready.push(true);
        }
        loop {
            self.state.batch.clear();
            self.rows.clear();
            let mut room = self.config.pass_tokens;
            for (i, s) in sequences.iter().enumerate() {
                let behind = s.len() - 1 - self.followed[s.followed].tokens.len();
                if !ready[i] || behind == 0 {
                    continue;
                }
                if room == 0 || self.rows.len() == self.config.sequences {
                    break;
                }
                let count = behind.min(room);
                if !self.reserve(s.followed, count) {
                    ready[i] = false;
                    continue;
                }
                let f = &self.followed[s.followed];
                let seq = self.state.batch.push_sequence(f.blocks.table());
                let start = f.tokens.len();
                // The drafter feeds every token as generated, its prompts too: its passes mix
                // sequences' catching up in any order, and one role keeps each position's KV
                // the same in all of them. Its proposals decide speed, never the output.
                for position in start..start + count {
                    self.state.batch.push_token(
                        seq,
                        s.token(position),
                        position as u32,
                        TokenRole::Generated,
                        false,
                    );
                }
                self.rows.push((i, count));
                room -= count;
            }
            if self.rows.is_empty() {
                break;
            }
            self.state.forward(&self.model)?;
            for &(i, count) in &self.rows {
                let s = &sequences[i];
                let f = &mut self.followed[s.followed];
                let start = f.tokens.len();
                f.blocks.advance(&self.state.pool, count);
                f.tokens.extend((start..start + count).map(|p| s.token(p)));
            }
        }
        for (s, _) in sequences.iter().zip(ready.iter()).filter(|(_, r)| **r) {
            let f = &mut self.followed[s.followed];
            if f.tokens.len() <= s.tokens.len() {
                f.blocks
                    .cache_full_blocks(&mut self.state.pool, &f.tokens, 0);
            }
        }
        Ok(())
    }

    /// One forward pass feeding each sequence its last token (its cache holds the rest) and
    /// drawing the token after it into its proposal's draft; a sequence the pool has no room
    /// for is marked `dropped`.
    fn draft_pass(
        &mut self,
        feeds: &[Feed],
        proposals: &mut [Proposal<'_>],
        dropped: &mut [bool],
    ) -> Result<(), Error> {
        let mut next = 0;
        while next < feeds.len() {
            self.state.batch.clear();
            self.rows.clear();
            while next < feeds.len() && self.rows.len() < self.config.sequences {
                let feed = &feeds[next];
                next += 1;
                if !self.reserve(feed.followed, 1) {
                    dropped[feed.proposal] = true;
                    continue;
                }
                let f = &self.followed[feed.followed];
                let seq = self.state.batch.push_sequence(f.blocks.table());
                self.state.batch.push_token(
                    seq,
                    feed.token,
                    feed.position as u32,
                    TokenRole::Generated,
                    true,
                );
                self.rows.push((next - 1, 1));
            }
            if self.rows.is_empty() {
                continue;
            }
            self.state.forward(&self.model)?;
            let rows = self.rows.len();
            let greedy = |f: &Followed| f.sampler.params().is_plain_greedy();
            let followed = |&(i, _): &(usize, usize)| &self.followed[feeds[i].followed];
            let backend = self.model.backend();
            if self.rows.iter().map(followed).any(greedy) {
                backend.argmax_rows(self.state.workspace.logits(), &mut self.picks[..rows])?;
            }
            let vocab = self.model.config().vocab;
            if !self.rows.iter().map(followed).all(greedy) {
                let out = &mut self.logits[..rows * vocab];
                backend.read_rows(self.state.workspace.logits(), rows, out)?;
            }
            for (row, &(i, _)) in self.rows.iter().enumerate() {
                let feed = &feeds[i];
                let f = &mut self.followed[feed.followed];
                f.blocks.advance(&self.state.pool, 1);
                f.tokens.push(feed.token);
                let draft = &mut *proposals[feed.proposal].draft;
                if greedy(f) {
                    draft.push_certain(self.picks[row]);
                } else {
                    let logits = &mut self.logits[row * vocab..(row + 1) * vocab];
                    let (token, from) = f.sampler.sample_with_distribution(logits, &f.tokens);
                    draft.push_drawn(token, from);
                }
            }
        }
        Ok(())
    }
}

/// A sequence's row in a drafting pass: its last token, fed at `position`.
struct Feed {
    followed: usize,
    token: u32,
    position: usize,
    proposal: usize,
}

impl<B: Backend> Drafter for ModelDrafter<B> {
    fn kind(&self) -> &'static str {
        "model"
    }

    fn start(&mut self, sequence: u64, params: &SamplingParams) -> Result<(), Error> {
        let seed = params.seed.map(|s| s ^ DRAFTER_SEED_SALT);
        let index = self.follow_index(sequence);
        self.followed[index].sampler = Sampler::new(SamplingParams {
            seed,
            ..params.clone()
        });
        Ok(())
    }

    fn finish(&mut self, sequence: u64) {
        if let Some(i) = self.followed.iter().position(|f| f.sequence == sequence) {
            let mut gone = self.followed.swap_remove(i);
            gone.blocks.release(&mut self.state.pool);
        }
    }

    fn catch_up(&mut self, inputs: &[DraftInput<'_>]) -> Result<(), Error> {
        self.calls += 1;
        let context = self.config.context;
        let sequences: Vec<Sequence<'_>> = inputs
            .iter()
            .filter(|input| fits(input.tokens.len(), context))
            .map(|input| Sequence {
                followed: self.follow_index(input.sequence),
                tokens: input.tokens,
                draft: &[],
            })
            .collect();
        self.catch_up_on(&sequences, &mut Vec::new())?;
        // Nothing reads the catch-up's result: without the wait, a device would still be
        // running it when `propose` starts, and its time would count as drafting.
        self.model.backend().synchronize()?;
        Ok(())
    }

    fn unseen(&self, input: &DraftInput<'_>) -> usize {
        if !fits(input.tokens.len(), self.config.context) {
            return 0;
        }
        let behind = input.tokens.len() - 1;
        match self.followed.iter().find(|f| f.sequence == input.sequence) {
            Some(f) => behind - common_prefix(&f.tokens, input.tokens).min(behind),
            None => behind,
        }
    }

    /// Catches up what is new (normally nothing, or a round's last token when `catch_up` was
    /// skipped), then one pass per further drafted position, for all the proposals at once.
    fn propose(&mut self, proposals: &mut [Proposal<'_>]) -> Result<(), Error> {
        self.calls += 1;
        let context = self.config.context;
        let first: Vec<usize> = proposals.iter().map(|p| p.draft.len()).collect();
        let followed: Vec<usize> = proposals
            .iter()
            .map(|p| self.follow_index(p.input.sequence))
            .collect();
        let mut dropped = vec![false; proposals.len()];
        let mut ready = Vec::with_capacity(proposals.len());
        let mut feeds = Vec::with_capacity(proposals.len());
        loop {
            let drafting: Vec<usize> = (0..proposals.len())
                .filter(|&i| {
                    let p = &proposals[i];
                    let len = p.input.tokens.len() + p.draft.len();
                    !dropped[i] && p.draft.len() - first[i] < p.max && fits(len, context)
                })
                .collect();
            if drafting.is_empty() {
                return Ok(());
            }
            let sequences: Vec<Sequence<'_>> = drafting
                .iter()
                .map(|&i| Sequence {
                    followed: followed[i],
                    tokens: proposals[i].input.tokens,
                    draft: proposals[i].draft.tokens(),
                })
                .collect();
            self.catch_up_on(&sequences, &mut ready)?;
            feeds.clear();
            for ((s, &i), &caught_up) in sequences.iter().zip(&drafting).zip(&ready) {
                dropped[i] |= !caught_up;
                if caught_up {
                    feeds.push(Feed {
                        followed: s.followed,
                        token: s.token(s.len() - 1),
                        position: s.len() - 1,
                        proposal: i,
                    });
                }
            }
            drop(sequences);
            self.draft_pass(&feeds, proposals, &mut dropped)?;
        }
    }
}

/// Prompt lookup: proposes what followed the earlier run of tokens that the sequence's end is
/// copying, with the copy's replacements carried on. Costs no model; strong wherever the output
/// repeats its input (code edits, quoting, retrieval).
///
/// The candidate sources are what follows each earlier occurrence of the sequence's last
/// `MATCHED_SUFFIX` tokens (the latest `CANDIDATES` of them), or where there is none (right
/// after a replaced name), what follows the earlier window closest to the last
/// `SUBSTITUTED_WINDOW` tokens, at most `SUBSTITUTIONS` of them differing. Each candidate is
/// lined up with the sequence backwards (`align`) across replaced runs; the best explanation
/// of the copy (`Alignment::score`) wins, the latest of equals. Its continuation is drafted
/// with the copy's replacements applied: an edit that renames something replaces every
/// occurrence, and a draft that reached the next one unchanged would end there. Given the
/// tokenizer's spelling ([`with_spelling`](Self::with_spelling)), it also reads the
/// replacements of the copy as identifier renames and drafts every spelling of
/// a renamed name with the new one; and where a sequence ends in a new name, whose source has
/// the old one, the suffix as the source spells it finds candidates too.
#[derive(Clone, Debug, Default)]
pub struct NgramDrafter {
    /// A sequence followed by its draft so far, when a call continues one.
    scratch: Vec<u32>,
    spelling: Option<Arc<dyn Spelling>>,
    /// Per sequence, the renames of its latest look-up that learned any: the look-up that
    /// ends in a new name needs them, and its suffix found no line-up to learn them from.
    renamed: HashMap<u64, Renames>,
}

/// How many of the sequence's last tokens an earlier occurrence must repeat to be a candidate:
/// a single token repeats too often by chance to predict much.
const MATCHED_SUFFIX: usize = 2;

/// How many occurrences of the suffix, the latest, are lined up with the sequence: a common
/// pair (a newline and an indent) occurs thousands of times in a long context.
const CANDIDATES: usize = 32;

/// The length of the window a substituted match compares ([`NgramDrafter`]).
const SUBSTITUTED_WINDOW: usize = 8;

/// How many of the window's tokens a substituted match may differ in: a renamed identifier
/// is one or two tokens, and more differences match text that is merely alike.
const SUBSTITUTIONS: usize = 2;

/// How many tokens back from its end a copy's renames are read ([`renames`]): about a
/// screenful of code.
const RENAME_SPAN: usize = 512;

/// How many tokens back from its end a copy is lined up with its source ([`align`]).
const ALIGNED_SPAN: usize = 64;

/// The longest run of tokens a replacement takes out of the source or puts into the copy:
/// a name of up to three tokens renamed to another.
const REPLACED_RUN: usize = 3;

/// How many matched tokens a replacement costs a line-up's score ([`Alignment::score`]): with
/// one, any text would line up with any other through runs of chance matches one token long.
const REPLACEMENT_PRICE: isize = 2;

/// How many replacements a line-up crosses before it stops: more are text merely alike.
const REPLACEMENTS: usize = 8;

/// A run of the source that its copy replaced by another run, as ranges of the sequence.
#[derive(Clone, Debug)]
struct Replacement {
    source: Range<usize>,
    copy: Range<usize>,
}

/// A candidate source lined up with the copy at the sequence's end.
#[derive(Debug)]
struct Alignment {
    /// Where the source's continuation starts.
    continuation: usize,
    /// Tokens equal in source and copy.
    matched: usize,
    /// The copy's replacements, the latest first.
    replacements: Vec<Replacement>,
}

impl Alignment {
    /// How well the source explains the copy: each replacement must be paid for by
    /// [`REPLACEMENT_PRICE`] matched tokens.
    fn score(&self) -> isize {
        self.matched as isize - REPLACEMENT_PRICE * self.replacements.len() as isize
    }
}

impl NgramDrafter {
    /// A drafter that also drafts renamed identifiers in every spelling of `spelling`'s
    /// tokens.
    pub fn with_spelling(spelling: Arc<dyn Spelling>) -> Self {
        Self {
            spelling: Some(spelling),
            ..Self::default()
        }
    }

    /// Proposes up to `max` tokens to follow `sequence`'s `tokens` into `draft`.
    fn look_up(&mut self, sequence: u64, tokens: &[u32], max: usize, draft: &mut Draft) {
        if max == 0 || tokens.len() <= MATCHED_SUFFIX {
            return;
        }
        let suffix = &tokens[tokens.len() - MATCHED_SUFFIX..];
        let found = best_alignment(tokens, continuations(tokens, suffix));
        // Renames learned from a line merely like the copy (a signature with other types)
        // are chance, and so are the sources they find: one must explain the copy better
        // than the suffix's own by more than a replacement's price.
        let bar = found.as_ref().map_or(0, Alignment::score) + REPLACEMENT_PRICE;
        let restored = self
            .restored_suffix(sequence, tokens)
            .and_then(|restored| best_alignment(tokens, continuations(tokens, &restored)))
            .filter(|alignment| alignment.score() > bar);
        let best = restored
            .or(found)
            .or_else(|| best_alignment(tokens, substituted_continuation(tokens)));
        let Some(alignment) = best else {
            return;
        };
        let Some(spelling) = self.spelling.as_deref() else {
            draft_continuation(tokens, alignment, max, None, draft);
            return;
        };
        let renames = renames(tokens, alignment.continuation, spelling);
        draft_continuation(tokens, alignment, max, Some((spelling, &renames)), draft);
        if !renames.is_empty() {
            self.renamed.insert(sequence, renames);
        }
    }

    /// The last [`MATCHED_SUFFIX`] tokens of `sequence`'s `tokens` spelled as their source
    /// has them, when the sequence's renames renamed a name in its last
    /// [`SUBSTITUTED_WINDOW`] tokens: ending in a new name, or just after one, the copy's
    /// own suffix occurs only where the instruction names it or the copy wrote it before.
    fn restored_suffix(&self, sequence: u64, tokens: &[u32]) -> Option<Vec<u32>> {
        let spelling = self.spelling.as_deref()?;
        let renames = self.renamed.get(&sequence)?;
        let start = tokens.len().saturating_sub(SUBSTITUTED_WINDOW);
        let text = text(spelling, &tokens[start..])?;
        let continued_before =
            start > 0 && joins_name(spelling.bytes(tokens[start - 1])?, text.as_bytes());
        let restored = spelling.encode(&renames.restore(&text, continued_before)?);
        let suffix = &restored[restored.len().checked_sub(MATCHED_SUFFIX)?..];
        (suffix != &tokens[tokens.len() - MATCHED_SUFFIX..]).then(|| suffix.to_vec())
    }
}

/// The line-up of the candidate whose source explains the copy best, the first of equals
/// ([`continuations`] lists the latest first).
fn best_alignment(
    tokens: &[u32],
    candidates: impl IntoIterator<Item = usize>,
) -> Option<Alignment> {
    candidates
        .into_iter()
        .map(|continuation| align(tokens, continuation))
        .min_by_key(|alignment| std::cmp::Reverse(alignment.score()))
}

/// Where the continuations of the latest [`CANDIDATES`] earlier occurrences of `suffix`, which
/// ends `tokens`, start; each before the suffix's own end, so none is empty.
fn continuations(tokens: &[u32], suffix: &[u32]) -> Vec<usize> {
    (0..tokens.len() - MATCHED_SUFFIX)
        .rev()
        .filter(|&start| tokens[start..].starts_with(suffix))
        .take(CANDIDATES)
        .map(|start| start + MATCHED_SUFFIX)
        .collect()
}

/// Whether text ending in `before` and going on with `after` runs one identifier through the
/// seam. A byte of a multibyte character counts as part of a name: such a name is left alone,
/// not renamed.
fn joins_name(before: &[u8], after: &[u8]) -> bool {
    let is_name_byte = |b: &u8| !b.is_ascii() || is_name_char(char::from(*b));
    before.last().is_some_and(is_name_byte) && after.first().is_some_and(is_name_byte)
}

/// The identifiers the copy ending the sequence renamed, read from its replacements over
/// [`RENAME_SPAN`] tokens of its line-up with the source whose continuation starts at
/// `continuation`. A rename is made once and then repeated, and its first occurrence lies
/// further back than the replacements the draft carries ([`ALIGNED_SPAN`], where each
/// occurrence counts): the code edit's `calc` was renamed 80 tokens before its next use.
fn renames(tokens: &[u32], continuation: usize, spelling: &dyn Spelling) -> Renames {
    let mut renames = Renames::default();
    let alignment = align_over(tokens, continuation, RENAME_SPAN, Count::Kinds);
    if alignment.score() <= 0 {
        return renames;
    }
    let spelled = |run: &Range<usize>| text(spelling, &tokens[run.clone()]);
    // A replacement at the very end may be a new name only partly written.
    for r in alignment
        .replacements
        .iter()
        .filter(|r| r.copy.end < tokens.len())
    {
        if let (Some(source), Some(copy)) = (spelled(&r.source), spelled(&r.copy)) {
            renames.learn(&source, &copy);
        }
    }
    renames
}

/// Lines the source ending at `continuation` up with the copy at the sequence's end, back
/// from both ends, for at most [`ALIGNED_SPAN`] tokens. Where they differ, the shortest pair of
/// runs (fewest tokens, then fewest of the source's) whose removal makes the tokens before
/// them equal is a replacement; the line-up stops where there is none within
/// [`REPLACED_RUN`] tokens, or after [`REPLACEMENTS`].
fn align(tokens: &[u32], continuation: usize) -> Alignment {
    align_over(tokens, continuation, ALIGNED_SPAN, Count::Occurrences)
}

/// What the limit of [`REPLACEMENTS`] counts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Count {
    /// Every replacement.
    Occurrences,
    /// Each pair of replaced and replacing runs once, however often it recurs.
    Kinds,
}

/// [`align`] over at most `span` tokens, its replacements counted as `count` says.
fn align_over(tokens: &[u32], continuation: usize, span: usize, count: Count) -> Alignment {
    let (mut source, mut copy) = (continuation, tokens.len());
    let mut alignment = Alignment {
        continuation,
        matched: 0,
        replacements: Vec::new(),
    };
    let mut walked = 0;
    let mut kinds = 0;
    while walked < span && source > 0 {
        if tokens[source - 1] == tokens[copy - 1] {
            source -= 1;
            copy -= 1;
            alignment.matched += 1;
            walked += 1;
            continue;
        }
        if kinds == REPLACEMENTS {
            break;
        }
        let Some((replaced, by)) = resynchronisation(tokens, source, copy) else {
            break;
        };
        // An insertion lines the two up but has nothing to replace in a continuation.
        if replaced > 0 {
            let replacement = Replacement {
                source: source - replaced..source,
                copy: copy - by..copy,
            };
            let same_kind = |r: &Replacement| {
                tokens[r.source.clone()] == tokens[replacement.source.clone()]
                    && tokens[r.copy.clone()] == tokens[replacement.copy.clone()]
            };
            if count == Count::Occurrences || !alignment.replacements.iter().any(same_kind) {
                kinds += 1;
            }
            alignment.replacements.push(replacement);
        }
        source -= replaced;
        copy -= by;
        walked += replaced.max(by);
    }
    alignment
}

/// The lengths of the shortest runs ending at `source` and at `copy` (fewest tokens in all,
/// then fewest of the source's) after whose removal the tokens before them are equal; the
/// copy stays after its source.
fn resynchronisation(tokens: &[u32], source: usize, copy: usize) -> Option<(usize, usize)> {
    (1..=2 * REPLACED_RUN).find_map(|total| {
        (total.saturating_sub(REPLACED_RUN)..=total.min(REPLACED_RUN)).find_map(|replaced| {
            let by = total - replaced;
            let fits = replaced < source && copy - by > source - replaced;
            (fits && tokens[source - replaced - 1] == tokens[copy - by - 1])
                .then_some((replaced, by))
        })
    })
}

/// Drafts up to `max` tokens of the source's continuation, each run a replacement took out of
/// the source put as the copy has it instead (the longest run first, then the latest), and
/// with `spelled`, each other token that holds a renamed identifier spelled with the new name,
/// after the rest of a new name the copy ends partway through ([`rest_of_name`]).
fn draft_continuation(
    tokens: &[u32],
    mut alignment: Alignment,
    max: usize,
    spelled: Option<(&dyn Spelling, &Renames)>,
    draft: &mut Draft,
) {
    let mut proposed = 0;
    if let Some(rest) = spelled.and_then(|spelled| rest_of_name(tokens, &alignment, spelled)) {
        proposed = push_fitting(draft, &rest, max);
    }
    alignment
        .replacements
        .sort_by_key(|r| std::cmp::Reverse(r.source.len()));
    let mut at = alignment.continuation;
    while proposed < max && at < tokens.len() {
        let replacement = alignment
            .replacements
            .iter()
            .find(|r| tokens[at..].starts_with(&tokens[r.source.clone()]));
        let respelled;
        let (taken, put) = match replacement {
            Some(r) => (r.source.len(), &tokens[r.copy.clone()]),
            None => match spelled.and_then(|spelled| respell(tokens, at, spelled)) {
                Some(tokens) => {
                    respelled = tokens;
                    (1, &respelled[..])
                }
                None => (1, &tokens[at..=at]),
            },
        };
        proposed += push_fitting(draft, put, max - proposed);
        at += taken;
    }
}

/// Drafts as many of `tokens` as `room` allows, and says how many.
fn push_fitting(draft: &mut Draft, tokens: &[u32], room: usize) -> usize {
    let fitting = &tokens[..tokens.len().min(room)];
    for &token in fitting {
        draft.push_certain(token);
    }
    fitting.len()
}

/// The rest of a renamed name that the copy ends partway through: where its latest
/// replacement ends the sequence and took the source's run right before the continuation
/// (`calc` by `total`), and that run renamed (`total_price`) is spelled with the copy's run
/// first, the tokens after it (`_price`).
fn rest_of_name(
    tokens: &[u32],
    alignment: &Alignment,
    (spelling, renames): (&dyn Spelling, &Renames),
) -> Option<Vec<u32>> {
    let latest = alignment.replacements.first()?;
    if latest.copy.end != tokens.len() || latest.source.end != alignment.continuation {
        return None;
    }
    let source = text(spelling, &tokens[latest.source.clone()])?;
    let continued_before = latest.source.start > 0
        && joins_name(
            spelling.bytes(tokens[latest.source.start - 1])?,
            source.as_bytes(),
        );
    let continues_after = joins_name(
        source.as_bytes(),
        spelling.bytes(tokens[alignment.continuation])?,
    );
    let renamed = renames.apply(&source, continued_before, continues_after)?;
    let renamed = spelling.encode(&renamed);
    let rest = renamed.strip_prefix(&tokens[latest.copy.clone()])?;
    (!rest.is_empty()).then(|| rest.to_vec())
}

/// The text `tokens` spell, if they spell whole characters.
fn text(spelling: &dyn Spelling, tokens: &[u32]) -> Option<String> {
    let mut bytes = Vec::new();
    for &token in tokens {
        bytes.extend_from_slice(spelling.bytes(token)?);
    }
    String::from_utf8(bytes).ok()
}

/// Token `at` spelled with its renamed identifiers, when it holds one whole.
fn respell(
    tokens: &[u32],
    at: usize,
    (spelling, renames): (&dyn Spelling, &Renames),
) -> Option<Vec<u32>> {
    if renames.is_empty() {
        return None;
    }
    let text = std::str::from_utf8(spelling.bytes(tokens[at])?).ok()?;
    let neighbour = |i: usize| {
        tokens
            .get(i)
            .and_then(|&t| spelling.bytes(t))
            .unwrap_or_default()
    };
    let continued_before = at > 0 && joins_name(neighbour(at - 1), text.as_bytes());
    let continues_after = joins_name(text.as_bytes(), neighbour(at + 1));
    let renamed = renames.apply(text, continued_before, continues_after)?;
    Some(spelling.encode(&renamed))
}

/// Where the continuation of the earlier run closest to the last [`SUBSTITUTED_WINDOW`] tokens
/// starts: the run differing in the fewest places, at most [`SUBSTITUTIONS`], and of those the
/// latest.
fn substituted_continuation(tokens: &[u32]) -> Option<usize> {
    let starts = tokens.len().checked_sub(SUBSTITUTED_WINDOW)?;
    let window = &tokens[starts..];
    let mut best: Option<(usize, usize)> = None;
    for start in (0..starts).rev() {
        let allowed = best.map_or(SUBSTITUTIONS, |(differences, _)| differences - 1);
        let mut differences = 0;
        let close = tokens[start..start + SUBSTITUTED_WINDOW]
            .iter()
            .zip(window)
            .all(|(a, b)| {
                differences += usize::from(a != b);
                differences <= allowed
            });
        if close {
            best = Some((differences, start + SUBSTITUTED_WINDOW));
            if differences == 0 {
                break;
            }
        }
    }
    best.map(|(_, continuation)| continuation)
}

impl Drafter for NgramDrafter {
    fn kind(&self) -> &'static str {
        "ngram"
    }

    /// A sequence started again may be another text: renames learned from the old one would
    /// mislead its look-ups, or let a repeated prompt draft faster than a new request would.
    fn start(&mut self, sequence: u64, _: &SamplingParams) -> Result<(), Error> {
        self.renamed.remove(&sequence);
        Ok(())
    }

    fn finish(&mut self, sequence: u64) {
        self.renamed.remove(&sequence);
    }

    fn proposes_first(&self) -> bool {
        true
    }

    fn propose(&mut self, proposals: &mut [Proposal<'_>]) -> Result<(), Error> {
        for p in proposals {
            let sequence = p.input.sequence;
            if p.draft.is_empty() {
                self.look_up(sequence, p.input.tokens, p.max, p.draft);
            } else {
                let mut scratch = std::mem::take(&mut self.scratch);
                scratch.clear();
                scratch.extend_from_slice(p.input.tokens);
                scratch.extend_from_slice(p.draft.tokens());
                self.look_up(sequence, &scratch, p.max, p.draft);
                self.scratch = scratch;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ngram(tokens: &[u32], max: usize) -> Vec<u32> {
        propose(&mut NgramDrafter::default(), 0, tokens, max)
    }

    /// What `drafter` proposes, at most `max` tokens, to follow `sequence`'s `tokens`.
    fn propose(drafter: &mut NgramDrafter, sequence: u64, tokens: &[u32], max: usize) -> Vec<u32> {
        let mut draft = Draft::default();
        let proposal = Proposal {
            input: DraftInput::new(sequence, tokens),
            max,
            draft: &mut draft,
        };
        drafter.propose(&mut [proposal]).unwrap();
        draft.tokens().to_vec()
    }

    #[test]
    fn ngram_proposes_what_followed_the_longest_match_the_latest_of_equals() {
        // "7 8" occurs twice before the end, each after other tokens; the later one wins.
        assert_eq!(ngram(&[7, 8, 1, 2, 7, 8, 3, 4, 5, 7, 8], 3), [3, 4, 5]);
        // "1 2 3" matches more of the end than the later "2 3".
        assert_eq!(ngram(&[1, 2, 3, 9, 9, 2, 3, 6, 1, 2, 3], 2), [9, 9]);
        // A continuation may run into the suffix itself.
        assert_eq!(ngram(&[5, 6, 5, 6], 4), [5, 6]);
    }

    #[test]
    fn ngram_lines_a_copy_up_with_its_source_across_substituted_tokens() {
        // A copy of 10..=20 whose 12 and 17 were renamed 99: no suffix of two tokens occurs
        // earlier, but the last eight differ from 10..=17 in two places.
        let copied = [10, 11, 99, 13, 14, 15, 16, 99];
        let tokens: Vec<u32> = (10..=20).chain(copied).collect();
        assert_eq!(ngram(&tokens, 3), [18, 19, 20]);
        // Three differences are too many.
        let mut three = tokens.clone();
        three[tokens.len() - 4] = 98;
        assert!(ngram(&three, 3).is_empty());
        // Fewer differences win over a later run, and the later of two equally close runs
        // wins: 1..=8 and 1..=7 with 9 are each one off the last 1..=7 with 6 (continuations
        // 50 and 60), and the run after them, two off, is passed over.
        let tokens = [
            1, 2, 3, 4, 5, 6, 7, 8, 50, 1, 2, 3, 4, 5, 6, 7, 9, 60, 1, 2, 3, 0, 5, 6, 7, 0, 40, 1,
            2, 3, 4, 5, 6, 7, 6,
        ];
        assert_eq!(ngram(&tokens, 1), [60]);
        // The window needs a whole window of earlier tokens to compare with.
        assert!(ngram(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 2).is_empty());
    }

    #[test]
    fn ngram_drafts_a_copy_with_the_replacements_it_has_made() {
        // 10..=18 copied with 12 renamed 99 and 14 renamed 98: the draft after "15 16" renames
        // the source's later 12 and 14 too.
        let source = [10, 11, 12, 13, 14, 15, 16, 12, 17, 14, 18];
        let copy = [10, 11, 99, 13, 98, 15, 16];
        let tokens: Vec<u32> = source.iter().chain(&copy).copied().collect();
        assert_eq!(ngram(&tokens, 4), [99, 17, 98, 18]);
        // A replacement may change the length: "12 13" became 99.
        let source = [10, 11, 12, 13, 14, 15, 16, 12, 13, 17, 18];
        let copy = [10, 11, 99, 14, 15, 16];
        let tokens: Vec<u32> = source.iter().chain(&copy).copied().collect();
        assert_eq!(ngram(&tokens, 3), [99, 17, 18]);
        // The latest replacement of a source token wins: 12 was renamed 99, then 97.
        let source = [10, 11, 12, 13, 14, 12, 15, 16, 12];
        let copy = [10, 11, 99, 13, 14, 97, 15, 16];
        let tokens: Vec<u32> = source.iter().chain(&copy).copied().collect();
        assert_eq!(ngram(&tokens, 1), [97]);
    }

    /// A vocabulary of whole strings, encoded by longest match.
    struct Vocabulary(&'static [&'static str]);

    impl Spelling for Vocabulary {
        fn bytes(&self, token: u32) -> Option<&[u8]> {
            self.0.get(token as usize).map(|s| s.as_bytes())
        }

        fn encode(&self, mut text: &str) -> Vec<u32> {
            let mut tokens = Vec::new();
            while let Some((id, word)) = (0..self.0.len())
                .map(|id| (id, self.0[id]))
                .filter(|(_, word)| text.starts_with(word))
                .max_by_key(|(_, word)| word.len())
            {
                tokens.push(id as u32);
                text = &text[word.len()..];
            }
            tokens
        }
    }

    const CODE: &[&str] = &[
        "def", " calc", "(xs", "):\n", " return", " xs", "\n", "(items", " items", "_total",
    ];

    fn spelled_ngram(tokens: &[u32], max: usize) -> Vec<u32> {
        let mut drafter = NgramDrafter::with_spelling(Arc::new(Vocabulary(CODE)));
        propose(&mut drafter, 0, tokens, max)
    }

    #[test]
    fn ngram_drafts_a_renamed_identifier_in_its_other_spellings() {
        // `def calc(xs):\n return xs\n` copied with `(xs` as `(items`: the token ` xs` was
        // never replaced, but it holds the renamed identifier.
        let tokens = [0, 1, 2, 3, 4, 5, 6, 0, 1, 7, 3, 4];
        assert_eq!(ngram(&tokens, 2), [5, 6]);
        assert_eq!(spelled_ngram(&tokens, 2), [8, 6]);
        // `xs_total` is another name: ` xs` followed by `_total` stays.
        let tokens = [0, 1, 2, 3, 4, 5, 9, 6, 0, 1, 7, 3, 4];
        assert_eq!(spelled_ngram(&tokens, 2), [5, 9]);
    }

    const EDIT: &[&str] = &[
        "\n", "def", " calc", "(xs", "):\n", " pass", " return", " xs", " {", "calc", "}",
        " total", "_price", "(items", " items", "total",
    ];

    #[test]
    fn ngram_finds_the_source_of_a_new_name_by_the_old_one() {
        // `\ndef calc(xs):\n pass\n pass\n return xs\n return {calc(xs)}\n` copied with
        // `calc` renamed `total_price` and `xs` renamed `items`.
        let source = [0, 1, 2, 3, 4, 5, 0, 5, 0, 6, 7, 0, 6, 8, 9, 3, 10, 0];
        let copy = [0, 1, 11, 12, 13, 4, 5, 0, 5, 0, 6, 14, 0, 6];
        let mut tokens: Vec<u32> = source.iter().chain(&copy).copied().collect();
        let mut drafter = NgramDrafter::with_spelling(Arc::new(Vocabulary(EDIT)));
        let draft =
            |drafter: &mut NgramDrafter, tokens: &[u32], max| propose(drafter, 7, tokens, max);
        // ` {calc` drafted as ` {total_price`; the look-up learns both renames.
        assert_eq!(draft(&mut drafter, &tokens, 3), [8, 15, 12]);
        tokens.extend([8, 15, 12]);
        // `total _price` occurs nowhere before, but `{calc` does, in the source: what
        // follows it is `(xs)}`, renamed.
        assert_eq!(draft(&mut drafter, &tokens, 2), [13, 10]);
        let mut fresh = NgramDrafter::with_spelling(Arc::new(Vocabulary(EDIT)));
        assert!(draft(&mut fresh, &tokens, 2).is_empty());
        // A finished or restarted sequence's renames are forgotten.
        let mut restarted = drafter.clone();
        restarted.start(7, &SamplingParams::default()).unwrap();
        assert!(draft(&mut restarted, &tokens, 2).is_empty());
        drafter.finish(7);
        assert!(draft(&mut drafter, &tokens, 2).is_empty());
    }

    #[test]
    fn ngram_completes_a_new_name_written_in_part() {
        // As above, with the copy ending in ` {total`: `_price` comes first.
        let source = [0, 1, 2, 3, 4, 5, 0, 5, 0, 6, 7, 0, 6, 8, 9, 3, 10, 0];
        let copy = [0, 1, 11, 12, 13, 4, 5, 0, 5, 0, 6, 14, 0, 6, 8, 15];
        let tokens: Vec<u32> = source.iter().chain(&copy).copied().collect();
        let mut drafter = NgramDrafter::with_spelling(Arc::new(Vocabulary(EDIT)));
        assert_eq!(propose(&mut drafter, 0, &tokens, 2), [12, 13]);
    }

    #[test]
    fn ngram_follows_the_source_that_explains_the_copy_best() {
        // "5 6" occurs twice before the end. The later occurrence (continued by 60) follows
        // unrelated tokens; the earlier one (continued by 30) follows the run 20..=23 that
        // the copy repeats with 12 renamed 99.
        let tokens = [
            20, 21, 22, 23, 12, 5, 6, 30, 31, 50, 51, 5, 6, 60, 20, 21, 22, 23, 99, 5, 6,
        ];
        assert_eq!(ngram(&tokens, 2), [30, 31]);
    }

    #[test]
    fn ngram_continues_a_draft_from_the_sequence_and_the_draft_together() {
        let tokens = [5, 6, 7, 8, 9, 5];
        let mut draft = Draft::default();
        draft.push_certain(6);
        let proposal = Proposal {
            input: DraftInput::new(0, &tokens),
            max: 2,
            draft: &mut draft,
        };
        NgramDrafter::default().propose(&mut [proposal]).unwrap();
        // "5 6" matches at the start: 7 and 8 follow the draft's 6.
        assert_eq!(draft.tokens(), [6, 7, 8]);
    }

    #[test]
    fn the_common_prefix_is_found_across_chunks() {
        let a: Vec<u32> = (0..200).collect();
        for cut in [0, 1, 63, 64, 65, 128, 199] {
            let mut b = a.clone();
            b[cut] = 1000;
            assert_eq!(common_prefix(&a, &b), cut);
            assert_eq!(common_prefix(&a[..cut], &b), cut);
        }
        assert_eq!(common_prefix(&a, &a[..130]), 130);
        assert_eq!(common_prefix(&[], &a), 0);
        let sequence = Sequence {
            followed: 0,
            tokens: &a[..100],
            draft: &a[100..110],
        };
        assert_eq!(sequence.shared_with(&a), 110);
        assert_eq!(sequence.shared_with(&a[..104]), 104);
        assert_eq!(sequence.shared_with(&[0, 1, 7]), 2);
    }

    #[test]
    fn ngram_proposes_nothing_without_a_match() {
        assert!(ngram(&[1, 2, 3, 4], 4).is_empty());
        assert!(ngram(&[1], 4).is_empty());
        assert!(ngram(&[], 4).is_empty());
        assert!(ngram(&[1, 2, 1, 2], 0).is_empty());
    }
}
