//! The health gate: after every activation and every boot, whether the running NixOS generation
//! stays and becomes the boot default, or gives way to the newest generation that passed.
//!
//! The caller probes the server (`/health`, then a one-token completion) and hands the outcome
//! to [`decide`] with the system profile ([`SystemProfile::read`]) and the gate's memory
//! ([`GateState`]). The decision is pure, so it is tested over fake profile directories;
//! [`Decision::commands`] turns it into the `nix-env` and `switch-to-configuration` calls a
//! NixOS administrator would type.
//!
//! - A generation that passes is remembered as good and made the boot default (after
//!   `nixos-rebuild test` it is not in the profile yet, so it is added).
//! - A generation that fails while activated (`switch` or `test`) gives way at once to the
//!   newest good generation, by `switch`: the running kernel is the old one, so user space is
//!   what changed.
//! - A generation that fails on a fresh boot has a new kernel and drivers running: after
//!   `max_boot_failures` such boots in a row, the newest good generation becomes the boot
//!   default and the machine reboots into it; before that it reboots to try again.
//! - With no good generation to go back to, the failure is recorded and nothing is switched.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A NixOS system profile (`/nix/var/nix/profiles/system`) and its numbered generations.
#[derive(Debug, Clone)]
pub struct SystemProfile {
    path: PathBuf,
    generations: Vec<Generation>,
    current: Option<u64>,
}

/// One generation of a profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    /// Its number: the `N` of `system-N-link`.
    pub number: u64,
    /// The system it links to, resolved (a store path).
    pub system: PathBuf,
}

/// Errors reading a profile or the gate's state.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum GateError {
    /// A file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The profile path has no parent directory or file name.
    #[error("{}: not a profile path like /nix/var/nix/profiles/system", path.display())]
    NotAProfile {
        /// The path.
        path: PathBuf,
    },
    /// The state file is not the gate's JSON.
    #[error("{}: {source}", path.display())]
    State {
        /// The state file.
        path: PathBuf,
        /// What the JSON reader found.
        source: serde_json::Error,
    },
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> GateError + '_ {
    move |source| GateError::Io {
        path: path.to_owned(),
        source,
    }
}

impl SystemProfile {
    /// Reads the generations beside `profile` (`<profile>-<N>-link`) and which one `profile`
    /// points to.
    pub fn read(profile: &Path) -> Result<Self, GateError> {
        let not_a_profile = || GateError::NotAProfile {
            path: profile.to_owned(),
        };
        let dir = profile.parent().ok_or_else(not_a_profile)?;
        let stem = profile
            .file_name()
            .and_then(|name| name.to_str())
            .ok_or_else(not_a_profile)?;
        let number_of = |file_name: &str| -> Option<u64> {
            let digits = file_name.strip_prefix(stem)?.strip_prefix('-')?;
            let digits = digits.strip_suffix("-link")?;
            digits
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| digits.parse().ok())?
        };
        let mut generations = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
            let entry = entry.map_err(io_error(dir))?;
            let Some(number) = entry.file_name().to_str().and_then(number_of) else {
                continue;
            };
            let link = entry.path();
            let system = std::fs::canonicalize(&link).map_err(io_error(&link))?;
            generations.push(Generation { number, system });
        }
        generations.sort_by_key(|g| g.number);
        let current = match std::fs::read_link(profile) {
            Ok(target) => target
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(number_of),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_error(profile)(e)),
        };
        Ok(Self {
            path: profile.to_owned(),
            generations,
            current,
        })
    }

    /// The generations, oldest first.
    pub fn generations(&self) -> &[Generation] {
        &self.generations
    }

    /// The generation the profile points to: the boot default.
    pub fn current(&self) -> Option<u64> {
        self.current
    }

    /// The newest generation of `system`.
    fn generation_of(&self, system: &Path) -> Option<u64> {
        self.generations
            .iter()
            .rev()
            .find(|g| g.system == system)
            .map(|g| g.number)
    }

    fn link(&self, number: u64) -> PathBuf {
        let stem = self.path.file_name().unwrap_or_default().to_string_lossy();
        self.path.with_file_name(format!("{stem}-{number}-link"))
    }
}

