//! Turning a logits row into the next token.
//!
//! The transforms run in a fixed order — penalties, temperature, top-k, top-p, min-p — and
//! produce a [`Distribution`] over the surviving tokens; a draw from it with the sequence's
//! [`Rng`] gives the token, walking the tokens in id order. Speculative decoding computes the
//! same distribution for target and drafter, which is what makes its sampling exact. A backend
//! that samples where the logits are
//! ([`Backend::sample_rows`](lucebox_backend::Backend::sample_rows)) takes the same transforms
//! and the same uniform number from [`Sampler::row_sampling`].

use lucebox_backend::{RowSampling, argmax};

use crate::{Error, Rng};

/// How a sequence chooses its tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 picks the most likely token (greedy).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the most likely tokens whose probabilities sum to at least `top_p`; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 keeps all.
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recently seen tokens; 1 is off.
    pub repetition_penalty: f32,
    /// Subtract from the logits of recently seen tokens; 0 is off.
    pub presence_penalty: f32,
    /// Subtract this times the count of each recently seen token; 0 is off.
    pub frequency_penalty: f32,
    /// How many of the most recent tokens the penalties look at.
    pub penalty_window: usize,
    /// The seed of the sequence's random stream; `None` picks one.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_window: 64,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Checks every value's range; the error names the parameter.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |name: &'static str, why: String| Err(Error::InvalidParameter { name, why });
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(
                "temperature",
                format!("{} is not a finite value >= 0", self.temperature),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("{} is not in (0, 1]", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", format!("{} is not in [0, 1]", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad(
                "repetition_penalty",
                format!("{} is not a finite value > 0", self.repetition_penalty),
            );
        }
        if self.penalty_window > MAX_PENALTY_WINDOW {
            return bad(
                "penalty_window",
                format!("{} is above {MAX_PENALTY_WINDOW}", self.penalty_window),
            );
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(name, format!("{v} is not in [-2, 2]"));
            }
        }
        Ok(())
    }

    /// Whether this picks the most likely token rather than drawing.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Whether this picks the most likely token of the raw logits: greedy without penalties,
    /// which a backend can do where the logits are.
    pub fn is_plain_greedy(&self) -> bool {
        self.is_greedy() && !self.has_penalties()
    }

    fn has_penalties(&self) -> bool {
        self.penalty_window > 0
            && (self.repetition_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
}

/// A probability distribution over the tokens that survived the transforms, in token order.
/// Probabilities sum to 1.
#[derive(Clone, Debug, Default)]
pub struct Distribution {
    /// `(probability, token)`: while the distribution is being built, the candidates and their
    /// scaled logits, so that the one buffer sized to the vocabulary serves both.
    entries: Vec<(f32, u32)>,
}

impl Distribution {
    /// The surviving tokens and their probabilities.
    pub fn iter(&self) -> impl Iterator<Item = (u32, f32)> + '_ {
        self.entries.iter().map(|&(p, t)| (t, p))
    }

    /// The probability of `token` (0 when it did not survive).
    pub fn prob(&self, token: u32) -> f32 {
        self.entries
            .iter()
            .find(|&&(_, t)| t == token)
            .map_or(0.0, |&(p, _)| p)
    }

    /// A distribution with all mass on `token`: what a deterministic drafter proposes from.
    pub fn set_certain(&mut self, token: u32) {
        self.entries.clear();
        self.entries.push((1.0, token));
    }

    /// Makes this a copy of `other`, reusing this one's buffer.
    pub fn copy_from(&mut self, other: &Distribution) {
        self.entries.clear();
        self.entries.extend_from_slice(&other.entries);
    }

    /// Whether all the mass is on one token: what a deterministic drafter proposes from.
    pub fn is_certain(&self) -> bool {
        self.entries.len() == 1
    }

    /// Draws a token with `uniform`, a number in [0, 1): the first token, in id order, at which
    /// the probabilities summed so far exceed it, as
    /// [`Backend::sample_rows`](lucebox_backend::Backend::sample_rows) draws.
    pub fn draw(&self, uniform: f64) -> u32 {
        draw_weighted(&self.entries, |&(p, _)| f64::from(p), 1.0, uniform)
    }
}

