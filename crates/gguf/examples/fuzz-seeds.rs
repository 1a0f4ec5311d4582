//! Writes small seed files for the `gguf_parse` fuzz target from real GGUF files.
//!
//! Usage: `fuzz-seeds OUT_DIR MODEL.gguf...`
//!
//! A real model is hundreds of megabytes and its vocabulary arrays alone megabytes; a fuzzer
//! wants inputs of kilobytes that still take every path a real file takes. For each model this
//! writes, each under 1 MB:
//! - `NAME-meta.gguf`: its metadata with every array cut to a few hundred entries (special-token
//!   ids clamped into the cut vocabulary, so the file stays valid), no tensors;
//! - `NAME-meta-v2.gguf`: the same as a version 2 file (same layout, other version number);
//! - `NAME-tiny-tensors.gguf`: that metadata and every tensor, with its name, type and number of
//!   dimensions, shrunk to one block holding the first bytes of its real data;
//! - `NAME-few-tensors.gguf`: a 16-entry vocabulary and one tiny tensor per storage type;
//! - `NAME-cut-N.gguf`: that file cut inside its metadata, its tensor table and its data.
//!
//! and one `synthetic-all-types.gguf` holding a value of every metadata type, nested arrays
//! included, which real files do not use.

use std::path::{Path, PathBuf};

use lucebox_gguf::{Array, GgmlType, GgufFile, GgufWriter, Value};

/// Entries kept of each array in the main seeds.
const ARRAY_CAP: usize = 256;
/// Entries kept in the smallest seeds.
const SMALL_ARRAY_CAP: usize = 16;
/// The largest seed this writes.
const MAX_SEED_BYTES: usize = 1 << 20;

fn main() {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let Some((out_dir, models)) = args.split_first().filter(|(_, m)| !m.is_empty()) else {
        eprintln!("usage: fuzz-seeds OUT_DIR MODEL.gguf...");
        std::process::exit(2);
    };
    if let Err(e) = run(out_dir, models) {
        eprintln!("fuzz-seeds: {e}");
        std::process::exit(1);
    }
}

fn run(out_dir: &Path, models: &[PathBuf]) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(out_dir)?;
    let write = |name: &str, bytes: &[u8]| -> Result<(), Box<dyn std::error::Error>> {
        if bytes.len() > MAX_SEED_BYTES {
            return Err(format!("seed {name} is {} bytes, over 1 MB", bytes.len()).into());
        }
        std::fs::write(out_dir.join(name), bytes)?;
        println!("{name}: {} bytes", bytes.len());
        Ok(())
    };
    for path in models {
        let file = GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or_else(|| format!("{}: no file name", path.display()))?;

        let meta = with_metadata(&file, ARRAY_CAP).to_bytes();
        write(&format!("{stem}-meta.gguf"), &meta)?;
        let mut v2 = meta.clone();
        v2[4..8].copy_from_slice(&2u32.to_le_bytes());
        write(&format!("{stem}-meta-v2.gguf"), &v2)?;

        let mut tiny = with_metadata(&file, ARRAY_CAP);
        for t in file.tensors() {
            add_tiny(&mut tiny, t);
        }
        write(&format!("{stem}-tiny-tensors.gguf"), &tiny.to_bytes())?;

        let mut few = with_metadata(&file, SMALL_ARRAY_CAP);
        let mut types_seen = Vec::new();
        for t in file.tensors() {
            if !types_seen.contains(&t.ggml_type()) {
                types_seen.push(t.ggml_type());
                add_tiny(&mut few, t);
            }
        }
        let few = few.to_bytes();
        write(&format!("{stem}-few-tensors.gguf"), &few)?;
        for (i, cut) in cuts(&few)?.into_iter().enumerate() {
            write(&format!("{stem}-cut-{i}.gguf"), &few[..cut as usize])?;
        }
    }
    write("synthetic-all-types.gguf", &all_types().to_bytes())
}

/// Lengths at which to cut a file: half way to its tensor table, inside that table, and one
/// byte into its last tensor's data. None when it has no tensors.
fn cuts(bytes: &[u8]) -> Result<Vec<u64>, lucebox_gguf::Error> {
    let file = GgufFile::from_bytes(bytes.to_vec())?;
    let (Some(first), Some(last)) = (file.tensor_infos().first(), file.tensor_infos().last())
    else {
        return Ok(Vec::new());
    };
    let last_data = file.tensor_infos().iter().map(|t| t.offset()).max();
    Ok(vec![
        first.info_offset() / 2,
        last.info_offset() + 10,
        file.data_offset() + last_data.unwrap_or(0) + 1,
    ])
}

