//! AVX2 activation quantizers, byte for byte equal to the portable ones: the scales come from
//! the same function, the products `x * inverse` and the residual's multiply and subtract are the
//! same `f32` operations, and the conversion rounds half to even like `round_ties_even`.

use std::arch::x86_64::*;

use super::{
    block_sum, quantize_block_lanes, quantize_pairs, scale_of, split32, split256, to_lanes,
};
use crate::simd::{array, array_mut, load_f32s, max_f32x8, store256, sum_i32x8};

/// Four vectors of eight values.
type Values32 = [__m256; 4];

#[target_feature(enable = "avx2")]
#[inline]
fn load32(x: &[f32; 32]) -> Values32 {
    let groups = x.as_chunks::<8>().0;
    std::array::from_fn(|k| load_f32s(&groups[k]))
}

#[target_feature(enable = "avx2")]
#[inline]
fn amax(values: &[Values32]) -> f32 {
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    let mut max = _mm256_setzero_ps();
    for v in values.iter().flatten() {
        max = _mm256_max_ps(max, _mm256_and_ps(*v, magnitude));
    }
    max_f32x8(max)
}

/// Quantizes 32 values into `q`, returning them as `i32` in four vectors.
#[target_feature(enable = "avx2")]
#[inline]
fn quantize32(values: &Values32, inverse: __m256, q: &mut [u8; 32]) -> [__m256i; 4] {
    let ints = values.map(|v| _mm256_cvtps_epi32(_mm256_mul_ps(v, inverse)));
    let words = [
        _mm256_packs_epi32(ints[0], ints[1]),
        _mm256_packs_epi32(ints[2], ints[3]),
    ];
    // The packs interleave the 128-bit halves; put the 4-byte groups back in order.
    let bytes = _mm256_packs_epi16(words[0], words[1]);
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    store256(q, _mm256_permutevar8x32_epi32(bytes, order));
    ints
}

/// The sums of values 0..16 and 16..32 of 32 quantized values.
#[target_feature(enable = "avx2")]
#[inline]
fn half_sums(ints: &[__m256i; 4]) -> [i32; 2] {
    [
        sum_i32x8(_mm256_add_epi32(ints[0], ints[1])),
        sum_i32x8(_mm256_add_epi32(ints[2], ints[3])),
    ]
}

/// The scales of a block quantized in two parts, and per part the sums of its values by 16.
struct Split<const GROUPS: usize> {
    d: [f32; 2],
    sums: [[[i32; 2]; GROUPS]; 2],
}

/// Quantizes `GROUPS` groups of 32 values in `PARTS` parts (1 or 2), writing the high values at
/// `hi` and the low ones at `lo` in `block`; with one part the low part is zero.
#[target_feature(enable = "avx2")]
#[inline]
fn split<const PARTS: usize, const GROUPS: usize>(
    x: &[[f32; 32]; GROUPS],
    block: &mut [u8],
    hi: usize,
    lo: usize,
) -> Split<GROUPS> {
    let values: [Values32; GROUPS] = std::array::from_fn(|k| load32(&x[k]));
    let (d_hi, inverse) = scale_of(amax(&values));
    let inverse = _mm256_set1_ps(inverse);
    let d = _mm256_set1_ps(d_hi);
    let mut sums = [[[0; 2]; GROUPS]; 2];
    let mut residual = [[_mm256_setzero_ps(); 4]; GROUPS];
    for (k, (values, residual)) in values.iter().zip(&mut residual).enumerate() {
        let ints = quantize32(values, inverse, array_mut(block, hi + 32 * k));
        sums[0][k] = half_sums(&ints);
        if PARTS == 2 {
            *residual = std::array::from_fn(|i| {
                _mm256_sub_ps(values[i], _mm256_mul_ps(d, _mm256_cvtepi32_ps(ints[i])))
            });
        }
    }
    if PARTS == 1 {
        for k in 0..GROUPS {
            *array_mut::<_, 32>(block, lo + 32 * k) = [0; 32];
        }
        return Split {
            d: [d_hi, 0.0],
            sums,
        };
    }
    let (d_lo, inverse) = scale_of(amax(&residual));
    let inverse = _mm256_set1_ps(inverse);
    for (k, residual) in residual.iter().enumerate() {
        let ints = quantize32(residual, inverse, array_mut(block, lo + 32 * k));
        sums[1][k] = half_sums(&ints);
    }
    Split {
        d: [d_hi, d_lo],
        sums,
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn quantize_split32<const PARTS: usize>(x: &[f32], dst: &mut [u8]) {
    let blocks = dst.as_chunks_mut::<{ split32::BYTES }>().0;
    let [hi, lo] = split32::PARTS;
    for (x, block) in x.as_chunks::<32>().0.iter().zip(blocks) {
        let Split { d, sums } = split::<PARTS, 1>(
            array(std::slice::from_ref(x), 0),
            block,
            hi.values,
            lo.values,
        );
        *array_mut(block, hi.d) = d[0].to_le_bytes();
        *array_mut(block, lo.d) = d[1].to_le_bytes();
        let [sum_hi, sum_lo] = sums.map(|[[first, second]]| first + second);
        *array_mut(block, split32::SUM) = block_sum(d[0], sum_hi, d[1], sum_lo).to_le_bytes();
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn quantize_split256<const PARTS: usize>(x: &[f32], dst: &mut [u8]) {
    let blocks = dst.as_chunks_mut::<{ split256::BYTES }>().0;
    let [hi, lo] = split256::PARTS;
    for (x, block) in x.as_chunks::<256>().0.iter().zip(blocks) {
        let groups = x.as_chunks::<32>().0;
        let Split { d, sums } = split::<PARTS, 8>(array(groups, 0), block, hi.values, lo.values);
        *array_mut(block, hi.d) = d[0].to_le_bytes();
        *array_mut(block, lo.d) = d[1].to_le_bytes();
        let [sums_hi, sums_lo] = &sums;
        let groups = sums_hi.as_flattened().iter().zip(sums_lo.as_flattened());
        for (g, (&sum_hi, &sum_lo)) in groups.enumerate() {
            let sum = block_sum(d[0], sum_hi, d[1], sum_lo);
            *array_mut(block, split256::SUMS + 4 * g) = sum.to_le_bytes();
        }
    }
}

/// [`quantize_split256`]'s blocks laid out as `SplitQ8Pairs512`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn quantize_pairs512<const PARTS: usize>(x: &[f32], dst: &mut [u8]) {
    quantize_pairs(x, dst, |x, blocks| quantize_split256::<PARTS>(x, blocks));
}

/// [`quantize_split32`]'s blocks laid out as `SplitQ8Lanes32`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn quantize_lanes32<const PARTS: usize>(x: &[f32], dst: &mut [u8]) {
    quantize_block_lanes(x, dst, |x, blocks| quantize_split32::<PARTS>(x, blocks));
}

/// [`quantize_split256`]'s blocks with their values laid out as `SplitQ8Lanes256`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn quantize_lanes256<const PARTS: usize>(x: &[f32], dst: &mut [u8]) {
    quantize_split256::<PARTS>(x, dst);
    to_lanes(dst);
}
