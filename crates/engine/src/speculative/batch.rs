//! Choosing the drafted rows of a batched step: which sequences' drafts the target verifies,
//! and how many of each, when all of them share one forward pass.
//!
//! A lone sequence weighs its drafts against its own plain step. In a batch the price of a
//! drafted row is what it adds to the shared pass, and that depends on the pass: on a GPU a
//! pass of 16 rows costs little more than one of 4, while on a CPU whose batch is already
//! compute-bound every row costs about as much as a plain sequence's, and a draft, never sure
//! to be accepted, is worth less than that row. So the step is planned as a whole: drafted
//! row j of a sequence is worth the chance that its first j drafts are all accepted (a^j for
//! drafts accepted with a known probability a; see [`Acceptance`]) in expected tokens, and the
//! rows worth most are added while the step's expected tokens per second,
//! from the measured cost of passes by their length ([`PairCosts::pass_seconds`]), improve by
//! a clear margin ([`REQUIRED_BATCH_GAIN`]).

use super::adaptive::{Acceptance, MAX_DRAFT, PairCosts};

/// Drafted rows must promise a step this much more than its plain pass: the costs of the
/// lengths a batch seldom runs rest on few passes, and the allotment favours exactly the
/// lengths whose estimates happen to be low. On the H200 (1.5B, 16 clients, with the margin of
/// a lone sequence), the passes the allotment chose took 1.03 ms more than plain ones where it
/// had predicted 0.62 ms.
const REQUIRED_BATCH_GAIN: f64 = 1.10;

/// What one sequence offers a batched step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Offer {
    /// The tokens it may draft: its drafter's proposal, within its limits.
    pub proposed: usize,
    /// The expected tokens of its j-th drafted row at index j - 1: the chance that its first
    /// j drafted tokens are all accepted.
    values: [f64; MAX_DRAFT],
    /// What its first drafted row costs the step besides the drafter's passes: its share of
    /// a catch-up ([`DraftLength::offer`](super::DraftLength::offer)).
    pub catch_up_seconds: f64,
}

impl Offer {
    /// An offer of up to `proposed` drafted tokens whose acceptance is `acceptance`.
    pub(crate) fn new(proposed: usize, acceptance: Acceptance, catch_up_seconds: f64) -> Self {
        let mut values = [0.0; MAX_DRAFT];
        for (value, run) in values.iter_mut().zip(acceptance.runs().skip(1)) {
            *value = run;
        }
        Self {
            proposed: proposed.min(MAX_DRAFT),
            values,
            catch_up_seconds,
        }
    }

    /// The expected tokens of its `j`-th drafted row (from 1).
    fn value(&self, j: usize) -> f64 {
        self.values[j - 1]
    }
}

/// How a batch's drafts are priced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DraftPrice {
    /// At the drafter's measured seconds per token, each sequence drafting on its own
    /// (n-gram lookup).
    PerToken,
    /// By drafter passes, each drafting a position of every sequence given that many rows
    /// ([`PairCosts::drafter_pass_seconds`]): a model drafter. On a GPU a pass for sixteen
    /// sequences costs little more than one for one.
    PerPass,
}

/// The rows of a step before any draft.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pass {
    /// Tokens fed: decode rows and prefill chunks.
    pub tokens: usize,
    /// Tokens it produces: one per sequence whose last row is scored.
    pub produces: usize,
}

