//! AVX2 dot products of the K-quants with SplitQ8Block256 activations.
//!
//! Values are unsigned (Q6_K's offset of 32 is folded in, as the minimums of Q4_K and Q5_K are,
//! through the activations' `f32` sums of 16 elements), so
//! `maddubs` multiplies them with the activations directly, and `madd` then applies the
//! sub-block scales while widening to `i32`. Each weight block is unpacked once and multiplied
//! with both parts of each activation row, into one `i32` sum per part; the parts' scales are
//! applied in `f32` at the end of the block.

use std::arch::x86_64::*;

use crate::activation::split256;
use crate::bytes::f32_at;
use crate::simd::{
    array, f16_at, load_f32x8, load128, load256, prefetch_ahead_of_rows, store256, sum_f32x8,
};

/// Blocks whose scales are unpacked, in a first pass, before their products are taken.
const BATCH: usize = 8;

/// Q4_K and Q5_K's eight scales and eight minimums from their 12 packed bytes, each widened to
/// the `i32` `(v << 16) | v`: two equal `i16` lanes, the multiplier `madd` wants.
///
/// The packing: bytes 0..4 hold scales 0..4 in their low 6 bits, bytes 4..8 minimums 0..4;
/// bytes 8..12 hold the low 4 bits of scales 4..8 and, in their high nibbles, of minimums 4..8,
/// whose top 2 bits are the top bits of bytes 0..4 and 4..8.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn scale_and_min_pairs(block: &[u8]) -> (__m256i, __m256i) {
    const Z: i8 = -128; // a shuffle index that yields 0
    let packed = _mm256_broadcastsi128_si256(load128(array(block, 4)));
    // Per lane: [bytes 0..4, 8..12, 4..8, 8..12], and the bytes whose top bits complete 4..8.
    let spread = _mm256_shuffle_epi8(
        packed,
        _mm256_broadcastsi128_si256(_mm_setr_epi8(
            0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11,
        )),
    );
    let tops = _mm256_shuffle_epi8(
        packed,
        _mm256_broadcastsi128_si256(_mm_setr_epi8(
            Z, Z, Z, Z, 0, 1, 2, 3, Z, Z, Z, Z, 4, 5, 6, 7,
        )),
    );
    let low = _mm256_and_si256(
        spread,
        _mm256_broadcastsi128_si256(_mm_setr_epi8(
            63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0,
        )),
    );
    let high_nibbles = _mm256_and_si256(
        _mm256_srli_epi16(spread, 4),
        _mm256_broadcastsi128_si256(_mm_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15,
        )),
    );
    let top_bits = _mm256_and_si256(_mm256_srli_epi16(tops, 2), _mm256_set1_epi8(0x30));
    // Per lane: scales 0..8, then minimums 0..8.
    let values = _mm256_or_si256(_mm256_or_si256(low, high_nibbles), top_bits);
    let scales = _mm256_shuffle_epi8(
        values,
        _mm256_setr_epi8(
            0, Z, 0, Z, 1, Z, 1, Z, 2, Z, 2, Z, 3, Z, 3, Z, 4, Z, 4, Z, 5, Z, 5, Z, 6, Z, 6, Z, 7,
            Z, 7, Z,
        ),
    );
    let mins = _mm256_shuffle_epi8(
        values,
        _mm256_setr_epi8(
            8, Z, 8, Z, 9, Z, 9, Z, 10, Z, 10, Z, 11, Z, 11, Z, 12, Z, 12, Z, 13, Z, 13, Z, 14, Z,
            14, Z, 15, Z, 15, Z,
        ),
    );
    (scales, mins)
}

/// The shared body of Q4_K and Q5_K, for one weight row and `R` activation rows:
/// `fifth_bits(w)` gives the 16s to add to the nibbles of each sub-block (zero for Q4_K).
///
/// A first pass over a batch of blocks unpacks their scales into a buffer and takes the
/// minimums' share; the second takes the products, broadcasting each scale from the buffer with
/// a load. Broadcasting it from a register instead would take one or two shuffles per sub-block,
/// and the shuffle unit is what limits this kernel. The weights are unpacked once for both parts
/// of all the activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn dot_with_mins<
    const BYTES: usize,
    const NIBBLES: usize,
    const PARTS: usize,
    const R: usize,
