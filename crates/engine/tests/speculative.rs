//! Speculative decoding on real models produces exactly what the target alone produces: the
//! same tokens when greedy, the same distribution when sampled, and the same KV state after
//! rejections.

mod common;

use std::ops::ControlFlow;
use std::sync::Arc;

use lucebox_backend::{ActivationPrecision, CpuBackend};
use lucebox_engine::speculative::{
    Draft, DraftInput, DraftPolicy, Drafter, DrafterConfig, ModelDrafter, NgramDrafter, Proposal,
    SpecStats, Speculator,
};
use lucebox_engine::{Generator, Rng, Sampler, SamplingParams, Session, SessionConfig};
use lucebox_gguf::{GgufFile, GgufWriter, Value};
use lucebox_model::Model;
use lucebox_tokenizer::Tokenizer;

const TARGET: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m";
const DRAFTER: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";
const SMALL: &str = "smollm2-135m-instruct-q4_1";

/// Prompts of the kinds speculation meets: code to complete, code to repeat with an edit,
/// prose, lists. Raw text, no chat template.
const PROMPTS: [&str; 20] = [
    "def fibonacci(n):\n",
    "fn main() {\n    let numbers = vec![3, 1, 4, 1, 5, 9];\n",
    "import numpy as np\n\ndef normalize(v):\n",
    "// Binary search over a sorted slice.\nfn binary_search(",
    "SELECT name, COUNT(*) FROM orders",
    "class Stack:\n    def __init__(self):\n",
    "#include <stdio.h>\n\nint main(void) {\n",
    "The quick brown fox",
    "Rename the variable x to count:\nx = 0\nfor item in items:\n    x += 1\nprint(x)\n\nResult:\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n",
    "const add = (a, b) =>",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
    "<html>\n<head>\n<title>",
    "def is_prime(n: int) -> bool:\n    \"\"\"Return True if n is prime.\"\"\"\n",
    "The capital of France is",
    "git commit -m \"",
    "for (int i = 0; i < n; i++) {\n",
    "# Sorting algorithms\n\n## Quicksort\n\n",
    "Q: What is a hash map?\nA:",
];

fn config() -> SessionConfig {
    SessionConfig {
        context: 512,
        ..SessionConfig::default()
    }
}

/// Up to `n` tokens of `prompt` from `generator`, and speculation's statistics if it speculated.
fn generate(
    generator: &mut dyn Generator,
    prompt: &[u32],
    params: &SamplingParams,
    n: usize,
) -> (Vec<u32>, Option<SpecStats>) {
    let mut sampler = Sampler::new(params.clone());
    let mut out = Vec::new();
    let (_, stats) = generator
        .generate(prompt, &mut sampler, n, &|_| false, &mut |t| {
            out.push(t);
            ControlFlow::Continue(())
        })
        .unwrap();
    (out, stats)
}

/// The reference: the target alone, from an empty cache.
fn plain(
    session: &mut Session<CpuBackend>,
    prompt: &[u32],
    params: &SamplingParams,
    n: usize,
) -> Vec<u32> {
    session.reset();
    generate(session, prompt, params, n).0
}

fn speculative(
    speculator: &mut Speculator<CpuBackend>,
    prompt: &[u32],
    params: &SamplingParams,
    n: usize,
) -> (Vec<u32>, SpecStats) {
    let (out, stats) = generate(speculator, prompt, params, n);
    (out, stats.expect("a speculator reports its statistics"))
}

fn model_drafter(model: &Arc<Model<CpuBackend>>) -> Box<dyn Drafter + Send> {
    Box::new(ModelDrafter::new(Arc::clone(model), config().context).unwrap())
}

/// The drafter at single-part activations, as the binary loads it: its precision only moves
/// acceptance.
#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn greedy_speculation_reproduces_plain_greedy_decoding() {
    let backend = Arc::new(CpuBackend::new(None).unwrap());
    let (file, target) = common::load_on(&backend, TARGET, ActivationPrecision::Split);
    let (_, drafter) = common::load_on(&backend, DRAFTER, ActivationPrecision::Single);
    let setups: Vec<(&str, Box<dyn Drafter + Send>, DraftPolicy)> = vec![
        ("model, k=1", model_drafter(&drafter), DraftPolicy::Fixed(1)),
        ("model, k=3", model_drafter(&drafter), DraftPolicy::Fixed(3)),
        ("model, k=7", model_drafter(&drafter), DraftPolicy::Fixed(7)),
        (
            "model, adaptive",
            model_drafter(&drafter),
            DraftPolicy::Adaptive(8),
        ),
        (
            "ngram, k=4",
            Box::new(NgramDrafter::default()),
            DraftPolicy::Fixed(4),
        ),
    ];
    check_greedy_speculation(&file, &target, setups);
}

