//! Crafted malformed files, one class of known GGUF parser vulnerabilities per test.
//!
//! The classes come from the llama.cpp advisories: Cisco Talos TALOS-2024-1912..1916
//! (CVE-2024-21802, CVE-2024-21825, CVE-2024-21836, CVE-2024-23496, CVE-2024-23605), the later
//! GHSA-vgg9-87g3-85w8 (CVE-2025-53630), GHSA-96jg-mvhq-q7q7 and GHSA-8wwf-w4qm-gpqr
//! (CVE-2025-49847), and the unnumbered fixes they prompted in ggml's `gguf.cpp` and
//! `llama-vocab.cpp`. Each test asserts the exact error kind, the field the error names and the
//! byte offset at which that field starts.

mod header;
mod metadata;
mod mutation;
mod tensors;

use lucebox_gguf::{Error, GgufFile, GgufWriter, Value};

/// Length of the fixed header: magic, version, tensor count, metadata count.
const HEADER_BYTES: u64 = 24;

/// A GGUF file written field by field, so that a test knows where each field starts.
struct Raw(Vec<u8>);

impl Raw {
    /// A version 3 header declaring `n_tensors` tensors and `n_kv` metadata entries.
    fn new(n_tensors: u64, n_kv: u64) -> Self {
        Self::with_version(3, n_tensors, n_kv)
    }

    fn with_version(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut raw = Self(b"GGUF".to_vec());
        raw.u32(version).u64(n_tensors).u64(n_kv);
        raw
    }

    /// Where the next field will start.
    fn pos(&self) -> u64 {
        self.0.len() as u64
    }

    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }

    /// A length-prefixed string.
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }

    /// One metadata entry encoded by [`GgufWriter`]; returns the offset at which it starts.
    fn kv(&mut self, key: &str, value: Value) -> u64 {
        let at = self.pos();
        let encoded = GgufWriter::new().metadata(key, value).to_bytes();
        self.bytes(&encoded[HEADER_BYTES as usize..]);
        at
    }

    /// One tensor-info entry with a raw type id; returns the offset at which it starts.
    fn tensor_info(&mut self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> u64 {
        let at = self.pos();
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(type_id).u64(offset);
        at
    }

    /// Zero bytes up to the next multiple of `alignment`.
    fn pad_to(&mut self, alignment: u64) -> &mut Self {
        let len = self.0.len().next_multiple_of(alignment as usize);
        self.0.resize(len, 0);
        self
    }

    fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }

    fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

/// The error that parsing `bytes` must give.
fn parse_err(bytes: Vec<u8>) -> Error {
    match GgufFile::from_bytes(bytes) {
        Ok(file) => panic!("a malformed file was accepted: {file:?}"),
        Err(e) => e,
    }
}

/// Asserts the field and offset an error names; the caller matches the kind.
#[track_caller]
fn assert_at(e: &Error, field: &str, offset: u64) {
    assert_eq!(
        (e.field(), e.offset()),
        (field, offset),
        "wrong place in error: {e}"
    );
}

/// Asserts that the error is [`lucebox_gguf::ErrorKind::Invalid`] with a message containing `why`.
#[track_caller]
fn assert_invalid(e: &Error, field: &str, offset: u64, why: &str) {
    assert_at(e, field, offset);
    match e.kind() {
        lucebox_gguf::ErrorKind::Invalid(msg) => {
            assert!(msg.contains(why), "message {msg:?} lacks {why:?}")
        }
        other => panic!("expected an invalid-value error, got {other:?} ({e})"),
    }
}

/// A small valid file that exercises every section: an architecture with a block count, a
/// tokenizer with per-token arrays and special-token ids, a custom alignment, and tensors of
/// scalar and block-quantized types. Its last tensor ends exactly at the end of the file, so
/// every proper prefix of it is malformed.
fn small_valid_file() -> Vec<u8> {
    let tokens: Vec<String> = ["<unk>", "<s>", "</s>", "a", "b", "ab"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let n = tokens.len();
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", Value::String("llama".into()))
        .metadata("general.alignment", Value::U32(64))
        .metadata("llama.block_count", Value::U32(1))
        .metadata("llama.rope.freq_base", Value::F32(10000.0))
        .metadata("tokenizer.ggml.model", Value::String("llama".into()))
        .metadata(
            "tokenizer.ggml.tokens",
            Value::Array(lucebox_gguf::Array::String(tokens)),
        )
        .metadata(
            "tokenizer.ggml.scores",
            Value::Array(lucebox_gguf::Array::F32(vec![0.5; n])),
        )
        .metadata(
            "tokenizer.ggml.token_type",
            Value::Array(lucebox_gguf::Array::I32(vec![1; n])),
        )
        .metadata(
            "tokenizer.ggml.merges",
            Value::Array(lucebox_gguf::Array::String(vec!["a b".into()])),
        )
        .metadata("tokenizer.ggml.bos_token_id", Value::U32(1))
        .metadata("tokenizer.ggml.eos_token_id", Value::U32(2))
        .metadata("general.flag", Value::Bool(true))
        .metadata(
            "general.nested",
            Value::Array(lucebox_gguf::Array::Array(vec![lucebox_gguf::Array::U8(
                vec![1, 2],
            )])),
        )
        .tensor(
            "blk.0.attn_norm.weight",
            &[8],
            lucebox_gguf::GgmlType::F32,
            (0..32).collect(),
        )
        .tensor(
            "token_embd.weight",
            &[32, 2],
            lucebox_gguf::GgmlType::Q8_0,
            (0..68).map(|i| i as u8).collect(),
        )
        .tensor(
            "output.weight",
            &[256],
            lucebox_gguf::GgmlType::Q4K,
            vec![7; 144],
        );
    let mut bytes = w.to_bytes();
    // The writer pads after the last tensor; drop that so the tensor ends the file.
    let padding = 144usize.next_multiple_of(64) - 144;
    bytes.truncate(bytes.len() - padding);
    bytes
}

#[test]
fn the_small_valid_file_is_valid() {
    let bytes = small_valid_file();
    let len = bytes.len() as u64;
    let file = GgufFile::from_bytes(bytes).expect("valid");
    assert_eq!(file.alignment(), 64);
    assert_eq!(file.tensor_infos().len(), 3);
    let last = file.tensor("output.weight").expect("present");
    assert_eq!(last.info().offset(), 192);
    assert_eq!(file.data_offset() + 192 + last.info().byte_len(), len);
    assert_eq!(last.data(), &[7; 144][..]);
    assert_eq!(
        file.metadata()
            .i32_array("tokenizer.ggml.token_type")
            .unwrap(),
        &[1; 6]
    );
}