/// The file's metadata with arrays cut to `cap` entries and special-token ids kept below it.
fn with_metadata(file: &GgufFile, cap: usize) -> GgufWriter {
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata().iter() {
        let value = match value {
            Value::Array(a) => Value::Array(truncated(a, cap)),
            v if key.ends_with("_token_id") => match v.as_u64() {
                Some(id) if id >= cap as u64 => Value::U32(cap as u32 - 1),
                _ => v.clone(),
            },
            v => v.clone(),
        };
        w.metadata(key, value);
    }
    w
}

fn truncated(array: &Array, cap: usize) -> Array {
    macro_rules! cut {
        ($($variant:ident),*) => {
            match array {
                $(Array::$variant(v) => Array::$variant(v[..v.len().min(cap)].to_vec()),)*
            }
        };
    }
    cut!(
        U8, I8, U16, I16, U32, I32, F32, Bool, String, Array, U64, I64, F64
    )
}

/// The tensor shrunk to one block, keeping its name, type, number of dimensions and first bytes.
fn add_tiny(w: &mut GgufWriter, t: lucebox_gguf::TensorView<'_>) {
    let ty = t.ggml_type();
    let mut dims = vec![1; t.dims().len()];
    dims[0] = ty.block_len();
    let bytes = t.data()[..ty.block_bytes() as usize].to_vec();
    w.tensor(t.name(), &dims, ty, bytes);
}

/// One value of every metadata type, arrays of every element type, and arrays nested to the
/// deepest level accepted.
fn all_types() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", Value::String("llama".into()))
        .metadata("general.alignment", Value::U32(64))
        .metadata("llama.block_count", Value::U32(2))
        .metadata("t.u8", Value::U8(1))
        .metadata("t.i8", Value::I8(-1))
        .metadata("t.u16", Value::U16(2))
        .metadata("t.i16", Value::I16(-2))
        .metadata("t.u32", Value::U32(3))
        .metadata("t.i32", Value::I32(-3))
        .metadata("t.f32", Value::F32(0.5))
        .metadata("t.bool", Value::Bool(true))
        .metadata("t.string", Value::String("string".into()))
        .metadata("t.u64", Value::U64(4))
        .metadata("t.i64", Value::I64(-4))
        .metadata("t.f64", Value::F64(0.25))
        .metadata("a.u8", Value::Array(Array::U8(vec![1, 2])))
        .metadata("a.i8", Value::Array(Array::I8(vec![-1, 2])))
        .metadata("a.u16", Value::Array(Array::U16(vec![1, 2])))
        .metadata("a.i16", Value::Array(Array::I16(vec![-1, 2])))
        .metadata("a.u32", Value::Array(Array::U32(vec![1, 2])))
        .metadata("a.i32", Value::Array(Array::I32(vec![-1, 2])))
        .metadata("a.f32", Value::Array(Array::F32(vec![1.0, 2.0])))
        .metadata("a.bool", Value::Array(Array::Bool(vec![true, false])))
        .metadata("a.string", Value::Array(Array::String(vec!["x".into()])))
        .metadata("a.u64", Value::Array(Array::U64(vec![1, 2])))
        .metadata("a.i64", Value::Array(Array::I64(vec![-1, 2])))
        .metadata("a.f64", Value::Array(Array::F64(vec![1.0, 2.0])));
    let mut nested = Array::U8(vec![7]);
    for _ in 1..lucebox_gguf::MAX_ARRAY_DEPTH {
        nested = Array::Array(vec![nested]);
    }
    w.metadata("a.nested", Value::Array(nested));
    let tokens = ["<unk>", "<s>", "</s>", "a"].map(String::from).to_vec();
    w.metadata("tokenizer.ggml.model", Value::String("llama".into()))
        .metadata("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
        .metadata(
            "tokenizer.ggml.scores",
            Value::Array(Array::F32(vec![0.0; 4])),
        )
        .metadata(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![1; 4])),
        )
        .metadata("tokenizer.ggml.eos_token_id", Value::U32(2));
    for (i, &ty) in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4K]
        .iter()
        .enumerate()
    {
        let dims = [ty.block_len(), 2];
        let bytes = (0..2 * ty.block_bytes()).map(|b| b as u8).collect();
        w.tensor(format!("blk.{i}.{}", ty.name()), &dims, ty, bytes);
    }
    w
}
