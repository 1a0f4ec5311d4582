//! The formats activations are quantized to before a matmul, and their scalar quantizers.
//!
//! Both integer formats quantize symmetrically to -127..=127 with an f32 scale `d = amax / 127`
//! and round half to even, so every ISA's quantizer produces the same bytes.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

use crate::bytes::f32_at;
use crate::isa::Isa;

/// How the activations of a matmul are quantized for a weight format.
///
/// A row of `n` activations takes [`row_bytes(n)`](Self::row_bytes) bytes, made of
/// `n / block_len()` blocks of [`block_bytes()`](Self::block_bytes) each:
///
/// - `F32`: each element as a little-endian `f32`.
/// - `Q8Block32`: 32 elements as `i8` values `q`, then the scale `d` (`f32`), then `d * sum(q)`
///   (`f32`); element `i` is `d * q[i]`. The sum lets formats with an offset or a minimum fold it
///   in once per block.
/// - `Q8Block256`: 256 `i8` values, then 16 sums of 16 consecutive values (`i16`), then the scale
///   (`f32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActivationFormat {
    /// Plain `f32`, for float weights.
    F32,
    /// 32-element `i8` blocks with a scale and a sum, for the legacy block formats.
    Q8Block32,
    /// 256-element `i8` blocks with 16-element sums, for the K-quants and IQ4_XS.
    Q8Block256,
}

/// Byte layout of a [`ActivationFormat::Q8Block32`] block.
pub(crate) mod q8_32 {
    /// Bytes in one block.
    pub(crate) const BYTES: usize = 40;
    /// Offset of the scale.
    pub(crate) const D: usize = 32;
    /// Offset of `d * sum(q)`.
    pub(crate) const SUM: usize = 36;
}

/// Byte layout of a [`ActivationFormat::Q8Block256`] block.
pub(crate) mod q8_256 {
    /// Bytes in one block.
    pub(crate) const BYTES: usize = 292;
    /// Offset of the 16 sums of 16 values.
    pub(crate) const BSUMS: usize = 256;
    /// Offset of the scale.
    pub(crate) const D: usize = 288;
}

/// Quantizes one row; the caller has checked the lengths and that the CPU has the ISA the
/// function was compiled for.
pub(crate) type QuantizeFn = unsafe fn(&[f32], &mut [u8]);

impl ActivationFormat {
    /// Elements in one block.
    pub fn block_len(self) -> usize {
        match self {
            ActivationFormat::F32 => 1,
            ActivationFormat::Q8Block32 => 32,
            ActivationFormat::Q8Block256 => 256,
        }
    }

    /// Bytes in one block.
    pub fn block_bytes(self) -> usize {
        match self {
            ActivationFormat::F32 => 4,
            ActivationFormat::Q8Block32 => q8_32::BYTES,
            ActivationFormat::Q8Block256 => q8_256::BYTES,
        }
    }

    /// Bytes one row of `n` activations takes.
    ///
    /// # Panics
    /// When `n` is not a multiple of [`block_len`](Self::block_len).
    pub fn row_bytes(self, n: usize) -> usize {
        assert!(
            n.is_multiple_of(self.block_len()),
            "{n} activations are not a whole number of {self:?} blocks"
        );
        n / self.block_len() * self.block_bytes()
    }

