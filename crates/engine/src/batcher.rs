//! Continuous batching: many sequences on one model, advanced together one forward pass at a
//! time.
//!
//! Each [`Batcher::step`] builds one ragged batch: a decode row for every running sequence
//! that has its next token, then prefill chunks of the others under a per-step token budget
//! (so a long prompt never stalls the decodes), then the first chunks of newly admitted
//! sequences. Sequences join at any step and leave as soon as they finish or are cancelled.
//!
//! KV memory is one pool of blocks with a prefix cache: a new sequence starts from the longest
//! cached run of full blocks of its prompt. When a step finds the pool full, the most recently
//! admitted sequences are preempted: their blocks go back (their full blocks stay cached) and
//! they wait at the head of the queue, to be fed again from their tokens so far. The kernels
//! are batch-invariant and deterministic, so none of this changes a single logit: a sequence's
//! output is the same alone, batched, preempted or served from the cache.
//!
//! With a drafter, a sequence speculates while it runs alone (the adaptive draft length
//! decides how far), and every decoding sequence of a batch drafts, the target verifying all
//! their drafts in the step's one pass: the drafted rows worth their share of the pass are
//! chosen for the step as a whole, from the measured cost of passes by length and each
//! sequence's acceptance, so a batch that already fills the machine drafts nothing. A
//! drafter that needs no catch-up (n-gram lookup) proposes for every sequence before the rows
//! are chosen; a model drafter, which follows each sequence in its own pool of KV blocks, is
//! told the rows first, and drafts them in passes that each draft a position of every
//! sequence given that many, priced by their measured time.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lucebox_backend::{Backend, BatchCapacity, RowSampling, TokenRole};
use lucebox_model::Model;

use crate::forward_state::ForwardState;
use crate::speculative::{
    Draft, DraftPolicy, DraftPrice, DraftTiming, Drafter, MAX_DRAFT, Offer, PairCosts, Pass,
    Proposal, Rivals, Round, Scores, SequenceDrafting, SpecStats, accept, allot, run_drafter,
};
use crate::{
    BlockPool, Error, GenerationStats, MAX_TOP_LOGPROBS, Sampler, SequenceBlocks, StopReason,
    TokenLogprobs,
};

/// The sizes of a [`Batcher`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchConfig {
    /// Positions one sequence may hold; capped at the model's trained context and the pool.
    pub context: usize,
    /// Blocks in the KV pool, shared by all sequences and the prefix cache.
    pub kv_blocks: usize,
    /// Positions per KV block.
    pub block_tokens: usize,
    /// Sequences that run at once; more wait.
    pub max_sequences: usize,
    /// Tokens one forward pass takes: decode rows first, prefill chunks in what is left.
    pub step_tokens: usize,
}

impl BatchConfig {
    /// Blocks of `block_tokens` positions that fit in `bytes` of KV cache when each of
    /// `models` (a target, and its drafter model if any) keeps a pool of that many blocks.
    pub fn kv_blocks_within<B: Backend>(
        models: &[&Model<B>],
        bytes: u64,
        block_tokens: usize,
    ) -> usize {
        let one: u64 = models
            .iter()
            .map(|model| model.kv_layout(1, block_tokens).bytes())
            .sum();
        usize::try_from(bytes / one.max(1)).unwrap_or(usize::MAX)
    }
}

/// A sequence's handle, unique for the engine's lifetime; each engine numbers its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SequenceId(pub u64);

/// A sequence to generate.
#[derive(Debug)]
pub struct NewSequence {
    /// The tokens it continues.
    pub prompt: Vec<u32>,
    /// How it chooses its tokens.
    pub sampler: Sampler,
    /// The most tokens it generates.
    pub max_tokens: usize,
    /// `Some(n)`: report each token's log-probability and the `n` most likely alternatives
    /// (up to [`MAX_TOP_LOGPROBS`]). Such a sequence never speculates.
    pub logprobs: Option<usize>,
}

/// What a step produced, in order for each sequence: tokens, then `Finished` once.
#[derive(Clone, Debug)]
pub enum Event {
    /// A generated token (an end-of-generation token included).
    Token {
        /// Whose.
        id: SequenceId,
        /// The token.
        token: u32,
        /// Its log-probabilities, when the sequence asked for them.
        logprobs: Option<Box<TokenLogprobs>>,
    },
    /// The sequence is done and its blocks are back in the pool.
    Finished {
        /// Which.
        id: SequenceId,
        /// What its generation did.
        stats: GenerationStats,
        /// What speculation did for it, when the batcher has a drafter.
        spec: Option<Box<SpecStats>>,
    },
}

