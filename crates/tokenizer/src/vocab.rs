//! The vocabulary read from `tokenizer.ggml.*`: token texts and kinds, the special ids, the bytes
//! each token stands for, the end-of-generation set, and the digest.

use std::collections::HashMap;

use lucebox_gguf::Metadata;
use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::unicode::char_to_byte;

pub(crate) const KEY_MODEL: &str = "tokenizer.ggml.model";
pub(crate) const KEY_PRE: &str = "tokenizer.ggml.pre";
pub(crate) const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub(crate) const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
pub(crate) const KEY_SCORES: &str = "tokenizer.ggml.scores";
pub(crate) const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

/// SentencePiece's visible space, which stands for U+0020 in its token texts.
pub(crate) const SPM_SPACE: char = '\u{2581}';

/// Texts of special tokens that end generation wherever they are in a vocabulary: the list
/// llama.cpp keeps (FIM padding, repository and file-separator markers included), since GGUF
/// files name only one end-of-sequence id.
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "[e~[",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
];

/// What a vocabulary entry is, from `tokenizer.ggml.token_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TokenKind {
    /// Ordinary text (type 1, and 0 "undefined").
    Normal,
    /// The unknown token (type 2).
    Unknown,
    /// A control token such as `<|im_start|>` (type 3): rendered as nothing unless asked, and
    /// matched in input text only when special tokens are parsed.
    Control,
    /// A token added by the model's authors (type 4): always matched in input text as a whole,
    /// and rendered as its text.
    UserDefined,
    /// A placeholder the model never uses (type 5): rendered as nothing.
    Unused,
    /// A byte-fallback token `<0xXX>` (type 6): stands for that byte.
    Byte,
}

impl TokenKind {
    fn from_type(value: i32) -> Option<Self> {
        Some(match value {
            0 | 1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => return None,
        })
    }

    fn digest_code(self) -> u8 {
        match self {
            Self::Normal => 1,
            Self::Unknown => 2,
            Self::Control => 3,
            Self::UserDefined => 4,
            Self::Unused => 5,
            Self::Byte => 6,
        }
    }

    /// Whether the token is markup rather than text: rendered only when special tokens are.
    pub(crate) fn is_special(self) -> bool {
        matches!(self, Self::Control | Self::Unknown)
    }
}

/// How token texts spell bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spelling {
    /// GPT-2's byte-to-character mapping.
    ByteLevel,
    /// UTF-8 text with `▁` for spaces.
    SentencePiece,
}

/// The special token ids, from `tokenizer.ggml.<name>_token_id`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SpecialIds {
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
    pub(crate) unk: Option<u32>,
    pub(crate) eot: Option<u32>,
    pub(crate) eom: Option<u32>,
    pub(crate) pad: Option<u32>,
    pub(crate) sep: Option<u32>,
    pub(crate) fim_pad: Option<u32>,
    pub(crate) fim_rep: Option<u32>,
    pub(crate) fim_sep: Option<u32>,
}

impl SpecialIds {
    /// Reads the ids; `defaults` supplies those a file may leave out (SentencePiece's
    /// conventional 1, 2 and 0). An id outside the vocabulary counts as absent, as llama.cpp
    /// has it: some files name a padding id one past the end.
    fn read(meta: &Metadata, vocab_size: usize, defaults: SpecialIds) -> Result<Self, Error> {
        let read = |name: &str, default: Option<u32>| -> Result<Option<u32>, Error> {
            let key = format!("tokenizer.ggml.{name}_token_id");
            let id = match meta.opt_uint(&key)? {
                Some(id) => u32::try_from(id).ok(),
                None => default,
            };
            Ok(id.filter(|&id| (id as usize) < vocab_size))
        };
        Ok(Self {
            bos: read("bos", defaults.bos)?,
            eos: read("eos", defaults.eos)?,
            unk: read("unknown", defaults.unk)?,
            eot: read("eot", None)?,
            eom: read("eom", None)?,
            pad: read("padding", None)?,
            // llama.cpp's key has this spelling.
            sep: read("seperator", None)?,
            fim_pad: read("fim_pad", None)?,
            fim_rep: read("fim_rep", None)?,
            fim_sep: read("fim_sep", None)?,
        })
    }

