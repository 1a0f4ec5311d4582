// Quantized matrix times activations, for any number of activation rows (decode, verify and
// prefill alike), and the row gather that embeds tokens. Weights stay in their GGUF blocks.
//
// mmv: one block of MMV_WARPS warps per weight row, the warps taking its 256-element windows in
// turn; each lane takes 8 elements of a window, decodes them once into registers and multiplies
// them with up to MMV_TOKENS activation rows. One block per row keeps the GPU busy even for the
// small matrices of a decode step.
// The K-quants map lanes onto their own layout (one aligned 32-bit load of packed quants per
// lane, each sub-block's scale decoded once); the other formats decode 8 consecutive elements.

#include "quant.cuh"

#define MMV_WARPS 4
#define MMV_TOKENS 8

// A lane's 8 weights of the 256-element window at `base` (a multiple of 256): w[0..4] belong to
// columns first..first+4, w[4..8] to columns second..second+4.
struct LaneWeights {
    float w[8];
    int first, second;
};

// Any format: 8 consecutive elements, decoded one by one; columns past the row's end are 0.
template <typename Block>
static __device__ __forceinline__ LaneWeights lane_weights(const uint8_t *row, int base, int lane,
                                                           int cols) {
    LaneWeights lw;
    lw.first = base + 8 * lane;
    lw.second = lw.first + 4;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int j = lw.first + k;
        lw.w[k] = j < cols ? row_at<Block>(row, j) : 0.0f;
    }
    return lw;
}

// Q4_K: lane i reads qs[4i..4i+4): the low nibbles are 4 elements of sub-block 2c, the high
// nibbles the same 4 places of sub-block 2c+1 (c = i/8, the 64-element chunk).
template <>
__device__ __forceinline__ LaneWeights lane_weights<BlockQ4_K>(const uint8_t *row, int base,
                                                                int lane, int) {
    const uint8_t *b = row + (size_t)(base / 256) * BlockQ4_K::BYTES;
    const int chunk = lane / 8, l0 = 4 * (lane % 8);
    const ChunkScales s = chunk_scales_k4(b, chunk);
    const unsigned q = *(const unsigned *)(b + 16 + 4 * lane);
    LaneWeights lw;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const unsigned byte = (q >> (8 * k)) & 0xFF;
        lw.w[k] = s.d_lo * (float)(byte & 0xF) - s.min_lo;
        lw.w[4 + k] = s.d_hi * (float)(byte >> 4) - s.min_hi;
    }
    lw.first = base + 64 * chunk + l0;
    lw.second = lw.first + 32;
    return lw;
}

// Q5_K: as Q4_K, with each element's fifth bit from qh[l] (bit 2c for the low nibble, 2c+1 for
// the high one).
template <>
__device__ __forceinline__ LaneWeights lane_weights<BlockQ5_K>(const uint8_t *row, int base,
                                                                int lane, int) {
    const uint8_t *b = row + (size_t)(base / 256) * BlockQ5_K::BYTES;
    const int chunk = lane / 8, l0 = 4 * (lane % 8);
    const ChunkScales s = chunk_scales_k4(b, chunk);
    LaneWeights lw;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int q = b[48 + 4 * lane + k], h = b[16 + l0 + k];
        lw.w[k] = s.d_lo * (float)((q & 0xF) | (((h >> (2 * chunk)) & 1) << 4)) - s.min_lo;
        lw.w[4 + k] = s.d_hi * (float)((q >> 4) | (((h >> (2 * chunk + 1)) & 1) << 4)) - s.min_hi;
    }
    lw.first = base + 64 * chunk + l0;
    lw.second = lw.first + 32;
    return lw;
}

