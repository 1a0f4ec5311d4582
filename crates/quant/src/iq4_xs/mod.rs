//! IQ4_XS: 256-element super-blocks of eight 32-element sub-blocks whose 4-bit indices pick
//! values from a fixed non-linear table. Its dot product takes
//! [`ActivationFormat::SplitQ8Block256`] activations.
//!
//! A block (136 bytes) is `d` (`f16`), the high 2 bits of the eight 6-bit sub-block scales
//! (`u16`), their low 4 bits (4 bytes), then 16 bytes of indices per sub-block: the low nibbles
//! are its elements 0..16, the high ones 16..32. Element `i` of sub-block `s` is
//! `d * (scale[s] - 32) * VALUES[index]`.

#[cfg(target_arch = "x86_64")]
mod avx2;

use lucebox_gguf::GgmlType;

use crate::activation::{ActivationFormat, split256};
use crate::bytes::{f16_at, f32_at, u16_at};
use crate::format::Format;
#[cfg(target_arch = "x86_64")]
use crate::format::{ByPrecision, DotFn, by_parts};

/// The values the 4-bit indices select (ggml's `kvalues_iq4nl`).
pub(crate) const VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

const BYTES: usize = 136;

/// The eight sub-block scales, with their offset of 32 removed.
pub(crate) fn scales(block: &[u8]) -> [i8; 8] {
    let high = u16_at(block, 2);
    std::array::from_fn(|s| {
        let low = (block[4 + s / 2] >> (4 * (s % 2))) & 0x0f;
        let high = ((high >> (2 * s)) & 3) as u8;
        (low | (high << 4)) as i8 - 32
    })
}

/// The table values of the 256 elements.
fn values(block: &[u8]) -> [i8; 256] {
    std::array::from_fn(|i| {
        let byte = block[8 + i / 32 * 16 + i % 16];
        let index = if i % 32 < 16 { byte & 0x0f } else { byte >> 4 };
        VALUES[usize::from(index)]
    })
}

/// IQ4_XS: see the module documentation.
pub(crate) struct Iq4Xs;

impl Format for Iq4Xs {
    const TYPE: GgmlType = GgmlType::Iq4Xs;
    const ACTIVATION: ActivationFormat = ActivationFormat::SplitQ8Block256;
    fn dequantize(src: &[u8], dst: &mut [f32]) {
        for (block, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(256)) {
            let d = f16_at(block, 0);
            let values = values(block);
            let subs = y.chunks_exact_mut(32).zip(values.chunks_exact(32));
            for ((y, values), &scale) in subs.zip(&scales(block)) {
                let scale = d * f32::from(scale);
                for (y, &value) in y.iter_mut().zip(values) {
                    *y = scale * f32::from(value);
                }
            }
        }
    }
    fn dot(weight: &[u8], activation: &[u8]) -> f32 {
        let mut sum = 0.0;
        let activations = activation.chunks_exact(split256::BYTES);
        for (block, a) in weight.chunks_exact(BYTES).zip(activations) {
            let values = values(block);
            for part in split256::PARTS {
                let x = &a[part.values..part.values + 256];
                let mut products = 0;
                for (s, &scale) in scales(block).iter().enumerate() {
                    let sub = values[32 * s..32 * s + 32].iter().zip(&x[32 * s..]);
                    let sub: i32 = sub.map(|(&w, &x)| i32::from(w) * i32::from(x as i8)).sum();
                    products += i32::from(scale) * sub;
                }
                sum += f16_at(block, 0) * f32_at(a, part.d) * products as f32;
            }
        }
        sum
    }
    #[cfg(target_arch = "x86_64")]
    const AVX2_DOT: ByPrecision<DotFn> = by_parts!(avx2::dot_iq4_xs);
}