/// A target at single-part activations: verify passes of several rows and plain steps of one
/// row quantize alike, so speculation still reproduces its plain decoding.
#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn greedy_speculation_reproduces_plain_greedy_decoding_at_single_part_activations() {
    let backend = Arc::new(CpuBackend::new(None).unwrap());
    let (file, target) = common::load_on(&backend, TARGET, ActivationPrecision::Single);
    let (_, drafter) = common::load_on(&backend, DRAFTER, ActivationPrecision::Single);
    let setups: Vec<(&str, Box<dyn Drafter + Send>, DraftPolicy)> = vec![
        ("model, k=3", model_drafter(&drafter), DraftPolicy::Fixed(3)),
        (
            "ngram spelled, k=4",
            Box::new(NgramDrafter::with_spelling(Arc::new(
                Tokenizer::from_gguf(file.metadata()).unwrap(),
            ))),
            DraftPolicy::Fixed(4),
        ),
    ];
    check_greedy_speculation(&file, &target, setups);
}

/// Each setup's greedy output on every prompt equals the target's plain greedy output.
fn check_greedy_speculation(
    file: &GgufFile,
    target: &Arc<Model<CpuBackend>>,
    setups: Vec<(&str, Box<dyn Drafter + Send>, DraftPolicy)>,
) {
    const TOKENS: usize = 32;
    let greedy = SamplingParams::default();
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| common::tokenize(file, p)).collect();
    let mut session = Session::new(Arc::clone(target), config()).unwrap();
    let expected: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| plain(&mut session, p, &greedy, TOKENS))
        .collect();
    for (name, drafter, policy) in setups {
        let mut speculator =
            Speculator::new(Arc::clone(target), config(), drafter, policy).unwrap();
        let mut total = SpecStats::default();
        for (i, prompt) in prompts.iter().enumerate() {
            let (got, stats) = speculative(&mut speculator, prompt, &greedy, TOKENS);
            assert_eq!(got, expected[i], "{name}: prompt {i} {:?}", PROMPTS[i]);
            total.add(&stats);
        }
        eprintln!(
            "{name}: {} drafted, acceptance {:.2}, mean acceptance length {:.2}",
            total.drafted_tokens(),
            total.acceptance_rate(),
            total.mean_acceptance_length()
        );
        assert!(total.drafted_tokens() > 0, "{name} never drafted");
        if name.starts_with("model, k") {
            assert!(
                total.accepted_tokens() < total.drafted_tokens(),
                "{name}: no rejection, so the rejection path went untested"
            );
        }
    }
}

/// `file` without the blocks `skipped` (the rest renumbered): same tokenizer, weaker
/// predictions. Skipping blocks in the middle keeps the drafter right about half the time, so
/// acceptance, rejection and the bonus token all occur often.
fn skipping_blocks(file: &GgufFile, skipped: std::ops::Range<u32>) -> Arc<GgufFile> {
    let arch = file
        .metadata()
        .str("general.architecture")
        .unwrap()
        .to_owned();
    let block_count = format!("{arch}.block_count");
    let blocks = file.metadata().uint(&block_count).unwrap() as u32;
    let mut writer = GgufWriter::new();
    for (key, value) in file.metadata().iter() {
        let value = if key == block_count {
            Value::U32(blocks - skipped.len() as u32)
        } else {
            value.clone()
        };
        writer.metadata(key, value);
    }
    for tensor in file.tensors() {
        let name = match tensor
            .name()
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
        {
            Some((block, rest)) => {
                let block: u32 = block.parse().unwrap();
                if skipped.contains(&block) {
                    continue;
                }
                let new = if block >= skipped.end {
                    block - skipped.len() as u32
                } else {
                    block
                };
                format!("blk.{new}.{rest}")
            }
            None => tensor.name().to_owned(),
        };
        writer.tensor(
            name,
            tensor.dims(),
            tensor.ggml_type(),
            tensor.data().to_vec(),
        );
    }
    Arc::new(GgufFile::from_bytes(writer.to_bytes()).unwrap())
}