/// Draws one of `entries`' tokens with `uniform`, a number in [0, 1), each with probability
/// `weight(entry) / total`; the weights are non-negative and sum to `total` > 0. Rounding can
/// leave the walk a hair short of `total`: the last token of positive weight takes the rest.
fn draw_weighted(
    entries: &[(f32, u32)],
    weight: impl Fn(&(f32, u32)) -> f64,
    total: f64,
    uniform: f64,
) -> u32 {
    let target = uniform * total;
    let mut cumulative = 0.0;
    let mut last = None;
    for entry in entries {
        let w = weight(entry);
        if w > 0.0 {
            cumulative += w;
            last = Some(entry.1);
            if target < cumulative {
                break;
            }
        }
    }
    last.expect("positive total weight has a token")
}

/// Chooses tokens for one sequence: its parameters, its random stream, and scratch space that
/// is reused so that sampling does not allocate once warm.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    seed: u64,
    window: Vec<u32>,
    distribution: Distribution,
}

/// The longest penalty window accepted: the sampler reserves it up front, so that penalising a
/// growing history never reallocates.
pub const MAX_PENALTY_WINDOW: usize = 1 << 16;

/// How many candidates the top-p search sorts first; it widens until the mass is covered.
const TOP_P_FIRST_WINDOW: usize = 256;