    fn in_digest_order(&self) -> [Option<u32>; 10] {
        [
            self.bos,
            self.eos,
            self.unk,
            self.eot,
            self.eom,
            self.pad,
            self.sep,
            self.fim_pad,
            self.fim_rep,
            self.fim_sep,
        ]
    }
}

/// Flags that change how text is encoded.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Flags {
    pub(crate) add_bos: bool,
    pub(crate) add_eos: bool,
    pub(crate) add_space_prefix: bool,
}

/// A vocabulary, read once and immutable.
#[derive(Debug)]
pub(crate) struct Vocab {
    pub(crate) tokens: Vec<String>,
    pub(crate) kinds: Vec<TokenKind>,
    pub(crate) scores: Option<Vec<f32>>,
    /// Token text to id; for a text present twice, the later id, as in llama.cpp and Hugging Face.
    pub(crate) by_text: HashMap<String, u32>,
    pub(crate) special: SpecialIds,
    pub(crate) flags: Flags,
    /// The bytes each token stands for, concatenated; token `i` is `bytes[ends[i-1]..ends[i]]`.
    bytes: Vec<u8>,
    ends: Vec<usize>,
    /// Ids that end generation, sorted.
    pub(crate) end_of_generation: Vec<u32>,
}

/// What a vocabulary's defaults depend on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct VocabDefaults {
    pub(crate) special: SpecialIds,
    pub(crate) add_bos: bool,
    pub(crate) add_space_prefix: bool,
}

impl Vocab {
    pub(crate) fn read(
        meta: &Metadata,
        spelling: Spelling,
        defaults: VocabDefaults,
    ) -> Result<Self, Error> {
        let tokens = meta.str_array(KEY_TOKENS)?.to_vec();
        if tokens.is_empty() {
            return Err(meta.invalid(KEY_TOKENS, "the vocabulary is empty").into());
        }
        if u32::try_from(tokens.len()).is_err() {
            return Err(meta
                .invalid(KEY_TOKENS, "more tokens than 32-bit ids can number")
                .into());
        }
        let kinds = read_kinds(meta, tokens.len())?;
        let scores = match meta.get(KEY_SCORES) {
            None => None,
            Some(_) => {
                let scores = meta.f32_array(KEY_SCORES)?;
                check_len(meta, KEY_SCORES, scores.len(), tokens.len())?;
                Some(scores.to_vec())
            }
        };
        let by_text = tokens
            .iter()
            .enumerate()
            .map(|(id, text)| (text.clone(), id as u32))
            .collect();
        let special = SpecialIds::read(meta, tokens.len(), defaults.special)?;
        let flags = Flags {
            add_bos: meta.opt_bool(KEY_ADD_BOS)?.unwrap_or(defaults.add_bos)
                && special.bos.is_some(),
            add_eos: meta.opt_bool(KEY_ADD_EOS)?.unwrap_or(false) && special.eos.is_some(),
            add_space_prefix: meta
                .opt_bool(KEY_ADD_SPACE_PREFIX)?
                .unwrap_or(defaults.add_space_prefix),
        };
        let mut vocab = Self {
            tokens,
            kinds,
            scores,
            by_text,
            special,
            flags,
            bytes: Vec::new(),
            ends: Vec::new(),
            end_of_generation: Vec::new(),
        };
        vocab.spell_bytes(meta, spelling)?;
        vocab.end_of_generation = vocab.find_end_of_generation();
        Ok(vocab)
    }

    pub(crate) fn len(&self) -> usize {
        self.tokens.len()
    }

