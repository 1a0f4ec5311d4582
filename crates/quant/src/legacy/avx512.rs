//! AVX-512 dot products of the legacy formats with SplitQ8Block32 activations.
//!
//! The two parts of an activation block lie side by side, 64 bytes: one 512-bit vector. Each
//! weight block's 32 values are unpacked once into both halves of a vector, and VNNI's
//! `vpdpbusd` multiplies them with both parts at once: lanes 0..8 sum the high part's products,
//! lanes 8..16 the low part's. As in the AVX2 kernels, blocks go in groups of eight whose scales
//! are gathered into vectors; one transposing reduction turns a group's eight product vectors
//! into its sixteen sums, scaled together. Q5's fifth bits are added under a byte mask, and Q8_0's
//! signed values are made unsigned by flipping their sign bit, which adds 128, taken back out
//! through the activation sums.
//!
//! Single-part activations (`PARTS` = 1) fill a vector with two blocks instead: the values of
//! blocks `2m` and `2m + 1` side by side against the high parts of their activations, half the
//! multiplies and the transposing reduction of four vectors instead of eight.

use std::arch::x86_64::*;

use super::avx2::{Bias, GROUP, activation_field, weight_scales};
use crate::activation::split32;
use crate::simd::{
    array, load128, load256, load512, prefetch_ahead_of_rows, sum_f32x8, sum_f32x16,
};

// One 64-byte load takes both parts of a block.
const _: () = assert!(split32::PARTS[0].values == 0 && split32::PARTS[1].values == 32);

/// The sums of the eight lanes of each part of eight blocks' products: lanes 0..4 hold the high
/// part's of blocks 0..4, lanes 4..8 their low part's, lanes 8..16 the same for blocks 4..8.
#[target_feature(enable = "avx512f")]
#[inline]
fn block_sums(v: [__m512i; GROUP]) -> __m512i {
    // Per 128-bit lane, [a0 + a2, b0 + b2, a1 + a3, b1 + b3].
    let pair = |a, b| _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    // Per 128-bit lane, the sums of its four values for four vectors.
    let quad = |a, b| _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    let first = quad(pair(v[0], v[1]), pair(v[2], v[3]));
    let second = quad(pair(v[4], v[5]), pair(v[6], v[7]));
    // 128-bit lanes 0 and 1 hold the high part, 2 and 3 the low part: add them in pairs.
    _mm512_add_epi32(
        _mm512_shuffle_i32x4::<0b10_00_10_00>(first, second),
        _mm512_shuffle_i32x4::<0b11_01_11_01>(first, second),
    )
}

/// Per lane of [`block_sums`]' order, the activation block's scale of that part.
#[target_feature(enable = "avx512f")]
#[inline]
fn activation_scales(blocks: &[[u8; split32::BYTES]; GROUP]) -> __m512 {
    let [hi, lo] = split32::PARTS.map(|part| part.d as i32);
    let stride = split32::BYTES as i32;
    let offsets = _mm512_setr_epi32(
        hi,
        hi + stride,
        hi + 2 * stride,
        hi + 3 * stride,
        lo,
        lo + stride,
        lo + 2 * stride,
        lo + 3 * stride,
        hi + 4 * stride,
        hi + 5 * stride,
        hi + 6 * stride,
        hi + 7 * stride,
        lo + 4 * stride,
        lo + 5 * stride,
        lo + 6 * stride,
        lo + 7 * stride,
    );
    // SAFETY: every lane reads the 4 bytes of a scale field (at byte 64 or 68 of 76) of one of
    // the eight blocks of `blocks`.
    unsafe { _mm512_i32gather_ps::<1>(offsets, blocks.as_ptr().cast()) }
}