/// Sets `chosen[i]`, the rows drafted for `offers[i]`, at most `room` in all, to make the
/// step's expected tokens per second the highest, and at least [`REQUIRED_BATCH_GAIN`] times
/// those of the pass without drafts (else none are drafted). Returns the value a first drafted
/// row had to beat: that of the last row taken, or, when none was, the value one row would
/// have needed. Nothing is drafted before any target pass was measured; drafts are free
/// before a drafter's cost was. An offer whose first row carries a catch-up keeps its rows
/// only where the step does better with them.
pub(crate) fn allot(
    costs: &PairCosts,
    price: DraftPrice,
    pass: Pass,
    offers: &[Offer],
    room: usize,
    chosen: &mut [usize],
) -> f64 {
    chosen.fill(0);
    // `depths[d - 1]`: the offers given at least d rows, who share the drafter's d-th pass.
    let mut depths = [0; MAX_DRAFT];
    // The catch-ups of the offers given rows.
    let mut catching_up = 0.0;
    let seconds = |drafted: usize, depths: &[usize], catching_up: f64| {
        let drafting = catching_up
            + match price {
                DraftPrice::PerToken => drafted as f64 * costs.draft_seconds().unwrap_or(0.0),
                DraftPrice::PerPass => depths
                    .iter()
                    .take_while(|&&n| n > 0)
                    .map(|&n| costs.drafter_pass_seconds(n))
                    .sum(),
            };
        costs.pass_seconds(pass.tokens + drafted) + drafting
    };
    let plain_seconds = seconds(0, &depths, 0.0);
    if plain_seconds <= 0.0 {
        return f64::INFINITY;
    }
    let plain_rate = pass.produces as f64 / plain_seconds;
    // Walks the rows in order of value, recording the best number to take; then walks again
    // as far as that. Ties go to the lower index, so both walks take the same rows.
    let mut best = (0, plain_rate * REQUIRED_BATCH_GAIN);
    let mut tokens = pass.produces as f64;
    for drafted in 1..=room {
        let Some((i, value)) = most_valuable(offers, chosen) else {
            break;
        };
        chosen[i] += 1;
        depths[chosen[i] - 1] += 1;
        if chosen[i] == 1 {
            catching_up += offers[i].catch_up_seconds;
        }
        tokens += value;
        let rate = tokens / seconds(drafted, &depths, catching_up);
        if rate > best.1 {
            best = (drafted, rate);
        }
    }
    chosen.fill(0);
    let mut last_taken = None;
    for _ in 0..best.0 {
        let (i, value) = most_valuable(offers, chosen).expect("taken in the first walk");
        chosen[i] += 1;
        last_taken = Some(value);
    }
    // The walks take rows by value alone, but a sequence whose drafter must first catch up
    // costs the step that besides its rows: it keeps them only where the step does better.
    let rate = |chosen: &[usize]| {
        let mut depths = [0; MAX_DRAFT];
        let (mut tokens, mut drafted, mut catching_up) = (pass.produces as f64, 0, 0.0);
        for (offer, &rows) in offers.iter().zip(chosen.iter()) {
            tokens += (1..=rows).map(|j| offer.value(j)).sum::<f64>();
            drafted += rows;
            depths[..rows].iter_mut().for_each(|n| *n += 1);
            if rows > 0 {
                catching_up += offer.catch_up_seconds;
            }
        }
        tokens / seconds(drafted, &depths, catching_up)
    };
    for i in 0..offers.len() {
        if chosen[i] > 0 && offers[i].catch_up_seconds > 0.0 {
            let with = rate(chosen);
            let rows = std::mem::take(&mut chosen[i]);
            if rate(chosen) <= with {
                chosen[i] = rows;
            }
        }
    }
    last_taken.unwrap_or_else(|| {
        // (produces + v) / seconds(1) > REQUIRED_BATCH_GAIN * plain_rate
        let mut one = [0; MAX_DRAFT];
        one[0] = 1;
        REQUIRED_BATCH_GAIN * plain_rate * seconds(1, &one, 0.0) - pass.produces as f64
    })
}

