//! Choosing each round's draft length from what speculation has measurably bought so far.
//!
//! A round with k drafted tokens costs `k * draft + verify(k + 1)` and yields, when each
//! drafted token is accepted with probability `a` independently, `1 + a + ... + a^k` tokens.
//! The controller estimates `a`, the drafter's cost per token and the target's cost per forward
//! pass of n tokens from the rounds it has seen, and picks the k with the best expected tokens
//! per second. k = 0 is plain decoding; when it wins, speculation is off for the sequence and
//! an occasional short probe round refreshes the acceptance estimate, so speculation comes back
//! when the text turns predictable again. No probe runs when the measured costs leave no room
//! for a gain even at full acceptance: a probe is not free (a model drafter first catches up on
//! every token since its last round).

use std::time::Duration;

/// The longest draft a sequence may use.
pub const MAX_DRAFT: usize = 16;

/// How much each new observation moves an estimate (exponential moving average).
const SMOOTHING: f64 = 0.15;
/// A draft length must promise this much more than plain decoding to be used: estimates are
/// noisy, and speculating for no gain only adds risk.
const REQUIRED_GAIN: f64 = 1.03;
/// Plain steps between probes when speculation is off, at first and at most; the interval
/// doubles after each probe that does not turn speculation back on.
const FIRST_PROBE_AFTER: u32 = 8;
const LONGEST_PROBE_AFTER: u32 = 256;
/// The draft length of the first speculative round and of probe rounds.
const PROBE_DRAFT: usize = 2;

/// What the measurements call for.
enum Verdict {
    /// Draft this many tokens.
    Draft(usize),
    /// Decode plainly; a probe round may still turn speculation back on, or it may not.
    Plain { probe_may_pay: bool },
}

/// An exponential moving average that starts at its first observation.
#[derive(Clone, Copy, Debug, Default)]
struct Average(Option<f64>);

impl Average {
    fn observe(&mut self, x: f64) {
        self.0 = Some(self.0.map_or(x, |m| m + SMOOTHING * (x - m)));
    }
}

/// Per-sequence draft-length control.
#[derive(Clone, Debug)]
pub struct DraftLength {
    max: usize,
    /// The chance that a drafted token is accepted, given the ones before it were.
    acceptance: Average,
    /// Seconds the drafter spends per proposed token.
    draft_cost: Average,
    /// Seconds of a target forward pass of `n + 1` tokens, at index `n`.
    verify_cost: [Average; MAX_DRAFT + 1],
    plain_steps: u32,
    probe_after: u32,
    /// Whether the last round drafted.
    drafted_last: bool,
}

impl DraftLength {
    /// A controller that drafts at most `max` tokens (capped at [`MAX_DRAFT`]).
    pub fn new(max: usize) -> Self {
        Self {
            max: max.min(MAX_DRAFT),
            acceptance: Average::default(),
            draft_cost: Average::default(),
            verify_cost: [Average::default(); MAX_DRAFT + 1],
            plain_steps: 0,
            probe_after: FIRST_PROBE_AFTER,
            drafted_last: false,
        }
    }

    /// The draft length for the next round.
    pub fn choose(&self) -> usize {
        match self.verdict() {
            Verdict::Draft(k) => k,
            Verdict::Plain { probe_may_pay } => {
                if probe_may_pay && self.plain_steps >= self.probe_after {
                    PROBE_DRAFT.min(self.max)
                } else {
                    0
                }
            }
        }
    }