/// The sums of the eight lanes of each block of four vectors of two blocks each (block `2m` in
/// the low half of vector `m`, block `2m + 1` in the high half), in block order.
#[target_feature(enable = "avx512f,avx2")]
#[inline]
fn paired_block_sums(v: [__m512i; GROUP / 2]) -> __m256i {
    let pair = |a, b| _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    let quad = |a, b| _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    // Per 128-bit lane L: the sums of lane L of vectors 0..4.
    let sums = quad(pair(v[0], v[1]), pair(v[2], v[3]));
    let (low, high) = (
        _mm512_castsi512_si256(sums),
        _mm512_extracti64x4_epi64::<1>(sums),
    );
    // Lanes 0 and 1 hold the even blocks, lanes 2 and 3 the odd ones.
    let even = _mm_add_epi32(
        _mm256_castsi256_si128(low),
        _mm256_extracti128_si256::<1>(low),
    );
    let odd = _mm_add_epi32(
        _mm256_castsi256_si128(high),
        _mm256_extracti128_si256::<1>(high),
    );
    _mm256_set_m128i(_mm_unpackhi_epi32(even, odd), _mm_unpacklo_epi32(even, odd))
}

/// The dot products of `weight`, legacy blocks of `BYTES` bytes whose `bias` is folded in
/// through the activation sums, with `R` activation rows of `PARTS` parts; `values(w)` unpacks
/// one block's unsigned values into both halves of a vector, once for all the rows. Each row's
/// arithmetic is the same whatever `R`, so every row's result equals its single-row dot
/// product, bit for bit.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn dot_blocks<const BYTES: usize, const PARTS: usize, const R: usize>(
    weight: &[u8],
    activations: [&[u8]; R],
    bias: Bias,
    values: impl Fn(&[u8; BYTES]) -> __m512i,
) -> [f32; R] {
    // Each block's weight scale, in block_sums' order.
    let weight_lanes = _mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7);
    let mut acc = [_mm512_setzero_ps(); R];
    // With one part a group's block sums come in eight lanes, in block order.
    let mut single_acc = [_mm256_setzero_ps(); R];
    let mut bias_acc = [_mm256_setzero_ps(); R];
    let (weight_groups, weight_rest) = weight.as_chunks::<BYTES>().0.as_chunks::<GROUP>();
    let rows = activations.map(|a| a.as_chunks::<{ split32::BYTES }>().0.as_chunks::<GROUP>());
    // The last group of a row, padded with zero blocks, which add nothing.
    let mut padded_weights = [[0; BYTES]; GROUP];
    let mut padded_rows = [[[0; split32::BYTES]; GROUP]; R];
    if !weight_rest.is_empty() {
        padded_weights[..weight_rest.len()].copy_from_slice(weight_rest);
        for (padded, (_, rest)) in padded_rows.iter_mut().zip(&rows) {
            padded[..rest.len()].copy_from_slice(rest);
        }
    }
    let tail = (!weight_rest.is_empty()).then_some(weight_groups.len());
    for g in (0..weight_groups.len()).chain(tail) {
        let w = weight_groups.get(g).unwrap_or(&padded_weights);
        let q: [__m512i; GROUP] = std::array::from_fn(|b| {
            prefetch_ahead_of_rows::<R>(&w[b]);
            values(&w[b])
        });
        let (d, weight_bias) = weight_scales(w, bias);
        if PARTS == 1 {
            let pairs: [__m512i; GROUP / 2] =
                std::array::from_fn(|m| _mm512_mask_blend_epi64(0xf0, q[2 * m], q[2 * m + 1]));
            for (r, ((acc, bias_acc), (groups, _))) in single_acc
                .iter_mut()
                .zip(&mut bias_acc)
                .zip(&rows)
                .enumerate()
            {
                let x = groups.get(g).unwrap_or(&padded_rows[r]);
                let products: [__m512i; GROUP / 2] = std::array::from_fn(|m| {
                    let high_parts = _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512(load256(array(&x[2 * m], 0))),
                        load256(array(&x[2 * m + 1], 0)),
                    );
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), pairs[m], high_parts)
                });
                let scales = _mm256_mul_ps(d, activation_field(x, split32::PARTS[0].d));
                let sums = _mm256_cvtepi32_ps(paired_block_sums(products));
                *acc = _mm256_fmadd_ps(scales, sums, *acc);
                let activation_sum = activation_field(x, split32::SUM);
                *bias_acc = _mm256_fmadd_ps(weight_bias, activation_sum, *bias_acc);
            }
            continue;
        }
        let d = _mm512_permutexvar_ps(weight_lanes, _mm512_castps256_ps512(d));
        for (r, ((acc, bias_acc), (groups, _))) in
            acc.iter_mut().zip(&mut bias_acc).zip(&rows).enumerate()
        {
            let x = groups.get(g).unwrap_or(&padded_rows[r]);
            let products: [__m512i; GROUP] =
                std::array::from_fn(|b| unsigned_products(q[b], &x[b]));
            let scales = _mm512_mul_ps(d, activation_scales(x));
            *acc = _mm512_fmadd_ps(scales, _mm512_cvtepi32_ps(block_sums(products)), *acc);
            let activation_sum = activation_field(x, split32::SUM);
            *bias_acc = _mm256_fmadd_ps(weight_bias, activation_sum, *bias_acc);
        }
    }
    std::array::from_fn(|r| {
        sum_f32x16(acc[r]) + sum_f32x8(_mm256_add_ps(single_acc[r], bias_acc[r]))
    })
}