    /// Turns a quantized row back into `f32`, for tests and debugging.
    ///
    /// # Panics
    /// When `src` is not [`row_bytes(dst.len())`](Self::row_bytes) long.
    pub fn dequantize(self, src: &[u8], dst: &mut [f32]) {
        assert_eq!(
            src.len(),
            self.row_bytes(dst.len()),
            "activation row length"
        );
        match self {
            ActivationFormat::F32 => {
                for (y, bytes) in dst.iter_mut().zip(src.as_chunks::<4>().0) {
                    *y = f32::from_le_bytes(*bytes);
                }
            }
            ActivationFormat::Q8Block32 => {
                let blocks = src.as_chunks::<{ q8_32::BYTES }>().0;
                for (y, block) in dst.chunks_exact_mut(32).zip(blocks) {
                    let d = f32_at(block, q8_32::D);
                    for (y, &q) in y.iter_mut().zip(&block[..32]) {
                        *y = d * f32::from(q as i8);
                    }
                }
            }
            ActivationFormat::Q8Block256 => {
                let blocks = src.as_chunks::<{ q8_256::BYTES }>().0;
                for (y, block) in dst.chunks_exact_mut(256).zip(blocks) {
                    let d = f32_at(block, q8_256::D);
                    for (y, &q) in y.iter_mut().zip(&block[..256]) {
                        *y = d * f32::from(q as i8);
                    }
                }
            }
        }
    }

    /// The quantizer for this format on `isa`, which must be available.
    pub(crate) fn quantizer(self, isa: Isa) -> QuantizeFn {
        match (self, isa) {
            (ActivationFormat::F32, _) => quantize_f32,
            #[cfg(target_arch = "x86_64")]
            (ActivationFormat::Q8Block32, Isa::Avx2 | Isa::Avx512) => avx2::quantize_q8_32,
            #[cfg(target_arch = "x86_64")]
            (ActivationFormat::Q8Block256, Isa::Avx2 | Isa::Avx512) => avx2::quantize_q8_256,
            (ActivationFormat::Q8Block32, _) => quantize_q8_32,
            (ActivationFormat::Q8Block256, _) => quantize_q8_256,
        }
    }
}

/// The scale of a block whose largest magnitude is `amax`, and its reciprocal (0 for an all-zero
/// block). Every quantizer calls this, so that all produce the same bytes.
#[inline]
pub(crate) fn scale_of(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    (d, inverse)
}

fn quantize_f32(x: &[f32], dst: &mut [u8]) {
    for (bytes, v) in dst.as_chunks_mut::<4>().0.iter_mut().zip(x) {
        *bytes = v.to_le_bytes();
    }
}

/// Quantizes `x` to `i8` in `q` with the block's scale, returning the sum of the values.
fn quantize_values(x: &[f32], inverse: f32, q: &mut [u8]) -> i32 {
    let mut sum = 0;
    for (q, &v) in q.iter_mut().zip(x) {
        let value = (v * inverse).round_ties_even() as i8;
        *q = value as u8;
        sum += i32::from(value);
    }
    sum
}

fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

fn quantize_q8_32(x: &[f32], dst: &mut [u8]) {
    let blocks = dst.as_chunks_mut::<{ q8_32::BYTES }>().0;
    for (x, block) in x.chunks_exact(32).zip(blocks) {
        let (d, inverse) = scale_of(amax(x));
        let sum = quantize_values(x, inverse, &mut block[..32]);
        block[q8_32::D..q8_32::D + 4].copy_from_slice(&d.to_le_bytes());
        block[q8_32::SUM..q8_32::SUM + 4].copy_from_slice(&(d * sum as f32).to_le_bytes());
    }
}

fn quantize_q8_256(x: &[f32], dst: &mut [u8]) {
    let blocks = dst.as_chunks_mut::<{ q8_256::BYTES }>().0;
    for (x, block) in x.chunks_exact(256).zip(blocks) {
        let (d, inverse) = scale_of(amax(x));
        let (values, rest) = block.split_at_mut(256);
        let (bsums, scale) = rest.split_at_mut(32);
        let groups = x.chunks_exact(16).zip(values.chunks_exact_mut(16));
        for ((x, q), bsum) in groups.zip(bsums.as_chunks_mut::<2>().0) {
            // 16 values of at most 127 in magnitude: the sum fits an i16.
            *bsum = (quantize_values(x, inverse, q) as i16).to_le_bytes();
        }
        scale.copy_from_slice(&d.to_le_bytes());
    }
}
