//! The formats activations are quantized to before a matmul, and their scalar quantizers.
//!
//! Every quantizer computes the scales with [`scale_of`], rounds half to even and takes the
//! residual as an `f32` multiply then subtract (no fused multiply-add), so every ISA's quantizer
//! produces the same bytes.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

use crate::bytes::f32_at;
use crate::isa::Isa;

/// How the activations of a matmul are quantized for a weight format.
///
/// The integer formats quantize each block in two parts. The high part is the usual symmetric
/// 8-bit quantization: `hi = round(x / d_hi)` with `d_hi = amax(x) / 127`. The low part
/// quantizes what the high part leaves, `r = x - d_hi * hi`, the same way: `lo = round(r / d_lo)`
/// with `d_lo = amax(r) / 127`. An element is `d_hi * hi + d_lo * lo`, within `d_lo / 2` of `x`
/// (about `amax / 64516`, where the high part alone is within `amax / 254`): a dot product then
/// carries the weights' rounding, not the activations'. The kernels unpack each weight block
/// once and multiply it with both parts. A part whose largest magnitude is below
/// `127 * f32::MIN_POSITIVE` (about 1.5e-36) is quantized to zero. Rounding is half to even, and
/// every instruction-set level's quantizer produces the same bytes.
///
/// A row of `n` activations takes [`row_bytes(n)`](Self::row_bytes) bytes, made of
/// `n / block_len()` blocks of [`block_bytes()`](Self::block_bytes) each:
///
/// - `F32`: each element as an `f32`.
/// - `SplitQ8Block32` (76 bytes): the 32 high values (`i8`), the 32 low values (`i8`), `d_hi`
///   (`f32`), `d_lo` (`f32`), then `d_hi * sum(hi) + d_lo * sum(lo)` (`f32`); element `i` is
///   `d_hi * hi[i] + d_lo * lo[i]`. The sum lets formats with an offset or a minimum fold it in
///   once per block.
/// - `SplitQ8Block256` (584 bytes): the 256 high values, the 256 low values, for each 16
///   consecutive elements `d_hi * sum(hi) + d_lo * sum(lo)` (16 `f32`), `d_hi`, then `d_lo`.
/// - `SplitQ8Lanes256` (584 bytes): a `SplitQ8Block256` block whose values are rearranged for
///   the 16 lanes of an AVX-512 vector, lane `l` standing for elements `16l..16l + 16`: each
///   part's 256 values are four vectors of 64 bytes, byte `4l + b` of vector `k` being element
///   `16l + 4k + b`. The sums of 16 elements, one per lane, and the scales are as in
///   `SplitQ8Block256`.
/// - `SplitQ8Pairs512` (1216 bytes): two `SplitQ8Block256` blocks (quantized as such),
///   rearranged for the 16 lanes of an AVX-512 vector. Lane `l` stands for the 32-element
///   sub-block `l % 8` of block `l / 8`. Each part's 512 values (the high part's at 0, the low
///   part's at 512) are eight vectors of 64 bytes: byte `4l + b` of vector `k` is element `4k + b`
///   of lane `l`'s sub-block. Then, per lane, `d_hi * sum(hi) + d_lo * sum(lo)` of its sub-block
///   (16 `f32` at 1024), its block's `d_hi` (16 `f32` at 1088) and `d_lo` (16 `f32` at 1152). A row
///   of an odd number of 256-element blocks ends with a pair whose second block is zero.
/// - `SplitQ8Lanes32` (1216 bytes per 512 elements): sixteen `SplitQ8Block32` blocks (quantized
///   as such) laid out as `SplitQ8Pairs512`, lane `l` standing for block `l`: byte `4l + b` of
///   vector `k` of each part is element `4k + b` of block `l`, and the lane's sum, `d_hi` and
///   `d_lo` are its block's. A row whose length is not a multiple of 512 ends with zero blocks.
///
/// All multi-byte fields are little-endian.
///
/// With [`ActivationPrecision::Single`] the layout is the same and the low part is zero
/// (`lo = 0`, `d_lo = 0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActivationFormat {
    /// Plain `f32`, for float weights.
    F32,
    /// 32-element blocks in two `i8` parts with their scales and a sum, for the legacy block
    /// formats.
    SplitQ8Block32,
    /// 256-element blocks in two `i8` parts with their scales and sums of 16 elements, for the
    /// K-quants and IQ4_XS.
    SplitQ8Block256,
    /// `SplitQ8Block256` blocks with their values laid out by AVX-512 lane, for Q6_K's AVX-512
    /// kernel.
    SplitQ8Lanes256,
    /// Pairs of `SplitQ8Block256` blocks laid out by AVX-512 lane, for Q4_K's AVX-512 kernel.
    SplitQ8Pairs512,
    /// Sixteen `SplitQ8Block32` blocks laid out by AVX-512 lane, for Q5_0's AVX-512 kernel.
    SplitQ8Lanes32,
}

