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
use crate::simd::{array, load128, load256, prefetch_ahead, sum_f32x8, sum_i16_pairs};

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
pub(super) fn weight_scales<const BYTES: usize>(
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
pub(super) fn activation_field(blocks: &[[u8; split32::BYTES]; GROUP], field: usize) -> __m256 {
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
/// blocks, in eight lanes, from its blocks' products with each of the `PARTS` parts multiplied,
/// each summed into eight lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn group_sum<const BYTES: usize, const PARTS: usize>(
    weights: &[[u8; BYTES]; GROUP],
    activations: &[[u8; split32::BYTES]; GROUP],
    bias: Bias,
    products: [[__m256i; PARTS]; GROUP],
) -> __m256 {
    let (d, weight_bias) = weight_scales(weights, bias);
    let [hi_at, lo_at] = split32::PARTS;
    let d_hi = activation_field(activations, hi_at.d);
    let activation_sum = activation_field(activations, split32::SUM);
    // One lane per block: scaling them all takes a few multiply-adds. (Loops and array maps
    // here would not be inlined: closures do not inherit the target features.)
    let mut hi = [_mm256_setzero_si256(); GROUP];
    let mut lo = [_mm256_setzero_si256(); GROUP];
    for (k, block) in products.into_iter().enumerate() {
        hi[k] = block[0];
        if PARTS == 2 {
            lo[k] = block[PARTS - 1];
        }
    }
    let hi = _mm256_cvtepi32_ps(lane_sums(hi));
    let parts = if PARTS == 2 {
        let d_lo = activation_field(activations, lo_at.d);
        let lo = _mm256_cvtepi32_ps(lane_sums(lo));
        _mm256_fmadd_ps(d_hi, hi, _mm256_mul_ps(d_lo, lo))
    } else {
        _mm256_mul_ps(d_hi, hi)
    };
    let biases = _mm256_mul_ps(weight_bias, activation_sum);
    _mm256_fmadd_ps(d, parts, biases)
}

/// A group of weight blocks and the activation blocks they multiply.
pub(super) type Group<'a, const BYTES: usize> =
    (&'a [[u8; BYTES]; GROUP], &'a [[u8; split32::BYTES]; GROUP]);

/// Room for the last group of a row, padded with zero blocks, which add nothing.
pub(super) struct Padded<const BYTES: usize> {
    weights: [[u8; BYTES]; GROUP],
    activations: [[u8; split32::BYTES]; GROUP],
}

impl<const BYTES: usize> Default for Padded<BYTES> {
    fn default() -> Self {
        Padded {
            weights: [[0; BYTES]; GROUP],
            activations: [[0; split32::BYTES]; GROUP],
        }
    }
}

/// The groups of a weight row of `BYTES`-byte blocks and its activation row, the last one
/// padded in `padded` (left alone unless needed) when the row is not a whole number of groups. One loop over these keeps
/// a kernel's body in one place, where a closure called for the whole groups and again for the
/// last one is compiled out of line.
#[inline]
pub(super) fn groups<'a, const BYTES: usize>(
    weight: &'a [u8],
    activation: &'a [u8],
    padded: &'a mut Option<Padded<BYTES>>,
) -> impl Iterator<Item = Group<'a, BYTES>> {
    let (weight_groups, weight_rest) = weight.as_chunks::<BYTES>().0.as_chunks::<GROUP>();
    let activations = activation.as_chunks::<{ split32::BYTES }>().0;
    let (activation_groups, activation_rest) = activations.as_chunks::<GROUP>();
    let last = (!weight_rest.is_empty()).then(|| {
        let padded = padded.insert(Padded::default());
        padded.weights[..weight_rest.len()].copy_from_slice(weight_rest);
        padded.activations[..activation_rest.len()].copy_from_slice(activation_rest);
        (&padded.weights, &padded.activations)
    });
    weight_groups.iter().zip(activation_groups).chain(last)
}

