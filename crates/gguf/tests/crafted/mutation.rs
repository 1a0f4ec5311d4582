//! Random corruption of a valid file: whatever the bytes, parsing gives a file whose every part
//! can be read, or an error that points inside the file — never a panic.

use lucebox_gguf::{GgufFile, Value};

use super::small_valid_file;

/// xorshift64*: a fixed seed makes every run test the same corruptions, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Reads everything an accepted file offers through the public API, checking what it promises.
fn read_everything(file: &GgufFile, len: usize) {
    let m = file.metadata();
    for (key, value) in m.iter() {
        assert!(m.offset_of(key) < len as u64);
        assert_eq!(m.get(key), Some(value));
        let _ = (m.str(key), m.uint(key), m.float(key), m.opt_bool(key));
        if let Value::Array(a) = value {
            assert_eq!(m.array(key).map(|a| a.len()).ok(), Some(a.len()));
            let _ = (m.str_array(key), m.f32_array(key), m.i32_array(key));
        }
    }
    assert_eq!(file.data_offset() % file.alignment(), 0);
    for t in file.tensors() {
        assert_eq!(t.data().len() as u64, t.info().byte_len());
        assert_eq!(
            t.info().byte_len(),
            t.ggml_type().bytes_for(t.info().elements()).unwrap()
        );
        assert!(file.data_offset() + t.info().offset() + t.info().byte_len() <= len as u64);
        assert_eq!(file.tensor(t.name()).unwrap().name(), t.name());
    }
}

#[test]
fn random_byte_flips_never_panic() {
    let original = small_valid_file();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..20_000 {
        let mut bytes = original.clone();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(bytes.len());
            // Half the time one bit, else a whole random byte: single bits reach the checks on
            // small values, whole bytes the ones on lengths and counts.
            if rng.below(2) == 0 {
                bytes[i] ^= 1 << rng.below(8);
            } else {
                bytes[i] = rng.next() as u8;
            }
        }
        let len = bytes.len();
        match GgufFile::from_bytes(bytes) {
            Ok(file) => {
                read_everything(&file, len);
                accepted += 1;
            }
            Err(e) => {
                assert!(e.offset() <= len as u64, "{e}");
                assert!(!e.to_string().is_empty());
                refused += 1;
            }
        }
    }
    // Flips inside tensor data or string contents leave a valid file, most others do not: both
    // outcomes must have been exercised for the test to mean anything.
    assert!(
        accepted > 1000 && refused > 1000,
        "{accepted} accepted, {refused} refused"
    );
}
