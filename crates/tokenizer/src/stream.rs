//! Incremental detokenization that never splits a UTF-8 sequence.

use std::ops::Deref;

use crate::tokenizer::Tokenizer;

/// Turns ids into text one id at a time.
///
/// A token may end in the middle of a multi-byte character (byte-level BPE splits emoji and CJK
/// characters across tokens); the decoder holds such bytes until the character is complete. A
/// sequence that can no longer complete becomes U+FFFD, exactly where
/// [`String::from_utf8_lossy`] over all the bytes would put one, so the concatenated output
/// always equals [`Tokenizer::decode`] of all the ids.
///
/// `T` is anything that derefs to the tokenizer: `&Tokenizer`, or `Arc<Tokenizer>` for a
/// decoder that must own its share.
#[derive(Debug)]
pub struct StreamDecoder<T> {
    tokenizer: T,
    skip_special: bool,
    pending: Vec<u8>,
}

impl<T: Deref<Target = Tokenizer>> StreamDecoder<T> {
    /// A decoder; `skip_special` as in [`Tokenizer::decode`].
    pub fn new(tokenizer: T, skip_special: bool) -> Self {
        Self {
            tokenizer,
            skip_special,
            pending: Vec::new(),
        }
    }

    /// Adds token `id`; returns the text that became complete, if any.
    pub fn push(&mut self, id: u32) -> Option<String> {
        let bytes = self.tokenizer.rendered_bytes(id, self.skip_special);
        self.pending.extend_from_slice(bytes);
        let mut text = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(valid) => {
                    text.push_str(valid);
                    self.pending.clear();
                    break;
                }
                Err(error) => {
                    let valid = error.valid_up_to();
                    text.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match error.error_len() {
                        Some(invalid) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + invalid);
                        }
                        // An incomplete sequence at the end: wait for the next token.
                        None => {
                            self.pending.drain(..valid);
                            break;
                        }
                    }
                }
            }
        }
        (!text.is_empty()).then_some(text)
    }

    /// Ends the stream: an incomplete sequence still held becomes U+FFFD.
    pub fn finish(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        self.pending.clear();
        Some(char::REPLACEMENT_CHARACTER.to_string())
    }
}
