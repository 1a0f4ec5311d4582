//! Encoding, decoding and error reporting on small vocabularies written for the test.

mod common;

use common::{ByteLevelVocab, CONTROL, byte_level, open, sentencepiece, spell};
use lucebox_gguf::{Array, Value};
use lucebox_tokenizer::{ErrorKind, TokenKind, Tokenizer};
use proptest::prelude::*;

fn tokenizer(vocab: &ByteLevelVocab) -> Tokenizer {
    Tokenizer::from_gguf(vocab.file().metadata()).expect("tokenizer builds")
}

fn id(t: &Tokenizer, bytes: &[u8]) -> u32 {
    t.token_id(&spell(bytes)).expect("token exists")
}

#[test]
fn byte_level_bpe_merges_by_rank() {
    let t = tokenizer(&byte_level());
    assert_eq!(t.encode("hello", false), [id(&t, b"hello")]);
    assert_eq!(t.encode(" hello", false), [id(&t, b" hello")]);
    assert_eq!(
        t.encode("help", false),
        [id(&t, b"he"), id(&t, b"l"), id(&t, b"p")]
    );
    assert_eq!(t.encode("é", false), [id(&t, "é".as_bytes())]);
    assert_eq!(
        t.encode("🦙", false),
        [id(&t, b"\xf0\x9f\xa6"), id(&t, b"\x99")]
    );
    assert_eq!(t.encode("", true), Vec::<u32>::new());
    // The qwen2 pre-tokenizer keeps " hello" together but splits digits.
    assert_eq!(
        t.encode(" hello12", false),
        [id(&t, b" hello"), id(&t, b"1"), id(&t, b"2")]
    );
}

#[test]
fn special_tokens_are_matched_whole() {
    let t = tokenizer(&byte_level());
    let end = t.token_id("<|end|>").expect("control token");
    let tool = t.token_id("<tool>").expect("user-defined token");
    assert_eq!(t.token_kind(end), Some(TokenKind::Control));
    assert_eq!(t.token_kind(tool), Some(TokenKind::UserDefined));
    assert_eq!(t.encode("hello<|end|>", true), [id(&t, b"hello"), end]);
    let plain = t.encode("hello<|end|>", false);
    assert!(!plain.contains(&end));
    assert_eq!(t.decode(&plain, false), "hello<|end|>");
    // User-defined tokens are matched whether or not special tokens are parsed.
    assert_eq!(t.encode("<tool>hello", false), [tool, id(&t, b"hello")]);
    assert_eq!(t.encode("<tool>hello", true), [tool, id(&t, b"hello")]);
}

/// Special tokens are split off the raw text before the qwen2 pre-tokenizer's NFC normalization,
/// as Hugging Face does for added tokens that are not normalized: a combining mark after `<tool>`
/// stays a mark and is not composed with the token's `>` into `≯` (found by the tokenizer_text
/// fuzz target, whose expectation had normalized the whole text).
#[test]
fn special_tokens_are_split_off_before_normalization() {
    let t = tokenizer(&byte_level());
    let tool = t.token_id("<tool>").expect("user-defined token");
    let ids = t.encode("<tool>\u{338}", false);
    assert_eq!(ids[0], tool);
    assert_eq!(t.decode(&ids, false), "<tool>\u{338}");
    // Without the token in front, the same characters compose.
    assert_eq!(t.decode(&t.encode("a>\u{338}", false), false), "a\u{226f}");
}

#[test]
fn decoding_renders_control_tokens_only_when_asked() {
    let t = tokenizer(&byte_level());
    let ids = t.encode("<tool>hello<|end|>", true);
    assert_eq!(t.decode(&ids, false), "<tool>hello<|end|>");
    assert_eq!(t.decode(&ids, true), "<tool>hello");
    assert_eq!(t.decode(&[u32::MAX], false), "");
    assert_eq!(t.token_bytes(id(&t, b" hello")), Some(&b" hello"[..]));
    assert_eq!(t.token_text(id(&t, b" hello")), Some("Ġhello"));
    // Half a character decodes to U+FFFD.
    assert_eq!(t.decode(&[id(&t, b"\xf0\x9f\xa6")], false), "\u{fffd}");
    assert!(t.is_end_of_generation(t.eos().expect("eos is set")));
}

#[test]
fn sentencepiece_merges_by_score_with_byte_fallback() {
    let pieces = [
        ("▁", -1.0),
        ("a", -2.0),
        ("b", -2.0),
        ("ab", -1.5),
        ("▁ab", -0.5),
        ("▁a", -3.0),
    ];
    let file = open(&sentencepiece(&pieces));
    let t = Tokenizer::from_gguf(file.metadata()).expect("tokenizer builds");
    let piece = |text: &str| t.token_id(text).expect("piece exists");
    assert_eq!(t.encode("ab", false), [piece("▁ab")]);
    assert_eq!(t.encode("ab ab", false), [piece("▁ab"), piece("▁ab")]);
    // € is not a piece: its three UTF-8 bytes become byte tokens.
    assert_eq!(
        t.encode("€", false),
        [
            piece("▁"),
            piece("<0xE2>"),
            piece("<0x82>"),
            piece("<0xAC>")
        ]
    );
    // Text after a special token starts afresh, with its own space prefix (as in llama.cpp).
    assert_eq!(t.encode("<s>ab", true), [piece("<s>"), piece("▁ab")]);
    assert_eq!(t.decode(&t.encode("ab €", false), false), " ab €");
    assert_eq!(t.bos(), Some(piece("<s>")));
    assert!(t.add_bos());
}