impl Sampler {
    /// A sampler for `params`, which must have passed [`SamplingParams::validate`].
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(Rng::random_seed);
        let window = Vec::with_capacity(if params.has_penalties() {
            params.penalty_window.min(MAX_PENALTY_WINDOW)
        } else {
            0
        });
        Self {
            rng: Rng::seeded(seed),
            seed,
            params,
            window,
            distribution: Distribution::default(),
        }
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed of the random stream (chosen at random when the parameters gave none).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Chooses the next token from `logits` (modified in place by the penalties), given the
    /// sequence so far.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        let uniform = self.next_uniform();
        self.sample_with(logits, history, uniform)
    }

    /// The uniform number of this sequence's next draw, taken from its stream; greedy
    /// parameters draw nothing and take none (0).
    pub fn next_uniform(&mut self) -> f64 {
        if self.params.is_greedy() {
            0.0
        } else {
            self.rng.next_f64()
        }
    }

    /// Like [`sample`](Self::sample), with a uniform number already taken from the stream
    /// ([`next_uniform`](Self::next_uniform)).
    pub fn sample_with(&mut self, logits: &mut [f32], history: &[u32], uniform: f64) -> u32 {
        self.apply_penalties(logits, history);
        self.sample_penalised(logits, uniform)
    }

    /// Like [`sample_with`](Self::sample_with), for logits that already carry the penalties: a
    /// row that [`Backend::sample_rows`](lucebox_backend::Backend::sample_rows) penalised, then
    /// left to the host, drawn with the uniform number its request carried, so that the
    /// stream goes on as if the device had drawn it.
    pub fn sample_penalised(&mut self, logits: &[f32], uniform: f64) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        self.build_distribution(logits);
        self.distribution.draw(uniform)
    }

    /// What [`Backend::sample_rows`](lucebox_backend::Backend::sample_rows) needs to choose this
    /// sequence's next token from logits row `row`, given the sequence so far (`history`, then
    /// `drafted`: the tokens of a draft before that row): the parameters, the penalised tokens
    /// (appended to `penalised`) and the uniform number of the draw, taken from this sampler's
    /// stream as [`sample`](Self::sample) takes it.
    pub fn row_sampling(
        &mut self,
        row: usize,
        history: &[u32],
        drafted: &[u32],
        penalised: &mut Vec<(u32, u32)>,
    ) -> RowSampling {
        let from = penalised.len();
        if self.params.has_penalties() {
            self.count_window(history, drafted);
            penalised.extend(
                self.window
                    .chunk_by(|a, b| a == b)
                    .map(|run| (run[0], run.len() as u32)),
            );
        }
        let p = &self.params;
        RowSampling {
            row,
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            penalised: from..penalised.len(),
            uniform: self.next_uniform(),
        }
    }

    /// Like [`sample`](Self::sample), and also returns the distribution the token was drawn
    /// from: a drafter's proposal comes with it, for the verifier.
    pub fn sample_with_distribution(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
    ) -> (u32, &Distribution) {
        self.distribution(logits, history);
        let token = if self.params.is_greedy() {
            self.distribution.entries[0].1
        } else {
            self.distribution.draw(self.rng.next_f64())
        };
        (token, &self.distribution)
    }

    /// One step of speculative sampling: `drafted` was drawn from `q`; this sampler's own
    /// distribution `p` comes from `logits` and `history` (through the same transforms). The
    /// token is kept with probability min(1, p/q); otherwise the replacement is drawn from
    /// max(p - q, 0), renormalised, and returned. Either way the token that results is
    /// distributed exactly as `p`. No random number is drawn when the outcome is certain, so
    /// greedy verification consumes none. `dense` is vocabulary-sized scratch, all zeros, and
    /// is left so.
    pub fn verify_draft(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        drafted: u32,
        q: &Distribution,
        dense: &mut [f32],
    ) -> Option<u32> {
        self.distribution(logits, history);
        let p = &self.distribution;
        let (px, qx) = (p.prob(drafted), q.prob(drafted));
        if px >= qx {
            return None;
        }
        if px > 0.0 && self.rng.next_f64() * f64::from(qx) < f64::from(px) {
            return None;
        }
        for &(prob, token) in &q.entries {
            if let Some(slot) = dense.get_mut(token as usize) {
                *slot = prob;
            }
        }
        let residual = |&(prob, token): &(f32, u32)| {
            f64::from((prob - dense.get(token as usize).copied().unwrap_or(0.0)).max(0.0))
        };
        let (mass, support, last) = p.entries.iter().fold((0.0, 0, 0), |(m, n, last), e| {
            let r = residual(e);
            if r > 0.0 {
                (m + r, n + 1, e.1)
            } else {
                (m, n, last)
            }
        });
        let replacement = if support == 1 {
            // Greedy verification lands here: the replacement is certain, nothing is drawn.
            last
        } else if mass > 0.0 {
            draw_weighted(&p.entries, residual, mass, self.rng.next_f64())
        } else {
            // p and q agree to rounding, yet the draw rejected: p itself is the residual's limit.
            p.draw(self.rng.next_f64())
        };
        for &(_, token) in &q.entries {
            if let Some(slot) = dense.get_mut(token as usize) {
                *slot = 0.0;
            }
        }
        Some(replacement)
    }

    /// The distribution the next token is drawn from, after every transform; for greedy
    /// parameters, all mass on the most likely token.
    pub fn distribution(&mut self, logits: &mut [f32], history: &[u32]) -> &Distribution {
        self.apply_penalties(logits, history);
        if self.params.is_greedy() {
            self.distribution.set_certain(argmax(logits));
        } else {
            self.build_distribution(logits);
        }
        &self.distribution
    }

    /// The penalty window of `history` followed by `then` into `self.window`, sorted, so that
    /// equal tokens form runs.
    fn count_window(&mut self, history: &[u32], then: &[u32]) {
        let window = self.params.penalty_window;
        let then = &then[then.len().saturating_sub(window)..];
        let history = &history[history.len().saturating_sub(window - then.len())..];
        self.window.clear();
        self.window.extend_from_slice(history);
        self.window.extend_from_slice(then);
        self.window.sort_unstable();
    }

    fn apply_penalties(&mut self, logits: &mut [f32], history: &[u32]) {
        if !self.params.has_penalties() {
            return;
        }
        self.count_window(history, &[]);
        let p = &self.params;
        for run in self.window.chunk_by(|a, b| a == b) {
            let Some(logit) = logits.get_mut(run[0] as usize) else {
                continue;
            };
            if *logit > 0.0 {
                *logit /= p.repetition_penalty;
            } else {
                *logit *= p.repetition_penalty;
            }
            *logit -= p.frequency_penalty * run.len() as f32 + p.presence_penalty;
        }
    }

    fn build_distribution(&mut self, logits: &[f32]) {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        let c = &mut self.distribution.entries;
        c.clear();
        c.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan())
                .map(|(i, &l)| (l * inv_t, i as u32)),
        );
        if c.is_empty() {
            c.push((0.0, 0));
        }
        let by_logit_desc =
            |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if p.top_k > 0 && p.top_k < c.len() {
            c.select_nth_unstable_by(p.top_k - 1, by_logit_desc);
            c.truncate(p.top_k);
        }
        let max = c.iter().map(|x| x.0).fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f64;
        for x in c.iter_mut() {
            x.0 = (x.0 - max).exp();
            sum += f64::from(x.0);
        }
        let inv_sum = (1.0 / sum) as f32;
        for x in c.iter_mut() {
            x.0 *= inv_sum;
        }
        if p.top_p < 1.0 {
            keep_top_p(c, p.top_p, by_logit_desc);
        }
        if p.min_p > 0.0 {
            let floor = p.min_p * c.iter().map(|x| x.0).fold(0.0, f32::max);
            c.retain(|x| x.0 >= floor);
        }
        let total: f64 = c.iter().map(|x| f64::from(x.0)).sum();
        for x in c.iter_mut() {
            x.0 = (f64::from(x.0) / total) as f32;
        }
        // Draws walk the tokens in id order; only top-k and top-p reorder them, and leave few.
        if !c.is_sorted_by_key(|x| x.1) {
            c.sort_unstable_by_key(|x| x.1);
        }
    }
}