/// What the gate remembers between runs, in `<state dir>/state.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateState {
    /// Systems that passed, oldest first.
    good: Vec<PathBuf>,
    /// The boot (`/proc/sys/kernel/random/boot_id`) the last check ran in.
    boot_id: Option<String>,
    /// Systems that failed on fresh boots, and on how many in a row.
    failed_boots: BTreeMap<PathBuf, u32>,
}

const STATE_FILE: &str = "state.json";

impl GateState {
    /// The state in `dir`, empty when the gate never ran.
    pub fn load(dir: &Path) -> Result<Self, GateError> {
        let path = dir.join(STATE_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|source| GateError::State { path, source })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(io_error(&path)(e)),
        }
    }

    /// Writes the state to `dir` whole or not at all (a temporary file renamed over it).
    pub fn save(&self, dir: &Path) -> Result<(), GateError> {
        let path = dir.join(STATE_FILE);
        let temporary = dir.join(format!("{STATE_FILE}.tmp"));
        let json = serde_json::to_vec_pretty(self).map_err(|source| GateError::State {
            path: path.clone(),
            source,
        })?;
        std::fs::write(&temporary, json).map_err(io_error(&temporary))?;
        std::fs::rename(&temporary, &path).map_err(io_error(&path))
    }

    /// Systems that passed, oldest first.
    pub fn good(&self) -> &[PathBuf] {
        &self.good
    }
}

/// One run of the gate: what is running and how its probe went.
#[derive(Debug, Clone)]
pub struct Check<'a> {
    /// `/run/current-system`, resolved.
    pub running: &'a Path,
    /// `/run/booted-system`, resolved.
    pub booted: &'a Path,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: &'a str,
    /// The probe: passed, or why not.
    pub probe: Result<(), String>,
    /// Fresh boots a generation may fail in a row before the gate rolls back.
    pub max_boot_failures: u32,
}

/// What to do with the running generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    /// It passed: it is (or becomes) the boot default. `generation` is `None` when it is not in
    /// the profile yet (`nixos-rebuild test`).
    Commit {
        /// Its generation, if the profile has it.
        generation: Option<u64>,
    },
    /// It failed on a fresh boot, fewer times in a row than allowed: reboot into it again.
    Retry {
        /// Fresh boots it has failed in a row.
        failed_boots: u32,
    },
    /// It failed: go back to generation `to`, the newest that passed.
    RollBack {
        /// The generation to go back to.
        to: u64,
        /// Whether to reboot into it (the failure came with a fresh boot's kernel and drivers).
        reboot: bool,
    },
    /// It failed and no generation that passed is left to go back to.
    Stay,
}

/// A decision with its reason, as recorded in `<state dir>/decisions.jsonl`.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// The running system.
    pub system: PathBuf,
    /// Its generation, if the profile has it.
    pub generation: Option<u64>,
    /// Whether the check ran on a fresh boot.
    pub fresh_boot: bool,
    /// What to do.
    #[serde(flatten)]
    pub decision: Decision,
    /// Why, in one line.
    pub reason: String,
}

/// Decides what to do with the running generation and updates `state` to remember it.
pub fn decide(profile: &SystemProfile, state: &mut GateState, check: &Check<'_>) -> Verdict {
    let running = check.running.to_path_buf();
    let generation = profile.generation_of(&running);
    let fresh_boot =
        state.boot_id.as_deref() != Some(check.boot_id) && check.running == check.booted;
    state.boot_id = Some(check.boot_id.to_owned());
    let verdict = |decision, reason: String| Verdict {
        system: running.clone(),
        generation,
        fresh_boot,
        decision,
        reason,
    };
    let failure = match &check.probe {
        Ok(()) => {
            state.failed_boots.remove(&running);
            state.good.retain(|system| *system != running);
            state.good.push(running.clone());
            let reason = match generation {
                Some(n) if profile.current() == Some(n) => {
                    format!("generation {n} passed; it is the boot default")
                }
                Some(n) => format!("generation {n} passed; it becomes the boot default"),
                None => "the running system passed; it becomes a new generation and the boot \
                         default"
                    .to_owned(),
            };
            return verdict(Decision::Commit { generation }, reason);
        }
        Err(failure) => failure,
    };
    state.good.retain(|system| *system != running);
    let failed_boots = if fresh_boot {
        let count = state.failed_boots.entry(running.clone()).or_default();
        *count += 1;
        *count
    } else {
        0
    };
    if fresh_boot && failed_boots < check.max_boot_failures {
        let reason = format!(
            "failed on boot {failed_boots} of {} allowed: {failure}; rebooting to try again",
            check.max_boot_failures
        );
        return verdict(Decision::Retry { failed_boots }, reason);
    }
    let fallback = state
        .good
        .iter()
        .rev()
        .find_map(|system| profile.generation_of(system));
    match fallback {
        Some(to) => {
            let when = if fresh_boot {
                format!("after {failed_boots} fresh boot(s)")
            } else {
                "when activated".to_owned()
            };
            let reason = format!("failed {when}: {failure}; back to generation {to}");
            verdict(
                Decision::RollBack {
                    to,
                    reboot: fresh_boot,
                },
                reason,
            )
        }
        None => verdict(
            Decision::Stay,
            format!("failed: {failure}; no generation that passed is left to go back to"),
        ),
    }
}

