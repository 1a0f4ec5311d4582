//! Small x86-64 helpers shared by the SIMD kernels: loads from fixed-size byte arrays (so that the
//! kernels themselves need no unsafe code) and horizontal reductions.

use std::arch::x86_64::*;

/// The `N` items of `items` starting at `offset`. Kernels call this with constant offsets
/// inside fixed-size blocks, where it compiles to nothing.
#[inline(always)]
pub(crate) fn array<T, const N: usize>(items: &[T], offset: usize) -> &[T; N] {
    items[offset..]
        .first_chunk::<N>()
        .expect("block field lies within its block")
}

/// [`array`], writable.
#[inline(always)]
pub(crate) fn array_mut<T, const N: usize>(items: &mut [T], offset: usize) -> &mut [T; N] {
    items[offset..]
        .first_chunk_mut::<N>()
        .expect("block field lies within its block")
}

/// How far ahead of the weights being multiplied the kernels prefetch.
///
/// A matmul streams its weights from memory once per token. The hardware prefetchers alone do
/// not keep far enough ahead for the memory transfers to overlap the arithmetic: measured on a
/// Q4_K matrix larger than the caches, prefetching 8 KiB ahead raised one core's throughput
/// from 6 to 9.7 GB/s (4 to 16 KiB all did well).
const PREFETCH_DISTANCE: usize = 8 << 10;

/// Prefetches the cache lines `PREFETCH_DISTANCE` bytes after those of `weights`. Past the end of
/// a weight row lie, in a matrix, the rows that will be multiplied next.
#[inline(always)]
pub(crate) fn prefetch_ahead(weights: &[u8]) {
    prefetch_ahead_of_rows::<1>(weights);
}

/// [`prefetch_ahead`] for a kernel multiplying each weight block with `R` activation rows. Each
/// weight byte then takes `R` times as long, so the same lead in time needs fewer bytes; and
/// lines fetched too early are evicted from L1 by those rows' activations before their use (at
/// eight rows on Sapphire Rapids, 8 KiB ahead ran 35% slower than 2 KiB from DRAM; one row ran
/// 10% slower at 2 KiB).
#[inline(always)]
pub(crate) fn prefetch_ahead_of_rows<const R: usize>(weights: &[u8]) {
    let distance = (2 * PREFETCH_DISTANCE / R).clamp(PREFETCH_DISTANCE / 4, PREFETCH_DISTANCE);
    let ahead = weights.as_ptr().wrapping_add(distance);
    for offset in (0..weights.len()).step_by(64) {
        // SAFETY: a prefetch is a hint: it never faults and reads nothing architecturally, so
        // any address, even one past the row or past the end of memory, is allowed.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(offset).cast()) }
    }
}

#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn load256(bytes: &[u8; 32]) -> __m256i {
    // SAFETY: `bytes` is 32 readable bytes and the load has no alignment requirement.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn load512(bytes: &[u8; 64]) -> __m512i {
    // SAFETY: `bytes` is 64 readable bytes and the load has no alignment requirement.
    unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) }
}

#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn load128(bytes: &[u8; 16]) -> __m128i {
    // SAFETY: `bytes` is 16 readable bytes and the load has no alignment requirement.
    unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
}

/// Eight little-endian `f32` values.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn load_f32x8(bytes: &[u8; 32]) -> __m256 {
    _mm256_castsi256_ps(load256(bytes))
}

/// The `f16` at `offset` of `bytes`, widened to `f32` with F16C.
///
/// Written in assembly because LLVM, seeing that only one lane of the conversion is used, loads
/// the `f16` with an insert into whichever vector register is free; when that register is a
/// kernel's accumulator, every block then waits for the one before.
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(crate) fn f16_at(bytes: &[u8], offset: usize) -> f32 {
    let bits = u32::from(crate::bytes::u16_at(bytes, offset));
    let widened: __m128;
    // SAFETY: two register-only instructions of AVX and F16C, which this function requires.
    unsafe {
        std::arch::asm!(
            "vmovd {widened}, {bits:e}",
            "vcvtph2ps {widened}, {widened}",
            bits = in(reg) bits,
            widened = out(xmm_reg) widened,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    _mm_cvtss_f32(widened)
}

/// The sum of the eight lanes.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn sum_f32x8(v: __m256) -> f32 {
    let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)))
}

