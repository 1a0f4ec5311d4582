use std::ops::ControlFlow;

use lucebox_backend::Backend;

use crate::speculative::{PairCosts, SpecStats, Speculator};
use crate::{Error, GenerationStats, Sampler, Session};

/// One sequence's generation, plain ([`Session`]) or speculative ([`Speculator`]), for callers
/// that choose which at run time: the server and the benchmarks.
pub trait Generator: Send {
    /// Generates a continuation of `prompt`, the whole sequence (the KV of a prefix shared with
    /// the previous call is reused), as [`Session::generate`] does; speculation's statistics
    /// come back too where there was speculation.
    fn generate(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        max_tokens: usize,
        is_end: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<(GenerationStats, Option<SpecStats>), Error>;

    /// The most tokens one sequence, prompt and generation together, may hold.
    fn context(&self) -> usize;

    /// The tokens whose KV positions the generator holds now.
    fn held_tokens(&self) -> usize;

    /// What speculation has measured of its pair so far; `None` for plain decoding.
    fn pair_costs(&self) -> Option<&PairCosts> {
        None
    }
}

impl<B: Backend> Generator for Session<B>
where
    Session<B>: Send,
{
    fn generate(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        max_tokens: usize,
        is_end: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<(GenerationStats, Option<SpecStats>), Error> {
        let stats = Session::generate(self, prompt, sampler, max_tokens, is_end, on_token)?;
        Ok((stats, None))
    }

    fn context(&self) -> usize {
        self.config().context
    }

    fn held_tokens(&self) -> usize {
        self.tokens().len()
    }
}

impl<B: Backend> Generator for Speculator<B>
where
    Speculator<B>: Send,
{
    fn generate(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        max_tokens: usize,
        is_end: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<(GenerationStats, Option<SpecStats>), Error> {
        let (stats, spec) =
            Speculator::generate(self, prompt, sampler, max_tokens, is_end, on_token)?;
        Ok((stats, Some(spec)))
    }

    fn context(&self) -> usize {
        self.config().context
    }

    fn held_tokens(&self) -> usize {
        self.tokens().len()
    }

    fn pair_costs(&self) -> Option<&PairCosts> {
        Some(self.costs())
    }
}
