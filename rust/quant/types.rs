//! The tensor element types GGUF files carry, with their block geometry.
//! Numeric ids are ggml's `ggml_type` values, which GGUF stores verbatim.

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    IQ2XXS = 16,
    IQ2XS = 17,
    IQ3XXS = 18,
    IQ1S = 19,
    IQ4NL = 20,
    IQ3S = 21,
    IQ2S = 22,
    IQ4XS = 23,
    IQ1M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
}

/// Elements in one super-block of the K-quants.
pub const QK_K: usize = 256;

impl GgmlType {
    pub const ALL: [GgmlType; 27] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8K,
        GgmlType::IQ2XXS,
        GgmlType::IQ2XS,
        GgmlType::IQ3XXS,
        GgmlType::IQ1S,
        GgmlType::IQ4NL,
        GgmlType::IQ3S,
        GgmlType::IQ2S,
        GgmlType::IQ4XS,
        GgmlType::IQ1M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
    ];

    pub fn from_u32(v: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| *t as u32 == v)
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q8_1 => "Q8_1",
            GgmlType::Q2K => "Q2_K",
            GgmlType::Q3K => "Q3_K",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::Q8K => "Q8_K",
            GgmlType::IQ2XXS => "IQ2_XXS",
            GgmlType::IQ2XS => "IQ2_XS",
            GgmlType::IQ3XXS => "IQ3_XXS",
            GgmlType::IQ1S => "IQ1_S",
            GgmlType::IQ4NL => "IQ4_NL",
            GgmlType::IQ3S => "IQ3_S",
            GgmlType::IQ2S => "IQ2_S",
            GgmlType::IQ4XS => "IQ4_XS",
            GgmlType::IQ1M => "IQ1_M",
            GgmlType::BF16 => "BF16",
            GgmlType::TQ1_0 => "TQ1_0",
            GgmlType::TQ2_0 => "TQ2_0",
            GgmlType::MXFP4 => "MXFP4",
        }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => 32,
            GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::IQ4NL | GgmlType::MXFP4 => 32,
            GgmlType::IQ2XXS | GgmlType::IQ2XS | GgmlType::IQ2S | GgmlType::IQ3XXS => QK_K,
            GgmlType::IQ3S | GgmlType::IQ1S | GgmlType::IQ1M | GgmlType::IQ4XS => QK_K,
            GgmlType::TQ1_0 | GgmlType::TQ2_0 => QK_K,
            GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K => QK_K,
            GgmlType::Q6K | GgmlType::Q8K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q8_1 => 36,
            GgmlType::Q2K => 84,
            GgmlType::Q3K => 110,
            GgmlType::Q4K => 144,
            GgmlType::Q5K => 176,
            GgmlType::Q6K => 210,
            GgmlType::Q8K => 292,
            GgmlType::IQ2XXS => 66,
            GgmlType::IQ2XS => 74,
            GgmlType::IQ2S => 82,
            GgmlType::IQ3XXS => 98,
            GgmlType::IQ3S => 110,
            GgmlType::IQ1S => 50,
            GgmlType::IQ1M => 56,
            GgmlType::IQ4NL => 18,
            GgmlType::IQ4XS => 136,
            GgmlType::TQ1_0 => 54,
            GgmlType::TQ2_0 => 66,
            GgmlType::MXFP4 => 17,
        }
    }

    /// Bytes taken by `n` consecutive elements, or `None` when `n` is not a
    /// whole number of blocks or the size overflows.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        let bs = self.block_size();
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size())
    }

    /// The format activations are quantized to before a dot product with a
    /// weight row of this type (ggml's `vec_dot_type`). Float weights keep
    /// float activations so no precision is lost where none was saved.
    pub fn vec_dot_type(self) -> GgmlType {
        match self {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => GgmlType::Q8_0,
            GgmlType::IQ4NL | GgmlType::MXFP4 => GgmlType::Q8_0,
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 => GgmlType::Q8_1,
            GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K => GgmlType::Q8K,
            GgmlType::Q5K | GgmlType::Q6K | GgmlType::Q8K => GgmlType::Q8K,
            GgmlType::IQ2XXS | GgmlType::IQ2XS | GgmlType::IQ2S | GgmlType::IQ3XXS => GgmlType::Q8K,
            GgmlType::IQ3S | GgmlType::IQ1S | GgmlType::IQ1M | GgmlType::IQ4XS => GgmlType::Q8K,
            GgmlType::TQ1_0 | GgmlType::TQ2_0 => GgmlType::Q8K,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => GgmlType::F32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_u32(t as u32), Some(t));
        }
        assert_eq!(GgmlType::from_u32(4), None);
        assert_eq!(GgmlType::from_u32(31), None); // ggml's retired Q4_0_4_4
        assert_eq!(GgmlType::from_u32(u32::MAX), None);
    }

    #[test]
    fn row_bytes_rejects_partial_blocks() {
        assert_eq!(GgmlType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(GgmlType::Q4_1.row_bytes(33), None);
        assert_eq!(GgmlType::F32.row_bytes(usize::MAX / 2), None);
    }
}
