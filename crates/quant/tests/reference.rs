//! The dequantizers against the independent reference, gguf-py's `gguf.quants.dequantize`
//! (run through tests/quant/dequantize.py), on random blocks, on real weights requantized to the
//! formats no fetched model holds (tests/quant/requantized.gguf), and on the fetched models'
//! weights. On the real weights, every ISA's dot product is also checked against an f64 dot of
//! gguf-py's dequantized weights.

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{Rng, random_activations, random_row};
use lucebox_gguf::GgufFile;
use lucebox_quant::{GgmlType, Isa, WeightFormat};

/// Rows of one tensor: raw bytes of whole rows of `n` elements.
struct Rows {
    name: String,
    ty: GgmlType,
    n: usize,
    bytes: Vec<u8>,
}

/// A directory of its own under the system's temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "lucebox-quant-{}-{}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// gguf-py's dequantization of each set of rows.
fn python_dequantize(jobs: &[Rows]) -> Vec<Vec<f32>> {
    let dir = TempDir::new();
    let script = lucebox_testkit::repo_root().join("tests/quant/dequantize.py");
    let mut command = lucebox_testkit::python();
    command.arg(script);
    for (i, job) in jobs.iter().enumerate() {
        let input = dir.0.join(format!("{i}.bin"));
        std::fs::write(&input, &job.bytes).unwrap();
        command
            .arg(job.ty.name())
            .arg(input)
            .arg(dir.0.join(format!("{i}.f32")));
    }
    let output = command.output().expect("runs the Python interpreter");
    assert!(
        output.status.success(),
        "tests/quant/dequantize.py failed ({}); does the interpreter have the packages of \
         tests/requirements.txt?\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    (0..jobs.len())
        .map(|i| {
            let bytes = std::fs::read(dir.0.join(format!("{i}.f32"))).unwrap();
            bytes
                .as_chunks::<4>()
                .0
                .iter()
                .map(|b| f32::from_le_bytes(*b))
                .collect()
        })
        .collect()
}

/// Checks that our dequantization of every job equals gguf-py's, value for value.
fn check_dequantization(jobs: &[Rows]) {
    let references = python_dequantize(jobs);
    for (job, reference) in jobs.iter().zip(&references) {
        let format = WeightFormat::new(job.ty, Isa::Scalar).unwrap();
        let mut values = vec![0.0; reference.len()];
        format.dequantize(&job.bytes, &mut values);
        for (i, (&ours, &theirs)) in values.iter().zip(reference).enumerate() {
            assert!(
                ours == theirs || (ours.is_nan() && theirs.is_nan()),
                "{} ({}): element {i} (row {}, column {}) is {ours}, gguf-py says {theirs}",
                job.name,
                job.ty,
                i / job.n,
                i % job.n
            );
        }
    }
    check_dots(jobs, &references);
}

/// Checks every ISA's dot product of each row with random activations against an f64 dot of
/// gguf-py's dequantized row and the dequantized activations.
fn check_dots(jobs: &[Rows], references: &[Vec<f32>]) {
    for (job, reference) in jobs.iter().zip(references) {
        let x = random_activations(&mut Rng::new(job.n as u64), job.n);
        for isa in Isa::ALL.iter().copied().filter(|isa| isa.is_available()) {
            let format = WeightFormat::new(job.ty, isa).unwrap();
            let row_bytes = format.kernel_row_bytes(job.n);
            let kernel_rows = format.repack_rows(&job.bytes, job.n);
            let activation_format = format.activation_format();
            let mut activation = vec![0; activation_format.row_bytes(job.n)];
            format.quantize_activation(&x, &mut activation);
            let mut a = vec![0.0; job.n];
            activation_format.dequantize(&activation, &mut a);
            let rows = kernel_rows
                .chunks_exact(row_bytes)
                .zip(reference.chunks_exact(job.n));
            for (r, (row, w)) in rows.enumerate() {
                let dot = f64::from(format.dot(row, &activation));
                let products = w.iter().zip(&a).map(|(&w, &a)| f64::from(w) * f64::from(a));
                let exact: f64 = products.clone().sum();
                let magnitude: f64 = products.map(f64::abs).sum();
                // Formats with minimums subtract two terms that can each exceed the products.
                let tolerance = 1e-5 * magnitude + 1e-6 * exact.abs() + 1e-30;
                assert!(
                    (dot - exact).abs() <= tolerance,
                    "{} ({}) {isa} row {r}: dot {dot}, f64 reference {exact}",
                    job.name,
                    job.ty
                );
            }
        }
    }
}

#[test]
#[ignore = "needs the Python reference tools (tests/requirements.txt); run by tests/run-all"]
fn dequantization_matches_gguf_py_on_random_blocks() {
    let jobs: Vec<Rows> = WeightFormat::supported_types()
        .iter()
        .map(|&ty| {
            let n = 2048;
            let mut rng = Rng::new(ty.id().into());
            let bytes = (0..4).flat_map(|_| random_row(&mut rng, ty, n)).collect();
            Rows {
                name: format!("random {ty}"),
                ty,
                n,
                bytes,
            }
        })
        .collect();
    check_dequantization(&jobs);
}

/// Every tensor of `file` whose type has kernels, as whole rows: all of a small tensor, else
/// four rows from its start, middle and end.
fn sample_rows(file: &GgufFile, names: impl Fn(&str) -> bool) -> Vec<Rows> {
    let mut jobs = Vec::new();
    for tensor in file.tensors().filter(|t| names(t.name())) {
        let ty = tensor.ggml_type();
        if WeightFormat::new(ty, Isa::Scalar).is_err() {
            continue;
        }
        let n = tensor.dims()[0] as usize;
        let row_bytes = ty.bytes_for(n as u64).unwrap() as usize;
        let data = tensor.data();
        let rows = data.len() / row_bytes;
        let picked: Vec<usize> = if rows <= 12 {
            (0..rows).collect()
        } else {
            let middle = rows / 2;
            (0..4)
                .chain(middle..middle + 4)
                .chain(rows - 4..rows)
                .collect()
        };
        let bytes = picked
            .iter()
            .flat_map(|&r| &data[r * row_bytes..(r + 1) * row_bytes])
            .copied()
            .collect();
        jobs.push(Rows {
            name: tensor.name().to_string(),
            ty,
            n,
            bytes,
        });
    }
    jobs
}

#[test]
#[ignore = "needs the Python reference tools (tests/requirements.txt); run by tests/run-all"]
fn dequantization_matches_gguf_py_on_requantized_weights() {
    let path = lucebox_testkit::repo_root().join("tests/quant/requantized.gguf");
    let file = GgufFile::open(&path).unwrap();
    let jobs = sample_rows(&file, |_| true);
    let types: Vec<GgmlType> = jobs.iter().map(|job| job.ty).collect();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q5_1,
        GgmlType::F16,
        GgmlType::Bf16,
        GgmlType::Q5K,
        GgmlType::Iq4Xs,
    ] {
        assert!(
            types.contains(&ty),
            "{} holds no {ty} tensor",
            path.display()
        );
    }
    check_dequantization(&jobs);
}

