use crate::ggml_type::GgmlType;
use crate::value::{Array, Value};

/// Builds a GGUF version 3 file in memory.
///
/// Used to write test fixtures, fuzzing seeds and metadata-only copies of real files. The writer
/// checks nothing: tests use it to produce malformed files on purpose.
#[derive(Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metadata entry.
    pub fn metadata(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        self.metadata.push((key.into(), value));
        self
    }

    /// Adds a tensor with dimensions in ggml order and its raw bytes.
    pub fn tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> &mut Self {
        self.tensors.push((name.into(), dims.to_vec(), ty, data));
        self
    }

    /// The encoded file. Tensor data is laid out in order, each aligned to `general.alignment`
    /// when that entry is a u32, else to 32 bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let alignment = self
            .metadata
            .iter()
            .find_map(|(k, v)| match (k.as_str(), v) {
                ("general.alignment", Value::U32(a)) if *a > 0 => Some(*a as usize),
                _ => None,
            })
            .unwrap_or(crate::DEFAULT_ALIGNMENT as usize);
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            out.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0usize;
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = (offset + data.len()).next_multiple_of(alignment);
        }
        if !self.tensors.is_empty() {
            out.resize(out.len().next_multiple_of(alignment), 0);
            for (_, _, _, data) in &self.tensors {
                out.extend_from_slice(data);
                out.resize(out.len().next_multiple_of(alignment), 0);
            }
        }
        out
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(v) => put_str(out, v),
        Value::Array(a) => put_array(out, a),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, array: &Array) {
    out.extend_from_slice(&(array.element_type() as u32).to_le_bytes());
    out.extend_from_slice(&(array.len() as u64).to_le_bytes());
    macro_rules! each {
        ($items:expr, $variant:ident) => {
            for item in $items {
                put_value(out, &Value::$variant(item.clone()));
            }
        };
    }
    match array {
        Array::U8(v) => each!(v, U8),
        Array::I8(v) => each!(v, I8),
        Array::U16(v) => each!(v, U16),
        Array::I16(v) => each!(v, I16),
        Array::U32(v) => each!(v, U32),
        Array::I32(v) => each!(v, I32),
        Array::F32(v) => each!(v, F32),
        Array::Bool(v) => each!(v, Bool),
        Array::String(v) => each!(v, String),
        Array::Array(v) => {
            for inner in v {
                put_array(out, inner);
            }
        }
        Array::U64(v) => each!(v, U64),
        Array::I64(v) => each!(v, I64),
        Array::F64(v) => each!(v, F64),
    }
}