/// The offer whose next row is worth most, and that row's value.
fn most_valuable(offers: &[Offer], chosen: &[usize]) -> Option<(usize, f64)> {
    offers
        .iter()
        .zip(chosen)
        .enumerate()
        .filter(|(_, (offer, taken))| **taken < offer.proposed)
        .map(|(i, (offer, taken))| (i, offer.value(taken + 1)))
        .fold(None, |best, (i, value)| match best {
            Some((_, v)) if v >= value => best,
            _ => Some((i, value)),
        })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Costs of passes of `tokens` tokens: `fixed + per_token * tokens` milliseconds, measured
    /// at the lengths given.
    fn costs(fixed: f64, per_token: f64, lengths: &[usize]) -> PairCosts {
        let mut costs = PairCosts::default();
        for &n in lengths {
            let ms = fixed + per_token * n as f64;
            costs.observe_pass(n, Duration::from_secs_f64(ms / 1e3));
        }
        costs
    }

    const PER_TOKEN: DraftPrice = DraftPrice::PerToken;

    fn offer(proposed: usize, acceptance: f64) -> Offer {
        Offer::new(proposed, Acceptance::exactly(acceptance), 0.0)
    }

    /// Sixteen sequences decoding, each with `offer`.
    fn sixteen(costs: &PairCosts, offer: Offer) -> (Vec<usize>, f64) {
        let mut chosen = vec![0; 16];
        let pass = Pass {
            tokens: 16,
            produces: 16,
        };
        let cutoff = allot(costs, PER_TOKEN, pass, &[offer; 16], 256, &mut chosen);
        (chosen, cutoff)
    }

    #[test]
    fn a_compute_bound_batch_drafts_nothing() {
        // Every token costs 10 ms: a row of a draft is never worth its price.
        let cpu = costs(0.0, 10.0, &[1, 8, 16, 24]);
        let (chosen, cutoff) = sixteen(&cpu, offer(8, 0.95));
        assert!(chosen.iter().all(|&n| n == 0), "{chosen:?}");
        assert!(cutoff > 0.95, "{cutoff}");
        // Even drafts sure to be accepted are not taken: they could not pay.
        let (chosen, _) = sixteen(&cpu, offer(8, 1.0));
        assert!(chosen.iter().all(|&n| n == 0), "{chosen:?}");
    }

    #[test]
    fn a_bandwidth_bound_batch_drafts_what_is_likely_accepted() {
        // A pass costs 5 ms plus 0.1 ms a token: likely drafts pay, unlikely ones do not.
        let gpu = costs(5.0, 0.1, &[1, 16, 64]);
        let (chosen, cutoff) = sixteen(&gpu, offer(8, 0.9));
        assert!(chosen.iter().all(|&n| n >= 4), "{chosen:?}");
        assert!(cutoff < 0.9, "{cutoff}");
        let (chosen, _) = sixteen(&gpu, offer(8, 0.02));
        assert!(chosen.iter().all(|&n| n == 0), "{chosen:?}");
        // Against each other, the likelier sequence's rows come first.
        let mut chosen = [0; 2];
        let pass = Pass {
            tokens: 2,
            produces: 2,
        };
        allot(
            &gpu,
            PER_TOKEN,
            pass,
            &[offer(8, 0.5), offer(8, 0.95)],
            3,
            &mut chosen,
        );
        assert_eq!(chosen, [0, 3], "the room limits the rows");
    }

    #[test]
    fn a_small_gain_is_not_worth_drafting() {
        // One of sixteen sequences offers four drafts at 0.7: 1.77 expected tokens for 4% more
        // time, at best 6.8% more tokens per second, within what the estimates may be off by.
        let gpu = costs(5.25, 0.0625, &[16, 20]);
        let mut offers = [offer(0, 0.0); 16];
        offers[3] = offer(4, 0.7);
        let mut chosen = [0; 16];
        let pass = Pass {
            tokens: 16,
            produces: 16,
        };
        let cutoff = allot(&gpu, PER_TOKEN, pass, &offers, 64, &mut chosen);
        assert_eq!(chosen, [0; 16]);
        assert!(cutoff > 0.7, "{cutoff}");
        offers[3] = offer(4, 0.95);
        allot(&gpu, PER_TOKEN, pass, &offers, 64, &mut chosen);
        assert_eq!(chosen[3], 4, "a likelier draft pays: {chosen:?}");
    }

    #[test]
    fn a_model_drafter_s_rows_are_priced_by_its_passes() {
        // The target as above; the drafter's pass costs `pass_ms` whatever the sequences.
        let drafter = |pass_ms: f64| {
            let mut costs = costs(5.0, 0.1, &[1, 16, 64]);
            for n in [1, 16] {
                costs.observe_drafter_pass(n, Duration::from_secs_f64(pass_ms / 1e3));
            }
            costs
        };
        let pass = Pass {
            tokens: 16,
            produces: 16,
        };
        let per_pass = |costs: &PairCosts, offers: &[Offer]| {
            let mut chosen = vec![0; offers.len()];
            allot(costs, DraftPrice::PerPass, pass, offers, 256, &mut chosen);
            chosen
        };
        // A cheap pass drafts every sequence deep: each further pass serves all sixteen.
        let chosen = per_pass(&drafter(1.0), &[offer(8, 0.9); 16]);
        assert!(chosen.iter().all(|&n| n >= 2), "{chosen:?}");
        // At 10 ms a pass even one drafted position for all sixteen does not pay.
        let chosen = per_pass(&drafter(10.0), &[offer(8, 0.9); 16]);
        assert_eq!(chosen, [0; 16]);
        // A sequence whose drafter must first catch up, at 5 ms of this step, is left out; the
        // others are not.
        let mut offers = [offer(8, 0.9); 16];
        offers[5].catch_up_seconds = 0.005;
        let chosen = per_pass(&drafter(1.0), &offers);
        assert_eq!(chosen[5], 0, "{chosen:?}");
        assert_eq!(chosen.iter().filter(|&&n| n >= 2).count(), 15, "{chosen:?}");
        // Priced per token at the lone drafter's cost, sixteen sequences would not draft.
        let mut per_token = drafter(1.0);
        per_token.observe_drafting(0, Duration::ZERO, 1, Duration::from_millis(5));
        let mut chosen = [0; 16];
        allot(
            &per_token,
            PER_TOKEN,
            pass,
            &[offer(8, 0.9); 16],
            256,
            &mut chosen,
        );
        assert_eq!(chosen, [0; 16]);
    }

    #[test]
    fn nothing_is_drafted_before_a_pass_was_measured() {
        let (chosen, cutoff) = sixteen(&PairCosts::default(), offer(8, 1.0));
        assert!(chosen.iter().all(|&n| n == 0));
        assert_eq!(cutoff, f64::INFINITY);
    }
}
