//! `lucebox health-gate`: probes the local server and keeps, commits or rolls back the running
//! NixOS generation (the decision is `lucebox_appliance::decide`; this runs the probe and the
//! commands).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Args;
use lucebox_appliance::{Check, GateState, SystemProfile, Verdict, decide};
use serde_json::{Value, json};

/// Flags of `lucebox health-gate`; the defaults are NixOS's paths.
#[derive(Debug, Args)]
pub struct HealthGateArgs {
    /// The server to probe.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// The systemd unit of the server: the gate first waits for it to be active, which for a
    /// `Type=notify` unit means it sent READY=1.
    #[arg(long)]
    unit: Option<String>,
    /// The server's API key, from the first line of this file.
    #[arg(long, value_name = "FILE")]
    api_key_file: Option<PathBuf>,
    /// How long the server may take to become healthy (model load included), in seconds.
    #[arg(long, default_value_t = 900)]
    timeout_secs: u64,
    /// Fresh boots a generation may fail in a row before the gate rolls back.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    max_boot_failures: u32,
    /// Where the gate remembers good generations and records its verdicts (decisions.jsonl).
    #[arg(long, default_value = "/var/lib/lucebox-health-gate")]
    state_dir: PathBuf,
    /// The system profile whose generations the gate switches between.
    #[arg(long, default_value = "/nix/var/nix/profiles/system")]
    system_profile: PathBuf,
    /// The running system.
    #[arg(long, default_value = "/run/current-system")]
    current_system: PathBuf,
    /// The system the machine booted.
    #[arg(long, default_value = "/run/booted-system")]
    booted_system: PathBuf,
    /// The file naming this boot.
    #[arg(long, default_value = "/proc/sys/kernel/random/boot_id")]
    boot_id_file: PathBuf,
    /// Print the verdict and the commands it needs; change nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Runs the gate; fails (exit 1) when the running generation did not pass.
pub fn run(args: HealthGateArgs) -> anyhow::Result<()> {
    let resolve = |path: &Path| {
        std::fs::canonicalize(path).with_context(|| format!("resolving {}", path.display()))
    };
    let running = resolve(&args.current_system)?;
    let booted = resolve(&args.booted_system)?;
    let boot_id = std::fs::read_to_string(&args.boot_id_file)
        .with_context(|| args.boot_id_file.display().to_string())?;
    let profile = SystemProfile::read(&args.system_profile)?;
    let api_key = match &args.api_key_file {
        Some(path) => Some(crate::serve::read_api_key(path)?),
        None => None,
    };
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let probe = match &args.unit {
        Some(unit) => wait_ready(unit, deadline),
        None => Ok(()),
    }
    .and_then(|()| probe(&args.url, api_key.as_deref(), deadline));
    let mut state = GateState::load(&args.state_dir)?;
    let verdict = decide(
        &profile,
        &mut state,
        &Check {
            running: &running,
            booted: &booted,
            boot_id: boot_id.trim(),
            probe,
            max_boot_failures: args.max_boot_failures,
        },
    );
    let commands = verdict.commands(&profile);
    println!("lucebox health-gate: {}", verdict.reason);
    if args.dry_run {
        for command in &commands {
            println!("would run: {}", shell_words(command));
        }
    } else {
        std::fs::create_dir_all(&args.state_dir)
            .with_context(|| args.state_dir.display().to_string())?;
        state.save(&args.state_dir)?;
        record(&args.state_dir, &verdict)?;
        if !commands.is_empty() {
            launch(&commands)?;
        }
    }
    if !verdict.passed() {
        bail!("the running generation failed its health check");
    }
    Ok(())
}

/// Waits until `unit` is active (READY=1 sent): `Err` when it fails or the deadline passes.
fn wait_ready(unit: &str, deadline: Instant) -> Result<(), String> {
    loop {
        let out = std::process::Command::new("systemctl")
            .args(["show", "--property=ActiveState,SubState,Result", unit])
            .output()
            .map_err(|e| format!("systemctl show {unit}: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let property = |key: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
                .unwrap_or("unknown")
                .to_owned()
        };
        let (active, sub, result) = (
            property("ActiveState"),
            property("SubState"),
            property("Result"),
        );
        match active.as_str() {
            "active" => return Ok(()),
            "failed" => return Err(format!("{unit} never reached READY: failed ({result})")),
            _ if Instant::now() >= deadline => {
                return Err(format!(
                    "{unit} never reached READY in time: {active} ({sub}), result {result}"
                ));
            }
            _ => std::thread::sleep(Duration::from_secs(2)),
        }
    }
}

/// Waits for `/health` to answer 200, then asks for one token: `Err` says what went wrong.
fn probe(url: &str, api_key: Option<&str>, deadline: Instant) -> Result<(), String> {
    let started = Instant::now();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(5)))
        .build()
        .into();
    let base = url.trim_end_matches('/');
    loop {
        let failure = match agent.get(format!("{base}/health")).call() {
            Ok(reply) if reply.status() == 200 => break,
            Ok(reply) => format!("/health answered {}", reply.status()),
            Err(e) => format!("/health: {e}"),
        };
        if Instant::now() >= deadline {
            return Err(format!("{failure} after {} s", started.elapsed().as_secs()));
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    let left = deadline.saturating_duration_since(Instant::now());
    let mut request = agent
        .post(format!("{base}/v1/completions"))
        .config()
        .timeout_global(Some(left.max(Duration::from_secs(30))))
        .build()
        .header("Content-Type", "application/json");
    if let Some(key) = api_key {
        request = request.header("Authorization", format!("Bearer {key}"));
    }
    let body = json!({"prompt": "Hello", "max_tokens": 1, "temperature": 0});
    let mut reply = request
        .send(body.to_string())
        .map_err(|e| format!("one-token completion: {e}"))?;
    let status = reply.status();
    let text = reply
        .body_mut()
        .read_to_string()
        .map_err(|e| format!("one-token completion: {e}"))?;
    let tokens = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|body| body["usage"]["completion_tokens"].as_u64());
    match (status.as_u16(), tokens) {
        (200, Some(1)) => Ok(()),
        _ => {
            let head: String = text.chars().take(200).collect();
            Err(format!("one-token completion answered {status}: {head}"))
        }
    }
}

/// Appends the verdict to `<state dir>/decisions.jsonl` with the time.
fn record(state_dir: &Path, verdict: &Verdict) -> anyhow::Result<()> {
    let path = state_dir.join("decisions.jsonl");
    let unix_seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| t.as_secs());
    let mut line = json!({"unix_seconds": unix_seconds});
    if let (Value::Object(line), Value::Object(verdict)) =
        (&mut line, serde_json::to_value(verdict)?)
    {
        line.extend(verdict);
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| path.display().to_string())?;
    writeln!(file, "{line}").with_context(|| path.display().to_string())
}

