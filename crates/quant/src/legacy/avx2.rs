//! AVX2 dot products of the legacy formats with Q8Block32 activations.
//!
//! The 4- and 5-bit formats multiply their unsigned values directly (`maddubs` takes an unsigned
//! and a signed operand) and fold the offset or minimum in through the activation block's sum.

use std::arch::x86_64::*;

use crate::activation::q8_32;
use crate::bytes::{f32_at, u32_at};
use crate::simd::{array, f16_at, load128, load256, prefetch_ahead, sum_f32x8, sum_i16_pairs};

/// A weight block unpacked into 32 unsigned bytes `q`, its scale `d` and `bias`: the block is
/// `d * q[i] + bias`.
struct Unsigned {
    q: __m256i,
    d: f32,
    bias: f32,
}

/// Sums `d * q . x + bias * sum(x)` over the blocks.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn dot_unsigned<const BYTES: usize>(
    weight: &[u8],
    activation: &[u8],
    unpack: impl Fn(&[u8; BYTES]) -> Unsigned,
) -> f32 {
    let weights = weight.as_chunks::<BYTES>().0;
    let activations = activation.as_chunks::<{ q8_32::BYTES }>().0;
    let mut acc = _mm256_setzero_ps();
    let mut bias = 0.0;
    for (w, a) in weights.iter().zip(activations) {
        prefetch_ahead(w);
        let block = unpack(w);
        let x = load256(array(a, 0));
        // Unsigned values below 32 times |x| <= 127, in pairs: no i16 overflow.
        let products = sum_i16_pairs(_mm256_maddubs_epi16(block.q, x));
        let scale = _mm256_set1_ps(block.d * f32_at(a, q8_32::D));
        acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(products), acc);
        bias += block.bias * f32_at(a, q8_32::SUM);
    }
    sum_f32x8(acc) + bias
}

/// The 32 nibbles of 16 bytes: the low ones are elements 0..16, the high ones 16..32.
#[target_feature(enable = "avx2")]
#[inline]
fn nibbles(packed: &[u8; 16]) -> __m256i {
    let low = load128(packed);
    let high = _mm_srli_epi16(low, 4);
    _mm256_and_si256(_mm256_set_m128i(high, low), _mm256_set1_epi8(0x0f))
}

/// 16 in byte `i` where bit `i` of `bits` is set, else 0.
#[target_feature(enable = "avx2")]
#[inline]
fn fifth_bits(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
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

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q4_0(weight: &[u8], activation: &[u8]) -> f32 {
    dot_unsigned::<18>(weight, activation, |w| {
        let d = f16_at(w, 0);
        Unsigned {
            q: nibbles(array(w, 2)),
            d,
            bias: -8.0 * d,
        }
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q4_1(weight: &[u8], activation: &[u8]) -> f32 {
    dot_unsigned::<20>(weight, activation, |w| Unsigned {
        q: nibbles(array(w, 4)),
        d: f16_at(w, 0),
        bias: f16_at(w, 2),
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q5_0(weight: &[u8], activation: &[u8]) -> f32 {
    dot_unsigned::<22>(weight, activation, |w| {
        let d = f16_at(w, 0);
        Unsigned {
            q: _mm256_or_si256(nibbles(array(w, 6)), fifth_bits(u32_at(w, 2))),
            d,
            bias: -16.0 * d,
        }
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q5_1(weight: &[u8], activation: &[u8]) -> f32 {
    dot_unsigned::<24>(weight, activation, |w| Unsigned {
        q: _mm256_or_si256(nibbles(array(w, 8)), fifth_bits(u32_at(w, 4))),
        d: f16_at(w, 0),
        bias: f16_at(w, 2),
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q8_0(weight: &[u8], activation: &[u8]) -> f32 {
    let weights = weight.as_chunks::<34>().0;
    let activations = activation.as_chunks::<{ q8_32::BYTES }>().0;
    let mut acc = _mm256_setzero_ps();
    for (w, a) in weights.iter().zip(activations) {
        prefetch_ahead(w);
        let q = load256(array(w, 2));
        let x = load256(array(a, 0));
        // maddubs wants one unsigned operand: move the weights' signs onto the activations.
        // |q| <= 128 and |x| <= 127, in pairs: no i16 overflow.
        let products = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
        let scale = _mm256_set1_ps(f16_at(w, 0) * f32_at(a, q8_32::D));
        acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sum_i16_pairs(products)), acc);
    }
    sum_f32x8(acc)
}
