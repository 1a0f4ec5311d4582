//! Speculative decoding: a drafter proposes tokens, the target checks them all in one forward
//! pass, and the output is exactly what the target alone would produce.
//!
//! Each round feeds the target the pending token (the last one chosen, not yet fed) followed by
//! the k drafted tokens, keeping all k + 1 logits rows. Row i is the target's prediction after
//! drafted token i - 1, bitwise equal to what decoding one token at a time gives, so:
//!
//! - greedy: drafted tokens are accepted while they equal the target's argmax; the first that
//!   does not is replaced by the argmax, and when all are accepted the last row adds one more.
//!   The output is token for token the target's.
//! - sampled: drafted token i, drawn by the drafter from q, is accepted with probability
//!   min(1, p/q), where p is the target's distribution at row i after the same transforms
//!   (penalties over the same history, temperature, top-k, top-p, min-p); on rejection the
//!   token is drawn from max(p - q, 0) renormalised, and when all are accepted a bonus token is
//!   drawn from the last row. Every token produced is distributed exactly as the target's own
//!   sampling would draw it, for every combination of parameters the sampler takes, so there is
//!   no combination that has to fall back to plain decoding.
//!
//! Rejected tokens are dropped from the target's KV cache by truncating its block table; the
//! drafter drops its own the same way when it next sees the sequence.
//!
//! # Adding a drafter
//!
//! Implement [`Drafter`]: `propose` gets one or more sequences, each with the most tokens it may
//! add, and fills each one's [`Draft`] with tokens and the distribution each was drawn from
//! ([`Draft::push_certain`] for a deterministic guess). Sequences are known by the key given
//! to `start` and released by `finish`; a drafter with a cache brings it up to date in
//! `catch_up`, and says in `unseen` how many tokens that will feed, so the draft-length control
//! can weigh a catch-up before paying it. A call with many sequences is a batch's: a model
//! drafter drafts a position of all of them in one forward pass. A block drafter in the style
//! of DFlash, which proposes a whole block in one forward pass conditioned on the target's
//! hidden states, fits the same call: the states become a field of [`DraftInput`], filled from
//! the verify pass (the target's forward pass would keep the rows of the layers the drafter
//! names), and the drafter fills each draft from its single pass. Nothing else in the engine
//! changes: verification, rollback and the draft-length control only ever see tokens and
//! distributions.

mod adaptive;
mod batch;
mod drafter;
mod renames;
mod replay;
mod stats;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lucebox_backend::Backend;
use lucebox_model::Model;

pub use adaptive::{CatchUp, DraftLength, MAX_DRAFT, PairCosts, Plan, Rivals};
pub(crate) use batch::{DraftPrice, Offer, Pass, allot};
pub use drafter::{
    Draft, DraftInput, Drafter, DrafterConfig, ModelDrafter, NgramDrafter, Proposal,
};
pub use renames::Spelling;
pub use replay::{Replayed, ShortRound, replay};
pub use stats::SpecStats;

use crate::session::TokenSink;
use crate::{Error, GenerationStats, Sampler, Session, SessionConfig, StopReason};

/// How many tokens each round drafts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftPolicy {
    /// Always `k` (fewer only near `max_tokens` or the end of the context).
    Fixed(usize),
    /// Chosen each round from measured acceptance and costs, up to the given length; 0 when
    /// speculation does not pay.
    Adaptive(usize),
}

impl DraftPolicy {
    pub(crate) fn longest(self) -> usize {
        match self {
            DraftPolicy::Fixed(k) | DraftPolicy::Adaptive(k) => k,
        }
    }
}

/// The sequence a [`Speculator`] drafts for, to its drafter: one at a time, always this one.
const SPECULATOR_SEQUENCE: u64 = 0;

/// A target model's session with a drafter.
pub struct Speculator<B: Backend> {
    target: Session<B>,
    drafter: Box<dyn Drafter + Send>,
    policy: DraftPolicy,
    draft: Draft,
    /// What drafting and verifying cost, kept across requests.
    costs: PairCosts,
    /// The target's tokens and the pending one; the drafter sees them from its plan's
    /// `view_from` on.
    sequence: Vec<u32>,
    /// The tokens of one verify pass: the pending token and the draft.
    verify: Vec<u32>,
    /// Vocabulary-sized zeros, scratch for rejection sampling.
    dense: Vec<f32>,
    /// [`set_host_sampling`](Self::set_host_sampling).
    host_sampling: bool,
}

