/// Declares [`GgmlType`] from one table, so that a type's id, name and block layout are written
/// once. Block sizes are those of ggml's `block_*` structs.
macro_rules! ggml_types {
    ($($variant:ident = $id:literal, $name:literal, $block_len:literal, $block_bytes:literal;)*) => {
        /// The storage type of a tensor, as ggml numbers it.
        ///
        /// Every type ggml has defined is recognised, so that the size of any tensor in a valid
        /// file can be checked; which of them a backend can compute with is the backend's business.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        #[allow(missing_docs)]
        pub enum GgmlType {
            $($variant,)*
        }

        impl GgmlType {
            /// Every type, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant,)*];

            /// The type with ggml id `id`, if ggml defines one.
            pub fn from_id(id: u32) -> Option<Self> {
                match id {
                    $($id => Some(GgmlType::$variant),)*
                    _ => None,
                }
            }

            /// ggml's numeric id, as stored in the file.
            pub fn id(self) -> u32 {
                match self {
                    $(GgmlType::$variant => $id,)*
                }
            }

            /// ggml's name for the type, such as `Q4_K`.
            pub fn name(self) -> &'static str {
                match self {
                    $(GgmlType::$variant => $name,)*
                }
            }

            /// How many elements one block holds (1 for plain scalar types).
            pub fn block_len(self) -> u64 {
                match self {
                    $(GgmlType::$variant => $block_len,)*
                }
            }

            /// How many bytes one block takes.
            pub fn block_bytes(self) -> u64 {
                match self {
                    $(GgmlType::$variant => $block_bytes,)*
                }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 18;
    Q4_1 = 3, "Q4_1", 32, 20;
    Q5_0 = 6, "Q5_0", 32, 22;
    Q5_1 = 7, "Q5_1", 32, 24;
    Q8_0 = 8, "Q8_0", 32, 34;
    Q8_1 = 9, "Q8_1", 32, 36;
    Q2K = 10, "Q2_K", 256, 84;
    Q3K = 11, "Q3_K", 256, 110;
    Q4K = 12, "Q4_K", 256, 144;
    Q5K = 13, "Q5_K", 256, 176;
    Q6K = 14, "Q6_K", 256, 210;
    Q8K = 15, "Q8_K", 256, 292;
    Iq2Xxs = 16, "IQ2_XXS", 256, 66;
    Iq2Xs = 17, "IQ2_XS", 256, 74;
    Iq3Xxs = 18, "IQ3_XXS", 256, 98;
    Iq1S = 19, "IQ1_S", 256, 50;
    Iq4Nl = 20, "IQ4_NL", 32, 18;
    Iq3S = 21, "IQ3_S", 256, 110;
    Iq2S = 22, "IQ2_S", 256, 82;
    Iq4Xs = 23, "IQ4_XS", 256, 136;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    Iq1M = 29, "IQ1_M", 256, 56;
    Bf16 = 30, "BF16", 1, 2;
    Tq1_0 = 34, "TQ1_0", 256, 54;
    Tq2_0 = 35, "TQ2_0", 256, 66;
    Mxfp4 = 39, "MXFP4", 32, 17;
}

impl GgmlType {
    /// The bytes that `elements` elements take, or `None` when `elements` is not a whole number
    /// of blocks or the size overflows.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        if !elements.is_multiple_of(self.block_len()) {
            return None;
        }
        (elements / self.block_len()).checked_mul(self.block_bytes())
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        for &ty in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(ty.id()), Some(ty));
            assert_eq!(
                GgmlType::ALL
                    .iter()
                    .filter(|t| t.name() == ty.name())
                    .count(),
                1
            );
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(u32::MAX), None);
    }

    #[test]
    fn sizes_follow_blocks() {
        assert_eq!(GgmlType::Q4K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q8_0.bytes_for(64), Some(68));
        assert_eq!(GgmlType::Q4K.bytes_for(100), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }
}
