//! Every format on every available ISA: dot products against the portable kernels and against an
//! f64 dot of the dequantized operands, and the activation quantizers' round trip.

mod common;

use common::{Rng, random_activations, random_row};
use lucebox_quant::{ActivationFormat, GgmlType, Isa, UnsupportedType, WeightFormat};

fn available_isas() -> impl Iterator<Item = Isa> {
    Isa::ALL.iter().copied().filter(|isa| isa.is_available())
}

/// Row lengths for a type: one block, a few, a model-sized row, and for the float types lengths
/// that leave a tail after the SIMD loops.
fn lengths(ty: GgmlType) -> Vec<usize> {
    match ty.block_len() as usize {
        1 => vec![1, 7, 8, 37, 64, 1000, 1536],
        32 => vec![32, 96, 1536],
        block => vec![block, 3 * block, 1536, 8960],
    }
}

/// A row with everything the checks need.
struct Case {
    ty: GgmlType,
    row: Vec<u8>,
    x: Vec<f32>,
    /// The activations quantized by the portable quantizer.
    activation: Vec<u8>,
    /// The dequantized weights and activations.
    w: Vec<f32>,
    a: Vec<f32>,
}

impl Case {
    fn new(ty: GgmlType, n: usize, seed: u64) -> Case {
        let mut rng = Rng::new(seed);
        let row = random_row(&mut rng, ty, n);
        let x = random_activations(&mut rng, n);
        let scalar = WeightFormat::new(ty, Isa::Scalar).unwrap();
        let format = scalar.activation_format();
        let mut activation = vec![0; format.row_bytes(n)];
        scalar.quantize_activation(&x, &mut activation);
        let mut w = vec![0.0; n];
        scalar.dequantize(&row, &mut w);
        let mut a = vec![0.0; n];
        format.dequantize(&activation, &mut a);
        Case {
            ty,
            row,
            x,
            activation,
            w,
            a,
        }
    }

    /// The size against which rounding errors are measured: per weight block, its largest
    /// magnitude times the magnitudes of its activations (this bounds both terms of a format
    /// with minimums, which may cancel).
    fn magnitude(&self) -> f64 {
        let block = (self.ty.block_len() as usize).max(32);
        let w = self.w.chunks(block);
        w.zip(self.a.chunks(block))
            .map(|(w, a)| {
                let largest = w.iter().fold(0.0f64, |m, &v| m.max(f64::from(v).abs()));
                largest * a.iter().map(|&v| f64::from(v).abs()).sum::<f64>()
            })
            .sum()
    }

    fn exact_dot(&self) -> f64 {
        self.w
            .iter()
            .zip(&self.a)
            .map(|(&w, &a)| f64::from(w) * f64::from(a))
            .sum()
    }
}

#[test]
fn scalar_dot_equals_f64_dot_of_the_dequantized_operands() {
    for &ty in WeightFormat::supported_types() {
        let scalar = WeightFormat::new(ty, Isa::Scalar).unwrap();
        for n in lengths(ty) {
            for seed in 0..4 {
                let case = Case::new(ty, n, seed * 7919 + n as u64);
                let dot = f64::from(scalar.dot(&case.row, &case.activation));
                let exact = case.exact_dot();
                let tolerance = 2e-6 * case.magnitude();
                assert!(
                    (dot - exact).abs() <= tolerance,
                    "{ty} n={n} seed={seed}: {dot} vs {exact} (tolerance {tolerance})"
                );
            }
        }
    }
}

#[test]
fn dot_is_within_the_activation_quantization_error_of_the_f32_dot() {
    for &ty in WeightFormat::supported_types() {
        let scalar = WeightFormat::new(ty, Isa::Scalar).unwrap();
        let block = scalar.activation_format().block_len();
        for n in lengths(ty) {
            let case = Case::new(ty, n, n as u64);
            let dot = f64::from(scalar.dot(&case.row, &case.activation));
            let exact: f64 = case
                .w
                .iter()
                .zip(&case.x)
                .map(|(&w, &x)| f64::from(w) * f64::from(x))
                .sum();
            // Each activation is off by at most half a step of its block.
            let mut bound = 2e-6 * case.magnitude();
            for (w, x) in case.w.chunks(block).zip(case.x.chunks(block)) {
                let step = match scalar.activation_format() {
                    ActivationFormat::F32 => 0.0,
                    _ => x.iter().fold(0.0f64, |m, &v| m.max(f64::from(v).abs())) / 127.0,
                };
                bound += step / 2.0 * w.iter().map(|&v| f64::from(v).abs()).sum::<f64>();
            }
            assert!(
                (dot - exact).abs() <= bound,
                "{ty} n={n}: {dot} vs {exact} (bound {bound})"
            );
        }
    }
}

