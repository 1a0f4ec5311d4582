//! AVX2 dot products of the legacy formats with SplitQ8Block32 activations.
//!
//! Blocks go in groups of eight. For a group, the scales of weights and activations are gathered
//! into vectors (one lane per block) and multiplied once, and the offset or minimum of each weight
//! block is folded in with the activation block's sum:
//! `d * (d_hi * q . hi + d_lo * q . lo) + bias * sum(x)`, for all eight blocks in a few
//! multiply-adds. Each block then only unpacks its values once, multiplies them with both parts
//! of its activations and adds them, scaled by its lanes of the group's scales. The 4- and 5-bit
//! formats multiply their unsigned values directly: `maddubs` takes one unsigned and one signed
//! operand.

use std::arch::x86_64::*;

use crate::activation::split32;
use crate::simd::{array, load128, load256, sum_i16_pairs};

/// Blocks whose scales are gathered together.
pub(super) const GROUP: usize = 8;

/// What a weight block adds to `d * q . x`, as a multiple of the activations' sum.
#[derive(Clone, Copy)]
pub(super) enum Bias {
    /// `offset * d`: symmetric formats store values offset to be unsigned (0 for Q8_0).
    Offset(f32),
    /// The `f16` minimum stored after `d`.
    Min,
}

/// Per block of the group, `d` and the bias per unit of activation sum.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn weight_scales<const BYTES: usize>(
    blocks: &[[u8; BYTES]; GROUP],
    bias: Bias,
) -> (__m256, __m256) {
    let stride = BYTES as i32;
    let offsets = _mm256_mullo_epi32(
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        _mm256_set1_epi32(stride),
    );
    // SAFETY: lane k reads the 4 bytes at the start of block k, inside `blocks` (a block has
    // at least 18 bytes).
    let fields = unsafe { _mm256_i32gather_epi32::<1>(blocks.as_ptr().cast(), offsets) };
    // `d` is the low half of each field, the minimum (if any) the high half.
    let low = _mm256_and_si256(fields, _mm256_set1_epi32(0xffff));
    let high = _mm256_srli_epi32(fields, 16);
    let halves = _mm256_permute4x64_epi64(_mm256_packus_epi32(low, high), 0b11_01_10_00);
    let d = _mm256_cvtph_ps(_mm256_castsi256_si128(halves));
    let bias = match bias {
        Bias::Offset(offset) => _mm256_mul_ps(d, _mm256_set1_ps(offset)),
        Bias::Min => _mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1)),
    };
    (d, bias)
}

/// Per block of the group, the `f32` at byte `field` of the activation block.
#[target_feature(enable = "avx2")]
#[inline]
fn activation_field(blocks: &[[u8; split32::BYTES]; GROUP], field: usize) -> __m256 {
    assert!(
        field + 4 <= split32::BYTES,
        "field {field} lies within the block"
    );
    let offsets = _mm256_mullo_epi32(
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        _mm256_set1_epi32(split32::BYTES as i32),
    );
    let base: *const f32 = blocks.as_ptr().cast();
    // SAFETY: lane k reads the 4 bytes at `field` of block k of `blocks`, inside the block as
    // just checked.
    unsafe { _mm256_i32gather_ps::<1>(base.wrapping_byte_add(field), offsets) }
}

/// The sums of the lanes of each of eight vectors, as the lanes of one.
#[target_feature(enable = "avx2")]
#[inline]
fn lane_sums(v: [__m256i; GROUP]) -> __m256i {
    let pairs = [0, 2, 4, 6].map(|k| _mm256_hadd_epi32(v[k], v[k + 1]));
    // Per 128-bit lane: the sums of its half of vectors 0..4, and of 4..8.
    let quads = [
        _mm256_hadd_epi32(pairs[0], pairs[1]),
        _mm256_hadd_epi32(pairs[2], pairs[3]),
    ];
    _mm256_add_epi32(
        _mm256_permute2x128_si256(quads[0], quads[1], 0x20),
        _mm256_permute2x128_si256(quads[0], quads[1], 0x31),
    )
}

/// One group's share, `d * (d_hi * q . hi + d_lo * q . lo) + bias * sum(x)` summed over its
/// blocks, in eight lanes, from its blocks' products with the high and the low part, each
/// summed into eight lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn group_sum<const BYTES: usize>(
    weights: &[[u8; BYTES]; GROUP],
    activations: &[[u8; split32::BYTES]; GROUP],
    bias: Bias,
    products: [[__m256i; 2]; GROUP],
) -> __m256 {
    let (d, weight_bias) = weight_scales(weights, bias);
    let [d_hi, d_lo] = split32::PARTS.map(|part| activation_field(activations, part.d));
    let activation_sum = activation_field(activations, split32::SUM);
    // One lane per block: scaling them all takes a few multiply-adds.
    let [hi, lo] = [0, 1].map(|p| _mm256_cvtepi32_ps(lane_sums(products.map(|block| block[p]))));
    let biases = _mm256_mul_ps(weight_bias, activation_sum);
    let parts = _mm256_fmadd_ps(d_hi, hi, _mm256_mul_ps(d_lo, lo));
    _mm256_fmadd_ps(d, parts, biases)
}

