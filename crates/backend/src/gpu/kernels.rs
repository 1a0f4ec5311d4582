//! The kernels of `kernels/cuda/` as one runtime loaded them for one device.

use std::collections::HashMap;
use std::sync::Arc;

use lucebox_gguf::GgmlType;
use lucebox_quant::ActivationPrecision;

use super::{GROUPED_ATTENTION, HEAD_DIMS, PROMPT_ATTENTION_HEAD_DIMS};
use crate::checks::HeadDims;

/// Every kernel, loaded for one device.
pub(crate) struct Kernels<F> {
    formats: HashMap<GgmlType, Arc<FormatKernels<F>>>,
    pub(crate) rms_norm: F,
    pub(crate) rms_norm_heads: F,
    pub(crate) rope: F,
    pub(crate) rope_store_kv: F,
    pub(crate) store_kv: F,
    /// Attention for every head length of [`HEAD_DIMS`].
    pub(crate) attention: PerHeadDim<F>,
    /// Attention taking several query heads of one KV head a block, for each of
    /// [`GROUPED_ATTENTION`].
    pub(crate) grouped_attention: GroupedAttention<F>,
    pub(crate) silu_mul: F,
    pub(crate) add: F,
    pub(crate) gather_rows: F,
    pub(crate) argmax_rows: F,
    pub(crate) sample_rows: F,
    pub(crate) quantize_q8: F,
    /// The f16 GEMM of prompt rows (`gemm.cu`); absent where the images have none (HIP).
    pub(crate) prompt_gemm: Option<PromptGemm<F>>,
    /// Prompt rows' attention on the tensor cores (`prompt_attention.cu`) for every head
    /// length of [`PROMPT_ATTENTION_HEAD_DIMS`]; absent where the images have none (HIP).
    pub(crate) prompt_attention: Option<PerHeadDim<F>>,
}

/// A family's kernel for each head length it takes: `<family>_<head_dim>` for the multiples
/// of `dims.multiple_of` up to `dims.max`, shortest first.
pub(crate) struct PerHeadDim<F> {
    family: &'static str,
    dims: HeadDims,
    kernels: Vec<F>,
}

impl<F> PerHeadDim<F> {
    /// Every instance of `family` through `function`, or the first one missing.
    fn load(
        family: &'static str,
        dims: HeadDims,
        function: &impl Fn(&str, &str) -> Result<F, String>,
    ) -> Result<Self, String> {
        let kernels = (1..=dims.max / dims.multiple_of)
            .map(|k| function(family, &format!("{family}_{}", k * dims.multiple_of)))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            family,
            dims,
            kernels,
        })
    }

    /// The kernel for heads of `head_dim` dimensions, if there is one.
    pub(crate) fn get(&self, head_dim: usize) -> Option<&F> {
        if !head_dim.is_multiple_of(self.dims.multiple_of) {
            return None;
        }
        self.kernels
            .get((head_dim / self.dims.multiple_of).checked_sub(1)?)
    }

    /// Every kernel, with its name.
    pub(crate) fn named(&self) -> impl Iterator<Item = (String, &F)> {
        self.kernels.iter().enumerate().map(|(i, kernel)| {
            let head_dim = (i + 1) * self.dims.multiple_of;
            (format!("{}_{head_dim}", self.family), kernel)
        })
    }
}

/// `attention_<head_dim>_x<group>`: attention whose blocks take `group` query heads of one KV
/// head, for each (head length, group) of [`GROUPED_ATTENTION`].
pub(crate) struct GroupedAttention<F> {
    kernels: Vec<((usize, u32), F)>,
}

impl<F> GroupedAttention<F> {
    fn load(function: &impl Fn(&str, &str) -> Result<F, String>) -> Result<Self, String> {
        let kernels = GROUPED_ATTENTION
            .head_dims
            .iter()
            .flat_map(|&head_dim| {
                GROUPED_ATTENTION
                    .groups
                    .iter()
                    .map(move |&group| (head_dim, group))
            })
            .map(|key| Ok((key, function("attention", &Self::name(key))?)))
            .collect::<Result<_, String>>()?;
        Ok(Self { kernels })
    }

    fn name((head_dim, group): (usize, u32)) -> String {
        format!("attention_{head_dim}_x{group}")
    }

