//! AVX2 dot products of the K-quants with Q8Block256 activations.
//!
//! Values are unsigned (Q6_K's offset of 32 is folded in through the activation sums), so
//! `maddubs` multiplies them with the activations directly, and `madd` then applies the
//! sub-block scales while widening to `i32`.

use std::arch::x86_64::*;

use crate::activation::q8_256;
use crate::bytes::{f32_at, u32_at};
use crate::simd::{array, f16_at, load128, load256, sum_f32x8};

/// Q4_K and Q5_K's 12 packed bytes as eight `u8` scales (bytes 0..8) and eight `u8` minimums
/// (bytes 8..16).
#[target_feature(enable = "avx2")]
#[inline]
fn scales_and_mins(block: &[u8]) -> __m128i {
    const LOW_6: u32 = 0x3f3f_3f3f;
    const LOW_4: u32 = 0x0f0f_0f0f;
    const LOW_2: u32 = 0x0303_0303;
    let (w0, w1, w2) = (u32_at(block, 4), u32_at(block, 8), u32_at(block, 12));
    let scales_low = w0 & LOW_6;
    let mins_low = w1 & LOW_6;
    let scales_high = (w2 & LOW_4) | (((w0 >> 6) & LOW_2) << 4);
    let mins_high = ((w2 >> 4) & LOW_4) | (((w1 >> 6) & LOW_2) << 4);
    _mm_set_epi32(
        mins_high as i32,
        mins_low as i32,
        scales_high as i32,
        scales_low as i32,
    )
}

/// `i16` lane `s` of `scales` broadcast to every lane.
#[target_feature(enable = "avx2")]
#[inline]
fn broadcast_i16(scales: __m256i, s: usize) -> __m256i {
    let pair = (2 * s) as i16 | (((2 * s + 1) as i16) << 8);
    _mm256_shuffle_epi8(scales, _mm256_set1_epi16(pair))
}

/// The minimums' share of a Q4_K or Q5_K block: `sum_s min[s] * (activation sum of sub-block s)`,
/// in four `i32` lanes.
#[target_feature(enable = "avx2")]
#[inline]
fn mins_times_sums(mins: __m128i, a: &[u8; q8_256::BYTES]) -> __m128i {
    let bsums = load256(array(a, q8_256::BSUMS));
    let sums = _mm_hadd_epi16(
        _mm256_castsi256_si128(bsums),
        _mm256_extracti128_si256(bsums, 1),
    );
    _mm_madd_epi16(mins, sums)
}

/// `scale_low * (q_low . x_low) + scale_high * (q_high . x_high)` in eight `i32` lanes, for two
/// 32-element sub-blocks of unsigned values below 64.
#[target_feature(enable = "avx2")]
#[inline]
fn sub_block_pair(
    q_low: __m256i,
    q_high: __m256i,
    x: &[u8; 64],
    scale_low: __m256i,
    scale_high: __m256i,
) -> __m256i {
    let low = _mm256_maddubs_epi16(q_low, load256(array(x, 0)));
    let high = _mm256_maddubs_epi16(q_high, load256(array(x, 32)));
    _mm256_add_epi32(
        _mm256_madd_epi16(scale_low, low),
        _mm256_madd_epi16(scale_high, high),
    )
}

