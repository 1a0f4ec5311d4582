//! Whether a drafter model may serve a target model in speculative decoding.
//!
//! The checks judge facts the caller reads from the two files (tokenizer digest, vocabulary and
//! context sizes, and where it hashed them, sha256), so they run without loading either model
//! and are tested on plain values. Speculation is exact with any drafter, but a drafter with a
//! different tokenizer proposes ids that mean other text, so it can never be accepted for the
//! right reason; such a pair is refused rather than served slowly.

use serde::Serialize;

use crate::Catalogue;

/// What the checks need to know about one model file.
#[derive(Clone, Debug, Serialize)]
pub struct ModelFacts {
    /// How the user named it (a path or a catalogue name).
    pub label: String,
    /// The catalogue entry this file claims to be, if any.
    pub catalogue_name: Option<String>,
    /// The hex digest of everything that decides tokenization (the tokenizer crate's
    /// `Tokenizer::digest`).
    pub tokenizer_digest: String,
    /// Rows of the token embedding (the ids the model can take and produce).
    pub vocab: usize,
    /// Positions the model was trained for.
    pub context: usize,
    /// The file's sha256, when the caller hashed it.
    pub sha256: Option<String>,
}

/// How a check came out, from best to worst.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Satisfied.
    Pass,
    /// Satisfied with a limit worth knowing.
    Warn,
    /// Not satisfied: the pair must not be served.
    Fail,
}

/// One check's result.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// The check's name.
    pub check: &'static str,
    /// How it came out.
    pub outcome: Outcome,
    /// Why, in one line.
    pub detail: String,
}

/// Runs every check that needs no model run: tokenizer, vocabulary, context, and the pinned
/// hashes of catalogue models that were hashed.
pub fn check_pair(
    target: &ModelFacts,
    drafter: &ModelFacts,
    catalogue: &Catalogue,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut add = |check, outcome, detail: String| {
        findings.push(Finding {
            check,
            outcome,
            detail,
        })
    };
    if target.tokenizer_digest == drafter.tokenizer_digest {
        add(
            "tokenizer",
            Outcome::Pass,
            format!("identical (digest {})", short(&target.tokenizer_digest)),
        );
    } else {
        add(
            "tokenizer",
            Outcome::Fail,
            format!(
                "the tokenizers differ (digests {} and {}): vocabulary, merges or special ids are not the same",
                short(&target.tokenizer_digest),
                short(&drafter.tokenizer_digest)
            ),
        );
    }
    if drafter.vocab <= target.vocab {
        add(
            "vocabulary",
            Outcome::Pass,
            format!("drafter {} ids, target {}", drafter.vocab, target.vocab),
        );
    } else {
        add(
            "vocabulary",
            Outcome::Fail,
            format!(
                "the drafter produces ids up to {} but the target takes only {}",
                drafter.vocab, target.vocab
            ),
        );
    }
    if drafter.context >= target.context {
        add(
            "context",
            Outcome::Pass,
            format!(
                "drafter {} positions, target {}",
                drafter.context, target.context
            ),
        );
    } else {
        add(
            "context",
            Outcome::Warn,
            format!(
                "the drafter holds {} positions, the target {}: beyond that, decoding is plain",
                drafter.context, target.context
            ),
        );
    }
    for facts in [target, drafter] {
        let (Some(name), Some(sha256)) = (&facts.catalogue_name, &facts.sha256) else {
            continue;
        };
        match catalogue.model(name) {
            Ok(pinned) if pinned.sha256() == sha256 => add(
                "sha256",
                Outcome::Pass,
                format!("{} matches the catalogue's {name}", facts.label),
            ),
            Ok(pinned) => add(
                "sha256",
                Outcome::Fail,
                format!(
                    "{} has sha256 {}, the catalogue pins {name} at {}",
                    facts.label,
                    short(sha256),
                    short(pinned.sha256())
                ),
            ),
            Err(_) => {}
        }
    }
    findings
}

/// The first failure, as the one-line reason to refuse the pair.
pub fn refusal(findings: &[Finding]) -> Option<String> {
    findings
        .iter()
        .find(|f| f.outcome == Outcome::Fail)
        .map(|f| format!("{}: {}", f.check, f.detail))
}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(digest: &str, vocab: usize, context: usize) -> ModelFacts {
        ModelFacts {
            label: "m".into(),
            catalogue_name: None,
            tokenizer_digest: digest.into(),
            vocab,
            context,
            sha256: None,
        }
    }

    fn outcome(findings: &[Finding], check: &str) -> Outcome {
        findings.iter().find(|f| f.check == check).unwrap().outcome
    }

    #[test]
    fn a_matching_pair_passes() {
        let catalogue = Catalogue::embedded().unwrap();
        let f = check_pair(&facts("ab", 100, 4096), &facts("ab", 100, 8192), &catalogue);
        assert!(f.iter().all(|f| f.outcome == Outcome::Pass), "{f:?}");
        assert_eq!(refusal(&f), None);
    }

    #[test]
    fn different_tokenizers_or_a_larger_drafter_vocabulary_fail() {
        let catalogue = Catalogue::embedded().unwrap();
        let f = check_pair(&facts("ab", 100, 4096), &facts("cd", 100, 4096), &catalogue);
        assert_eq!(outcome(&f, "tokenizer"), Outcome::Fail);
        assert!(refusal(&f).unwrap().starts_with("tokenizer: "));
        let f = check_pair(&facts("ab", 100, 4096), &facts("ab", 101, 4096), &catalogue);
        assert_eq!(outcome(&f, "vocabulary"), Outcome::Fail);
    }

    #[test]
    fn a_shorter_drafter_context_only_warns() {
        let catalogue = Catalogue::embedded().unwrap();
        let f = check_pair(&facts("ab", 100, 4096), &facts("ab", 100, 2048), &catalogue);
        assert_eq!(outcome(&f, "context"), Outcome::Warn);
        assert_eq!(refusal(&f), None);
    }

    #[test]
    fn hashes_are_checked_against_the_catalogue() {
        let catalogue = Catalogue::embedded().unwrap();
        let pinned = &catalogue.models()[0];
        let mut target = facts("ab", 100, 4096);
        target.catalogue_name = Some(pinned.name().to_owned());
        target.sha256 = Some(pinned.sha256().to_owned());
        let mut drafter = target.clone();
        drafter.sha256 = Some("0".repeat(64));
        let f = check_pair(&target, &drafter, &catalogue);
        let sha: Vec<_> = f.iter().filter(|f| f.check == "sha256").collect();
        assert_eq!(sha.len(), 2);
        assert_eq!(sha[0].outcome, Outcome::Pass);
        assert_eq!(sha[1].outcome, Outcome::Fail);
    }
}
