//! AVX-512 dot products of Q5_K with SplitQ8Block256 activations, on GGUF's blocks. (Q4_K's
//! AVX-512 kernel takes its weights repacked: see `repacked_q4_k`, whose layout needs half the
//! multiplies of this one; Q5_K, which no model here uses, has not been repacked yet.)
//!
//! Where 512-bit integer multiplies issue on two ports (as on Sapphire Rapids, where this was
//! measured), a 512-bit vector covers two sub-blocks at the cost of one 256-bit multiply, and the
//! two parts of the activations double the multiplies: this kernel takes each 32-byte chunk of
//! nibbles as one vector, its low nibbles (sub-block `2j`) in the low half and its high nibbles
//! (sub-block `2j + 1`) in the high half, against the 64 activations of those two sub-blocks,
//! contiguous in each part. VNNI's `vpdpwssd` applies the sub-block scales and accumulates.

use std::arch::x86_64::*;

use super::avx2::scale_and_min_pairs;
use crate::activation::split256;
use crate::bytes::f32_at;
use crate::simd::{array, dpwssd512, f16_at, load256, load512, prefetch_ahead_of_rows, sum_f32x16};

/// Q5_K's body, for one weight row and `R` activation rows, `PARTS` parts of each:
/// `fifth_bits(w)` gives, per chunk of nibbles, the 16s to add to its values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn dot_with_mins<const BYTES: usize, const NIBBLES: usize, const PARTS: usize, const R: usize>(
    weight: &[u8],
    activations: [&[u8]; R],
    fifth_bits: impl Fn(&[u8; BYTES]) -> [__m512i; 4],
) -> [f32; R] {
    let weights = weight.as_chunks::<BYTES>().0;
    let rows = activations.map(|a| a.as_chunks::<{ split256::BYTES }>().0);
    let low_nibbles = _mm512_set1_epi8(0x0f);
    // Shifts the high half's 16-bit lanes by 4: their high nibbles come down.
    let high_half_down = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    // Per chunk, the index of the scale pair each i32 lane takes: 2j in the low half, 2j + 1 in
    // the high half.
    let scale_of_lane: [__m512i; 4] = std::array::from_fn(|j| {
        let j = j as i32;
        _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_set1_epi32(2 * j)),
            _mm256_set1_epi32(2 * j + 1),
            1,
        )
    });
    let mut acc = [_mm512_setzero_ps(); R];
    for (i, w) in weights.iter().enumerate() {
        prefetch_ahead_of_rows::<R>(w);
        let (scale_pairs, min_pairs) = scale_and_min_pairs(w);
        let (d, dmin) = (f16_at(w, 0), f16_at(w, 2));
        // Times -dmin, each minimum twice: once for each 16-element sum of its sub-block.
        let mins = _mm512_mul_ps(
            _mm512_set1_ps(-dmin),
            _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(min_pairs)),
        );
        for (acc, row) in acc.iter_mut().zip(&rows) {
            let sums = load512(array(&row[i], split256::SUMS));
            *acc = _mm512_fmadd_ps(mins, _mm512_castsi512_ps(sums), *acc);
        }
        let scale_pairs = _mm512_castsi256_si512(scale_pairs);
        let high = fifth_bits(w);
        let mut sums = [[_mm512_setzero_si512(); PARTS]; R];
        for (j, high) in high.into_iter().enumerate() {
            let packed = _mm512_broadcast_i64x4(load256(array(w, NIBBLES + 32 * j)));
            let q = _mm512_and_si512(_mm512_srlv_epi16(packed, high_half_down), low_nibbles);
            let q = _mm512_or_si512(q, high);
            let scale = _mm512_permutexvar_epi32(scale_of_lane[j], scale_pairs);
            for (sums, row) in sums.iter_mut().zip(&rows) {
                for (sum, part) in sums.iter_mut().zip(&split256::PARTS[..PARTS]) {
                    let x = load512(array(&row[i], part.values + 64 * j));
                    // Unsigned values below 32 times |x| <= 127, in pairs: no i16 overflow;
                    // four chunks of scales below 64 times pairs of those keep an i32 lane
                    // below 2^23.
                    let products = _mm512_maddubs_epi16(q, x);
                    *sum = dpwssd512(*sum, products, scale);
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

/// 16 in each byte of Q5_K's values whose fifth bit is set, per chunk of nibbles: bit `s` of
/// high-bit byte `l` belongs to element `l` of sub-block `s`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
fn q5_k_fifth_bits(w: &[u8; 176]) -> [__m512i; 4] {
    let bits = _mm512_broadcast_i64x4(load256(array(w, 16)));
    let sixteen = _mm512_set1_epi8(0x10);
    std::array::from_fn(|j| {
        let (low, high) = (1u8 << (2 * j), 1u8 << (2 * j + 1));
        let select = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_set1_epi8(low as i8)),
            _mm256_set1_epi8(high as i8),
            1,
        );
        _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(bits, select), sixteen)
    })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn dot_q5_k<const PARTS: usize>(weight: &[u8], activation: &[u8]) -> f32 {
    dot_q5_k_rows::<PARTS, 1>(weight, [activation])[0]
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn dot_q5_k_rows<const PARTS: usize, const R: usize>(
    weight: &[u8],
    activations: [&[u8]; R],
) -> [f32; R] {
    dot_with_mins::<176, 48, PARTS, R>(weight, activations, |w| q5_k_fifth_bits(w))
}