/// The shared body of Q4_K and Q5_K: `fifth_bits(w, s)` gives the 16s to add to the nibbles of
/// sub-block `s` (zero for Q4_K).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn dot_with_mins<const BYTES: usize, const NIBBLES: usize>(
    weight: &[u8],
    activation: &[u8],
    fifth_bits: impl Fn(&[u8; BYTES]) -> [__m256i; 8],
) -> f32 {
    let weights = weight.as_chunks::<BYTES>().0;
    let activations = activation.as_chunks::<{ q8_256::BYTES }>().0;
    let low_nibbles = _mm256_set1_epi8(0x0f);
    let mut acc = _mm256_setzero_ps();
    let mut acc_mins = _mm_setzero_ps();
    for (w, a) in weights.iter().zip(activations) {
        let d = f32_at(a, q8_256::D);
        let scales_mins = _mm256_cvtepu8_epi16(scales_and_mins(w));
        let mins = _mm256_extracti128_si256(scales_mins, 1);
        let min_scale = -d * f16_at(w, 2);
        let min_products = _mm_cvtepi32_ps(mins_times_sums(mins, a));
        acc_mins = _mm_fmadd_ps(_mm_set1_ps(min_scale), min_products, acc_mins);

        let scales = _mm256_permute2x128_si256(scales_mins, scales_mins, 0x00);
        let high = fifth_bits(w);
        let mut sum = _mm256_setzero_si256();
        for j in 0..4 {
            let packed = load256(array(w, NIBBLES + 32 * j));
            let q_low = _mm256_and_si256(packed, low_nibbles);
            let q_high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibbles);
            let pair = sub_block_pair(
                _mm256_or_si256(q_low, high[2 * j]),
                _mm256_or_si256(q_high, high[2 * j + 1]),
                array(a, 64 * j),
                broadcast_i16(scales, 2 * j),
                broadcast_i16(scales, 2 * j + 1),
            );
            sum = _mm256_add_epi32(sum, pair);
        }
        let scale = _mm256_set1_ps(d * f16_at(w, 0));
        acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sum), acc);
    }
    let mins = _mm_add_ps(acc_mins, _mm_movehl_ps(acc_mins, acc_mins));
    let mins = _mm_add_ss(mins, _mm_movehdup_ps(mins));
    sum_f32x8(acc) + _mm_cvtss_f32(mins)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q4_k(weight: &[u8], activation: &[u8]) -> f32 {
    dot_with_mins::<144, 16>(weight, activation, |_| [_mm256_setzero_si256(); 8])
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q5_k(weight: &[u8], activation: &[u8]) -> f32 {
    dot_with_mins::<176, 48>(weight, activation, |w| {
        let bits = load256(array(w, 16));
        // Move bit s of every byte to bit 4: 16-bit shifts of at most 4 keep it in its byte.
        [
            _mm256_slli_epi16(bits, 4),
            _mm256_slli_epi16(bits, 3),
            _mm256_slli_epi16(bits, 2),
            _mm256_slli_epi16(bits, 1),
            bits,
            _mm256_srli_epi16(bits, 1),
            _mm256_srli_epi16(bits, 2),
            _mm256_srli_epi16(bits, 3),
        ]
        .map(|shifted| _mm256_and_si256(shifted, _mm256_set1_epi8(0x10)))
    })
}

/// Sixteen `i16` lanes: lanes 0..8 hold `i8` scale `g`, lanes 8..16 scale `g + 1`.
#[target_feature(enable = "avx2")]
#[inline]
fn q6_k_scale_pair(scales: __m128i, g: usize) -> __m256i {
    let low = _mm_set1_epi8(g as i8);
    let high = _mm_set1_epi8((g + 1) as i8);
    let selector = _mm_unpacklo_epi64(low, high);
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, selector))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q6_k(weight: &[u8], activation: &[u8]) -> f32 {
    let weights = weight.as_chunks::<210>().0;
    let activations = activation.as_chunks::<{ q8_256::BYTES }>().0;
    let low_nibbles = _mm256_set1_epi8(0x0f);
    let mut acc = _mm256_setzero_ps();
    for (w, a) in weights.iter().zip(activations) {
        let scales = load128(array(w, 192));
        // The offset of 32: 32 * sum_g scale[g] * (activation sum of group g).
        let bsums = load256(array(a, q8_256::BSUMS));
        let offset = _mm256_madd_epi16(bsums, _mm256_cvtepi8_epi16(scales));
        let mut sum = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offset, 5));
        for half in 0..2 {
            let low_a = load256(array(w, 64 * half));
            let low_b = load256(array(w, 64 * half + 32));
            let high = load256(array(w, 128 + 32 * half));
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(low_a, low_nibbles),
                    _mm256_slli_epi16(_mm256_and_si256(high, _mm256_set1_epi8(0x03)), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(low_b, low_nibbles),
                    _mm256_slli_epi16(_mm256_and_si256(high, _mm256_set1_epi8(0x0c)), 2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(low_a, 4), low_nibbles),
                    _mm256_and_si256(high, _mm256_set1_epi8(0x30)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(low_b, 4), low_nibbles),
                    _mm256_srli_epi16(_mm256_and_si256(high, _mm256_set1_epi8(-64)), 2),
                ),
            ];
            for (k, q) in q.into_iter().enumerate() {
                let x = load256(array(a, 128 * half + 32 * k));
                // Values below 64 times |x| <= 127, in pairs: no i16 overflow.
                let products = _mm256_maddubs_epi16(q, x);
                let scale = q6_k_scale_pair(scales, 8 * half + 2 * k);
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(scale, products));
            }
        }
        let scale = _mm256_set1_ps(f32_at(a, q8_256::D) * f16_at(w, 208));
        acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sum), acc);
    }
    sum_f32x8(acc)
}
