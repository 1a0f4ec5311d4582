//! Every format on every available ISA: dot products against the portable kernels, against an f64
//! dot of the dequantized operands and against an f64 dot of the dequantized weights with the
//! original activations, and the activation quantizers' round trip, at both activation
//! precisions.

mod common;

use common::{Rng, random_activations, random_row};
use lucebox_quant::{
    ActivationFormat, ActivationPrecision, GgmlType, Isa, UnsupportedType, WeightFormat,
};

const PRECISIONS: [ActivationPrecision; 2] =
    [ActivationPrecision::Split, ActivationPrecision::Single];

fn available_isas() -> impl Iterator<Item = Isa> {
    Isa::ALL.iter().copied().filter(|isa| isa.is_available())
}

/// Row lengths for a type: one block, a few, a model-sized row, and for the float types lengths
/// that leave a tail after the SIMD loops.
fn lengths(ty: GgmlType) -> Vec<usize> {
    match ty.block_len() as usize {
        1 => vec![1, 7, 8, 37, 64, 1000, 1536],
        // 896: three groups of eight blocks and a partial one, as Qwen2.5-0.5B's rows.
        32 => vec![32, 96, 896, 1536],
        block => vec![block, 3 * block, 1536, 8960],
    }
}

/// One block of a split activation format, read from its documented layout.
struct SplitBlock {
    hi: Vec<i8>,
    lo: Vec<i8>,
    d_hi: f32,
    d_lo: f32,
}

impl SplitBlock {
    /// The blocks of a row of `format`, which must be a split format.
    fn read(format: ActivationFormat, row: &[u8]) -> Vec<SplitBlock> {
        let len = format.block_len();
        // The scales follow the values and, in 256-blocks, the sums of 16 elements.
        let scales = match format {
            ActivationFormat::SplitQ8Block32 => 64,
            ActivationFormat::SplitQ8Block256 => 576,
            other => panic!("{other:?} is not a split format"),
        };
        row.chunks_exact(format.block_bytes())
            .map(|b| {
                let values = |at: usize| b[at..at + len].iter().map(|&v| v as i8).collect();
                let scale = |at: usize| f32::from_le_bytes(b[at..at + 4].try_into().unwrap());
                SplitBlock {
                    hi: values(0),
                    lo: values(len),
                    d_hi: scale(scales),
                    d_lo: scale(scales + 4),
                }
            })
            .collect()
    }

    /// Element `i` in f64, as the kernels take it: `d_hi * hi + d_lo * lo` without rounding.
    fn element(&self, i: usize) -> f64 {
        f64::from(self.d_hi) * f64::from(self.hi[i]) + f64::from(self.d_lo) * f64::from(self.lo[i])
    }
}

fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
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
        Case::at(ActivationPrecision::Split, ty, n, seed)
    }

    /// A case whose activations are quantized at `precision`.
    fn at(precision: ActivationPrecision, ty: GgmlType, n: usize, seed: u64) -> Case {
        let mut rng = Rng::new(seed);
        let row = random_row(&mut rng, ty, n);
        let x = random_activations(&mut rng, n);
        let scalar = WeightFormat::with_precision(ty, Isa::Scalar, precision).unwrap();
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

    /// The dot product by `format`'s kernels, of the row repacked where the format repacks
    /// and of the activations quantized in its own layout (the same values as the case's at
    /// `format`'s precision).
    fn dot(&self, format: &WeightFormat) -> f32 {
        let row = format.repack_rows(&self.row, self.x.len());
        let mut activation = vec![0; format.activation_format().row_bytes(self.x.len())];
        format.quantize_activation(&self.x, &mut activation);
        format.dot(&row, &activation)
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

/// The dot products of the quantized formats with the original activations: within the bound
/// the low part's rounding gives (each activation off by at most half a low step) plus the
/// kernels' `f32` rounding. The high part alone, the single-part format this replaced, must miss
/// that bound in most cases: the bound is tight enough to tell the two apart.
#[test]
fn dot_is_within_the_low_part_rounding_of_the_f32_dot() {
    for &ty in WeightFormat::supported_types() {
        let scalar = WeightFormat::new(ty, Isa::Scalar).unwrap();
        let format = scalar.activation_format();
        if format == ActivationFormat::F32 {
            continue;
        }
        let block = format.block_len();
        let (mut cases, mut single_part_misses) = (0, 0);
        for n in lengths(ty) {
            for seed in 0..4 {
                let case = Case::new(ty, n, seed * 6151 + n as u64);
                let dot = f64::from(scalar.dot(&case.row, &case.activation));
                let exact: f64 = case
                    .w
                    .iter()
                    .zip(&case.x)
                    .map(|(&w, &x)| f64::from(w) * f64::from(x))
                    .sum();
                let blocks = SplitBlock::read(format, &case.activation);
                let mut bound = 2e-6 * case.magnitude();
                let mut single_part = 0.0;
                for (w, b) in case.w.chunks(block).zip(&blocks) {
                    let w_sum: f64 = w.iter().map(|&v| f64::from(v).abs()).sum();
                    bound += f64::from(b.d_lo) / 2.0 * w_sum;
                    single_part += w
                        .iter()
                        .zip(&b.hi)
                        .map(|(&w, &hi)| f64::from(w) * f64::from(b.d_hi) * f64::from(hi))
                        .sum::<f64>();
                }
                assert!(
                    (dot - exact).abs() <= bound,
                    "{ty} n={n} seed={seed}: {dot} vs {exact} (bound {bound})"
                );
                cases += 1;
                if (single_part - exact).abs() > bound {
                    single_part_misses += 1;
                }
            }
        }
        assert!(
            4 * single_part_misses >= 3 * cases,
            "{ty}: the high part alone kept within the bound in {} of {cases} cases",
            cases - single_part_misses
        );
    }
}

/// The SIMD kernels of each precision against the portable one, which multiplies both parts
/// (a single-part row's zero low part adds nothing); a single-part kernel skips the low part.
#[test]
fn simd_dot_agrees_with_scalar_dot() {
    for &ty in WeightFormat::supported_types() {
        let scalar = WeightFormat::new(ty, Isa::Scalar).unwrap();
        for (isa, precision) in available_isas().flat_map(|isa| PRECISIONS.map(|p| (isa, p))) {
            let format = WeightFormat::with_precision(ty, isa, precision).unwrap();
            if !format.repacks() {
                assert_eq!(format.activation_format(), scalar.activation_format());
            }
            assert_eq!(format.activation_precision(), precision);
            for n in lengths(ty) {
                for seed in 0..4 {
                    let case = Case::at(precision, ty, n, seed * 104_729 + n as u64);
                    let expected = f64::from(scalar.dot(&case.row, &case.activation));
                    let dot = f64::from(case.dot(&format));
                    let tolerance = 1e-6 * case.magnitude();
                    assert!(
                        (dot - expected).abs() <= tolerance,
                        "{ty} {isa} {precision:?} n={n} seed={seed}: {dot} vs {expected} \
                         (tolerance {tolerance})"
                    );
                }
            }
        }
    }
}

/// Single-part activations are the split ones' high part, with a zero low part and sums of the
/// high part alone; their dot products are within the high part's rounding (half a high step
/// per activation) of the f32 dot.
#[test]
fn single_part_activations_are_the_high_part_alone() {
    for (format, ty) in &ACTIVATION_FORMATS[1..] {
        for isa in available_isas() {
            let split = WeightFormat::new(*ty, isa).unwrap();
            let single =
                WeightFormat::with_precision(*ty, isa, ActivationPrecision::Single).unwrap();
            let x = activations_with_edge_cases(11, 2048);
            let [mut q_split, mut q_single] = [0, 1].map(|_| vec![0; format.row_bytes(x.len())]);
            split.quantize_activation(&x, &mut q_split);
            single.quantize_activation(&x, &mut q_single);
            let blocks = SplitBlock::read(*format, &q_split);
            for (i, (s, b)) in blocks
                .iter()
                .zip(SplitBlock::read(*format, &q_single))
                .enumerate()
            {
                let context = format!("{format:?} {isa} block {i}");
                assert_eq!(
                    (s.d_hi.to_bits(), &s.hi),
                    (b.d_hi.to_bits(), &b.hi),
                    "{context}"
                );
                assert_eq!(b.d_lo, 0.0, "{context}");
                assert!(b.lo.iter().all(|&v| v == 0), "{context}");
            }
            for (bytes, b) in q_single
                .chunks_exact(format.block_bytes())
                .zip(SplitBlock::read(*format, &q_single))
            {
                let sum = |values: &[i8]| values.iter().map(|&v| i32::from(v)).sum::<i32>() as f32;
                let (at, group) = match format {
                    ActivationFormat::SplitQ8Block32 => (72, 32),
                    _ => (512, 16),
                };
                for (g, hi) in b.hi.chunks(group).enumerate() {
                    let at = at + 4 * g;
                    let recorded = f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
                    assert_eq!(recorded, b.d_hi * sum(hi), "{format:?} {isa}");
                }
            }
        }
    }
    for &ty in WeightFormat::supported_types() {
        let single =
            WeightFormat::with_precision(ty, Isa::detect(), ActivationPrecision::Single).unwrap();
        let format = single.activation_format();
        if format == ActivationFormat::F32 {
            continue;
        }
        for n in lengths(ty) {
            let case = Case::at(ActivationPrecision::Single, ty, n, 31 + n as u64);
            let dot = f64::from(case.dot(&single));
            let mut bound = 2e-6 * case.magnitude();
            let scalar_format = WeightFormat::new(ty, Isa::Scalar)
                .unwrap()
                .activation_format();
            for ((w, x), b) in case
                .w
                .chunks(scalar_format.block_len())
                .zip(case.x.chunks(scalar_format.block_len()))
                .zip(SplitBlock::read(scalar_format, &case.activation))
            {
                let w_sum: f64 = w.iter().map(|&v| f64::from(v).abs()).sum();
                bound += f64::from(b.d_hi) / 2.0 * w_sum;
                assert!(b.d_hi <= amax(x) / 127.0 * 1.0001);
            }
            let exact: f64 = case
                .w
                .iter()
                .zip(&case.x)
                .map(|(&w, &x)| f64::from(w) * f64::from(x))
                .sum();
            assert!(
                (dot - exact).abs() <= bound,
                "{ty} n={n}: {dot} vs {exact} (bound {bound})"
            );
        }
    }
}

/// The activation formats of every ISA, each with a weight type that takes it on every ISA.
const ACTIVATION_FORMATS: [(ActivationFormat, GgmlType); 3] = [
    (ActivationFormat::F32, GgmlType::F32),
    (ActivationFormat::SplitQ8Block32, GgmlType::Q8_0),
    (ActivationFormat::SplitQ8Block256, GgmlType::Iq4Xs),
];

/// Random activations, then blocks of 256 that take the quantizers' edge cases: all zero, values
/// the high part holds exactly (no residual), one outlier among tiny values, subnormals.
fn activations_with_edge_cases(seed: u64, n: usize) -> Vec<f32> {
    let mut x = random_activations(&mut Rng::new(seed), n);
    x.extend([0.0; 256]);
    x.extend((0..256).map(|i| (i % 255) as f32 - 127.0));
    x.extend((0..256).map(|i| {
        if i == 100 {
            50.0
        } else {
            1e-6 * (i as f32 - 128.0)
        }
    }));
    x.extend((0..256).map(|i| f32::from_bits(i * 1000 + 1) * if i % 2 == 0 { 1.0 } else { -1.0 }));
    x
}

#[test]
fn the_f32_format_round_trips_exactly() {
    let x = activations_with_edge_cases(9, 512);
    let format = WeightFormat::new(GgmlType::F32, Isa::detect()).unwrap();
    let mut q = vec![0; ActivationFormat::F32.row_bytes(x.len())];
    format.quantize_activation(&x, &mut q);
    let mut back = vec![0.0; x.len()];
    ActivationFormat::F32.dequantize(&q, &mut back);
    assert_eq!(back, x);
}

/// Each activation comes back within half a low step, `d_lo / 2`, which is at most about
/// `amax / 64516`: the low part quantizes a residual of at most half a high step. (A part
/// smaller than `127 * f32::MIN_POSITIVE` is zero: that much absolute error is allowed too.)
#[test]
fn split_activations_round_trip_within_half_a_low_step() {
    for (format, ty) in &ACTIVATION_FORMATS[1..] {
        let block = format.block_len();
        for isa in available_isas() {
            let quantizer = WeightFormat::new(*ty, isa).unwrap();
            for n in [block, 4 * block, 2048] {
                let x = activations_with_edge_cases(n as u64, n);
                let mut q = vec![0; format.row_bytes(x.len())];
                quantizer.quantize_activation(&x, &mut q);
                let mut back = vec![0.0; x.len()];
                format.dequantize(&q, &mut back);
                let blocks = SplitBlock::read(*format, &q);
                let chunks = x.chunks(block).zip(back.chunks(block)).zip(&blocks);
                for (i, ((x, back), b)) in chunks.enumerate() {
                    let amax = amax(x);
                    let context = format!("{format:?} {isa} n={n} block {i}");
                    assert!(
                        b.d_lo <= amax / (127.0 * 254.0) * 1.0001,
                        "{context}: d_lo {} for amax {amax}",
                        b.d_lo
                    );
                    for (k, (&x, &back)) in x.iter().zip(back).enumerate() {
                        // The kernels' value, and dequantize's, rounded once more to f32.
                        let slack = f64::from(amax) * 2e-7 + 127.0 * f64::from(f32::MIN_POSITIVE);
                        let bound = f64::from(b.d_lo) * 0.5001 + slack;
                        let error = (f64::from(x) - b.element(k)).abs();
                        assert!(
                            error <= bound,
                            "{context}: {x} became {} (bound {bound})",
                            b.element(k)
                        );
                        let error = (f64::from(x) - f64::from(back)).abs();
                        assert!(
                            error <= bound + slack,
                            "{context}: dequantize gave {back} for {x}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn every_isa_quantizes_activations_to_the_same_bytes() {
    for ((format, ty), precision) in ACTIVATION_FORMATS
        .into_iter()
        .flat_map(|f| PRECISIONS.map(|p| (f, p)))
    {
        let x = activations_with_edge_cases(3, 4096);
        let n = x.len();
        let mut expected = vec![0; format.row_bytes(n)];
        WeightFormat::with_precision(ty, Isa::Scalar, precision)
            .unwrap()
            .quantize_activation(&x, &mut expected);
        for isa in available_isas() {
            let mut got = vec![0; format.row_bytes(n)];
            WeightFormat::with_precision(ty, isa, precision)
                .unwrap()
                .quantize_activation(&x, &mut got);
            let first_difference = got.iter().zip(&expected).position(|(a, b)| a != b);
            assert!(
                first_difference.is_none(),
                "{format:?} {precision:?} {isa}: byte {first_difference:?} differs, block bytes {}",
                format.block_bytes()
            );
        }
    }
}

#[test]
fn blocks_with_sums_record_them() {
    let x = random_activations(&mut Rng::new(5), 256);
    let sum = |values: &[i8]| values.iter().map(|&v| i32::from(v)).sum::<i32>();
    for isa in available_isas() {
        let format = ActivationFormat::SplitQ8Block32;
        let mut q = vec![0; format.row_bytes(256)];
        let q8_0 = WeightFormat::new(GgmlType::Q8_0, isa).unwrap();
        q8_0.quantize_activation(&x, &mut q);
        let blocks = q.chunks_exact(format.block_bytes());
        for (bytes, b) in blocks.zip(SplitBlock::read(format, &q)) {
            let recorded = f32::from_le_bytes(bytes[72..76].try_into().unwrap());
            let expected = b.d_hi * sum(&b.hi) as f32 + b.d_lo * sum(&b.lo) as f32;
            assert_eq!(recorded, expected, "{isa}");
        }
        let format = ActivationFormat::SplitQ8Block256;
        let mut q = vec![0; format.row_bytes(256)];
        let iq4_xs = WeightFormat::new(GgmlType::Iq4Xs, isa).unwrap();
        iq4_xs.quantize_activation(&x, &mut q);
        let b = &SplitBlock::read(format, &q)[0];
        for g in 0..16 {
            let at = 512 + 4 * g;
            let recorded = f32::from_le_bytes(q[at..at + 4].try_into().unwrap());
            let group = 16 * g..16 * g + 16;
            let expected =
                b.d_hi * sum(&b.hi[group.clone()]) as f32 + b.d_lo * sum(&b.lo[group]) as f32;
            assert_eq!(recorded, expected, "{isa} group {g}");
        }
    }
}

/// Where Q4_K repacks (AVX-512), its activations are the portable quantizer's 256-element
/// blocks laid out by lane as `SplitQ8Pairs512` documents, and dequantize to the same values.
#[test]
fn pair_activations_are_the_blocks_rearranged() {
    let pairs = ActivationFormat::SplitQ8Pairs512;
    let blocks = ActivationFormat::SplitQ8Block256;
    let f32_at =
        |bytes: &[u8], at: usize| f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    for (isa, precision) in available_isas().flat_map(|isa| PRECISIONS.map(|p| (isa, p))) {
        let format = WeightFormat::with_precision(GgmlType::Q4K, isa, precision).unwrap();
        if !format.repacks() {
            continue;
        }
        assert_eq!(format.activation_format(), pairs);
        let scalar = WeightFormat::with_precision(GgmlType::Q4K, Isa::Scalar, precision).unwrap();
        // An odd number of blocks: the last pair's second block is padding.
        let x = activations_with_edge_cases(17, 256 * 5);
        let n = x.len();
        let (mut q, mut reference) = (vec![0; pairs.row_bytes(n)], vec![0; blocks.row_bytes(n)]);
        format.quantize_activation(&x, &mut q);
        scalar.quantize_activation(&x, &mut reference);
        let mut expected = vec![0.0; n];
        blocks.dequantize(&reference, &mut expected);
        let reference = SplitBlock::read(blocks, &reference);
        let context = format!("{isa} {precision:?}");
        for (p, pair) in q.chunks_exact(pairs.block_bytes()).enumerate() {
            for lane in 0..16 {
                let block = reference.get(2 * p + lane / 8);
                let sub_block = 32 * (lane % 8);
                for (part, (values, scales)) in [(0, 1088), (512, 1152)].into_iter().enumerate() {
                    let d = block.map_or(0.0, |b| [b.d_hi, b.d_lo][part]);
                    assert_eq!(f32_at(pair, scales + 4 * lane), d, "{context} pair {p}");
                    for (vector, byte) in (0..8).flat_map(|k| (0..4).map(move |b| (k, b))) {
                        let value = pair[values + 64 * vector + 4 * lane + byte] as i8;
                        let expected = block
                            .map_or(0, |b| [&b.hi, &b.lo][part][sub_block + 4 * vector + byte]);
                        assert_eq!(value, expected, "{context} pair {p} lane {lane}");
                    }
                }
                let sum = |values: &[i8]| values.iter().map(|&v| i32::from(v)).sum::<i32>() as f32;
                let expected = block.map_or(0.0, |b| {
                    let range = sub_block..sub_block + 32;
                    b.d_hi * sum(&b.hi[range.clone()]) + b.d_lo * sum(&b.lo[range])
                });
                assert_eq!(
                    f32_at(pair, 1024 + 4 * lane),
                    expected,
                    "{context} pair {p}"
                );
            }
        }
        let mut back = vec![0.0; n];
        pairs.dequantize(&q, &mut back);
        assert_eq!(back, expected, "{context}");
    }
}

/// Where Q5_0 repacks (AVX-512), its activations are the portable quantizer's 32-element blocks
/// laid out by lane as `SplitQ8Lanes32` documents, and dequantize to the same values.
#[test]
fn block_lane_activations_are_the_blocks_rearranged() {
    let lanes = ActivationFormat::SplitQ8Lanes32;
    let blocks = ActivationFormat::SplitQ8Block32;
    let f32_at =
        |bytes: &[u8], at: usize| f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    for (isa, precision) in available_isas().flat_map(|isa| PRECISIONS.map(|p| (isa, p))) {
        let format = WeightFormat::with_precision(GgmlType::Q5_0, isa, precision).unwrap();
        if !format.repacks() {
            continue;
        }
        assert_eq!(format.activation_format(), lanes);
        let scalar = WeightFormat::with_precision(GgmlType::Q5_0, Isa::Scalar, precision).unwrap();
        // 28 blocks, as a row of Qwen2.5-0.5B: the second unit's last four lanes are padding.
        let mut x = activations_with_edge_cases(19, 128);
        x.truncate(896);
        let n = x.len();
        assert_eq!(n, 896);
        let (mut q, mut reference) = (vec![0; lanes.row_bytes(n)], vec![0; blocks.row_bytes(n)]);
        format.quantize_activation(&x, &mut q);
        scalar.quantize_activation(&x, &mut reference);
        let mut expected = vec![0.0; n];
        blocks.dequantize(&reference, &mut expected);
        let sums: Vec<f32> = reference.chunks_exact(76).map(|b| f32_at(b, 72)).collect();
        let reference = SplitBlock::read(blocks, &reference);
        let context = format!("{isa} {precision:?}");
        for (u, unit) in q.chunks_exact(lanes.block_bytes()).enumerate() {
            for lane in 0..16 {
                let index = 16 * u + lane;
                let block = reference.get(index);
                for (part, (values, scales)) in [(0, 1088), (512, 1152)].into_iter().enumerate() {
                    let d = block.map_or(0.0, |b| [b.d_hi, b.d_lo][part]);
                    assert_eq!(f32_at(unit, scales + 4 * lane), d, "{context} unit {u}");
                    for (vector, byte) in (0..8).flat_map(|k| (0..4).map(move |b| (k, b))) {
                        let value = unit[values + 64 * vector + 4 * lane + byte] as i8;
                        let expected = block.map_or(0, |b| [&b.hi, &b.lo][part][4 * vector + byte]);
                        assert_eq!(value, expected, "{context} unit {u} lane {lane}");
                    }
                }
                let expected = sums.get(index).copied().unwrap_or(0.0);
                assert_eq!(
                    f32_at(unit, 1024 + 4 * lane),
                    expected,
                    "{context} unit {u}"
                );
            }
        }
        let mut back = vec![0.0; n];
        lanes.dequantize(&q, &mut back);
        assert_eq!(back, expected, "{context}");
    }
}

/// Where Q6_K repacks (AVX-512), its activations are the portable quantizer's 256-element
/// blocks with each part's values laid out by lane as `SplitQ8Lanes256` documents, the sums
/// and scales unchanged, and dequantize to the same values.
#[test]
fn lane_activations_are_the_blocks_rearranged() {
    let lanes = ActivationFormat::SplitQ8Lanes256;
    let blocks = ActivationFormat::SplitQ8Block256;
    for (isa, precision) in available_isas().flat_map(|isa| PRECISIONS.map(|p| (isa, p))) {
        let format = WeightFormat::with_precision(GgmlType::Q6K, isa, precision).unwrap();
        if !format.repacks() {
            continue;
        }
        assert_eq!(format.activation_format(), lanes);
        let scalar = WeightFormat::with_precision(GgmlType::Q6K, Isa::Scalar, precision).unwrap();
        let x = activations_with_edge_cases(19, 256 * 3);
        let n = x.len();
        let (mut q, mut reference) = (vec![0; lanes.row_bytes(n)], vec![0; blocks.row_bytes(n)]);
        format.quantize_activation(&x, &mut q);
        scalar.quantize_activation(&x, &mut reference);
        let context = format!("{isa} {precision:?}");
        let block_bytes = blocks.block_bytes();
        for (b, (got, expected)) in q
            .chunks_exact(block_bytes)
            .zip(reference.chunks_exact(block_bytes))
            .enumerate()
        {
            assert_eq!(
                got[512..],
                expected[512..],
                "{context} block {b}: sums and scales"
            );
            for part in [0, 256] {
                for (vector, lane, byte) in
                    (0..4).flat_map(|k| (0..16).flat_map(move |l| (0..4).map(move |b| (k, l, b))))
                {
                    assert_eq!(
                        got[part + 64 * vector + 4 * lane + byte],
                        expected[part + 16 * lane + 4 * vector + byte],
                        "{context} block {b} lane {lane}"
                    );
                }
            }
        }
        let (mut back, mut expected) = (vec![0.0; n], vec![0.0; n]);
        lanes.dequantize(&q, &mut back);
        blocks.dequantize(&reference, &mut expected);
        assert_eq!(back, expected, "{context}");
    }
}

#[test]
fn zero_activations_give_zero() {
    for &ty in WeightFormat::supported_types() {
        for (isa, precision) in available_isas().flat_map(|isa| PRECISIONS.map(|p| (isa, p))) {
            let format = WeightFormat::with_precision(ty, isa, precision).unwrap();
            let n = 512;
            let row = format.repack_rows(&random_row(&mut Rng::new(1), ty, n), n);
            let mut q = vec![0xa5; format.activation_format().row_bytes(n)];
            format.quantize_activation(&vec![0.0; n], &mut q);
            assert_eq!(format.dot(&row, &q), 0.0, "{ty} {isa} {precision:?}");
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
    let row = format.repack_rows(&row, 512);
    let activation = vec![0; format.activation_format().row_bytes(1024)];
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
fn dot_rows_and_dot_matrix_equal_dot_row_by_row() {
    const WEIGHT_ROWS: usize = 9;
    for &ty in WeightFormat::supported_types() {
        for (isa, precision) in available_isas().flat_map(|isa| PRECISIONS.map(|p| (isa, p))) {
            let format = WeightFormat::with_precision(ty, isa, precision).unwrap();
            for n in lengths(ty) {
                let mut rng = Rng::new(n as u64 + 1);
                // Nine rows: a group of eight that the repacked kernels carry across column
                // blocks, and one more.
                let weight_rows: Vec<u8> = (0..WEIGHT_ROWS)
                    .flat_map(|_| random_row(&mut rng, ty, n))
                    .collect();
                let weight_rows = format.repack_rows(&weight_rows, n);
                let weight_bytes = format.kernel_row_bytes(n);
                let row = &weight_rows[..weight_bytes];
                let row_bytes = format.activation_format().row_bytes(n);
                for count in 0..10 {
                    let mut activations = vec![0; row_bytes * count];
                    for activation in activations.chunks_exact_mut(row_bytes) {
                        format.quantize_activation(&random_activations(&mut rng, n), activation);
                    }
                    let mut out = vec![f32::NAN; count];
                    format.dot_rows(row, &activations, &mut out);
                    let mut matrix = vec![f32::NAN; WEIGHT_ROWS * count];
                    format.dot_matrix(&weight_rows, weight_bytes, &activations, &mut matrix);
                    for (i, activation) in activations.chunks_exact(row_bytes).enumerate() {
                        let context =
                            format!("{ty} {isa} {precision:?} {n} elements, row {i} of {count}");
                        assert_eq!(
                            out[i].to_bits(),
                            format.dot(row, activation).to_bits(),
                            "{context}"
                        );
                        for (w, weight) in weight_rows.chunks_exact(weight_bytes).enumerate() {
                            let dot = format.dot(weight, activation);
                            assert_eq!(
                                matrix[w * count + i].to_bits(),
                                dot.to_bits(),
                                "{context}, weight row {w}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
#[should_panic(expected = "activation bytes for 3 rows")]
fn dot_rows_rejects_a_missing_row() {
    let format = WeightFormat::new(GgmlType::Q4K, Isa::detect()).unwrap();
    let row = format.repack_rows(&random_row(&mut Rng::new(1), GgmlType::Q4K, 256), 256);
    let activations = vec![0; format.activation_format().row_bytes(256) * 2];
    format.dot_rows(&row, &activations, &mut [0.0; 3]);
}