/// The 32 nibbles of 16 bytes, in both halves: the low ones are elements 0..16, the high ones
/// 16..32.
#[target_feature(enable = "avx512f")]
#[inline]
fn nibbles(packed: &[u8; 16]) -> __m512i {
    let all = _mm512_broadcast_i32x4(load128(packed));
    let shifted = _mm512_srlv_epi64(all, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    _mm512_and_si512(shifted, _mm512_set1_epi8(0x0f))
}

/// The nibbles at `packed`, plus 16 where the little-endian bits at `bits` are set, in both
/// halves.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn five_bit_values(packed: &[u8; 16], bits: &[u8; 4]) -> __m512i {
    let low = nibbles(packed);
    let bits = u64::from(u32::from_le_bytes(*bits));
    let fifth = _cvtu64_mask64(bits | bits << 32);
    _mm512_mask_add_epi8(low, fifth, low, _mm512_set1_epi8(16))
}

/// `q . x` of unsigned values, in both halves, with both parts of the activations.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
fn unsigned_products(q: __m512i, x: &[u8; split32::BYTES]) -> __m512i {
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, load512(array(x, 0)))
}

/// Implements, for each legacy format, the dot product for one activation row and the
/// const-generic one for `R` rows, both on [`dot_blocks`].
macro_rules! legacy_kernels {
    ($($dot:ident, $dot_rows:ident: $bytes:literal, $bias:expr, |$w:ident| $values:expr;)*) => {$(
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(super) fn $dot<const PARTS: usize>(weight: &[u8], activation: &[u8]) -> f32 {
            $dot_rows::<PARTS, 1>(weight, [activation])[0]
        }

        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(super) fn $dot_rows<const PARTS: usize, const R: usize>(
            weight: &[u8],
            activations: [&[u8]; R],
        ) -> [f32; R] {
            dot_blocks::<$bytes, PARTS, R>(
                weight,
                activations,
                $bias,
                |$w: &[u8; $bytes]| $values,
            )
        }
    )*};
}

legacy_kernels! {
    dot_q4_0, dot_q4_0_rows: 18, Bias::Offset(-8.0), |w| nibbles(array(w, 2));
    dot_q4_1, dot_q4_1_rows: 20, Bias::Min, |w| nibbles(array(w, 4));
    dot_q5_1, dot_q5_1_rows: 24, Bias::Min, |w| five_bit_values(array(w, 8), array(w, 4));
    // Q8_0's signed values are made unsigned by flipping their sign bit.
    dot_q8_0, dot_q8_0_rows: 34, Bias::Offset(-128.0), |w| _mm512_xor_si512(
        _mm512_broadcast_i64x4(load256(array(w, 2))),
        _mm512_set1_epi8(-128),
    );
}
