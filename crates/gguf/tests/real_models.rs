//! The three fetched models open, and what they hold matches the facts read from their headers
//! (see /work/shared/models.md): counts, known shapes and types, and data that lies inside the
//! file without gaps larger than the alignment padding.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};

use lucebox_gguf::{GgmlType, GgufFile};

/// What a model must hold.
struct Expected {
    name: &'static str,
    architecture: &'static str,
    block_count: u64,
    vocab: usize,
    eos: u64,
    data_offset: u64,
    /// Tensor count per storage type.
    types: &'static [(GgmlType, usize)],
    /// (tensor, type, dims in ggml order) for a few tensors.
    shapes: &'static [(&'static str, GgmlType, &'static [u64])],
    /// Tensors the model must not have.
    absent: &'static [&'static str],
}

const MODELS: [Expected; 3] = [
    Expected {
        name: "smollm2-135m-instruct-q4_1",
        architecture: "llama",
        block_count: 30,
        vocab: 49152,
        eos: 2,
        data_offset: 1_785_664,
        types: &[
            (GgmlType::F32, 61),
            (GgmlType::Q4_1, 210),
            (GgmlType::Q8_0, 1),
        ],
        shapes: &[
            ("token_embd.weight", GgmlType::Q8_0, &[576, 49152]),
            ("output_norm.weight", GgmlType::F32, &[576]),
            ("blk.0.attn_q.weight", GgmlType::Q4_1, &[576, 576]),
            ("blk.0.attn_k.weight", GgmlType::Q4_1, &[576, 192]),
            ("blk.29.ffn_down.weight", GgmlType::Q4_1, &[1536, 576]),
        ],
        // The output projection is tied to the embeddings.
        absent: &["output.weight", "blk.30.attn_q.weight"],
    },
    Expected {
        name: "qwen2.5-coder-0.5b-instruct-q4_k_m",
        architecture: "qwen2",
        block_count: 24,
        vocab: 151_936,
        eos: 151_645,
        data_offset: 5_947_776,
        types: &[
            (GgmlType::F32, 121),
            (GgmlType::Q4K, 12),
            (GgmlType::Q5_0, 133),
            (GgmlType::Q6K, 12),
            (GgmlType::Q8_0, 13),
        ],
        shapes: &[
            ("token_embd.weight", GgmlType::Q5_0, &[896, 151_936]),
            ("output.weight", GgmlType::Q8_0, &[896, 151_936]),
            ("blk.0.attn_k.bias", GgmlType::F32, &[128]),
            ("blk.0.attn_q.bias", GgmlType::F32, &[896]),
            ("blk.0.attn_v.weight", GgmlType::Q8_0, &[896, 128]),
            ("blk.0.ffn_down.weight", GgmlType::Q6K, &[4864, 896]),
        ],
        absent: &["blk.24.attn_q.weight"],
    },
    Expected {
        name: "qwen2.5-coder-1.5b-instruct-q4_k_m",
        architecture: "qwen2",
        block_count: 28,
        vocab: 151_936,
        eos: 151_645,
        data_offset: 5_950_528,
        types: &[
            (GgmlType::F32, 141),
            (GgmlType::Q4K, 169),
            (GgmlType::Q6K, 29),
        ],
        shapes: &[
            ("token_embd.weight", GgmlType::Q4K, &[1536, 151_936]),
            ("output.weight", GgmlType::Q6K, &[1536, 151_936]),
            ("blk.0.attn_k.bias", GgmlType::F32, &[256]),
            ("blk.27.ffn_gate.weight", GgmlType::Q4K, &[1536, 8960]),
        ],
        absent: &["blk.28.attn_q.weight"],
    },
];

fn check(expected: &Expected) {
    let path = lucebox_testkit::model(expected.name);
    let file_len = std::fs::metadata(&path).expect("stat").len();
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", expected.name));
    let m = file.metadata();

    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.data_offset(), expected.data_offset);
    assert_eq!(
        m.str("general.architecture").unwrap(),
        expected.architecture
    );
    let blocks = m
        .uint(&format!("{}.block_count", expected.architecture))
        .unwrap();
    assert_eq!(blocks, expected.block_count);
    assert_eq!(
        m.str_array("tokenizer.ggml.tokens").unwrap().len(),
        expected.vocab
    );
    assert_eq!(
        m.i32_array("tokenizer.ggml.token_type").unwrap().len(),
        expected.vocab
    );
    assert_eq!(m.uint("tokenizer.ggml.eos_token_id").unwrap(), expected.eos);
    assert_eq!(m.str("tokenizer.ggml.model").unwrap(), "gpt2");

    let mut types = BTreeMap::new();
    for t in file.tensors() {
        *types.entry(t.ggml_type().id()).or_insert(0) += 1;
    }
    let want: BTreeMap<u32, usize> = expected.types.iter().map(|&(t, n)| (t.id(), n)).collect();
    assert_eq!(types, want, "tensor count per type id");

    for &(name, ty, dims) in expected.shapes {
        let t = file
            .tensor(name)
            .unwrap_or_else(|| panic!("{name} is missing"));
        assert_eq!((t.ggml_type(), t.dims()), (ty, dims), "{name}");
    }
    for name in expected.absent {
        assert!(file.tensor(name).is_none(), "{name} should be absent");
    }

    // Every tensor's bytes lie inside the file, each view holds the bytes found at its place in
    // the file, and the data section is fully used: the last tensor ends within one alignment
    // of the end of the file.
    let mut raw = std::fs::File::open(&path).expect("open");
    let mut furthest_end = 0;
    for t in file.tensors() {
        let info = t.info();
        let start = file.data_offset() + info.offset();
        let end = start + info.byte_len();
        assert!(
            end <= file_len,
            "{} ends at {end}, past {file_len}",
            t.name()
        );
        assert_eq!(t.data().len() as u64, info.byte_len());
        let mut head = vec![0; t.data().len().min(64)];
        raw.seek(SeekFrom::Start(start)).expect("seek");
        raw.read_exact(&mut head).expect("read");
        assert_eq!(&t.data()[..head.len()], head, "{}'s first bytes", t.name());
        furthest_end = furthest_end.max(end);
    }
    assert!(file_len - furthest_end < file.alignment());
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn smollm2_135m_opens_and_matches_its_header_facts() {
    check(&MODELS[0]);
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn qwen2_5_coder_0_5b_opens_and_matches_its_header_facts() {
    check(&MODELS[1]);
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn qwen2_5_coder_1_5b_opens_and_matches_its_header_facts() {
    check(&MODELS[2]);
}
