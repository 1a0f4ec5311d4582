//! Token ids and rendered chat templates against Hugging Face's, for the fetched models.
//!
//! The fixtures (tests/tokenizer/fixtures/*.hf.json) were made by
//! tests/tokenizer/make_hf_fixtures.py from the same GGUF files: `hf` is what
//! `transformers.AutoTokenizer.from_pretrained(dir, gguf_file=...)` produces, `original` what the
//! model family's published tokenizer pipeline produces for the same vocabulary.

use std::path::PathBuf;

use lucebox_gguf::GgufFile;
use lucebox_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use serde_json::Value;
use unicode_normalization::UnicodeNormalization;

/// Corpus entries on which transformers' GGUF loader builds a different tokenizer from the
/// published one. There lucebox follows the published tokenizer, which llama.cpp follows too.
///
/// SmolLM2: the loader gives llama-architecture files a plain ByteLevel pre-tokenizer, dropping
/// the `Digits(individual_digits=True)` step of SmolLM2's tokenizer.json (llama.cpp's `smollm`
/// pre-tokenizer keeps it). SmolLM2's vocabulary has no multi-digit tokens, so only digits whose
/// UTF-8 bytes merge across characters (Arabic-Indic, other numerals) come out differently.
const SMOLLM2_LOADER_DIVERGENCES: &[&str] = &["arabic", "other_numerals"];

/// Qwen2.5: the loader adds only `<|endoftext|>`, `<|im_start|>` and `<|im_end|>` as added
/// tokens; the published tokenizer (and llama.cpp) also matches the FIM control tokens and the
/// user-defined `<tool_call>` / `</tool_call>` whole.
const QWEN2_LOADER_DIVERGENCES: &[&str] = &["special_fim", "special_tool_call"];

fn fixture_dir() -> PathBuf {
    lucebox_testkit::repo_root().join("tests/tokenizer")
}

fn read_json(path: PathBuf) -> Value {
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .expect("an id list")
        .iter()
        .map(|v| v.as_u64().expect("an id") as u32)
        .collect()
}

fn open(model: &str) -> GgufFile {
    GgufFile::open(lucebox_testkit::model(model)).expect("model opens")
}

fn check_encodings(model: &str, loader_divergences: &[&str]) {
    let file = open(model);
    let tokenizer = Tokenizer::from_gguf(file.metadata()).expect("tokenizer builds");
    let corpus = read_json(fixture_dir().join("corpus.json"));
    let fixture = read_json(fixture_dir().join(format!("fixtures/{model}.hf.json")));
    let references = fixture["encodings"].as_array().expect("encodings");
    let mut failures = Vec::new();
    let mut loader_differs = Vec::new();
    for (entry, reference) in corpus.as_array().expect("corpus").iter().zip(references) {
        let name = entry["name"].as_str().expect("name");
        let text = entry["text"].as_str().expect("text");
        assert_eq!(
            reference["name"], entry["name"],
            "fixture and corpus out of step"
        );
        for (parse_special, suffix) in [(true, ""), (false, "_split_special")] {
            let ours = tokenizer.encode(text, parse_special);
            let hf = ids(&reference[format!("hf{suffix}")]);
            let original = ids(&reference[format!("original{suffix}")]);
            if ours != original {
                failures.push(format!(
                    "{name} (parse_special {parse_special}):\n  ours     {ours:?}\n  expected {original:?}\n  hf       {hf:?}"
                ));
            }
            if hf != original && !loader_differs.contains(&name) {
                loader_differs.push(name);
            }
        }
        let decoded = tokenizer.decode(&tokenizer.encode(text, false), false);
        let expected: String = if model.starts_with("qwen") {
            text.nfc().collect()
        } else {
            text.to_string()
        };
        if decoded != expected {
            failures.push(format!("{name}: decodes to {decoded:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{model}: {} mismatches\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(
        loader_differs, loader_divergences,
        "{model}: the entries where transformers' GGUF loader differs from the published tokenizer changed"
    );
}

fn check_chat(model: &str) {
    let file = open(model);
    let template = ChatTemplate::from_gguf(file.metadata())
        .expect("template compiles")
        .expect("file has a template");
    let conversations = read_json(fixture_dir().join("conversations.json"));
    let fixture = read_json(fixture_dir().join(format!("fixtures/{model}.hf.json")));
    for (conversation, reference) in conversations
        .as_array()
        .expect("list")
        .iter()
        .zip(fixture["chat"].as_array().expect("chat"))
    {
        let messages: Vec<ChatMessage> = conversation["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| {
                ChatMessage::new(
                    m["role"].as_str().expect("role"),
                    m["content"].as_str().expect("content"),
                )
            })
            .collect();
        let add_generation_prompt = conversation["add_generation_prompt"]
            .as_bool()
            .expect("flag");
        let ours = template
            .render(&messages, add_generation_prompt)
            .expect("renders");
        assert_eq!(
            ours,
            reference["text"].as_str().expect("text"),
            "{model}: {}",
            conversation["name"]
        );
    }
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn qwen2_5_coder_0_5b_encodes_as_hugging_face() {
    check_encodings(
        "qwen2.5-coder-0.5b-instruct-q4_k_m",
        QWEN2_LOADER_DIVERGENCES,
    );
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn qwen2_5_coder_1_5b_encodes_as_hugging_face() {
    check_encodings(
        "qwen2.5-coder-1.5b-instruct-q4_k_m",
        QWEN2_LOADER_DIVERGENCES,
    );
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn smollm2_encodes_as_hugging_face() {
    check_encodings("smollm2-135m-instruct-q4_1", SMOLLM2_LOADER_DIVERGENCES);
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn chat_templates_render_as_hugging_face() {
    for model in [
        "qwen2.5-coder-0.5b-instruct-q4_k_m",
        "qwen2.5-coder-1.5b-instruct-q4_k_m",
        "smollm2-135m-instruct-q4_1",
    ] {
        check_chat(model);
    }
}
