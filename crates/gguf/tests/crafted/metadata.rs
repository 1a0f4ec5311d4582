//! Metadata entries: strings, arrays and their lengths, value types, and the keys whose values
//! llama.cpp's loaders trust (alignment, tokenizer arrays, token ids, block count).

use lucebox_gguf::{
    Array, ErrorKind, GgufFile, MAX_ARRAY_DEPTH, MAX_ARRAY_LEN, MAX_BLOCK_COUNT, MAX_STRING_BYTES,
    Value, ValueType,
};

use super::{HEADER_BYTES, Raw, assert_at, assert_invalid, parse_err};

/// A file holding only `entries`, and the offset at which each entry starts.
fn file_with(entries: Vec<(&str, Value)>) -> (Vec<u8>, Vec<u64>) {
    let mut raw = Raw::new(0, entries.len() as u64);
    let offsets = entries
        .into_iter()
        .map(|(key, value)| raw.kv(key, value))
        .collect();
    (raw.finish(), offsets)
}

fn strings(items: &[&str]) -> Value {
    Value::Array(Array::String(items.iter().map(|s| s.to_string()).collect()))
}

fn vocab() -> (&'static str, Value) {
    ("tokenizer.ggml.tokens", strings(&["<unk>", "a", "b"]))
}

#[track_caller]
fn assert_wrong_type(
    e: &lucebox_gguf::Error,
    field: &str,
    offset: u64,
    expected: &str,
    found: &str,
) {
    assert_at(e, field, offset);
    match e.kind() {
        ErrorKind::WrongType {
            expected: x,
            found: f,
        } => assert_eq!((*x, *f), (expected, found), "{e}"),
        other => panic!("expected a wrong-type error, got {other:?} ({e})"),
    }
}

/// TALOS-2024-1916 / CVE-2024-23496: `gguf_fread_str` allocated `len + 1` bytes, which wraps
/// to zero for a length of u64::MAX. A length the rest of the file cannot hold is refused.
#[test]
fn a_key_longer_than_the_file_is_refused() {
    let mut raw = Raw::new(0, 1);
    raw.u64(u64::MAX).zeros(20);
    let e = parse_err(raw.finish());
    assert!(matches!(
        e.kind(),
        ErrorKind::TooLarge {
            value: u64::MAX,
            limit: 20
        }
    ));
    assert_at(&e, "metadata entry 0 key", HEADER_BYTES);
}

/// The same class for a string value: the error names the key and points at the length.
#[test]
fn a_string_value_longer_than_the_file_is_refused() {
    let mut raw = Raw::new(0, 1);
    raw.str("general.name")
        .u32(ValueType::String as u32)
        .u64(1000)
        .zeros(10);
    let e = parse_err(raw.finish());
    assert!(matches!(
        e.kind(),
        ErrorKind::TooLarge {
            value: 1000,
            limit: 10
        }
    ));
    assert_at(&e, "general.name", HEADER_BYTES + 8 + 12 + 4);
}

/// Commit 418dea3 ("gguf : prevent string exhaustion"): a string the file does hold is still
/// refused above a fixed cap, so one entry cannot claim gigabytes of memory.
#[test]
fn a_string_above_the_cap_is_refused_even_when_present() {
    let len = MAX_STRING_BYTES + 1;
    let mut raw = Raw::new(0, 1);
    raw.str("k").u32(ValueType::String as u32);
    let at = raw.pos();
    raw.u64(len).zeros(len as usize);
    let e = parse_err(raw.finish());
    assert!(matches!(
        e.kind(),
        ErrorKind::TooLarge { value, limit: MAX_STRING_BYTES } if *value == len
    ));
    assert_at(&e, "k", at);
}

/// TALOS-2024-1912 / CVE-2024-21825: an array's element count times the element size
/// overflowed. The count is bounded by the bytes left divided by the element's size.
#[test]
fn an_array_longer_than_the_file_is_refused() {
    let mut raw = Raw::new(0, 1);
    raw.str("a")
        .u32(ValueType::Array as u32)
        .u32(ValueType::U32 as u32);
    let at = raw.pos();
    raw.u64(100).zeros(12);
    let e = parse_err(raw.finish());
    assert!(matches!(
        e.kind(),
        ErrorKind::TooLarge {
            value: 100,
            limit: 3
        }
    ));
    assert_at(&e, "a", at);
}

