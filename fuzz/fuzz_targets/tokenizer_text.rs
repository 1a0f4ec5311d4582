//! Encodes arbitrary text with small vocabularies of every implemented kind and decodes arbitrary
//! ids: nothing may panic, byte-level BPE must give back the text it encoded (in NFC where the
//! pre-tokenizer normalizes), and streaming must give what whole decoding gives.
//!
//! Input: byte 0 picks the vocabulary and whether special tokens are parsed; the rest is the
//! text (lossily UTF-8), and also, read as little-endian u16 pairs, ids to decode.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use lucebox_gguf::{Array, GgufFile, GgufWriter, Value};
use lucebox_tokenizer::Tokenizer;
use unicode_normalization::UnicodeNormalization;

const PRE_TOKENIZERS: [&str; 4] = ["qwen2", "llama-bpe", "smollm", "gpt-2"];

/// GPT-2's byte-to-character mapping.
fn spell(bytes: &[u8]) -> String {
    let printable = |b: u8| matches!(b, 33..=126 | 161..=172 | 174..=255);
    bytes
        .iter()
        .map(|&b| {
            if printable(b) {
                char::from(b)
            } else {
                let moved = (0..b).filter(|&x| !printable(x)).count() as u32;
                char::from_u32(256 + moved).unwrap_or('?')
            }
        })
        .collect()
}

fn byte_level(pre: &str) -> Tokenizer {
    let merges: [(&[u8], &[u8]); 7] = [
        (b" ", b"t"),
        (b"h", b"e"),
        (b" t", b"he"),
        (b"\xc3", b"\xa9"),
        (b"\xf0", b"\x9f"),
        (b"1", b"2"),
        (b"\n", b"\n"),
    ];
    let mut tokens = vec!["<|im_start|>".to_string(), "<tool>".to_string()];
    let mut types = vec![3, 4];
    for b in 0..=255u8 {
        tokens.push(spell(&[b]));
        types.push(1);
    }
    for (l, r) in merges {
        tokens.push(spell(&[l, r].concat()));
        types.push(1);
    }
    let merges = merges
        .iter()
        .map(|(l, r)| format!("{} {}", spell(l), spell(r)))
        .collect();
    let mut w = GgufWriter::new();
    w.metadata("tokenizer.ggml.model", Value::String("gpt2".into()))
        .metadata("tokenizer.ggml.pre", Value::String(pre.into()))
        .metadata("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .metadata("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))
        .metadata("tokenizer.ggml.merges", Value::Array(Array::String(merges)));
    build(&w)
}

fn sentencepiece() -> Tokenizer {
    let mut tokens = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0f32; 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (piece, score) in [
        ("▁", -1.0),
        ("▁t", -2.0),
        ("he", -3.0),
        ("▁the", -0.5),
        ("é", -4.0),
    ] {
        tokens.push(piece.to_string());
        types.push(1);
        scores.push(score);
    }
    let mut w = GgufWriter::new();
    w.metadata("tokenizer.ggml.model", Value::String("llama".into()))
        .metadata("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .metadata("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))
        .metadata("tokenizer.ggml.scores", Value::Array(Array::F32(scores)));
    build(&w)
}

fn build(writer: &GgufWriter) -> Tokenizer {
    let file = GgufFile::from_bytes(writer.to_bytes()).expect("fixture vocabulary parses");
    Tokenizer::from_gguf(file.metadata()).expect("fixture vocabulary builds")
}

fn tokenizers() -> &'static [Tokenizer] {
    static ALL: OnceLock<Vec<Tokenizer>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut all: Vec<Tokenizer> = PRE_TOKENIZERS.iter().map(|pre| byte_level(pre)).collect();
        all.push(sentencepiece());
        all
    })
}

/// What byte-level BPE gives back for `text`: special tokens are split off the raw text first (the
/// user-defined `<tool>` always, the control `<|im_start|>` when parsing special tokens), and only
/// the text between them is normalized, as Hugging Face does for added tokens that are not
/// normalized.
fn round_trip(text: &str, parse_special: bool, nfc: bool) -> String {
    let specials: &[&str] = if parse_special {
        &["<|im_start|>", "<tool>"]
    } else {
        &["<tool>"]
    };
    let mut out = String::new();
    let mut plain = String::new();
    let flush = |plain: &mut String, out: &mut String| {
        if nfc {
            out.extend(plain.nfc());
        } else {
            out.push_str(plain);
        }
        plain.clear();
    };
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if let Some(special) = specials.iter().find(|s| rest.starts_with(**s)) {
            flush(&mut plain, &mut out);
            out.push_str(special);
            rest = &rest[special.len()..];
        } else {
            plain.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    flush(&mut plain, &mut out);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let all = tokenizers();
    let which = selector as usize % all.len();
    let tokenizer = &all[which];
    let parse_special = selector & 0x80 != 0;
    let text = String::from_utf8_lossy(rest);

    let ids = tokenizer.encode(&text, parse_special);
    assert!(ids.iter().all(|&id| (id as usize) < tokenizer.vocab_size()));
    if which < PRE_TOKENIZERS.len() {
        let expected = round_trip(&text, parse_special, PRE_TOKENIZERS[which] == "qwen2");
        assert_eq!(tokenizer.decode(&ids, false), expected);
    }

    let arbitrary: Vec<u32> = rest
        .chunks_exact(2)
        .map(|pair| u32::from(u16::from_le_bytes([pair[0], pair[1]])))
        .collect();
    for skip_special in [false, true] {
        let mut stream = tokenizer.stream_decoder(skip_special);
        let mut streamed = String::new();
        for &id in &arbitrary {
            streamed.extend(stream.push(id));
        }
        streamed.extend(stream.finish());
        assert_eq!(streamed, tokenizer.decode(&arbitrary, skip_special));
    }
});
