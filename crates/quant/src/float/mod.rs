//! The plain float formats F32, F16 and BF16 (little-endian, one element per "block"). Their dot
//! products take [`ActivationFormat::F32`] activations.

#[cfg(target_arch = "x86_64")]
mod avx2;

use lucebox_gguf::GgmlType;

use crate::activation::ActivationFormat;
use crate::bytes::f16_to_f32;
use crate::format::Format;
#[cfg(target_arch = "x86_64")]
use crate::format::{ByPrecision, DotFn};

/// Independent partial sums of the portable dot products: they shorten the chain of dependent
/// additions and keep the rounding error of long rows small.
const LANES: usize = 8;

/// The portable dot product of float weights of `N` bytes each, widened by `widen`.
fn dot<const N: usize>(weight: &[u8], activation: &[u8], widen: fn([u8; N]) -> f32) -> f32 {
    let mut sums = [0.0f32; LANES];
    let weights = weight.as_chunks::<N>().0;
    let activations = activation.as_chunks::<4>().0;
    for (i, (w, x)) in weights.iter().zip(activations).enumerate() {
        sums[i % LANES] += widen(*w) * f32::from_le_bytes(*x);
    }
    sums.iter().sum()
}

fn dequantize<const N: usize>(src: &[u8], dst: &mut [f32], widen: fn([u8; N]) -> f32) {
    for (y, w) in dst.iter_mut().zip(src.as_chunks::<N>().0) {
        *y = widen(*w);
    }
}

fn f16_widen(bytes: [u8; 2]) -> f32 {
    f16_to_f32(u16::from_le_bytes(bytes))
}

fn bf16_widen(bytes: [u8; 2]) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes(bytes)) << 16)
}

/// F32 weights.
pub(crate) struct F32;

impl Format for F32 {
    const TYPE: GgmlType = GgmlType::F32;
    const ACTIVATION: ActivationFormat = ActivationFormat::F32;
    fn dequantize(src: &[u8], dst: &mut [f32]) {
        dequantize(src, dst, f32::from_le_bytes);
    }
    fn dot(weight: &[u8], activation: &[u8]) -> f32 {
        dot(weight, activation, f32::from_le_bytes)
    }
    #[cfg(target_arch = "x86_64")]
    const AVX2_DOT: ByPrecision<DotFn> = ByPrecision::same(avx2::dot_f32);
}

/// F16 weights.
pub(crate) struct F16;

impl Format for F16 {
    const TYPE: GgmlType = GgmlType::F16;
    const ACTIVATION: ActivationFormat = ActivationFormat::F32;
    fn dequantize(src: &[u8], dst: &mut [f32]) {
        dequantize(src, dst, f16_widen);
    }
    fn dot(weight: &[u8], activation: &[u8]) -> f32 {
        dot(weight, activation, f16_widen)
    }
    #[cfg(target_arch = "x86_64")]
    const AVX2_DOT: ByPrecision<DotFn> = ByPrecision::same(avx2::dot_f16);
}

/// BF16 weights.
pub(crate) struct Bf16;

impl Format for Bf16 {
    const TYPE: GgmlType = GgmlType::Bf16;
    const ACTIVATION: ActivationFormat = ActivationFormat::F32;
    fn dequantize(src: &[u8], dst: &mut [f32]) {
        dequantize(src, dst, bf16_widen);
    }
    fn dot(weight: &[u8], activation: &[u8]) -> f32 {
        dot(weight, activation, bf16_widen)
    }
    #[cfg(target_arch = "x86_64")]
    const AVX2_DOT: ByPrecision<DotFn> = ByPrecision::same(avx2::dot_bf16);
}