/// How loaded a batcher is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// Sequences in the running batch.
    pub running: usize,
    /// Sequences added but not running: new, or preempted.
    pub waiting: usize,
    /// The most sequences that run at once.
    pub max_sequences: usize,
    /// KV blocks held by sequences.
    pub kv_blocks_used: usize,
    /// KV blocks in the pool.
    pub kv_blocks: usize,
    /// Preemptions since the start.
    pub preemptions: u64,
}

/// Many sequences advanced a step at a time, as a server runs them. Implemented by
/// [`Batcher`]; the trait lets the server's tests drive a scripted stand-in.
pub trait BatchEngine: Send {
    /// Queues a sequence.
    fn add(&mut self, sequence: NewSequence) -> Result<SequenceId, Error>;

    /// Ends a sequence early, running or waiting (a stop string matched, or its client went
    /// away): frees its blocks and returns its `Finished` event, stopped by the caller; `None`
    /// if it is unknown (finished already).
    fn stop(&mut self, id: SequenceId) -> Option<Event>;

    /// Runs one forward pass over the running batch (admitting waiting sequences first where
    /// there is room) and appends what it produced to `events`. Does nothing when no sequence
    /// is added.
    fn step(&mut self, events: &mut Vec<Event>) -> Result<(), Error>;

    /// How loaded the engine is.
    fn load(&self) -> Load;

    /// The most tokens one sequence, prompt and generation together, may hold.
    fn context(&self) -> usize;
}

/// One sequence in the batcher.
struct Sequence {
    id: SequenceId,
    /// The prompt and every generated token; the last one is fed at the next step.
    tokens: Vec<u32>,
    prompt_tokens: usize,
    /// The leading tokens fed in the prompt role: the whole prompt, or none where it is too
    /// short for the backend's prompt kernels (`Backend::prompt_role`).
    prompt_role_tokens: usize,
    blocks: SequenceBlocks,
    sampler: Sampler,
    max_tokens: usize,
    logprobs: Option<usize>,
    generated: usize,
    /// Prompt tokens found in the prefix cache when first admitted.
    reused: Option<usize>,
    first_scheduled: Option<Instant>,
    first_token: Option<Instant>,
    spec: SpecStats,
    drafting: SequenceDrafting,
    /// This step's draft, verified with the next token.
    draft: Draft,
}

impl Sequence {
    /// Tokens not yet in the KV cache.
    fn unfed(&self) -> usize {
        self.tokens.len() - self.blocks.len()
    }

    /// How many of `count` unfed tokens one pass feeds: never tokens of the two roles together
    /// (a recomputed sequence's pass ends with its prompt), since a pass holds its prompt-role
    /// tokens first and a backend may give their rows other arithmetic.
    fn chunk(&self, count: usize) -> usize {
        match self.prompt_role_tokens.checked_sub(self.blocks.len()) {
            Some(prompt_left) if prompt_left > 0 => count.min(prompt_left),
            _ => count,
        }
    }

    /// The role of the token at `position`.
    fn role(&self, position: usize) -> TokenRole {
        if position < self.prompt_role_tokens {
            TokenRole::Prompt
        } else {
            TokenRole::Generated
        }
    }
}

/// What a step does for one running sequence.
struct Planned {
    /// Index into `running`.
    index: usize,
    /// The first position fed.
    start: usize,
    /// Tokens fed.
    count: usize,
    /// Whether the step ends with a logits row for a new token.
    scored: bool,
    /// For a speculating sequence: the draft length asked for and how long drafting took.
    drafting: Option<(usize, DraftTiming)>,
    /// Where a scored entry's token comes from, decided once the pass has run.
    pick: Pick,
}

/// Where a scored sequence's next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pick {
    /// The device's argmax of its rows (plain greedy).
    Argmax,
    /// The device's sampler ([`Backend::sample_rows`]), every row of a certain draft's verify
    /// pass; the host draws the rows it leaves with the same uniform numbers.
    Device,
    /// The host's sampler, on the rows read back.
    Host,
}

/// The drafter and its scratch.
struct Speculation {
    drafter: Box<dyn Drafter + Send>,
    policy: DraftPolicy,
    /// What drafting and verifying cost, kept across sequences.
    costs: PairCosts,
    /// Vocabulary-sized zeros, scratch for rejection sampling.
    dense: Vec<f32>,
    /// A batched step's offers, one per plan entry that drafts, in plan order, and the rows
    /// each was given.
    offers: Vec<Offer>,
    chosen: Vec<usize>,
    /// What this step's drafts competed with.
    rivals: Rivals,
}

