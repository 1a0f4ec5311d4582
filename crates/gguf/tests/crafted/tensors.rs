//! The tensor-info table and the extents of tensor data.

use lucebox_gguf::{ErrorKind, GgmlType, GgufFile, MAX_TENSOR_NAME_BYTES, Value};

use super::{HEADER_BYTES, Raw, assert_at, assert_invalid, parse_err};

const F32: u32 = 0;

/// Offsets inside the entry of a one-byte-named tensor written first after an empty metadata
/// section: its n_dims field, and its i-th dimension.
const N_DIMS_AT: u64 = HEADER_BYTES + 8 + 1;
const fn dim_at(i: u64) -> u64 {
    N_DIMS_AT + 4 + 8 * i
}

/// A file with one tensor called `t`, its data section holding `data_bytes` bytes.
fn one_tensor(dims: &[u64], type_id: u32, offset: u64, data_bytes: usize) -> Vec<u8> {
    let mut raw = Raw::new(1, 0);
    raw.tensor_info("t", dims, type_id, offset);
    raw.pad_to(32).zeros(data_bytes);
    raw.finish()
}

/// ggml's tensors have at most four dimensions and its loops index `ne[GGML_MAX_DIMS]` with the
/// count read from the file; zero dimensions is no tensor.
#[test]
fn dimension_counts_outside_1_to_4_are_refused() {
    for n_dims in [0u32, 5, 64] {
        let dims = vec![1; n_dims as usize];
        let e = parse_err(one_tensor(&dims, F32, 0, 64));
        assert_invalid(
            &e,
            "tensor t n_dims",
            N_DIMS_AT,
            &format!("{n_dims} is not in 1..=4"),
        );
    }
    let mut raw = Raw::new(1, 0);
    raw.str("t").u32(u32::MAX).zeros(64);
    let e = parse_err(raw.finish());
    assert_invalid(&e, "tensor t n_dims", N_DIMS_AT, "is not in 1..=4");
}

/// A zero dimension made ggml divide by it in its overflow check (ggml #1517); a dimension
/// above i64::MAX is negative as ggml's `int64_t ne`.
#[test]
fn zero_and_negative_dimensions_are_refused() {
    let e = parse_err(one_tensor(&[4, 0], F32, 0, 64));
    assert_invalid(&e, "tensor t dims[1]", dim_at(1), "0 is not in 1..=2^63-1");

    let e = parse_err(one_tensor(&[1 << 63, 1], F32, 0, 64));
    assert_invalid(&e, "tensor t dims[0]", dim_at(0), "is not in 1..=2^63-1");
}

/// TALOS-2024-1915 / CVE-2024-21802 (`info->ne`): the element count, the product of the
/// dimensions, overflowed and sized a short buffer. It must fit in an i64.
#[test]
fn dimension_products_that_overflow_are_refused() {
    let cases: [(&[u64], u64); 3] = [
        (&[1 << 32, 1 << 32], 1),
        (&[1 << 31, 1 << 31, 2], 2),
        (&[i64::MAX as u64, 2], 1),
    ];
    for (dims, at) in cases {
        let e = parse_err(one_tensor(dims, F32, 0, 64));
        assert!(matches!(e.kind(), ErrorKind::Overflow), "{dims:?}: {e}");
        assert_at(&e, "tensor t element count", dim_at(at));
    }
}

/// GHSA-96jg-mvhq-q7q7: the element count fit, but times the type's size it overflowed.
#[test]
fn byte_sizes_that_overflow_are_refused() {
    let cases: [(&[u64], GgmlType); 3] = [
        (&[1 << 62], GgmlType::F32),
        (&[1 << 61, 2], GgmlType::F64),
        (&[1 << 31, 1 << 31], GgmlType::I32),
    ];
    for (dims, ty) in cases {
        let e = parse_err(one_tensor(dims, ty.id(), 0, 64));
        assert!(matches!(e.kind(), ErrorKind::Overflow), "{dims:?}: {e}");
        assert_at(&e, "tensor t byte size", HEADER_BYTES);
    }
}

/// ggml indexed its type-traits table with the type id (a negative one read out of bounds:
/// "ggml : fix negative tensor type oob" in 418dea3), and the removed types 4 and 5 had block
/// size 0, a division by zero (llama.cpp #8816).
#[test]
fn unknown_tensor_types_are_refused() {
    for id in [4, 5, 31, 36, 40, i32::MAX as u32, u32::MAX] {
        let e = parse_err(one_tensor(&[32], id, 0, 256));
        assert!(matches!(e.kind(), ErrorKind::UnknownTensorType(t) if *t == id));
        assert_at(&e, "tensor t type", dim_at(1));
    }
}

/// A row that is not a whole number of quantization blocks has no byte size.
#[test]
fn rows_that_are_not_whole_blocks_are_refused() {
    let e = parse_err(one_tensor(&[100, 2], GgmlType::Q4K.id(), 0, 1024));
    assert_invalid(
        &e,
        "tensor t dims[0]",
        dim_at(0),
        "100 is not a multiple of the Q4_K block length 256",
    );
}

/// GHSA-vgg9-87g3-85w8 / CVE-2025-53630 and its bypass through `GGML_PAD` (llama.cpp #24759):
/// the running sum of padded tensor sizes wrapped. Here each extent is computed with checked
/// arithmetic, so offset + size cannot wrap to a small number.
#[test]
fn extents_whose_end_overflows_are_refused() {
    let last_aligned_offset = u64::MAX - 31;
    let e = parse_err(one_tensor(&[16], F32, last_aligned_offset, 64));
    assert!(matches!(e.kind(), ErrorKind::Overflow), "{e}");
    assert_at(&e, "tensor t extent", HEADER_BYTES);
}

