//! AVX2 activation quantizers, byte for byte equal to the portable ones: the scale comes from
//! the same function, the product `x * inverse` is the same `f32` operation, and the conversion
//! rounds half to even like `round_ties_even`.

use std::arch::x86_64::*;

use super::{q8_32, q8_256, scale_of};
use crate::simd::{load_f32s, max_f32x8, store256, sum_i32x8};

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

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn quantize_q8_32(x: &[f32], dst: &mut [u8]) {
    let blocks = dst.as_chunks_mut::<{ q8_32::BYTES }>().0;
    for (x, block) in x.as_chunks::<32>().0.iter().zip(blocks) {
        let values = load32(x);
        let (d, inverse) = scale_of(amax(std::slice::from_ref(&values)));
        let (q, rest) = block
            .split_first_chunk_mut::<32>()
            .expect("block holds 32 values");
        let ints = quantize32(&values, _mm256_set1_ps(inverse), q);
        let sum = _mm256_add_epi32(
            _mm256_add_epi32(ints[0], ints[1]),
            _mm256_add_epi32(ints[2], ints[3]),
        );
        rest[..4].copy_from_slice(&d.to_le_bytes());
        rest[4..].copy_from_slice(&(d * sum_i32x8(sum) as f32).to_le_bytes());
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn quantize_q8_256(x: &[f32], dst: &mut [u8]) {
    let blocks = dst.as_chunks_mut::<{ q8_256::BYTES }>().0;
    for (x, block) in x.as_chunks::<256>().0.iter().zip(blocks) {
        let groups = x.as_chunks::<32>().0;
        let values: [Values32; 8] = std::array::from_fn(|k| load32(&groups[k]));
        let (d, inverse) = scale_of(amax(&values));
        let inverse = _mm256_set1_ps(inverse);
        let (q, rest) = block.split_at_mut(256);
        let (bsums, scale) = rest.split_at_mut(32);
        let q = q.as_chunks_mut::<32>().0;
        let bsums = bsums.as_chunks_mut::<4>().0;
        for ((values, q), bsum) in values.iter().zip(q).zip(bsums) {
            let ints = quantize32(values, inverse, q);
            let first = sum_i32x8(_mm256_add_epi32(ints[0], ints[1])) as i16;
            let second = sum_i32x8(_mm256_add_epi32(ints[2], ints[3])) as i16;
            bsum[..2].copy_from_slice(&first.to_le_bytes());
            bsum[2..].copy_from_slice(&second.to_le_bytes());
        }
        scale.copy_from_slice(&d.to_le_bytes());
    }
}