/// How finely the integer activation formats quantize, chosen per matrix.
///
/// A matmul's dot products cost about twice as much in [`Split`](Self::Split) as in
/// [`Single`](Self::Single) once they are compute-bound (several activation rows: prefill,
/// batches, speculative verify steps); a single row reads the weights from memory at the same
/// speed in both. Every row count of one matrix uses its one precision, so a row's result never
/// depends on the batch it is in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ActivationPrecision {
    /// Two 8-bit parts: each element within `amax / 64516` of its value, so that a dot product
    /// carries the weights' rounding alone.
    #[default]
    Split,
    /// The high part alone, llama.cpp's 8-bit activations: within `amax / 254`. The low part is
    /// written as zero, and the kernels skip it.
    Single,
}

impl std::fmt::Display for ActivationPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ActivationPrecision::Split => "two-part 8-bit",
            ActivationPrecision::Single => "single 8-bit",
        })
    }
}

/// Where one part of a [`ActivationFormat::SplitQ8Block32`] block lies.
#[derive(Clone, Copy)]
pub(crate) struct Part32 {
    /// Offset of the 32 `i8` values.
    pub(crate) values: usize,
    /// Offset of the `f32` scale.
    pub(crate) d: usize,
}

/// Byte layout of a [`ActivationFormat::SplitQ8Block32`] block.
pub(crate) mod split32 {
    use super::Part32;

    /// Bytes in one block.
    pub(crate) const BYTES: usize = 76;
    /// The high part, then the low part.
    pub(crate) const PARTS: [Part32; 2] =
        [Part32 { values: 0, d: 64 }, Part32 { values: 32, d: 68 }];
    /// Offset of `d_hi * sum(hi) + d_lo * sum(lo)`.
    pub(crate) const SUM: usize = 72;
}

/// Where one part of a [`ActivationFormat::SplitQ8Block256`] block lies.
#[derive(Clone, Copy)]
pub(crate) struct Part256 {
    /// Offset of the 256 `i8` values.
    pub(crate) values: usize,
    /// Offset of the `f32` scale.
    pub(crate) d: usize,
}

/// Byte layout of a [`ActivationFormat::SplitQ8Block256`] block.
pub(crate) mod split256 {
    use super::Part256;

    /// Bytes in one block.
    pub(crate) const BYTES: usize = 584;
    /// The high part, then the low part.
    pub(crate) const PARTS: [Part256; 2] = [
        Part256 { values: 0, d: 576 },
        Part256 {
            values: 256,
            d: 580,
        },
    ];
    /// Offset of the 16 `f32` sums of 16 elements, `d_hi * sum(hi) + d_lo * sum(lo)`: the
    /// formats with minimums or offsets fold them in with these.
    pub(crate) const SUMS: usize = 512;
}

/// The element of a [`ActivationFormat::SplitQ8Lanes256`] block's part at byte `at` of its
/// values.
pub(crate) const fn lanes256_element(at: usize) -> usize {
    let (vector, lane, byte) = (at / 64, at % 64 / 4, at % 4);
    16 * lane + 4 * vector + byte
}

/// Byte layout of a [`ActivationFormat::SplitQ8Pairs512`] block.
pub(crate) mod pairs512 {
    /// Bytes in one block.
    pub(crate) const BYTES: usize = 1216;
    /// Offsets of the high part's values and lane scales, then of the low part's.
    pub(crate) const PARTS: [(usize, usize); 2] = [(0, 1088), (512, 1152)];
    /// Offset of the 16 lane sums.
    pub(crate) const SUMS: usize = 1024;

    /// The element of the pair (0..512) at byte `at` of a part's values.
    pub(crate) const fn element(at: usize) -> usize {
        let (vector, lane, byte) = (at / 64, at % 64 / 4, at % 4);
        256 * (lane / 8) + 32 * (lane % 8) + 4 * vector + byte
    }
}

