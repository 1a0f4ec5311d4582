//! llama.cpp's own tokenizer tests: `models/ggml-vocab-<name>.gguf` (a vocabulary without
//! weights) with `.inp` (texts separated by `__ggml_vocab_test__` lines) and `.out` (one line of
//! ids per text), which llama.cpp's converter writes from the Hugging Face tokenizer. Encoded
//! without BOS and without parsing special tokens, as llama.cpp's test-tokenizer-0 does.
//!
//! The llama.cpp source tree is found through `LUCEBOX_LLAMA_CPP_SRC` (tests/run-all unpacks
//! llama-cpp-python's sdist and points it at `vendor/llama.cpp`).

use std::path::PathBuf;

use lucebox_gguf::GgufFile;
use lucebox_tokenizer::Tokenizer;

const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

fn vocab_dir() -> PathBuf {
    let root = std::env::var_os("LUCEBOX_LLAMA_CPP_SRC").expect(
        "LUCEBOX_LLAMA_CPP_SRC is not set: point it at a llama.cpp source tree (tests/run-all \
         sets it to the llama.cpp of the llama-cpp-python sdist it downloads)",
    );
    PathBuf::from(root).join("models")
}

fn check(name: &str) {
    let dir = vocab_dir();
    let gguf = dir.join(format!("ggml-vocab-{name}.gguf"));
    let file = GgufFile::open(&gguf).unwrap_or_else(|e| panic!("{}: {e}", gguf.display()));
    let tokenizer = Tokenizer::from_gguf(file.metadata()).expect("tokenizer builds");
    let read = |ext: &str| {
        let path = dir.join(format!("ggml-vocab-{name}.gguf.{ext}"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let (inputs, outputs) = (read("inp"), read("out"));
    let inputs: Vec<&str> = inputs
        .strip_suffix(SEPARATOR)
        .unwrap_or(&inputs)
        .split(SEPARATOR)
        .collect();
    let outputs: Vec<&str> = outputs.lines().collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{name}: .inp and .out disagree on the number of tests"
    );
    let mut failures = Vec::new();
    for (text, expected) in inputs.iter().zip(&outputs) {
        let expected: Vec<u32> = expected
            .split_whitespace()
            .map(|id| id.parse().expect("an id"))
            .collect();
        let ours = tokenizer.encode(text, false);
        if ours != expected {
            failures.push(format!(
                "{text:?}\n  ours     {ours:?}\n  expected {expected:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} texts differ\n{}",
        failures.len(),
        inputs.len(),
        failures.join("\n")
    );
}

#[test]
#[ignore = "needs LUCEBOX_LLAMA_CPP_SRC; run by tests/run-all"]
fn qwen2() {
    check("qwen2");
}

#[test]
#[ignore = "needs LUCEBOX_LLAMA_CPP_SRC; run by tests/run-all"]
fn llama_bpe() {
    check("llama-bpe");
}

#[test]
#[ignore = "needs LUCEBOX_LLAMA_CPP_SRC; run by tests/run-all"]
fn llama_spm() {
    check("llama-spm");
}

#[test]
#[ignore = "needs LUCEBOX_LLAMA_CPP_SRC; run by tests/run-all"]
fn gpt_2() {
    check("gpt-2");
}

/// StarCoder and Refact use the pre-tokenizer of SmolLM (digits one by one, then GPT-2's).
#[test]
#[ignore = "needs LUCEBOX_LLAMA_CPP_SRC; run by tests/run-all"]
fn starcoder() {
    check("starcoder");
}

#[test]
#[ignore = "needs LUCEBOX_LLAMA_CPP_SRC; run by tests/run-all"]
fn refact() {
    check("refact");
}

#[test]
#[ignore = "needs LUCEBOX_LLAMA_CPP_SRC; run by tests/run-all"]
fn phi_3() {
    check("phi-3");
}
