//! AVX2 dot product of IQ4_XS with SplitQ8Block256 activations: the table lookup is a byte
//! shuffle, done once per sub-block for the `PARTS` parts of the activations it multiplies.

use std::arch::x86_64::*;

use super::{BYTES, VALUES, scales};
use crate::activation::split256;
use crate::bytes::f32_at;
use crate::simd::{array, f16_at, load128, load256, prefetch_ahead, sum_f32x8};

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_iq4_xs<const PARTS: usize>(weight: &[u8], activation: &[u8]) -> f32 {
    let weights = weight.as_chunks::<BYTES>().0;
    let activations = activation.as_chunks::<{ split256::BYTES }>().0;
    let table = _mm256_broadcastsi128_si256(load128(&VALUES.map(|v| v as u8)));
    let low_nibbles = _mm256_set1_epi8(0x0f);
    let mut acc = _mm256_setzero_ps();
    for (w, a) in weights.iter().zip(activations) {
        prefetch_ahead(w);
        let mut sums = [_mm256_setzero_si256(); PARTS];
        for (s, scale) in scales(w).into_iter().enumerate() {
            let packed = load128(array(w, 8 + 16 * s));
            let indices = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
            let values = _mm256_shuffle_epi8(table, _mm256_and_si256(indices, low_nibbles));
            // maddubs wants one unsigned operand: move the values' signs onto the activations.
            let magnitudes = _mm256_sign_epi8(values, values);
            let scale = _mm256_set1_epi16(i16::from(scale));
            for (sum, part) in sums.iter_mut().zip(&split256::PARTS[..PARTS]) {
                let x = load256(array(a, part.values + 32 * s));
                // Both are at most 127 in magnitude, in pairs: no i16 overflow.
                let products = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(x, values));
                *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(scale, products));
            }
        }
        let d = f16_at(w, 0);
        for (sum, part) in sums.into_iter().zip(&split256::PARTS[..PARTS]) {
            let scale = _mm256_set1_ps(f32_at(a, part.d) * d);
            acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sum), acc);
        }
    }
    sum_f32x8(acc)
}