/// The sum of the sixteen lanes.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn sum_f32x16(v: __m512) -> f32 {
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    sum_f32x8(_mm256_add_ps(_mm512_castps512_ps256(v), high))
}

/// The sum of each vector's sixteen lanes, bitwise equal to [`sum_f32x16`] of each (the same
/// pairs added in the same tree), eight vectors sharing each add: a quarter of the instructions
/// of eight separate sums, which a kernel of eight rows spent on every row of 1,536 weights.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn sums_f32x16<const R: usize>(v: [__m512; R]) -> [f32; R] {
    let mut eight = [_mm512_setzero_ps(); 8];
    eight[..R].copy_from_slice(&v);
    // Lanes i and i + 8 of vectors 2p and 2p + 1: per 128 bits, [2p low, 2p high, 2p + 1 low,
    // 2p + 1 high] (shuffles by 128-bit lane: two from the first operand, two from the second).
    let mut halves = [_mm512_setzero_ps(); 4];
    for (p, halves) in halves.iter_mut().enumerate() {
        let (a, b) = (eight[2 * p], eight[2 * p + 1]);
        *halves = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(a, b),
            _mm512_shuffle_f32x4::<0xee>(a, b),
        );
    }
    // Lanes i and i + 4: per 128 bits, the quarters of vectors 0 to 3, then of 4 to 7.
    let mut quarters = [_mm512_setzero_ps(); 2];
    for (q, quarters) in quarters.iter_mut().enumerate() {
        let (a, b) = (halves[2 * q], halves[2 * q + 1]);
        *quarters = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(a, b),
            _mm512_shuffle_f32x4::<0xdd>(a, b),
        );
    }
    // Lanes i and i + 2 within each 128 bits, then lanes 0 and 1: 128-bit lane k ends with
    // vector k's sum in element 0 and vector k + 4's in element 2.
    let [a, b] = quarters;
    let pairs = _mm512_add_ps(
        _mm512_shuffle_ps::<0x44>(a, b),
        _mm512_shuffle_ps::<0xee>(a, b),
    );
    let sums = _mm512_add_ps(pairs, _mm512_shuffle_ps::<0xb1>(pairs, pairs));
    let mut lanes = [0.0; 16];
    // SAFETY: `lanes` is 64 writable bytes and the store has no alignment requirement.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), sums) };
    let mut out = [0.0; R];
    for (i, out) in out.iter_mut().enumerate() {
        *out = lanes[4 * (i % 4) + 2 * (i / 4)];
    }
    out
}

/// Sums adjacent pairs of `i16` lanes into `i32` lanes.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn sum_i16_pairs(v: __m256i) -> __m256i {
    _mm256_madd_epi16(v, _mm256_set1_epi16(1))
}

#[target_feature(enable = "avx")]
#[inline]
pub(crate) fn load_f32s(values: &[f32; 8]) -> __m256 {
    // SAFETY: `values` is 32 readable bytes and the load has no alignment requirement.
    unsafe { _mm256_loadu_ps(values.as_ptr()) }
}

#[target_feature(enable = "avx")]
#[inline]
pub(crate) fn store256(bytes: &mut [u8; 32], v: __m256i) {
    // SAFETY: `bytes` is 32 writable bytes and the store has no alignment requirement.
    unsafe { _mm256_storeu_si256(bytes.as_mut_ptr().cast(), v) }
}

/// The largest of the eight lanes.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn max_f32x8(v: __m256) -> f32 {
    let quad = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let pair = _mm_max_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_max_ss(pair, _mm_movehdup_ps(pair)))
}

/// The sum of the eight `i32` lanes.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn sum_i32x8(v: __m256i) -> i32 {
    let quad = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let pair = _mm_add_epi32(quad, _mm_unpackhi_epi64(quad, quad));
    _mm_cvtsi128_si32(_mm_add_epi32(pair, _mm_shuffle_epi32(pair, 0b01)))
}

/// `acc` plus the sums of adjacent pairs of `i16` products of `a` and `b` (VNNI's `vpdpwssd`).
///
/// Written in assembly because LLVM, tuning for a generic x86-64, splits the intrinsic into
/// `vpmaddwd` and `vpaddd`: in kernels limited by how many vector instructions the CPU issues,
/// that extra instruction per multiply measurably costs.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
pub(crate) fn dpwssd512(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: one register-only instruction of AVX-512 VNNI, which this function requires.
    unsafe {
        std::arch::asm!(
            "vpdpwssd {acc}, {a}, {b}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}