/// Quantizes one row; the caller has checked the lengths and that the CPU has the ISA the
/// function was compiled for.
pub(crate) type QuantizeFn = unsafe fn(&[f32], &mut [u8]);

impl ActivationFormat {
    /// Elements in one block.
    pub const fn block_len(self) -> usize {
        match self {
            ActivationFormat::F32 => 1,
            ActivationFormat::SplitQ8Block32 => 32,
            ActivationFormat::SplitQ8Block256 | ActivationFormat::SplitQ8Lanes256 => 256,
            ActivationFormat::SplitQ8Pairs512 | ActivationFormat::SplitQ8Lanes32 => 512,
        }
    }

    /// Bytes in one block.
    pub const fn block_bytes(self) -> usize {
        match self {
            ActivationFormat::F32 => 4,
            ActivationFormat::SplitQ8Block32 => split32::BYTES,
            ActivationFormat::SplitQ8Block256 | ActivationFormat::SplitQ8Lanes256 => {
                split256::BYTES
            }
            ActivationFormat::SplitQ8Pairs512 | ActivationFormat::SplitQ8Lanes32 => pairs512::BYTES,
        }
    }

    /// Bytes one row of `n` activations takes.
    ///
    /// # Panics
    /// When `n` is not a multiple of [`block_len`](Self::block_len), or for `SplitQ8Pairs512`
    /// of 256 and for `SplitQ8Lanes32` of 32: their last block may be partly padding.
    pub fn row_bytes(self, n: usize) -> usize {
        let padded = match self {
            ActivationFormat::SplitQ8Pairs512 => Some(256),
            ActivationFormat::SplitQ8Lanes32 => Some(32),
            _ => None,
        };
        if let Some(quantum) = padded {
            assert!(
                n.is_multiple_of(quantum),
                "{n} activations are not a whole number of {quantum}-element blocks"
            );
            return n.div_ceil(512) * pairs512::BYTES;
        }
        assert!(
            n.is_multiple_of(self.block_len()),
            "{n} activations are not a whole number of {self:?} blocks"
        );
        n / self.block_len() * self.block_bytes()
    }