/// Continuous batching on one model (its design: the head of crates/engine/src/batcher.rs).
pub struct Batcher<B: Backend> {
    model: Arc<Model<B>>,
    config: BatchConfig,
    state: ForwardState<B>,
    /// The most logits rows one pass keeps.
    logits_rows: usize,
    /// The logits rows of the last forward pass, on the host once read.
    logits: Vec<f32>,
    /// One row as the model gave it, for log-probabilities after sampling transformed it.
    raw_row: Vec<f32>,
    picks: Vec<u32>,
    /// The rows sampled on the device this step: their requests, penalised tokens, plan
    /// entries and tokens.
    device_rows: Vec<RowSampling>,
    penalised: Vec<(u32, u32)>,
    device_entries: Vec<usize>,
    device_picks: Vec<Option<u32>>,
    running: Vec<Sequence>,
    waiting: VecDeque<Sequence>,
    plan: Vec<Planned>,
    next_id: u64,
    is_end: Box<dyn Fn(u32) -> bool + Send>,
    speculation: Option<Speculation>,
    preemptions: u64,
    /// Whether a forward pass has run: the first one faults the weights in (a server's
    /// self-test: two seconds for the 1.5B on the CPU) and says nothing of the others.
    warm: bool,
}

impl<B: Backend> std::fmt::Debug for Batcher<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("config", &self.config)
            .field("load", &self.load())
            .finish()
    }
}

impl<B: Backend> Batcher<B> {
    /// A batcher on `model`; `is_end` says which tokens end a generation, and `speculation`
    /// is the drafter sequences speculate with, alone or in a batch.
    pub fn new(
        model: Arc<Model<B>>,
        config: BatchConfig,
        is_end: Box<dyn Fn(u32) -> bool + Send>,
        speculation: Option<(Box<dyn Drafter + Send>, DraftPolicy)>,
    ) -> Result<Self, Error> {
        let longest_draft = speculation.as_ref().map_or(0, |(_, p)| p.longest());
        let invalid = |why: String| Err(Error::InvalidParameter { name: "batch", why });
        if config.block_tokens == 0
            || config.kv_blocks == 0
            || config.context == 0
            || config.max_sequences == 0
        {
            return invalid(format!("{config:?} has a zero size"));
        }
        if longest_draft > MAX_DRAFT {
            return invalid(format!("draft length {longest_draft} is above {MAX_DRAFT}"));
        }
        if config.step_tokens < config.max_sequences.max(longest_draft + 1) {
            return invalid(format!(
                "{} step tokens cannot hold a decode row per sequence ({}) or a verify pass ({})",
                config.step_tokens,
                config.max_sequences,
                longest_draft + 1
            ));
        }
        let context = config
            .context
            .min(model.config().context_length)
            .min(config.kv_blocks * config.block_tokens);
        let config = BatchConfig { context, ..config };
        // Every sequence of a batch may verify a draft.
        let logits_rows = (config.max_sequences * (longest_draft + 1)).min(config.step_tokens);
        let state = ForwardState::new(
            &model,
            BlockPool::with_prefix_cache(
                config.kv_blocks,
                config.block_tokens,
                model.backend().prompt_rows_from().is_some(),
            ),
            BatchCapacity {
                tokens: config.step_tokens,
                sequences: config.max_sequences,
                blocks: config.max_sequences * context.div_ceil(config.block_tokens),
                logits: logits_rows,
            },
        )?;
        let vocab = model.config().vocab;
        Ok(Self {
            model,
            config,
            state,
            logits_rows,
            logits: vec![0.0; vocab * logits_rows],
            raw_row: Vec::new(),
            picks: vec![0; logits_rows],
            device_rows: Vec::with_capacity(logits_rows),
            penalised: Vec::new(),
            device_entries: Vec::with_capacity(logits_rows),
            device_picks: Vec::with_capacity(logits_rows),
            running: Vec::with_capacity(config.max_sequences),
            waiting: VecDeque::new(),
            plan: Vec::with_capacity(config.max_sequences),
            next_id: 0,
            is_end,
            speculation: speculation.map(|(drafter, policy)| Speculation {
                drafter,
                policy,
                costs: PairCosts::default(),
                dense: vec![0.0; vocab],
                offers: Vec::with_capacity(config.max_sequences),
                chosen: Vec::with_capacity(config.max_sequences),
                rivals: Rivals::None,
            }),
            preemptions: 0,
            warm: false,
        })
    }

    /// The effective configuration (context capped at the model's and the pool's).
    pub fn config(&self) -> BatchConfig {
        self.config
    }

