//! Q5_0 on AVX-512 VNNI with its weights repacked at load, sixteen blocks to a unit, so that
//! each of the 16 lanes of a vector holds one 32-element block, its values spread over eight
//! vectors, four bytes in each. `vpdpbusd` multiplies 64 weights with 64 activations
//! ([`SplitQ8Lanes32`], the same layout) and sums each lane's four products, so a lane
//! accumulates one block: its scale is applied once per unit, in `f32`, and the offset of 16
//! is folded in through the activations' block sums. The fifth bits come as one 64-bit mask per
//! vector, added in by a masked byte add.
//!
//! GGUF's layout keeps each block's 32 values in 16 bytes and its fifth bits in a 32-bit word:
//! the kernel for it spread the bits to bytes and scaled each 32 products apart.
//!
//! A unit (352 bytes, as sixteen GGUF blocks): the sixteen `d` (`f16`); eight 64-bit masks, bit
//! `4l + b` of mask `k` the fifth bit of element `4k + b` of lane `l`'s block; 256 bytes of
//! nibbles, vector `2j` in the low nibbles and vector `2j + 1` in the high nibbles of bytes
//! `64j..64j + 64`, byte `4l + b` of vector `k` holding element `4k + b` of block `l`. A row
//! whose block count is not a multiple of 16 ends with zero blocks.
//!
//! [`SplitQ8Lanes32`]: crate::ActivationFormat::SplitQ8Lanes32

use std::arch::x86_64::*;

use crate::activation::ActivationFormat;
use crate::bytes::u32_at;
use crate::repacked::{LaneUnit, Lanes32};
use crate::simd::{array, load256, load512};

/// Bytes in one unit of sixteen blocks.
const UNIT_BYTES: usize = 352;
/// GGUF's bytes in one Q5_0 block.
const BLOCK_BYTES: usize = 22;
/// Offsets within a unit.
const MASKS: usize = 32;
const NIBBLES: usize = 96;

/// Repacks one row of GGUF Q5_0 blocks into `out`, `gguf.len() / 22` blocks rounded up to whole
/// units.
fn repack_q5_0(gguf: &[u8], out: &mut [u8]) {
    let blocks = gguf.as_chunks::<BLOCK_BYTES>().0;
    let units = out.as_chunks_mut::<UNIT_BYTES>().0;
    for (sixteen, unit) in blocks.chunks(16).zip(units) {
        unit.fill(0);
        for (lane, block) in sixteen.iter().enumerate() {
            unit[2 * lane..2 * lane + 2].copy_from_slice(&block[..2]);
            let fifth_bits = u32_at(block, 2);
            for element in 0..32 {
                let (vector, byte) = (element / 4, 4 * lane + element % 4);
                let packed = block[6 + element % 16];
                let nibble = if element < 16 {
                    packed & 0x0f
                } else {
                    packed >> 4
                };
                unit[NIBBLES + 64 * (vector / 2) + byte] |= nibble << (4 * (vector % 2));
                let bit = (fifth_bits >> element & 1) as u8;
                unit[MASKS + 8 * vector + byte / 8] |= bit << (byte % 8);
            }
        }
    }
}

/// Q5_0 in units.
pub(crate) struct Q5_0Lanes;

impl Lanes32 for Q5_0Lanes {
    const ACTIVATION: ActivationFormat = ActivationFormat::SplitQ8Lanes32;
    const UNIT_BYTES: usize = UNIT_BYTES;
    fn repack(gguf: &[u8], out: &mut [u8]) {
        repack_q5_0(gguf, out)
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn unpack(unit: &[u8]) -> LaneUnit {
        let low_nibbles = _mm512_set1_epi8(0x0f);
        let mut values = [_mm512_setzero_si512(); 8];
        for j in 0..4 {
            let packed = load512(array(unit, NIBBLES + 64 * j));
            values[2 * j] = _mm512_and_si512(packed, low_nibbles);
            values[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibbles);
        }
        let fifth_bit = _mm512_set1_epi8(16);
        for (k, values) in values.iter_mut().enumerate() {
            let mask = u64::from_le_bytes(*array(unit, MASKS + 8 * k));
            *values = _mm512_mask_add_epi8(*values, mask, *values, fifth_bit);
        }
        let scales = _mm512_cvtph_ps(load256(array(unit, 0)));
        LaneUnit {
            values,
            scales,
            // The offset of 16: -16 * d * (activation sum of the lane's block).
            offsets: _mm512_mul_ps(_mm512_set1_ps(-16.0), scales),
        }
    }
}
