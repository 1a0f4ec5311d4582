use std::fmt;

use lucebox_gguf::GgmlType;

use crate::activation::{ActivationFormat, ActivationPrecision, QuantizeFn};
use crate::error::UnsupportedType;
use crate::float::{Bf16, F16, F32};
use crate::iq4_xs::Iq4Xs;
use crate::isa::Isa;
use crate::kquants::{Q4K, Q5K, Q6K};
use crate::legacy::{Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};

/// A dot product of one weight row with one activation row. The caller has checked that both
/// hold the same number of whole blocks and that the CPU has the ISA the kernel was compiled for.
pub(crate) type DotFn = unsafe fn(&[u8], &[u8]) -> f32;

/// Dot products of weight rows of `row_bytes` bytes, back to back in `weights`, with `rows`
/// activation rows (between one and the tile's `max_rows`) stored back to back:
/// `out[w * stride + i]` for weight row `w` and activation row `i`, under [`DotFn`]'s
/// conditions.
pub(crate) type DotTileFn = unsafe fn(
    weights: &[u8],
    row_bytes: usize,
    activations: &[u8],
    rows: usize,
    out: &mut [f32],
    stride: usize,
);

/// A kernel in its two instances: multiplying both activation parts, and the high part alone.
#[derive(Clone, Copy)]
pub(crate) struct ByPrecision<T> {
    pub(crate) split: T,
    pub(crate) single: T,
}

impl<T: Copy> ByPrecision<T> {
    /// One kernel for both precisions: it multiplies both parts, and the zero low part of
    /// single-part activations adds nothing.
    pub(crate) const fn same(kernel: T) -> Self {
        ByPrecision {
            split: kernel,
            single: kernel,
        }
    }

    fn get(self, precision: ActivationPrecision) -> T {
        match precision {
            ActivationPrecision::Split => self.split,
            ActivationPrecision::Single => self.single,
        }
    }
}

/// The two instances of a dot product generic over the activation parts it multiplies.
macro_rules! by_parts {
    ($($dot:ident)::+) => {
        $crate::format::ByPrecision {
            split: $($dot)::+::<2>,
            single: $($dot)::+::<1>,
        }
    };
}

pub(crate) use by_parts;

/// A kernel that unpacks each weight block once for several activation rows.
#[derive(Clone, Copy)]
pub(crate) struct Tile {
    dot: DotTileFn,
    max_rows: usize,
}

/// A kernel family for `R` activation rows at once, `R` known at compile time so that each row's
/// sums stay in registers, multiplying `PARTS` parts of the activations (1 or 2).
pub(crate) trait RowsKernel {
    /// The most rows whose sums fit the vector registers.
    const MAX_ROWS: usize;
    /// Each weight row of `row_bytes` in `weights` with the `R` activation rows:
    /// `out[w * stride + i]` for weight row `w` and activation row `i`.
    ///
    /// # Safety
    /// The CPU has the kernel's instruction set, each activation row holds as many elements as a
    /// weight row, and `out` holds `stride * (weight rows - 1) + R` values.
    unsafe fn dot<const PARTS: usize, const R: usize>(
        weights: &[u8],
        row_bytes: usize,
        activations: [&[u8]; R],
        out: &mut [f32],
        stride: usize,
    );
}

impl Tile {
    /// The tiles of `K`, for any row count up to `K::MAX_ROWS`.
    pub(crate) const fn of<K: RowsKernel>() -> ByPrecision<Tile> {
        assert!(K::MAX_ROWS <= 8, "tiles are instantiated for up to 8 rows");
        ByPrecision {
            split: Tile {
                dot: dot_tile::<K, 2>,
                max_rows: K::MAX_ROWS,
            },
            single: Tile {
                dot: dot_tile::<K, 1>,
                max_rows: K::MAX_ROWS,
            },
        }
    }
}

