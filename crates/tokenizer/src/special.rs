//! Finding special and user-defined tokens in input text, before pre-tokenization, the way
//! Hugging Face's added vocabulary does: leftmost-longest matches of the whole token text.

use aho_corasick::{AhoCorasick, MatchKind};
use lucebox_gguf::Metadata;

use crate::error::Error;
use crate::vocab::{KEY_TOKENS, TokenKind, Vocab};

/// A part of the input: text to encode, or a token found whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Segment<'a> {
    Text(&'a str),
    Token(u32),
}

#[derive(Debug)]
pub(crate) struct SpecialTokens {
    /// Control, unknown and user-defined tokens: used when special tokens are parsed.
    parsed: Matcher,
    /// User-defined tokens alone: always matched, as Hugging Face does for added tokens that
    /// are not special and llama.cpp does for user-defined ones.
    literal: Matcher,
}

#[derive(Debug)]
struct Matcher {
    automaton: Option<AhoCorasick>,
    ids: Vec<u32>,
}

impl Matcher {
    fn new(
        meta: &Metadata,
        vocab: &Vocab,
        include: impl Fn(TokenKind) -> bool,
    ) -> Result<Self, Error> {
        let ids: Vec<u32> = vocab
            .tokens
            .iter()
            .enumerate()
            .filter(|&(id, text)| {
                // The id a text maps back to, so that a text listed twice is matched once.
                include(vocab.kinds[id])
                    && !text.is_empty()
                    && vocab.by_text.get(text) == Some(&(id as u32))
            })
            .map(|(id, _)| id as u32)
            .collect();
        if ids.is_empty() {
            return Ok(Self {
                automaton: None,
                ids,
            });
        }
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(ids.iter().map(|&id| vocab.tokens[id as usize].as_str()))
            .map_err(|e| {
                meta.invalid(KEY_TOKENS, format!("special tokens cannot be indexed: {e}"))
            })?;
        Ok(Self {
            automaton: Some(automaton),
            ids,
        })
    }
}

impl SpecialTokens {
    pub(crate) fn new(meta: &Metadata, vocab: &Vocab) -> Result<Self, Error> {
        Ok(Self {
            parsed: Matcher::new(meta, vocab, |kind| {
                kind.is_special() || kind == TokenKind::UserDefined
            })?,
            literal: Matcher::new(meta, vocab, |kind| kind == TokenKind::UserDefined)?,
        })
    }

    /// Calls `each` with the segments of `text`, in order.
    pub(crate) fn split<'a>(
        &self,
        text: &'a str,
        parse_special: bool,
        mut each: impl FnMut(Segment<'a>),
    ) {
        let matcher = if parse_special {
            &self.parsed
        } else {
            &self.literal
        };
        let Some(automaton) = &matcher.automaton else {
            each(Segment::Text(text));
            return;
        };
        let mut rest = 0;
        for found in automaton.find_iter(text) {
            if found.start() > rest {
                each(Segment::Text(&text[rest..found.start()]));
            }
            each(Segment::Token(matcher.ids[found.pattern().as_usize()]));
            rest = found.end();
        }
        if rest < text.len() {
            each(Segment::Text(&text[rest..]));
        }
    }
}
