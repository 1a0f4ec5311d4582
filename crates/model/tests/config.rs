//! Metadata that a model cannot be built from is refused with an error naming the key.

use lucebox_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use lucebox_model::{Architecture, ModelConfig};

type Keys = Vec<(&'static str, Value)>;
type Edit = Box<dyn FnOnce(&mut Keys)>;

/// A minimal qwen2 file: metadata plus the token embedding the config reads its vocabulary from.
fn qwen2(edit: impl FnOnce(&mut Keys)) -> Result<ModelConfig, String> {
    let mut keys = vec![
        ("general.architecture", Value::String("qwen2".into())),
        ("qwen2.block_count", Value::U32(2)),
        ("qwen2.context_length", Value::U32(4096)),
        ("qwen2.embedding_length", Value::U32(64)),
        ("qwen2.feed_forward_length", Value::U32(128)),
        ("qwen2.attention.head_count", Value::U32(4)),
        ("qwen2.attention.head_count_kv", Value::U32(2)),
        ("qwen2.rope.freq_base", Value::F32(1e6)),
        ("qwen2.attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
    ];
    edit(&mut keys);
    let mut w = GgufWriter::new();
    for (k, v) in keys {
        w.metadata(k, v);
    }
    w.tensor(
        "token_embd.weight",
        &[64, 10],
        GgmlType::F32,
        vec![0; 64 * 10 * 4],
    );
    let file = GgufFile::from_bytes(w.to_bytes()).map_err(|e| e.to_string())?;
    ModelConfig::from_gguf(&file).map_err(|e| e.to_string())
}

fn set(keys: &mut [(&'static str, Value)], key: &str, value: Value) {
    keys.iter_mut().find(|(k, _)| *k == key).unwrap().1 = value;
}

#[test]
fn a_complete_file_gives_its_hyperparameters() {
    let c = qwen2(|_| {}).unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert_eq!(
        (
            c.layers,
            c.embedding,
            c.heads,
            c.kv_heads,
            c.head_dim,
            c.vocab
        ),
        (2, 64, 4, 2, 16, 10)
    );
    assert_eq!(c.rope.rotary_dims, 16);
    assert_eq!(c.rope.freq_base, 1e6);
}

#[test]
fn bad_metadata_is_refused_naming_the_key() {
    let cases: [(&str, Edit); 7] = [
        (
            "architecture \"mamba\" is not supported",
            Box::new(|k| set(k, "general.architecture", Value::String("mamba".into()))),
        ),
        (
            "qwen2.attention.head_count_kv",
            Box::new(|k| set(k, "qwen2.attention.head_count_kv", Value::U32(3))),
        ),
        (
            "qwen2.embedding_length",
            Box::new(|k| set(k, "qwen2.embedding_length", Value::U32(0))),
        ),
        (
            "qwen2.context_length",
            Box::new(|k| set(k, "qwen2.context_length", Value::U64(u64::MAX))),
        ),
        (
            "qwen2.attention.layer_norm_rms_epsilon",
            Box::new(|k| {
                set(
                    k,
                    "qwen2.attention.layer_norm_rms_epsilon",
                    Value::F32(f32::NAN),
                )
            }),
        ),
        (
            "qwen2.rope.scaling.type",
            Box::new(|k| k.push(("qwen2.rope.scaling.type", Value::String("yarn".into())))),
        ),
        (
            "qwen2.feed_forward_length",
            Box::new(|k| k.retain(|(key, _)| *key != "qwen2.feed_forward_length")),
        ),
    ];
    for (expected, edit) in cases {
        let error = qwen2(edit).unwrap_err();
        assert!(
            error.contains(expected),
            "{error:?} does not mention {expected:?}"
        );
    }
}

#[test]
fn an_embedding_of_the_wrong_width_is_refused() {
    let error = qwen2(|k| set(k, "qwen2.embedding_length", Value::U32(32))).unwrap_err();
    assert!(error.contains("token_embd.weight"), "{error}");
}