/// The dot product of `weight`, legacy blocks of `BYTES` bytes whose `bias` is folded in
/// through the activation sums, with `activation`; `products(w, x)` unpacks one block's values
/// and multiplies them with each of the `PARTS` parts of its activations multiplied, summing each
/// into eight `i32` lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn dot_blocks<const BYTES: usize, const PARTS: usize>(
    weight: &[u8],
    activation: &[u8],
    bias: Bias,
    products: impl Fn(&[u8; BYTES], &[u8; split32::BYTES]) -> [__m256i; PARTS],
) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (w, x) in groups(weight, activation, &mut None) {
        let mut blocks = [[_mm256_setzero_si256(); PARTS]; GROUP];
        for ((block, w), x) in blocks.iter_mut().zip(w).zip(x) {
            prefetch_ahead(w);
            *block = products(w, x);
        }
        acc = _mm256_add_ps(acc, group_sum(w, x, bias, blocks));
    }
    sum_f32x8(acc)
}

/// The 32 nibbles of 16 bytes: the low ones are elements 0..16, the high ones 16..32.
#[target_feature(enable = "avx2")]
#[inline]
fn nibbles(packed: &[u8; 16]) -> __m256i {
    // Both halves from one load, the upper one shifted by 4: no shuffle needed.
    let both = _mm256_broadcastsi128_si256(load128(packed));
    let shifted = _mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4));
    _mm256_and_si256(shifted, _mm256_set1_epi8(0x0f))
}

/// 16 in byte `i` where bit `i` of the little-endian `bits` is set, else 0.
#[target_feature(enable = "avx2")]
#[inline]
fn fifth_bits(bits: &[u8; 4]) -> __m256i {
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

/// The 32 values of each of the first `PARTS` parts of an activation block.
#[target_feature(enable = "avx2")]
#[inline]
fn parts<const PARTS: usize>(x: &[u8; split32::BYTES]) -> [__m256i; PARTS] {
    let mut values = [_mm256_setzero_si256(); PARTS];
    for (values, part) in values.iter_mut().zip(&split32::PARTS) {
        *values = load256(array(x, part.values));
    }
    values
}

/// Unsigned values below 32 times each part's values (at most 127 in magnitude), in eight
/// `i32` lanes per part.
#[target_feature(enable = "avx2")]
#[inline]
fn unsigned_products<const PARTS: usize>(q: __m256i, x: &[u8; split32::BYTES]) -> [__m256i; PARTS] {
    // Pairs of products stay below 2 * 31 * 127: no i16 overflow.
    let mut products = parts::<PARTS>(x);
    for products in &mut products {
        *products = sum_i16_pairs(_mm256_maddubs_epi16(q, *products));
    }
    products
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q4_0<const PARTS: usize>(weight: &[u8], activation: &[u8]) -> f32 {
    dot_blocks::<18, PARTS>(weight, activation, Bias::Offset(-8.0), |w, x| {
        unsigned_products(nibbles(array(w, 2)), x)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q4_1<const PARTS: usize>(weight: &[u8], activation: &[u8]) -> f32 {
    dot_blocks::<20, PARTS>(weight, activation, Bias::Min, |w, x| {
        unsigned_products(nibbles(array(w, 4)), x)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q5_0<const PARTS: usize>(weight: &[u8], activation: &[u8]) -> f32 {
    dot_blocks::<22, PARTS>(weight, activation, Bias::Offset(-16.0), |w, x| {
        let q = _mm256_or_si256(nibbles(array(w, 6)), fifth_bits(array(w, 2)));
        unsigned_products(q, x)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q5_1<const PARTS: usize>(weight: &[u8], activation: &[u8]) -> f32 {
    dot_blocks::<24, PARTS>(weight, activation, Bias::Min, |w, x| {
        let q = _mm256_or_si256(nibbles(array(w, 8)), fifth_bits(array(w, 4)));
        unsigned_products(q, x)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q8_0<const PARTS: usize>(weight: &[u8], activation: &[u8]) -> f32 {
    dot_blocks::<34, PARTS>(weight, activation, Bias::Offset(0.0), |w, x| {
        let q = load256(array(w, 2));
        let magnitudes = _mm256_sign_epi8(q, q);
        // maddubs wants one unsigned operand: move the weights' signs onto the activations.
        // |q| <= 128 and |x| <= 127, in pairs: no i16 overflow.
        let mut products = parts::<PARTS>(x);
        for products in &mut products {
            let signed = _mm256_sign_epi8(*products, q);
            *products = sum_i16_pairs(_mm256_maddubs_epi16(magnitudes, signed));
        }
        products
    })
}