/// Out-of-file data: the read of tensor data past the end of the file or map (CVE-2026-7482,
/// "Bleeding Llama", is this class in Ollama's loader).
#[test]
fn data_past_the_end_of_the_file_is_refused() {
    let e = parse_err(one_tensor(&[16], F32, 0, 32));
    assert_invalid(
        &e,
        "tensor t extent",
        HEADER_BYTES,
        "data [0, 64) ends past the data section of 32 bytes",
    );

    let e = parse_err(one_tensor(&[8], F32, 1 << 40, 64));
    assert_invalid(
        &e,
        "tensor t extent",
        HEADER_BYTES,
        "ends past the data section",
    );

    // A file whose tensor table ends before the data section even begins.
    let mut raw = Raw::new(1, 0);
    raw.tensor_info("t", &[8], F32, 0);
    let len = raw.pos();
    let e = parse_err(raw.finish());
    assert!(matches!(
        e.kind(),
        ErrorKind::Truncated { needed, left } if *needed == len.next_multiple_of(32) && *left == len
    ));
    assert_at(&e, "data section", len);
}

#[test]
fn duplicate_tensor_names_are_refused() {
    let mut raw = Raw::new(2, 0);
    raw.tensor_info("t", &[8], F32, 0);
    let second = raw.tensor_info("t", &[8], F32, 32);
    raw.pad_to(32).zeros(64);
    let e = parse_err(raw.finish());
    assert!(matches!(e.kind(), ErrorKind::Duplicate));
    assert_at(&e, "t", second);
}

/// Two tensors sharing bytes would let a write through one corrupt the other, and let a file
/// claim more tensor data than it holds.
#[test]
fn overlapping_tensors_are_refused() {
    // `a` covers [0, 64) and `b` starts inside it; listed in either order, `b` is named.
    let mut raw = Raw::new(2, 0);
    raw.tensor_info("a", &[16], F32, 0);
    let b_at = raw.tensor_info("b", &[8], F32, 32);
    raw.pad_to(32).zeros(128);
    let e = parse_err(raw.finish());
    let why = "data starting at 32 overlaps tensor a, which ends at 64";
    assert_invalid(&e, "tensor b extent", b_at, why);

    let mut raw = Raw::new(2, 0);
    let b_at = raw.tensor_info("b", &[8], F32, 32);
    raw.tensor_info("a", &[16], F32, 0);
    raw.pad_to(32).zeros(128);
    let e = parse_err(raw.finish());
    assert_invalid(&e, "tensor b extent", b_at, why);

    // The same start: the one listed second is named.
    let mut raw = Raw::new(2, 0);
    raw.tensor_info("a", &[8], F32, 0);
    let b_at = raw.tensor_info("b", &[8], F32, 0);
    raw.pad_to(32).zeros(64);
    let e = parse_err(raw.finish());
    let why = "data starting at 0 overlaps tensor a, which ends at 32";
    assert_invalid(&e, "tensor b extent", b_at, why);
}

/// Misaligned offsets break every kernel that loads aligned vectors from tensor data.
#[test]
fn misaligned_tensor_offsets_are_refused() {
    let e = parse_err(one_tensor(&[8], F32, 16, 64));
    assert_invalid(
        &e,
        "tensor t offset",
        dim_at(1) + 4,
        "16 is not a multiple of the alignment 32",
    );

    let mut raw = Raw::new(1, 1);
    raw.kv("general.alignment", Value::U32(64));
    let info = raw.tensor_info("t", &[8], F32, 32);
    raw.pad_to(64).zeros(128);
    let e = parse_err(raw.finish());
    assert_invalid(
        &e,
        "tensor t offset",
        info + 8 + 1 + 4 + 8 + 4,
        "32 is not a multiple of the alignment 64",
    );
}

/// ggml copies names into a fixed `char name[GGML_MAX_NAME]`.
#[test]
fn tensor_names_longer_than_ggml_allows_are_refused() {
    let name = "n".repeat(MAX_TENSOR_NAME_BYTES as usize + 1);
    let mut raw = Raw::new(1, 0);
    raw.tensor_info(&name, &[8], F32, 0);
    raw.pad_to(32).zeros(32);
    let e = parse_err(raw.finish());
    assert!(matches!(
        e.kind(),
        ErrorKind::TooLarge { value, limit: MAX_TENSOR_NAME_BYTES }
            if *value == MAX_TENSOR_NAME_BYTES + 1
    ));
    assert_at(&e, "tensor 0 name", HEADER_BYTES);

    let name = "n".repeat(MAX_TENSOR_NAME_BYTES as usize);
    let mut raw = Raw::new(1, 0);
    raw.tensor_info(&name, &[8], F32, 0);
    raw.pad_to(32).zeros(32);
    let file = GgufFile::from_bytes(raw.finish()).expect("the longest name accepted");
    assert_eq!(file.tensor(&name).unwrap().data().len(), 32);
}

#[test]
fn a_tensor_entry_cut_short_is_truncation() {
    let name = "u".repeat(40);
    let mut raw = Raw::new(2, 0);
    raw.tensor_info("t", &[8], F32, 0);
    raw.str(&name).u32(1).u64(8).u32(F32);
    let end = raw.pos();
    let e = parse_err(raw.finish());
    assert!(
        matches!(e.kind(), ErrorKind::Truncated { needed: 8, left: 0 }),
        "{e}"
    );
    assert_at(&e, &format!("tensor {name} offset"), end);
}