/// Keeps the smallest set of most likely candidates whose probabilities reach `top_p`, sorted
/// most likely first. Sorts a small window first and widens it only when the window's mass
/// falls short, so a 150k vocabulary is rarely sorted whole.
fn keep_top_p(
    c: &mut Vec<(f32, u32)>,
    top_p: f32,
    order: impl Fn(&(f32, u32), &(f32, u32)) -> std::cmp::Ordering + Copy,
) {
    let mut window = TOP_P_FIRST_WINDOW.min(c.len());
    loop {
        if window < c.len() {
            c.select_nth_unstable_by(window - 1, order);
        }
        c[..window].sort_unstable_by(order);
        let mut mass = 0.0f32;
        if let Some(keep) = c[..window].iter().position(|x| {
            mass += x.0;
            mass >= top_p
        }) {
            c.truncate(keep + 1);
            return;
        }
        if window == c.len() {
            return;
        }
        window = (window * 4).min(c.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            seed: Some(1),
            ..SamplingParams::default()
        }
    }

    fn distribution_of(p: SamplingParams, logits: &[f32]) -> Vec<(u32, f32)> {
        let mut s = Sampler::new(p);
        let mut logits = logits.to_vec();
        let mut d: Vec<_> = s.distribution(&mut logits, &[]).iter().collect();
        d.sort_by_key(|x| x.0);
        d
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let mut s = Sampler::new(params(0.0));
        assert_eq!(s.sample(&mut [0.1, 2.0, 2.0, -1.0], &[]), 1);
    }

    #[test]
    fn temperature_softmax_is_exact() {
        let d = distribution_of(params(0.5), &[0.0, 1.0]);
        let e = (2.0f32).exp();
        assert!((d[1].1 - e / (1.0 + e)).abs() < 1e-6, "{d:?}");
    }

    #[test]
    fn top_k_top_p_min_p_cut_the_tail() {
        let logits = [4.0, 3.0, 2.0, 1.0, 0.0];
        assert_eq!(
            distribution_of(
                SamplingParams {
                    top_k: 2,
                    ..params(1.0)
                },
                &logits
            )
            .len(),
            2
        );
        // Probabilities ~ [0.636, 0.234, 0.086, 0.032, 0.012]: 0.8 needs the first two.
        let d = distribution_of(
            SamplingParams {
                top_p: 0.8,
                ..params(1.0)
            },
            &logits,
        );
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), [0, 1]);
        assert!((d.iter().map(|x| x.1).sum::<f32>() - 1.0).abs() < 1e-6);
        // min_p 0.1 keeps tokens with p >= 0.0636: the first three.
        assert_eq!(
            distribution_of(
                SamplingParams {
                    min_p: 0.1,
                    ..params(1.0)
                },
                &logits
            )
            .len(),
            3
        );
    }

    #[test]
    fn top_p_widens_its_window_on_flat_distributions() {
        let logits = vec![0.0; 5000];
        let d = distribution_of(
            SamplingParams {
                top_p: 0.5,
                ..params(1.0)
            },
            &logits,
        );
        assert_eq!(d.len(), 2500);
    }

    #[test]
    fn penalties_follow_their_definitions() {
        let mut s = Sampler::new(SamplingParams {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..params(0.0)
        });
        let mut logits = [4.0, -4.0, 1.0];
        s.sample(&mut logits, &[0, 1, 1, 99]);
        assert_eq!(
            logits,
            [4.0 / 2.0 - 0.25 - 0.5, -4.0 * 2.0 - 0.5 - 0.5, 1.0]
        );
    }

    #[test]
    fn a_seed_reproduces_draws_and_frequencies_match() {
        let logits = [1.0, 0.0, -1.0];
        let draw = |seed| {
            let mut s = Sampler::new(SamplingParams {
                seed: Some(seed),
                ..params(1.0)
            });
            (0..20000)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        let a = draw(5);
        assert_eq!(a, draw(5));
        assert_ne!(a, draw(6));
        let z: f32 = logits.iter().map(|l: &f32| l.exp()).sum();
        for t in 0..3 {
            let freq = a.iter().filter(|&&x| x == t).count() as f32 / a.len() as f32;
            let p = logits[t as usize].exp() / z;
            // Five standard deviations of a binomial proportion over 20000 draws.
            assert!(
                (freq - p).abs() < 5.0 * (p * (1.0 - p) / 20000.0).sqrt(),
                "token {t}: {freq} vs {p}"
            );
        }
    }

    /// Drafts from `q_logits` with the drafter's own stream, verifies against `p_logits`, and
    /// returns how often each token came out.
    fn speculative_frequencies(
        params: SamplingParams,
        p_logits: &[f32],
        q_logits: &[f32],
        history: &[u32],
        draws: usize,
    ) -> Vec<f64> {
        let mut drafter = Sampler::new(SamplingParams {
            seed: Some(11),
            ..params.clone()
        });
        let mut verifier = Sampler::new(params);
        let mut dense = vec![0.0; p_logits.len()];
        let mut counts = vec![0usize; p_logits.len()];
        let mut q = Distribution::default();
        for _ in 0..draws {
            let (drafted, from) = drafter.sample_with_distribution(&mut q_logits.to_vec(), history);
            q.copy_from(from);
            let token = verifier
                .verify_draft(&mut p_logits.to_vec(), history, drafted, &q, &mut dense)
                .unwrap_or(drafted);
            counts[token as usize] += 1;
        }
        assert!(dense.iter().all(|&x| x == 0.0), "scratch left zeroed");
        counts.iter().map(|&c| c as f64 / draws as f64).collect()
    }

    #[test]
    fn verifying_drafts_reproduces_the_target_distribution() {
        const DRAWS: usize = 200_000;
        let p_logits = [2.0, 1.5, 0.0, -1.0, 0.5, -3.0];
        // The drafter favours other tokens, and gives token 5 almost nothing.
        let q_logits = [0.0, 2.0, 1.0, 0.5, -1.0, -9.0];
        for params in [
            params(1.0),
            SamplingParams {
                top_p: 0.9,
                min_p: 0.05,
                ..params(0.7)
            },
            SamplingParams {
                top_k: 3,
                ..params(1.3)
            },
            SamplingParams {
                repetition_penalty: 1.3,
                presence_penalty: 0.5,
                frequency_penalty: 0.2,
                ..params(0.9)
            },
        ] {
            // The penalties, where set, see the same history on both sides.
            let history = [0, 1, 1, 4];
            let mut exact = Sampler::new(params.clone());
            let p = exact.distribution(&mut p_logits.to_vec(), &history).clone();
            let got =
                speculative_frequencies(params.clone(), &p_logits, &q_logits, &history, DRAWS);
            for (t, &freq) in got.iter().enumerate() {
                let want = f64::from(p.prob(t as u32));
                let sigma = (want * (1.0 - want) / DRAWS as f64).sqrt();
                assert!(
                    (freq - want).abs() <= 5.0 * sigma + 1e-9,
                    "{params:?} token {t}: {freq} vs {want}"
                );
            }
        }
    }

    #[test]
    fn greedy_verification_is_exact_and_draws_nothing() {
        let mut verifier = Sampler::new(SamplingParams::default());
        let mut dense = vec![0.0; 3];
        let mut certain = Distribution::default();
        certain.set_certain(1);
        let logits = [0.0f32, 1.0, 0.5];
        assert_eq!(
            verifier.verify_draft(&mut logits.to_vec(), &[], 1, &certain, &mut dense),
            None
        );
        certain.set_certain(2);
        assert_eq!(
            verifier.verify_draft(&mut logits.to_vec(), &[], 2, &certain, &mut dense),
            Some(1)
        );
        let untouched = Rng::seeded(verifier.seed()).next_u64();
        assert_eq!(
            verifier.rng.next_u64(),
            untouched,
            "no random number was drawn"
        );
    }

    #[test]
    fn validation_names_the_parameter() {
        let e = SamplingParams {
            top_p: 0.0,
            ..SamplingParams::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("top_p"), "{e}");
        assert!(
            SamplingParams {
                temperature: f32::NAN,
                ..SamplingParams::default()
            }
            .validate()
            .is_err()
        );
    }

    #[test]
    fn draws_walk_the_survivors_in_token_order() {
        // Top-p sorts by likelihood and top-k leaves its own order; the draw must not see either.
        let logits = [0.5, 3.0, 1.0, 2.5, 2.0, 0.0];
        for p in [
            SamplingParams {
                top_p: 0.9,
                ..params(1.0)
            },
            SamplingParams {
                top_k: 3,
                ..params(1.0)
            },
        ] {
            let mut s = Sampler::new(p.clone());
            let tokens: Vec<u32> = s
                .distribution(&mut logits.to_vec(), &[])
                .iter()
                .map(|(t, _)| t)
                .collect();
            assert!(tokens.is_sorted(), "{p:?}: {tokens:?}");
        }
        // The smallest uniform numbers draw the lowest surviving id, whatever its likelihood.
        let mut s = Sampler::new(SamplingParams {
            top_k: 3,
            ..params(1.0)
        });
        let d = s.distribution(&mut logits.to_vec(), &[]).clone();
        let lowest = d.iter().next().unwrap();
        assert_eq!(lowest.0, 1);
        assert_eq!(
            draw_weighted(
                &d.entries,
                |&(p, _)| f64::from(p),
                1.0,
                Rng::seeded(0).next_f64()
            ),
            {
                let mut rng = Rng::seeded(0);
                let u = rng.next_f64();
                let mut cumulative = 0.0;
                d.iter()
                    .find(|&(_, p)| {
                        cumulative += f64::from(p);
                        u < cumulative
                    })
                    .unwrap()
                    .0
            }
        );
    }

    #[test]
    fn a_device_request_carries_the_parameters_penalties_and_the_next_uniform() {
        let p = SamplingParams {
            temperature: 0.8,
            top_k: 5,
            top_p: 0.9,
            min_p: 0.1,
            repetition_penalty: 1.2,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            penalty_window: 4,
            seed: Some(9),
        };
        let mut s = Sampler::new(p.clone());
        let mut penalised = vec![(99, 1)];
        // Only the last four tokens count: 7 twice, 3 and 5 once.
        let r = s.row_sampling(2, &[1, 1, 7, 3, 7, 5], &[], &mut penalised);
        assert_eq!(penalised, [(99, 1), (3, 1), (5, 1), (7, 2)]);
        assert_eq!(r.penalised, 1..4);
        assert_eq!(r.row, 2);
        assert_eq!(
            (r.temperature, r.top_k, r.top_p, r.min_p),
            (0.8, 5, 0.9, 0.1)
        );
        assert_eq!(
            (
                r.repetition_penalty,
                r.presence_penalty,
                r.frequency_penalty
            ),
            (1.2, 0.5, 0.25)
        );
        assert_eq!(r.uniform, Rng::seeded(9).next_f64());
        // The next request takes the next number, as the next host draw would.
        let mut rng = Rng::seeded(9);
        rng.next_f64();
        assert_eq!(
            s.row_sampling(0, &[], &[], &mut penalised).uniform,
            rng.next_f64()
        );
        // A verify row's window runs on into the draft before it: 5, then 8, 8 and 3.
        penalised.clear();
        let r = s.row_sampling(1, &[1, 1, 7, 3, 7, 5], &[8, 8, 3], &mut penalised);
        assert_eq!(penalised, [(3, 1), (5, 1), (8, 2)]);
        assert_eq!(r.penalised, 0..3);
        let mut full_draft = Vec::new();
        s.row_sampling(1, &[1, 1], &[2, 8, 8, 3, 9], &mut full_draft);
        assert_eq!(full_draft, [(3, 1), (8, 2), (9, 1)]);
        // Greedy takes none, and penalties off name no tokens.
        let mut greedy = Sampler::new(params(0.0));
        let mut none = Vec::new();
        let r = greedy.row_sampling(0, &[1, 2, 3], &[], &mut none);
        assert!(none.is_empty() && r.penalised.is_empty());
        assert_eq!(greedy.rng.next_u64(), Rng::seeded(1).next_u64());
    }
}