// Q6_K: lane i reads ql[4i..4i+4) (half n = i/16 of the block, quarter q = (i%16)/8): the low
// nibbles are elements 128n + 32q + l0.., the high nibbles the same places of quarter q+2; the
// two high bits come from qh[32n + l0..]. Blocks are 210 bytes, so loads are bytewise.
template <>
__device__ __forceinline__ LaneWeights lane_weights<BlockQ6_K>(const uint8_t *row, int base,
                                                                int lane, int) {
    const uint8_t *b = row + (size_t)(base / 256) * BlockQ6_K::BYTES;
    const int n = lane / 16, quarter = (lane % 16) / 8, l0 = 4 * (lane % 8);
    const float d = load_f16(b + 208);
    const float d_lo = d * (float)(int8_t)b[192 + 8 * n + l0 / 16 + 2 * quarter];
    const float d_hi = d * (float)(int8_t)b[192 + 8 * n + l0 / 16 + 2 * (quarter + 2)];
    LaneWeights lw;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int ql = b[4 * lane + k], qh = b[128 + 32 * n + l0 + k];
        lw.w[k] = d_lo * (float)(((ql & 0xF) | (((qh >> (2 * quarter)) & 3) << 4)) - 32);
        lw.w[4 + k] = d_hi * (float)(((ql >> 4) | (((qh >> (2 * (quarter + 2))) & 3) << 4)) - 32);
    }
    lw.first = base + 128 * n + 32 * quarter + l0;
    lw.second = lw.first + 64;
    return lw;
}

template <typename Block>
static __device__ void mmv(const uint8_t *w, unsigned long long row_bytes, int rows, int cols,
                           const float *x, int tokens, const float *bias, float *out) {
    __shared__ float partial[MMV_WARPS][MMV_TOKENS];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int row = blockIdx.x;
    const uint8_t *w_row = w + (size_t)row * row_bytes;
    const float b = bias ? bias[row] : 0.0f;
    for (int t0 = 0; t0 < tokens; t0 += MMV_TOKENS) {
        const int n = min(MMV_TOKENS, tokens - t0);
        float acc[MMV_TOKENS] = {0};
#pragma unroll 2
        for (int base = 256 * warp; base < cols; base += 256 * MMV_WARPS) {
            const LaneWeights lw = lane_weights<Block>(w_row, base, lane, cols);
#pragma unroll
            for (int t = 0; t < MMV_TOKENS; t++) {
                if (t < n) {
                    const float *xt = x + (size_t)(t0 + t) * cols;
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        if (lw.first + k < cols) {
                            acc[t] += lw.w[k] * xt[lw.first + k];
                        }
                        if (lw.second + k < cols) {
                            acc[t] += lw.w[4 + k] * xt[lw.second + k];
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < MMV_TOKENS; t++) {
            const float sum = warp_sum(acc[t]);
            if (lane == 0) {
                partial[warp][t] = sum;
            }
        }
        __syncthreads();
        // The warps' sums in a fixed order, so a token's result never depends on the others.
        if (threadIdx.x < n) {
            float total = 0.0f;
#pragma unroll
            for (int k = 0; k < MMV_WARPS; k++) {
                total += partial[k][threadIdx.x];
            }
            out[(size_t)(t0 + threadIdx.x) * rows + row] = total + b;
        }
        __syncthreads();
    }
}

// out[t] = table[tokens[t]]: one block of threads per token.
template <typename Block>
static __device__ void get_rows(const uint8_t *table, unsigned long long row_bytes, int cols,
                                const unsigned *tokens, float *out) {
    const int t = blockIdx.x;
    const uint8_t *row = table + (size_t)tokens[t] * row_bytes;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        out[(size_t)t * cols + j] = row_at<Block>(row, j);
    }
}

#define INSTANCES(name, Block)                                                                 \
    extern "C" __global__ void mmv_##name(const uint8_t *w, unsigned long long row_bytes,      \
                                          int rows, int cols, const float *x, int tokens,     \
                                          const float *bias, float *out) {                    \
        mmv<Block>(w, row_bytes, rows, cols, x, tokens, bias, out);                            \
    }                                                                                          \
    extern "C" __global__ void get_rows_##name(const uint8_t *table,                           \
                                               unsigned long long row_bytes, int cols,         \
                                               const unsigned *tokens, float *out) {           \
        get_rows<Block>(table, row_bytes, cols, tokens, out);                                  \
    }
FOR_EACH_FORMAT(INSTANCES)
