//! Reading the little-endian fields of a block.

/// The `f16` at `offset`, widened to `f32`.
#[inline]
pub(crate) fn f16_at(bytes: &[u8], offset: usize) -> f32 {
    f16_to_f32(u16_at(bytes, offset))
}

/// Widens the `f16` with bits `bits` to `f32`, exactly, on any target.
#[inline]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    const EXPONENT: u16 = 0x7c00;
    // 2^(127 - 15): moves the exponent from f16's bias to f32's, subnormals included.
    const REBIAS: f32 = f32::from_bits(0x7780_0000);
    let magnitude = f32::from_bits(u32::from(bits & 0x7fff) << 13) * REBIAS;
    let sign = u32::from(bits & 0x8000) << 16;
    let infinite_or_nan = if bits & EXPONENT == EXPONENT {
        0x7f80_0000
    } else {
        0
    };
    f32::from_bits(magnitude.to_bits() | sign | infinite_or_nan)
}

/// The little-endian `u16` at `offset`.
#[inline]
pub(crate) fn u16_at(bytes: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([bytes[offset], bytes[offset + 1]])
}

/// The little-endian `u32` at `offset`.
#[inline]
pub(crate) fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes([
        bytes[offset],
        bytes[offset + 1],
        bytes[offset + 2],
        bytes[offset + 3],
    ])
}

/// The little-endian `f32` at `offset`.
#[inline]
pub(crate) fn f32_at(bytes: &[u8], offset: usize) -> f32 {
    f32::from_bits(u32_at(bytes, offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_widens_exactly() {
        for bits in 0..=u16::MAX {
            let expected = half::f16::from_bits(bits).to_f32();
            let got = f16_to_f32(bits);
            if expected.is_nan() {
                assert!(got.is_nan(), "{bits:#06x}: {got}");
                assert_eq!(got.is_sign_negative(), expected.is_sign_negative());
            } else {
                assert_eq!(
                    got.to_bits(),
                    expected.to_bits(),
                    "{bits:#06x}: {got} vs {expected}"
                );
            }
        }
    }
}
