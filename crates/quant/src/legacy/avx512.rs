//! AVX-512 dot products of the legacy formats with SplitQ8Block32 activations: the AVX2 kernels'
//! structure, with VNNI's `vpdpbusd` multiplying and summing each part of a block in one
//! instruction, and Q5's fifth bits added under a byte mask.

use std::arch::x86_64::*;

use super::avx2::{Bias, dot_blocks, nibbles, parts};
use crate::activation::split32;
use crate::simd::{array, load256};

/// `q . x` of unsigned values with each part of the activations, in eight `i32` lanes per part.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn unsigned_products(q: __m256i, x: &[u8; split32::BYTES]) -> [__m256i; 2] {
    parts(x).map(|x| _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, x))
}

/// The nibbles at `packed`, plus 16 where the little-endian bits at `bits` are set.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
fn five_bit_values(packed: &[u8; 16], bits: &[u8; 4]) -> __m256i {
    let low = nibbles(packed);
    let fifth = _cvtu32_mask32(u32::from_le_bytes(*bits));
    _mm256_mask_add_epi8(low, fifth, low, _mm256_set1_epi8(16))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn dot_q4_0(weight: &[u8], activation: &[u8]) -> f32 {
    dot_blocks!(weight, activation, 18, Bias::Offset(-8.0), |w, x| {
        unsigned_products(nibbles(array(w, 2)), x)
    })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn dot_q4_1(weight: &[u8], activation: &[u8]) -> f32 {
    dot_blocks!(weight, activation, 20, Bias::Min, |w, x| {
        unsigned_products(nibbles(array(w, 4)), x)
    })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn dot_q5_0(weight: &[u8], activation: &[u8]) -> f32 {
    dot_blocks!(weight, activation, 22, Bias::Offset(-16.0), |w, x| {
        unsigned_products(five_bit_values(array(w, 6), array(w, 2)), x)
    })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn dot_q5_1(weight: &[u8], activation: &[u8]) -> f32 {
    dot_blocks!(weight, activation, 24, Bias::Min, |w, x| {
        unsigned_products(five_bit_values(array(w, 8), array(w, 4)), x)
    })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn dot_q8_0(weight: &[u8], activation: &[u8]) -> f32 {
    // vpdpbusd wants unsigned weights: flipping the sign bit adds 128, taken back out through
    // the activation sums.
    dot_blocks!(weight, activation, 34, Bias::Offset(-128.0), |w, x| {
        let q = _mm256_xor_si256(load256(array(w, 2)), _mm256_set1_epi8(-128));
        unsigned_products(q, x)
    })
}
