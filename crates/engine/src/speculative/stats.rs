//! What speculation did: per draft position, per round, and where the time went.

use std::time::Duration;

use super::adaptive::MAX_DRAFT;

/// Counters of one sequence's speculation, or of many added together.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecStats {
    /// `drafted[i]`: rounds that proposed a token at draft position `i`.
    pub drafted: [u64; MAX_DRAFT],
    /// `accepted[i]`: rounds whose token at draft position `i` was accepted.
    pub accepted: [u64; MAX_DRAFT],
    /// Rounds that verified at least one drafted token.
    pub speculative_rounds: u64,
    /// Target steps without a draft: speculation off, or nothing proposed.
    pub plain_steps: u64,
    /// Tokens produced by the target in speculative rounds (accepted drafts plus one each).
    pub speculative_tokens: u64,
    /// Time spent drafting.
    pub draft_time: Duration,
    /// Time spent in target forward passes and verification, plain steps included.
    pub verify_time: Duration,
}

impl SpecStats {
    /// Tokens drafted in all.
    pub fn drafted_tokens(&self) -> u64 {
        self.drafted.iter().sum()
    }

    /// Drafted tokens accepted in all.
    pub fn accepted_tokens(&self) -> u64 {
        self.accepted.iter().sum()
    }

    /// The share of drafted tokens that were accepted (0 when none were drafted).
    pub fn acceptance_rate(&self) -> f64 {
        ratio(self.accepted_tokens(), self.drafted_tokens())
    }

    /// Tokens per speculative round: accepted drafts plus the target's own token (0 when no
    /// round speculated).
    pub fn mean_acceptance_length(&self) -> f64 {
        ratio(self.speculative_tokens, self.speculative_rounds)
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &SpecStats) {
        for i in 0..MAX_DRAFT {
            self.drafted[i] += other.drafted[i];
            self.accepted[i] += other.accepted[i];
        }
        self.speculative_rounds += other.speculative_rounds;
        self.plain_steps += other.plain_steps;
        self.speculative_tokens += other.speculative_tokens;
        self.draft_time += other.draft_time;
        self.verify_time += other.verify_time;
    }

    /// Records one round that drafted `drafted` tokens and accepted the first `accepted`.
    pub(crate) fn record_round(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            self.plain_steps += 1;
            return;
        }
        for i in 0..drafted {
            self.drafted[i] += 1;
        }
        for i in 0..accepted {
            self.accepted[i] += 1;
        }
        self.speculative_rounds += 1;
        self.speculative_tokens += accepted as u64 + 1;
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_add_up_per_position() {
        let mut s = SpecStats::default();
        s.record_round(3, 1);
        s.record_round(2, 2);
        s.record_round(0, 0);
        assert_eq!(&s.drafted[..3], &[2, 2, 1]);
        assert_eq!(&s.accepted[..3], &[2, 1, 0]);
        assert_eq!((s.drafted_tokens(), s.accepted_tokens()), (5, 3));
        assert_eq!(s.plain_steps, 1);
        assert!((s.acceptance_rate() - 0.6).abs() < 1e-12);
        assert!((s.mean_acceptance_length() - 2.5).abs() < 1e-12);
        let mut total = SpecStats::default();
        total.add(&s);
        total.add(&s);
        assert_eq!(total.drafted_tokens(), 10);
        assert_eq!(total.speculative_rounds, 4);
    }
}
