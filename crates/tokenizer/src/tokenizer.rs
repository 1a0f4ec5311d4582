//! The tokenizer: built from GGUF metadata, it encodes text to ids and decodes ids to text.

use std::borrow::Cow;

use lucebox_gguf::Metadata;
use unicode_normalization::{UnicodeNormalization, is_nfc};

use crate::bpe::{Bpe, Scratch};
use crate::error::{Error, ErrorKind};
use crate::pretokenize::{PRE_TOKENIZERS, PreTokenizer};
use crate::special::{Segment, SpecialTokens};
use crate::spm::Spm;
use crate::stream::StreamDecoder;
use crate::unicode::byte_to_char;
use crate::vocab::{
    KEY_MERGES, KEY_MODEL, KEY_PRE, SPM_SPACE, SpecialIds, Spelling, TokenKind, Vocab,
    VocabDefaults,
};

/// A tokenizer read from a GGUF file's `tokenizer.ggml.*` metadata.
///
/// Two models are implemented: byte-level BPE (`tokenizer.ggml.model = gpt2`, with the
/// pre-tokenizers of Qwen2, Llama 3, SmolLM/StarCoder and GPT-2) and SentencePiece
/// (`llama`). Encoding matches Hugging Face's tokenizer for the same vocabulary.
#[derive(Debug)]
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    special: SpecialTokens,
    digest: String,
}

#[derive(Debug)]
enum Model {
    Bpe { bpe: Box<Bpe>, pre: PreTokenizer },
    Spm(Box<Spm>),
}

impl Tokenizer {
    /// Reads the tokenizer described by `meta`.
    ///
    /// Fails with [`ErrorKind::Unsupported`] for a model or pre-tokenizer that is not
    /// implemented (naming it), and with [`ErrorKind::Metadata`] for missing or malformed keys.
    pub fn from_gguf(meta: &Metadata) -> Result<Self, Error> {
        let model_name = meta.str(KEY_MODEL)?;
        match model_name {
            "gpt2" => {
                let pre_name = meta.str(KEY_PRE)?;
                let pre = PreTokenizer::from_name(pre_name).ok_or_else(|| {
                    let known: Vec<&str> = PRE_TOKENIZERS.iter().map(|(name, _)| *name).collect();
                    ErrorKind::Unsupported(meta.invalid(
                        KEY_PRE,
                        format!(
                            "unknown pre-tokenizer {pre_name:?} (known: {})",
                            known.join(", ")
                        ),
                    ))
                })?;
                let defaults = VocabDefaults {
                    special: SpecialIds::default(),
                    add_bos: pre == PreTokenizer::Llama3,
                    add_space_prefix: false,
                };
                let vocab = Vocab::read(meta, Spelling::ByteLevel, defaults)?;
                let merges = meta.str_array(KEY_MERGES)?;
                let bpe = Box::new(Bpe::new(meta, &vocab, merges)?);
                let digest = vocab.digest(model_name, Some(pre_name), Some(merges));
                Self::assemble(meta, vocab, Model::Bpe { bpe, pre }, digest)
            }
            "llama" => {
                let defaults = VocabDefaults {
                    special: SpecialIds {
                        bos: Some(1),
                        eos: Some(2),
                        unk: Some(0),
                        ..SpecialIds::default()
                    },
                    add_bos: true,
                    add_space_prefix: true,
                };
                let vocab = Vocab::read(meta, Spelling::SentencePiece, defaults)?;
                let spm = Spm::new(meta, &vocab)?;
                let digest = vocab.digest(model_name, None, None);
                Self::assemble(meta, vocab, Model::Spm(Box::new(spm)), digest)
            }
            other => Err(ErrorKind::Unsupported(meta.invalid(
                KEY_MODEL,
                format!("unknown tokenizer model {other:?} (known: gpt2, llama)"),
            ))
            .into()),
        }
    }

    fn assemble(
        meta: &Metadata,
        vocab: Vocab,
        model: Model,
        digest: String,
    ) -> Result<Self, Error> {
        let special = SpecialTokens::new(meta, &vocab)?;
        Ok(Self {
            vocab,
            model,
            special,
            digest,
        })
    }

    /// The ids of a prompt: [`Self::bos`] first when the file asks for it ([`Self::add_bos`]),
    /// then [`encode`](Self::encode) of `text`. A rendered chat template writes its special
    /// tokens as text, so its prompts are encoded with `parse_special`; raw user text without.
    pub fn encode_prompt(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut ids = Vec::new();
        if self.add_bos()
            && let Some(bos) = self.bos()
        {
            ids.push(bos);
        }
        ids.extend(self.encode(text, parse_special));
        ids
    }

