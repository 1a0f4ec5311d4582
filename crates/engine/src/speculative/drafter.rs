//! What a drafter is, and the two the engine ships: a smaller model, and n-gram lookup.

use std::sync::Arc;

use lucebox_backend::Backend;
use lucebox_model::Model;

use crate::{Distribution, Error, Sampler, SamplingParams, Session, SessionConfig};

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
    /// row decides ([`accept`](super::accept)).
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

/// What a drafter sees of the sequence when it proposes.
///
/// The struct is open to new fields: a block drafter conditioned on the target's hidden states
/// (DFlash-style) gets them here, as a field filled by the engine's verify pass, without any
/// change to the drafters that ignore it.
#[derive(Debug)]
#[non_exhaustive]
pub struct DraftInput<'a> {
    /// Every token of the sequence so far, prompt included; the last one has not yet been fed
    /// to the target.
    pub tokens: &'a [u32],
}

impl<'a> DraftInput<'a> {
    /// The input for a sequence of `tokens`.
    pub fn new(tokens: &'a [u32]) -> Self {
        Self { tokens }
    }
}

/// Proposes the tokens a target model is likely to produce next.
///
/// A proposal is only ever a guess: the verifier accepts a drafted token with probability
/// min(1, p/q), where q is the distribution the drafter drew it from, so any drafter keeps the
/// output exact. Better guesses only make it faster. Drafters keep whatever state they like
/// between calls (a KV cache, an index) and must cope with the sequence having changed since
/// the last call: tokens rejected, others appended.
pub trait Drafter {
    /// A short name for statistics and logs.
    fn kind(&self) -> &'static str;

    /// Starts a new sequence, sampled with `params`; it may share a prefix with the last one.
    fn start(&mut self, params: &SamplingParams) -> Result<(), Error>;

    /// Whether the drafter keeps nothing between calls (its `start` and `catch_up` do nothing,
    /// and `propose` depends on its input alone), so that it may propose for many sequences in
    /// turn: a batch then verifies the drafts of all its sequences in one pass. A drafter that
    /// follows one sequence (a model with its KV cache) drafts only for a sequence running
    /// alone.
    fn is_stateless(&self) -> bool {
        false
    }

    /// Brings whatever state the drafter keeps up to date with `input.tokens` except the last
    /// one; called before every [`propose`](Self::propose) and timed apart from it, so it
    /// returns once that work has run (a drafter on a device waits for it). Between drafting
    /// rounds it feeds a round's last token, part of the price of drafting. After a new
    /// prompt, or plain steps with speculation off, it is a prefill: the engine prices it per
    /// token and drafts only when what drafting saves can repay it.
    fn catch_up(&mut self, input: &DraftInput<'_>) -> Result<(), Error> {
        let _ = input;
        Ok(())
    }

    /// How many tokens [`catch_up`](Self::catch_up) would feed for `input`: the price of
    /// drafting now beyond the proposal itself, which the draft-length control weighs.
    fn unseen(&self, input: &DraftInput<'_>) -> usize {
        let _ = input;
        0
    }

    /// Proposes up to `max` tokens to follow `input.tokens` into `draft`, which comes empty.
    /// Proposing fewer, or none, is always allowed.
    fn propose(
        &mut self,
        input: &DraftInput<'_>,
        max: usize,
        draft: &mut Draft,
    ) -> Result<(), Error>;
}

/// A smaller model with the target's tokenizer, sampled with the request's own parameters so
/// that its proposals follow the same transforms as the target's choices.
pub struct ModelDrafter<B: Backend> {
    session: Session<B>,
    sampler: Sampler,
}

impl<B: Backend> std::fmt::Debug for ModelDrafter<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelDrafter")
            .field("session", &self.session)
            .finish()
    }
}

/// Mixed into the request's seed for the drafter's own random stream, so that the drafter's
/// draws do not repeat the verifier's.
const DRAFTER_SEED_SALT: u64 = 0x6472_6166_7465_7221;

impl<B: Backend> ModelDrafter<B> {
    /// A drafter running `model` with room for `context` positions.
    pub fn new(model: Arc<Model<B>>, context: usize) -> Result<Self, Error> {
        let session = Session::new(
            model,
            SessionConfig {
                context,
                ..SessionConfig::default()
            },
        )?;
        Ok(Self {
            session,
            sampler: Sampler::new(SamplingParams::default()),
        })
    }

    /// What `catch_up` brings the cache to: every token but the last, when there is room to
    /// draft after them (the same condition as in `propose`).
    fn followed<'a>(&self, input: &DraftInput<'a>) -> Option<&'a [u32]> {
        let tokens = input.tokens;
        let fits = !tokens.is_empty() && tokens.len() < self.session.config().context;
        fits.then(|| &tokens[..tokens.len() - 1])
    }
}

