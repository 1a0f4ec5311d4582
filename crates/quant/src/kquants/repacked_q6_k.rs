//! Q6_K on AVX-512 VNNI with its weights repacked at load so that each of the 16 lanes of a
//! vector holds one 16-element sub-block: lane `l` is elements `16l..16l + 16`, spread over four
//! vectors, four bytes in each. VNNI's `vpdpbusd` multiplies 64 unsigned values with 64
//! activations ([`SplitQ8Lanes256`], the same layout) and sums each lane's four products, so a
//! lane accumulates one sub-block and its scale is applied once per block, in `f32`; the offset
//! of 32 is folded in through the activations' sums of 16, as the AVX2 kernel does.
//!
//! GGUF's layout needs a scale per 16 lanes in every multiply (`vpmaddubsw`, then `vpdpwssd`):
//! twice the multiplies.
//!
//! A block (210 bytes, as GGUF's): 128 bytes of low nibbles, vector `2j` in the low nibbles and
//! vector `2j + 1` in the high nibbles of bytes `64j..64j + 64`; 64 bytes of high bits, bits
//! `2k` and `2k + 1` of byte `i` completing byte `i` of vector `k`; the sixteen `i8` scales; `d`.
//!
//! [`SplitQ8Lanes256`]: crate::ActivationFormat::SplitQ8Lanes256

use std::arch::x86_64::*;

use crate::activation::{ActivationFormat, lanes256_element, split256};
use crate::bytes::{f32_at, u32_at};
use crate::repacked::{UnitSums, units_of};
use crate::simd::{array, f16_at, load128, load512, prefetch_ahead_of_rows};

/// Bytes in one block.
const BLOCK_BYTES: usize = 210;
/// Offsets within a block.
const HIGH_BITS: usize = 128;
const SCALES: usize = 192;
const D: usize = 208;

/// Repacks one row of GGUF Q6_K blocks into `out`, as many blocks.
///
/// GGUF's element `i` (`h = i / 128`, `k = i % 128 / 32`, `l = i % 32`) has its low nibble in
/// byte `64h + 32(k % 2) + l` (the high nibble for `k >= 2`) and its top two bits at bit `2k` of
/// byte `128 + 32h + l`. A lane's four bytes of one vector are four consecutive elements, so
/// they move as one `u32`.
fn repack_q6_k(gguf: &[u8], out: &mut [u8]) {
    let blocks = gguf.as_chunks::<BLOCK_BYTES>().0;
    for (block, repacked) in blocks.iter().zip(out.as_chunks_mut::<BLOCK_BYTES>().0) {
        repacked[..SCALES].fill(0);
        repacked[SCALES..].copy_from_slice(&block[SCALES..]);
        for (vector, lane) in (0..4).flat_map(|vector| (0..16).map(move |lane| (vector, lane))) {
            let element = lanes256_element(64 * vector + 4 * lane);
            let (half, k, l) = (element / 128, element % 128 / 32, element % 32);
            let low = u32_at(block, 64 * half + 32 * (k % 2) + l) >> (4 * (k / 2)) & 0x0f0f_0f0f;
            let high = u32_at(block, HIGH_BITS + 32 * half + l) >> (2 * k) & 0x0303_0303;
            let at = 64 * (vector / 2) + 4 * lane;
            let low = u32_at(repacked, at) | low << (4 * (vector % 2));
            repacked[at..at + 4].copy_from_slice(&low.to_le_bytes());
            let at = HIGH_BITS + 4 * lane;
            let high = u32_at(repacked, at) | high << (2 * vector);
            repacked[at..at + 4].copy_from_slice(&high.to_le_bytes());
        }
    }
}

/// `(a & 0x0f) | b`, for `b` without bits in the low nibble.
#[target_feature(enable = "avx512f")]
#[inline]
fn low_nibbles_or(a: __m512i, b: __m512i) -> __m512i {
    _mm512_ternarylogic_epi32(a, _mm512_set1_epi8(0x0f), b, 0xea)
}

/// Q6_K's kernel on repacked blocks.
pub(crate) struct Q6KBlocks;

impl UnitSums for Q6KBlocks {
    const ACTIVATION: ActivationFormat = ActivationFormat::SplitQ8Lanes256;
    const UNIT_BYTES: usize = BLOCK_BYTES;
    fn repack(gguf: &[u8], out: &mut [u8]) {
        repack_q6_k(gguf, out)
    }
    /// The weights unpacked once for `PARTS` parts of each row.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn sums<const PARTS: usize, const R: usize>(
        weight: &[u8],
        activations: [&[u8]; R],
        mut acc: [__m512; R],
    ) -> [__m512; R] {
        let rows = units_of::<{ split256::BYTES }, R>(activations);
        let blocks = weight.as_chunks::<BLOCK_BYTES>().0;
        let bits_4_5 = _mm512_set1_epi8(0x30);
        for (i, w) in blocks.iter().enumerate() {
            prefetch_ahead_of_rows::<R>(w);
            let scales = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load128(array(w, SCALES))));
            let scales = _mm512_mul_ps(_mm512_set1_ps(f16_at(w, D)), scales);
            // The offset of 32: -32 * d * scale[l] * (activation sum of lane l).
            let offsets = _mm512_mul_ps(_mm512_set1_ps(-32.0), scales);
            let low = load512(array(w, 0));
            let high = load512(array(w, 64));
            let bits = load512(array(w, HIGH_BITS));
            // Bits 2k and 2k + 1 of each byte moved to bits 4 and 5 (16-bit shifts: the bits that
            // cross into the next byte are masked off).
            let q = [
                low_nibbles_or(low, _mm512_and_si512(_mm512_slli_epi16(bits, 4), bits_4_5)),
                low_nibbles_or(
                    _mm512_srli_epi16(low, 4),
                    _mm512_and_si512(_mm512_slli_epi16(bits, 2), bits_4_5),
                ),
                low_nibbles_or(high, _mm512_and_si512(bits, bits_4_5)),
                low_nibbles_or(
                    _mm512_srli_epi16(high, 4),
                    _mm512_and_si512(_mm512_srli_epi16(bits, 2), bits_4_5),
                ),
            ];
            for (acc, row) in acc.iter_mut().zip(&rows) {
                let x = &row[i];
                let sums = _mm512_castsi512_ps(load512(array(x, split256::SUMS)));
                *acc = _mm512_fmadd_ps(offsets, sums, *acc);
                for part in &split256::PARTS[..PARTS] {
                    // Two chains of two multiply-adds. Values below 64 times |x| <= 127, 16 to a
                    // lane, stay far inside an `i32`.
                    let mut even = _mm512_setzero_si512();
                    let mut odd = _mm512_setzero_si512();
                    for k in (0..4).step_by(2) {
                        let x_even = load512(array(x, part.values + 64 * k));
                        let x_odd = load512(array(x, part.values + 64 * (k + 1)));
                        even = _mm512_dpbusd_epi32(even, q[k], x_even);
                        odd = _mm512_dpbusd_epi32(odd, q[k + 1], x_odd);
                    }
                    let products = _mm512_cvtepi32_ps(_mm512_add_epi32(even, odd));
                    let d = _mm512_set1_ps(f32_at(x, part.d));
                    *acc = _mm512_fmadd_ps(products, _mm512_mul_ps(scales, d), *acc);
                }
            }
        }
        acc
    }
}