/// The string-array case of the same advisory, with counts chosen so that multiplying by
/// `sizeof(gguf_str)` (16) or by any small entry size wraps.
#[test]
fn huge_string_array_counts_are_refused() {
    for count in [u64::MAX, 1 << 60, (u64::MAX / 16) + 1, 1 << 63] {
        let mut raw = Raw::new(0, 1);
        raw.str("tokenizer.ggml.tokens")
            .u32(ValueType::Array as u32)
            .u32(ValueType::String as u32);
        let at = raw.pos();
        raw.u64(count).zeros(64);
        let e = parse_err(raw.finish());
        assert!(
            matches!(e.kind(), ErrorKind::TooLarge { value, limit: 8 } if *value == count),
            "{e}"
        );
        assert_at(&e, "tokenizer.ggml.tokens", at);
    }
}

/// Commit 418dea3 ("gguf : prevent array elements exhaustion"): an array the file does hold is
/// still refused above a fixed element cap.
#[test]
fn an_array_above_the_cap_is_refused_even_when_present() {
    let len = MAX_ARRAY_LEN + 1;
    let mut raw = Raw::new(0, 1);
    raw.str("k")
        .u32(ValueType::Array as u32)
        .u32(ValueType::U8 as u32);
    let at = raw.pos();
    raw.u64(len).zeros(len as usize);
    let e = parse_err(raw.finish());
    assert!(matches!(
        e.kind(),
        ErrorKind::TooLarge { value, limit: MAX_ARRAY_LEN } if *value == len
    ));
    assert_at(&e, "k", at);
}

/// Arrays of arrays `levels` deep, the innermost an empty u8 array; returns the file and the
/// offset of each level's element-type field.
fn nested(levels: u32) -> (Vec<u8>, Vec<u64>) {
    let mut raw = Raw::new(0, 1);
    raw.str("nested").u32(ValueType::Array as u32);
    let mut starts = Vec::new();
    for level in 0..levels {
        starts.push(raw.pos());
        if level + 1 < levels {
            raw.u32(ValueType::Array as u32).u64(1);
        } else {
            raw.u32(ValueType::U8 as u32).u64(0);
        }
    }
    (raw.finish(), starts)
}

/// gguf-py's reader recursed without limit on nested arrays (a RecursionError on a small file),
/// and a native reader can overflow its stack the same way. Depth is capped.
#[test]
fn arrays_nested_too_deep_are_refused() {
    let (bytes, _) = nested(MAX_ARRAY_DEPTH);
    let file = GgufFile::from_bytes(bytes).expect("the deepest accepted nesting");
    assert_eq!(file.metadata().array("nested").unwrap().len(), 1);

    let (bytes, starts) = nested(MAX_ARRAY_DEPTH + 1);
    let e = parse_err(bytes);
    assert_invalid(
        &e,
        "nested",
        starts[MAX_ARRAY_DEPTH as usize],
        "nest deeper",
    );

    let (bytes, starts) = nested(10_000);
    let e = parse_err(bytes);
    assert_invalid(
        &e,
        "nested",
        starts[MAX_ARRAY_DEPTH as usize],
        "nest deeper",
    );
}

/// ggml indexed a per-type size table with the type id read from the file ("ggml : fix negative
/// tensor type oob" in 418dea3 is the tensor twin). Unknown value types are refused by id.
#[test]
fn unknown_value_types_are_refused() {
    for id in [13, 255, u32::MAX] {
        let mut raw = Raw::new(0, 1);
        raw.str("k");
        let at = raw.pos();
        raw.u32(id).zeros(16);
        let e = parse_err(raw.finish());
        assert!(matches!(e.kind(), ErrorKind::UnknownValueType(v) if *v == id));
        assert_at(&e, "k", at);

        let mut raw = Raw::new(0, 1);
        raw.str("k").u32(ValueType::Array as u32);
        let at = raw.pos();
        raw.u32(id).u64(1).zeros(16);
        let e = parse_err(raw.finish());
        assert!(matches!(e.kind(), ErrorKind::UnknownValueType(v) if *v == id));
        assert_at(&e, "k", at);
    }
}

/// gguf-py now errors on duplicate keys (418dea3); ggml's reader refuses them too, since which
/// copy a consumer sees would otherwise depend on the lookup.
#[test]
fn duplicate_keys_are_refused() {
    let (bytes, offsets) = file_with(vec![
        ("general.name", Value::String("first".into())),
        ("general.architecture", Value::String("llama".into())),
        ("general.name", Value::String("second".into())),
    ]);
    let e = parse_err(bytes);
    assert!(matches!(e.kind(), ErrorKind::Duplicate));
    assert_at(&e, "general.name", offsets[2]);
}

#[test]
fn bools_other_than_0_and_1_are_refused() {
    let mut raw = Raw::new(0, 1);
    raw.str("flag").u32(ValueType::Bool as u32);
    let at = raw.pos();
    raw.bytes(&[2]);
    let e = parse_err(raw.finish());
    assert_invalid(&e, "flag", at, "bool byte is 2");
}