    /// Makes room for `count` more positions of `running[index]`, preempting the most recently
    /// admitted sequences while the pool is short; `false` when `running[index]` itself had to
    /// go.
    fn make_room(&mut self, index: usize, count: usize) -> bool {
        loop {
            if self.running[index]
                .blocks
                .reserve(&mut self.state.pool, count)
            {
                return true;
            }
            let victim = self.running.len() - 1;
            let mut seq = self.running.remove(victim);
            seq.blocks.release(&mut self.state.pool);
            self.waiting.push_front(seq);
            self.preemptions += 1;
            if victim == index {
                return false;
            }
        }
    }

    /// Plans this step's rows for the running sequences: a decode row for each that has its
    /// next token, prefill chunks for the others within the step's tokens; returns the tokens
    /// left.
    fn plan_running(&mut self) -> usize {
        let mut budget = self.config.step_tokens;
        let mut index = 0;
        while index < self.running.len() {
            let seq = &self.running[index];
            let unfed = seq.unfed();
            let count = seq.chunk(if unfed == 1 { 1 } else { unfed.min(budget) });
            if count == 0 {
                index += 1;
                continue;
            }
            if !self.make_room(index, count) {
                continue;
            }
            let seq = &self.running[index];
            let start = seq.blocks.len();
            budget -= count.min(budget);
            self.plan.push(Planned {
                index,
                start,
                count,
                scored: start + count >= seq.tokens.len(),
                drafting: None,
                pick: Pick::Host,
            });
            index += 1;
        }
        budget
    }

    /// Drafts for the planned decode rows within `budget` more tokens: for a lone sequence as
    /// its draft-length control says, for a batch the rows the step's allotment (or a fixed
    /// draft length) chooses. A draft goes only where the pool has room for it without
    /// preempting anyone.
    fn plan_drafts(&mut self, budget: usize) -> Result<(), Error> {
        let Some(spec) = &mut self.speculation else {
            return Ok(());
        };
        let alone = self.running.len() == 1 && self.waiting.is_empty();
        let scored = self.plan.iter().filter(|p| p.scored).count();
        let room = budget.min(self.logits_rows - scored);
        spec.offers.clear();
        spec.rivals = if alone {
            Rivals::None
        } else {
            Rivals::Batch { cutoff: 0.0 }
        };
        let allotted = !alone && matches!(spec.policy, DraftPolicy::Adaptive(_));
        let proposes_first = spec.drafter.proposes_first();
        let mut measuring_catch_up = false;
        for p in &mut self.plan {
            let seq = &mut self.running[p.index];
            if p.count != 1 || !p.scored || seq.logprobs.is_some() {
                continue;
            }
            let remaining = seq.max_tokens - seq.generated;
            let context_left = self.config.context - seq.blocks.len();
            // Nothing is drafted beyond what may still be generated or fit in the context.
            let most = (remaining - 1).min(context_left - 1);
            seq.draft.clear();
            let drafter = &mut *spec.drafter;
            let (wanted, timing) = if alone {
                let plan =
                    seq.drafting
                        .plan(drafter, spec.policy, &spec.costs, &seq.tokens, remaining);
                let k = plan.wanted.min(most);
                let view = seq.drafting.view(&seq.tokens);
                let timing = run_drafter(drafter, view, plan.unseen, k, &mut seq.draft)?;
                (k, timing)
            } else {
                let k = spec.policy.longest().min(most);
                let view = seq.drafting.view(&seq.tokens);
                let (proposed, unseen, timing) = if proposes_first {
                    let timing = run_drafter(drafter, view, 0, k, &mut seq.draft)?;
                    (seq.draft.len(), 0, timing)
                } else {
                    (k, drafter.unseen(&view), DraftTiming::default())
                };
                if allotted {
                    let control = &seq.drafting.control;
                    let mut offer = control.offer(proposed, unseen, remaining, &spec.costs);
                    // Until a catch-up's cost is measured, one sequence a step that needs one
                    // offers rows, and its step measures it: catching up on every prompt of
                    // a batch at once could stall a CPU for many seconds.
                    if spec.costs.catch_up_unpriced(unseen) {
                        if measuring_catch_up {
                            offer.proposed = 0;
                        }
                        measuring_catch_up = true;
                    }
                    spec.offers.push(offer);
                }
                (k, timing)
            };
            p.drafting = Some((wanted, timing));
        }
        if !alone {
            self.choose_batch_rows(room, allotted);
            if !proposes_first {
                self.draft_chosen_rows()?;
            }
        }
        let mut room = room;
        for p in &mut self.plan {
            let seq = &mut self.running[p.index];
            if p.drafting.is_none() {
                continue;
            }
            let drafted = seq.draft.len().min(room);
            if !seq.blocks.reserve(&mut self.state.pool, 1 + drafted) {
                seq.draft.clear();
            }
            seq.draft.truncate(drafted);
            room -= seq.draft.len();
            p.count += seq.draft.len();
        }
        Ok(())
    }