impl<B: Backend> std::fmt::Debug for Speculator<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speculator")
            .field("target", &self.target)
            .field("drafter", &self.drafter.kind())
            .field("policy", &self.policy)
            .finish()
    }
}

impl<B: Backend> Speculator<B> {
    /// A session on `target` (sized by `config`; its `scored_tokens` is raised to fit the
    /// longest draft) that speculates with `drafter`.
    pub fn new(
        target: Arc<Model<B>>,
        config: SessionConfig,
        drafter: Box<dyn Drafter + Send>,
        policy: DraftPolicy,
    ) -> Result<Self, Error> {
        let longest = policy.longest();
        if longest > MAX_DRAFT {
            return Err(Error::InvalidParameter {
                name: "draft length",
                why: format!("{longest} is above {MAX_DRAFT}"),
            });
        }
        let vocab = target.config().vocab;
        let target = Session::new(
            target,
            SessionConfig {
                scored_tokens: config.scored_tokens.max(longest + 1),
                ..config
            },
        )?;
        let context = target.config().context;
        Ok(Self {
            target,
            drafter,
            policy,
            draft: Draft::default(),
            costs: PairCosts::default(),
            sequence: Vec::with_capacity(context),
            verify: Vec::with_capacity(longest + 1),
            dense: vec![0.0; vocab],
            host_sampling: false,
        })
    }

    /// Samples and verifies on the host, from the logits rows copied back, even where the
    /// backend draws tokens on the device ([`Backend::samples_rows`]): the baseline to measure
    /// the device against. The same seed gives the same tokens either way.
    pub fn set_host_sampling(&mut self, on: bool) {
        self.host_sampling = on;
    }

    /// The target's session: every token fed to it so far, and its KV cache.
    pub fn target(&mut self) -> &mut Session<B> {
        &mut self.target
    }

    /// The target session's configuration.
    pub fn config(&self) -> SessionConfig {
        self.target.config()
    }

    /// What drafting and verifying have cost so far, and the acceptance seen.
    pub fn costs(&self) -> &PairCosts {
        &self.costs
    }

    /// The tokens the target's KV cache holds.
    pub fn tokens(&self) -> &[u32] {
        self.target.tokens()
    }

    /// Generates a continuation of `prompt` (the whole sequence: the KV positions of a prefix
    /// shared with the previous call are reused) like [`Session::generate`], producing exactly
    /// the tokens (greedy) or the distribution of tokens (sampled) that the target alone
    /// would, and returns what speculation did besides.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        max_tokens: usize,
        is_end: impl Fn(u32) -> bool,
        on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> Result<(GenerationStats, SpecStats), Error> {
        if prompt.is_empty() {
            return Err(Error::InvalidParameter {
                name: "prompt",
                why: "is empty".into(),
            });
        }
        let mut spec = SpecStats::default();
        let mut out = TokenSink::new(prompt.len(), max_tokens, is_end, on_token);
        if max_tokens == 0 {
            return Ok((out.finish(), spec));
        }
        self.drafter.start(SPECULATOR_SEQUENCE, sampler.params())?;
        let reused = self.target.feed_reusing(prompt)?;
        let mut pending = if self.host_sampling {
            self.target.sample_on_host(sampler)?
        } else {
            self.target.sample(sampler)?
        };
        out.prefill_done(reused);
        let mut drafting = SequenceDrafting::new(SPECULATOR_SEQUENCE, self.policy, &self.costs);
        if !out.push(pending) {
            return Ok((out.finish(), spec));
        }
        loop {
            let room = self.target.config().context - self.target.tokens().len();
            if room == 0 {
                return Ok((out.stop(StopReason::ContextFull), spec));
            }
            self.sequence.clear();
            self.sequence.extend_from_slice(self.target.tokens());
            self.sequence.push(pending);
            let plan = drafting.plan(
                &*self.drafter,
                self.policy,
                &self.costs,
                &self.sequence,
                out.remaining(),
            );
            // Nothing is drafted beyond what may still be generated or fit in the context.
            let k = plan.wanted.min(out.remaining() - 1).min(room - 1);
            let round = self.round(pending, k, &plan, sampler)?;
            round.price_own_pass(&mut self.costs);
            let control = &mut drafting.control;
            round.record(k, &mut spec, control, &mut self.costs, Rivals::None);
            let accepted = self.draft.tokens()[..round.accepted].iter().copied();
            if !accepted.chain([round.next]).all(|token| out.push(token)) {
                return Ok((out.finish(), spec));
            }
            pending = round.next;
        }
    }

