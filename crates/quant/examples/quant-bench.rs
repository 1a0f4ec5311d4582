//! Single-thread dot-product throughput per weight format and ISA level.
//!
//! For each matrix shape it quantizes one activation row, then takes the dot product of every
//! weight row with it, over and over, and prints GB/s of weight bytes read and rows per second.
//! With `--batch B` it quantizes B activation rows and takes each weight row's dot products with
//! all of them at once (`WeightFormat::dot_matrix` over runs of rows, as a prefill's matmuls);
//! rows/s then counts dot products (weight rows times activation rows) per second. Each row of
//! the table is one activation precision (`--precisions`, both by default: the single-part
//! figures beside the split ones of the same run).
//! Shapes: `l1` (about 16 KiB of weights: the arithmetic alone), `l2` (about 512 KiB),
//! `ffn_up` (8960 rows of 1536, as in Qwen2.5 1.5B), `ffn_down` (1536 rows of 8960), and `dram`
//! (`--dram-mib` MiB of rows of 1536, larger than the caches; 0 skips it).
//!
//! ```text
//! cargo run --release -p lucebox-quant --example quant-bench -- \
//!     [--types Q4_K,Q6_K] [--isas avx2,avx512] [--seconds 0.5] [--dram-mib 1024] [--batch 1] \
//!     [--precisions split,single]
//! ```

use std::borrow::Cow;
use std::hint::black_box;
use std::time::{Duration, Instant};

use lucebox_quant::{ActivationPrecision, GgmlType, Isa, WeightFormat};

struct Options {
    types: Vec<GgmlType>,
    isas: Vec<Isa>,
    precisions: Vec<ActivationPrecision>,
    seconds: f64,
    dram_mib: usize,
    batch: usize,
}

fn parse() -> Result<Options, String> {
    let mut options = Options {
        types: ["Q4_K", "Q6_K", "Q5_0", "Q8_0", "Q4_1"]
            .iter()
            .map(|name| type_named(name))
            .collect::<Result<_, _>>()?,
        isas: Isa::ALL
            .iter()
            .copied()
            .filter(|isa| isa.is_available())
            .collect(),
        precisions: vec![ActivationPrecision::Split, ActivationPrecision::Single],
        seconds: 0.5,
        dram_mib: 1024,
        batch: 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--types" if value == "all" => {
                options.types = WeightFormat::supported_types().to_vec();
            }
            "--types" => {
                options.types = value.split(',').map(type_named).collect::<Result<_, _>>()?;
            }
            "--isas" => {
                options.isas = value.split(',').map(isa_named).collect::<Result<_, _>>()?;
            }
            "--precisions" => {
                options.precisions = value
                    .split(',')
                    .map(precision_named)
                    .collect::<Result<_, _>>()?;
            }
            "--seconds" => {
                options.seconds = value
                    .parse()
                    .map_err(|e| format!("--seconds {value}: {e}"))?;
            }
            "--dram-mib" => {
                options.dram_mib = value
                    .parse()
                    .map_err(|e| format!("--dram-mib {value}: {e}"))?;
            }
            "--batch" => {
                options.batch = value.parse().map_err(|e| format!("--batch {value}: {e}"))?;
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(options)
}

fn precision_named(name: &str) -> Result<ActivationPrecision, String> {
    match name {
        "split" => Ok(ActivationPrecision::Split),
        "single" => Ok(ActivationPrecision::Single),
        _ => Err(format!("--precisions {name}: not split or single")),
    }
}

fn type_named(name: &str) -> Result<GgmlType, String> {
    GgmlType::ALL
        .iter()
        .copied()
        .find(|ty| ty.name().eq_ignore_ascii_case(name))
        .ok_or(format!("unknown type {name}"))
}

fn isa_named(name: &str) -> Result<Isa, String> {
    Isa::ALL
        .iter()
        .copied()
        .find(|isa| isa.name() == name)
        .ok_or(format!("unknown isa {name}"))
}

/// Random bytes (xorshift64*) with every f16 field set to a small finite value: the kernels'
/// speed does not depend on the values, but NaNs and infinities could slow the float units.
fn random_weights(ty: GgmlType, rows: usize, n: usize) -> Vec<u8> {
    let row_bytes = ty.bytes_for(n as u64).expect("whole blocks") as usize;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut bytes: Vec<u8> = (0..rows * row_bytes / 8)
        .flat_map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes()
        })
        .collect();
    bytes.resize(rows * row_bytes, 0);
    let small = half::f16::from_f32(0.01).to_le_bytes();
    let (f16_fields, stride): (&[usize], usize) = match ty {
        GgmlType::F32 => {
            for value in bytes.as_chunks_mut::<4>().0 {
                *value = 0.01f32.to_le_bytes();
            }
            (&[], 1)
        }
        GgmlType::F16 | GgmlType::Bf16 => (&[0], 2),
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => (&[0, 2], 0),
        GgmlType::Q6K => (&[208], 0),
        _ => (&[0], 0),
    };
    let stride = if stride == 0 {
        ty.block_bytes() as usize
    } else {
        stride
    };
    for block in bytes.chunks_exact_mut(stride) {
        for &offset in f16_fields {
            block[offset..offset + 2].copy_from_slice(&small);
        }
    }
    bytes
}

