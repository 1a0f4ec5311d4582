//! Speculation replayed against a known output, priced by given pass costs: what a drafter and
//! a draft-length policy would make of a text, without a model and without the noise of timing.

use std::time::Duration;

use super::adaptive::{PairCosts, Rivals};
use super::{
    Draft, DraftInput, DraftPolicy, Drafter, Round, SPECULATOR_SEQUENCE, SequenceDrafting,
    SpecStats, run_drafter,
};
use crate::{Error, SamplingParams};

/// What replaying one output gave.
#[derive(Clone, Debug, Default)]
pub struct Replayed {
    /// The rounds as a speculator counts them; their verify time is the given costs' and
    /// their drafting time the drafter's real one.
    pub stats: SpecStats,
    /// Seconds of the passes had each round drafted only the tokens that were accepted: what
    /// any control of the draft length could reach with these drafts.
    pub oracle_seconds: f64,
    /// The rounds that fell short: fewer tokens accepted than the policy asked for.
    pub short_rounds: Vec<ShortRound>,
}

impl Replayed {
    /// Rounds, plain steps included: verify passes.
    pub fn rounds(&self) -> u64 {
        self.stats.speculative_rounds + self.stats.plain_steps
    }

    /// Seconds of the rounds' passes.
    pub fn seconds(&self) -> f64 {
        self.stats.verify_time.as_secs_f64()
    }
}

/// A round of a replay that fell short.
#[derive(Clone, Debug)]
pub struct ShortRound {
    /// How many output tokens came before it.
    pub at: usize,
    /// The draft length the policy asked for.
    pub asked: usize,
    /// What the drafter proposed.
    pub drafted: Vec<u32>,
    /// How many of those the output has next.
    pub accepted: usize,
}

impl PairCosts {
    /// Costs that measured a target pass of `n` tokens at `pass_seconds[n - 1]`, and nothing
    /// else yet.
    pub fn with_passes(pass_seconds: &[f64]) -> Self {
        let mut costs = Self::default();
        for (i, &seconds) in pass_seconds.iter().enumerate() {
            costs.observe_pass(i + 1, Duration::from_secs_f64(seconds));
        }
        costs
    }
}

/// Replays `output`, the target's greedy continuation of `input`, as a [`Speculator`] would
/// decode it with `drafter` and `policy` if a pass of `n` tokens took `pass_seconds[n - 1]`:
/// each round drafts as the policy says after the output so far, keeps the drafted tokens
/// equal to the output's and one more, and takes a pass over the draft and its pending token.
/// `costs` are the pair's, as a speculator keeps them across requests: the passes the rounds
/// take are measured in them at the given costs, and the drafter at its real speed. Every
/// output token is produced by a round; the first, which follows the prompt, too.
///
/// [`Speculator`]: super::Speculator
pub fn replay(
    drafter: &mut dyn Drafter,
    policy: DraftPolicy,
    costs: &mut PairCosts,
    input: &[u32],
    output: &[u32],
    pass_seconds: &[f64],
) -> Result<Replayed, Error> {
    if policy.longest() >= pass_seconds.len() {
        return Err(Error::InvalidParameter {
            name: "pass_seconds",
            why: format!(
                "prices passes of up to {} tokens, and drafts of {} take {} tokens",
                pass_seconds.len(),
                policy.longest(),
                policy.longest() + 1
            ),
        });
    }
    drafter.start(SPECULATOR_SEQUENCE, &SamplingParams::default())?;
    let mut drafting = SequenceDrafting::new(SPECULATOR_SEQUENCE, policy, costs);
    let mut draft = Draft::default();
    let mut sequence = input.to_vec();
    let mut replayed = Replayed::default();
    let mut at = 0;
    while at < output.len() {
        let remaining = output.len() - at;
        let plan = drafting.plan(drafter, policy, costs, &sequence, remaining);
        // As a speculator drafts nothing beyond what may still be generated.
        let k = plan.wanted.min(remaining - 1);
        let view = DraftInput::new(SPECULATOR_SEQUENCE, &sequence[plan.view_from..]);
        let drafting_time = run_drafter(drafter, view, plan.unseen, k, &mut draft)?;
        let accepted = draft
            .tokens()
            .iter()
            .zip(&output[at..])
            .take_while(|(drafted, wanted)| drafted == wanted)
            .count();
        let round = Round {
            drafted: draft.len(),
            accepted,
            next: output[at + accepted],
            drafting: drafting_time,
            verify_time: Duration::from_secs_f64(pass_seconds[draft.len()]),
            recorded_a_pass: false,
        };
        round.price_own_pass(costs);
        let stats = &mut replayed.stats;
        round.record(k, stats, &mut drafting.control, costs, Rivals::None);
        replayed.oracle_seconds += pass_seconds[accepted];
        if accepted < k {
            replayed.short_rounds.push(ShortRound {
                at,
                asked: k,
                drafted: draft.tokens().to_vec(),
                accepted,
            });
        }
        sequence.extend_from_slice(&output[at..=at + accepted]);
        at += accepted + 1;
    }
    drafter.finish(SPECULATOR_SEQUENCE);
    Ok(replayed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculative::NgramDrafter;

    #[test]
    fn a_replay_prices_each_round_by_its_draft() {
        // The output repeats the input, then leaves it: n-gram drafts after "1 2" are
        // "3 4 5 ...".
        let input = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2];
        let output = [3, 4, 5, 6, 7, 9, 9];
        let pass_seconds = [1.0, 1.5, 2.0, 2.5];
        let mut costs = PairCosts::with_passes(&pass_seconds);
        let mut drafter = NgramDrafter::default();
        let fixed = DraftPolicy::Fixed(3);
        let r = replay(
            &mut drafter,
            fixed,
            &mut costs,
            &input,
            &output,
            &pass_seconds,
        )
        .unwrap();
        // 3 4 5 drafted and kept, 6 added; 7 8 drafted (no more: three tokens remain), 7
        // kept and 9 added; the last 9 a plain step.
        let counts = (
            r.rounds(),
            r.stats.drafted_tokens(),
            r.stats.accepted_tokens(),
        );
        assert_eq!(counts, (3, 5, 4));
        assert_eq!(r.seconds(), 2.5 + 2.0 + 1.0);
        assert_eq!(r.oracle_seconds, 2.5 + 1.5 + 1.0);
        let short: Vec<_> = r.short_rounds.iter().map(|s| (s.at, s.asked)).collect();
        assert_eq!(short, [(4, 2)]);
        assert_eq!(r.short_rounds[0].drafted, [7, 8]);
        let too_long = replay(
            &mut drafter,
            DraftPolicy::Fixed(4),
            &mut costs,
            &input,
            &output,
            &pass_seconds,
        );
        assert!(too_long.is_err());
    }
}