/// Runs `K::dot::<PARTS, R>` with `R = rows`.
///
/// # Safety
/// As [`RowsKernel::dot`], `rows` is between 1 and `K::MAX_ROWS`, and `out` holds
/// `stride * (weight rows - 1) + rows` values.
unsafe fn dot_tile<K: RowsKernel, const PARTS: usize>(
    weights: &[u8],
    row_bytes: usize,
    activations: &[u8],
    rows: usize,
    out: &mut [f32],
    stride: usize,
) {
    /// Splitting the activations and matching on `R` once per run of weight rows, not once
    /// per row, saved a tenth of a decode step's time.
    ///
    /// # Safety
    /// As `dot_tile`, with `R` rows.
    unsafe fn split_rows<K: RowsKernel, const PARTS: usize, const R: usize>(
        weights: &[u8],
        row_bytes: usize,
        activations: &[u8],
        out: &mut [f32],
        stride: usize,
    ) {
        let bytes = activations.len() / R;
        let activations: [&[u8]; R] =
            std::array::from_fn(|i| &activations[i * bytes..(i + 1) * bytes]);
        // SAFETY: the caller's conditions are the kernel's.
        unsafe { K::dot::<PARTS, R>(weights, row_bytes, activations, out, stride) }
    }
    let (w, a, o) = (weights, activations, out);
    // SAFETY: the caller's conditions, with `R = rows`.
    unsafe {
        match rows {
            1 => split_rows::<K, PARTS, 1>(w, row_bytes, a, o, stride),
            2 => split_rows::<K, PARTS, 2>(w, row_bytes, a, o, stride),
            3 => split_rows::<K, PARTS, 3>(w, row_bytes, a, o, stride),
            4 => split_rows::<K, PARTS, 4>(w, row_bytes, a, o, stride),
            5 => split_rows::<K, PARTS, 5>(w, row_bytes, a, o, stride),
            6 => split_rows::<K, PARTS, 6>(w, row_bytes, a, o, stride),
            7 => split_rows::<K, PARTS, 7>(w, row_bytes, a, o, stride),
            8 => split_rows::<K, PARTS, 8>(w, row_bytes, a, o, stride),
            rows => unreachable!("a tile of {rows} rows"),
        }
    }
}

/// The AVX2 kernels of format `F` for several rows: 16 vector registers hold four rows' sums.
#[cfg(target_arch = "x86_64")]
pub(crate) struct Avx2Rows<F>(std::marker::PhantomData<F>);

/// The AVX-512 kernels of format `F` for several rows: 32 vector registers hold eight rows' sums.
#[cfg(target_arch = "x86_64")]
pub(crate) struct Avx512Rows<F>(std::marker::PhantomData<F>);

/// Implements [`RowsKernel`] for `$kernels` with the const-generic kernel `$dot`.
macro_rules! rows_kernel {
    ($($kernels:ty => $($dot:ident)::+, $max_rows:literal;)*) => {$(
        #[cfg(target_arch = "x86_64")]
        impl $crate::format::RowsKernel for $kernels {
            const MAX_ROWS: usize = $max_rows;
            unsafe fn dot<const PARTS: usize, const R: usize>(
                weights: &[u8],
                row_bytes: usize,
                activations: [&[u8]; R],
                out: &mut [f32],
                stride: usize,
            ) {
                for (w, weight) in weights.chunks_exact(row_bytes).enumerate() {
                    // SAFETY: the caller checked the CPU and the lengths.
                    let dots = unsafe { $($dot)::+::<PARTS, R>(weight, activations) };
                    out[w * stride..w * stride + R].copy_from_slice(&dots);
                }
            }
        }
    )*};
}

pub(crate) use rows_kernel;

/// One weight storage format: its block layout and its kernels.
///
/// The portable functions are the reference every SIMD kernel is tested against.
pub(crate) trait Format {
    /// The ggml type this implements.
    const TYPE: GgmlType;
    /// The activation format its dot products take.
    const ACTIVATION: ActivationFormat;
    /// Dequantizes whole blocks; `src` holds exactly the blocks of `dst`.
    fn dequantize(src: &[u8], dst: &mut [f32]);
    /// The portable dot product, of both parts (a zero low part adds nothing).
    fn dot(weight: &[u8], activation: &[u8]) -> f32;
    /// The AVX2 dot product.
    #[cfg(target_arch = "x86_64")]
    const AVX2_DOT: ByPrecision<DotFn>;
    /// The AVX-512 dot product, where one beats the AVX2 one.
    #[cfg(target_arch = "x86_64")]
    const AVX512_DOT: ByPrecision<DotFn> = Self::AVX2_DOT;
    /// An AVX2 kernel for several activation rows at once, where unpacking each weight block once
    /// for all of them pays.
    #[cfg(target_arch = "x86_64")]
    const AVX2_TILE: Option<ByPrecision<Tile>> = None;
    /// The AVX-512 kernel for several activation rows.
    #[cfg(target_arch = "x86_64")]
    const AVX512_TILE: Option<ByPrecision<Tile>> = Self::AVX2_TILE;
    /// AVX-512 kernels that take the weights repacked at load, where that pays; they replace
    /// `AVX512_DOT` and `AVX512_TILE`.
    #[cfg(target_arch = "x86_64")]
    const AVX512_REPACKED: Option<Repacked> = None;
}

