//! AVX-512 dot product of Q6_K with SplitQ8Block256 activations: its bit assembly, which costs
//! more than its multiplications, works on 512 bits with `vpternlog` and per-lane shifts, and
//! VNNI's `vpdpwssd` applies the scales. Each weight block is unpacked once for the parts of the
//! activations it multiplies.

use std::arch::x86_64::*;

use crate::activation::split256;
use crate::bytes::f32_at;
use crate::simd::{
    array, dpwssd512, f16_at, load128, load256, load512, prefetch_ahead_of_rows, sum_f32x16,
};

/// `(a & 0x0f) | b`, for `b` without bits in the low nibble.
#[target_feature(enable = "avx512f")]
#[inline]
fn low_nibbles_or(a: __m512i, b: __m512i) -> __m512i {
    _mm512_ternarylogic_epi32(a, _mm512_set1_epi8(0x0f), b, 0xea)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn dot_q6_k<const PARTS: usize>(weight: &[u8], activation: &[u8]) -> f32 {
    dot_q6_k_rows::<PARTS, 1>(weight, [activation])[0]
}

/// Q6_K with `R` activation rows, the weights unpacked once for `PARTS` parts of all of them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn dot_q6_k_rows<const PARTS: usize, const R: usize>(
    weight: &[u8],
    activations: [&[u8]; R],
) -> [f32; R] {
    let weights = weight.as_chunks::<210>().0;
    let rows = activations.map(|a| a.as_chunks::<{ split256::BYTES }>().0);
    let bits_4_5 = _mm512_set1_epi8(0x30);
    // Per 256-bit half: where the high bits of the first and of the second 32 values sit.
    let to_bit_4_first = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    let to_bit_4_second = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    // Scale index of each i16 lane of a product vector: four groups of 16 values per 64.
    let group_of_lane: [__m512i; 4] = std::array::from_fn(|k| {
        let first = 4 * k as i16;
        let [a, b, c, d] = [first, first + 1, first + 2, first + 3];
        _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_setr_epi16(
                a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b,
            )),
            _mm256_setr_epi16(c, c, c, c, c, c, c, c, d, d, d, d, d, d, d, d),
            1,
        )
    });
    let mut acc = [_mm512_setzero_ps(); R];
    for (i, w) in weights.iter().enumerate() {
        prefetch_ahead_of_rows::<R>(w);
        let d = f16_at(w, 208);
        let scales_i8 = load128(array(w, 192));
        // The offset of 32: -32 * d * sum_g scale[g] * (activation sum of group g).
        let offsets = _mm512_mul_ps(
            _mm512_set1_ps(-32.0 * d),
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(scales_i8)),
        );
        for (acc, row) in acc.iter_mut().zip(&rows) {
            let sums = load512(array(&row[i], split256::SUMS));
            *acc = _mm512_fmadd_ps(offsets, _mm512_castsi512_ps(sums), *acc);
        }
        let scales = _mm256_cvtepi8_epi16(scales_i8);
        // One accumulator per row and part: two chains of VNNI's multiply-adds, which take 5
        // cycles each, per row.
        let mut sums = [[_mm512_setzero_si512(); PARTS]; R];
        let wide_scales = _mm512_castsi256_si512(scales);
        for half in 0..2 {
            let low = load512(array(w, 64 * half));
            let high = _mm512_broadcast_i64x4(load256(array(w, 128 + 32 * half)));
            // Values 0..64 and 64..128 of this half, each below 64.
            let first = low_nibbles_or(
                low,
                _mm512_and_si512(_mm512_sllv_epi16(high, to_bit_4_first), bits_4_5),
            );
            let second = low_nibbles_or(
                _mm512_srli_epi16(low, 4),
                _mm512_and_si512(_mm512_srlv_epi16(high, to_bit_4_second), bits_4_5),
            );
            for (k, q) in [(2 * half, first), (2 * half + 1, second)] {
                let scale = _mm512_permutexvar_epi16(group_of_lane[k], wide_scales);
                for (sums, row) in sums.iter_mut().zip(&rows) {
                    for (sum, part) in sums.iter_mut().zip(&split256::PARTS[..PARTS]) {
                        let x = load512(array(&row[i], part.values + 64 * k));
                        // Values below 64 times |x| <= 127, in pairs: no i16 overflow.
                        let products = _mm512_maddubs_epi16(q, x);
                        *sum = dpwssd512(*sum, products, scale);
                    }
                }
            }
        }
        let d = _mm512_set1_ps(d);
        for ((acc, sums), row) in acc.iter_mut().zip(sums).zip(&rows) {
            for (sum, part) in sums.into_iter().zip(&split256::PARTS[..PARTS]) {
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(f32_at(&row[i], part.d)));
                *acc = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sum), *acc);
            }
        }
    }
    acc.map(|acc| sum_f32x16(acc))
}
