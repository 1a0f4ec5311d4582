//! AVX2 dot products of float weights with f32 activations.

use std::arch::x86_64::*;

use crate::simd::{load_f32x8, load128, prefetch_ahead, sum_f32x8};

/// Sums over eight elements at a time, `EIGHT` weight bytes each, widened by `widen8`; the
/// remaining elements go through the portable code with `widen`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn dot<const EIGHT: usize, const N: usize>(
    weight: &[u8],
    activation: &[u8],
    widen8: impl Fn(&[u8; EIGHT]) -> __m256,
    widen: fn([u8; N]) -> f32,
) -> f32 {
    let (weights, weight_tail) = weight.as_chunks::<EIGHT>();
    let (activations, activation_tail) = activation.as_chunks::<32>();
    // Four accumulators keep four FMAs in flight.
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut weight_quads = weights.chunks_exact(4);
    let mut activation_quads = activations.chunks_exact(4);
    for (w, x) in (&mut weight_quads).zip(&mut activation_quads) {
        prefetch_ahead(w.as_flattened());
        for k in 0..4 {
            acc[k] = _mm256_fmadd_ps(widen8(&w[k]), load_f32x8(&x[k]), acc[k]);
        }
    }
    let rest = weight_quads
        .remainder()
        .iter()
        .zip(activation_quads.remainder());
    for (w, x) in rest {
        acc[0] = _mm256_fmadd_ps(widen8(w), load_f32x8(x), acc[0]);
    }
    let acc = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    sum_f32x8(acc) + super::dot(weight_tail, activation_tail, widen)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_f32(weight: &[u8], activation: &[u8]) -> f32 {
    dot::<32, 4>(weight, activation, |w| load_f32x8(w), f32::from_le_bytes)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_f16(weight: &[u8], activation: &[u8]) -> f32 {
    dot::<16, 2>(
        weight,
        activation,
        |w| _mm256_cvtph_ps(load128(w)),
        super::f16_widen,
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_bf16(weight: &[u8], activation: &[u8]) -> f32 {
    dot::<16, 2>(
        weight,
        activation,
        |w| _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(w)), 16)),
        super::bf16_widen,
    )
}