/// The dot product of `$weight`, legacy blocks of `$bytes` bytes whose `$bias` is folded in
/// through the activation sums, with `$activation`; `$products(w, x)` unpacks one block's values
/// and multiplies them with each part of its activations, summing each into eight `i32` lanes.
///
/// A macro rather than a function so that `$products`, which may need more than AVX2, is
/// compiled, and inlined, with the instruction set of the kernel it expands in.
macro_rules! dot_blocks {
    ($weight:expr, $activation:expr, $bytes:literal, $bias:expr, $products:expr) => {{
        use super::avx2::{GROUP, group_sum};
        use crate::activation::split32;
        let weights = $weight.as_chunks::<$bytes>().0;
        let activations = $activation.as_chunks::<{ split32::BYTES }>().0;
        let group = |w: &[[u8; $bytes]; GROUP], x: &[[u8; split32::BYTES]; GROUP]| {
            let blocks = std::array::from_fn(|k| {
                crate::simd::prefetch_ahead(&w[k]);
                ($products)(&w[k], &x[k])
            });
            group_sum(w, x, $bias, blocks)
        };
        let (weight_groups, weight_rest) = weights.as_chunks::<GROUP>();
        let (activation_groups, activation_rest) = activations.as_chunks::<GROUP>();
        let mut acc = _mm256_setzero_ps();
        for (w, x) in weight_groups.iter().zip(activation_groups) {
            acc = _mm256_add_ps(acc, group(w, x));
        }
        if !weight_rest.is_empty() {
            // The last blocks, padded with zero blocks, which add nothing, to a whole group.
            let mut w = [[0; $bytes]; GROUP];
            let mut x = [[0; split32::BYTES]; GROUP];
            w[..weight_rest.len()].copy_from_slice(weight_rest);
            x[..activation_rest.len()].copy_from_slice(activation_rest);
            acc = _mm256_add_ps(acc, group(&w, &x));
        }
        crate::simd::sum_f32x8(acc)
    }};
}
pub(super) use dot_blocks;

/// The 32 nibbles of 16 bytes: the low ones are elements 0..16, the high ones 16..32.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn nibbles(packed: &[u8; 16]) -> __m256i {
    // Both halves from one load, the upper one shifted by 4: no shuffle needed.
    let both = _mm256_broadcastsi128_si256(load128(packed));
    let shifted = _mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4));
    _mm256_and_si256(shifted, _mm256_set1_epi8(0x0f))
}

/// 16 in byte `i` where bit `i` of the little-endian `bits` is set, else 0.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn fifth_bits(bits: &[u8; 4]) -> __m256i {
    // A vector load: read into a general register, LLVM merges these 4 bytes with the load of
    // the nibbles beside them and rebuilds both out of partial loads and five shuffles.
    // SAFETY: `bits` is 4 readable bytes and the load has no alignment requirement.
    let bits = unsafe { _mm_loadu_si32(bits.as_ptr().cast()) };
    let spread = _mm256_shuffle_epi8(
        _mm256_broadcastd_epi32(bits),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    // Byte i now holds bits 8*(i/8)..; set every bit but bit i%8 and test for all ones.
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The 32 values of each part of an activation block.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn parts(x: &[u8; split32::BYTES]) -> [__m256i; 2] {
    split32::PARTS.map(|part| load256(array(x, part.values)))
}

/// Unsigned values below 32 times each part's values (at most 127 in magnitude), in eight
/// `i32` lanes per part.
#[target_feature(enable = "avx2")]
#[inline]
fn unsigned_products(q: __m256i, x: &[u8; split32::BYTES]) -> [__m256i; 2] {
    // Pairs of products stay below 2 * 31 * 127: no i16 overflow.
    parts(x).map(|x| sum_i16_pairs(_mm256_maddubs_epi16(q, x)))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q4_0(weight: &[u8], activation: &[u8]) -> f32 {
    dot_blocks!(weight, activation, 18, Bias::Offset(-8.0), |w, x| {
        unsigned_products(nibbles(array(w, 2)), x)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q4_1(weight: &[u8], activation: &[u8]) -> f32 {
    dot_blocks!(weight, activation, 20, Bias::Min, |w, x| {
        unsigned_products(nibbles(array(w, 4)), x)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q5_0(weight: &[u8], activation: &[u8]) -> f32 {
    dot_blocks!(weight, activation, 22, Bias::Offset(-16.0), |w, x| {
        let q = _mm256_or_si256(nibbles(array(w, 6)), fifth_bits(array(w, 2)));
        unsigned_products(q, x)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q5_1(weight: &[u8], activation: &[u8]) -> f32 {
    dot_blocks!(weight, activation, 24, Bias::Min, |w, x| {
        let q = _mm256_or_si256(nibbles(array(w, 8)), fifth_bits(array(w, 4)));
        unsigned_products(q, x)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q8_0(weight: &[u8], activation: &[u8]) -> f32 {
    dot_blocks!(weight, activation, 34, Bias::Offset(0.0), |w, x| {
        let q = load256(array(w, 2));
        let magnitudes = _mm256_sign_epi8(q, q);
        // maddubs wants one unsigned operand: move the weights' signs onto the activations.
        // |q| <= 128 and |x| <= 127, in pairs: no i16 overflow.
        parts(x).map(|x| sum_i16_pairs(_mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(x, q))))
    })
}