    /// The kernel for heads of `head_dim` dimensions taken `group` a block, if there is one.
    pub(crate) fn get(&self, head_dim: usize, group: u32) -> Option<&F> {
        self.kernels
            .iter()
            .find(|(key, _)| *key == (head_dim, group))
            .map(|(_, kernel)| kernel)
    }

    /// Every kernel, with its name.
    pub(crate) fn named(&self) -> impl Iterator<Item = (String, &F)> {
        self.kernels
            .iter()
            .map(|(key, kernel)| (Self::name(*key), kernel))
    }
}

/// The f16 GEMM of prompt rows and its activations' conversion.
pub(crate) struct PromptGemm<F> {
    /// `activations_to_f16`: f32 rows to f16, a pair of values a thread.
    pub(crate) to_f16: F,
    /// `gemm_f16_<rows>x<weight rows>` for each of [`GEMM_TILES`], which give a row the same
    /// bits.
    pub(crate) tiles: [F; 4],
}

/// The (activation rows, weight rows) of each tile of the f16 GEMM's instances.
pub(crate) const GEMM_TILES: [(usize, usize); 4] = [(64, 64), (64, 128), (128, 64), (128, 128)];

/// The kernels of one storage format.
pub(crate) struct FormatKernels<F> {
    pub(crate) ty: GgmlType,
    /// The matvec for any number of activation rows: over f32 activations for the float
    /// formats, over quantized activations for the others.
    pub(crate) mmv: F,
    /// The matvec of exactly one quantized activation row (a decode step); the float formats
    /// have none.
    pub(crate) mmv1: Option<F>,
    /// `mmv1` taking weight rows two per warp (`mmv_q8_pairs`), present with it.
    pub(crate) mmv1p: Option<F>,
    /// `mmv1` over three matrices whose third is in the paired format (`mmv_q8_mixed`,
    /// `mmv1m_<this>_<that>`), for the pairs the images have.
    pub(crate) mmv1_mixed: Vec<(GgmlType, F)>,
    /// The matvec of up to four quantized activation rows (a short verify step); the float
    /// formats have none.
    pub(crate) mmv4: Option<F>,
    /// `mmv`, `mmv1` and `mmv4` for rows split between warps (`mmv_q8_split`); the float
    /// formats have none.
    pub(crate) split: Option<[F; 3]>,
    /// The tensor-core matmuls (`mmq.cu`) for blocks of [`MMQ_TILE_ROWS`] activation rows;
    /// absent where the images have none (HIP, the float formats).
    pub(crate) mmq: Option<[F; 2]>,
    /// The streamed tensor-core matmul (`mmt.cu`), with its own order of additions; present for
    /// Q4_K and Q6_K where the images have it (not HIP).
    pub(crate) mmt: Option<Streamed<F>>,
    /// `mmt` for activations quantized in one part (`mmt_..._single`), which skips the low
    /// part's products.
    pub(crate) mmt_single: Option<Streamed<F>>,
    pub(crate) get_rows: F,
    /// The matrix to f16, eight elements a thread (`dequantize_f16_<format>` of `gemm.cu`),
    /// before each GEMM of prompt rows; absent where the images have none (HIP).
    pub(crate) dequantize_f16: Option<F>,
}

/// How the names of the kernels for activations in one part end (`mmt_row_q4_k_single`).
const SINGLE_SUFFIX: &str = "_single";

impl<F> FormatKernels<F> {
    /// The streamed matmul for activations quantized at `precision`, where the images have it.
    pub(crate) fn streamed(&self, precision: ActivationPrecision) -> Option<&Streamed<F>> {
        match precision {
            ActivationPrecision::Split => self.mmt.as_ref(),
            ActivationPrecision::Single => self.mmt_single.as_ref(),
        }
    }
}

/// The kernels of the streamed matmul for one precision, which give a row the same bits.
pub(crate) struct Streamed<F> {
    /// Tiles of activation rows on the tensor cores (`mmt_<format>`), for any number of rows.
    pub(crate) tiles: F,
    /// Wide tiles (`mmt_wide_<format>`), for large launches of passes of more rows than a tile
    /// holds.
    pub(crate) wide_tiles: F,
    /// One activation row (a decode step) through warp reductions (`mmt_row_<format>`).
    pub(crate) row: F,
    /// The same with rows two per warp (`mmt_pair_<format>`), for launches of many rows of
    /// 4k + 2 super-blocks.
    pub(crate) pair: F,
    /// The same with a warp per row where the rows are cut into ranges of at most two
    /// super-blocks (`mmt_ranges_<format>`), two ranges a turn.
    pub(crate) ranges: F,
    /// `tiles`, `wide_tiles` and `ranges` over three matrices whose third is in the paired
    /// format (`mmt_mixed_<this>_<that>`, `mmt_wide_mixed_...`, `mmt_ranges_mixed_...`), for the
    /// pairs the images have.
    pub(crate) mixed: Vec<(GgmlType, StreamedMixed<F>)>,
}

