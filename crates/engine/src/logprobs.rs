//! Log-probabilities of generated tokens, as OpenAI's `logprobs` reports them.

/// The most alternatives one token may report (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The model's log-probabilities at one generated token: of the chosen token and of the most
/// likely ones. They come from the raw logits (a log-softmax before penalties, temperature and
/// truncation), as vLLM reports them by default, so they describe the model and not the
/// sampling settings.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The chosen token's.
    pub logprob: f32,
    /// The most likely tokens and theirs, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprobs {
    /// The log-probabilities of `chosen` and the `top` most likely tokens under `logits`.
    pub fn of(logits: &[f32], chosen: u32, top: usize) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
        let log_normaliser = max as f64 + sum.ln();
        let logprob = |l: f32| (f64::from(l) - log_normaliser) as f32;
        let top = top.min(MAX_TOP_LOGPROBS).min(logits.len());
        // Kept sorted, most likely first; one pass over the vocabulary.
        let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
        for (id, &l) in logits.iter().enumerate() {
            if best.len() == top && best.last().is_none_or(|&(_, worst)| l <= worst) {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= l);
            best.insert(at, (id as u32, l));
            best.truncate(top);
        }
        Self {
            logprob: logprob(logits[chosen as usize]),
            top: best.into_iter().map(|(id, l)| (id, logprob(l))).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax_and_the_top_ones_come_sorted() {
        let logits = [1.0, 3.0, 2.0, 3.0, -1.0];
        let lp = TokenLogprobs::of(&logits, 2, 3);
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let expect = |l: f64| (l - z.ln()) as f32;
        assert!((lp.logprob - expect(2.0)).abs() < 1e-6);
        let ids: Vec<u32> = lp.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, [1, 3, 2], "ties keep the lower id first");
        assert!((lp.top[0].1 - expect(3.0)).abs() < 1e-6);
        let total: f64 = logits
            .iter()
            .map(|&l| f64::from(expect(f64::from(l))).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(TokenLogprobs::of(&logits, 0, 0).top.is_empty());
        assert_eq!(TokenLogprobs::of(&logits, 0, 50).top.len(), 5);
    }

    #[test]
    fn huge_logits_do_not_overflow() {
        let lp = TokenLogprobs::of(&[1e30, 0.0], 0, 1);
        assert_eq!(lp.logprob, 0.0);
        assert!(lp.top[0].1.is_finite());
    }
}
