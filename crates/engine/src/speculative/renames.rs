//! Renamed identifiers, as text, for the n-gram drafter.
//!
//! A byte-level BPE spells one identifier as several tokens: `xs` after `(` is the token
//! `(xs`, after a space ` xs`, at a line's start `xs`. An edit that renames `xs` to `items`
//! shows the n-gram drafter one token replaced by another (`(xs` by `(items`), which says
//! nothing about the next ` xs`, so its draft stopped at every other spelling of the old name.
//! [`Renames`] reads the replacement as text instead, a rename of the identifier `xs`, and
//! spells each drafted token that holds the whole identifier with the new name.

use std::fmt;

/// How the target's tokenizer spells tokens, for drafters that also reason about text.
pub trait Spelling: Send + Sync {
    /// The bytes of `token`, if it is one of the vocabulary's.
    fn bytes(&self, token: u32) -> Option<&[u8]>;
    /// The tokens the tokenizer splits `text` into.
    fn encode(&self, text: &str) -> Vec<u32>;
}

impl Spelling for lucebox_tokenizer::Tokenizer {
    fn bytes(&self, token: u32) -> Option<&[u8]> {
        self.token_bytes(token)
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        lucebox_tokenizer::Tokenizer::encode(self, text, false)
    }
}

impl fmt::Debug for dyn Spelling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Spelling")
    }
}

/// Identifier renames, old name to new, the first learned of each old name kept.
#[derive(Clone, Debug, Default)]
pub(crate) struct Renames(Vec<(String, String)>);

impl Renames {
    /// Learns the renames a copy made where it replaced the run spelled `source` by the run
    /// spelled `copy`: both split into the same runs of other characters around identifiers,
    /// each differing identifier is a rename. Anything else (a changed operator, an inserted
    /// argument) teaches nothing.
    pub(crate) fn learn(&mut self, source: &str, copy: &str) {
        let (source, copy) = (runs(source), runs(copy));
        if source.len() != copy.len() {
            return;
        }
        let mut found = Vec::new();
        for ((is_name, old), (same_kind, new)) in source.iter().zip(&copy) {
            if is_name != same_kind || (!is_name && old != new) {
                return;
            }
            if old != new {
                found.push((*old, *new));
            }
        }
        for (old, new) in found {
            if !self.0.iter().any(|(known, _)| known == old) {
                self.0.push((old.to_owned(), new.to_owned()));
            }
        }
    }

    /// Whether nothing was learned.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `text` with each renamed identifier spelled anew, if it holds one. An identifier at the
    /// text's start or end that the token before (`continued_before`) or after
    /// (`continues_after`) carries on is only part of a name, and is left alone.
    pub(crate) fn apply(
        &self,
        text: &str,
        continued_before: bool,
        continues_after: bool,
    ) -> Option<String> {
        self.respelled(text, continued_before, continues_after, |(old, new)| {
            (old, new)
        })
    }

    /// `text`, which ends a sequence, with each new name spelled as the name it replaced, if
    /// it holds one: what the copy's source reads where the copy wrote it.
    pub(crate) fn restore(&self, text: &str, continued_before: bool) -> Option<String> {
        self.respelled(text, continued_before, false, |(old, new)| (new, old))
    }

    /// `text` with each whole identifier that is the first of a rename's (`from`, `to`),
    /// as `direction` orders its old and new names, spelled as the second.
    fn respelled<'a>(
        &'a self,
        text: &str,
        continued_before: bool,
        continues_after: bool,
        direction: impl Fn((&'a str, &'a str)) -> (&'a str, &'a str),
    ) -> Option<String> {
        let runs = runs(text);
        let last = runs.len().checked_sub(1)?;
        let mut respelled = String::with_capacity(text.len());
        let mut changed = false;
        for (i, (is_name, run)) in runs.into_iter().enumerate() {
            let partial = (i == 0 && continued_before) || (i == last && continues_after);
            let to = (is_name && !partial)
                .then(|| {
                    self.0
                        .iter()
                        .map(|(old, new)| direction((old.as_str(), new.as_str())))
                        .find_map(|(from, to)| (from == run).then_some(to))
                })
                .flatten();
            match to {
                Some(to) => {
                    respelled.push_str(to);
                    changed = true;
                }
                None => respelled.push_str(run),
            }
        }
        changed.then_some(respelled)
    }
}

/// Whether `c` may be part of an identifier.
pub(crate) fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `text` cut into runs of identifier characters (`true`) and of others (`false`).
fn runs(text: &str) -> Vec<(bool, &str)> {
    let mut runs = Vec::new();
    let mut start = 0;
    let mut kind = None;
    for (at, c) in text.char_indices() {
        let is_name = is_name_char(c);
        if kind.is_some_and(|k| k != is_name) {
            runs.push((!is_name, &text[start..at]));
            start = at;
        }
        kind = Some(is_name);
    }
    if let Some(is_name) = kind {
        runs.push((is_name, &text[start..]));
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learned(pairs: &[(&str, &str)]) -> Renames {
        let mut renames = Renames::default();
        for (source, copy) in pairs {
            renames.learn(source, copy);
        }
        renames
    }

    #[test]
    fn a_replacement_that_changes_only_identifiers_is_a_rename() {
        let renames = learned(&[("(xs", "(items"), (" calc", " total_price")]);
        assert_eq!(
            renames.apply(" xs", false, false).as_deref(),
            Some(" items")
        );
        assert_eq!(
            renames.apply("xs):", false, false).as_deref(),
            Some("items):")
        );
        assert_eq!(
            renames.apply("calc", false, false).as_deref(),
            Some("total_price")
        );
        assert_eq!(renames.apply(" x", false, false), None);
        // Changed punctuation, or a different shape, teaches nothing.
        let renames = learned(&[("(a", "[b"), ("a, b", "a")]);
        assert!(renames.is_empty());
    }

    #[test]
    fn only_whole_identifiers_are_renamed() {
        let renames = learned(&[("xs", "items")]);
        // Part of a longer name in the token itself, or carried on by a neighbour.
        assert_eq!(renames.apply("xs_total", false, false), None);
        assert_eq!(renames.apply(" xs", false, true), None);
        assert_eq!(renames.apply("xs", true, false), None);
        // The continuation belongs to another run: `xs` ends where `.` begins.
        assert_eq!(
            renames.apply(" xs.", false, true).as_deref(),
            Some(" items.")
        );
    }

    #[test]
    fn a_restored_text_spells_new_names_as_the_old_ones() {
        let renames = learned(&[(" calc", " total_price"), ("(xs", "(items")]);
        assert_eq!(
            renames
                .restore("Total: {total_price(items", false)
                .as_deref(),
            Some("Total: {calc(xs")
        );
        // An end carried on by the token before is part of a longer name.
        assert_eq!(renames.restore("items):", true), None);
        assert_eq!(renames.restore(" calc(xs", false), None);
    }

    #[test]
    fn the_first_rename_of_a_name_is_kept() {
        let renames = learned(&[("x", "item"), ("x", "y")]);
        assert_eq!(renames.apply("x", false, false).as_deref(), Some("item"));
    }

    #[test]
    fn text_splits_into_identifier_and_other_runs() {
        assert_eq!(
            runs("(x_1, y)"),
            [
                (false, "("),
                (true, "x_1"),
                (false, ", "),
                (true, "y"),
                (false, ")")
            ]
        );
        assert!(runs("").is_empty());
    }
}