>(
    weight: &[u8],
    activations: [&[u8]; R],
    fifth_bits: impl Fn(&[u8; BYTES]) -> [__m256i; 8],
) -> [f32; R] {
    let weights = weight.as_chunks::<BYTES>().0;
    let rows = activations.map(|a| a.as_chunks::<{ split256::BYTES }>().0);
    let low_nibbles = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); R];
    for (batch, weights) in weights.chunks(BATCH).enumerate() {
        let first = batch * BATCH;
        let mut scales = [[0u8; 32]; BATCH];
        for ((i, w), scales) in weights.iter().enumerate().zip(&mut scales) {
            let (scale_pairs, min_pairs) = scale_and_min_pairs(w);
            store256(scales, scale_pairs);
            // Times -dmin, each minimum twice: once for each 16-element sum of its sub-block.
            let dmin = _mm256_set1_ps(-f16_at(w, 2));
            let low = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(min_pairs));
            let high = _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(min_pairs));
            let mins_low = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(low));
            let mins_high = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(high));
            for (acc, row) in acc.iter_mut().zip(&rows) {
                let sums = array::<_, 64>(&row[first + i], split256::SUMS);
                *acc = _mm256_fmadd_ps(mins_low, load_f32x8(array(sums, 0)), *acc);
                *acc = _mm256_fmadd_ps(mins_high, load_f32x8(array(sums, 32)), *acc);
            }
        }
        for ((i, w), scales) in weights.iter().enumerate().zip(&scales) {
            prefetch_ahead_of_rows::<R>(w);
            let scale = |s: usize| _mm256_set1_epi32(i32::from_le_bytes(*array(scales, 4 * s)));
            let high = fifth_bits(w);
            let mut sums = [[_mm256_setzero_si256(); PARTS]; R];
            for j in 0..4 {
                let packed = load256(array(w, NIBBLES + 32 * j));
                let q_low = _mm256_and_si256(packed, low_nibbles);
                let q_high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibbles);
                let q_low = _mm256_or_si256(q_low, high[2 * j]);
                let q_high = _mm256_or_si256(q_high, high[2 * j + 1]);
                for (sums, row) in sums.iter_mut().zip(&rows) {
                    let x = &row[first + i];
                    for (sum, part) in sums.iter_mut().zip(&split256::PARTS[..PARTS]) {
                        let at = part.values + 64 * j;
                        // Unsigned values below 32 times |x| <= 127, in pairs: no i16 overflow.
                        let low = _mm256_maddubs_epi16(q_low, load256(array(x, at)));
                        let high = _mm256_maddubs_epi16(q_high, load256(array(x, at + 32)));
                        let pair = _mm256_add_epi32(
                            _mm256_madd_epi16(scale(2 * j), low),
                            _mm256_madd_epi16(scale(2 * j + 1), high),
                        );
                        *sum = _mm256_add_epi32(*sum, pair);
                    }
                }
            }
            let d = _mm256_set1_ps(f16_at(w, 0));
            for ((acc, sums), row) in acc.iter_mut().zip(sums).zip(&rows) {
                for (sum, part) in sums.into_iter().zip(&split256::PARTS[..PARTS]) {
                    let scale = _mm256_mul_ps(d, _mm256_set1_ps(f32_at(&row[first + i], part.d)));
                    *acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sum), *acc);
                }
            }
        }
    }
    acc.map(|acc| sum_f32x8(acc))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q4_k<const PARTS: usize>(weight: &[u8], activation: &[u8]) -> f32 {
    dot_q4_k_rows::<PARTS, 1>(weight, [activation])[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q4_k_rows<const PARTS: usize, const R: usize>(
    weight: &[u8],
    activations: [&[u8]; R],
) -> [f32; R] {
    dot_with_mins::<144, 16, PARTS, R>(weight, activations, |_| [_mm256_setzero_si256(); 8])
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q5_k<const PARTS: usize>(weight: &[u8], activation: &[u8]) -> f32 {
    dot_q5_k_rows::<PARTS, 1>(weight, [activation])[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q5_k_rows<const PARTS: usize, const R: usize>(
    weight: &[u8],
    activations: [&[u8]; R],
) -> [f32; R] {
    dot_with_mins::<176, 48, PARTS, R>(weight, activations, |w| q5_k_fifth_bits(w))
}

/// 16 in byte `l` of sub-block `s` where bit `s` of Q5_K's high-bit byte `l` is set.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn q5_k_fifth_bits(w: &[u8; 176]) -> [__m256i; 8] {
    let bits = load256(array(w, 16));
    let sixteen = _mm256_set1_epi8(0x10);
    // Move bit s of every byte to bit 4: 16-bit shifts of at most 4 keep it in its byte.
    [
        _mm256_and_si256(_mm256_slli_epi16(bits, 4), sixteen),
        _mm256_and_si256(_mm256_slli_epi16(bits, 3), sixteen),
        _mm256_and_si256(_mm256_slli_epi16(bits, 2), sixteen),
        _mm256_and_si256(_mm256_slli_epi16(bits, 1), sixteen),
        _mm256_and_si256(bits, sixteen),
        _mm256_and_si256(_mm256_srli_epi16(bits, 1), sixteen),
        _mm256_and_si256(_mm256_srli_epi16(bits, 2), sixteen),
        _mm256_and_si256(_mm256_srli_epi16(bits, 3), sixteen),
    ]
}

/// Byte shuffles that take, from eight `i16` scales repeated in both 128-bit lanes, scale `2k`
/// into every lane of the low half and scale `2k + 1` into every lane of the high half: the
/// multipliers of two 16-element groups of Q6_K.
static Q6_K_SCALE_PAIRS: [[u8; 32]; 4] = {
    let mut masks = [[0; 32]; 4];
    let mut k = 0;
    while k < 4 {
        let mut i = 0;
        while i < 32 {
            let scale = 2 * k + i / 16;
            masks[k][i] = (2 * scale + i % 2) as u8;
            i += 1;
        }
        k += 1;
    }
    masks
};

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q6_k<const PARTS: usize>(weight: &[u8], activation: &[u8]) -> f32 {
    dot_q6_k_rows::<PARTS, 1>(weight, [activation])[0]
}

/// Q6_K with `R` activation rows, the weights unpacked once for `PARTS` parts of all of them.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn dot_q6_k_rows<const PARTS: usize, const R: usize>(
    weight: &[u8],
    activations: [&[u8]; R],
) -> [f32; R] {
    let weights = weight.as_chunks::<210>().0;
    let rows = activations.map(|a| a.as_chunks::<{ split256::BYTES }>().0);
    let low_nibbles = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); R];
    // Hidden from the optimiser, which would otherwise turn each one-instruction shuffle by a
    // constant mask into two or three cheaper-looking ones, all on the busiest port.
    let pair_masks = std::hint::black_box(&Q6_K_SCALE_PAIRS);
    for (i, w) in weights.iter().enumerate() {
        prefetch_ahead_of_rows::<R>(w);
        let d = f16_at(w, 208);
        // The offset of 32: -32 * d * sum_g scale[g] * (activation sum of group g).
        let offset_scale = _mm256_set1_ps(-32.0 * d);
        let group_scales = |at: usize| {
            let scales = _mm_set1_epi64x(i64::from_le_bytes(*array(w, at)));
            _mm256_mul_ps(
                offset_scale,
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scales)),
            )
        };
        let (offsets_low, offsets_high) = (group_scales(192), group_scales(200));
        for (acc, row) in acc.iter_mut().zip(&rows) {
            let sums = array::<_, 64>(&row[i], split256::SUMS);
            *acc = _mm256_fmadd_ps(offsets_low, load_f32x8(array(sums, 0)), *acc);
            *acc = _mm256_fmadd_ps(offsets_high, load_f32x8(array(sums, 32)), *acc);
        }
        let mut sums = [[_mm256_setzero_si256(); PARTS]; R];
        // Scales 0..8 and 8..16 as i16, each set repeated in both lanes.
        let scale_halves = [192, 200]
            .map(|at| _mm256_cvtepi8_epi16(_mm_set1_epi64x(i64::from_le_bytes(*array(w, at)))));
        for (half, scales) in scale_halves.into_iter().enumerate() {
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
                let scale = _mm256_shuffle_epi8(scales, load256(&pair_masks[k]));
                for (sums, row) in sums.iter_mut().zip(&rows) {
                    for (sum, part) in sums.iter_mut().zip(&split256::PARTS[..PARTS]) {
                        let x = load256(array(&row[i], part.values + 128 * half + 32 * k));
                        // Values below 64 times |x| <= 127, in pairs: no i16 overflow.
                        let products = _mm256_maddubs_epi16(q, x);
                        *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(scale, products));
                    }
                }
            }
        }
        let d = _mm256_set1_ps(d);
        for ((acc, sums), row) in acc.iter_mut().zip(sums).zip(&rows) {
            for (sum, part) in sums.into_iter().zip(&split256::PARTS[..PARTS]) {
                let scale = _mm256_mul_ps(d, _mm256_set1_ps(f32_at(&row[i], part.d)));
                *acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sum), *acc);
            }
        }
    }
    acc.map(|acc| sum_f32x8(acc))
}