/// The weights as `format`'s kernels take them: repacked where the format repacks.
fn kernel_weights<'a>(format: &WeightFormat, gguf: &'a [u8], n: usize) -> Cow<'a, [u8]> {
    if format.repacks() {
        Cow::Owned(format.repack_rows(gguf, n))
    } else {
        Cow::Borrowed(gguf)
    }
}

struct Measurement {
    rows_per_second: f64,
    gigabytes_per_second: f64,
}

/// Weight bytes per timed chunk: short enough that, on a busy machine, some repetitions of each
/// chunk run without being preempted. Each chunk's best time counts.
const CHUNK_BYTES: usize = 256 << 10;

fn measure(
    format: &WeightFormat,
    weights: &[u8],
    rows: usize,
    n: usize,
    options: &Options,
) -> Measurement {
    let row_bytes = weights.len() / rows;
    let activation_bytes = format.activation_format().row_bytes(n);
    let mut activations = vec![0; activation_bytes * options.batch];
    for (b, activation) in activations.chunks_exact_mut(activation_bytes).enumerate() {
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 + b * 31) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        format.quantize_activation(&x, activation);
    }
    let chunk_rows = (CHUNK_BYTES / row_bytes).max(1);
    let mut out = vec![0.0; chunk_rows * options.batch];
    let chunks: Vec<&[u8]> = weights.chunks(chunk_rows * row_bytes).collect();
    let mut best = vec![Duration::MAX; chunks.len()];
    let budget = Duration::from_secs_f64(options.seconds);
    let start = Instant::now();
    let mut passes = 0;
    while passes < 3 || start.elapsed() < budget {
        for (chunk, best) in chunks.iter().zip(&mut best) {
            let chunk_start = Instant::now();
            if options.batch == 1 {
                let mut sum = 0.0;
                for row in chunk.chunks_exact(row_bytes) {
                    sum += format.dot(black_box(row), &activations);
                }
                black_box(sum);
            } else {
                let out = &mut out[..chunk.len() / row_bytes * options.batch];
                format.dot_matrix(black_box(chunk), row_bytes, &activations, out);
                black_box(out);
            }
            *best = (*best).min(chunk_start.elapsed());
        }
        passes += 1;
    }
    let elapsed = best.iter().sum::<Duration>().as_secs_f64();
    Measurement {
        rows_per_second: (rows * options.batch) as f64 / elapsed,
        gigabytes_per_second: weights.len() as f64 / elapsed / 1e9,
    }
}

fn main() {
    let options = match parse() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("quant-bench: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "{:<7} {:<7} {:<7} {:<9} {:>6} {:>6} {:>9} {:>8} {:>12}",
        "type", "isa", "acts", "shape", "rows", "n", "MiB", "GB/s", "rows/s"
    );
    for &ty in &options.types {
        let mut shapes = vec![("ffn_up", 8960, 1536), ("ffn_down", 1536, 8960)];
        let row_bytes_1536 = ty.bytes_for(1536).expect("1536 is whole blocks") as usize;
        shapes.insert(0, ("l2", (512 << 10) / row_bytes_1536, 1536));
        shapes.insert(0, ("l1", (16 << 10) / row_bytes_1536, 1536));
        if options.dram_mib > 0 {
            shapes.push(("dram", (options.dram_mib << 20) / row_bytes_1536, 1536));
        }
        for (shape, rows, n) in shapes {
            let weights = random_weights(ty, rows, n);
            let kernels = options
                .isas
                .iter()
                .flat_map(|&isa| options.precisions.iter().map(move |&p| (isa, p)));
            for (isa, precision) in kernels {
                let format = match WeightFormat::with_precision(ty, isa, precision) {
                    Ok(format) => format,
                    Err(e) => {
                        eprintln!("quant-bench: {e}");
                        continue;
                    }
                };
                let weights = kernel_weights(&format, &weights, n);
                let m = measure(&format, &weights, rows, n, &options);
                println!(
                    "{:<7} {:<7} {:<7} {:<9} {:>6} {:>6} {:>9.2} {:>8.2} {:>12.0}",
                    ty.name(),
                    isa.name(),
                    match precision {
                        ActivationPrecision::Split => "split",
                        ActivationPrecision::Single => "single",
                    },
                    shape,
                    rows,
                    n,
                    weights.len() as f64 / (1 << 20) as f64,
                    m.gigabytes_per_second,
                    m.rows_per_second
                );
            }
        }
    }
}
