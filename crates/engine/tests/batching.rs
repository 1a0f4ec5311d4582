//! One forward call serves any mix of sequences: a token's logits depend only on its own
//! sequence, never on what else shares the batch or on how its sequence was fed.

mod common;

use std::ops::ControlFlow;
use std::sync::Arc;

use lucebox_backend::{ActivationPrecision, CpuBackend};
use lucebox_model::Model;

use lucebox_engine::speculative::{
    DraftPolicy, Drafter, DrafterConfig, ModelDrafter, NgramDrafter,
};
use lucebox_engine::{
    BatchConfig, BatchEngine, Batcher, Event, GenerationStats, NewSequence, Rng, Sampler,
    SamplingParams, SequenceId, Session, SessionConfig, StopReason,
};

const MODEL: &str = "smollm2-135m-instruct-q4_1";

/// The model at each activation precision, on one backend.
fn at_each_precision() -> impl Iterator<Item = Arc<Model<CpuBackend>>> {
    let backend = Arc::new(CpuBackend::new(None).unwrap());
    [ActivationPrecision::Split, ActivationPrecision::Single]
        .into_iter()
        .map(move |precision| common::load_on(&backend, MODEL, precision).1)
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn a_ragged_batch_gives_each_sequence_exactly_its_own_logits() {
    for model in at_each_precision() {
        let vocab = model.config().vocab;
        let mut rng = Rng::seeded(11);
        let sequences: Vec<Vec<u32>> = [5, 23, 1, 40]
            .iter()
            .map(|&n| common::random_tokens(&mut rng, n, vocab))
            .collect();
        common::assert_each_sequence_gets_its_own_logits(&model, &sequences);
    }
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn decoding_one_token_at_a_time_equals_one_prefill() {
    for model in at_each_precision() {
        decoding_one_token_at_a_time_equals_one_prefill_on(model);
    }
}

fn decoding_one_token_at_a_time_equals_one_prefill_on(model: Arc<Model<CpuBackend>>) {
    let vocab = model.config().vocab;
    let tokens = common::random_tokens(&mut Rng::seeded(12), 37, vocab);
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

/// What each sequence generates alone, on a fresh session: the reference for the batcher.
fn alone(
    model: &Arc<Model<CpuBackend>>,
    prompt: &[u32],
    params: &SamplingParams,
    max_tokens: usize,
) -> Vec<u32> {
    let mut session = Session::new(model.clone(), SessionConfig::default()).unwrap();
    let mut out = Vec::new();
    session
        .generate(
            prompt,
            &mut Sampler::new(params.clone()),
            max_tokens,
            |_| false,
            |t| {
                out.push(t);
                ControlFlow::Continue(())
            },
        )
        .unwrap();
    out
}

/// A prompt, how to sample it, and how many tokens to generate.
type Request = (Vec<u32>, SamplingParams, usize);

fn sequence(prompt: &[u32], params: &SamplingParams, max_tokens: usize) -> NewSequence {
    NewSequence {
        prompt: prompt.to_vec(),
        sampler: Sampler::new(params.clone()),
        max_tokens,
        logprobs: None,
    }
}

/// Runs every request through `batcher`, adding request `i` before step `arrivals[i]`, and
/// returns each one's tokens and statistics.
fn run_batched(
    batcher: &mut dyn BatchEngine,
    requests: &[Request],
    arrivals: &[usize],
) -> Vec<(Vec<u32>, Option<GenerationStats>)> {
    let mut ids = Vec::new();
    let mut out: Vec<(Vec<u32>, Option<GenerationStats>)> =
        vec![(Vec::new(), None); requests.len()];
    let mut events = Vec::new();
    let mut step = 0;
    while out.iter().any(|(_, done)| done.is_none()) {
        for (i, (prompt, params, max)) in requests.iter().enumerate() {
            if arrivals[i] == step {
                let id = batcher.add(sequence(prompt, params, *max)).unwrap();
                ids.push((id, i));
            }
        }
        events.clear();
        batcher.step(&mut events).unwrap();
        for event in &events {
            let (Event::Token { id, .. } | Event::Finished { id, .. }) = event;
            let index = ids.iter().find(|(known, _)| known == id).unwrap().1;
            match event {
                Event::Token { token, .. } => out[index].0.push(*token),
                Event::Finished { stats, .. } => out[index].1 = Some(*stats),
            }
        }
        step += 1;
        assert!(step < 10_000, "the batcher makes no progress");
    }
    out
}

fn batcher(
    model: &Arc<Model<CpuBackend>>,
    kv_blocks: usize,
    max_sequences: usize,
    step_tokens: usize,
) -> Batcher<lucebox_backend::CpuBackend> {
    Batcher::new(
        model.clone(),
        BatchConfig {
            context: 512,
            kv_blocks,
            block_tokens: 16,
            max_sequences,
            step_tokens,
        },
        Box::new(|_| false),
        None,
    )
    .unwrap()
}

/// Mixed prompts: some share a 40-token prefix (the prefix cache's case), one is long enough
/// to be prefilled in several chunks, sampled and greedy alike.
fn mixed_requests(vocab: usize) -> Vec<Request> {
    let mut rng = Rng::seeded(21);
    let shared = common::random_tokens(&mut rng, 40, vocab);
    let sampled = |seed| SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    let mut requests = Vec::new();
    for (i, len) in [3usize, 70, 9, 130, 1, 45].into_iter().enumerate() {
        let mut prompt = if i % 2 == 0 {
            shared.clone()
        } else {
            Vec::new()
        };
        prompt.extend(common::random_tokens(&mut rng, len, vocab));
        let params = if i % 3 == 1 {
            sampled(i as u64)
        } else {
            SamplingParams::default()
        };
        requests.push((prompt, params, 12 + 5 * i));
    }
    requests
}

/// The mixed requests, and what each generates alone.
fn mixed_requests_and_outputs_alone(
    model: &Arc<Model<CpuBackend>>,
) -> (Vec<Request>, Vec<Vec<u32>>) {
    let requests = mixed_requests(model.config().vocab);
    let expected = requests
        .iter()
        .map(|(p, params, n)| alone(model, p, params, *n))
        .collect();
    (requests, expected)
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn batched_sequences_generate_exactly_what_each_generates_alone() {
    let (_, model) = common::load(MODEL);
    let (requests, expected) = mixed_requests_and_outputs_alone(&model);
    // Arrivals spread over the first steps, so sequences join a running batch; 48 tokens per
    // step, so the long prompts are prefilled in chunks beside running decodes.
    let mut batcher = batcher(&model, 64, 4, 48);
    let out = run_batched(&mut batcher, &requests, &[0, 0, 1, 3, 3, 7]);
    for (i, ((tokens, stats), expected)) in out.iter().zip(&expected).enumerate() {
        assert_eq!(tokens, expected, "request {i}");
        let stats = stats.unwrap();
        assert_eq!(stats.generated_tokens, requests[i].2);
        assert_eq!(stats.stop, StopReason::MaxTokens);
    }
    // The later requests with the shared prefix found its 2 full blocks in the cache.
    let reused: Vec<usize> = out.iter().map(|(_, s)| s.unwrap().reused_tokens).collect();
    assert_eq!(reused[0], 0);
    assert_eq!((reused[2], reused[4]), (32, 32), "{reused:?}");
    let load = batcher.load();
    assert_eq!((load.running, load.waiting, load.kv_blocks_used), (0, 0, 0));
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn a_full_pool_preempts_and_recomputes_without_changing_any_output() {
    let (_, model) = common::load(MODEL);
    let (requests, expected) = mixed_requests_and_outputs_alone(&model);
    // 11 blocks of 16: the longest request alone needs 10, so running several at once must
    // preempt.
    let mut batcher = batcher(&model, 11, 6, 256);
    let out = run_batched(&mut batcher, &requests, &[0; 6]);
    for (i, ((tokens, _), expected)) in out.iter().zip(&expected).enumerate() {
        assert_eq!(tokens, expected, "request {i}");
    }
    assert!(batcher.load().preemptions > 0, "the pool never ran out");
    assert_eq!(batcher.load().kv_blocks_used, 0);
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn a_stopped_sequence_frees_its_blocks_and_the_others_go_on() {
    let (_, model) = common::load(MODEL);
    let requests = mixed_requests(model.config().vocab);
    let mut batcher = batcher(&model, 64, 4, 512);
    let ids: Vec<SequenceId> = requests
        .iter()
        .take(3)
        .map(|(p, params, n)| batcher.add(sequence(p, params, *n)).unwrap())
        .collect();
    let mut events = Vec::new();
    batcher.step(&mut events).unwrap();
    let used = batcher.load().kv_blocks_used;
    match batcher.stop(ids[1]) {
        Some(Event::Finished { stats, .. }) => {
            assert_eq!(
                (stats.stop, stats.generated_tokens),
                (StopReason::Caller, 1)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(batcher.stop(ids[1]).is_none(), "already gone");
    assert!(batcher.load().kv_blocks_used < used);
    let mut tokens = vec![Vec::new(); 3];
    while batcher.load().running > 0 {
        events.clear();
        batcher.step(&mut events).unwrap();
        for event in &events {
            if let Event::Token { id, token, .. } = event {
                assert_ne!(*id, ids[1], "a cancelled sequence produced a token");
                tokens[ids.iter().position(|i| i == id).unwrap()].push(*token);
            }
        }
    }
    let first = alone(&model, &requests[0].0, &requests[0].1, requests[0].2);
    assert_eq!(
        tokens[0][..],
        first[1..],
        "the first token came with the first step"
    );
}

/// A prompt that repeats a random phrase, so that n-gram lookup finds drafts.
fn repeating_prompt(rng: &mut Rng, vocab: usize) -> Vec<u32> {
    let phrase = common::random_tokens(rng, 12, vocab);
    phrase
        .iter()
        .chain(&phrase)
        .chain(&phrase[..6])
        .copied()
        .collect()
}

/// A batcher of up to 4 sequences that speculates with `drafter`.
fn speculating_batcher(
    model: &Arc<Model<CpuBackend>>,
    drafter: Box<dyn Drafter + Send>,
    policy: DraftPolicy,
) -> Batcher<CpuBackend> {
    Batcher::new(
        model.clone(),
        BatchConfig {
            context: 512,
            kv_blocks: 64,
            block_tokens: 16,
            max_sequences: 4,
            step_tokens: 64,
        },
        Box::new(|_| false),
        Some((drafter, policy)),
    )
    .unwrap()
}

/// A batcher of up to 4 sequences that speculates with n-gram lookup.
fn ngram_batcher(model: &Arc<Model<CpuBackend>>, policy: DraftPolicy) -> Batcher<CpuBackend> {
    speculating_batcher(model, Box::new(NgramDrafter::default()), policy)
}

/// A batcher of up to 4 sequences that speculates with `model` itself as its drafter, in a
/// pool of `drafter_blocks` blocks of its own: greedy drafts are then always accepted.
fn self_drafting_batcher(
    model: &Arc<Model<CpuBackend>>,
    policy: DraftPolicy,
    drafter_blocks: usize,
) -> Batcher<CpuBackend> {
    let config = DrafterConfig {
        context: 512,
        sequences: 4,
        kv_blocks: drafter_blocks,
        block_tokens: 16,
        pass_tokens: 64,
    };
    let drafter = ModelDrafter::with_config(model.clone(), config).unwrap();
    speculating_batcher(model, Box::new(drafter), policy)
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn a_lone_sequence_speculates_and_its_output_does_not_change() {
    let (_, model) = common::load(MODEL);
    let prompt = repeating_prompt(&mut Rng::seeded(5), model.config().vocab);
    let params = SamplingParams::default();
    let expected = alone(&model, &prompt, &params, 40);
    let mut batcher = ngram_batcher(&model, DraftPolicy::Fixed(4));
    let (out, _) = common::run_together(&mut batcher, &[(prompt, params, 40)]);
    let (tokens, spec) = &out[0];
    assert_eq!(tokens, &expected);
    assert!(spec.drafted_tokens() > 0, "nothing was drafted: {spec:?}");
}

/// Four requests of 40 tokens for `prompts`, greedy but the last, sampled with `seed`.
fn three_greedy_one_sampled(seed: u64, prompts: impl Iterator<Item = Vec<u32>>) -> Vec<Request> {
    let sampled = SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    prompts
        .take(4)
        .enumerate()
        .map(|(i, prompt)| {
            let params = if i == 3 {
                sampled.clone()
            } else {
                SamplingParams::default()
            };
            (prompt, params, 40)
        })
        .collect()
}

/// Runs `requests` together in `batcher(fixed)` and checks that each gets what it gets alone
/// in such a batcher (the greedy ones plain decoding's), with drafts accepted for each, and
/// that the greedy ones get the same in `batcher` with the adaptive allotment, which decides
/// from measured times; returns what each got and the steps until the first finished.
fn check_batched_drafts(
    model: &Arc<Model<CpuBackend>>,
    requests: &[Request],
    fixed: DraftPolicy,
    batcher: impl Fn(DraftPolicy) -> Batcher<CpuBackend>,
) -> (Vec<Vec<u32>>, usize) {
    let lone: Vec<Vec<u32>> = requests
        .iter()
        .map(|request| {
            let out = common::run_together(&mut batcher(fixed), std::slice::from_ref(request));
            out.0[0].0.clone()
        })
        .collect();
    for (i, (prompt, params, n)) in requests.iter().enumerate().take(3) {
        assert_eq!(lone[i], alone(model, prompt, params, *n), "request {i}");
    }
    let (out, first_finished) = common::run_together(&mut batcher(fixed), requests);
    for (i, (tokens, spec)) in out.iter().enumerate() {
        assert_eq!(tokens, &lone[i], "request {i}");
        assert!(spec.accepted_tokens() > 0, "request {i}: {spec:?}");
    }
    let (out, _) = common::run_together(&mut batcher(DraftPolicy::Adaptive(8)), requests);
    for (i, (tokens, _)) in out.iter().enumerate().take(3) {
        assert_eq!(tokens, &lone[i], "request {i}, adaptive");
    }
    (lone, first_finished)
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn batched_sequences_verify_their_drafts_in_one_pass_and_each_output_is_its_own() {
    let (_, model) = common::load(MODEL);
    let vocab = model.config().vocab;
    let mut rng = Rng::seeded(6);
    let prompts = std::iter::repeat_with(|| repeating_prompt(&mut rng, vocab));
    let requests = three_greedy_one_sampled(4, prompts);
    // N-gram drafts depend on the tokens alone and every row's logits on its own sequence
    // alone, so the batch must give the same tokens as each request alone, the sampled
    // request's included (same drafts, rows and draws).
    let (_, first_finished) =
        check_batched_drafts(&model, &requests, DraftPolicy::Fixed(4), |policy| {
            ngram_batcher(&model, policy)
        });
    // All four ran in every step until one finished: taking fewer steps than its 40 tokens
    // (the prompts' two prefill steps aside), it had drafts accepted in shared passes.
    assert!(
        first_finished < 30,
        "the first finished after {first_finished} steps"
    );
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn a_model_drafter_drafts_for_the_whole_batch_and_each_output_is_its_own() {
    let (_, model) = common::load(MODEL);
    let vocab = model.config().vocab;
    let mut rng = Rng::seeded(7);
    let prompts = [17, 30, 9, 24].map(|len| common::random_tokens(&mut rng, len, vocab));
    let requests = three_greedy_one_sampled(9, prompts.into_iter());
    // The drafter's logits, like the target's, do not depend on the batch, and its draws come
    // from each sequence's own stream: the same argument as for n-gram drafts.
    let fixed = DraftPolicy::Fixed(3);
    let (lone, first_finished) = check_batched_drafts(&model, &requests, fixed, |policy| {
        self_drafting_batcher(&model, policy, 64)
    });
    // Greedy drafts by the target itself are always accepted: four tokens a step from the
    // prompts' prefill on, for all four sequences at once.
    assert!(
        first_finished < 16,
        "the first finished after {first_finished} steps"
    );
    // A drafter pool too small for the batch: sequences lose their drafter's blocks to one
    // another and draft less, and the output may not change.
    let (out, _) = common::run_together(&mut self_drafting_batcher(&model, fixed, 5), &requests);
    for (i, (tokens, _)) in out.iter().enumerate().take(3) {
        assert_eq!(tokens, &lone[i], "request {i}, small drafter pool");
    }
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn logprobs_leave_the_tokens_alone_and_describe_each_one() {
    let (_, model) = common::load(MODEL);
    let requests = mixed_requests(model.config().vocab);
    let mut batcher = batcher(&model, 64, 4, 512);
    let mut expected = Vec::new();
    for (prompt, params, n) in requests.iter().take(3) {
        expected.push(alone(&model, prompt, params, *n));
        let mut sequence = sequence(prompt, params, *n);
        sequence.logprobs = Some(4);
        batcher.add(sequence).unwrap();
    }
    let mut tokens = vec![Vec::new(); 3];
    let mut events = Vec::new();
    while batcher.load().running + batcher.load().waiting > 0 {
        events.clear();
        batcher.step(&mut events).unwrap();
        for event in &events {
            if let Event::Token {
                id,
                token,
                logprobs,
            } = event
            {
                let logprobs = logprobs.as_ref().expect("asked for");
                assert_eq!(logprobs.top.len(), 4);
                assert!(logprobs.logprob <= 0.0);
                assert!(logprobs.top[0].1 >= logprobs.logprob);
                tokens[id.0 as usize].push(*token);
            }
        }
    }
    assert_eq!(tokens, expected);
}
