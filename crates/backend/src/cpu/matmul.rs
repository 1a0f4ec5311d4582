//! Quantized matrix multiplication: activations are quantized once per call, then each thread
//! takes a few weight rows at a time and runs them against every activation row while they are
//! hot in L1.

use super::CpuMatrix;
use super::pool::{DisjointMut, ThreadPool};

/// `out[r][j] = dot(matrix row j, x row r) (+ bias[j])` for `rows` rows of `x`.
pub(super) fn matmul(
    pool: &ThreadPool,
    matrix: &CpuMatrix,
    bias: Option<&[f32]>,
    x: &[f32],
    rows: usize,
    out: &mut [f32],
    quantized: &mut Vec<u8>,
) {
    let format = matrix.format;
    let (n, k) = (matrix.rows, matrix.cols);
    let act_bytes = format.activation_format().row_bytes(k);
    if quantized.len() < rows * act_bytes {
        quantized.resize(rows * act_bytes, 0);
    }
    let quantized = &mut quantized[..rows * act_bytes];
    {
        let dst = DisjointMut::new(quantized);
        pool.for_each(rows, 1, &|range| {
            for r in range {
                // SAFETY: each activation row is quantized by exactly one range.
                let row = unsafe { dst.slice(r * act_bytes..(r + 1) * act_bytes) };
                format.quantize_activation(&x[r * k..(r + 1) * k], row);
            }
        });
    }
    let quantized = &*quantized;
    let weights = matrix.bytes();
    let out = DisjointMut::new(out);
    let grain = (n / (pool.threads() * 16)).clamp(4, 32);
    pool.for_each(n, grain, &|cols| {
        for r in 0..rows {
            let activation = &quantized[r * act_bytes..(r + 1) * act_bytes];
            // SAFETY: this range owns output columns `cols` of every row; ranges are disjoint.
            let dst = unsafe { out.slice(r * n + cols.start..r * n + cols.end) };
            for (j, o) in cols.clone().zip(dst) {
                *o = format.dot(matrix.row(weights, j), activation) + bias.map_or(0.0, |b| b[j]);
            }
        }
    });
}
