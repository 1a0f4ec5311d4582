use std::collections::HashMap;

use crate::error::{Error, ErrorKind};
use crate::value::{Array, Value};

/// The key/value metadata of a GGUF file, in file order.
///
/// Each entry remembers the byte offset at which it starts, so that a consumer that finds a value
/// it cannot use can say where it is with [`Metadata::invalid`].
#[derive(Debug, Default)]
pub struct Metadata {
    entries: Vec<Entry>,
    index: HashMap<String, usize>,
    /// Where the metadata section starts: the place reported for keys that are missing.
    section_offset: u64,
}

#[derive(Debug)]
struct Entry {
    key: String,
    value: Value,
    offset: u64,
}

impl Metadata {
    pub(crate) fn new(section_offset: u64) -> Self {
        Self {
            section_offset,
            ..Self::default()
        }
    }

    /// Adds an entry; `false` when the key is already present.
    pub(crate) fn insert(&mut self, key: String, value: Value, offset: u64) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push(Entry { key, value, offset });
        true
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries as (key, value) in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|e| (e.key.as_str(), &e.value))
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].value)
    }

    /// The byte offset at which the entry for `key` starts, or where the metadata section starts
    /// when the key is absent.
    pub fn offset_of(&self, key: &str) -> u64 {
        self.index
            .get(key)
            .map_or(self.section_offset, |&i| self.entries[i].offset)
    }

    /// An error saying that the value of `key` is unusable, and why.
    pub fn invalid(&self, key: &str, why: impl Into<String>) -> Error {
        Error::invalid(key, self.offset_of(key), why)
    }

    fn missing(&self, key: &str) -> Error {
        Error::new(ErrorKind::Missing, key, self.section_offset)
    }

    pub(crate) fn wrong_type(&self, key: &str, expected: &'static str, found: &Value) -> Error {
        let found = match found {
            Value::Array(a) => array_type_name(a),
            v => v.value_type().name(),
        };
        self.wrong_type_named(key, expected, found)
    }

    fn wrong_type_named(&self, key: &str, expected: &'static str, found: &'static str) -> Error {
        Error::new(
            ErrorKind::WrongType { expected, found },
            key,
            self.offset_of(key),
        )
    }

    fn require(&self, key: &str) -> Result<&Value, Error> {
        self.get(key).ok_or_else(|| self.missing(key))
    }

    /// A string value.
    pub fn str(&self, key: &str) -> Result<&str, Error> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            v => Err(self.wrong_type(key, "string", v)),
        }
    }

    /// A string value, or `None` when the key is absent.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, Error> {
        self.optional(key, Self::str)
    }

    /// A non-negative integer of any width.
    pub fn uint(&self, key: &str) -> Result<u64, Error> {
        let v = self.require(key)?;
        v.as_u64()
            .ok_or_else(|| self.wrong_type(key, "non-negative integer", v))
    }

    /// A non-negative integer of any width, or `None` when the key is absent.
    pub fn opt_uint(&self, key: &str) -> Result<Option<u64>, Error> {
        self.optional(key, Self::uint)
    }

    /// A float of either width.
    pub fn float(&self, key: &str) -> Result<f64, Error> {
        let v = self.require(key)?;
        v.as_f64().ok_or_else(|| self.wrong_type(key, "float", v))
    }

    /// A float of either width, or `None` when the key is absent.
    pub fn opt_float(&self, key: &str) -> Result<Option<f64>, Error> {
        self.optional(key, Self::float)
    }

    /// A boolean, or `None` when the key is absent.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, Error> {
        self.optional(key, |m, k| match m.require(k)? {
            Value::Bool(b) => Ok(*b),
            v => Err(m.wrong_type(k, "bool", v)),
        })
    }

    /// An array of any element type.
    pub fn array(&self, key: &str) -> Result<&Array, Error> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            v => Err(self.wrong_type(key, "array", v)),
        }
    }

    /// An array of strings.
    pub fn str_array(&self, key: &str) -> Result<&[String], Error> {
        match self.array(key)? {
            Array::String(v) => Ok(v),
            a => Err(self.wrong_type_named(key, "array of string", array_type_name(a))),
        }
    }

    /// An array of `f32`.
    pub fn f32_array(&self, key: &str) -> Result<&[f32], Error> {
        match self.array(key)? {
            Array::F32(v) => Ok(v),
            a => Err(self.wrong_type_named(key, "array of f32", array_type_name(a))),
        }
    }

    /// An array of `i32`.
    pub fn i32_array(&self, key: &str) -> Result<&[i32], Error> {
        match self.array(key)? {
            Array::I32(v) => Ok(v),
            a => Err(self.wrong_type_named(key, "array of i32", array_type_name(a))),
        }
    }

    fn optional<'a, T>(
        &'a self,
        key: &str,
        read: impl FnOnce(&'a Self, &str) -> Result<T, Error>,
    ) -> Result<Option<T>, Error> {
        if self.get(key).is_some() {
            read(self, key).map(Some)
        } else {
            Ok(None)
        }
    }
}

fn array_type_name(a: &Array) -> &'static str {
    use crate::value::ValueType::*;
    match a.element_type() {
        U8 => "array of u8",
        I8 => "array of i8",
        U16 => "array of u16",
        I16 => "array of i16",
        U32 => "array of u32",
        I32 => "array of i32",
        F32 => "array of f32",
        Bool => "array of bool",
        String => "array of string",
        Array => "array of array",
        U64 => "array of u64",
        I64 => "array of i64",
        F64 => "array of f64",
    }
}
