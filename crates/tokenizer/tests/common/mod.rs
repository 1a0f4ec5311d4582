//! Small GGUF vocabularies written with `GgufWriter`, for tests that need no model.

use lucebox_gguf::{Array, GgufFile, GgufWriter, Value};

pub const NORMAL: i32 = 1;
pub const UNKNOWN: i32 = 2;
pub const CONTROL: i32 = 3;
pub const USER_DEFINED: i32 = 4;
pub const BYTE: i32 = 6;

/// GPT-2's byte-to-character mapping, written out independently of the crate's.
pub fn spell(bytes: &[u8]) -> String {
    let printable = |b: u8| matches!(b, 33..=126 | 161..=172 | 174..=255);
    bytes
        .iter()
        .map(|&b| {
            if printable(b) {
                char::from(b)
            } else {
                let moved = (0..b).filter(|&x| !printable(x)).count() as u32;
                char::from_u32(256 + moved).expect("below U+0200")
            }
        })
        .collect()
}

/// A byte-level BPE vocabulary: the special tokens, every byte, then one token per merge.
pub struct ByteLevelVocab {
    pub pre: &'static str,
    pub specials: Vec<(&'static str, i32)>,
    /// Merges as (left bytes, right bytes); each adds the token of their concatenation.
    pub merges: Vec<(&'static [u8], &'static [u8])>,
}

impl ByteLevelVocab {
    pub fn tokens(&self) -> (Vec<String>, Vec<i32>) {
        let mut tokens: Vec<String> = self.specials.iter().map(|(t, _)| t.to_string()).collect();
        let mut types: Vec<i32> = self.specials.iter().map(|&(_, k)| k).collect();
        for b in 0..=255u8 {
            tokens.push(spell(&[b]));
            types.push(NORMAL);
        }
        for (left, right) in &self.merges {
            tokens.push(spell(&[*left, *right].concat()));
            types.push(NORMAL);
        }
        (tokens, types)
    }

    pub fn writer(&self) -> GgufWriter {
        let (tokens, types) = self.tokens();
        let merges = self
            .merges
            .iter()
            .map(|(l, r)| format!("{} {}", spell(l), spell(r)))
            .collect();
        let mut writer = GgufWriter::new();
        writer
            .metadata("general.architecture", Value::String("test".into()))
            .metadata("tokenizer.ggml.model", Value::String("gpt2".into()))
            .metadata("tokenizer.ggml.pre", Value::String(self.pre.into()))
            .metadata("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
            .metadata("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))
            .metadata("tokenizer.ggml.merges", Value::Array(Array::String(merges)))
            .metadata("tokenizer.ggml.eos_token_id", Value::U32(0));
        writer
    }

    pub fn file(&self) -> GgufFile {
        open(&self.writer())
    }
}

pub fn open(writer: &GgufWriter) -> GgufFile {
    GgufFile::from_bytes(writer.to_bytes()).expect("a well-formed file")
}

/// A vocabulary whose merges build `hello`, `é` and the first three bytes of `🦙`, so that ids
/// can end in the middle of a character; `<|end|>` is a control token and `<tool>` user-defined.
pub fn byte_level() -> ByteLevelVocab {
    ByteLevelVocab {
        pre: "qwen2",
        specials: vec![("<|end|>", CONTROL), ("<tool>", USER_DEFINED)],
        merges: vec![
            (b"h", b"e"),
            (b"l", b"l"),
            (b"he", b"ll"),
            (b"hell", b"o"),
            (b" ", b"hello"),
            (b"\xc3", b"\xa9"),
            (b"\xf0", b"\x9f"),
            (b"\xf0\x9f", b"\xa6"),
        ],
    }
}

/// A SentencePiece vocabulary: `<unk> <s> </s>`, the 256 byte tokens, then scored pieces.
pub fn sentencepiece(pieces: &[(&str, f32)]) -> GgufWriter {
    let mut tokens = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
    let mut types = vec![UNKNOWN, CONTROL, CONTROL];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(BYTE);
        scores.push(0.0);
    }
    for &(piece, score) in pieces {
        tokens.push(piece.to_string());
        types.push(NORMAL);
        scores.push(score);
    }
    let mut writer = GgufWriter::new();
    writer
        .metadata("general.architecture", Value::String("test".into()))
        .metadata("tokenizer.ggml.model", Value::String("llama".into()))
        .metadata("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .metadata("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))
        .metadata("tokenizer.ggml.scores", Value::Array(Array::F32(scores)));
    writer
}