    /// One round: has the drafter draft up to `k` tokens after `pending` from its view of
    /// `self.sequence` as `plan` says, verifies them with the target and drops the rejected
    /// ones from its cache.
    fn round(
        &mut self,
        pending: u32,
        k: usize,
        plan: &RoundPlan,
        sampler: &mut Sampler,
    ) -> Result<Round, Error> {
        let recorded = self.target.model().backend().passes_recorded();
        let view = DraftInput::new(SPECULATOR_SEQUENCE, &self.sequence[plan.view_from..]);
        let timing = run_drafter(&mut *self.drafter, view, plan.unseen, k, &mut self.draft)?;

        let verify_started = Instant::now();
        let drafted = self.draft.len();
        self.verify.clear();
        self.verify.push(pending);
        self.verify.extend_from_slice(self.draft.tokens());
        let base = self.target.tokens().len();
        self.target.feed_scored(&self.verify)?;
        let on_device = !self.host_sampling && self.target.model().backend().samples_rows();
        let scores = if sampler.params().is_plain_greedy() {
            Scores::Picks(self.target.argmax_rows()?)
        } else if on_device && self.draft.is_certain() {
            Scores::Picks(self.target.draw_rows(sampler)?)
        } else {
            let (logits, tokens) = self.target.read_logits()?;
            Scores::Rows { logits, tokens }
        };
        let (accepted, next) = accept(&self.draft, scores, sampler, &mut self.dense);
        self.target.truncate(base + 1 + accepted);
        Ok(Round {
            drafted,
            accepted,
            next,
            drafting: timing,
            verify_time: verify_started.elapsed(),
            recorded_a_pass: self.target.model().backend().passes_recorded() != recorded,
        })
    }
}

/// One sequence's side of speculation: its key to the drafter, its draft-length control, and
/// where the drafter's view of the sequence starts (past 0 once the drafter was restarted on
/// the last tokens only).
#[derive(Clone, Debug)]
pub(crate) struct SequenceDrafting {
    sequence: u64,
    pub control: DraftLength,
    view_from: usize,
}

/// A sequence's next round, as planned.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RoundPlan {
    /// The draft length wanted, before the limits of what may still be generated or fit.
    pub wanted: usize,
    /// Where the tokens the drafter sees start in the sequence.
    pub view_from: usize,
    /// How many of those the drafter has not seen ([`Drafter::unseen`]).
    pub unseen: usize,
}

impl SequenceDrafting {
    /// A new sequence, known to the drafter as `sequence`, speculating with `policy` on a
    /// pair that measured `costs` so far.
    pub(crate) fn new(sequence: u64, policy: DraftPolicy, costs: &PairCosts) -> Self {
        Self {
            sequence,
            control: DraftLength::new(policy.longest(), costs),
            view_from: 0,
        }
    }

    /// What the drafter sees of `tokens`, the sequence and its pending token.
    pub(crate) fn view<'a>(&self, tokens: &'a [u32]) -> DraftInput<'a> {
        DraftInput::new(self.sequence, &tokens[self.view_from.min(tokens.len())..])
    }

    /// Plans the next round for `tokens` (the sequence and its pending token), which may grow
    /// by up to `remaining` more.
    pub(crate) fn plan(
        &mut self,
        drafter: &dyn Drafter,
        policy: DraftPolicy,
        costs: &PairCosts,
        tokens: &[u32],
        remaining: usize,
    ) -> RoundPlan {
        let sequence = self.sequence;
        let unseen_from = |from: usize| drafter.unseen(&DraftInput::new(sequence, &tokens[from..]));
        let unseen = unseen_from(self.view_from);
        let plan = match policy {
            DraftPolicy::Fixed(k) => Plan::draft(k),
            DraftPolicy::Adaptive(_) => self.control.choose(costs, unseen, remaining),
        };
        let unseen = match plan.catch_up {
            CatchUp::Full => unseen,
            CatchUp::RestartOn(last) => {
                self.view_from = tokens.len().saturating_sub(last);
                unseen_from(self.view_from)
            }
        };
        RoundPlan {
            wanted: plan.draft,
            view_from: self.view_from,
            unseen,
        }
    }
}