    /// The ids of `text`. Never adds BOS or EOS: the caller adds them when [`Self::add_bos`]
    /// and [`Self::add_eos`] say so.
    ///
    /// With `parse_special`, control tokens written in the text (`<|im_start|>`) become their
    /// ids; without, they are encoded as the characters they are made of. User-defined tokens
    /// are always matched whole, as in Hugging Face and llama.cpp.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut scratch = Scratch::default();
        let mut after_special = true;
        self.special
            .split(text, parse_special, |segment| match segment {
                Segment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Segment::Text("") => {}
                Segment::Text(text) => {
                    self.encode_text(text, after_special, &mut scratch, &mut out);
                    after_special = false;
                }
            });
        out
    }

    fn encode_text(
        &self,
        text: &str,
        after_special: bool,
        scratch: &mut Scratch,
        out: &mut Vec<u32>,
    ) {
        match &self.model {
            Model::Bpe { bpe, pre } => {
                let text: Cow<str> = if pre.normalizes_nfc() && !is_nfc(text) {
                    Cow::Owned(text.nfc().collect())
                } else {
                    Cow::Borrowed(text)
                };
                let mut spelled = String::new();
                pre.split(&text, |piece| {
                    if pre.ignores_merges() {
                        spelled.clear();
                        spelled.extend(piece.bytes().map(byte_to_char));
                        if let Some(&id) = self.vocab.by_text.get(&spelled) {
                            out.push(id);
                            return;
                        }
                    }
                    bpe.encode_piece(piece.as_bytes(), scratch, out);
                });
            }
            Model::Spm(spm) => {
                let prefix = self.vocab.flags.add_space_prefix && after_special;
                let mut escaped = String::with_capacity(text.len() + 3);
                if prefix {
                    escaped.push(SPM_SPACE);
                }
                escaped.extend(text.chars().map(|c| if c == ' ' { SPM_SPACE } else { c }));
                spm.encode(&self.vocab, &escaped, out);
            }
        }
    }

    /// The text of `ids`: their bytes concatenated, with invalid UTF-8 replaced by U+FFFD.
    ///
    /// With `skip_special`, control and unknown tokens render as nothing; unused tokens always
    /// do, and ids outside the vocabulary too. Nothing is stripped: the space that SentencePiece
    /// prefixes to a text decodes as a leading space.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.rendered_bytes(id, skip_special));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The bytes token `id` adds to decoded text under the rules of [`Self::decode`].
    pub(crate) fn rendered_bytes(&self, id: u32, skip_special: bool) -> &[u8] {
        match self.vocab.kind(id) {
            None | Some(TokenKind::Unused) => &[],
            Some(kind) if skip_special && kind.is_special() => &[],
            Some(_) => self.vocab.bytes(id).unwrap_or_default(),
        }
    }

    /// A decoder that takes ids one at a time and returns text only once it is valid UTF-8.
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<&Self> {
        StreamDecoder::new(self, skip_special)
    }

    /// The bytes token `id` stands for: byte-level or `▁` spelling undone, `<0xXX>` as its
    /// byte, control and user-defined tokens as their text.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.vocab.bytes(id)
    }

    /// The text of token `id` as the vocabulary spells it (`Ġhello`, `▁hello`, `<|im_end|>`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of the token the vocabulary spells `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.by_text.get(text).copied()
    }

    /// What token `id` is.
    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.vocab.kind(id)
    }

    /// The number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// The beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.vocab.special.bos
    }

    /// The end-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.vocab.special.eos
    }

    /// Whether a prompt starts with [`Self::bos`] (`tokenizer.ggml.add_bos_token`, defaulting
    /// as llama.cpp does; false when there is no BOS token).
    pub fn add_bos(&self) -> bool {
        self.vocab.flags.add_bos
    }

    /// Whether a prompt ends with [`Self::eos`] (`tokenizer.ggml.add_eos_token`).
    pub fn add_eos(&self) -> bool {
        self.vocab.flags.add_eos
    }

    /// Whether generating `id` ends generation: EOS, end-of-turn and end-of-message ids, and
    /// tokens llama.cpp treats as ending generation by their text (`<|im_end|>`,
    /// `<|endoftext|>`, `<|eot_id|>`, FIM padding and separators, ...).
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.vocab.end_of_generation.binary_search(&id).is_ok()
    }

    /// The ids that end generation, ascending.
    pub fn end_of_generation(&self) -> &[u32] {
        &self.vocab.end_of_generation
    }

    /// A hex SHA-256 of everything that decides how text maps to ids and back (model,
    /// pre-tokenizer, tokens, kinds, scores, merges, special ids, flags). Two files with equal
    /// digests tokenize identically, so a drafter can serve a target with the same digest.
    pub fn digest(&self) -> &str {
        &self.digest
    }
}