/// Two-sample chi-square statistic of `a` against `b` (equal totals) over the categories both
/// saw, pooling rare ones, and its degrees of freedom.
fn chi_square(a: &[u32], b: &[u32]) -> (f64, usize) {
    use std::collections::BTreeMap;
    let mut counts: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
    for &t in a {
        counts.entry(t).or_default().0 += 1.0;
    }
    for &t in b {
        counts.entry(t).or_default().1 += 1.0;
    }
    let (mut cells, mut rare) = (Vec::new(), (0.0, 0.0));
    for (_, (x, y)) in counts {
        if x + y < 10.0 {
            rare.0 += x;
            rare.1 += y;
        } else {
            cells.push((x, y));
        }
    }
    if rare.0 + rare.1 > 0.0 {
        cells.push(rare);
    }
    let stat = cells.iter().map(|(x, y)| (x - y) * (x - y) / (x + y)).sum();
    (stat, cells.len().saturating_sub(1))
}

/// The chi-square value that a statistic with `df` degrees of freedom exceeds with probability
/// 1e-4 (Wilson–Hilferty).
fn critical_value(df: usize) -> f64 {
    let df = df.max(1) as f64;
    let z = 3.719;
    let c = 2.0 / (9.0 * df);
    df * (1.0 - c + z * c.sqrt()).powi(3)
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn sampled_speculation_draws_from_the_target_distribution() {
    const SAMPLES: usize = 800;
    const TOKENS: usize = 4;
    let (file, target) = common::load(SMALL);
    let backend = Arc::clone(target.backend());
    let drafter = Arc::new(Model::load(backend, skipping_blocks(&file, 12..20)).unwrap());
    let prompt = common::tokenize(&file, "The best thing about programming is");
    for (temperature, top_p) in [(0.7, 0.9), (1.0, 0.95)] {
        let params = |seed| SamplingParams {
            temperature,
            top_p,
            seed: Some(seed),
            ..SamplingParams::default()
        };
        let mut speculator = Speculator::new(
            Arc::clone(&target),
            config(),
            model_drafter(&drafter),
            DraftPolicy::Fixed(3),
        )
        .unwrap();
        let mut plain_session = Session::new(Arc::clone(&target), config()).unwrap();
        let mut by_position = vec![(Vec::new(), Vec::new()); TOKENS];
        let mut total = SpecStats::default();
        for seed in 0..SAMPLES as u64 {
            let (spec, stats) = speculative(&mut speculator, &prompt, &params(seed), TOKENS);
            total.add(&stats);
            let reference = plain(
                &mut plain_session,
                &prompt,
                &params(seed + 1_000_000),
                TOKENS,
            );
            for (i, (s, p)) in spec.iter().zip(&reference).enumerate() {
                by_position[i].0.push(*s);
                by_position[i].1.push(*p);
            }
        }
        eprintln!(
            "T={temperature} top-p={top_p}: acceptance {:.2} over {} drafted",
            total.acceptance_rate(),
            total.drafted_tokens()
        );
        assert!(
            (0.1..0.9).contains(&total.acceptance_rate()),
            "the drafter should be both accepted and rejected often"
        );
        for (i, (spec, reference)) in by_position.iter().enumerate() {
            assert_eq!(spec.len(), SAMPLES);
            let (stat, df) = chi_square(spec, reference);
            eprintln!(
                "  token {i}: chi-square {stat:.1} on {df} df (critical {:.1})",
                critical_value(df)
            );
            assert!(
                stat < critical_value(df),
                "T={temperature} top-p={top_p}, token {i}: chi-square {stat:.1} on {df} df"
            );
        }
    }
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn after_rejections_the_target_cache_equals_a_fresh_run() {
    let (file, target) = common::load(SMALL);
    let backend = Arc::clone(target.backend());
    let drafter = Arc::new(Model::load(backend, skipping_blocks(&file, 4..26)).unwrap());
    let prompt = common::tokenize(&file, "Write a haiku about the sea:");
    let params = SamplingParams {
        temperature: 1.0,
        seed: Some(7),
        ..SamplingParams::default()
    };
    let mut speculator = Speculator::new(
        Arc::clone(&target),
        config(),
        model_drafter(&drafter),
        DraftPolicy::Fixed(4),
    )
    .unwrap();
    let (generated, stats) = speculative(&mut speculator, &prompt, &params, 48);
    assert!(
        stats.accepted_tokens() < stats.drafted_tokens(),
        "no rejection happened"
    );
    // The target holds the prompt and every generated token but the last; feed that one.
    let session = speculator.target();
    let mut sequence = prompt.clone();
    sequence.extend_from_slice(&generated[..generated.len() - 1]);
    assert_eq!(session.tokens(), sequence);
    session.feed(&generated[generated.len() - 1..]).unwrap();
    let vocab = target.config().vocab;
    let mut after = vec![0.0; vocab];
    session.last_logits(&mut after).unwrap();

    let mut fresh = Session::new(Arc::clone(&target), config()).unwrap();
    sequence.push(generated[generated.len() - 1]);
    fresh.feed(&sequence).unwrap();
    let mut expected = vec![0.0; vocab];
    fresh.last_logits(&mut expected).unwrap();
    assert!(
        after
            .iter()
            .zip(&expected)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "logits after rejections differ from a fresh run over the same tokens"
    );
}

/// A model drafter proposes, greedily, exactly its model's own continuation, for several
/// sequences at once and after any change to them: drafts rejected, tokens appended, a prompt
/// shared with another sequence, positions drafted one call at a time.
#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn a_model_drafter_proposes_its_model_s_own_greedy_continuation() {
    let (_, model) = common::load(SMALL);
    let vocab = model.config().vocab;
    let greedy = SamplingParams::default();
    let mut session = Session::new(Arc::clone(&model), config()).unwrap();
    let mut continuation = |tokens: &[u32], n: usize| {
        session.reset();
        generate(&mut session, tokens, &greedy, n).0
    };
    let drafter_config = DrafterConfig {
        context: 512,
        sequences: 3,
        kv_blocks: 96,
        block_tokens: 16,
        pass_tokens: 64,
    };
    let mut drafter = ModelDrafter::with_config(Arc::clone(&model), drafter_config).unwrap();
    let mut rng = Rng::seeded(11);
    let shared = common::random_tokens(&mut rng, 40, vocab);
    let mut sequences: Vec<Vec<u32>> = [7, 13, 90]
        .into_iter()
        .enumerate()
        .map(|(s, len)| {
            let own = common::random_tokens(&mut rng, len, vocab);
            if s < 2 {
                [shared.clone(), own].concat()
            } else {
                own
            }
        })
        .collect();
    for s in 0..3 {
        drafter.start(s as u64, &greedy).unwrap();
    }
    for round in 0..6 {
        let mut drafts: Vec<Draft> = (0..3).map(|_| Draft::default()).collect();
        let inputs: Vec<DraftInput<'_>> = sequences
            .iter()
            .enumerate()
            .map(|(s, tokens)| DraftInput::new(s as u64, tokens))
            .collect();
        // Odd rounds skip the catch-up (the proposal catches up itself) and draft one position
        // a call, as a batch does.
        let calls = if round % 2 == 0 {
            drafter.catch_up(&inputs).unwrap();
            vec![4]
        } else {
            vec![1; 4]
        };
        for max in calls {
            let mut proposals: Vec<Proposal<'_>> = inputs
                .iter()
                .zip(&mut drafts)
                .map(|(&input, draft)| Proposal { input, max, draft })
                .collect();
            drafter.propose(&mut proposals).unwrap();
        }
        for (s, (tokens, draft)) in sequences.iter_mut().zip(&drafts).enumerate() {
            assert_eq!(
                draft.tokens(),
                continuation(tokens, 4),
                "round {round}, sequence {s}"
            );
            // The target keeps some of the draft, then a token of its own.
            let kept = (round + s) % 5;
            tokens.extend_from_slice(&draft.tokens()[..kept.min(draft.len())]);
            tokens.push(common::random_tokens(&mut rng, 1, vocab)[0]);
        }
    }
}
