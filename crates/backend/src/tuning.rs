//! Launch shapes of the GPU kernels that a chip's host profile tunes (`[kernels]` in
//! `hosts/<chip>.toml`); the kernels read them from their launch, so one build serves every
//! value.

use crate::Error;

/// How the GPU kernels are launched on one chip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuTuning {
    /// Weight rows per block of the matrix-vector kernels, one warp (wave) each.
    pub matvec_warps: u32,
    /// Parts of attention's work on a (token, query head), each a warp's (wave's) in its block:
    /// they split the positions between them. Changing it changes the order in which a head's
    /// partial sums are merged, so logits move within rounding. A batch whose sequences are
    /// all shorter than this many tiles of 32 positions runs fewer warps per block, each taking
    /// parts in turn, with the same arithmetic.
    pub attention_warps: u32,
    /// The most query heads of one KV head that a block of attention takes together, where a
    /// launch of one block per head would outnumber the SMs (batches): each K and V row is
    /// then read once for them all instead of once per head. The backend takes the largest
    /// group, up to this, that divides the model's query heads per KV head and has a kernel
    /// (2, 3 or 4 heads of 64 or 128 dimensions); 1 never groups. Every group gives a head
    /// the same bits.
    pub attention_group: u32,
    /// Up to this many activation rows, a quantized matvec runs its one-row instance once per
    /// row, reading the weights from memory once and then from cache, instead of the
    /// instances that hold several rows' sums in registers. Every instance sums a row in the
    /// same order, so this changes no bit.
    pub matvec_loop_rows: u32,
    /// From this many activation rows, a quantized matmul runs on the tensor cores where the
    /// device has them (CUDA, sm_80 and later: `kernels/cuda/mmq.cu`), before the one-row
    /// loop and the multi-row matvecs are considered. It gives each row the same bits as the
    /// matvec, so this too changes no bit.
    pub mmq_rows: u32,
    /// Every pass of a matrix whose format has one runs through the streamed tensor-core
    /// matmul (CUDA, sm_80 and later, Q4_K: `kernels/cuda/mmt.cu`), whatever its rows, instead
    /// of the matvec and `mmq_rows`. It adds a row's products in its own order, the same in a
    /// pass of any length (its one-row kernel, for passes of one or two rows, too), so logits
    /// move within rounding against the matvec, and a pass of several tokens costs little more
    /// than one.
    pub streamed_matmul: bool,
    /// Prompt tokens' rows of the layers' matmuls run through an f16 GEMM (CUDA, sm_80 and
    /// later: `kernels/cuda/gemm.cu`), each matrix dequantized into one scratch buffer just
    /// before it, the other rows through the kernels above. Each way gives a row the same bits
    /// in any pass, so a token's results depend on its role, not its batch; the prompt's rows
    /// move within rounding against the int8 kernels. Every pass with prompt rows dequantizes
    /// the layers' matrices (1.5 ms for the 1.5B on an H100), which `prompt_rows_from` keeps
    /// away from short prompts.
    pub prompt_gemm: bool,
    /// Prompt tokens' rows of attention, for heads of up to 128 dimensions, run on f16 tiles
    /// of K and V shared by 64 rows, on the tensor cores (CUDA, sm_80 and later:
    /// `kernels/cuda/prompt_attention.cu`), the other rows through `attention_warps`' kernel.
    /// As with `prompt_gemm`, a row's bits depend on its role, not its pass; it takes no
    /// memory. A 2,048-token prompt prefilled 1.66x as fast on an H100 (README, "Prompt rows'
    /// attention on the tensor cores").
    pub prompt_attention: bool,
    /// The shortest prompt whose rows take the two kernels above; a shorter prompt's rows take
    /// the kernels of generated tokens (`Backend::prompt_role`). It goes by the whole prompt,
    /// never by the pass, so a token's bits stay independent of how its prompt is cut. On an
    /// H100 (README, "Prompt rows' kernels from a prompt length") the two kernels prefilled
    /// the 1.5B's 32 and 128 tokens 2.8x and 1.3x slower than generated tokens' kernels, 192
    /// tokens 1.03x, 256, 512 and 2,048 tokens 1.3x, 2.0x and 3.7x faster.
    pub prompt_rows_from: u32,
}