    /// Chooses the drafted rows of a batched step, `chosen[i]` for the `i`-th drafting plan
    /// entry, within `room`: by the allotment when `allotted`, else each sequence its fixed
    /// length in plan order. Drafts already proposed are cut to their rows.
    fn choose_batch_rows(&mut self, room: usize, allotted: bool) {
        let spec = self.speculation.as_mut().expect("drafting");
        let proposes_first = spec.drafter.proposes_first();
        spec.chosen.clear();
        if allotted {
            let pass = Pass {
                tokens: self.plan.iter().map(|p| p.count).sum(),
                produces: self.plan.iter().filter(|p| p.scored).count(),
            };
            let price = if proposes_first {
                DraftPrice::PerToken
            } else {
                DraftPrice::PerPass
            };
            spec.chosen.resize(spec.offers.len(), 0);
            let cutoff = allot(
                &spec.costs,
                price,
                pass,
                &spec.offers,
                room,
                &mut spec.chosen,
            );
            spec.rivals = Rivals::Batch { cutoff };
        } else {
            let mut left = room;
            for p in &self.plan {
                let Some((k, _)) = p.drafting else {
                    continue;
                };
                let wanted = if proposes_first {
                    self.running[p.index].draft.len()
                } else {
                    k
                };
                let rows = wanted.min(left);
                left -= rows;
                spec.chosen.push(rows);
            }
        }
        let drafting = self.plan.iter_mut().filter(|p| p.drafting.is_some());
        for (i, (p, &chosen)) in drafting.zip(&spec.chosen).enumerate() {
            // A sequence that offered drafts but was given none made a plain step by choice.
            let offered = spec.offers.get(i).is_some_and(|offer| offer.proposed > 0);
            if chosen == 0
                && offered
                && let Some((wanted, _)) = &mut p.drafting
            {
                *wanted = 0;
            }
            self.running[p.index].draft.truncate(chosen);
        }
    }

    /// Has a model drafter draft the chosen rows: it catches up every sequence given rows,
    /// then drafts a position of each in a pass, as many passes as the most rows given; each
    /// pass is priced by the sequences it drafted for, and each sequence's timing is its
    /// share of the catch-up and of the passes it took part in.
    fn draft_chosen_rows(&mut self) -> Result<(), Error> {
        let Self {
            model,
            running,
            plan,
            speculation,
            ..
        } = self;
        let spec = speculation.as_mut().expect("drafting");
        let mut rows = vec![0; running.len()];
        let drafting = plan.iter().filter(|p| p.drafting.is_some());
        for (p, &chosen) in drafting.zip(&spec.chosen) {
            rows[p.index] = chosen;
        }
        let depth = rows.iter().copied().max().unwrap_or(0);
        if depth == 0 {
            return Ok(());
        }
        let backend = model.backend();
        let inputs: Vec<_> = running
            .iter()
            .zip(&rows)
            .filter(|&(_, &r)| r > 0)
            .map(|(seq, _)| seq.drafting.view(&seq.tokens))
            .collect();
        let unseen = inputs.iter().map(|input| spec.drafter.unseen(input)).sum();
        let recorded = backend.passes_recorded();
        let started = Instant::now();
        spec.drafter.catch_up(&inputs)?;
        let catching_up = started.elapsed();
        if backend.passes_recorded() == recorded {
            spec.costs
                .observe_catch_up(unseen, inputs.len(), catching_up);
        }
        let catch_up = catching_up / inputs.len() as u32;
        drop(inputs);
        let mut shares = vec![Duration::ZERO; running.len()];
        for position in 0..depth {
            let mut proposals: Vec<Proposal<'_>> = Vec::with_capacity(running.len());
            let mut taking_part = Vec::with_capacity(running.len());
            for (index, (seq, &r)) in running.iter_mut().zip(&rows).enumerate() {
                if r > position && seq.draft.len() == position {
                    taking_part.push(index);
                    proposals.push(Proposal {
                        input: seq.drafting.view(&seq.tokens),
                        max: 1,
                        draft: &mut seq.draft,
                    });
                }
            }
            if proposals.is_empty() {
                break;
            }
            let recorded = backend.passes_recorded();
            let pass_started = Instant::now();
            spec.drafter.propose(&mut proposals)?;
            let pass = pass_started.elapsed();
            if backend.passes_recorded() == recorded {
                spec.costs.observe_drafter_pass(proposals.len(), pass);
            }
            let share = pass / proposals.len() as u32;
            for index in taking_part {
                shares[index] += share;
            }
        }
        for p in plan.iter_mut() {
            if let Some((_, timing)) = &mut p.drafting
                && rows[p.index] > 0
            {
                *timing = DraftTiming {
                    caught_up: 0,
                    catch_up,
                    propose: shares[p.index],
                    shared: true,
                };
            }
        }
        Ok(())
    }

