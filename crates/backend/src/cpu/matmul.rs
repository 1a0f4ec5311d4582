//! Quantized matrix multiplication: activations are quantized once per call; then each thread
//! claims a contiguous run of weight rows and multiplies them, a tile of activation rows at a
//! time, the run's weights staying in cache across the tiles.

use super::CpuMatrix;
use super::pool::{DisjointMut, ThreadPool};
use crate::Error;

/// Activation rows multiplied together against one weight row: the quant kernels unpack a weight
/// block once for up to eight activation rows (fewer on some formats and instruction sets, where
/// `dot_rows` splits the tile evenly).
const ACTIVATION_TILE: usize = 8;

/// `out[r][j] = dot(matrix row j, x row r) (+ bias[j])` for `rows` rows of `x`.
pub(super) fn matmul(
    pool: &ThreadPool,
    matrix: &CpuMatrix,
    bias: Option<&[f32]>,
    x: &[f32],
    rows: usize,
    out: &mut [f32],
    quantized: &mut Vec<u8>,
) -> Result<(), Error> {
    let weights = matrix.kernel_bytes(pool)?;
    let format = matrix.format;
    let (n, k) = (matrix.rows, matrix.cols);
    let act_bytes = format.activation_format().row_bytes(k);
    if quantized.len() < rows * act_bytes {
        quantized.resize(rows * act_bytes, 0);
    }
    let quantized = &mut quantized[..rows * act_bytes];
    {
        let dst = DisjointMut::new(quantized);
        pool.for_each(rows, 1, &|_, range| {
            for r in range {
                // SAFETY: each activation row is quantized by exactly one range.
                let row = unsafe { dst.slice(r * act_bytes..(r + 1) * act_bytes) };
                format.quantize_activation(&x[r * k..(r + 1) * k], row);
            }
        });
    }
    let quantized = &*quantized;
    let row_bytes = weights.len() / n;
    let out = DisjointMut::new(out);
    pool.for_each(
        n,
        weight_rows_per_claim(n, pool.threads()),
        &|_, weight_rows| {
            let mut dots = [0f32; MAX_CLAIM_ROWS * ACTIVATION_TILE];
            let claimed = &weights[weight_rows.start * row_bytes..weight_rows.end * row_bytes];
            let bias = bias.map(|b| &b[weight_rows.clone()]);
            for first in (0..rows).step_by(ACTIVATION_TILE) {
                let tile = ACTIVATION_TILE.min(rows - first);
                let activations = &quantized[first * act_bytes..(first + tile) * act_bytes];
                let dots = &mut dots[..weight_rows.len() * tile];
                format.dot_matrix(claimed, row_bytes, activations, dots);
                for i in 0..tile {
                    let at = (first + i) * n;
                    // SAFETY: this claim owns these output columns of every row; claims are
                    // disjoint.
                    let out = unsafe { out.slice(at + weight_rows.start..at + weight_rows.end) };
                    for (w, out) in out.iter_mut().enumerate() {
                        *out = dots[w * tile + i] + bias.map_or(0.0, |b| b[w]);
                    }
                }
            }
        },
    );
    Ok(())
}

/// How many weight rows a thread claims at a time: long contiguous runs, so that the kernels'
/// prefetching runs ahead as the weights stream from memory, while several claims per thread
/// still balance the load when a core is busy elsewhere. A run of at most 512 rows (under 1 MiB
/// for the matrices here) stays in L2 while every tile of activation rows passes over it. Short
/// runs, tried for many activation rows to keep a run in L1, lost to this: a batch of 16
/// decoding sequences ran 12-40% slower on the Qwen2.5 pair, as each short run started cold.
fn weight_rows_per_claim(weight_rows: usize, threads: usize) -> usize {
    (weight_rows / (threads * 8)).clamp(16, MAX_CLAIM_ROWS)
}

/// The longest run of weight rows a thread claims.
const MAX_CLAIM_ROWS: usize = 512;
