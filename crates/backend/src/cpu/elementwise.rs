//! Row-wise operations that are small next to the matmuls: norms, rotations, activations.

use half::f16;
use half::slice::HalfFloatSliceExt;

fn mean_square(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v * v;
        }
    }
    let sum: f32 = acc.iter().sum::<f32>() + tail.iter().map(|v| v * v).sum::<f32>();
    sum / x.len() as f32
}

pub(super) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let scale = 1.0 / (mean_square(x) + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

pub(super) fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let scale = 1.0 / (mean_square(x) + eps).sqrt();
    for (v, &w) in x.iter_mut().zip(weight) {
        *v *= scale * w;
    }
}

pub(super) fn rotate_adjacent(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    for (pair, (&c, &s)) in head.chunks_exact_mut(2).zip(cos.iter().zip(sin)) {
        let (a, b) = (pair[0], pair[1]);
        pair[0] = a * c - b * s;
        pair[1] = a * s + b * c;
    }
}

pub(super) fn rotate_neox(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    let (first, rest) = head.split_at_mut(half);
    for (((a, b), &c), &s) in first.iter_mut().zip(&mut rest[..half]).zip(cos).zip(sin) {
        let (x, y) = (*a, *b);
        *a = x * c - y * s;
        *b = x * s + y * c;
    }
}

pub(super) fn to_f16(src: &[f32], dst: &mut [f16]) {
    dst.convert_from_f32_slice(src);
}

pub(super) fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Rope, RopeStyle};

    #[test]
    fn rotations_preserve_norm_and_match_angle() {
        let rope = Rope {
            style: RopeStyle::Neox,
            rotary_dims: 4,
            freq_base: 10000.0,
            position_scale: 1.0,
        };
        let (mut cos, mut sin) = (vec![0.0; 2], vec![0.0; 2]);
        rope.tables(&[3], &mut cos, &mut sin);
        assert!((cos[0] - 3f32.cos()).abs() < 1e-6 && (sin[0] - 3f32.sin()).abs() < 1e-6);
        assert!((cos[1] - 0.03f32.cos()).abs() < 1e-6);
        let mut neox = [1.0, 0.0, 0.0, 0.0];
        rotate_neox(&mut neox, &cos, &sin);
        assert!((neox[0] - 3f32.cos()).abs() < 1e-6 && (neox[2] - 3f32.sin()).abs() < 1e-6);
        let mut adjacent = [1.0, 0.0, 0.0, 0.0];
        rotate_adjacent(&mut adjacent, &cos, &sin);
        assert!((adjacent[0] - 3f32.cos()).abs() < 1e-6 && (adjacent[1] - 3f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn rms_norm_gives_unit_rms() {
        let x: Vec<f32> = (0..37).map(|i| i as f32 - 11.0).collect();
        let mut out = vec![0.0; 37];
        rms_norm(&x, &[1.0; 37], 0.0, &mut out);
        assert!((mean_square(&out) - 1.0).abs() < 1e-5);
    }
}
