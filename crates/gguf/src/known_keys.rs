//! Checks on the metadata keys that llama.cpp's conventions give a meaning, so that a file whose
//! values contradict each other is refused when it is opened, not when a value is first used.

use crate::error::Error;
use crate::metadata::Metadata;

/// The most transformer blocks accepted. The deepest published models have a few hundred.
pub const MAX_BLOCK_COUNT: u64 = 4096;

const TOKENS: &str = "tokenizer.ggml.tokens";
const SCORES: &str = "tokenizer.ggml.scores";
const TOKEN_TYPES: &str = "tokenizer.ggml.token_type";

pub(crate) fn validate(metadata: &Metadata) -> Result<(), Error> {
    validate_tokenizer(metadata)?;
    validate_architecture(metadata)
}

fn validate_tokenizer(m: &Metadata) -> Result<(), Error> {
    let Some(_) = m.get(TOKENS) else {
        return Ok(());
    };
    let n_tokens = m.str_array(TOKENS)?.len() as u64;
    check_per_token(m, SCORES, Metadata::f32_array, n_tokens)?;
    check_per_token(m, TOKEN_TYPES, Metadata::i32_array, n_tokens)?;
    m.opt_str("tokenizer.ggml.model")?;
    if m.get("tokenizer.ggml.merges").is_some() {
        m.str_array("tokenizer.ggml.merges")?;
    }
    for (key, value) in m.iter() {
        if !(key.starts_with("tokenizer.ggml.") && key.ends_with("_token_id")) {
            continue;
        }
        let id = value
            .as_u64()
            .ok_or_else(|| m.invalid(key, "token id is not a non-negative integer"))?;
        if id >= n_tokens {
            return Err(m.invalid(
                key,
                format!("token id {id} is not below the vocabulary size {n_tokens}"),
            ));
        }
    }
    Ok(())
}

/// A per-token array, when present, must have its declared element type (llama.cpp once read an
/// i8-declared token_type array as i32, past its end) and one entry per token.
fn check_per_token<'m, T: 'm>(
    m: &'m Metadata,
    key: &str,
    read: impl Fn(&'m Metadata, &str) -> Result<&'m [T], Error>,
    n_tokens: u64,
) -> Result<(), Error> {
    if m.get(key).is_none() {
        return Ok(());
    }
    let len = read(m, key)?.len() as u64;
    if len != n_tokens {
        return Err(m.invalid(key, format!("has {len} entries for {n_tokens} tokens")));
    }
    Ok(())
}

fn validate_architecture(m: &Metadata) -> Result<(), Error> {
    let Some(arch) = m.opt_str("general.architecture")? else {
        return Ok(());
    };
    let key = format!("{arch}.block_count");
    if let Some(blocks) = m.opt_uint(&key)?
        && !(1..=MAX_BLOCK_COUNT).contains(&blocks)
    {
        return Err(m.invalid(&key, format!("{blocks} is not in 1..={MAX_BLOCK_COUNT}")));
    }
    Ok(())
}
