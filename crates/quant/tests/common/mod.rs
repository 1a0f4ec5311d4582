//! Random weight rows and activations shared by the integration tests.

#![allow(dead_code)]

use lucebox_quant::GgmlType;

/// A small deterministic generator (xorshift64*), so that failures reproduce.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-scale, scale).
    pub fn symmetric(&mut self, scale: f32) -> f32 {
        (2.0 * self.unit() - 1.0) * scale
    }

    /// A finite value with a random sign and a magnitude spread over several octaves.
    pub fn sane(&mut self) -> f32 {
        let magnitude = 2f32.powf(self.symmetric(6.0) - 4.0);
        if self.next_u64() & 1 == 0 {
            magnitude
        } else {
            -magnitude
        }
    }

    pub fn fill(&mut self, bytes: &mut [u8]) {
        for byte in bytes {
            *byte = self.next_u64() as u8;
        }
    }
}

/// Byte offsets of the `f16` scales and minimums in one block of a quantized type.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Iq4Xs => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        other => panic!("no block layout for {other} in the tests"),
    }
}

/// A row of `n` elements of type `ty`: random bytes, with finite, sane `f16` scales (and for the
/// float types, finite, sane elements), so that every bit pattern of the values occurs.
pub fn random_row(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    match ty {
        GgmlType::F32 => (0..n).flat_map(|_| rng.sane().to_le_bytes()).collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| half::f16::from_f32(rng.sane()).to_le_bytes())
            .collect(),
        GgmlType::Bf16 => (0..n)
            .flat_map(|_| half::bf16::from_f32(rng.sane()).to_le_bytes())
            .collect(),
        _ => {
            let bytes = ty.bytes_for(n as u64).expect("whole blocks") as usize;
            let mut row = vec![0; bytes];
            rng.fill(&mut row);
            for block in row.chunks_exact_mut(ty.block_bytes() as usize) {
                for &offset in f16_fields(ty) {
                    // Either sign, down to subnormal f16.
                    let scale = half::f16::from_f32(rng.sane() * 0.01);
                    block[offset..offset + 2].copy_from_slice(&scale.to_le_bytes());
                }
            }
            row
        }
    }
}

/// Activations like a hidden state: mostly small, some outliers.
pub fn random_activations(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            if rng.next_u64().is_multiple_of(64) {
                rng.symmetric(20.0)
            } else {
                rng.symmetric(1.0)
            }
        })
        .collect()
}