#[test]
fn shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Tokenizer>();
    send_sync::<lucebox_tokenizer::ChatTemplate>();
    send_sync::<lucebox_tokenizer::StreamDecoder<std::sync::Arc<Tokenizer>>>();
}

#[test]
fn unknown_pre_tokenizer_is_named() {
    let vocab = ByteLevelVocab {
        pre: "mystery-pre",
        ..byte_level()
    };
    let error = Tokenizer::from_gguf(vocab.file().metadata()).expect_err("unknown pre");
    assert!(matches!(error.kind(), ErrorKind::Unsupported(_)));
    let message = error.to_string();
    assert!(
        message.contains("mystery-pre") && message.contains("tokenizer.ggml.pre"),
        "{message}"
    );
}

#[test]
fn unknown_model_is_named() {
    let (tokens, _) = byte_level().tokens();
    let mut writer = lucebox_gguf::GgufWriter::new();
    writer
        .metadata("tokenizer.ggml.model", Value::String("wordpiece".into()))
        .metadata("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    let error = Tokenizer::from_gguf(open(&writer).metadata()).expect_err("unknown model");
    assert!(matches!(error.kind(), ErrorKind::Unsupported(_)));
    assert!(error.to_string().contains("wordpiece"), "{error}");
}

#[test]
fn malformed_vocabularies_are_errors_naming_the_key() {
    // Per-token arrays of the wrong length are refused by the GGUF reader already.
    let (tokens, types) = byte_level().tokens();
    let cases: Vec<(&str, Value)> = vec![
        (
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![9; types.len()])),
        ),
        (
            "tokenizer.ggml.merges",
            Value::Array(Array::String(vec!["h nosuchtoken".into()])),
        ),
        (
            "tokenizer.ggml.merges",
            Value::Array(Array::String(vec!["h".into()])),
        ),
        ("tokenizer.ggml.pre", Value::U32(7)),
    ];
    for (key, value) in cases {
        let mut writer = lucebox_gguf::GgufWriter::new();
        let base = [
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            ("tokenizer.ggml.pre", Value::String("qwen2".into())),
            (
                "tokenizer.ggml.tokens",
                Value::Array(Array::String(tokens.clone())),
            ),
            (
                "tokenizer.ggml.token_type",
                Value::Array(Array::I32(types.clone())),
            ),
            (
                "tokenizer.ggml.merges",
                Value::Array(Array::String(Vec::new())),
            ),
        ];
        for (k, v) in base {
            writer.metadata(k, if k == key { value.clone() } else { v });
        }
        let error = Tokenizer::from_gguf(open(&writer).metadata()).expect_err(key);
        assert!(
            matches!(error.kind(), ErrorKind::Metadata(_)),
            "{key}: {error}"
        );
        assert!(error.to_string().contains(key), "{key}: {error}");
    }
}

#[test]
fn digest_follows_the_vocabulary() {
    let base = tokenizer(&byte_level());
    assert_eq!(base.digest(), tokenizer(&byte_level()).digest());
    let mut reordered = byte_level();
    reordered.merges.swap(0, 1);
    assert_ne!(base.digest(), tokenizer(&reordered).digest());
    let mut retyped = byte_level();
    retyped.specials[1].1 = CONTROL;
    assert_ne!(base.digest(), tokenizer(&retyped).digest());
    let other_pre = ByteLevelVocab {
        pre: "gpt-2",
        ..byte_level()
    };
    assert_ne!(base.digest(), tokenizer(&other_pre).digest());
}

proptest! {
    #![proptest_config(ProptestConfig {
        // Failures are reported in the test output; nothing is written into the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Streaming gives the same text as decoding everything at once, for any ids, including
    /// tokens that end inside a character and ids outside the vocabulary.
    #[test]
    fn stream_decoding_equals_whole_decoding(
        ids in proptest::collection::vec(0u32..280, 0..40),
        skip_special in any::<bool>(),
    ) {
        let t = tokenizer(&byte_level());
        let mut stream = t.stream_decoder(skip_special);
        let mut streamed = String::new();
        for &id in &ids {
            if let Some(chunk) = stream.push(id) {
                prop_assert!(!chunk.is_empty());
                streamed.push_str(&chunk);
            }
        }
        streamed.extend(stream.finish());
        prop_assert_eq!(streamed, t.decode(&ids, skip_special));
    }
}

#[test]
fn stream_holds_incomplete_characters() {
    let t = tokenizer(&byte_level());
    let mut stream = t.stream_decoder(false);
    assert_eq!(stream.push(id(&t, b"\xf0\x9f\xa6")), None);
    assert_eq!(stream.push(id(&t, b"\x99")).as_deref(), Some("🦙"));
    assert_eq!(stream.push(id(&t, b"\xc3")), None);
    // `h` cannot continue `\xc3`: the lone byte becomes U+FFFD, then `h` follows.
    assert_eq!(stream.push(id(&t, b"h")).as_deref(), Some("\u{fffd}h"));
    assert_eq!(stream.push(id(&t, b"\xf0\x9f")), None);
    assert_eq!(stream.finish().as_deref(), Some("\u{fffd}"));
    assert_eq!(stream.finish(), None);
}
