//! The fixed header: magic, version, and the two counts that size everything after it.

use lucebox_gguf::{ErrorKind, Value};

use super::{Raw, assert_at, assert_invalid, parse_err, small_valid_file};

/// Counts that llama.cpp once multiplied by an entry size before allocating: the largest values,
/// those that turn negative as i64, and those whose product with a 16..64-byte entry wraps.
const HOSTILE_COUNTS: [u64; 6] = [
    u64::MAX,
    1 << 63,
    (1 << 63) + 1,
    (u64::MAX / 16) + 1,
    (u64::MAX / 48) + 1,
    (u64::MAX / 64) + 1,
];

#[test]
fn wrong_magic_is_refused() {
    let mut bytes = Raw::new(0, 0).finish();
    bytes[..4].copy_from_slice(b"GGML");
    let e = parse_err(bytes);
    assert!(matches!(e.kind(), ErrorKind::BadMagic(m) if m == b"GGML"));
    assert_at(&e, "header.magic", 0);
}

/// Version 1 stored counts and lengths as u32; reading it with the v2/v3 layout would misparse
/// every field after the header.
#[test]
fn version_1_is_refused() {
    let e = parse_err(Raw::with_version(1, 0, 0).finish());
    assert!(matches!(e.kind(), ErrorKind::UnsupportedVersion(1)));
    assert_at(&e, "header.version", 4);
}

#[test]
fn unknown_versions_are_refused() {
    for version in [0, 4, u32::MAX] {
        let e = parse_err(Raw::with_version(version, 0, 0).finish());
        assert!(matches!(e.kind(), ErrorKind::UnsupportedVersion(v) if *v == version));
        assert_at(&e, "header.version", 4);
    }
}

/// A big-endian file (written for s390x) has byte-swapped counts; read as little-endian they
/// are huge. It is named for what it is rather than reported as an unknown version.
#[test]
fn big_endian_files_are_refused_as_such() {
    for version in [2u32, 3] {
        let mut raw = Raw(b"GGUF".to_vec());
        raw.bytes(&version.to_be_bytes())
            .bytes(&0u64.to_be_bytes())
            .bytes(&0u64.to_be_bytes());
        let e = parse_err(raw.finish());
        assert_invalid(&e, "header.version", 4, "big-endian");
    }
}

/// TALOS-2024-1914 / CVE-2024-21836: `n_tensors * sizeof(gguf_tensor_info)` overflowed and the
/// loop wrote past a short allocation. Here a count the rest of the file cannot hold is refused
/// before anything is allocated for it.
#[test]
fn huge_tensor_counts_are_refused_before_allocating() {
    for n in HOSTILE_COUNTS {
        let e = parse_err(Raw::new(n, 0).finish());
        // After n_tensors only the 8 bytes of n_kv are left: room for no 32-byte tensor info.
        assert!(
            matches!(e.kind(), ErrorKind::TooLarge { value, limit: 0 } if *value == n),
            "{e}"
        );
        assert_at(&e, "header.n_tensors", 8);
    }
}

/// TALOS-2024-1913 / CVE-2024-23605: the same overflow with `n_kv * sizeof(gguf_kv)`.
#[test]
fn huge_metadata_counts_are_refused_before_allocating() {
    for n in HOSTILE_COUNTS {
        let mut raw = Raw::new(0, n);
        raw.zeros(130);
        let e = parse_err(raw.finish());
        // 130 bytes hold at most 10 entries of the 13-byte minimum.
        assert!(
            matches!(e.kind(), ErrorKind::TooLarge { value, limit: 10 } if *value == n),
            "{e}"
        );
        assert_at(&e, "header.n_kv", 16);
    }
}

/// A count just above what the file holds passes the size bound but runs out of bytes; the
/// error points at the first missing entry.
#[test]
fn a_count_one_above_the_entries_present_is_truncation() {
    let mut raw = Raw::new(0, 2);
    raw.kv("general.name", Value::String("x".repeat(20)));
    let end = raw.pos();
    let e = parse_err(raw.finish());
    assert!(matches!(
        e.kind(),
        ErrorKind::Truncated { needed: 8, left: 0 }
    ));
    assert_at(&e, "metadata entry 1 key", end);
}

/// Every prefix of a valid file is malformed and must give an error, never a panic, and the
/// error must point inside the prefix.
#[test]
fn every_truncation_of_a_valid_file_is_an_error() {
    let bytes = small_valid_file();
    for len in 0..bytes.len() {
        let e = match lucebox_gguf::GgufFile::from_bytes(bytes[..len].to_vec()) {
            Ok(_) => panic!("prefix of {len} bytes accepted"),
            Err(e) => e,
        };
        assert!(e.offset() <= len as u64, "prefix {len}: {e}");
        // Inside the header and tables the cut is found as truncation; inside the data section
        // it is found as a tensor whose data ends past the file.
        match e.kind() {
            ErrorKind::Truncated { .. } => {}
            ErrorKind::Invalid(msg) if msg.contains("ends past the data section") => {}
            // A cut inside a length prefix can leave a length that the rest cannot hold.
            ErrorKind::TooLarge { .. } => {}
            other => panic!("prefix {len}: unexpected {other:?} ({e})"),
        }
    }
    assert!(lucebox_gguf::GgufFile::from_bytes(bytes).is_ok());
}
