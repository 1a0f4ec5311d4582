//! Properties of the tokenizers of the fetched models: special ids, end of generation, the
//! digest, streaming on a real vocabulary, encoding speed.

use std::sync::OnceLock;
use std::time::Instant;

use lucebox_gguf::GgufFile;
use lucebox_tokenizer::Tokenizer;
use proptest::prelude::*;
use serde_json::Value;

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";

fn open(model: &str) -> GgufFile {
    GgufFile::open(lucebox_testkit::model(model)).expect("model opens")
}

fn tokenizer(model: &str) -> Tokenizer {
    Tokenizer::from_gguf(open(model).metadata()).expect("tokenizer builds")
}

fn qwen() -> &'static Tokenizer {
    static QWEN_TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    QWEN_TOKENIZER.get_or_init(|| tokenizer(QWEN))
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn special_ids_end_of_generation_and_digest() {
    let qwen_small = Tokenizer::from_gguf(open("qwen2.5-coder-0.5b-instruct-q4_k_m").metadata())
        .expect("builds");
    let qwen_large = Tokenizer::from_gguf(open("qwen2.5-coder-1.5b-instruct-q4_k_m").metadata())
        .expect("builds");
    let smollm =
        Tokenizer::from_gguf(open("smollm2-135m-instruct-q4_1").metadata()).expect("builds");

    assert_eq!(qwen_small.vocab_size(), 151_936);
    assert_eq!(qwen_small.eos(), qwen_small.token_id("<|im_end|>"));
    assert!(!qwen_small.add_bos());
    let eog: Vec<&str> = qwen_small
        .end_of_generation()
        .iter()
        .map(|&id| qwen_small.token_text(id).expect("text"))
        .collect();
    assert_eq!(
        eog,
        [
            "<|endoftext|>",
            "<|im_end|>",
            "<|fim_pad|>",
            "<|repo_name|>",
            "<|file_sep|>"
        ]
    );
    assert!(!qwen_small.is_end_of_generation(qwen_small.token_id("<|im_start|>").expect("token")));
    assert_eq!(
        qwen_small.decode(&qwen_small.encode("<|im_start|>hi<|im_end|>", true), true),
        "hi"
    );

    assert_eq!(smollm.vocab_size(), 49_152);
    assert_eq!(smollm.bos(), smollm.token_id("<|im_start|>"));
    assert!(smollm.is_end_of_generation(smollm.token_id("<|im_end|>").expect("token")));
    assert!(smollm.is_end_of_generation(smollm.token_id("<|endoftext|>").expect("token")));

    // The two Qwen2.5 sizes share their tokenizer; SmolLM2's is another.
    assert_eq!(qwen_small.digest(), qwen_large.digest());
    assert_ne!(qwen_small.digest(), smollm.digest());
    assert_eq!(qwen_small.digest().len(), 64);
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn long_code_prompt_encodes_quickly() {
    let tokenizer = qwen();
    let path = lucebox_testkit::repo_root().join("tests/tokenizer/corpus.json");
    let corpus: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("corpus")).expect("json");
    let code: String = corpus
        .as_array()
        .expect("corpus")
        .iter()
        .filter(|e| {
            [
                "python",
                "rust",
                "c_tabs",
                "javascript",
                "haskell",
                "shell_sql_html",
            ]
            .contains(&e["name"].as_str().unwrap_or(""))
        })
        .map(|e| e["text"].as_str().expect("text"))
        .collect();
    let prompt = code.repeat(100_000 / code.len() + 1);
    let start = Instant::now();
    let ids = tokenizer.encode(&prompt, true);
    let elapsed = start.elapsed();
    eprintln!(
        "encoded {} bytes into {} tokens in {elapsed:?}",
        prompt.len(),
        ids.len()
    );
    assert_eq!(tokenizer.decode(&ids, false), prompt);
    if !cfg!(debug_assertions) {
        assert!(
            elapsed.as_secs_f64() < 0.5,
            "{} bytes took {elapsed:?}",
            prompt.len()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        // Failures are reported in the test output; nothing is written into the source tree.
        failure_persistence: None,
        ..ProptestConfig::with_cases(64)
    })]

    /// On Qwen2.5's vocabulary, where many tokens are fragments of multi-byte characters,
    /// streaming gives the text that decoding all ids at once gives.
    #[test]
    #[ignore = "needs fetched models; run by tests/run-all"]
    fn stream_decoding_equals_whole_decoding_on_qwen(
        ids in proptest::collection::vec(0u32..151_936, 1..64),
    ) {
        let t = qwen();
        let mut stream = t.stream_decoder(true);
        let mut streamed = String::new();
        for &id in &ids {
            streamed.extend(stream.push(id));
        }
        streamed.extend(stream.finish());
        prop_assert_eq!(streamed, t.decode(&ids, true));
    }
}
