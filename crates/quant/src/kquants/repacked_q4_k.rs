//! Q4_K on AVX-512 VNNI with its weights repacked at load, two 256-element blocks to a unit, so
//! that each of the 16 lanes of a vector holds one 32-element sub-block: lane `l` is sub-block
//! `l % 8` of block `l / 8`, its 32 values spread over eight vectors, four bytes in each.
//! VNNI's `vpdpbusd` then multiplies 64 weights with 64 activations ([`SplitQ8Pairs512`], the
//! same layout) and sums each lane's four products, so a lane accumulates one sub-block: its
//! scale, minimum and activation scale are applied once per unit, in `f32`.
//!
//! GGUF's layout, two sub-blocks per 32 bytes of nibbles, needs a scale per pair of sub-blocks
//! in every multiply (`vpmaddubsw`, then `vpdpwssd` with the scales): twice the multiplies. On
//! an AMD EPYC (Zen 4) this layout's kernel ran 1.8x as fast with one activation row and 1.4x
//! with eight, at single-part activations (README, "Repacked K-quants").
//!
//! A unit (296 bytes): `d` and `dmin` (`f16`) of each block; the 16 lanes' scales and their 16
//! minimums (`u8`, unpacked from GGUF's 6 bits); 256 bytes of nibbles, vector `2j` in the low
//! nibbles and vector `2j + 1` in the high nibbles of bytes `64j..64j + 64`. A row of an odd
//! number of blocks ends with a unit whose second block is zero.
//!
//! [`SplitQ8Pairs512`]: crate::ActivationFormat::SplitQ8Pairs512

use std::arch::x86_64::*;

use super::scales_and_mins;
use crate::activation::ActivationFormat;
use crate::bytes::u32_at;
use crate::repacked::{LaneUnit, Lanes32};
use crate::simd::{array, f16_at, load128, load512};

/// Bytes in one unit of two blocks.
const UNIT_BYTES: usize = 296;
/// GGUF's bytes in one Q4_K block.
const BLOCK_BYTES: usize = 144;
/// Offsets within a unit.
const SCALES: usize = 8;
const MINS: usize = 24;
const NIBBLES: usize = 40;

/// Repacks one row of GGUF Q4_K blocks into `out`, `gguf.len() / 144` blocks rounded up to
/// whole units.
fn repack_q4_k(gguf: &[u8], out: &mut [u8]) {
    let blocks = gguf.as_chunks::<BLOCK_BYTES>().0;
    let units = out.as_chunks_mut::<UNIT_BYTES>().0;
    for (pair, unit) in blocks.chunks(2).zip(units) {
        unit.fill(0);
        for (b, block) in pair.iter().enumerate() {
            unit[4 * b..4 * b + 4].copy_from_slice(&block[..4]);
            let (scales, mins) = scales_and_mins(&block[4..16]);
            unit[SCALES + 8 * b..SCALES + 8 * b + 8].copy_from_slice(&scales);
            unit[MINS + 8 * b..MINS + 8 * b + 8].copy_from_slice(&mins);
            for sub_block in 0..8 {
                let lane = 8 * b + sub_block;
                // GGUF: sub-block 2j in the low nibbles of bytes 32j.., 2j + 1 in the high.
                let nibbles = &block[16 + 32 * (sub_block / 2)..];
                for vector in 0..8 {
                    let four = u32_at(nibbles, 4 * vector) >> (4 * (sub_block % 2)) & 0x0f0f_0f0f;
                    let at = NIBBLES + 64 * (vector / 2) + 4 * lane;
                    let packed = u32_at(unit, at) | four << (4 * (vector % 2));
                    unit[at..at + 4].copy_from_slice(&packed.to_le_bytes());
                }
            }
        }
    }
}

/// The `f32` per lane of two `f16` fields, one for each block of a unit.
#[target_feature(enable = "avx512f,f16c")]
#[inline]
fn per_block(unit: &[u8; UNIT_BYTES], first: usize, second: usize) -> __m512 {
    let [first, second] = [first, second].map(|at| _mm512_set1_ps(f16_at(unit, at)));
    _mm512_mask_blend_ps(0xff00, first, second)
}

/// Bytes `at..at + 16` of a unit widened to `f32`.
#[target_feature(enable = "avx512f")]
#[inline]
fn lanes_u8(unit: &[u8; UNIT_BYTES], at: usize) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(load128(array(unit, at))))
}

/// Q4_K in units.
pub(crate) struct Q4KUnits;

impl Lanes32 for Q4KUnits {
    const ACTIVATION: ActivationFormat = ActivationFormat::SplitQ8Pairs512;
    const UNIT_BYTES: usize = UNIT_BYTES;
    fn repack(gguf: &[u8], out: &mut [u8]) {
        repack_q4_k(gguf, out)
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn unpack(unit: &[u8]) -> LaneUnit {
        let unit: &[u8; UNIT_BYTES] = array(unit, 0);
        let low_nibbles = _mm512_set1_epi8(0x0f);
        let mut values = [_mm512_setzero_si512(); 8];
        for j in 0..4 {
            let packed = load512(array(unit, NIBBLES + 64 * j));
            values[2 * j] = _mm512_and_si512(packed, low_nibbles);
            values[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibbles);
        }
        let mins = _mm512_mul_ps(per_block(unit, 2, 6), lanes_u8(unit, MINS));
        LaneUnit {
            values,
            scales: _mm512_mul_ps(per_block(unit, 0, 4), lanes_u8(unit, SCALES)),
            offsets: _mm512_sub_ps(_mm512_setzero_ps(), mins),
        }
    }
}