#[test]
fn keys_that_are_not_utf8_are_refused() {
    let mut raw = Raw::new(0, 1);
    raw.u64(2)
        .bytes(&[0xc3, 0x28])
        .u32(ValueType::U8 as u32)
        .bytes(&[0]);
    let e = parse_err(raw.finish());
    assert!(matches!(e.kind(), ErrorKind::InvalidUtf8));
    assert_at(&e, "metadata entry 0 key", HEADER_BYTES + 8);
}

/// ggml divided by the alignment (a zero one was a SIGFPE: llama.cpp #20716, the same bug in
/// candle #3876 and gguf-tools #27), masked with `alignment - 1` (wrong unless a power of two)
/// and padded with it (a huge one wraps `GGML_PAD`: llama.cpp #24997).
#[test]
fn alignments_that_are_zero_huge_or_not_powers_of_two_are_refused() {
    for alignment in [0, 3, 48, 1 << 21, 1 << 31, u32::MAX] {
        let (bytes, offsets) = file_with(vec![
            ("general.name", Value::String("x".into())),
            ("general.alignment", Value::U32(alignment)),
        ]);
        let e = parse_err(bytes);
        assert_invalid(&e, "general.alignment", offsets[1], "not a power of two");
    }
    for alignment in [1, 8, 64, 1 << 20] {
        let (bytes, _) = file_with(vec![("general.alignment", Value::U32(alignment))]);
        let file = GgufFile::from_bytes(bytes).expect("a valid alignment");
        assert_eq!(file.alignment(), u64::from(alignment));
    }
}

/// llama.cpp asserted on a `general.alignment` of another type (its #26318 notes an INT32 one).
/// The type is checked, and the error says which type was found.
#[test]
fn alignments_of_the_wrong_type_are_refused() {
    let cases = [
        (Value::U64(32), "u64"),
        (Value::I32(32), "i32"),
        (Value::U16(32), "u16"),
        (Value::String("32".into()), "string"),
        (Value::Array(Array::U32(vec![32])), "array of u32"),
    ];
    for (value, found) in cases {
        let (bytes, offsets) = file_with(vec![("general.alignment", value)]);
        let e = parse_err(bytes);
        assert_wrong_type(&e, "general.alignment", offsets[0], "u32", found);
    }
}

/// llama.cpp's vocabulary loader cast `gguf_get_arr_data` to `const int32_t *` / `const float *`
/// whatever the declared element type, reading an i8- or u8-declared array past its end
/// (llama.cpp #26690). The typed accessors refuse another element type, even one of the same
/// width, and never reinterpret the bytes.
#[test]
fn typed_array_accessors_refuse_other_element_types() {
    let (bytes, offsets) = file_with(vec![
        ("x.i8", Value::Array(Array::I8(vec![1, 2, 3, 4]))),
        ("x.u8", Value::Array(Array::U8(vec![1, 2, 3, 4]))),
        ("x.i32", Value::Array(Array::I32(vec![1, 2]))),
        ("x.byte", Value::U8(7)),
    ]);
    let file = GgufFile::from_bytes(bytes).expect("valid: nothing reads these keys at open");
    let m = file.metadata();
    let e = m.i32_array("x.i8").unwrap_err();
    assert_wrong_type(&e, "x.i8", offsets[0], "array of i32", "array of i8");
    let e = m.f32_array("x.u8").unwrap_err();
    assert_wrong_type(&e, "x.u8", offsets[1], "array of f32", "array of u8");
    let e = m.str_array("x.u8").unwrap_err();
    assert_wrong_type(&e, "x.u8", offsets[1], "array of string", "array of u8");
    let e = m.f32_array("x.i32").unwrap_err();
    assert_wrong_type(&e, "x.i32", offsets[2], "array of f32", "array of i32");
    let e = m.uint("x.i8").unwrap_err();
    assert_wrong_type(
        &e,
        "x.i8",
        offsets[0],
        "non-negative integer",
        "array of i8",
    );
    let e = m.array("x.byte").unwrap_err();
    assert_wrong_type(&e, "x.byte", offsets[3], "array", "u8");
    assert_eq!(m.i32_array("x.i32").unwrap(), &[1, 2]);
    assert_eq!(m.array("x.i8").unwrap(), &Array::I8(vec![1, 2, 3, 4]));

    let e = m.str("absent").unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Missing));
    assert_at(&e, "absent", HEADER_BYTES);
    assert_eq!(m.opt_str("absent").unwrap(), None);
}