    /// Admits waiting sequences while there is room in the batch, the budget and the pool, and
    /// plans their first chunks; returns the tokens left.
    fn admit(&mut self, mut budget: usize) -> usize {
        while self.running.len() < self.config.max_sequences && budget > 0 {
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            let shared = seq.blocks.share_cached_prefix(
                &mut self.state.pool,
                &seq.tokens,
                seq.prompt_role_tokens,
            );
            let needed =
                seq.tokens.len().div_ceil(self.config.block_tokens) - seq.blocks.table().len();
            if needed > self.state.pool.free_blocks() {
                seq.blocks.release(&mut self.state.pool);
                self.waiting.push_front(seq);
                break;
            }
            if seq.reused.is_none() {
                seq.reused = Some(shared);
                seq.first_scheduled = Some(Instant::now());
            }
            let count = seq.chunk(seq.unfed().min(budget));
            let reserved = seq.blocks.reserve(&mut self.state.pool, count);
            assert!(reserved, "checked against the free blocks");
            budget -= count;
            self.plan.push(Planned {
                index: self.running.len(),
                start: seq.blocks.len(),
                count,
                scored: count == seq.unfed(),
                drafting: None,
                pick: Pick::Host,
            });
            self.running.push(seq);
        }
        budget
    }

    /// Fills the batch from the plan and runs the forward pass.
    fn forward(&mut self) -> Result<(), Error> {
        self.state.batch.clear();
        for p in &self.plan {
            let seq = &self.running[p.index];
            let s = self.state.batch.push_sequence(seq.blocks.table());
            let draft = seq.draft.tokens();
            for j in 0..p.count {
                let (token, scored) = match p.drafting {
                    // The pending token, then the draft: every row is scored.
                    Some(_) if j > 0 => (draft[j - 1], true),
                    Some(_) => (seq.tokens[p.start], true),
                    None => (seq.tokens[p.start + j], p.scored && j + 1 == p.count),
                };
                let position = p.start + j;
                self.state
                    .batch
                    .push_token(s, token, position as u32, seq.role(position), scored);
            }
        }
        self.state.forward(&self.model)?;
        for p in &self.plan {
            self.running[p.index]
                .blocks
                .advance(&self.state.pool, p.count);
        }
        // Rows are read the cheapest way each sequence allows: the device's argmax for plain
        // greedy ones, its sampler (where it has one) for sampled ones that want no
        // log-probabilities and whose drafts, if any, are certain, the whole rows for the
        // others.
        let rows = self.state.workspace.logits_rows();
        let backend = self.model.backend();
        let device_samples = backend.samples_rows();
        let (mut greedy, mut read) = (false, false);
        self.device_rows.clear();
        self.penalised.clear();
        self.device_entries.clear();
        self.device_picks.clear();
        let mut row = 0;
        for (entry, p) in self.plan.iter_mut().enumerate() {
            if !p.scored {
                continue;
            }
            let seq = &mut self.running[p.index];
            let plain_greedy = seq.sampler.params().is_plain_greedy();
            // A verify pass's row j follows the pending token and the draft's first j tokens.
            let (rows, drafted) = match p.drafting {
                Some(_) => (p.count, seq.draft.tokens()),
                None => (1, &[][..]),
            };
            p.pick = if plain_greedy {
                Pick::Argmax
            } else if device_samples
                && seq.logprobs.is_none()
                && (p.drafting.is_none() || seq.draft.is_certain())
            {
                for j in 0..rows {
                    let request = seq.sampler.row_sampling(
                        row + j,
                        &seq.tokens,
                        &drafted[..j],
                        &mut self.penalised,
                    );
                    self.device_rows.push(request);
                    self.device_entries.push(entry);
                }
                Pick::Device
            } else {
                Pick::Host
            };
            greedy |= plain_greedy;
            read |= p.pick == Pick::Host || seq.logprobs.is_some();
            row += rows;
        }
        if greedy {
            backend.argmax_rows(self.state.workspace.logits(), &mut self.picks[..rows])?;
        }
        if !self.device_rows.is_empty() {
            self.device_picks.resize(self.device_rows.len(), None);
            backend.sample_rows(
                self.state.workspace.logits_mut(),
                &self.device_rows,
                &self.penalised,
                &mut self.device_picks,
            )?;
            for (request, &token) in self.device_rows.iter().zip(&self.device_picks) {
                self.picks[request.row] = token.unwrap_or(0);
            }
        }
        let left_to_host = self.device_picks.iter().any(Option::is_none);
        let vocab = self.model.config().vocab;
        if read || left_to_host {
            backend.read_rows(
                self.state.workspace.logits(),
                rows,
                &mut self.logits[..rows * vocab],
            )?;
        }
        if left_to_host {
            for ((request, &entry), &token) in self
                .device_rows
                .iter()
                .zip(&self.device_entries)
                .zip(&self.device_picks)
            {
                if token.is_none() {
                    let sampler = &mut self.running[self.plan[entry].index].sampler;
                    let logits = &self.logits[request.row * vocab..(request.row + 1) * vocab];
                    self.picks[request.row] = sampler.sample_penalised(logits, request.uniform);
                }
            }
        }
        Ok(())
    }

