//! Causal grouped-query attention over the paged f16 KV cache.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::pool::{DisjointMut, ThreadPool};
use crate::{AttentionShape, KvLayout, RaggedBatch};

/// Each thread's working space: a K or V row converted to f32, then the scores of one item.
/// Sized by the caller before a loop starts, for every thread at once, so that no thread grows
/// its space later, mid-decode, when it first picks up an item.
pub(super) type Scratch = Vec<Vec<f32>>;

/// For every batch token and KV head, the query heads of that group attend over the token's
/// sequence at positions `0..=position`. Work items are (token, KV head) pairs, so each K and V
/// row is converted from f16 once per group rather than once per query head.
#[allow(clippy::too_many_arguments)]
pub(super) fn attention(
    pool: &ThreadPool,
    scratch: &mut Scratch,
    q: &[f32],
    k_cache: &[f16],
    v_cache: &[f16],
    layout: &KvLayout,
    batch: &RaggedBatch,
    shape: AttentionShape,
    out: &mut [f32],
) {
    let group = shape.heads / shape.kv_heads;
    let d = shape.head_dim;
    let row_width = shape.heads * d;
    let kv_width = shape.kv_heads * d;
    let items = batch.len() * shape.kv_heads;
    // Room for the longest sequence the cache can hold, so decoding never regrows it.
    let scratch_len = d + group * layout.blocks * layout.block_tokens;
    scratch.resize_with(pool.threads(), Vec::new);
    for space in scratch.iter_mut() {
        space.resize(space.len().max(scratch_len), 0.0);
    }
    let scratch = DisjointMut::new(scratch);
    let out = DisjointMut::new(out);
    pool.for_each(items, 1, &|thread, range| {
        // SAFETY: a thread index runs on one thread at a time, so its space is used by it alone.
        let (kv_row, scores) = unsafe { scratch.slice(thread..thread + 1) }[0].split_at_mut(d);
        for item in range {
            let (t, kv_head) = (item / shape.kv_heads, item % shape.kv_heads);
            let pos = batch.positions()[t] as usize;
            let table = batch.block_table(batch.token_seqs()[t] as usize);
            let n = pos + 1;
            let scores = &mut scores[..group * n];
            let q_heads = &q[t * row_width + kv_head * group * d..][..group * d];
            let slot_row = |p: usize| {
                let slot = table[p / layout.block_tokens] as usize * layout.block_tokens
                    + p % layout.block_tokens;
                slot * kv_width + kv_head * d
            };
            for p in 0..n {
                k_cache[slot_row(p)..][..d].convert_to_f32_slice(kv_row);
                for (g, qh) in q_heads.chunks_exact(d).enumerate() {
                    scores[g * n + p] = dot(qh, kv_row) * shape.scale;
                }
            }
            for g in 0..group {
                softmax(&mut scores[g * n..(g + 1) * n]);
            }
            // SAFETY: item (t, kv_head) owns exactly these `group * d` outputs, and items are
            // handed out to threads disjointly.
            let dst = unsafe {
                out.slice(
                    t * row_width + kv_head * group * d..t * row_width + (kv_head + 1) * group * d,
                )
            };
            dst.fill(0.0);
            for p in 0..n {
                v_cache[slot_row(p)..][..d].convert_to_f32_slice(kv_row);
                for (g, o) in dst.chunks_exact_mut(d).enumerate() {
                    axpy(scores[g * n + p], kv_row, o);
                }
            }
        }
    });
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}
