//! Builds the tokenizer and chat template of an arbitrary GGUF file: a refused file must give an
//! error, an accepted one must encode, decode and render without panicking, and a template must
//! stop within its fuel and output limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lucebox_gguf::GgufFile;
use lucebox_tokenizer::{ChatMessage, ChatTemplate, TemplateLimits, Tokenizer};

const TEXTS: [&str; 3] = [
    "Hello, world! 123 'll\n\n  <|im_start|>é🦙",
    "",
    "<s> </s> <unk> ▁▁ \u{0}\u{7f}",
];

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let meta = file.metadata();
    if let Ok(tokenizer) = Tokenizer::from_gguf(meta) {
        for text in TEXTS {
            for parse_special in [false, true] {
                let ids = tokenizer.encode(text, parse_special);
                assert!(ids.iter().all(|&id| (id as usize) < tokenizer.vocab_size()));
                let _ = tokenizer.decode(&ids, true);
            }
        }
        let probe: Vec<u32> = (0..tokenizer.vocab_size().min(512) as u32).collect();
        let mut stream = tokenizer.stream_decoder(false);
        let mut streamed = String::new();
        for &id in &probe {
            streamed.extend(stream.push(id));
        }
        streamed.extend(stream.finish());
        assert_eq!(streamed, tokenizer.decode(&probe, false));
        assert_eq!(tokenizer.digest().len(), 64);
    }
    if let Ok(Some(template)) = ChatTemplate::from_gguf(meta) {
        let template = template.with_limits(TemplateLimits {
            fuel: 100_000,
            max_output_bytes: 1 << 16,
        });
        let messages = [
            ChatMessage::new("system", "s"),
            ChatMessage::new("user", "u"),
        ];
        let _ = template.render(&messages, true);
    }
});