impl<B: Backend> Drafter for ModelDrafter<B> {
    fn kind(&self) -> &'static str {
        "model"
    }

    /// Keeps the cache: the next proposal reuses whatever prefix the new sequence shares.
    fn start(&mut self, params: &SamplingParams) -> Result<(), Error> {
        let seed = params.seed.map(|s| s ^ DRAFTER_SEED_SALT);
        self.sampler = Sampler::new(SamplingParams {
            seed,
            ..params.clone()
        });
        Ok(())
    }

    fn catch_up(&mut self, input: &DraftInput<'_>) -> Result<(), Error> {
        if let Some(tokens) = self.followed(input) {
            self.session.follow(tokens)?;
            // Nothing reads the catch-up's result: without the wait, a device would still be
            // running it when `propose` starts, and its time would count as drafting.
            self.session.model().backend().synchronize()?;
        }
        Ok(())
    }

    fn unseen(&self, input: &DraftInput<'_>) -> usize {
        self.followed(input)
            .map_or(0, |tokens| self.session.unshared(tokens))
    }

    /// Feeds the last token (and, when `catch_up` was skipped, whatever else is new), then
    /// one pass per further drafted token: `max` passes in a round that follows a catch-up.
    fn propose(
        &mut self,
        input: &DraftInput<'_>,
        max: usize,
        draft: &mut Draft,
    ) -> Result<(), Error> {
        let context = input.tokens;
        let room = self.session.config().context.saturating_sub(context.len());
        let max = max.min(room);
        if max == 0 || context.is_empty() {
            return Ok(());
        }
        self.session.feed_reusing(context)?;
        let plain_greedy = self.sampler.params().is_plain_greedy();
        for i in 0..max {
            if plain_greedy {
                let token = self.session.sample(&mut self.sampler)?;
                draft.push_certain(token);
            } else {
                // After feed_reusing or feed, the pass kept one row: the last token's.
                let (row, history) = self.session.read_logits()?;
                let (token, from) = self.sampler.sample_with_distribution(row, history);
                draft.push_drawn(token, from);
            }
            if i + 1 < max {
                self.session.feed(&draft.tokens()[i..=i])?;
            }
        }
        Ok(())
    }
}

/// Prompt lookup: finds the latest earlier occurrence of the sequence's last few tokens and
/// proposes what followed it. Costs no model; strong wherever the output repeats its input
/// (code edits, quoting, retrieval).
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    longest: usize,
    shortest: usize,
}

impl NgramDrafter {
    /// Matches suffixes of `shortest..=longest` tokens, longest first.
    pub fn new(shortest: usize, longest: usize) -> Result<Self, Error> {
        if shortest == 0 || shortest > longest {
            return Err(Error::InvalidParameter {
                name: "ngram",
                why: format!("sizes {shortest}..={longest} are not a range of lengths >= 1"),
            });
        }
        Ok(Self { longest, shortest })
    }
}

impl Default for NgramDrafter {
    /// Suffixes of 2 to 4 tokens: a single token repeats too often by chance to predict much.
    fn default() -> Self {
        Self {
            longest: 4,
            shortest: 2,
        }
    }
}

impl Drafter for NgramDrafter {
    fn kind(&self) -> &'static str {
        "ngram"
    }

    fn start(&mut self, _: &SamplingParams) -> Result<(), Error> {
        Ok(())
    }

    fn is_stateless(&self) -> bool {
        true
    }

    fn propose(
        &mut self,
        input: &DraftInput<'_>,
        max: usize,
        draft: &mut Draft,
    ) -> Result<(), Error> {
        let tokens = input.tokens;
        if max == 0 {
            return Ok(());
        }
        for n in (self.shortest..=self.longest.min(tokens.len().saturating_sub(1))).rev() {
            let suffix = &tokens[tokens.len() - n..];
            // The latest earlier occurrence: its continuation starts at `start + n`, before the
            // suffix itself.
            let found = (0..tokens.len() - n)
                .rev()
                .find(|&start| &tokens[start..start + n] == suffix);
            if let Some(start) = found {
                for &t in tokens[start + n..].iter().take(max) {
                    draft.push_certain(t);
                }
                return Ok(());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ngram(tokens: &[u32], max: usize) -> Vec<u32> {
        let mut draft = Draft::default();
        NgramDrafter::default()
            .propose(&DraftInput::new(tokens), max, &mut draft)
            .unwrap();
        draft.tokens().to_vec()
    }

    #[test]
    fn ngram_proposes_what_followed_the_latest_match_of_the_longest_suffix() {
        // "7 8" occurs twice before the end; the later occurrence wins.
        assert_eq!(ngram(&[7, 8, 1, 2, 7, 8, 3, 4, 5, 7, 8], 3), [3, 4, 5]);
        // "1 2 3" matches with the longest suffix even though "2 3" occurs later.
        assert_eq!(ngram(&[1, 2, 3, 9, 9, 2, 3, 6, 1, 2, 3], 2), [9, 9]);
        // A continuation may run into the suffix itself.
        assert_eq!(ngram(&[5, 6, 5, 6], 4), [5, 6]);
    }

    #[test]
    fn ngram_proposes_nothing_without_a_match() {
        assert!(ngram(&[1, 2, 3, 4], 4).is_empty());
        assert!(ngram(&[1], 4).is_empty());
        assert!(ngram(&[], 4).is_empty());
        assert!(ngram(&[1, 2, 1, 2], 0).is_empty());
    }

    #[test]
    fn ngram_sizes_must_form_a_range() {
        assert!(NgramDrafter::new(0, 3).is_err());
        assert!(NgramDrafter::new(3, 2).is_err());
        assert!(NgramDrafter::new(1, 1).is_ok());
    }
}
