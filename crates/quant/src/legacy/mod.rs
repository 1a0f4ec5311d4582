//! The legacy 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0.
//!
//! Each block holds an `f16` scale `d`, for the affine formats an `f16` minimum `m`, and 32
//! quantized values `q`: element `i` is `d * q[i]` (with `q` offset to be signed) or
//! `d * q[i] + m`. Their dot products take [`ActivationFormat::SplitQ8Block32`] activations,
//! except Q5_0's AVX-512 kernel, which takes its weights repacked at load (`repacked_q5_0`) and
//! activations in the matching layout.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod repacked_q5_0;

use lucebox_gguf::GgmlType;

use crate::activation::{ActivationFormat, split32};
use crate::bytes::{f16_at, f32_at, u32_at};
use crate::format::Format;
#[cfg(target_arch = "x86_64")]
use crate::format::{Avx512Rows, ByPrecision, DotFn, Repacked, Tile, by_parts, rows_kernel};

/// A block unpacked by the portable code.
struct Unpacked {
    /// The values, with the offset of the symmetric formats already subtracted.
    values: [i8; 32],
    d: f32,
    /// The minimum of the affine formats.
    min: Option<f32>,
}

/// The layout of one legacy format.
trait Legacy {
    /// Bytes in one block.
    const BYTES: usize;
    /// Unpacks one block of [`BYTES`](Self::BYTES) bytes.
    fn unpack(block: &[u8]) -> Unpacked;
}

fn dequantize<L: Legacy>(src: &[u8], dst: &mut [f32]) {
    for (block, y) in src.chunks_exact(L::BYTES).zip(dst.chunks_exact_mut(32)) {
        let Unpacked { values, d, min } = L::unpack(block);
        for (y, &q) in y.iter_mut().zip(&values) {
            *y = match min {
                None => d * f32::from(q),
                Some(m) => d * f32::from(q) + m,
            };
        }
    }
}

fn dot<L: Legacy>(weight: &[u8], activation: &[u8]) -> f32 {
    let mut sum = 0.0;
    let activations = activation.chunks_exact(split32::BYTES);
    for (block, a) in weight.chunks_exact(L::BYTES).zip(activations) {
        let Unpacked { values, d, min } = L::unpack(block);
        let [hi, lo] = split32::PARTS.map(|part| {
            let x = &a[part.values..part.values + 32];
            let products: i32 = values
                .iter()
                .zip(x)
                .map(|(&w, &x)| i32::from(w) * i32::from(x as i8))
                .sum();
            f32_at(a, part.d) * products as f32
        });
        sum += d * (hi + lo);
        if let Some(m) = min {
            sum += m * f32_at(a, split32::SUM);
        }
    }
    sum
}

/// Splits 16 bytes into 32 4-bit values: the low nibbles are elements 0..16, the high ones 16..32.
fn nibbles(packed: &[u8]) -> [u8; 32] {
    std::array::from_fn(|i| {
        let byte = packed[i % 16];
        if i < 16 { byte & 0x0f } else { byte >> 4 }
    })
}

/// Adds bit `i` of `high_bits` to value `i` as its fifth bit.
fn with_fifth_bits(mut values: [u8; 32], high_bits: u32) -> [u8; 32] {
    for (i, value) in values.iter_mut().enumerate() {
        *value |= (((high_bits >> i) & 1) as u8) << 4;
    }
    values
}

/// Converts unsigned values into signed ones centred on `offset`.
fn centred(values: [u8; 32], offset: u8) -> [i8; 32] {
    values.map(|q| q as i8 - offset as i8)
}

/// Q4_0: `d`, then 16 bytes of nibbles; values are offset by 8.
pub(crate) struct Q4_0;

impl Legacy for Q4_0 {
    const BYTES: usize = 18;
    fn unpack(block: &[u8]) -> Unpacked {
        Unpacked {
            values: centred(nibbles(&block[2..18]), 8),
            d: f16_at(block, 0),
            min: None,
        }
    }
}

/// Q4_1: `d`, `m`, then 16 bytes of nibbles.
pub(crate) struct Q4_1;