/// The streamed matmul over three matrices whose third is in another format: its tiles, and
/// its one-row kernel for rows cut into ranges of at most two super-blocks, the only rows the
/// backend launches it for.
pub(crate) struct StreamedMixed<F> {
    pub(crate) tiles: F,
    pub(crate) wide_tiles: F,
    pub(crate) ranges: F,
}

/// The activation rows per block of each `FormatKernels::mmq` instance, smallest first.
pub(crate) const MMQ_TILE_ROWS: [u32; 2] = [8, 16];

/// All of a set of instances, or none: a format has a kernel family only if the images hold
/// every instance of it.
fn every<F, const N: usize>(instances: [Option<F>; N]) -> Option<[F; N]> {
    let found: Vec<F> = instances.into_iter().collect::<Option<_>>()?;
    found.try_into().ok()
}

impl<F> Kernels<F> {
    /// Loads every kernel through `function(family, name)`, `family` being the file of
    /// `kernels/cuda/` that defines `name`.
    pub(crate) fn load(function: impl Fn(&str, &str) -> Result<F, String>) -> Result<Self, String> {
        // The formats with kernels are those kernels/cuda/quant.cuh instantiates.
        let formats = GgmlType::ALL
            .iter()
            .filter_map(|&ty| {
                let suffix = ty.name().to_lowercase();
                let mmv = function("mmv", &format!("mmv_{suffix}")).ok()?;
                let get_rows = function("mmv", &format!("get_rows_{suffix}")).ok()?;
                let dequantize_f16 = function("gemm", &format!("dequantize_f16_{suffix}")).ok();
                let mmv1 = function("mmv", &format!("mmv1_{suffix}")).ok();
                let mmv1p = function("mmv", &format!("mmv1p_{suffix}")).ok();
                let mmv1_mixed = GgmlType::ALL
                    .iter()
                    .filter_map(|&third| {
                        let name = format!("mmv1m_{suffix}_{}", third.name().to_lowercase());
                        Some((third, function("mmv", &name).ok()?))
                    })
                    .collect();
                let mmv4 = function("mmv", &format!("mmv4_{suffix}")).ok();
                let split = every(
                    ["mmvs", "mmv1s", "mmv4s"]
                        .map(|instance| function("mmv", &format!("{instance}_{suffix}")).ok()),
                );
                let mmq = every(
                    MMQ_TILE_ROWS.map(|rows| function("mmq", &format!("mmq{rows}_{suffix}")).ok()),
                );
                // The instances for one precision, whose names end in `precision`.
                let streamed = |precision: &str| {
                    let mmt = |name: String| function("mmt", &format!("{name}{precision}")).ok();
                    every(
                        ["mmt", "mmt_wide", "mmt_row", "mmt_pair", "mmt_ranges"]
                            .map(|instance| mmt(format!("{instance}_{suffix}"))),
                    )
                    .map(|[tiles, wide_tiles, row, pair, ranges]| Streamed {
                        tiles,
                        wide_tiles,
                        row,
                        pair,
                        ranges,
                        mixed: GgmlType::ALL
                            .iter()
                            .filter_map(|&third| {
                                let pair = format!("{suffix}_{}", third.name().to_lowercase());
                                let [tiles, wide_tiles, ranges] = every(
                                    ["mmt_mixed", "mmt_wide_mixed", "mmt_ranges_mixed"]
                                        .map(|instance| mmt(format!("{instance}_{pair}"))),
                                )?;
                                Some((
                                    third,
                                    StreamedMixed {
                                        tiles,
                                        wide_tiles,
                                        ranges,
                                    },
                                ))
                            })
                            .collect(),
                    })
                };
                let (mmt, mmt_single) = (streamed(""), streamed(SINGLE_SUFFIX));
                Some((
                    ty,
                    Arc::new(FormatKernels {
                        ty,
                        mmv,
                        mmv1,
                        mmv1p,
                        mmv1_mixed,
                        mmv4,
                        split,
                        mmq,
                        mmt,
                        mmt_single,
                        get_rows,
                        dequantize_f16,
                    }),
                ))
            })
            .collect();
        Ok(Self {
            formats,
            rms_norm: function("norm", "rms_norm")?,
            rms_norm_heads: function("norm", "rms_norm_heads")?,
            rope: function("rope", "rope")?,
            rope_store_kv: function("rope", "rope_store_kv")?,
            store_kv: function("attention", "store_kv")?,
            attention: PerHeadDim::load("attention", HEAD_DIMS, &function)?,
            grouped_attention: GroupedAttention::load(&function)?,
            silu_mul: function("elementwise", "silu_mul")?,
            add: function("elementwise", "add")?,
            gather_rows: function("elementwise", "gather_rows")?,
            argmax_rows: function("argmax", "argmax_rows")?,
            sample_rows: function("sample", "sample_rows")?,
            quantize_q8: function("quantize", "quantize_q8")?,
            prompt_gemm: function("gemm", "activations_to_f16")
                .ok()
                .zip(every(GEMM_TILES.map(|(rows, weight_rows)| {
                    function("gemm", &format!("gemm_f16_{rows}x{weight_rows}")).ok()
                })))
                .map(|(to_f16, tiles)| PromptGemm { to_f16, tiles }),
            prompt_attention: PerHeadDim::load(
                "prompt_attention",
                PROMPT_ATTENTION_HEAD_DIMS,
                &function,
            )
            .ok(),
        })
    }

