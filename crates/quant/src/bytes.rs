//! Reading the little-endian fields of a block.

/// The `f16` at `offset`, widened to `f32`.
#[inline]
pub(crate) fn f16_at(bytes: &[u8], offset: usize) -> f32 {
    half::f16::from_bits(u16_at(bytes, offset)).to_f32()
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

/// The little-endian `i16` at `offset`.
#[inline]
pub(crate) fn i16_at(bytes: &[u8], offset: usize) -> i16 {
    u16_at(bytes, offset) as i16
}
