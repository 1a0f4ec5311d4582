//! Helpers shared by the engine's integration tests; each test binary uses a subset.
#![allow(dead_code)]

use std::sync::Arc;

use lucebox_backend::{
    ActivationPrecision, Backend, BatchCapacity, CpuBackend, RaggedBatch, TokenRole,
};
use lucebox_engine::speculative::SpecStats;
use lucebox_engine::{
    BatchEngine, Batcher, Event, NewSequence, Rng, Sampler, SamplingParams, SequenceId,
};
use lucebox_gguf::GgufFile;
use lucebox_model::Model;

const BLOCK_TOKENS: usize = 16;

/// `n` tokens drawn uniformly from a vocabulary of `vocab`.
pub fn random_tokens(rng: &mut Rng, n: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

/// A fetched catalogue model on the CPU backend using every core, with its file.
pub fn load(name: &str) -> (Arc<GgufFile>, Arc<Model<CpuBackend>>) {
    load_on_threads(name, None)
}

/// A fetched catalogue model on a CPU backend of `threads` threads, with its file.
pub fn load_on_threads(
    name: &str,
    threads: Option<usize>,
) -> (Arc<GgufFile>, Arc<Model<CpuBackend>>) {
    let backend = Arc::new(CpuBackend::new(threads).unwrap());
    load_on(&backend, name, ActivationPrecision::Split)
}

/// A fetched catalogue model on `backend`, its matmuls at `precision`, with its file.
pub fn load_on(
    backend: &Arc<CpuBackend>,
    name: &str,
    precision: ActivationPrecision,
) -> (Arc<GgufFile>, Arc<Model<CpuBackend>>) {
    let file = Arc::new(GgufFile::open(lucebox_testkit::model(name)).unwrap());
    let model = Model::load_with_precision(Arc::clone(backend), Arc::clone(&file), precision);
    (file, Arc::new(model.unwrap()))
}

/// Runs `sequences` as one ragged batch, token order given by `order` (pairs of sequence index
/// and offset within it), every token wanting logits; returns each sequence's logits rows.
pub fn batched_logits<B: Backend>(
    model: &Model<B>,
    sequences: &[Vec<u32>],
    order: &[(usize, usize)],
) -> Vec<Vec<f32>> {
    logits_in_passes(model, sequences, &[order.to_vec()])
}

/// Runs `sequences` as ragged batches, one forward pass after another over the same KV cache,
/// each pass's tokens given as in [`batched_logits`]; returns each sequence's logits rows (of
/// the positions the passes fed).
pub fn logits_in_passes<B: Backend>(
    model: &Model<B>,
    sequences: &[Vec<u32>],
    passes: &[Vec<(usize, usize)>],
) -> Vec<Vec<f32>> {
    let vocab = model.config().vocab;
    let tables: Vec<Vec<u32>> = {
        let mut next = 0u32;
        sequences
            .iter()
            .map(|s| {
                let blocks = s.len().div_ceil(BLOCK_TOKENS) as u32;
                next += blocks;
                (next - blocks..next).collect()
            })
            .collect()
    };
    let blocks = tables.iter().map(Vec::len).sum();
    let most_tokens = passes.iter().map(Vec::len).max().unwrap_or(0);
    let layout = model.kv_layout(blocks, BLOCK_TOKENS);
    let backend = model.backend();
    let mut kv = backend.kv_cache(layout).unwrap();
    let mut ws = model
        .workspace(BatchCapacity {
            tokens: most_tokens,
            sequences: sequences.len(),
            blocks,
            logits: most_tokens,
        })
        .unwrap();
    let mut per_sequence: Vec<Vec<f32>> = sequences
        .iter()
        .map(|s| vec![0.0; s.len() * vocab])
        .collect();
    let mut all = vec![0.0; most_tokens * vocab];
    for order in passes {
        let mut batch = RaggedBatch::new();
        for table in &tables {
            batch.push_sequence(table);
        }
        for &(s, i) in order {
            // Prompt tokens, so that a backend's prompt arithmetic is what the tests check.
            batch.push_token(s, sequences[s][i], i as u32, TokenRole::Prompt, true);
        }
        model.forward(&batch, &mut kv, &layout, &mut ws).unwrap();
        let tokens = order.len();
        backend
            .read_rows(ws.logits(), tokens, &mut all[..tokens * vocab])
            .unwrap();
        for (row, &(s, i)) in order.iter().enumerate() {
            per_sequence[s][i * vocab..(i + 1) * vocab]
                .copy_from_slice(&all[row * vocab..(row + 1) * vocab]);
        }
    }
    per_sequence
}

/// `text` as the file's tokenizer encodes a raw prompt: a BOS token first when the file asks
/// for one.
pub fn tokenize(file: &GgufFile, text: &str) -> Vec<u32> {
    let tokenizer = lucebox_tokenizer::Tokenizer::from_gguf(file.metadata()).unwrap();
    let mut ids = Vec::new();
    if tokenizer.add_bos() {
        ids.extend(tokenizer.bos());
    }
    ids.extend(tokenizer.encode(text, false));
    ids
}

/// The sequences' tokens taken round-robin, as a scheduler mixing decodes and prefills would
/// feed them: (sequence, offset) pairs for [`batched_logits`].
pub fn round_robin(sequences: &[Vec<u32>]) -> Vec<(usize, usize)> {
    let longest = sequences.iter().map(Vec::len).max().unwrap_or(0);
    let mut order = Vec::new();
    for i in 0..longest {
        order.extend(
            sequences
                .iter()
                .enumerate()
                .filter(|(_, seq)| i < seq.len())
                .map(|(s, _)| (s, i)),
        );
    }
    order
}

/// Asserts that each of `sequences`, fed round-robin in one ragged batch with the others, gets
/// bitwise the logits it gets alone.
pub fn assert_each_sequence_gets_its_own_logits<B: Backend>(
    model: &Model<B>,
    sequences: &[Vec<u32>],
) {
    let alone: Vec<Vec<f32>> = sequences.iter().map(|s| prefill_logits(model, s)).collect();
    let together = batched_logits(model, sequences, &round_robin(sequences));
    for (s, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert!(
            a == b,
            "sequence {s}: logits differ when batched with others"
        );
    }
}

/// The logits at every position of `tokens`, from one forward pass.
pub fn prefill_logits<B: Backend>(model: &Model<B>, tokens: &[u32]) -> Vec<f32> {
    let order: Vec<(usize, usize)> = (0..tokens.len()).map(|i| (0, i)).collect();
    batched_logits(model, &[tokens.to_vec()], &order).remove(0)
}

/// Adds every request (prompt, sampling, most tokens) to `batcher` at once and steps until all
/// are done: each one's tokens and speculation statistics (empty where the batcher does not
/// speculate), and the steps taken until the first one finished.
pub fn run_together<B: Backend>(
    batcher: &mut Batcher<B>,
    requests: &[(Vec<u32>, SamplingParams, usize)],
) -> (Vec<(Vec<u32>, SpecStats)>, usize)
where
    Batcher<B>: Send,
{
    let ids: Vec<SequenceId> = requests
        .iter()
        .map(|(prompt, params, max_tokens)| {
            let sequence = NewSequence {
                prompt: prompt.clone(),
                sampler: Sampler::new(params.clone()),
                max_tokens: *max_tokens,
                logprobs: None,
            };
            batcher.add(sequence).unwrap()
        })
        .collect();
    let mut out = vec![(Vec::new(), None); requests.len()];
    let (mut events, mut steps, mut first_finished) = (Vec::new(), 0, None);
    while out.iter().any(|(_, spec)| spec.is_none()) {
        events.clear();
        batcher.step(&mut events).unwrap();
        steps += 1;
        assert!(steps < 1000, "the batcher makes no progress");
        for event in events.drain(..) {
            let (Event::Token { id, .. } | Event::Finished { id, .. }) = event;
            let i = ids.iter().position(|known| *known == id).unwrap();
            match event {
                Event::Token { token, .. } => out[i].0.push(token),
                Event::Finished { spec, .. } => {
                    out[i].1 = Some(spec.map(|s| *s).unwrap_or_default());
                    first_finished.get_or_insert(steps);
                }
            }
        }
    }
    let out = out.into_iter().map(|(t, s)| (t, s.unwrap())).collect();
    (out, first_finished.unwrap())
}