    /// Chooses the scored sequences' tokens from the forward pass, emits them, and retires the
    /// sequences that finished.
    /// `passes_recorded` is the backend's count from before this step's drafting.
    fn commit(&mut self, verify_started: Instant, passes_recorded: u64, events: &mut Vec<Event>) {
        let vocab = self.model.config().vocab;
        let mut row = 0;
        let mut finished = Vec::new();
        for p in &self.plan {
            let seq = &mut self.running[p.index];
            if p.scored {
                let before = seq.tokens.len();
                let greedy = seq.sampler.params().is_plain_greedy();
                let mut logprobs = None;
                match (p.drafting, &mut self.speculation) {
                    (Some((k, timing)), Some(spec)) => {
                        let rows = p.count;
                        let pending = p.start;
                        seq.tokens.extend_from_slice(seq.draft.tokens());
                        let scores = if greedy || p.pick == Pick::Device {
                            Scores::Picks(&self.picks[row..row + rows])
                        } else {
                            Scores::Rows {
                                logits: &mut self.logits[row * vocab..(row + rows) * vocab],
                                tokens: &seq.tokens,
                            }
                        };
                        let (accepted, next) =
                            accept(&seq.draft, scores, &mut seq.sampler, &mut spec.dense);
                        seq.tokens.truncate(pending + 1 + accepted);
                        seq.blocks
                            .truncate(&mut self.state.pool, pending + 1 + accepted);
                        seq.tokens.push(next);
                        let round = Round {
                            drafted: seq.draft.len(),
                            accepted,
                            next,
                            drafting: timing,
                            verify_time: verify_started.elapsed(),
                            recorded_a_pass: self.model.backend().passes_recorded()
                                != passes_recorded,
                        };
                        let control = &mut seq.drafting.control;
                        round.record(k, &mut seq.spec, control, &mut spec.costs, spec.rivals);
                        row += rows;
                    }
                    _ => {
                        let logits = &mut self.logits[row * vocab..(row + 1) * vocab];
                        let token = match p.pick {
                            Pick::Argmax | Pick::Device => self.picks[row],
                            Pick::Host => {
                                // Sampling transforms the row in place: the raw row is kept
                                // first.
                                if seq.logprobs.is_some() {
                                    self.raw_row.clear();
                                    self.raw_row.extend_from_slice(logits);
                                }
                                seq.sampler.sample(logits, &seq.tokens)
                            }
                        };
                        if let Some(top) = seq.logprobs {
                            let raw = if greedy { &*logits } else { &self.raw_row };
                            logprobs = Some(Box::new(TokenLogprobs::of(raw, token, top)));
                        }
                        seq.tokens.push(token);
                        row += 1;
                    }
                }
                let now = Instant::now();
                seq.first_token.get_or_insert(now);
                let mut stop = None;
                for &token in &seq.tokens[before..] {
                    seq.generated += 1;
                    events.push(Event::Token {
                        id: seq.id,
                        token,
                        logprobs: logprobs.take(),
                    });
                    stop = StopReason::after_token(
                        (self.is_end)(token),
                        seq.generated,
                        seq.max_tokens,
                    );
                    if stop.is_some() {
                        break;
                    }
                }
                if stop.is_none() && seq.blocks.len() + 1 > self.config.context {
                    stop = Some(StopReason::ContextFull);
                }
                if let Some(stop) = stop {
                    finished.push((p.index, stop));
                }
            }
            seq.blocks
                .cache_full_blocks(&mut self.state.pool, &seq.tokens, seq.prompt_role_tokens);
        }
        // The highest index first, so that the lower ones stay valid.
        finished.sort_unstable_by_key(|&(index, _)| index);
        for (index, stop) in finished.into_iter().rev() {
            let seq = self.running.remove(index);
            events.push(self.retire(seq, stop));
        }
    }