    pub(crate) fn kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// The bytes token `id` stands for.
    pub(crate) fn bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.bytes[start..end])
    }

    fn spell_bytes(&mut self, meta: &Metadata, spelling: Spelling) -> Result<(), Error> {
        self.ends.reserve_exact(self.tokens.len());
        for (id, (text, kind)) in self.tokens.iter().zip(&self.kinds).enumerate() {
            match kind {
                TokenKind::Normal => match spelling {
                    Spelling::ByteLevel => {
                        // A character outside the mapping stands for its own UTF-8 bytes.
                        for c in text.chars() {
                            match char_to_byte(c) {
                                Some(b) => self.bytes.push(b),
                                None => push_char(&mut self.bytes, c),
                            }
                        }
                    }
                    Spelling::SentencePiece => {
                        for c in text.chars() {
                            push_char(&mut self.bytes, if c == SPM_SPACE { ' ' } else { c });
                        }
                    }
                },
                TokenKind::Byte => {
                    let byte = parse_byte_token(text).ok_or_else(|| {
                        meta.invalid(
                            KEY_TOKENS,
                            format!("byte token {id} is {text:?}, not <0xXX>"),
                        )
                    })?;
                    self.bytes.push(byte);
                }
                _ => self.bytes.extend_from_slice(text.as_bytes()),
            }
            self.ends.push(self.bytes.len());
        }
        Ok(())
    }

    fn find_end_of_generation(&self) -> Vec<u32> {
        let s = &self.special;
        let mut ids: Vec<u32> = [s.eos, s.eot, s.eom, s.fim_pad, s.fim_rep, s.fim_sep]
            .into_iter()
            .flatten()
            .chain(
                END_OF_GENERATION_TEXTS
                    .iter()
                    .filter_map(|text| self.by_text.get(*text).copied())
                    // Unlike llama.cpp, ordinary text never ends generation: Qwen2's vocabulary
                    // has `</s>` as a normal token (HTML's strike-through closing tag).
                    .filter(|&id| self.kinds[id as usize] != TokenKind::Normal),
            )
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// A SHA-256 over everything that decides how text maps to ids and back: the model and
    /// pre-tokenizer names, tokens, kinds, scores, merges, special ids and flags.
    pub(crate) fn digest(
        &self,
        model: &str,
        pre: Option<&str>,
        merges: Option<&[String]>,
    ) -> String {
        let mut hash = Sha256::new();
        let mut put = |bytes: &[u8]| {
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(bytes);
        };
        put(b"lucebox-tokenizer vocabulary digest v1");
        put(model.as_bytes());
        put(pre.unwrap_or("").as_bytes());
        put(&(self.tokens.len() as u64).to_le_bytes());
        for token in &self.tokens {
            put(token.as_bytes());
        }
        let kinds: Vec<u8> = self.kinds.iter().map(|k| k.digest_code()).collect();
        put(&kinds);
        let scores: Vec<u8> = self
            .scores
            .iter()
            .flatten()
            .flat_map(|s| s.to_bits().to_le_bytes())
            .collect();
        put(&scores);
        let merges = merges.unwrap_or_default();
        put(&(merges.len() as u64).to_le_bytes());
        for merge in merges {
            put(merge.as_bytes());
        }
        for id in self.special.in_digest_order() {
            put(&id.unwrap_or(u32::MAX).to_le_bytes());
        }
        let flags = self.flags;
        put(&[
            u8::from(flags.add_bos),
            u8::from(flags.add_eos),
            u8::from(flags.add_space_prefix),
        ]);
        hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

fn push_char(bytes: &mut Vec<u8>, c: char) {
    let mut buf = [0u8; 4];
    bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
}

/// The byte of a byte-fallback token text `<0xXX>`.
pub(crate) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

fn read_kinds(meta: &Metadata, len: usize) -> Result<Vec<TokenKind>, Error> {
    if meta.get(KEY_TOKEN_TYPE).is_none() {
        return Ok(vec![TokenKind::Normal; len]);
    }
    let types = meta.i32_array(KEY_TOKEN_TYPE)?;
    check_len(meta, KEY_TOKEN_TYPE, types.len(), len)?;
    types
        .iter()
        .enumerate()
        .map(|(id, &t)| {
            TokenKind::from_type(t).ok_or_else(|| {
                meta.invalid(KEY_TOKEN_TYPE, format!("token {id} has unknown type {t}"))
                    .into()
            })
        })
        .collect()
}

fn check_len(meta: &Metadata, key: &str, found: usize, tokens: usize) -> Result<(), Error> {
    if found == tokens {
        Ok(())
    } else {
        Err(meta
            .invalid(key, format!("has {found} entries for {tokens} tokens"))
            .into())
    }
}