impl Verdict {
    /// Whether the running generation passed.
    pub fn passed(&self) -> bool {
        matches!(self.decision, Decision::Commit { .. })
    }

    /// The commands that carry the decision out, in order (none when there is nothing to do).
    pub fn commands(&self, profile: &SystemProfile) -> Vec<Vec<OsString>> {
        let nix_env = |args: &[&str]| -> Vec<OsString> {
            let mut command: Vec<OsString> = vec!["nix-env".into(), "--profile".into()];
            command.push(profile.path.clone().into());
            command.extend(args.iter().map(OsString::from));
            command
        };
        let switch = |system: &Path, action: &str| -> Vec<OsString> {
            vec![
                system.join("bin/switch-to-configuration").into(),
                action.into(),
            ]
        };
        let reboot = || vec![OsString::from("systemctl"), OsString::from("reboot")];
        match self.decision {
            Decision::Commit {
                generation: Some(n),
            } if profile.current() == Some(n) => Vec::new(),
            Decision::Commit {
                generation: Some(n),
            } => vec![
                nix_env(&["--switch-generation", &n.to_string()]),
                switch(&self.system, "boot"),
            ],
            Decision::Commit { generation: None } => {
                let mut set = nix_env(&["--set"]);
                set.push(self.system.clone().into());
                vec![set, switch(&self.system, "boot")]
            }
            Decision::Retry { .. } => vec![reboot()],
            Decision::RollBack { to, reboot: false } => vec![
                nix_env(&["--switch-generation", &to.to_string()]),
                switch(&profile.link(to), "switch"),
            ],
            Decision::RollBack { to, reboot: true } => vec![
                nix_env(&["--switch-generation", &to.to_string()]),
                switch(&profile.link(to), "boot"),
                reboot(),
            ],
            Decision::Stay => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake root: `store/<name>` systems, and `profiles/system-N-link` links to them.
    struct Fake {
        root: tempfile::TempDir,
    }

    impl Fake {
        fn new(generations: &[&str], current: u64) -> Fake {
            let root = tempfile::tempdir().unwrap();
            std::fs::create_dir(root.path().join("profiles")).unwrap();
            let fake = Fake { root };
            for (index, name) in generations.iter().enumerate() {
                let system = fake.system(name);
                let link = fake
                    .profile()
                    .with_file_name(format!("system-{}-link", index + 1));
                std::os::unix::fs::symlink(system, link).unwrap();
            }
            std::os::unix::fs::symlink(format!("system-{current}-link"), fake.profile()).unwrap();
            fake
        }

        fn system(&self, name: &str) -> PathBuf {
            let path = self.root.path().join("store").join(name);
            std::fs::create_dir_all(&path).unwrap();
            std::fs::canonicalize(path).unwrap()
        }

        fn profile(&self) -> PathBuf {
            self.root.path().join("profiles/system")
        }

        fn read(&self) -> SystemProfile {
            SystemProfile::read(&self.profile()).unwrap()
        }

        /// Runs the gate with `running` active, in boot `boot_id` of `booted`.
        fn check(
            &self,
            state: &mut GateState,
            running: &str,
            (booted, boot_id): (&str, &str),
            probe: Result<(), &str>,
        ) -> Verdict {
            let running = self.system(running);
            let check = Check {
                running: &running,
                booted: &self.system(booted),
                boot_id,
                probe: probe.map_err(str::to_owned),
                max_boot_failures: 2,
            };
            decide(&self.read(), state, &check)
        }
    }

    fn strings(commands: &[Vec<OsString>], root: &Path) -> Vec<String> {
        commands
            .iter()
            .map(|command| {
                let words: Vec<String> = command
                    .iter()
                    .map(|w| w.to_string_lossy().into_owned())
                    .collect();
                words.join(" ").replace(&*root.to_string_lossy(), "R")
            })
            .collect()
    }

    #[test]
    fn a_profile_lists_its_generations_and_its_current_one() {
        let fake = Fake::new(&["a", "b", "c"], 2);
        std::fs::write(fake.profile().with_file_name("system-x-link"), "").unwrap();
        std::fs::write(fake.profile().with_file_name("user-1-link"), "").unwrap();
        let profile = fake.read();
        let numbers: Vec<u64> = profile.generations().iter().map(|g| g.number).collect();
        assert_eq!(numbers, [1, 2, 3]);
        assert_eq!(profile.generations()[2].system, fake.system("c"));
        assert_eq!(profile.current(), Some(2));
    }

    #[test]
    fn a_passing_switch_is_remembered_and_needs_no_command() {
        let fake = Fake::new(&["a", "b"], 2);
        let mut state = GateState::default();
        let verdict = fake.check(&mut state, "b", ("a", "1"), Ok(()));
        assert_eq!(
            verdict.decision,
            Decision::Commit {
                generation: Some(2)
            }
        );
        assert!(verdict.passed() && !verdict.fresh_boot);
        assert!(verdict.commands(&fake.read()).is_empty());
        assert_eq!(state.good(), [fake.system("b")]);
    }

    #[test]
    fn a_passing_test_activation_becomes_a_generation_and_the_boot_default() {
        let fake = Fake::new(&["a"], 1);
        let mut state = GateState::default();
        let verdict = fake.check(&mut state, "t", ("a", "1"), Ok(()));
        assert_eq!(verdict.decision, Decision::Commit { generation: None });
        let root = fake.root.path().canonicalize().unwrap();
        assert_eq!(
            strings(&verdict.commands(&fake.read()), &root),
            [
                "nix-env --profile R/profiles/system --set R/store/t",
                "R/store/t/bin/switch-to-configuration boot",
            ]
        );
    }

    #[test]
    fn a_failing_activation_rolls_back_at_once_to_the_newest_good_generation() {
        let fake = Fake::new(&["a", "b", "c"], 3);
        let mut state = GateState::default();
        assert!(fake.check(&mut state, "a", ("a", "1"), Ok(())).passed());
        assert!(fake.check(&mut state, "b", ("a", "1"), Ok(())).passed());
        let verdict = fake.check(&mut state, "c", ("a", "1"), Err("/health: 503"));
        assert_eq!(
            verdict.decision,
            Decision::RollBack {
                to: 2,
                reboot: false
            }
        );
        assert_eq!(
            verdict.reason,
            "failed when activated: /health: 503; back to generation 2"
        );
        let root = fake.root.path().canonicalize().unwrap();
        assert_eq!(
            strings(&verdict.commands(&fake.read()), &root),
            [
                "nix-env --profile R/profiles/system --switch-generation 2",
                "R/profiles/system-2-link/bin/switch-to-configuration switch",
            ]
        );
    }

    #[test]
    fn a_generation_that_passed_then_fails_after_a_reboot_is_retried_then_rolled_back() {
        let fake = Fake::new(&["a", "b"], 2);
        let mut state = GateState::default();
        assert!(fake.check(&mut state, "a", ("a", "1"), Ok(())).passed());
        // `b` passes when switched to under `a`'s kernel...
        assert!(fake.check(&mut state, "b", ("a", "1"), Ok(())).passed());
        // ...and fails on its own kernel: once is retried, twice rolls back with a reboot.
        let first = fake.check(&mut state, "b", ("b", "2"), Err("no GPU"));
        assert_eq!(first.decision, Decision::Retry { failed_boots: 1 });
        assert!(first.fresh_boot);
        let root = fake.root.path().canonicalize().unwrap();
        assert_eq!(
            strings(&first.commands(&fake.read()), &root),
            ["systemctl reboot"]
        );
        let second = fake.check(&mut state, "b", ("b", "3"), Err("no GPU"));
        assert_eq!(
            second.decision,
            Decision::RollBack {
                to: 1,
                reboot: true
            }
        );
        assert_eq!(
            strings(&second.commands(&fake.read()), &root),
            [
                "nix-env --profile R/profiles/system --switch-generation 1",
                "R/profiles/system-1-link/bin/switch-to-configuration boot",
                "systemctl reboot",
            ]
        );
        assert_eq!(state.good(), [fake.system("a")]);
    }

    #[test]
    fn a_server_that_never_reaches_ready_is_rolled_back() {
        let fake = Fake::new(&["a", "b"], 2);
        let mut state = GateState::default();
        assert!(fake.check(&mut state, "a", ("a", "1"), Ok(())).passed());
        let verdict = fake.check(
            &mut state,
            "b",
            ("a", "1"),
            Err("lucebox.service never reached READY: failed (exit-code)"),
        );
        assert_eq!(
            verdict.decision,
            Decision::RollBack {
                to: 1,
                reboot: false
            }
        );
    }

    #[test]
    fn repeated_failures_never_loop_back_to_a_failed_generation() {
        let fake = Fake::new(&["a", "b", "c"], 3);
        let mut state = GateState::default();
        for system in ["a", "b", "c"] {
            assert!(fake.check(&mut state, system, ("a", "1"), Ok(())).passed());
        }
        // From here on everything fails (say the GPU died), boot after boot.
        let mut boot = 2;
        let mut running = "c";
        let mut visited = vec![running];
        loop {
            boot += 1;
            let verdict = fake.check(&mut state, running, (running, &boot.to_string()), Err("x"));
            match verdict.decision {
                Decision::Retry { .. } => continue,
                Decision::RollBack { to, reboot } => {
                    assert!(reboot);
                    running = ["a", "b", "c"][to as usize - 1];
                    assert!(
                        !visited.contains(&running),
                        "back to {running} after {visited:?}"
                    );
                    visited.push(running);
                }
                Decision::Stay => break,
                Decision::Commit { .. } => unreachable!("a failed probe never commits"),
            }
            assert!(boot < 20, "no end after {boot} boots: {visited:?}");
        }
        assert_eq!(visited, ["c", "b", "a"]);
        assert!(state.good().is_empty());
    }

    #[test]
    fn a_check_in_the_same_boot_is_no_fresh_boot() {
        let fake = Fake::new(&["a"], 1);
        let mut state = GateState::default();
        assert!(fake.check(&mut state, "a", ("a", "1"), Ok(())).fresh_boot);
        assert!(!fake.check(&mut state, "a", ("a", "1"), Ok(())).fresh_boot);
        assert!(fake.check(&mut state, "a", ("a", "2"), Ok(())).fresh_boot);
    }

    #[test]
    fn with_nothing_good_left_the_failure_stays_and_is_explained() {
        let fake = Fake::new(&["a", "b"], 2);
        let mut state = GateState::default();
        let verdict = fake.check(&mut state, "b", ("a", "1"), Err("timed out"));
        assert_eq!(verdict.decision, Decision::Stay);
        assert!(
            verdict.reason.contains("no generation that passed"),
            "{}",
            verdict.reason
        );
        assert!(verdict.commands(&fake.read()).is_empty());
    }

    #[test]
    fn a_good_system_no_longer_in_the_profile_is_skipped() {
        let fake = Fake::new(&["a", "b", "c"], 3);
        let mut state = GateState::default();
        for system in ["a", "b"] {
            assert!(fake.check(&mut state, system, ("a", "1"), Ok(())).passed());
        }
        std::fs::remove_file(fake.profile().with_file_name("system-2-link")).unwrap();
        let verdict = fake.check(&mut state, "c", ("a", "1"), Err("500"));
        assert_eq!(
            verdict.decision,
            Decision::RollBack {
                to: 1,
                reboot: false
            }
        );
    }

    #[test]
    fn state_survives_a_save_and_a_load() {
        let fake = Fake::new(&["a"], 1);
        let dir = fake.root.path();
        assert_eq!(GateState::load(dir).unwrap(), GateState::default());
        let mut state = GateState::default();
        fake.check(&mut state, "a", ("a", "1"), Err("x"));
        state.save(dir).unwrap();
        assert_eq!(GateState::load(dir).unwrap(), state);
        std::fs::write(dir.join(STATE_FILE), "{").unwrap();
        let error = GateState::load(dir).unwrap_err().to_string();
        assert!(error.contains("state.json"), "{error}");
    }
}