/// Where a round's drafting time went.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DraftTiming {
    /// The tokens [`Drafter::catch_up`] fed: a prefill after a prompt or plain steps, a
    /// round's last token between drafting rounds.
    pub caught_up: usize,
    pub catch_up: Duration,
    /// [`Drafter::propose`]: the steady cost of drafting.
    pub propose: Duration,
    /// Whether the drafting was shared with other sequences, in drafter passes that each
    /// drafted a position for all of them: its times are this sequence's share, and the
    /// passes are priced by the caller.
    pub shared: bool,
}

/// Has `drafter`, `unseen` tokens behind `input` ([`Drafter::unseen`]), propose up to `k`
/// tokens to follow it into `draft` (emptied first; left empty when `k` is 0), timing its
/// catch-up and its proposal apart.
pub(crate) fn run_drafter(
    drafter: &mut dyn Drafter,
    input: DraftInput<'_>,
    unseen: usize,
    k: usize,
    draft: &mut Draft,
) -> Result<DraftTiming, Error> {
    draft.clear();
    if k == 0 {
        return Ok(DraftTiming::default());
    }
    let started = Instant::now();
    drafter.catch_up(&[input])?;
    let caught_up = Instant::now();
    let proposal = Proposal {
        input,
        max: k,
        draft: &mut *draft,
    };
    drafter.propose(&mut [proposal])?;
    draft.truncate(k);
    Ok(DraftTiming {
        caught_up: unseen,
        catch_up: caught_up - started,
        propose: caught_up.elapsed(),
        shared: false,
    })
}

/// The target's verdicts on a draft: the logits rows of the verify pass (the pending token's,
/// then one per drafted token).
pub(crate) enum Scores<'a> {
    /// The target's own token at each row: its most likely one (plain greedy), or, for a
    /// certain draft, its draw with one uniform number per row, as [`accept`] draws on the
    /// host.
    Picks(&'a [u32]),
    /// The rows, vocabulary-sized, and the sequence through the last drafted token (the
    /// history penalties look at).
    Rows {
        logits: &'a mut [f32],
        tokens: &'a [u32],
    },
}

/// Decides how many of `draft`'s tokens the target accepts and which token follows them (a
/// replacement for the first rejected one, or a bonus token after all of them): token for
/// token the target's own choice when greedy, its own distribution when sampled.
///
/// A certain draft (n-gram lookup, a greedy drafter) is verified by drawing the target's token
/// from each row and keeping the draft while they agree. That is rejection sampling for a
/// proposal q with all its mass on the drafted token x: it is kept with probability p(x) =
/// min(1, p(x) / q(x)), and a disagreeing draw is distributed as p without x, renormalised,
/// which is max(p - q, 0) renormalised. One uniform number is taken per row, every row, also
/// those after the first disagreement, because a device draws all of them at once
/// ([`Scores::Picks`]): the same seed then gives the same tokens wherever they are drawn.
pub(crate) fn accept(
    draft: &Draft,
    scores: Scores<'_>,
    sampler: &mut Sampler,
    dense: &mut [f32],
) -> (usize, u32) {
    match scores {
        Scores::Picks(picks) => {
            let accepted = draft
                .tokens()
                .iter()
                .zip(picks)
                .take_while(|(d, p)| d == p)
                .count();
            (accepted, picks[accepted])
        }
        Scores::Rows { logits, tokens } if draft.is_certain() => {
            let drafted = draft.len();
            let base = tokens.len() - 1 - drafted;
            let mut outcome = None;
            for (i, row) in logits.chunks_exact_mut(dense.len()).enumerate() {
                let uniform = sampler.next_uniform();
                if outcome.is_none() {
                    let token = sampler.sample_with(row, &tokens[..base + 1 + i], uniform);
                    if draft.tokens().get(i) != Some(&token) {
                        outcome = Some((i, token));
                    }
                }
            }
            outcome.expect("the row after the draft has no drafted token to agree with")
        }
        Scores::Rows { logits, tokens } => {
            let drafted = draft.len();
            let base = tokens.len() - 1 - drafted;
            let mut rows = logits.chunks_exact_mut(dense.len());
            let mut accepted = 0;
            let mut replacement = None;
            for (i, row) in rows.by_ref().take(drafted).enumerate() {
                let history = &tokens[..base + 1 + i];
                let (token, from) = (draft.tokens()[i], draft.distribution(i));
                replacement = sampler.verify_draft(row, history, token, from, dense);
                if replacement.is_some() {
                    break;
                }
                accepted += 1;
            }
            let next = match replacement {
                Some(token) => token,
                // Every draft accepted: the bonus token comes from the row after the last.
                None => {
                    let row = rows.next().expect("a row after the drafts");
                    sampler.sample(row, &tokens[..base + 1 + accepted])
                }
            };
            (accepted, next)
        }
    }
}