    /// Turns a quantized row back into `f32` (`d_hi * hi + d_lo * lo` for the split formats,
    /// rounded once more to `f32`), for tests and debugging.
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
            ActivationFormat::SplitQ8Block32 => {
                let [hi, lo] = split32::PARTS.map(|part| (part.values, part.d));
                dequantize_split(src, dst, split32::BYTES, 32, hi, lo);
            }
            ActivationFormat::SplitQ8Block256 => {
                let [hi, lo] = split256::PARTS.map(|part| (part.values, part.d));
                dequantize_split(src, dst, split256::BYTES, 256, hi, lo);
            }
            ActivationFormat::SplitQ8Lanes256 => {
                for (y, block) in dst
                    .chunks_exact_mut(256)
                    .zip(src.chunks_exact(split256::BYTES))
                {
                    let mut in_order = [0.0; 256];
                    ActivationFormat::SplitQ8Block256.dequantize(block, &mut in_order);
                    for (at, value) in in_order.into_iter().enumerate() {
                        y[lanes256_element(at)] = value;
                    }
                }
            }
            ActivationFormat::SplitQ8Pairs512 | ActivationFormat::SplitQ8Lanes32 => {
                dequantize_pairs(src, dst)
            }
        }
    }

    /// The quantizer for this format at `precision` on `isa`, which must be available.
    pub(crate) fn quantizer(self, precision: ActivationPrecision, isa: Isa) -> QuantizeFn {
        use ActivationPrecision::{Single, Split};
        #[cfg(target_arch = "x86_64")]
        if matches!(isa, Isa::Avx2 | Isa::Avx512) {
            return match (self, precision) {
                (ActivationFormat::F32, _) => quantize_f32,
                (ActivationFormat::SplitQ8Block32, Split) => avx2::quantize_split32::<2>,
                (ActivationFormat::SplitQ8Block32, Single) => avx2::quantize_split32::<1>,
                (ActivationFormat::SplitQ8Block256, Split) => avx2::quantize_split256::<2>,
                (ActivationFormat::SplitQ8Block256, Single) => avx2::quantize_split256::<1>,
                (ActivationFormat::SplitQ8Lanes256, Split) => avx2::quantize_lanes256::<2>,
                (ActivationFormat::SplitQ8Lanes256, Single) => avx2::quantize_lanes256::<1>,
                (ActivationFormat::SplitQ8Pairs512, Split) => avx2::quantize_pairs512::<2>,
                (ActivationFormat::SplitQ8Pairs512, Single) => avx2::quantize_pairs512::<1>,
                (ActivationFormat::SplitQ8Lanes32, Split) => avx2::quantize_lanes32::<2>,
                (ActivationFormat::SplitQ8Lanes32, Single) => avx2::quantize_lanes32::<1>,
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = isa;
        match (self, precision) {
            (ActivationFormat::F32, _) => quantize_f32,
            (ActivationFormat::SplitQ8Block32, Split) => quantize_split32::<2>,
            (ActivationFormat::SplitQ8Block32, Single) => quantize_split32::<1>,
            (ActivationFormat::SplitQ8Block256, Split) => quantize_split256::<2>,
            (ActivationFormat::SplitQ8Block256, Single) => quantize_split256::<1>,
            (ActivationFormat::SplitQ8Lanes256, Split) => quantize_lanes256::<2>,
            (ActivationFormat::SplitQ8Lanes256, Single) => quantize_lanes256::<1>,
            (ActivationFormat::SplitQ8Pairs512, Split) => quantize_pairs512::<2>,
            (ActivationFormat::SplitQ8Pairs512, Single) => quantize_pairs512::<1>,
            (ActivationFormat::SplitQ8Lanes32, Split) => quantize_lanes32::<2>,
            (ActivationFormat::SplitQ8Lanes32, Single) => quantize_lanes32::<1>,
        }
    }
}

/// Dequantizes blocks of `len` elements and `bytes` bytes whose two parts lie at the
/// `(values, d)` offsets `hi` and `lo`.
fn dequantize_split(
    src: &[u8],
    dst: &mut [f32],
    bytes: usize,
    len: usize,
    hi: (usize, usize),
    lo: (usize, usize),
) {
    for (y, block) in dst.chunks_exact_mut(len).zip(src.chunks_exact(bytes)) {
        let (d_hi, d_lo) = (f32_at(block, hi.1), f32_at(block, lo.1));
        let parts = block[hi.0..hi.0 + len].iter().zip(&block[lo.0..lo.0 + len]);
        for (y, (&hi, &lo)) in y.iter_mut().zip(parts) {
            *y = d_hi * f32::from(hi as i8) + d_lo * f32::from(lo as i8);
        }
    }
}

fn dequantize_pairs(src: &[u8], dst: &mut [f32]) {
    let pairs = src.as_chunks::<{ pairs512::BYTES }>().0;
    for (y, pair) in dst.chunks_mut(512).zip(pairs) {
        let [hi, lo] = pairs512::PARTS;
        for at in 0..512 {
            let element = pairs512::element(at);
            let lane = at % 64 / 4;
            let [d_hi, d_lo] = [hi.1, lo.1].map(|scales| f32_at(pair, scales + 4 * lane));
            if let Some(y) = y.get_mut(element) {
                *y = d_hi * f32::from(pair[hi.0 + at] as i8)
                    + d_lo * f32::from(pair[lo.0 + at] as i8);
            }
        }
    }
}

/// The 16 sums of 16 elements of a [`ActivationFormat::SplitQ8Block256`] block.
pub(crate) fn sums_of_16(block: &[u8]) -> [f32; 16] {
    std::array::from_fn(|i| f32_at(block, split256::SUMS + 4 * i))
}

/// Blocks (or residuals) whose largest magnitude is below this quantize to zero: their scale
/// would be subnormal, and below about `127 / f32::MAX` its reciprocal would overflow.
const SMALLEST_AMAX: f32 = 127.0 * f32::MIN_POSITIVE;

/// The scale of a block whose largest magnitude is `amax`, and its reciprocal (both 0 for a
/// block below [`SMALLEST_AMAX`]). Every quantizer calls this, so that all produce the same
/// bytes.
#[inline]
pub(crate) fn scale_of(amax: f32) -> (f32, f32) {
    if amax >= SMALLEST_AMAX {
        (amax / 127.0, 127.0 / amax)
    } else {
        (0.0, 0.0)
    }
}

fn quantize_f32(x: &[f32], dst: &mut [u8]) {
    for (bytes, v) in dst.as_chunks_mut::<4>().0.iter_mut().zip(x) {
        *bytes = v.to_le_bytes();
    }
}

fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// One block of `N` elements quantized in two parts, in `i8` values (as bytes).
struct Split<const N: usize> {
    hi: [u8; N],
    lo: [u8; N],
    d_hi: f32,
    d_lo: f32,
}

/// Quantizes `x` to `i8` with the reciprocal scale `inverse`.
fn quantize_part<const N: usize>(x: &[f32; N], inverse: f32) -> [u8; N] {
    x.map(|v| (v * inverse).round_ties_even() as i8 as u8)
}

/// Quantizes `x` in `PARTS` parts (1 or 2); with one, the low part is zero.
fn split<const PARTS: usize, const N: usize>(x: &[f32; N]) -> Split<N> {
    let (d_hi, inverse) = scale_of(amax(x));
    let hi = quantize_part(x, inverse);
    if PARTS == 1 {
        return Split {
            hi,
            lo: [0; N],
            d_hi,
            d_lo: 0.0,
        };
    }
    let residual: [f32; N] = std::array::from_fn(|i| x[i] - d_hi * f32::from(hi[i] as i8));
    let (d_lo, inverse) = scale_of(amax(&residual));
    let lo = quantize_part(&residual, inverse);
    Split { hi, lo, d_hi, d_lo }
}

fn sum(values: &[u8]) -> i32 {
    values.iter().map(|&v| i32::from(v as i8)).sum()
}

/// `d_hi * sum(hi) + d_lo * sum(lo)` of a block or of 16 elements, as every quantizer computes
/// it.
#[inline]
pub(crate) fn block_sum(d_hi: f32, sum_hi: i32, d_lo: f32, sum_lo: i32) -> f32 {
    d_hi * sum_hi as f32 + d_lo * sum_lo as f32
}

fn quantize_split32<const PARTS: usize>(x: &[f32], dst: &mut [u8]) {
    let blocks = dst.as_chunks_mut::<{ split32::BYTES }>().0;
    for (x, block) in x.as_chunks::<32>().0.iter().zip(blocks) {
        let Split { hi, lo, d_hi, d_lo } = split::<PARTS, _>(x);
        let [hi_at, lo_at] = split32::PARTS;
        for (part, values, d) in [(hi_at, &hi, d_hi), (lo_at, &lo, d_lo)] {
            block[part.values..part.values + 32].copy_from_slice(values);
            block[part.d..part.d + 4].copy_from_slice(&d.to_le_bytes());
        }
        let sum = block_sum(d_hi, sum(&hi), d_lo, sum(&lo));
        block[split32::SUM..split32::SUM + 4].copy_from_slice(&sum.to_le_bytes());
    }
}

fn quantize_lanes32<const PARTS: usize>(x: &[f32], dst: &mut [u8]) {
    quantize_block_lanes(x, dst, quantize_split32::<PARTS>);
}

/// Quantizes a row into [`ActivationFormat::SplitQ8Lanes32`] with `quantize32`, a
/// `SplitQ8Block32` quantizer, so that the values and scales are that quantizer's.
#[inline]
pub(crate) fn quantize_block_lanes(
    x: &[f32],
    dst: &mut [u8],
    quantize32: impl Fn(&[f32], &mut [u8]),
) {
    let units = dst.as_chunks_mut::<{ pairs512::BYTES }>().0;
    for (x, unit) in x.chunks(512).zip(units) {
        let mut blocks = [[0; split32::BYTES]; 16];
        let len = x.len() / 32 * split32::BYTES;
        quantize32(x, &mut blocks.as_flattened_mut()[..len]);
        rearrange_blocks(&blocks, unit);
    }
}

/// Lays out sixteen `SplitQ8Block32` blocks as a `SplitQ8Lanes32` unit.
fn rearrange_blocks(blocks: &[[u8; split32::BYTES]; 16], unit: &mut [u8; pairs512::BYTES]) {
    for (part, (values, scales)) in split32::PARTS.iter().zip(pairs512::PARTS) {
        for at in (0..512).step_by(4) {
            let element = pairs512::element(at);
            let from = part.values + element % 32;
            unit[values + at..values + at + 4]
                .copy_from_slice(&blocks[element / 32][from..from + 4]);
        }
        for (lane, block) in blocks.iter().enumerate() {
            unit[scales + 4 * lane..scales + 4 * lane + 4]
                .copy_from_slice(&block[part.d..part.d + 4]);
        }
    }
    for (lane, block) in blocks.iter().enumerate() {
        let at = pairs512::SUMS + 4 * lane;
        unit[at..at + 4].copy_from_slice(&block[split32::SUM..split32::SUM + 4]);
    }
}

fn quantize_lanes256<const PARTS: usize>(x: &[f32], dst: &mut [u8]) {
    quantize_split256::<PARTS>(x, dst);
    to_lanes(dst);
}

/// Rearranges the values of `SplitQ8Block256` blocks in place into `SplitQ8Lanes256`'s order.
pub(crate) fn to_lanes(blocks: &mut [u8]) {
    for block in blocks.as_chunks_mut::<{ split256::BYTES }>().0 {
        for part in split256::PARTS {
            let values = &mut block[part.values..part.values + 256];
            let in_order: [u8; 256] = values.try_into().expect("256 values");
            for at in (0..256).step_by(4) {
                let element = lanes256_element(at);
                values[at..at + 4].copy_from_slice(&in_order[element..element + 4]);
            }
        }
    }
}

fn quantize_pairs512<const PARTS: usize>(x: &[f32], dst: &mut [u8]) {
    quantize_pairs(x, dst, quantize_split256::<PARTS>);
}

/// Quantizes a row into [`ActivationFormat::SplitQ8Pairs512`] with `quantize256`, a
/// `SplitQ8Block256` quantizer, so that the values and scales are that quantizer's.
#[inline]
pub(crate) fn quantize_pairs(x: &[f32], dst: &mut [u8], quantize256: impl Fn(&[f32], &mut [u8])) {
    let pairs = dst.as_chunks_mut::<{ pairs512::BYTES }>().0;
    for (x, pair) in x.chunks(512).zip(pairs) {
        let mut blocks = [[0; split256::BYTES]; 2];
        let len = x.len() / 256 * split256::BYTES;
        quantize256(x, &mut blocks.as_flattened_mut()[..len]);
        rearrange_pair(&blocks, pair);
    }
}

/// Lays out two `SplitQ8Block256` blocks as a `SplitQ8Pairs512` block.
fn rearrange_pair(blocks: &[[u8; split256::BYTES]; 2], pair: &mut [u8; pairs512::BYTES]) {
    for (part, (values, scales)) in split256::PARTS.iter().zip(pairs512::PARTS) {
        for at in (0..512).step_by(4) {
            let element = pairs512::element(at);
            let from = part.values + element % 256;
            pair[values + at..values + at + 4]
                .copy_from_slice(&blocks[element / 256][from..from + 4]);
        }
        for lane in 0..16 {
            let d = &blocks[lane / 8][part.d..part.d + 4];
            pair[scales + 4 * lane..scales + 4 * lane + 4].copy_from_slice(d);
        }
    }
    let [hi, lo] = split256::PARTS;
    for lane in 0..16 {
        let block = &blocks[lane / 8];
        let sub_block = |values: usize| {
            let start = values + 32 * (lane % 8);
            sum(&block[start..start + 32])
        };
        let sum = block_sum(
            f32_at(block, hi.d),
            sub_block(hi.values),
            f32_at(block, lo.d),
            sub_block(lo.values),
        );
        let at = pairs512::SUMS + 4 * lane;
        pair[at..at + 4].copy_from_slice(&sum.to_le_bytes());
    }
}

fn quantize_split256<const PARTS: usize>(x: &[f32], dst: &mut [u8]) {
    let blocks = dst.as_chunks_mut::<{ split256::BYTES }>().0;
    for (x, block) in x.as_chunks::<256>().0.iter().zip(blocks) {
        let Split { hi, lo, d_hi, d_lo } = split::<PARTS, _>(x);
        let [hi_at, lo_at] = split256::PARTS;
        for (part, values, d) in [(hi_at, &hi, d_hi), (lo_at, &lo, d_lo)] {
            block[part.values..part.values + 256].copy_from_slice(values);
            block[part.d..part.d + 4].copy_from_slice(&d.to_le_bytes());
        }
        let sums = &mut block[split256::SUMS..split256::SUMS + 64];
        let groups = hi.chunks(16).zip(lo.chunks(16));
        for (sum_bytes, (hi, lo)) in sums.as_chunks_mut::<4>().0.iter_mut().zip(groups) {
            *sum_bytes = block_sum(d_hi, sum(hi), d_lo, sum(lo)).to_le_bytes();
        }
    }
}
