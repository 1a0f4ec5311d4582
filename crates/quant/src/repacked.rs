//! What the repacked AVX-512 kernels share: the loops over weight rows, activation rows and
//! column blocks around a kernel's sums of one weight row (`kquants::repacked_q4_k`,
//! `kquants::repacked_q6_k`, `legacy::repacked_q5_0`).
//!
//! Rows much longer than the model's width (`ffn_down`'s 8,960) have activations that, at eight
//! rows, do not fit L1 (90 KiB at one part): each weight row read them again from L2, and eight
//! rows ran no faster than one. Such rows are taken in column blocks whose activations fit, a
//! group of weight rows at a time, their sums kept between blocks; each sum still adds the same
//! products in the same order, so the results do not change.

use std::arch::x86_64::*;
use std::marker::PhantomData;

use crate::activation::{ActivationFormat, pairs512};
use crate::format::{ByPrecision, Repacked, RowsKernel, Tile, Units};
use crate::simd::{array, load512, prefetch_ahead_of_rows, sum_f32x16, sums_f32x16};

/// One repacked format: its layout, and its kernel of a weight row's products with `R`
/// activation rows.
pub(crate) trait UnitSums {
    /// The activations' layout: a unit of weights spans one of its blocks.
    const ACTIVATION: ActivationFormat;
    /// Bytes in one unit of repacked weights.
    const UNIT_BYTES: usize;
    /// Writes one row of GGUF's blocks as units, the last one padded with zero weights.
    fn repack(gguf: &[u8], out: &mut [u8]);
    /// `acc` plus the products of the units in `weight` with the same columns of each activation
    /// row, summed lane by lane.
    ///
    /// # Safety
    /// The CPU has AVX-512 VNNI (the features of [`dot_rows`]), and each activation row holds
    /// one block of `ACTIVATION` for each unit of `weight`.
    unsafe fn sums<const PARTS: usize, const R: usize>(
        weight: &[u8],
        activations: [&[u8]; R],
        acc: [__m512; R],
    ) -> [__m512; R];
}

/// A format repacked as sixteen 32-element lanes to a 512-element unit (Q4_K, Q5_0). Its
/// activations, `SplitQ8Pairs512` or `SplitQ8Lanes32`, have the same bytes, so one loop
/// ([`ByLane`]) multiplies them all; each format only unpacks its units.
pub(crate) trait Lanes32 {
    /// The activations' layout.
    const ACTIVATION: ActivationFormat;
    /// Bytes in one unit of repacked weights.
    const UNIT_BYTES: usize;
    /// Writes one row of GGUF's blocks as units, the last one padded with zero weights.
    fn repack(gguf: &[u8], out: &mut [u8]);
    /// One unit of `UNIT_BYTES`, unpacked.
    ///
    /// # Safety
    /// The CPU has the features of [`dot_rows`].
    unsafe fn unpack(unit: &[u8]) -> LaneUnit;
}

/// A [`Lanes32`] unit unpacked: a weight is `scale * value + offset`, per lane.
pub(crate) struct LaneUnit {
    /// Eight vectors of unsigned values: byte `4l + b` of vector `k` is element `4k + b` of
    /// lane `l`.
    pub(crate) values: [__m512i; 8],
    pub(crate) scales: __m512,
    /// What each lane's activation sum is multiplied by: the offset (minus Q4_K's minimum,
    /// minus 16 times Q5_0's scale).
    pub(crate) offsets: __m512,
}

/// The [`UnitSums`] of a [`Lanes32`] format.
pub(crate) struct ByLane<K>(PhantomData<K>);

