//! The TOML files the binary reads (`serve --config`, `bench --prompt-file`), whose errors
//! must fit the one line a CLI error gets.

use serde::de::DeserializeOwned;

/// `text` read as a `T`; an error starts with `origin` (the flag and file it came from).
pub(crate) fn parse<T: DeserializeOwned>(text: &str, origin: &str) -> anyhow::Result<T> {
    toml::from_str(text).map_err(|e| anyhow::anyhow!("{origin}: {}", one_line(&e, text)))
}

/// A TOML error as one line: where, then what (whose own lines are joined).
fn one_line(error: &toml::de::Error, text: &str) -> String {
    let what = error
        .message()
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(", ");
    let Some(span) = error.span() else {
        return what;
    };
    let before = &text[..span.start.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |at| at + 1) + 1;
    format!("line {line}, column {column}: {what}")
}