#[test]
fn simd_dot_agrees_with_scalar_dot() {
    for &ty in WeightFormat::supported_types() {
        let scalar = WeightFormat::new(ty, Isa::Scalar).unwrap();
        for isa in available_isas() {
            let format = WeightFormat::new(ty, isa).unwrap();
            assert_eq!(format.activation_format(), scalar.activation_format());
            for n in lengths(ty) {
                for seed in 0..4 {
                    let case = Case::new(ty, n, seed * 104_729 + n as u64);
                    let expected = f64::from(scalar.dot(&case.row, &case.activation));
                    let dot = f64::from(format.dot(&case.row, &case.activation));
                    let tolerance = 1e-6 * case.magnitude();
                    assert!(
                        (dot - expected).abs() <= tolerance,
                        "{ty} {isa} n={n} seed={seed}: {dot} vs {expected} (tolerance {tolerance})"
                    );
                }
            }
        }
    }
}

const ACTIVATION_FORMATS: [(ActivationFormat, GgmlType); 3] = [
    (ActivationFormat::F32, GgmlType::F32),
    (ActivationFormat::Q8Block32, GgmlType::Q8_0),
    (ActivationFormat::Q8Block256, GgmlType::Q4K),
];

#[test]
fn quantized_activations_round_trip_within_half_a_step() {
    for (format, ty) in ACTIVATION_FORMATS {
        let block = format.block_len();
        for isa in available_isas() {
            let quantizer = WeightFormat::new(ty, isa).unwrap();
            for n in [block, 4 * block, 2048] {
                let x = random_activations(&mut Rng::new(n as u64), n);
                let mut q = vec![0; format.row_bytes(n)];
                quantizer.quantize_activation(&x, &mut q);
                let mut back = vec![0.0; n];
                format.dequantize(&q, &mut back);
                for (i, (x, back)) in x.chunks(block).zip(back.chunks(block)).enumerate() {
                    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    let step = if format == ActivationFormat::F32 {
                        0.0
                    } else {
                        amax / 127.0
                    };
                    for (&x, &back) in x.iter().zip(back) {
                        let error = (x - back).abs();
                        assert!(
                            error <= step * 0.5001 + amax * 1e-7,
                            "{format:?} {isa} block {i}: {x} became {back} (step {step})"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn every_isa_quantizes_activations_to_the_same_bytes() {
    for (format, ty) in ACTIVATION_FORMATS {
        let n = 4096;
        let x = random_activations(&mut Rng::new(3), n);
        let mut expected = vec![0; format.row_bytes(n)];
        WeightFormat::new(ty, Isa::Scalar)
            .unwrap()
            .quantize_activation(&x, &mut expected);
        for isa in available_isas() {
            let mut got = vec![0; format.row_bytes(n)];
            WeightFormat::new(ty, isa)
                .unwrap()
                .quantize_activation(&x, &mut got);
            assert!(got == expected, "{format:?} {isa}");
        }
    }
}

#[test]
fn blocks_with_sums_record_them() {
    let x = random_activations(&mut Rng::new(5), 256);
    for isa in available_isas() {
        let q8_0 = WeightFormat::new(GgmlType::Q8_0, isa).unwrap();
        let mut q = vec![0; ActivationFormat::Q8Block32.row_bytes(256)];
        q8_0.quantize_activation(&x, &mut q);
        for block in q.chunks_exact(ActivationFormat::Q8Block32.block_bytes()) {
            let sum: i32 = block[..32].iter().map(|&v| i32::from(v as i8)).sum();
            let d = f32::from_le_bytes(block[32..36].try_into().unwrap());
            let recorded = f32::from_le_bytes(block[36..40].try_into().unwrap());
            assert_eq!(recorded, d * sum as f32, "{isa}");
        }
        let q4_k = WeightFormat::new(GgmlType::Q4K, isa).unwrap();
        let mut q = vec![0; ActivationFormat::Q8Block256.row_bytes(256)];
        q4_k.quantize_activation(&x, &mut q);
        for g in 0..16 {
            let sum: i32 = q[16 * g..16 * g + 16]
                .iter()
                .map(|&v| i32::from(v as i8))
                .sum();
            let recorded = i16::from_le_bytes([q[256 + 2 * g], q[257 + 2 * g]]);
            assert_eq!(i32::from(recorded), sum, "{isa} group {g}");
        }
    }
}

#[test]
fn zero_activations_give_zero() {
    for &ty in WeightFormat::supported_types() {
        for isa in available_isas() {
            let format = WeightFormat::new(ty, isa).unwrap();
            let n = 512;
            let row = random_row(&mut Rng::new(1), ty, n);
            let mut q = vec![0xa5; format.activation_format().row_bytes(n)];
            format.quantize_activation(&vec![0.0; n], &mut q);
            assert_eq!(format.dot(&row, &q), 0.0, "{ty} {isa}");
        }
    }
}

#[test]
fn unsupported_types_are_named() {
    let err = WeightFormat::new(GgmlType::Q2K, Isa::Scalar).unwrap_err();
    assert_eq!(err, UnsupportedType::NoKernels { ty: GgmlType::Q2K });
    assert!(err.to_string().contains("Q2_K"), "{err}");
    for &isa in Isa::ALL {
        let result = WeightFormat::new(GgmlType::Q4K, isa);
        match result {
            Ok(format) => assert!(isa.is_available() && format.isa() == isa),
            Err(err) => {
                assert_eq!(
                    err,
                    UnsupportedType::IsaUnavailable {
                        ty: GgmlType::Q4K,
                        isa
                    }
                );
                assert!(err.to_string().contains(isa.name()), "{err}");
            }
        }
    }
}

#[test]
#[should_panic(expected = "activation row bytes")]
fn dot_rejects_an_activation_row_of_another_length() {
    let format = WeightFormat::new(GgmlType::Q4K, Isa::detect()).unwrap();
    let row = random_row(&mut Rng::new(1), GgmlType::Q4K, 512);
    let activation = vec![0; format.activation_format().row_bytes(256)];
    format.dot(&row, &activation);
}

#[test]
#[should_panic(expected = "not a whole number")]
fn dot_rejects_a_partial_block() {
    let format = WeightFormat::new(GgmlType::Q6K, Isa::detect()).unwrap();
    let row = random_row(&mut Rng::new(1), GgmlType::Q6K, 256);
    let activation = vec![0; format.activation_format().row_bytes(256)];
    format.dot(&row[..209], &activation);
}

#[test]
#[should_panic(expected = "bytes for 64 elements")]
fn dequantize_rejects_a_short_source() {
    let format = WeightFormat::new(GgmlType::Q4_0, Isa::Scalar).unwrap();
    format.dequantize(&[0; 18], &mut [0.0; 64]);
}

#[test]
fn dot_rows_equals_dot_row_by_row() {
    for &ty in WeightFormat::supported_types() {
        for isa in available_isas() {
            let format = WeightFormat::new(ty, isa).unwrap();
            let n = lengths(ty)[1];
            let mut rng = Rng::new(n as u64 + 1);
            let row = random_row(&mut rng, ty, n);
            let row_bytes = format.activation_format().row_bytes(n);
            for count in 0..10 {
                let mut activations = vec![0; row_bytes * count];
                for activation in activations.chunks_exact_mut(row_bytes) {
                    format.quantize_activation(&random_activations(&mut rng, n), activation);
                }
                let mut out = vec![f32::NAN; count];
                format.dot_rows(&row, &activations, &mut out);
                for (i, activation) in activations.chunks_exact(row_bytes).enumerate() {
                    let dot = format.dot(&row, activation);
                    assert_eq!(
                        out[i].to_bits(),
                        dot.to_bits(),
                        "{ty} {isa} row {i} of {count}"
                    );
                }
            }
        }
    }
}

#[test]
#[should_panic(expected = "activation bytes for 3 rows")]
fn dot_rows_rejects_a_missing_row() {
    let format = WeightFormat::new(GgmlType::Q4K, Isa::detect()).unwrap();
    let row = random_row(&mut Rng::new(1), GgmlType::Q4K, 256);
    let activations = vec![0; format.activation_format().row_bytes(256) * 2];
    format.dot_rows(&row, &activations, &mut [0.0; 3]);
}
