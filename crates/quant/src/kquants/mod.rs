//! The K-quants Q4_K, Q5_K and Q6_K: 256-element super-blocks of sub-blocks that each have a
//! quantized scale. Their dot products take [`ActivationFormat::SplitQ8Block256`] activations,
//! except the AVX-512 kernels of Q4_K and Q6_K, which take their weights repacked at load
//! (`repacked_q4_k`, `repacked_q6_k`, the loops they share in `crate::repacked`) and activations in the
//! matching layouts.
//!
//! - Q4_K (144 bytes): `d`, `dmin` (`f16`), 12 bytes packing eight 6-bit scales and eight 6-bit
//!   minimums, 128 bytes of nibbles. Sub-block `s` of 32 is `d * scale[s] * q - dmin * min[s]`;
//!   32-byte chunk `j` holds sub-block `2j` in its low nibbles and `2j + 1` in its high ones.
//! - Q5_K (176 bytes): as Q4_K with 32 bytes of fifth bits before the nibbles: bit `s` of byte `l`
//!   is the fifth bit of element `l` of sub-block `s`.
//! - Q6_K (210 bytes): 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, sixteen `i8`
//!   scales (one per 16 elements), `d`; element values are offset by 32.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512_mins;
#[cfg(target_arch = "x86_64")]
mod repacked_q4_k;
#[cfg(target_arch = "x86_64")]
mod repacked_q6_k;

use lucebox_gguf::GgmlType;

use crate::activation::{ActivationFormat, split256, sums_of_16};
use crate::bytes::{f16_at, f32_at};
use crate::format::Format;
#[cfg(target_arch = "x86_64")]
use crate::format::{
    Avx2Rows, Avx512Rows, ByPrecision, DotFn, Repacked, Tile, by_parts, rows_kernel,
};
#[cfg(target_arch = "x86_64")]
use crate::repacked::ByLane;
#[cfg(target_arch = "x86_64")]
use repacked_q4_k::Q4KUnits;
#[cfg(target_arch = "x86_64")]
use repacked_q6_k::Q6KBlocks;

/// The eight 6-bit scales and eight 6-bit minimums packed in the 12 bytes of Q4_K and Q5_K.
pub(crate) fn scales_and_mins(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut scales = [0; 8];
    let mut mins = [0; 8];
    for j in 0..4 {
        scales[j] = packed[j] & 63;
        mins[j] = packed[j + 4] & 63;
        scales[j + 4] = (packed[j + 8] & 0x0f) | ((packed[j] >> 6) << 4);
        mins[j + 4] = (packed[j + 8] >> 4) | ((packed[j + 4] >> 6) << 4);
    }
    (scales, mins)
}

/// A Q4_K or Q5_K block unpacked: unsigned values, the eight scales and minimums, `d`, `dmin`.
struct Unpacked {
    values: [u8; 256],
    scales: [u8; 8],
    mins: [u8; 8],
    d: f32,
    dmin: f32,
}

/// The 4-bit values of Q4_K and Q5_K: 128 bytes, each 32-byte chunk holding two sub-blocks.
fn k_nibbles(packed: &[u8]) -> [u8; 256] {
    std::array::from_fn(|i| {
        let byte = packed[i / 64 * 32 + i % 32];
        if i % 64 < 32 { byte & 0x0f } else { byte >> 4 }
    })
}

fn unpack_q4_k(block: &[u8]) -> Unpacked {
    let (scales, mins) = scales_and_mins(&block[4..16]);
    Unpacked {
        values: k_nibbles(&block[16..144]),
        scales,
        mins,
        d: f16_at(block, 0),
        dmin: f16_at(block, 2),
    }
}

fn unpack_q5_k(block: &[u8]) -> Unpacked {
    let (scales, mins) = scales_and_mins(&block[4..16]);
    let high = &block[16..48];
    let mut values = k_nibbles(&block[48..176]);
    for (i, value) in values.iter_mut().enumerate() {
        *value |= ((high[i % 32] >> (i / 32)) & 1) << 4;
    }
    Unpacked {
        values,
        scales,
        mins,
        d: f16_at(block, 0),
        dmin: f16_at(block, 2),
    }
}

fn dequantize_with_mins(src: &[u8], dst: &mut [f32], bytes: usize, unpack: fn(&[u8]) -> Unpacked) {
    for (block, y) in src.chunks_exact(bytes).zip(dst.chunks_exact_mut(256)) {
        let b = unpack(block);
        for (s, y) in y.chunks_exact_mut(32).enumerate() {
            let scale = b.d * f32::from(b.scales[s]);
            let min = b.dmin * f32::from(b.mins[s]);
            for (y, &q) in y.iter_mut().zip(&b.values[32 * s..]) {
                *y = scale * f32::from(q) - min;
            }
        }
    }
}

fn dot_with_mins(
    weight: &[u8],
    activation: &[u8],
    bytes: usize,
    unpack: fn(&[u8]) -> Unpacked,
) -> f32 {
    let mut sum = 0.0;
    let activations = activation.chunks_exact(split256::BYTES);
    for (block, a) in weight.chunks_exact(bytes).zip(activations) {
        let b = unpack(block);
        for part in split256::PARTS {
            let x = &a[part.values..part.values + 256];
            let mut products = 0;
            for s in 0..8 {
                let sub = b.values[32 * s..32 * s + 32].iter().zip(&x[32 * s..]);
                let sub: i32 = sub.map(|(&w, &x)| i32::from(w) * i32::from(x as i8)).sum();
                products += i32::from(b.scales[s]) * sub;
            }
            sum += b.d * f32_at(a, part.d) * products as f32;
        }
        let sums = sums_of_16(a);
        let mins: f32 = (0..8)
            .map(|s| f32::from(b.mins[s]) * (sums[2 * s] + sums[2 * s + 1]))
            .sum();
        sum -= b.dmin * mins;
    }
    sum
}