    /// What the measurements so far call for, probes aside.
    fn verdict(&self) -> Verdict {
        let plain_only = Verdict::Plain {
            probe_may_pay: false,
        };
        if self.max == 0 {
            return plain_only;
        }
        // Measure plain decoding first, then a short draft: the cost model extrapolates from
        // both, and a short first draft is cheap where verifying costs much more than a step.
        let Some(plain) = self.verify_cost[0].0 else {
            return plain_only;
        };
        let (Some(acceptance), Some(draft)) = (self.acceptance.0, self.draft_cost.0) else {
            return Verdict::Draft(PROBE_DRAFT.min(self.max));
        };
        let best = (1..=self.max)
            .map(|k| (k, self.tokens_per_second(k, acceptance, draft)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .expect("max >= 1");
        if best.1 > REQUIRED_GAIN / plain {
            return Verdict::Draft(best.0);
        }
        // A probe only refreshes the acceptance estimate: when even drafts that are always
        // accepted would not beat plain decoding at the measured costs, it cannot pay.
        let ceiling = (1..=self.max)
            .map(|k| self.tokens_per_second(k, 1.0, draft))
            .fold(0.0, f64::max);
        Verdict::Plain {
            probe_may_pay: ceiling > REQUIRED_GAIN / plain,
        }
    }

    /// Expected tokens per second of rounds drafting `k` tokens.
    fn tokens_per_second(&self, k: usize, acceptance: f64, draft: f64) -> f64 {
        let expected_tokens = (0..=k).map(|i| acceptance.powi(i as i32)).sum::<f64>();
        expected_tokens / (k as f64 * draft + self.verify_seconds(k))
    }

    /// The estimated cost of verifying `k` drafts (a forward pass of `k + 1` tokens): measured
    /// when it was, else interpolated linearly between the nearest measured lengths, else
    /// extrapolated along the line through the shortest and longest measured ones.
    fn verify_seconds(&self, k: usize) -> f64 {
        let measured = |i: usize| self.verify_cost[i].0.map(|s| (i as f64, s));
        if let Some((_, s)) = measured(k) {
            return s;
        }
        let below = (0..k).rev().find_map(measured);
        let above = (k + 1..=MAX_DRAFT).find_map(measured);
        let first = (0..=MAX_DRAFT).find_map(measured);
        let last = (0..=MAX_DRAFT).rev().find_map(measured);
        let line = |(x0, y0): (f64, f64), (x1, y1): (f64, f64)| {
            if x1 == x0 {
                y0
            } else {
                y0 + (y1 - y0) * (k as f64 - x0) / (x1 - x0)
            }
        };
        match (below, above, first, last) {
            (Some(b), Some(a), _, _) => line(b, a),
            (_, _, Some(f), Some(l)) => line(f, l).max(f.1.min(l.1)),
            _ => 0.0,
        }
    }

    /// Records a round: `drafted` tokens proposed in `draft_time`, of which the first
    /// `accepted` were accepted, verified in a forward pass that took `verify_time`.
    pub fn observe(
        &mut self,
        drafted: usize,
        accepted: usize,
        draft_time: Duration,
        verify_time: Duration,
    ) {
        self.verify_cost[drafted.min(MAX_DRAFT)].observe(verify_time.as_secs_f64());
        if drafted > 0 {
            self.draft_cost
                .observe(draft_time.as_secs_f64() / drafted as f64);
        }
        self.observe_untimed(drafted, accepted);
    }

    /// Records a round whose times say nothing of the steady costs (a pass of it was recorded
    /// as a graph, a one-off cost): what was accepted only.
    pub fn observe_untimed(&mut self, drafted: usize, accepted: usize) {
        self.drafted_last = drafted > 0;
        if drafted == 0 {
            self.plain_steps += 1;
            return;
        }
        // Each accepted token is a success; a rejection (when there was one) a failure.
        for _ in 0..accepted {
            self.acceptance.observe(1.0);
        }
        if accepted < drafted {
            self.acceptance.observe(0.0);
        }
        if self.plain_steps >= self.probe_after {
            // That was a probe: if speculation stays off, wait longer before the next one.
            let still_off = matches!(self.verdict(), Verdict::Plain { .. });
            self.probe_after = if still_off {
                (self.probe_after * 2).min(LONGEST_PROBE_AFTER)
            } else {
                FIRST_PROBE_AFTER
            };
        }
        self.plain_steps = 0;
    }

    /// Records a round in which the drafter had nothing to propose (n-gram lookup without a
    /// match): a plain step that says nothing about acceptance, and whose time, when it is
    /// given, is a plain step's cost.
    pub fn observe_empty_draft(&mut self, verify_time: Option<Duration>) {
        if let Some(time) = verify_time {
            self.verify_cost[0].observe(time.as_secs_f64());
        }
        self.drafted_last = false;
    }

    /// Whether the last round drafted: then a drafter's catch-up covers only that round's
    /// last tokens, a cost every round pays, not a prefill paid once.
    pub(crate) fn drafted_last_round(&self) -> bool {
        self.drafted_last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1000.0)
    }

    /// Runs rounds against a simulated pair: plain step 50 ms, each extra verified token
    /// `verify_slope` ms, each drafted token `draft` ms, every draft token accepted with
    /// `acceptance` (deterministically, as its expected run length).
    fn settle(acceptance: f64, draft: f64, verify_slope: f64) -> usize {
        let mut c = DraftLength::new(8);
        let mut k = 0;
        for _ in 0..200 {
            k = c.choose();
            let accepted = (0..k)
                .take_while(|&i| acceptance.powi(i as i32 + 1) >= 0.5)
                .count();
            let verify = ms(50.0 + verify_slope * k as f64);
            c.observe(k, accepted, ms(draft * k as f64), verify);
        }
        k
    }

    /// Runs 400 rounds, `round(k)` giving each the accepted tokens, draft and verify
    /// milliseconds; returns how many rounds drafted.
    fn drafted_rounds(round: impl Fn(usize) -> (usize, f64, f64)) -> usize {
        let mut c = DraftLength::new(8);
        let mut drafted = 0;
        for _ in 0..400 {
            let k = c.choose();
            drafted += usize::from(k > 0);
            let (accepted, draft, verify) = round(k);
            c.observe(k, accepted, ms(draft), ms(verify));
        }
        drafted
    }

    #[test]
    fn a_cheap_accurate_drafter_drafts_long() {
        assert!(settle(0.95, 2.0, 1.0) >= 4);
    }

    #[test]
    fn a_drafter_that_is_never_right_turns_speculation_off() {
        let drafted_rounds = drafted_rounds(|k| (0, 20.0 * k as f64, 50.0 + 5.0 * k as f64));
        // The first short round, then probes at growing intervals: a handful in all.
        assert!(drafted_rounds <= 8, "{drafted_rounds} drafted rounds");
        assert!(drafted_rounds >= 2, "probes continue");
    }

    #[test]
    fn an_expensive_drafter_is_not_used_even_when_accurate() {
        // Drafting costs as much as a target step: speculation cannot pay.
        assert_eq!(settle(0.9, 50.0, 5.0), 0);
    }

    #[test]
    fn no_probes_when_even_perfect_drafts_cannot_pay() {
        // Every draft accepted, but verifying costs a full step per token.
        let drafted_rounds = drafted_rounds(|k| (k, 20.0 * k as f64, 50.0 * (k + 1) as f64));
        assert_eq!(drafted_rounds, 1, "only the first, measuring round");
    }

    #[test]
    fn nothing_drafted_until_plain_decoding_is_measured() {
        let c = DraftLength::new(8);
        assert_eq!(c.choose(), 0);
        assert_eq!(DraftLength::new(0).choose(), 0);
    }

    #[test]
    fn verify_cost_is_interpolated_and_extrapolated() {
        let mut c = DraftLength::new(8);
        c.observe(0, 0, Duration::ZERO, ms(50.0));
        c.observe(4, 4, ms(8.0), ms(70.0));
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(c.verify_seconds(2), 0.060));
        assert!(close(c.verify_seconds(8), 0.090));
    }
}