/// Kernels that take the weights repacked once, at load, into units of their own layout, and
/// activations in a layout of their own.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct Repacked {
    pub(crate) activation: ActivationFormat,
    pub(crate) units: Units,
    pub(crate) dot: ByPrecision<DotFn>,
    pub(crate) tile: ByPrecision<Tile>,
}

/// A repacked layout: units of `len` elements in `bytes` bytes, which `repack` writes from one
/// row of GGUF's blocks, its last unit padded with zero weights.
#[derive(Clone, Copy)]
pub(crate) struct Units {
    pub(crate) len: usize,
    pub(crate) bytes: usize,
    pub(crate) repack: fn(&[u8], &mut [u8]),
}

/// Declares the supported formats, once.
macro_rules! weight_formats {
    ($($format:ty),* $(,)?) => {
        /// Every weight type with kernels.
        const SUPPORTED: &[GgmlType] = &[$(<$format>::TYPE),*];

        fn kernels(ty: GgmlType, isa: Isa, precision: ActivationPrecision) -> Option<Kernels> {
            $(if ty == <$format>::TYPE {
                return Some(Kernels::of::<$format>(isa, precision));
            })*
            None
        }
    };
}

weight_formats!(
    F32, F16, Bf16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4K, Q5K, Q6K, Iq4Xs
);

/// How the kernels take a weight row.
#[derive(Clone, Copy)]
enum Layout {
    /// GGUF's blocks, in place.
    Gguf,
    Repacked(Units),
}

#[derive(Clone, Copy)]
struct Kernels {
    activation: ActivationFormat,
    /// Dequantizes GGUF's blocks, whatever the layout the dot products take.
    dequantize: fn(&[u8], &mut [f32]),
    quantize_activation: QuantizeFn,
    layout: Layout,
    dot: DotFn,
    tile: Option<Tile>,
}

impl Kernels {
    fn of<F: Format>(isa: Isa, precision: ActivationPrecision) -> Kernels {
        #[cfg(target_arch = "x86_64")]
        if let (Isa::Avx512, Some(repacked)) = (isa, F::AVX512_REPACKED) {
            return Kernels {
                activation: repacked.activation,
                dequantize: F::dequantize,
                quantize_activation: repacked.activation.quantizer(precision, isa),
                layout: Layout::Repacked(repacked.units),
                dot: repacked.dot.get(precision),
                tile: Some(repacked.tile.get(precision)),
            };
        }
        let (dot, tile): (DotFn, Option<Tile>) = match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => (
                F::AVX2_DOT.get(precision),
                F::AVX2_TILE.map(|t| t.get(precision)),
            ),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => (
                F::AVX512_DOT.get(precision),
                F::AVX512_TILE.map(|t| t.get(precision)),
            ),
            _ => (F::dot, None),
        };
        Kernels {
            activation: F::ACTIVATION,
            dequantize: F::dequantize,
            quantize_activation: F::ACTIVATION.quantizer(precision, isa),
            layout: Layout::Gguf,
            dot,
            tile,
        }
    }
}

/// The kernels for one weight type on one instruction-set level, chosen once.
///
/// ```
/// use lucebox_quant::{GgmlType, Isa, WeightFormat};
///
/// let format = WeightFormat::new(GgmlType::Q8_0, Isa::detect())?;
/// // One Q8_0 block: scale 1.0 (f16 bits 0x3c00), then the values 0, 1, ..., 31.
/// let mut row = vec![0x00, 0x3c];
/// row.extend(0..32u8);
/// let x = vec![1.0f32; 32];
/// let mut activation = vec![0; format.activation_format().row_bytes(x.len())];
/// format.quantize_activation(&x, &mut activation);
/// let dot = format.dot(&row, &activation);
/// assert!((dot - (0..32).sum::<i32>() as f32).abs() < 1e-3, "{dot}");
/// # Ok::<(), lucebox_quant::UnsupportedType>(())
/// ```
#[derive(Clone, Copy)]
pub struct WeightFormat {
    ty: GgmlType,
    isa: Isa,
    precision: ActivationPrecision,
    kernels: Kernels,
}