/// The outcome of one round.
pub(crate) struct Round {
    pub drafted: usize,
    pub accepted: usize,
    /// The token the target chose after the accepted ones: a replacement or the bonus.
    pub next: u32,
    pub drafting: DraftTiming,
    pub verify_time: Duration,
    /// Whether a forward pass of the round was recorded as a graph, as the target's backend
    /// counts them ([`Backend::passes_recorded`]; a model drafter on the same device shares
    /// it): then its times include that one-off cost.
    pub recorded_a_pass: bool,
}

impl Round {
    /// Prices the round's verify pass in `costs`, when the round had the pass to itself.
    pub(crate) fn price_own_pass(&self, costs: &mut PairCosts) {
        if !self.recorded_a_pass {
            costs.observe_pass(self.drafted + 1, self.verify_time);
        }
    }

    /// Counts this round, which asked for `k` drafted tokens against `rivals`, in the
    /// sequence's `spec` and `control` and in the pair's `costs`. The statistics count all the
    /// time spent drafting; the costs price a catch-up beyond a round's last token per token,
    /// apart from drafting, and take nothing from a round that recorded a pass (a one-off
    /// cost). The target's pass is the caller's to price: a batch shares it.
    pub(crate) fn record(
        &self,
        k: usize,
        spec: &mut SpecStats,
        control: &mut DraftLength,
        costs: &mut PairCosts,
        rivals: Rivals,
    ) {
        spec.record_round(self.drafted, self.accepted);
        spec.draft_time += self.drafting.catch_up + self.drafting.propose;
        spec.verify_time += self.verify_time;
        let d = &self.drafting;
        if !self.recorded_a_pass && !d.shared {
            costs.observe_drafting(d.caught_up, d.catch_up, self.drafted, d.propose);
        }
        // A drafter with nothing to propose (n-gram lookup without a match) made a plain step
        // that says nothing of acceptance, nor of the probe schedule.
        if self.drafted > 0 || k == 0 {
            control.observe(costs, self.drafted, self.accepted, rivals);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SamplingParams;

    #[test]
    fn a_certain_draft_is_verified_by_the_target_s_own_draw_at_each_row() {
        // Three rows of four tokens verify a draft of two. Whatever the seed, the outcome is
        // drawing each row in turn and keeping the draft while it agrees, and the round takes
        // one uniform number per row, the rows after a disagreement too, as a device drawing
        // them all at once does. The first token out is then the first row's draw, so it is
        // distributed as the target's own.
        let rows = [
            [1.0f32, 0.5, -0.5, 0.0],
            [0.2, 1.5, 0.0, -1.0],
            [0.0, 0.0, 1.0, 0.3],
        ];
        let params = |seed| SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            presence_penalty: 0.4,
            seed: Some(seed),
            ..SamplingParams::default()
        };
        let mut draft = Draft::default();
        draft.push_certain(0);
        draft.push_certain(1);
        assert!(draft.is_certain());
        // The history before the pending token (2), then the draft.
        let tokens = [3, 1, 2, 0, 1];
        let mut outcomes = [0; 3];
        for seed in 0..300 {
            let mut sampler = Sampler::new(params(seed));
            let mut logits = rows.concat();
            let scores = Scores::Rows {
                logits: &mut logits,
                tokens: &tokens,
            };
            let (accepted, next) = accept(&draft, scores, &mut sampler, &mut [0.0; 4]);
            let mut reference = Sampler::new(params(seed));
            let drawn: Vec<u32> = rows
                .iter()
                .enumerate()
                .map(|(i, row)| reference.sample(&mut row.to_vec(), &tokens[..3 + i]))
                .collect();
            let agreed = draft
                .tokens()
                .iter()
                .zip(&drawn)
                .take_while(|(d, t)| d == t)
                .count();
            assert_eq!((accepted, next), (agreed, drawn[agreed]), "seed {seed}");
            assert_eq!(
                sampler.next_uniform(),
                reference.next_uniform(),
                "seed {seed}"
            );
            outcomes[accepted] += 1;
        }
        assert!(outcomes.iter().all(|&n| n > 0), "{outcomes:?}");
    }

    /// A round that drafted two tokens, both accepted, after catching up on `caught_up`.
    fn round(caught_up: usize, catch_up: u64, propose: u64) -> Round {
        Round {
            drafted: 2,
            accepted: 2,
            next: 0,
            drafting: DraftTiming {
                caught_up,
                catch_up: Duration::from_millis(catch_up),
                propose: Duration::from_millis(propose),
                shared: false,
            },
            verify_time: Duration::from_millis(12),
            recorded_a_pass: false,
        }
    }

    /// Records `round` as a lone sequence's, its pass priced too.
    fn record_alone(
        round: &Round,
        k: usize,
        spec: &mut SpecStats,
        control: &mut DraftLength,
        costs: &mut PairCosts,
    ) {
        round.price_own_pass(costs);
        round.record(k, spec, control, costs, Rivals::None);
    }

    /// Pair costs that have measured a 10 ms plain step, a sequence's control and statistics.
    fn after_a_plain_step() -> (DraftLength, PairCosts, SpecStats) {
        let mut costs = PairCosts::default();
        let mut control = DraftLength::new(4, &costs);
        let plain = Round {
            drafted: 0,
            accepted: 0,
            verify_time: Duration::from_millis(10),
            ..round(0, 0, 0)
        };
        let mut spec = SpecStats::default();
        record_alone(&plain, 0, &mut spec, &mut control, &mut costs);
        (control, costs, SpecStats::default())
    }

    #[test]
    fn a_drafter_s_prefill_counts_in_the_statistics_and_is_priced_per_token() {
        let (mut control, mut costs, mut spec) = after_a_plain_step();
        // The first round after a prompt of 500 tokens: the drafter's prefill took a second,
        // its two drafts 2 ms.
        record_alone(&round(500, 1000, 2), 2, &mut spec, &mut control, &mut costs);
        assert_eq!(spec.draft_time, Duration::from_millis(1002));
        assert!(
            control.choose(&costs, 1, 100).draft > 0,
            "a cheap, accurate drafter keeps drafting"
        );
        // After two accepted drafts, drafting four tokens is expected to give 3.28 in 18 ms,
        // saving 4.5 ms a token against plain steps: catching up on 100 tokens at 2 ms each
        // takes 44 tokens to repay, and 10 tokens repay 22 tokens' catch-up, too few to
        // restart the drafter on.
        assert_eq!(control.choose(&costs, 100, 100), Plan::draft(4));
        assert_eq!(control.choose(&costs, 100, 10), Plan::PLAIN);
    }

    /// A drafter that holds every token it caught up on, as a model drafter's cache does,
    /// and always guesses token 0.
    #[derive(Default)]
    struct Following {
        held: Vec<u32>,
    }

    impl Drafter for Following {
        fn kind(&self) -> &'static str {
            "following"
        }

        fn start(&mut self, _: u64, _: &crate::SamplingParams) -> Result<(), Error> {
            Ok(())
        }

        fn unseen(&self, input: &DraftInput<'_>) -> usize {
            let followed = &input.tokens[..input.tokens.len() - 1];
            let shared = self.held.iter().zip(followed).take_while(|(a, b)| a == b);
            followed.len() - shared.count()
        }

        fn catch_up(&mut self, inputs: &[DraftInput<'_>]) -> Result<(), Error> {
            for input in inputs {
                self.held = input.tokens[..input.tokens.len() - 1].to_vec();
            }
            Ok(())
        }

        fn propose(&mut self, proposals: &mut [Proposal<'_>]) -> Result<(), Error> {
            for p in proposals {
                (0..p.max).for_each(|_| p.draft.push_certain(0));
            }
            Ok(())
        }
    }

    #[test]
    fn a_drafter_restarted_on_the_last_tokens_keeps_following_from_there() {
        let (mut control, mut costs, mut spec) = after_a_plain_step();
        // Catching up costs 2 ms a token, and rounds of four drafts save 4.5 ms a token.
        record_alone(&round(500, 1000, 2), 2, &mut spec, &mut control, &mut costs);
        let mut drafting = SequenceDrafting {
            sequence: 0,
            control,
            view_from: 0,
        };
        let mut drafter = Following::default();
        let mut tokens: Vec<u32> = (0..200).collect();
        let policy = DraftPolicy::Adaptive(4);
        // 30 tokens left repay 135 ms, 67 tokens of catch-up, not all 199.
        let plan = drafting.plan(&drafter, policy, &costs, &tokens, 30);
        assert_eq!(plan.wanted, 4);
        assert!((130..=135).contains(&plan.view_from), "{plan:?}");
        assert_eq!(plan.unseen, tokens.len() - 1 - plan.view_from);
        let mut draft = Draft::default();
        let view = drafting.view(&tokens);
        run_drafter(&mut drafter, view, plan.unseen, 4, &mut draft).unwrap();
        // Three more tokens: the drafter follows from where it restarted.
        tokens.extend([7, 8, 9]);
        let next = drafting.plan(&drafter, policy, &costs, &tokens, 27);
        assert_eq!(next.view_from, plan.view_from);
        assert_eq!(next.unseen, 3);
        assert_eq!(next.wanted, 4);
    }

    #[test]
    fn a_drafter_s_catch_up_between_drafting_rounds_is_part_of_their_price() {
        let (mut control, mut costs, mut spec) = after_a_plain_step();
        record_alone(&round(0, 0, 12), 2, &mut spec, &mut control, &mut costs);
        // Plain steps take 10 ms, a drafter pass 6 ms, verifying two drafts 12 ms: rounds of
        // two drafts, both accepted, would give 3 tokens in 24 ms, but each also feeds the
        // drafter the last token it proposed, one more pass, and at 30 ms they do not pay.
        for _ in 0..50 {
            record_alone(&round(1, 6, 12), 2, &mut spec, &mut control, &mut costs);
        }
        assert_eq!(
            control.choose(&costs, 1, 100),
            Plan::PLAIN,
            "speculation turns off"
        );
    }

    #[test]
    fn a_round_that_recorded_a_graph_counts_in_the_statistics_but_not_in_the_costs() {
        // Verifying two drafts took a second: as the pass was recorded, or as it runs.
        let slow = |recorded_a_pass| Round {
            verify_time: Duration::from_millis(1000),
            recorded_a_pass,
            ..round(0, 0, 12)
        };
        let (mut control, mut costs, mut spec) = after_a_plain_step();
        record_alone(&slow(true), 2, &mut spec, &mut control, &mut costs);
        assert_eq!(spec.verify_time, Duration::from_millis(1000));
        record_alone(&round(0, 0, 12), 2, &mut spec, &mut control, &mut costs);
        assert!(
            control.choose(&costs, 0, 100).draft > 0,
            "the recording is not the price of drafts"
        );
        let (mut control, mut costs, mut spec) = after_a_plain_step();
        record_alone(&slow(false), 2, &mut spec, &mut control, &mut costs);
        record_alone(&round(0, 0, 12), 2, &mut spec, &mut control, &mut costs);
        assert_eq!(
            control.choose(&costs, 0, 100),
            Plan::PLAIN,
            "a slow pass that recorded nothing is"
        );
    }
}