impl<K: Lanes32> UnitSums for ByLane<K> {
    const ACTIVATION: ActivationFormat = K::ACTIVATION;
    const UNIT_BYTES: usize = K::UNIT_BYTES;
    fn repack(gguf: &[u8], out: &mut [u8]) {
        K::repack(gguf, out)
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn sums<const PARTS: usize, const R: usize>(
        weight: &[u8],
        activations: [&[u8]; R],
        mut acc: [__m512; R],
    ) -> [__m512; R] {
        let rows = units_of::<{ pairs512::BYTES }, R>(activations);
        for (i, unit) in weight.chunks_exact(K::UNIT_BYTES).enumerate() {
            prefetch_ahead_of_rows::<R>(unit);
            // SAFETY: this function has the features `unpack` needs.
            let LaneUnit {
                values: q,
                scales,
                offsets,
            } = unsafe { K::unpack(unit) };
            for (acc, row) in acc.iter_mut().zip(&rows) {
                let x = &row[i];
                let sums = _mm512_castsi512_ps(load512(array(x, pairs512::SUMS)));
                *acc = _mm512_fmadd_ps(offsets, sums, *acc);
                for (values, d) in &pairs512::PARTS[..PARTS] {
                    // Two chains of four multiply-adds: VNNI's take 4 to 5 cycles each. Values
                    // below 32 times |x| <= 127, 32 to a lane, stay far inside an `i32`.
                    let mut even = _mm512_setzero_si512();
                    let mut odd = _mm512_setzero_si512();
                    for k in (0..8).step_by(2) {
                        let x_even = load512(array(x, values + 64 * k));
                        let x_odd = load512(array(x, values + 64 * (k + 1)));
                        even = _mm512_dpbusd_epi32(even, q[k], x_even);
                        odd = _mm512_dpbusd_epi32(odd, q[k + 1], x_odd);
                    }
                    let products = _mm512_cvtepi32_ps(_mm512_add_epi32(even, odd));
                    let d = _mm512_castsi512_ps(load512(array(x, *d)));
                    *acc = _mm512_fmadd_ps(products, _mm512_mul_ps(scales, d), *acc);
                }
            }
        }
        acc
    }
}

/// Each activation row as its units of `N` bytes.
#[inline]
pub(crate) fn units_of<const N: usize, const R: usize>(rows: [&[u8]; R]) -> [&[[u8; N]]; R] {
    let mut units = [&[][..]; R];
    for (units, row) in units.iter_mut().zip(rows) {
        *units = row.as_chunks::<N>().0;
    }
    units
}

/// Activation bytes of all rows that a column block may span: Zen 4's L1 (Sapphire Rapids has
/// 48 KiB). On Sapphire Rapids at eight rows of `ffn_down`, budgets from 10 to 40 KB ran within
/// 5% of each other (Q4_K, 3 units at two parts), 60 KB no faster than no blocks; `ffn_up`'s
/// 29 KB of activations (Q4_K, two parts) ran 5% slower in two blocks than in one.
const BLOCK_ACTIVATION_BYTES: usize = 32 << 10;
/// Weight rows whose sums a column block carries: 8 rows of 8 vectors, 4 KiB.
const GROUP_ROWS: usize = 8;

/// The kernels of the repacked format `K`.
pub(crate) const fn kernels<K: UnitSums>() -> Repacked {
    Repacked {
        activation: K::ACTIVATION,
        units: Units {
            len: K::ACTIVATION.block_len(),
            bytes: K::UNIT_BYTES,
            repack: K::repack,
        },
        dot: ByPrecision {
            split: dot::<K, 2>,
            single: dot::<K, 1>,
        },
        tile: Tile::of::<Rows<K>>(),
    }
}

/// The dot product of one weight row with one activation row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot<K: UnitSums, const PARTS: usize>(weight: &[u8], activation: &[u8]) -> f32 {
    // SAFETY: this function has the kernel's features; the caller checked the lengths.
    let [sums] = unsafe { K::sums::<PARTS, 1>(weight, [activation], [_mm512_setzero_ps()]) };
    sum_f32x16(sums)
}

/// Each row of `weights` with `R` activation rows, as [`RowsKernel::dot`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn dot_rows<K: UnitSums, const PARTS: usize, const R: usize>(
    weights: &[u8],
    row_bytes: usize,
    activations: [&[u8]; R],
    out: &mut [f32],
    stride: usize,
) {
    let units = row_bytes / K::UNIT_BYTES;
    let activation_bytes = K::ACTIVATION.block_bytes();
    let block = (BLOCK_ACTIVATION_BYTES / (R * activation_bytes)).clamp(1, units);
    // The sums of one block stay in registers.
    if block == units {
        for (weight, out) in weights.chunks_exact(row_bytes).zip(out.chunks_mut(stride)) {
            let zero = [_mm512_setzero_ps(); R];
            // SAFETY: this function has the kernel's features; the caller checked the lengths.
            let acc = unsafe { K::sums::<PARTS, R>(weight, activations, zero) };
            out[..R].copy_from_slice(&sums_f32x16(acc));
        }
        return;
    }
    let group_bytes = GROUP_ROWS * row_bytes;
    for (group, out) in weights
        .chunks(group_bytes)
        .zip(out.chunks_mut(GROUP_ROWS * stride))
    {
        let mut acc = [[_mm512_setzero_ps(); R]; GROUP_ROWS];
        for first in (0..units).step_by(block) {
            let columns = first..(first + block).min(units);
            let weight_bytes = columns.start * K::UNIT_BYTES..columns.end * K::UNIT_BYTES;
            let mut x = [&[][..]; R];
            for (x, a) in x.iter_mut().zip(activations) {
                *x = &a[columns.start * activation_bytes..columns.end * activation_bytes];
            }
            for (weight, acc) in group.chunks_exact(row_bytes).zip(&mut acc) {
                // SAFETY: this function has the kernel's features; `x` spans the same units.
                *acc = unsafe { K::sums::<PARTS, R>(&weight[weight_bytes.clone()], x, *acc) };
            }
        }
        let rows = group.len() / row_bytes;
        for (acc, out) in acc[..rows].iter().zip(out.chunks_mut(stride)) {
            out[..R].copy_from_slice(&sums_f32x16(*acc));
        }
    }
}

/// The rows kernel of a repacked format.
struct Rows<K>(std::marker::PhantomData<K>);

impl<K: UnitSums> RowsKernel for Rows<K> {
    const MAX_ROWS: usize = 8;
    unsafe fn dot<const PARTS: usize, const R: usize>(
        weights: &[u8],
        row_bytes: usize,
        activations: [&[u8]; R],
        out: &mut [f32],
        stride: usize,
    ) {
        // SAFETY: the caller checked the CPU and the lengths.
        unsafe { dot_rows::<K, PARTS, R>(weights, row_bytes, activations, out, stride) }
    }
}
