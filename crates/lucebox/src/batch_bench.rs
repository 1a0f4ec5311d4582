//! `lucebox bench --batch`: aggregate decode throughput of many sequences at once through the
//! batch engine, as llama.cpp's batched-bench measures it.

use std::collections::HashSet;
use std::time::Instant;

use anyhow::bail;
use lucebox_engine::{
    BatchConfig, BatchEngine, Batcher, DEFAULT_BLOCK_TOKENS, Event, NewSequence, Rng, Sampler,
    SamplingParams,
};

use crate::bench::median;
use lucebox_backend::Backend;

use crate::load::Loaded;

/// For each level of `batch`: `prompt_tokens` random tokens per sequence are prefilled (timed
/// as one figure), then `gen_tokens` greedy steps of all sequences together are timed; the
/// median over `repetitions` runs, after one untimed warm-up.
pub(crate) fn run<B: Backend>(
    target: &Loaded<B>,
    batch: &[usize],
    prompt_tokens: usize,
    gen_tokens: usize,
    repetitions: usize,
    json: bool,
) -> anyhow::Result<()> {
    if batch.contains(&0) {
        bail!("--batch levels must be at least 1");
    }
    let model = &target.model;
    let vocab = model.config().vocab as u64;
    let block_tokens = DEFAULT_BLOCK_TOKENS;
    let context = prompt_tokens + gen_tokens;
    let mut levels = Vec::new();
    for &sequences in batch {
        let config = BatchConfig {
            context,
            kv_blocks: sequences * context.div_ceil(block_tokens),
            block_tokens,
            max_sequences: sequences,
            step_tokens: sequences.max(512),
        };
        let mut batcher = Batcher::new(model.clone(), config, Box::new(|_| false), None)?;
        let mut rng = Rng::seeded(0);
        let (mut prefill_runs, mut decode_runs) = (Vec::new(), Vec::new());
        let mut events = Vec::new();
        for run in 0..=repetitions {
            for _ in 0..sequences {
                // Random token ids, as llama-bench uses; distinct, so the prefix cache finds
                // nothing.
                batcher.add(NewSequence {
                    prompt: (0..prompt_tokens)
                        .map(|_| (rng.next_u64() % vocab) as u32)
                        .collect(),
                    sampler: Sampler::new(SamplingParams::default()),
                    max_tokens: gen_tokens + 1,
                    logprobs: None,
                })?;
            }
            // Prefill ends when every sequence has its first token; decode is timed from there
            // until every sequence has finished. With prompts longer than a step, sequences
            // whose prefill ended early decode beside the others' prefill: those tokens count
            // in neither rate.
            let mut first_token_seen = HashSet::new();
            let mut finished = 0;
            let started = Instant::now();
            while first_token_seen.len() < sequences {
                events.clear();
                batcher.step(&mut events)?;
                for event in &events {
                    match event {
                        Event::Token { id, .. } => {
                            first_token_seen.insert(*id);
                        }
                        Event::Finished { .. } => finished += 1,
                    }
                }
            }
            let prefill = (sequences * prompt_tokens) as f64 / started.elapsed().as_secs_f64();
            let started = Instant::now();
            let mut generated = 0;
            while finished < sequences {
                events.clear();
                batcher.step(&mut events)?;
                for event in &events {
                    match event {
                        Event::Token { .. } => generated += 1,
                        Event::Finished { .. } => finished += 1,
                    }
                }
            }
            let decode = generated as f64 / started.elapsed().as_secs_f64();
            if run > 0 {
                prefill_runs.push(prefill);
                decode_runs.push(decode);
            }
        }
        levels.push((
            sequences,
            median(&mut prefill_runs),
            median(&mut decode_runs),
        ));
    }
    let base = levels[0].2;
    if json {
        let levels: Vec<_> = levels
            .iter()
            .map(|&(sequences, prefill, decode)| {
                serde_json::json!({
                    "sequences": sequences,
                    "prefill_tok_s": prefill,
                    "decode_tok_s": decode,
                })
            })
            .collect();
        let report = serde_json::json!({
            "model": target.label,
            "backend": crate::load::describe(model),
            "prompt_tokens": prompt_tokens,
            "gen_tokens": gen_tokens,
            "repetitions": repetitions,
            "levels": levels,
        });
        println!("{report}");
    } else {
        println!("model    {}", target.label);
        println!("backend  {}", crate::load::describe(model));
        println!("prompt {prompt_tokens} tokens, then {gen_tokens} decode steps, per sequence");
        println!(
            "{:>9} {:>14} {:>14} {:>16}",
            "sequences", "prefill t/s", "decode t/s", "decode vs first"
        );
        for (sequences, prefill, decode) in levels {
            println!(
                "{sequences:>9} {prefill:>14.2} {decode:>14.2} {:>15.2}x",
                decode / base
            );
        }
    }
    Ok(())
}