    /// Every tensor-core matmul kernel, with its name.
    pub(crate) fn mmqs(&self) -> impl Iterator<Item = (String, &F)> {
        self.formats.values().flat_map(|f| {
            f.mmq.iter().flat_map(move |kernels| {
                MMQ_TILE_ROWS
                    .iter()
                    .zip(kernels)
                    .map(move |(rows, kernel)| {
                        (format!("mmq{rows}_{}", f.ty.name().to_lowercase()), kernel)
                    })
            })
        })
    }

    /// Every format's streamed matmul kernels, with the format's name (and the precision's
    /// suffix, as the kernels' names have it).
    pub(crate) fn mmts(&self) -> impl Iterator<Item = (String, &Streamed<F>)> {
        self.formats.values().flat_map(|f| {
            let name = f.ty.name().to_lowercase();
            let single = format!("{name}{SINGLE_SUFFIX}");
            f.mmt
                .iter()
                .map(move |kernels| (name.clone(), kernels))
                .chain(
                    f.mmt_single
                        .iter()
                        .map(move |kernels| (single.clone(), kernels)),
                )
        })
    }

    /// Every matvec kernel, with its name and whether it splits rows between warps.
    pub(crate) fn matvecs(&self) -> impl Iterator<Item = (String, bool, &F)> {
        self.formats.values().flat_map(|f| {
            let name = f.ty.name().to_lowercase();
            let split = f.split.as_ref();
            [
                ("mmv", false, Some(&f.mmv)),
                ("mmv1", false, f.mmv1.as_ref()),
                ("mmv1p", false, f.mmv1p.as_ref()),
                ("mmv4", false, f.mmv4.as_ref()),
                ("mmvs", true, split.map(|s| &s[0])),
                ("mmv1s", true, split.map(|s| &s[1])),
                ("mmv4s", true, split.map(|s| &s[2])),
            ]
            .into_iter()
            .filter_map(move |(instance, split, kernel)| {
                Some((format!("{instance}_{name}"), split, kernel?))
            })
            .chain(f.mmv1_mixed.iter().map(move |(third, kernel)| {
                let third = third.name().to_lowercase();
                (
                    format!("mmv1m_{}_{third}", f.ty.name().to_lowercase()),
                    false,
                    kernel,
                )
            }))
        })
    }

    /// The kernels of storage type `ty`, if the images have them.
    pub(crate) fn format(&self, ty: GgmlType) -> Option<Arc<FormatKernels<F>>> {
        self.formats.get(&ty).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_is_every_instance_or_none() {
        assert_eq!(every([Some(8), Some(16)]), Some([8, 16]));
        assert_eq!(every([Some(8), None, Some(32)]), None);
    }
}