/// The same class caught when the file is opened: per-token arrays declared with a narrower
/// element type than the one they are read as.
#[test]
fn per_token_arrays_of_a_narrower_type_are_refused_at_open() {
    let (bytes, offsets) = file_with(vec![
        vocab(),
        (
            "tokenizer.ggml.token_type",
            Value::Array(Array::I8(vec![1, 1, 1])),
        ),
    ]);
    let e = parse_err(bytes);
    assert_wrong_type(
        &e,
        "tokenizer.ggml.token_type",
        offsets[1],
        "array of i32",
        "array of i8",
    );

    let (bytes, offsets) = file_with(vec![
        vocab(),
        ("tokenizer.ggml.scores", Value::Array(Array::U8(vec![0; 3]))),
    ]);
    let e = parse_err(bytes);
    assert_wrong_type(
        &e,
        "tokenizer.ggml.scores",
        offsets[1],
        "array of f32",
        "array of u8",
    );

    let (bytes, offsets) = file_with(vec![(
        "tokenizer.ggml.tokens",
        Value::Array(Array::U8(vec![0; 3])),
    )]);
    let e = parse_err(bytes);
    assert_wrong_type(
        &e,
        "tokenizer.ggml.tokens",
        offsets[0],
        "array of string",
        "array of u8",
    );
}

/// llama.cpp indexed its token table with scores/token_type arrays of another length
/// (llama.cpp #20735): each per-token array must have one entry per token.
#[test]
fn per_token_arrays_of_the_wrong_length_are_refused() {
    let (bytes, offsets) = file_with(vec![
        vocab(),
        (
            "tokenizer.ggml.scores",
            Value::Array(Array::F32(vec![0.0; 2])),
        ),
    ]);
    let e = parse_err(bytes);
    assert_invalid(
        &e,
        "tokenizer.ggml.scores",
        offsets[1],
        "has 2 entries for 3 tokens",
    );

    let (bytes, offsets) = file_with(vec![
        (
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![1; 4])),
        ),
        vocab(),
    ]);
    let e = parse_err(bytes);
    assert_invalid(
        &e,
        "tokenizer.ggml.token_type",
        offsets[0],
        "has 4 entries for 3 tokens",
    );
}

/// GHSA-g4cc-763q-h9h6 and llama.cpp #3634 / #25508 (and mistral.rs #2225): special-token ids
/// were used as indexes into the token table unchecked. Every `*_token_id` must be a
/// non-negative integer below the vocabulary size.
#[test]
fn token_ids_outside_the_vocabulary_are_refused() {
    for id in [3, 151_645, u64::MAX] {
        let (bytes, offsets) = file_with(vec![
            vocab(),
            ("tokenizer.ggml.bos_token_id", Value::U32(1)),
            ("tokenizer.ggml.eos_token_id", Value::U64(id)),
        ]);
        let e = parse_err(bytes);
        assert_invalid(
            &e,
            "tokenizer.ggml.eos_token_id",
            offsets[2],
            &format!("token id {id} is not below the vocabulary size 3"),
        );
    }

    let (bytes, offsets) = file_with(vec![
        vocab(),
        ("tokenizer.ggml.padding_token_id", Value::I32(-1)),
    ]);
    let e = parse_err(bytes);
    assert_invalid(
        &e,
        "tokenizer.ggml.padding_token_id",
        offsets[1],
        "not a non-negative integer",
    );

    let (bytes, _) = file_with(vec![
        vocab(),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
    ]);
    GgufFile::from_bytes(bytes).expect("the last token is a valid id");
}

/// Loaders size per-layer tables from `{arch}.block_count`; zero or an absurd count is refused.
#[test]
fn block_counts_out_of_range_are_refused() {
    for blocks in [0, MAX_BLOCK_COUNT + 1, u64::from(u32::MAX), u64::MAX] {
        let (bytes, offsets) = file_with(vec![
            ("general.architecture", Value::String("llama".into())),
            ("llama.block_count", Value::U64(blocks)),
        ]);
        let e = parse_err(bytes);
        assert_invalid(
            &e,
            "llama.block_count",
            offsets[1],
            &format!("{blocks} is not in 1..={MAX_BLOCK_COUNT}"),
        );
    }

    let (bytes, offsets) = file_with(vec![
        ("qwen2.block_count", Value::String("28".into())),
        ("general.architecture", Value::String("qwen2".into())),
    ]);
    let e = parse_err(bytes);
    assert_wrong_type(
        &e,
        "qwen2.block_count",
        offsets[0],
        "non-negative integer",
        "string",
    );

    let (bytes, _) = file_with(vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U32(MAX_BLOCK_COUNT as u32)),
    ]);
    GgufFile::from_bytes(bytes).expect("the largest block count accepted");
}
