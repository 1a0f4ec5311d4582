//! Bad command-line input ends with exit status 1 and one line on stderr saying what and where,
//! never a panic.

use std::process::Command;

fn lucebox(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lucebox"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn assert_one_line_error(args: &[&str], expected: &str) {
    let (code, stderr) = lucebox(args);
    assert_eq!(code, 1, "{args:?}: exit status, stderr {stderr:?}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "{args:?}: not one line: {stderr:?}"
    );
    assert!(stderr.starts_with("lucebox: "), "{args:?}: {stderr:?}");
    assert!(
        stderr.contains(expected),
        "{args:?}: {stderr:?} does not mention {expected:?}"
    );
}

#[test]
fn a_file_that_is_not_gguf_is_named_with_the_offending_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, b"this is not a model").unwrap();
    let path = path.to_str().unwrap();
    assert_one_line_error(
        &["generate", "--model", path, "--prompt", "hi"],
        "header.magic at byte 0: not a GGUF file",
    );
    std::fs::write(
        dir.path().join("model.gguf"),
        b"GGUF\x03\0\0\0\xff\xff\xff\xff\xff\xff\xff\xff",
    )
    .unwrap();
    assert_one_line_error(&["bench", "--model", path], "header.n_tensors at byte 8");
}

#[test]
fn unknown_models_and_bad_flags_are_refused_before_any_work() {
    assert_one_line_error(
        &["generate", "--model", "no-such-model", "--prompt", "hi"],
        "no catalogue model of that name",
    );
    assert_one_line_error(
        &["generate", "--model", "x", "--prompt", "hi", "--top-p", "2"],
        "top_p: 2 is not in (0, 1]",
    );
    assert_one_line_error(
        &[
            "generate",
            "--model",
            "x",
            "--prompt",
            "hi",
            "--temperature",
            "-1",
        ],
        "temperature: -1",
    );
    assert_one_line_error(
        &[
            "generate",
            "--model",
            "x",
            "--prompt",
            "hi",
            "--max-tokens",
            "0",
        ],
        "--max-tokens",
    );
    assert_one_line_error(
        &["bench", "--model", "x", "--repetitions", "0"],
        "--repetitions",
    );
    assert_one_line_error(&["fetch"], "--all");
    assert_one_line_error(&["fetch", "no-such-model"], "no-such-model");
    assert_one_line_error(
        &[
            "generate",
            "--model",
            "x",
            "--prompt",
            "hi",
            "--ngram",
            "--draft-tokens",
            "0",
        ],
        "--draft-tokens 0",
    );
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn a_drafter_with_another_tokenizer_is_refused() {
    let target = lucebox_testkit::model("qwen2.5-coder-0.5b-instruct-q4_k_m");
    let drafter = lucebox_testkit::model("smollm2-135m-instruct-q4_1");
    let (target, drafter) = (target.to_str().unwrap(), drafter.to_str().unwrap());
    assert_one_line_error(
        &[
            "generate", "--model", target, "--draft", drafter, "--prompt", "hi",
        ],
        "tokenizer: the tokenizers differ",
    );
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("pair.json");
    let out = Command::new(env!("CARGO_BIN_EXE_lucebox"))
        .args(["verify-pair", target, drafter, "--record"])
        .arg(&record)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("FAIL  tokenizer"), "{stdout}");
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    assert_eq!(record["verdict"], "fail");
    assert!(record["probe"].is_null(), "no probe for a refused pair");
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn the_qwen_coder_pair_passes_verification() {
    let target = lucebox_testkit::model("qwen2.5-coder-1.5b-instruct-q4_k_m");
    let drafter = lucebox_testkit::model("qwen2.5-coder-0.5b-instruct-q4_k_m");
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("pair.json");
    let out = Command::new(env!("CARGO_BIN_EXE_lucebox"))
        .arg("verify-pair")
        .args([&target, &drafter])
        .args(["--probe-tokens", "16", "--record"])
        .arg(&record)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    assert_eq!(record["verdict"], "pass", "{stdout}");
    let sha256: Vec<_> = record["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "sha256")
        .collect();
    assert_eq!(sha256.len(), 2, "both catalogue files hashed: {stdout}");
    assert!(record["probe"]["acceptance_rate"].as_f64().unwrap() > 0.4);
}