/// Two tensors of each type in a fetched model: the first and the last of that type.
fn model_samples(model: &str) -> Vec<Rows> {
    let file = GgufFile::open(lucebox_testkit::model(model)).unwrap();
    let all = sample_rows(&file, |_| true);
    let mut picked: Vec<Rows> = Vec::new();
    for &ty in WeightFormat::supported_types() {
        let mut of_type = all.iter().filter(|job| job.ty == ty);
        let first = of_type.next();
        let last = of_type.next_back();
        for job in first.into_iter().chain(last) {
            picked.push(Rows {
                name: job.name.clone(),
                ty,
                n: job.n,
                bytes: job.bytes.clone(),
            });
        }
    }
    picked
}

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn dequantization_matches_gguf_py_on_model_weights() {
    let mut jobs = Vec::new();
    let mut types = Vec::new();
    for model in [
        "smollm2-135m-instruct-q4_1",
        "qwen2.5-coder-0.5b-instruct-q4_k_m",
        "qwen2.5-coder-1.5b-instruct-q4_k_m",
    ] {
        let samples = model_samples(model);
        types.extend(samples.iter().map(|job| job.ty));
        jobs.extend(samples);
    }
    for ty in [
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_1,
        GgmlType::F32,
    ] {
        assert!(types.contains(&ty), "the models hold no {ty} tensor");
    }
    check_dequantization(&jobs);
}
