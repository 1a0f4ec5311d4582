//! Prints a GGUF file's metadata (long arrays abbreviated) and tensor table.

use lucebox_gguf::{Array, GgufFile, Value};

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: gguf-dump FILE.gguf");
        std::process::exit(2);
    };
    let file = match GgufFile::open(&path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "version {} alignment {} data at {}",
        file.version(),
        file.alignment(),
        file.data_offset()
    );
    for (key, value) in file.metadata().iter() {
        match value {
            Value::Array(a) => println!("{key} = [{:?}; {}]", a.element_type(), a.len()),
            Value::String(s) if s.len() > 80 => println!(
                "{key} = {:?}... ({} bytes)",
                &s[..s.floor_char_boundary(80)],
                s.len()
            ),
            v => println!("{key} = {v:?}"),
        }
        if let Value::Array(Array::String(items)) = value {
            println!("    first: {:?}", &items[..items.len().min(5)]);
        }
    }
    for t in file.tensors() {
        println!(
            "{:<32} {:<8} {:?}",
            t.name(),
            t.ggml_type().name(),
            t.dims()
        );
    }
}
