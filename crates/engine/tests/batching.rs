//! One forward call serves any mix of sequences: a token's logits depend only on its own
//! sequence, never on what else shares the batch or on how its sequence was fed.

mod common;

use lucebox_engine::{Rng, Session, SessionConfig};

const MODEL: &str = "smollm2-135m-instruct-q4_1";

fn random_tokens(rng: &mut Rng, n: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn a_ragged_batch_gives_each_sequence_exactly_its_own_logits() {
    let (_, model) = common::load(MODEL);
    let vocab = model.config().vocab;
    let mut rng = Rng::seeded(11);
    let sequences: Vec<Vec<u32>> = [5, 23, 1, 40]
        .iter()
        .map(|&n| random_tokens(&mut rng, n, vocab))
        .collect();
    let alone: Vec<Vec<f32>> = sequences
        .iter()
        .map(|s| common::prefill_logits(&model, s))
        .collect();
    // Interleave the sequences' tokens round-robin, as a scheduler mixing decodes and prefills would.
    let longest = sequences.iter().map(Vec::len).max().unwrap();
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
    let together = common::batched_logits(&model, &sequences, &order);
    for (s, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert!(
            a == b,
            "sequence {s}: logits differ when batched with others"
        );
    }
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn decoding_one_token_at_a_time_equals_one_prefill() {
    let (_, model) = common::load(MODEL);
    let vocab = model.config().vocab;
    let tokens = random_tokens(&mut Rng::seeded(12), 37, vocab);
    let prefill = common::prefill_logits(&model, &tokens);
    let mut session = Session::new(
        model.clone(),
        SessionConfig {
            context: 64,
            prefill_chunk: 7,
            ..SessionConfig::default()
        },
    )
    .unwrap();
    let mut row = vec![0.0; vocab];
    for (i, &t) in tokens.iter().enumerate() {
        session.feed(&[t]).unwrap();
        session.last_logits(&mut row).unwrap();
        assert!(
            row[..] == prefill[i * vocab..(i + 1) * vocab],
            "position {i}: decode logits differ from prefill"
        );
    }
    // Chunked prefill (7 tokens per pass) ends at the same logits too.
    session.reset();
    session.feed(&tokens).unwrap();
    session.last_logits(&mut row).unwrap();
    assert!(
        row[..] == prefill[(tokens.len() - 1) * vocab..],
        "chunked prefill differs"
    );
}