    /// Frees a finished sequence's blocks and reports it.
    fn retire(&mut self, mut seq: Sequence, stop: StopReason) -> Event {
        seq.blocks.release(&mut self.state.pool);
        if let Some(spec) = &mut self.speculation {
            spec.drafter.finish(seq.id.0);
        }
        let now = Instant::now();
        let first_token = seq.first_token.unwrap_or(now);
        Event::Finished {
            id: seq.id,
            stats: GenerationStats {
                prompt_tokens: seq.prompt_tokens,
                reused_tokens: seq.reused.unwrap_or(0),
                generated_tokens: seq.generated,
                prefill: first_token - seq.first_scheduled.unwrap_or(first_token),
                decode: now - first_token,
                stop,
            },
            spec: self.speculation.as_ref().map(|_| Box::new(seq.spec)),
        }
    }
}

impl<B: Backend> BatchEngine for Batcher<B>
where
    Batcher<B>: Send,
{
    fn add(&mut self, sequence: NewSequence) -> Result<SequenceId, Error> {
        let NewSequence {
            prompt,
            sampler,
            max_tokens,
            logprobs,
        } = sequence;
        let invalid = |name, why: String| Err(Error::InvalidParameter { name, why });
        if prompt.is_empty() {
            return invalid("prompt", "is empty".into());
        }
        if max_tokens == 0 {
            return invalid("max_tokens", "must be at least 1".into());
        }
        let vocab = self.model.config().vocab;
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return invalid(
                "prompt",
                format!("token {bad} is not below the vocabulary size {vocab}"),
            );
        }
        if prompt.len() > self.config.context {
            return Err(Error::ContextFull {
                tokens: prompt.len(),
                context: self.config.context,
            });
        }
        let id = SequenceId(self.next_id);
        self.next_id += 1;
        let drafting = match &mut self.speculation {
            Some(spec) => {
                spec.drafter.start(id.0, sampler.params())?;
                SequenceDrafting::new(id.0, spec.policy, &spec.costs)
            }
            None => SequenceDrafting::new(id.0, DraftPolicy::Fixed(0), &PairCosts::default()),
        };
        self.waiting.push_back(Sequence {
            id,
            prompt_tokens: prompt.len(),
            prompt_role_tokens: match self.model.backend().prompt_role(prompt.len()) {
                TokenRole::Prompt => prompt.len(),
                TokenRole::Generated => 0,
            },
            tokens: prompt,
            blocks: SequenceBlocks::new(),
            sampler,
            max_tokens,
            logprobs: logprobs.map(|n| n.min(MAX_TOP_LOGPROBS)),
            generated: 0,
            reused: None,
            first_scheduled: None,
            first_token: None,
            spec: SpecStats::default(),
            drafting,
            draft: Draft::default(),
        });
        Ok(id)
    }

    fn stop(&mut self, id: SequenceId) -> Option<Event> {
        let seq = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            self.running.remove(i)
        } else {
            let i = self.waiting.iter().position(|s| s.id == id)?;
            self.waiting.remove(i).expect("found at this index")
        };
        Some(self.retire(seq, StopReason::Caller))
    }

    fn step(&mut self, events: &mut Vec<Event>) -> Result<(), Error> {
        self.plan.clear();
        let passes_recorded = self.model.backend().passes_recorded();
        let preemptions = self.preemptions;
        let budget = self.plan_running();
        // A pool that was just short takes nobody new: a preempted sequence re-admitted at
        // once would only be preempted again.
        let budget = if self.preemptions == preemptions {
            self.admit(budget)
        } else {
            budget
        };
        if self.plan.is_empty() {
            return Ok(());
        }
        self.plan_drafts(budget)?;
        // A pass holds its prompt tokens first (`RaggedBatch`); drafting entries keep their
        // order, which the drafts' bookkeeping follows.
        let running = &self.running;
        self.plan
            .sort_by_key(|p| running[p.index].role(p.start) == TokenRole::Generated);
        let started = Instant::now();
        let before_pass = self.model.backend().passes_recorded();
        self.forward()?;
        let was_warm = std::mem::replace(&mut self.warm, true);
        if let Some(spec) = &mut self.speculation
            && self.model.backend().passes_recorded() == before_pass
            && was_warm
        {
            spec.costs
                .observe_pass(self.state.batch.len(), started.elapsed());
        }
        self.commit(started, passes_recorded, events);
        Ok(())
    }

    fn load(&self) -> Load {
        Load {
            running: self.running.len(),
            waiting: self.waiting.len(),
            max_sequences: self.config.max_sequences,
            kv_blocks_used: self.state.pool.blocks() - self.state.pool.free_blocks(),
            kv_blocks: self.state.pool.blocks(),
            preemptions: self.preemptions,
        }
    }

    fn context(&self) -> usize {
        self.config.context
    }
}
