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
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts.toml");
    let prompts_arg = prompts.to_str().unwrap();
    let spec = [
        "bench",
        "--model",
        "x",
        "--spec",
        "--prompt-file",
        prompts_arg,
    ];
    assert_one_line_error(&spec, "--prompt-file");
    std::fs::write(
        &prompts,
        "[[prompts]]\nname = \"a\"\nchat = false\ntext = \"hi\"\n",
    )
    .unwrap();
    assert_one_line_error(&spec, "missing field `max_tokens`");
    std::fs::write(&prompts, "prompts = [\n").unwrap();
    assert_one_line_error(&spec, "line 2, column 1: invalid array, expected `]`");
    std::fs::write(&prompts, "prompts = []\n").unwrap();
    assert_one_line_error(&spec, "no [[prompts]]");
    assert_one_line_error(
        &["bench", "--model", "x", "--draft-tokens", "4"],
        "--draft-tokens goes with --spec or --serve",
    );
    std::fs::write(
        &prompts,
        "[[prompts]]\nname = \"a\"\nchat = false\ntext = \"hi\"\nmax_tokens = 4\n",
    )
    .unwrap();
    let mut too_long = spec.to_vec();
    too_long.extend(["--draft-tokens", "17"]);
    assert_one_line_error(&too_long, "--draft-tokens 17 is not between 1 and 16");
    let mut unknown = spec.to_vec();
    unknown.extend(["--prompts", "a,b"]);
    assert_one_line_error(&unknown, "--prompts: no prompt \"b\" in the set (a)");
    assert_one_line_error(
        &["bench", "--model", "x", "--prompts", "a"],
        "--prompts goes with --spec or --serve",
    );
    let mut replay = spec.to_vec();
    replay.extend(["--replay", "40"]);
    assert_one_line_error(
        &replay,
        "--replay: give the milliseconds of passes of 1 and 2",
    );
    replay.push("--replay=50,-1");
    assert_one_line_error(&replay, "--replay: -1 is not the milliseconds of a pass");
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

/// `lucebox doctor` over a fake machine: its exit status and stdout.
fn doctor(sysroot: &std::path::Path, chip: &str) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lucebox"))
        .args([
            "doctor",
            "--chip",
            chip,
            "--sysroot",
            sysroot.to_str().unwrap(),
        ])
        .env("ROCM_PATH", "/opt/rocm")
        .env("LUCEBOX_MODEL_DIR", sysroot.join("models"))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn doctor_says_plainly_when_there_is_no_gpu_and_names_the_one_there_is() {
    let root = tempfile::tempdir().unwrap();
    // No GPU here: the r9700 package is for another machine, and its HIP engine cannot start
    // (a build without HIP says so; a build with it finds no device).
    let engine = "the profile's HIP engine cannot start: ";
    let (code, stdout, stderr) = doctor(root.path(), "r9700");
    assert_eq!(code, 1, "{stdout}{stderr}");
    for line in [
        "engine backend: hip\n",
        "amd gpu: none (no GPU node under /sys/class/kfd)",
        "nvidia gpu: none (no /proc/driver/nvidia/gpus)",
        "pair qwen2.5-coder-32b+0.5b (default): qwen2.5-coder-32b-instruct-q4_k_m absent",
    ] {
        assert!(stdout.contains(line), "{line:?} not in {stdout}");
    }
    assert!(!stdout.contains("CPU engine"), "{stdout}");
    assert!(
        stderr.starts_with(
            "lucebox: the package is built for r9700, which this machine is not; \
             the profile's HIP engine cannot start: "
        ) && stderr.lines().count() == 1,
        "{stderr}"
    );

    // A fake gfx1201 under the sysroot: the chip is recognised and ROCm's version checked.
    let node = root.path().join("sys/class/kfd/kfd/topology/nodes/1");
    std::fs::create_dir_all(&node).unwrap();
    std::fs::write(node.join("properties"), "gfx_target_version 120001\n").unwrap();
    let info = root.path().join("opt/rocm/.info");
    std::fs::create_dir_all(&info).unwrap();
    std::fs::write(info.join("version"), "6.4.1-120\n").unwrap();
    let (code, stdout, stderr) = doctor(root.path(), "r9700");
    assert!(
        stdout.contains("amd gpu: node 1 is gfx1201 (profile r9700)\nrocm: 6.4.1-120\n"),
        "{stdout}"
    );
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stderr.starts_with(&format!("lucebox: {engine}"))
            && stderr
                .ends_with("; ROCm 6.4.1-120 is installed, the profile was built for ROCm 7.2\n"),
        "{stderr}"
    );
    std::fs::write(info.join("version"), "7.2.0\n").unwrap();
    let (code, stdout, stderr) = doctor(root.path(), "r9700");
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("package: built for r9700, which this machine is\n"),
        "{stdout}"
    );
    assert!(
        stderr.starts_with(&format!("lucebox: {engine}")) && !stderr.contains("ROCm"),
        "{stderr}"
    );

    // A drafter file of the right size but the wrong bytes fails verification.
    let models = root.path().join("models");
    std::fs::create_dir(&models).unwrap();
    let drafter = models.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    std::fs::File::create(&drafter)
        .unwrap()
        .set_len(491_400_064)
        .unwrap();
    let (code, stdout, stderr) = doctor(root.path(), "cpu");
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.contains("tested chip: yes (r9700)\npackage: built for cpu, which runs anywhere\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("qwen2.5-coder-0.5b-instruct-q4_k_m CORRUPT (sha256 differs)"),
        "{stdout}"
    );
    assert_eq!(
        stderr,
        format!(
            "lucebox: {} does not match its pinned sha256: delete it to fetch it again\n",
            drafter.display()
        )
    );
}

#[test]
fn a_gpu_device_this_machine_or_build_lacks_is_one_line() {
    // Each GPU device, with what a build without its backend says, and, for HIP, what a
    // build with it says on a machine without an AMD GPU (this one and CI). A build without
    // the backend refuses before `serve` listens; one with it fails while loading, after.
    let no_amd_gpu = !std::path::Path::new("/dev/kfd").exists();
    for (device, built) in [
        ("cuda", cfg!(feature = "cuda")),
        ("hip", cfg!(feature = "hip")),
    ] {
        let expected = match (device, built) {
            ("cuda", false) => "this lucebox was built without the CUDA backend",
            ("hip", false) => "this lucebox was built without the HIP backend",
            ("hip", true) if no_amd_gpu => {
                "hip backend unavailable: no AMD GPU that HIP can use on this machine"
            }
            _ => continue,
        };
        let commands: &[&str] = if built {
            &["bench"]
        } else {
            &["bench", "serve"]
        };
        for &command in commands {
            let mut args = vec![
                command,
                "--device",
                device,
                "--model",
                "smollm2-135m-instruct-q4_1",
            ];
            if command == "serve" {
                args.extend(["--port", "0"]);
            }
            assert_one_line_error(&args, expected);
        }
    }
}

#[test]
#[cfg(not(feature = "cuda"))]
fn doctor_fails_a_cuda_profile_on_a_build_without_cuda() {
    let root = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = doctor(root.path(), "rtx3090");
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.contains("engine backend: cuda\n") && !stdout.contains("CPU engine"),
        "{stdout}"
    );
    // No NVIDIA GPU here either: both problems, on one line.
    for problem in [
        "the package is built for rtx3090, which this machine is not",
        "the profile's CUDA engine cannot start: the cuda device: this lucebox was built without \
         the CUDA backend",
    ] {
        assert!(stderr.contains(problem), "{problem:?} not in {stderr}");
    }
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}
