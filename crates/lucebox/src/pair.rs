//! `lucebox verify-pair`, and the pair checks every command that loads a drafter runs.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use lucebox_appliance::pair::{Finding, ModelFacts, Outcome, check_pair, refusal};
use lucebox_appliance::{Catalogue, sha256_file};
use lucebox_engine::speculative::{DraftPolicy, ModelDrafter, SpecStats, Speculator};
use lucebox_engine::{Sampler, SamplingParams, SessionConfig};
use lucebox_tokenizer::Tokenizer;
use serde::Serialize;

use crate::generate::prompt_tokens;
use lucebox_backend::{Backend, CpuBackend};

use crate::load::{Activations, Loaded, cpu_backend, drafter_precision, load_model};

#[derive(Debug, clap::Args)]
pub(crate) struct VerifyPairArgs {
    /// The target model: a GGUF file or a catalogue name.
    target: String,
    /// The drafter model: a GGUF file or a catalogue name.
    drafter: String,
    /// Where to write the JSON record (default: `pairs/TARGET+DRAFTER.json` in the model
    /// directory).
    #[arg(long)]
    record: Option<PathBuf>,
    /// Tokens generated per probe prompt.
    #[arg(long, default_value_t = 32)]
    probe_tokens: usize,
    /// Threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

/// Prompts of the acceptance probe: code, prose and a chat turn, greedy.
const PROBE_PROMPTS: [&str; 3] = [
    "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n",
    "The history of the printing press begins",
    "Question: How do I reverse a string in Python?\nAnswer:",
];

/// Below this share of drafts accepted, the probe fails: the drafter is not a drafter of this
/// target, whatever its tokenizer says.
const FAILING_ACCEPTANCE: f64 = 0.1;
/// Below this, it warns: speculation will mostly switch itself off.
const WEAK_ACCEPTANCE: f64 = 0.4;

#[derive(Serialize)]
struct Probe {
    prompts: usize,
    tokens_per_prompt: usize,
    draft_tokens: usize,
    drafted: u64,
    accepted: u64,
    acceptance_rate: f64,
    mean_acceptance_length: f64,
}

#[derive(Serialize)]
struct Record {
    lucebox_version: &'static str,
    verdict: Outcome,
    target: ModelFacts,
    drafter: ModelFacts,
    findings: Vec<Finding>,
    probe: Option<Probe>,
}

fn facts<B: Backend>(loaded: &Loaded<B>, hash: bool) -> anyhow::Result<ModelFacts> {
    let tokenizer = Tokenizer::from_gguf(loaded.file.metadata())
        .with_context(|| format!("{}: tokenizer", loaded.label))?;
    let sha256 = if hash && loaded.catalogue_name.is_some() {
        Some(
            sha256_file(&loaded.path)
                .with_context(|| format!("hashing {}", loaded.path.display()))?,
        )
    } else {
        None
    };
    let config = loaded.model.config();
    Ok(ModelFacts {
        label: loaded.label.clone(),
        catalogue_name: loaded.catalogue_name.clone(),
        tokenizer_digest: tokenizer.digest().to_owned(),
        vocab: config.vocab,
        context: config.context_length,
        sha256,
    })
}

/// Refuses a drafter that fails the checks needing no model run (hashes are left to
/// `verify-pair` and `fetch`), with the first failure as a one-line reason.
pub(crate) fn refuse_failing_pair<B: Backend>(
    target: &Loaded<B>,
    drafter: &Loaded<B>,
) -> anyhow::Result<()> {
    let findings = check_pair(
        &facts(target, false)?,
        &facts(drafter, false)?,
        &Catalogue::embedded()?,
    );
    if let Some(reason) = refusal(&findings) {
        bail!(
            "--draft {} cannot draft for {}: {reason} (see `lucebox verify-pair`)",
            drafter.label,
            target.label
        );
    }
    Ok(())
}

pub(crate) fn run(args: VerifyPairArgs) -> anyhow::Result<()> {
    if args.probe_tokens < 2 {
        bail!("--probe-tokens must be at least 2");
    }
    let backend = cpu_backend(args.threads)?;
    // Each at the precision serving gives it by default, so that the probe measures that.
    let target =
        load_model(&args.target, &backend, Activations::default().into()).context("TARGET")?;
    let drafter = load_model(&args.drafter, &backend, drafter_precision::<CpuBackend>())
        .context("DRAFTER")?;
    eprintln!("hashing catalogue models...");
    let target_facts = facts(&target, true)?;
    let drafter_facts = facts(&drafter, true)?;
    let mut findings = check_pair(&target_facts, &drafter_facts, &Catalogue::embedded()?);
    let probe = if refusal(&findings).is_none() {
        let probe = run_probe(&target, &drafter, args.probe_tokens)?;
        let rate = probe.acceptance_rate;
        let (outcome, meaning) = if rate < FAILING_ACCEPTANCE {
            (Outcome::Fail, "the drafter does not predict this target")
        } else if rate < WEAK_ACCEPTANCE {
            (Outcome::Warn, "speculation will rarely pay")
        } else {
            (Outcome::Pass, "the drafter predicts the target well")
        };
        findings.push(Finding {
            check: "acceptance probe",
            outcome,
            detail: format!(
                "{:.0}% of {} greedy drafts accepted, {:.2} tokens per round: {meaning}",
                100.0 * rate,
                probe.drafted,
                probe.mean_acceptance_length
            ),
        });
        Some(probe)
    } else {
        None
    };
    let verdict = findings
        .iter()
        .map(|f| f.outcome)
        .max()
        .unwrap_or(Outcome::Pass);
    for f in &findings {
        println!("{:<5} {:<17} {}", label(f.outcome), f.check, f.detail);
    }
    let record = Record {
        lucebox_version: env!("CARGO_PKG_VERSION"),
        verdict,
        target: target_facts,
        drafter: drafter_facts,
        findings,
        probe,
    };
    let path = match args.record {
        Some(path) => path,
        None => lucebox_appliance::model_dir()?.join("pairs").join(format!(
            "{}+{}.json",
            stem(&target.path),
            stem(&drafter.path)
        )),
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&path, serde_json::to_string_pretty(&record)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    println!("verdict: {} (record: {})", label(verdict), path.display());
    if verdict == Outcome::Fail {
        bail!("{} cannot draft for {}", args.drafter, args.target);
    }
    Ok(())
}

/// Greedy speculation over the probe prompts, with a fixed draft length so that acceptance is
/// measured at every position.
fn run_probe(target: &Loaded, drafter: &Loaded, tokens: usize) -> anyhow::Result<Probe> {
    const DRAFT: usize = 4;
    let config = SessionConfig {
        context: 512,
        ..SessionConfig::default()
    };
    let tokenizer = Tokenizer::from_gguf(target.file.metadata())?;
    let mut speculator = Speculator::new(
        Arc::clone(&target.model),
        config,
        Box::new(ModelDrafter::new(
            Arc::clone(&drafter.model),
            config.context,
        )?),
        DraftPolicy::Fixed(DRAFT),
    )?;
    let mut total = SpecStats::default();
    for text in PROBE_PROMPTS {
        let prompt = prompt_tokens(target, &tokenizer, text, false, None)?;
        let mut sampler = Sampler::new(SamplingParams::default());
        let (_, stats) = speculator.generate(
            &prompt,
            &mut sampler,
            tokens,
            |t| tokenizer.is_end_of_generation(t),
            |_| ControlFlow::Continue(()),
        )?;
        total.add(&stats);
    }
    Ok(Probe {
        prompts: PROBE_PROMPTS.len(),
        tokens_per_prompt: tokens,
        draft_tokens: DRAFT,
        drafted: total.drafted_tokens(),
        accepted: total.accepted_tokens(),
        acceptance_rate: total.acceptance_rate(),
        mean_acceptance_length: total.mean_acceptance_length(),
    })
}

fn label(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Pass => "PASS",
        Outcome::Warn => "WARN",
        Outcome::Fail => "FAIL",
    }
}

fn stem(path: &std::path::Path) -> String {
    path.file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
}