/// Q6_K's values, offset by 32 so as to be signed.
fn q6_k_values(block: &[u8]) -> [i8; 256] {
    std::array::from_fn(|i| {
        let (half, k, l) = (i / 128, i % 128 / 32, i % 32);
        let low = block[64 * half + 32 * (k % 2) + l];
        let low = if k < 2 { low & 0x0f } else { low >> 4 };
        let high = (block[128 + 32 * half + l] >> (2 * k)) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

fn q6_k_scales(block: &[u8]) -> [i8; 16] {
    std::array::from_fn(|i| block[192 + i] as i8)
}

/// Q4_K: see the module documentation.
pub(crate) struct Q4K;

impl Format for Q4K {
    const TYPE: GgmlType = GgmlType::Q4K;
    const ACTIVATION: ActivationFormat = ActivationFormat::SplitQ8Block256;
    fn dequantize(src: &[u8], dst: &mut [f32]) {
        dequantize_with_mins(src, dst, 144, unpack_q4_k);
    }
    fn dot(weight: &[u8], activation: &[u8]) -> f32 {
        dot_with_mins(weight, activation, 144, unpack_q4_k)
    }
    #[cfg(target_arch = "x86_64")]
    const AVX2_DOT: ByPrecision<DotFn> = by_parts!(avx2::dot_q4_k);
    #[cfg(target_arch = "x86_64")]
    const AVX2_TILE: Option<ByPrecision<Tile>> = Some(Tile::of::<Avx2Rows<Q4K>>());
    #[cfg(target_arch = "x86_64")]
    const AVX512_REPACKED: Option<Repacked> = Some(crate::repacked::kernels::<ByLane<Q4KUnits>>());
}

/// Q5_K: see the module documentation.
pub(crate) struct Q5K;

impl Format for Q5K {
    const TYPE: GgmlType = GgmlType::Q5K;
    const ACTIVATION: ActivationFormat = ActivationFormat::SplitQ8Block256;
    fn dequantize(src: &[u8], dst: &mut [f32]) {
        dequantize_with_mins(src, dst, 176, unpack_q5_k);
    }
    fn dot(weight: &[u8], activation: &[u8]) -> f32 {
        dot_with_mins(weight, activation, 176, unpack_q5_k)
    }
    #[cfg(target_arch = "x86_64")]
    const AVX2_DOT: ByPrecision<DotFn> = by_parts!(avx2::dot_q5_k);
    #[cfg(target_arch = "x86_64")]
    const AVX2_TILE: Option<ByPrecision<Tile>> = Some(Tile::of::<Avx2Rows<Q5K>>());
    #[cfg(target_arch = "x86_64")]
    const AVX512_DOT: ByPrecision<DotFn> = by_parts!(avx512_mins::dot_q5_k);
    #[cfg(target_arch = "x86_64")]
    const AVX512_TILE: Option<ByPrecision<Tile>> = Some(Tile::of::<Avx512Rows<Q5K>>());
}

/// Q6_K: see the module documentation.
pub(crate) struct Q6K;

impl Format for Q6K {
    const TYPE: GgmlType = GgmlType::Q6K;
    const ACTIVATION: ActivationFormat = ActivationFormat::SplitQ8Block256;
    fn dequantize(src: &[u8], dst: &mut [f32]) {
        for (block, y) in src.chunks_exact(210).zip(dst.chunks_exact_mut(256)) {
            let d = f16_at(block, 208);
            let values = q6_k_values(block);
            let scales = q6_k_scales(block);
            for ((y, q), &scale) in y
                .chunks_exact_mut(16)
                .zip(values.chunks_exact(16))
                .zip(&scales)
            {
                let scale = d * f32::from(scale);
                for (y, &q) in y.iter_mut().zip(q) {
                    *y = scale * f32::from(q);
                }
            }
        }
    }
    fn dot(weight: &[u8], activation: &[u8]) -> f32 {
        let mut sum = 0.0;
        let activations = activation.chunks_exact(split256::BYTES);
        for (block, a) in weight.chunks_exact(210).zip(activations) {
            let values = q6_k_values(block);
            let scales = q6_k_scales(block);
            for part in split256::PARTS {
                let x = &a[part.values..part.values + 256];
                let mut products = 0;
                for (g, &scale) in scales.iter().enumerate() {
                    let group = values[16 * g..16 * g + 16].iter().zip(&x[16 * g..]);
                    let group: i32 = group
                        .map(|(&w, &x)| i32::from(w) * i32::from(x as i8))
                        .sum();
                    products += i32::from(scale) * group;
                }
                sum += f16_at(block, 208) * f32_at(a, part.d) * products as f32;
            }
        }
        sum
    }
    #[cfg(target_arch = "x86_64")]
    const AVX2_DOT: ByPrecision<DotFn> = by_parts!(avx2::dot_q6_k);
    // With AVX2's 16 vector registers, four rows spill and gain under 10%: no AVX2 tile.
    #[cfg(target_arch = "x86_64")]
    const AVX512_REPACKED: Option<Repacked> = Some(crate::repacked::kernels::<Q6KBlocks>());
}

rows_kernel! {
    Avx2Rows<Q4K> => avx2::dot_q4_k_rows, 4;
    Avx2Rows<Q5K> => avx2::dot_q5_k_rows, 4;
    Avx512Rows<Q5K> => avx512_mins::dot_q5_k_rows, 8;
}