impl WeightFormat {
    /// The kernels for weights of type `ty` on `isa`: those written for that level, else those of
    /// the best level below it; activations in [`ActivationPrecision::Split`].
    pub fn new(ty: GgmlType, isa: Isa) -> Result<Self, UnsupportedType> {
        Self::with_precision(ty, isa, ActivationPrecision::Split)
    }

    /// As [`new`](Self::new), with activations quantized at `precision` (for the formats that
    /// quantize them).
    pub fn with_precision(
        ty: GgmlType,
        isa: Isa,
        precision: ActivationPrecision,
    ) -> Result<Self, UnsupportedType> {
        let kernels = kernels(ty, isa, precision).ok_or(UnsupportedType::NoKernels { ty })?;
        if !isa.is_available() {
            return Err(UnsupportedType::IsaUnavailable { ty, isa });
        }
        Ok(WeightFormat {
            ty,
            isa,
            precision,
            kernels,
        })
    }

    /// Every weight type [`new`](Self::new) accepts.
    pub fn supported_types() -> &'static [GgmlType] {
        SUPPORTED
    }

    /// The weight type.
    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// The instruction-set level the kernels were chosen for.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The precision of the quantized activations.
    pub fn activation_precision(&self) -> ActivationPrecision {
        self.precision
    }

    /// How activations must be quantized for [`dot`](Self::dot).
    pub fn activation_format(&self) -> ActivationFormat {
        self.kernels.activation
    }

    /// Dequantizes the weights of `dst.len()` elements from `src`, GGUF's blocks (not the
    /// repacked layout of [`repack_row`](Self::repack_row)), into `dst`.
    ///
    /// # Panics
    /// When `dst.len()` is not a whole number of blocks or `src` does not hold exactly those
    /// blocks.
    pub fn dequantize(&self, src: &[u8], dst: &mut [f32]) {
        assert_eq!(
            Some(src.len() as u64),
            self.ty.bytes_for(dst.len() as u64),
            "{} bytes for {} elements of {}",
            src.len(),
            dst.len(),
            self.ty
        );
        (self.kernels.dequantize)(src, dst);
    }

    /// Quantizes one activation row into
    /// [`activation_format().row_bytes(x.len())`](ActivationFormat::row_bytes) bytes.
    ///
    /// Non-finite activations give unspecified values.
    ///
    /// # Panics
    /// When `dst` does not have that length.
    pub fn quantize_activation(&self, x: &[f32], dst: &mut [u8]) {
        assert_eq!(
            dst.len(),
            self.kernels.activation.row_bytes(x.len()),
            "activation row bytes for {} elements",
            x.len()
        );
        // SAFETY: `new` checked that the CPU has `isa`, and the lengths match.
        unsafe { (self.kernels.quantize_activation)(x, dst) }
    }

    /// Whether the kernels take weight rows repacked by [`repack_row`](Self::repack_row)
    /// rather than GGUF's blocks in place: Q4_K, Q6_K and Q5_0 with AVX-512, whose kernels
    /// read each sub-block's (Q5_0: block's) values from one vector lane.
    pub fn repacks(&self) -> bool {
        matches!(self.kernels.layout, Layout::Repacked(_))
    }

    /// The bytes of a weight row of `cols` elements as the kernels take it: GGUF's, or those of
    /// [`repack_row`](Self::repack_row) where the format [`repacks`](Self::repacks).
    ///
    /// # Panics
    /// When `cols` is not a whole number of blocks.
    pub fn kernel_row_bytes(&self, cols: usize) -> usize {
        let gguf = self.gguf_row_bytes(cols);
        match self.kernels.layout {
            Layout::Gguf => gguf,
            Layout::Repacked(units) => cols.div_ceil(units.len) * units.bytes,
        }
    }

    /// Rearranges one weight row of GGUF's blocks into `out`, the layout the kernels take (a
    /// copy where the format does not [`repack`](Self::repacks)).
    ///
    /// # Panics
    /// When `gguf_row` is not a whole number of blocks or `out` is not
    /// [`kernel_row_bytes`](Self::kernel_row_bytes) long.
    pub fn repack_row(&self, gguf_row: &[u8], out: &mut [u8]) {
        let cols = self.gguf_cols(gguf_row);
        assert_eq!(out.len(), self.kernel_row_bytes(cols), "repacked row bytes");
        match self.kernels.layout {
            Layout::Gguf => out.copy_from_slice(gguf_row),
            Layout::Repacked(units) => (units.repack)(gguf_row, out),
        }
    }

    /// [`repack_row`](Self::repack_row) for every row of `gguf_rows`, rows of `cols` elements
    /// back to back.
    ///
    /// # Panics
    /// When `cols` is not a whole number of blocks or `gguf_rows` not a whole number of rows.
    pub fn repack_rows(&self, gguf_rows: &[u8], cols: usize) -> Vec<u8> {
        let rows = gguf_rows.len() / self.gguf_row_bytes(cols).max(1);
        let mut out = vec![0; rows * self.kernel_row_bytes(cols)];
        self.repack_rows_into(gguf_rows, cols, &mut out);
        out
    }

    /// [`repack_rows`](Self::repack_rows) into `out`, which holds as many rows as the kernels
    /// take them.
    ///
    /// # Panics
    /// As `repack_rows`, and when `out` does not hold as many rows.
    pub fn repack_rows_into(&self, gguf_rows: &[u8], cols: usize, out: &mut [u8]) {
        let gguf_row = self.gguf_row_bytes(cols);
        assert!(
            gguf_row > 0 && gguf_rows.len().is_multiple_of(gguf_row),
            "{} weight bytes are not whole rows of {cols} elements",
            gguf_rows.len()
        );
        let row = self.kernel_row_bytes(cols);
        assert_eq!(
            out.len(),
            gguf_rows.len() / gguf_row * row,
            "repacked bytes of {cols}-element rows"
        );
        for (gguf, out) in gguf_rows
            .chunks_exact(gguf_row)
            .zip(out.chunks_exact_mut(row))
        {
            self.repack_row(gguf, out);
        }
    }

    /// The dot product of one weight row (as the kernels take it, see
    /// [`repacks`](Self::repacks)) with one quantized activation row of the same length.
    ///
    /// The SIMD kernels hint the CPU to fetch the 8 KiB after the row (in a matrix, the next
    /// rows); they read nothing outside the two slices.
    ///
    /// # Panics
    /// When `weight_row` is not a whole number of blocks or `activation_row` does not hold as
    /// many elements.
    pub fn dot(&self, weight_row: &[u8], activation_row: &[u8]) -> f32 {
        let row_bytes = self.activation_row_bytes(weight_row);
        assert_eq!(
            activation_row.len(),
            row_bytes,
            "activation row bytes for a weight row of {} bytes",
            weight_row.len()
        );
        // SAFETY: `new` checked that the CPU has `isa`, and the lengths match.
        unsafe { (self.kernels.dot)(weight_row, activation_row) }
    }

    /// How many activation rows [`dot_rows`](Self::dot_rows) multiplies per pass over a weight
    /// row: 1 where the format has no kernel for several rows.
    pub fn tile_rows(&self) -> usize {
        self.kernels.tile.map_or(1, |tile| tile.max_rows)
    }

    /// The dot products of one weight row with several quantized activation rows, stored back to
    /// back: `out[i]` is [`dot`](Self::dot) of the weight row with activation row `i`.
    ///
    /// Formats with a kernel for several rows (on x86-64: Q4_K and Q5_K, and with AVX-512 the
    /// K-quants and the legacy formats) unpack each weight block once for up to
    /// [`tile_rows`](Self::tile_rows) activation rows, which makes a prefill's and a speculative
    /// verify's matmuls cheaper; the others take the rows one by one. Either way the results
    /// equal `dot`'s, bit for bit.
    ///
    /// # Panics
    /// When `weight_row` is not a whole number of blocks or `activation_rows` does not hold
    /// `out.len()` rows of as many elements.
    pub fn dot_rows(&self, weight_row: &[u8], activation_rows: &[u8], out: &mut [f32]) {
        if weight_row.is_empty() {
            assert!(
                activation_rows.is_empty(),
                "activation bytes for an empty weight row"
            );
            out.fill(0.0);
            return;
        }
        self.dot_matrix(weight_row, weight_row.len(), activation_rows, out);
    }

    /// [`dot_rows`](Self::dot_rows) for several weight rows of `row_bytes` bytes each, back to
    /// back in `weight_rows`: `out[w * n + i]` is the dot product of weight row `w` with
    /// activation row `i` of the `n = out.len() / weight rows` in `activation_rows`. Results
    /// equal `dot`'s, bit for bit; the kernels are called once per run of weight rows rather
    /// than once per row.
    ///
    /// # Panics
    /// When `row_bytes` is zero or not a whole number of blocks, `weight_rows` not a whole
    /// number of rows, or `activation_rows` and `out` do not hold as many activation rows.
    pub fn dot_matrix(
        &self,
        weight_rows: &[u8],
        row_bytes: usize,
        activation_rows: &[u8],
        out: &mut [f32],
    ) {
        assert!(
            row_bytes > 0 && weight_rows.len().is_multiple_of(row_bytes),
            "{} weight bytes are not whole rows of {row_bytes} bytes",
            weight_rows.len()
        );
        let weight_count = weight_rows.len() / row_bytes;
        if weight_count == 0 {
            assert!(out.is_empty(), "dot products of no weight rows");
            return;
        }
        let activation_bytes = self.activation_row_bytes(&weight_rows[..row_bytes]);
        let n = out.len() / weight_count;
        assert!(
            out.len() == n * weight_count
                && Some(activation_rows.len()) == activation_bytes.checked_mul(n),
            "activation bytes for {n} rows matching a weight row of {row_bytes} bytes"
        );
        if n == 0 {
            return;
        }
        let Some(tile) = self.kernels.tile else {
            let rows = weight_rows
                .chunks_exact(row_bytes)
                .zip(out.chunks_exact_mut(n));
            for (weight, out) in rows {
                for (out, row) in out
                    .iter_mut()
                    .zip(activation_rows.chunks_exact(activation_bytes))
                {
                    // SAFETY: `new` checked that the CPU has `isa`, and the lengths match.
                    *out = unsafe { (self.kernels.dot)(weight, row) };
                }
            }
            return;
        };
        // Equal tiles: seven rows on a kernel of four take four and three, not four and one,
        // as unpacking a block costs the same for any number of rows.
        let tiles = n.div_ceil(tile.max_rows);
        let mut first = 0;
        for t in 0..tiles {
            let rows = (n - first) / (tiles - t);
            let activations =
                &activation_rows[first * activation_bytes..(first + rows) * activation_bytes];
            // SAFETY: `new` checked that the CPU has `isa`, the lengths match, `rows` is
            // between 1 and `tile.max_rows`, and `out[first..]` holds
            // `n * (weight_count - 1) + rows` values.
            unsafe {
                (tile.dot)(
                    weight_rows,
                    row_bytes,
                    activations,
                    rows,
                    &mut out[first..],
                    n,
                );
            }
            first += rows;
        }
    }

    /// The bytes of an activation row matching `weight_row`, in the kernels' layout.
    fn activation_row_bytes(&self, weight_row: &[u8]) -> usize {
        let (unit_len, unit_bytes) = match self.kernels.layout {
            Layout::Gguf => (self.ty.block_len() as usize, self.ty.block_bytes() as usize),
            Layout::Repacked(units) => (units.len, units.bytes),
        };
        assert!(
            weight_row.len().is_multiple_of(unit_bytes),
            "{} weight bytes are not a whole number of {}-byte {} units",
            weight_row.len(),
            unit_bytes,
            self.ty
        );
        let elements = weight_row.len() / unit_bytes * unit_len;
        self.kernels.activation.row_bytes(elements)
    }

    /// The elements of a row of GGUF's blocks.
    fn gguf_cols(&self, gguf_row: &[u8]) -> usize {
        let block_bytes = self.ty.block_bytes() as usize;
        assert!(
            gguf_row.len().is_multiple_of(block_bytes),
            "{} weight bytes are not a whole number of {} blocks",
            gguf_row.len(),
            self.ty
        );
        gguf_row.len() / block_bytes * self.ty.block_len() as usize
    }

    /// GGUF's bytes for a row of `cols` elements.
    fn gguf_row_bytes(&self, cols: usize) -> usize {
        let block_len = self.ty.block_len() as usize;
        assert!(
            cols.is_multiple_of(block_len),
            "{cols} elements are not a whole number of {} blocks",
            self.ty
        );
        cols / block_len * self.ty.block_bytes() as usize
    }
}

impl fmt::Debug for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeightFormat")
            .field("ty", &self.ty)
            .field("isa", &self.isa)
            .field("activation", &self.kernels.activation)
            .field("precision", &self.precision)
            .finish()
    }
}