impl Legacy for Q4_1 {
    const BYTES: usize = 20;
    fn unpack(block: &[u8]) -> Unpacked {
        Unpacked {
            values: nibbles(&block[4..20]).map(|q| q as i8),
            d: f16_at(block, 0),
            min: Some(f16_at(block, 2)),
        }
    }
}

/// Q5_0: `d`, the 32 fifth bits, then 16 bytes of nibbles; values are offset by 16.
pub(crate) struct Q5_0;

impl Legacy for Q5_0 {
    const BYTES: usize = 22;
    fn unpack(block: &[u8]) -> Unpacked {
        let values = with_fifth_bits(nibbles(&block[6..22]), u32_at(block, 2));
        Unpacked {
            values: centred(values, 16),
            d: f16_at(block, 0),
            min: None,
        }
    }
}

/// Q5_1: `d`, `m`, the 32 fifth bits, then 16 bytes of nibbles.
pub(crate) struct Q5_1;

impl Legacy for Q5_1 {
    const BYTES: usize = 24;
    fn unpack(block: &[u8]) -> Unpacked {
        let values = with_fifth_bits(nibbles(&block[8..24]), u32_at(block, 4));
        Unpacked {
            values: values.map(|q| q as i8),
            d: f16_at(block, 0),
            min: Some(f16_at(block, 2)),
        }
    }
}

/// Q8_0: `d`, then 32 `i8` values.
pub(crate) struct Q8_0;

impl Legacy for Q8_0 {
    const BYTES: usize = 34;
    fn unpack(block: &[u8]) -> Unpacked {
        Unpacked {
            values: std::array::from_fn(|i| block[2 + i] as i8),
            d: f16_at(block, 0),
            min: None,
        }
    }
}

/// Implements [`Format`] for the legacy formats, whose portable kernels are generic. Each names
/// its AVX2 kernel, then its AVX-512 kernels: `gguf(dot, rows)` on GGUF's blocks, or
/// `repacked(units)`, a [`UnitSums`](crate::repacked::UnitSums) on weights repacked at load.
macro_rules! legacy_formats {
    ($($format:ident: $avx2:ident, $avx512:ident $kernels:tt;)*) => {$(
        impl Format for $format {
            const TYPE: GgmlType = GgmlType::$format;
            const ACTIVATION: ActivationFormat = ActivationFormat::SplitQ8Block32;
            fn dequantize(src: &[u8], dst: &mut [f32]) {
                dequantize::<Self>(src, dst)
            }
            fn dot(weight: &[u8], activation: &[u8]) -> f32 {
                dot::<Self>(weight, activation)
            }
            #[cfg(target_arch = "x86_64")]
            const AVX2_DOT: ByPrecision<DotFn> = by_parts!(avx2::$avx2);
            legacy_formats!(@$avx512 $format $kernels);
        }
        legacy_formats!(@$avx512 rows $format $kernels);
    )*};
    (@gguf rows $format:ident ($dot:ident, $rows:ident)) => {
        rows_kernel! {
            Avx512Rows<$format> => avx512::$rows, 8;
        }
    };
    (@gguf $format:ident ($dot:ident, $rows:ident)) => {
        #[cfg(target_arch = "x86_64")]
        const AVX512_DOT: ByPrecision<DotFn> = by_parts!(avx512::$dot);
        #[cfg(target_arch = "x86_64")]
        const AVX512_TILE: Option<ByPrecision<Tile>> = Some(Tile::of::<Avx512Rows<$format>>());
    };
    (@repacked rows $format:ident ($units:ty)) => {};
    (@repacked $format:ident ($units:ty)) => {
        #[cfg(target_arch = "x86_64")]
        const AVX512_REPACKED: Option<Repacked> = Some(crate::repacked::kernels::<$units>());
    };
}

legacy_formats! {
    Q4_0: dot_q4_0, gguf(dot_q4_0, dot_q4_0_rows);
    Q4_1: dot_q4_1, gguf(dot_q4_1, dot_q4_1_rows);
    Q5_0: dot_q5_0, repacked(crate::repacked::ByLane<repacked_q5_0::Q5_0Lanes>);
    Q5_1: dot_q5_1, gguf(dot_q5_1, dot_q5_1_rows);
    Q8_0: dot_q8_0, gguf(dot_q8_0, dot_q8_0_rows);
}
