use std::fmt;

/// A level of instruction-set support, chosen at run time.
///
/// Each level includes the ones before it: a format without kernels written for a level uses
/// those of the level below.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Isa {
    /// Portable Rust, on every target.
    Scalar,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2,
    /// x86-64 with AVX-512 F, BW, VL and VNNI, besides everything [`Isa::Avx2`] needs.
    Avx512,
}

impl Isa {
    /// Every level, from the most portable to the most demanding.
    pub const ALL: &'static [Isa] = &[Isa::Scalar, Isa::Avx2, Isa::Avx512];

    /// The best level this CPU supports.
    pub fn detect() -> Isa {
        Isa::ALL
            .iter()
            .rev()
            .copied()
            .find(|isa| isa.is_available())
            .unwrap_or(Isa::Scalar)
    }

    /// Whether this CPU can run kernels of this level.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => has_avx2(),
            Isa::Avx512 => has_avx2() && has_avx512(),
        }
    }

    /// A short lowercase name, such as `avx2`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx2() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx512() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detected_level_is_available_and_includes_those_below() {
        let best = Isa::detect();
        assert!(best.is_available());
        for &isa in Isa::ALL {
            assert_eq!(isa.is_available(), isa <= best, "{isa}");
        }
    }
}