impl GpuTuning {
    /// The most warps per block of any kernel: 1,024 threads. A kernel that holds many
    /// registers per thread takes fewer on a given device, which the backend checks when it
    /// loads the kernels.
    pub const MAX_WARPS: u32 = 32;
    /// The most warps per block of attention (`ATTENTION_MAX_WARPS`): its shared memory holds
    /// this many partial results.
    pub const MAX_ATTENTION_WARPS: u32 = 16;

    /// The values measured best on the lent H200 (README, "CUDA"; `tests/gpu/device-check`
    /// sweeps them), for a chip without a host profile. Sixteen attention warps decode the
    /// 1.5B target 1.9x faster than four after 1,024 positions and 1.7% slower from an empty
    /// context; four matvec warps were as fast as two or eight; looping the one-row matvec up
    /// to 16 rows decodes 2, 8 and 16 sequences 15%, 10% and 4% faster than the multi-row
    /// instances; the tensor-core matmul decodes 6 sequences as fast as that loop, 8 and 16
    /// sequences 20% and 70% faster, 2 and 4 sequences 45% and 19% slower. The streamed matmul
    /// stays off here, where the GPU tests take the matvec as their reference, and a single
    /// stream decodes 6% faster without it; the CUDA host profiles turn it on. Prompt rows'
    /// kernels stay off here too, as the GPU tests' reference, whose logits are nearest the
    /// CPU's, and take every prompt when turned on, as the tests that compare them want; the
    /// CUDA profiles turn on their attention kernel from 192 tokens. Attention takes one head
    /// a block here, as HIP (never run) gets it; the CUDA profiles group up to three, which
    /// give the same bits and ran faster on an H100 from 48 sequences. The GEMM stays off there:
    /// it ran on an H100 alone, whose f16 tensor cores run at half its int8 rate, where a
    /// GeForce card's f16 products with f32 sums run at a quarter.
    pub const DEFAULT: GpuTuning = GpuTuning {
        matvec_warps: 4,
        attention_warps: 16,
        attention_group: 1,
        matvec_loop_rows: 16,
        mmq_rows: 6,
        streamed_matmul: false,
        prompt_gemm: false,
        prompt_attention: false,
        prompt_rows_from: 1,
    };

    /// Fails when a value is out of the kernels' range.
    pub fn validate(&self) -> Result<(), Error> {
        for (name, warps, max) in [
            ("matvec_warps", self.matvec_warps, Self::MAX_WARPS),
            (
                "attention_warps",
                self.attention_warps,
                Self::MAX_ATTENTION_WARPS,
            ),
        ] {
            if !(1..=max).contains(&warps) {
                return Err(Error::Tuning(format!(
                    "{name} = {warps}: the kernels take 1 to {max} warps per block"
                )));
            }
        }
        for (name, rows, least) in [
            (
                "matvec_loop_rows",
                self.matvec_loop_rows,
                "a decode step has one row",
            ),
            ("mmq_rows", self.mmq_rows, "a decode step has one row"),
            (
                "attention_group",
                self.attention_group,
                "a block takes one head",
            ),
            (
                "prompt_rows_from",
                self.prompt_rows_from,
                "a prompt has one token",
            ),
        ] {
            if rows == 0 {
                return Err(Error::Tuning(format!("{name} = 0: {least}, at least")));
            }
        }
        Ok(())
    }
}

impl Default for GpuTuning {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_valid_and_out_of_range_values_are_named() {
        GpuTuning::default().validate().unwrap();
        let zero = GpuTuning {
            matvec_warps: 0,
            ..GpuTuning::DEFAULT
        };
        let many = GpuTuning {
            attention_warps: 17,
            ..GpuTuning::DEFAULT
        };
        assert_eq!(
            zero.validate().unwrap_err().to_string(),
            "kernel tuning: matvec_warps = 0: the kernels take 1 to 32 warps per block"
        );
        assert!(
            many.validate()
                .unwrap_err()
                .to_string()
                .starts_with("kernel tuning: attention_warps = 17")
        );
        let no_rows = GpuTuning {
            matvec_loop_rows: 0,
            ..GpuTuning::DEFAULT
        };
        assert!(
            no_rows
                .validate()
                .unwrap_err()
                .to_string()
                .starts_with("kernel tuning: matvec_loop_rows = 0")
        );
        let no_prompt = GpuTuning {
            prompt_rows_from: 0,
            ..GpuTuning::DEFAULT
        };
        assert_eq!(
            no_prompt.validate().unwrap_err().to_string(),
            "kernel tuning: prompt_rows_from = 0: a prompt has one token, at least"
        );
    }
}