/// The lock every `switch-to-configuration` takes, failing at once when another holds it.
const SWITCH_LOCK: &str = "/run/nixos/switch-to-configuration.lock";

/// Starts the commands, in order, as a transient systemd unit and returns at once: the gate
/// may run inside a `switch-to-configuration`, which waits for the gate and holds the lock the
/// commands need, so the unit first waits for that lock to be free. It runs with the gate's
/// PATH (where the NixOS module puts nix-env and flock).
fn launch(commands: &[Vec<std::ffi::OsString>]) -> anyhow::Result<()> {
    let wait_for_lock = format!("while ! flock --nonblock {SWITCH_LOCK} true; do sleep 1; done");
    let script = ["set -e".to_owned(), wait_for_lock]
        .into_iter()
        .chain(commands.iter().map(|command| shell_words(command)))
        .collect::<Vec<_>>()
        .join("; ");
    let path = std::env::var("PATH").unwrap_or_default();
    let status = std::process::Command::new("systemd-run")
        .arg(format!("--setenv=PATH={path}"))
        .args([
            "--no-block",
            "--collect",
            "--service-type=oneshot",
            "--unit=lucebox-health-gate-action",
            "--description=Lucebox health gate: carry out the verdict",
            "--",
            "/bin/sh",
            "-c",
            &script,
        ])
        .status()
        .context("starting systemd-run")?;
    if !status.success() {
        bail!("systemd-run failed ({status}) to start: {script}");
    }
    Ok(())
}

/// A command as one line of POSIX shell, each word single-quoted where it needs to be.
fn shell_words(command: &[std::ffi::OsString]) -> String {
    command
        .iter()
        .map(|word| {
            let word = word.to_string_lossy();
            let plain = !word.is_empty()
                && word
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"/._-+=:".contains(&b));
            if plain {
                word.into_owned()
            } else {
                format!("'{}'", word.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_quote_what_the_shell_would_split_or_expand() {
        let words = ["a/b-1.2", "it's", "", "$x y"].map(std::ffi::OsString::from);
        assert_eq!(shell_words(&words), r"a/b-1.2 'it'\''s' '' '$x y'");
    }
}
