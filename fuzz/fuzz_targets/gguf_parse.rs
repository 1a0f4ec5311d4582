//! Parses the input as a GGUF file; an accepted file must then be readable in every part through
//! the public API, and a refused one must give an error that points inside the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lucebox_gguf::{GgufFile, Value};

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    match GgufFile::from_bytes(data.to_vec()) {
        Ok(file) => read_everything(&file, len),
        Err(e) => {
            assert!(e.offset() <= len, "error points past the input: {e}");
            assert!(!e.to_string().is_empty());
        }
    }
});

fn read_everything(file: &GgufFile, len: u64) {
    let m = file.metadata();
    for (key, value) in m.iter() {
        assert!(m.offset_of(key) < len);
        assert_eq!(m.get(key), Some(value));
        // Every typed accessor either returns the value or an error naming this key.
        for e in [
            m.str(key).err(),
            m.uint(key).err(),
            m.float(key).err(),
            m.opt_bool(key).err(),
            m.array(key).err(),
            m.str_array(key).err(),
            m.f32_array(key).err(),
            m.i32_array(key).err(),
        ]
        .into_iter()
        .flatten()
        {
            assert_eq!(e.field(), key);
            assert_eq!(e.offset(), m.offset_of(key));
        }
        if let Value::Array(a) = value {
            assert_eq!(m.array(key).map(|a| a.len()).ok(), Some(a.len()));
        }
    }
    assert!(file.alignment().is_power_of_two());
    assert_eq!(file.data_offset() % file.alignment(), 0);
    for t in file.tensors() {
        let info = t.info();
        assert_eq!(t.data().len() as u64, info.byte_len());
        assert_eq!(
            Some(info.byte_len()),
            t.ggml_type().bytes_for(info.elements())
        );
        assert_eq!(info.offset() % file.alignment(), 0);
        assert!(file.data_offset() + info.offset() + info.byte_len() <= len);
        assert_eq!(
            file.tensor(t.name()).map(|v| v.info().info_offset()),
            Some(info.info_offset())
        );
    }
}
