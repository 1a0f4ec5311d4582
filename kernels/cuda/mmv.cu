// Quantized matrix times activations, for any number of activation rows (decode, verify and
// prefill alike), and the row gather that embeds tokens. Weights stay in their GGUF blocks.
//
// mmv: one warp per weight row (several for a wide one: mmv_q8_split), as many rows per block
// as the host profile's matvec_warps. A row is cut into spans of 32 elements; lane i takes spans
// i, i + 32, ..., decodes each once into registers and multiplies it with up to MMV_TOKENS
// activation rows. The warp of an unsplit row needs no shared memory and no barrier, so a
// decode step's small matrices run as one wave of independent loads.
//
// The quantized formats multiply integers: the activations come quantized in groups of 32, in
// two 8-bit parts (quantize.cu), a span is two runs of 16 quants packed four to an int, and each
// run's dot product with each part is four DP4A instructions; the scales apply once per run.
// The K-quants map their spans onto their own layout (one 16-byte load of packed quants, each
// sub-block's scale decoded once). The float formats (f32, f16) multiply f32 activations.

#include "qspan.cuh"

#define MMV_TOKENS 8
// The most warps of a matvec block (1,024 threads).
#define MMV_MAX_WARPS 32

// The dot products of one run's 16 quants with 16 quantized activations, high and low part,
// from BIASED_ZERO (span_value's operands).
static __device__ __forceinline__ int2 run_dots(const int q[4], const QuantizedRow &x,
                                                unsigned start) {
    int h[4], l[4];
    load16((const uint8_t *)(x.hi + start), h);
    load16((const uint8_t *)(x.lo + start), l);
    int dot_hi = BIASED_ZERO, dot_lo = BIASED_ZERO;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        dot_hi = DP4A(q[i], h[i], dot_hi);
        dot_lo = DP4A(q[i], l[i], dot_lo);
    }
    return make_int2(dot_hi, dot_lo);
}

// The span's value with one row of quantized activations, its dot products by DP4A.
static __device__ __forceinline__ float qspan_dot(const QSpan &sp, const QuantizedRow &x) {
    const int2 lo = run_dots(sp.lo, x, sp.first), hi = run_dots(sp.hi, x, sp.second);
    return span_value(sp, {lo.x, lo.y, hi.x, hi.y}, x);
}

// The warp's sums of acc[t] for t < n, written to out[t0 + t][row] (plus the bias) by lane 0.
template <int TOKENS>
static __device__ __forceinline__ void write_sums(const float acc[TOKENS], int n, int t0,
                                                  int rows, int row, float bias, float *out) {
#pragma unroll
    for (int t = 0; t < TOKENS; t++) {
        if (t < n) {
            const float sum = warp_sum(acc[t]);
            if (threadIdx.x % WARP_SIZE == 0) {
                out[(size_t)(t0 + t) * rows + row] = sum + bias;
            }
        }
    }
}

// Adds to acc[t] (t < n) this lane's spans s = first, first + 32, ... below last of w_row, times
// activation row t0 + t. The loop is not unrolled: see mmv_q8.
template <typename Block, int TOKENS>
static __device__ __forceinline__ void dot_spans(float acc[TOKENS], const uint8_t *w_row,
                                                 int first, int last, int cols,
                                                 const QuantizedRow &x, int t0, int n) {
#pragma unroll 1
    for (int s = first; s < last; s += WARP_SIZE) {
        const QSpan sp = qspan<Block>(w_row, s);
#pragma unroll
        for (int t = 0; t < TOKENS; t++) {
            if (t < n) {
                acc[t] += qspan_dot(sp, activation_row(x, cols, t0 + t));
            }
        }
    }
}

// A lane's first TURNS spans s, s + 32, ... of a weight row (those below last), for the
// one-row instances (decode, and passes of up to matvec_loop_rows rows, which they run row by
// row): decoded before the wait for the previous kernel, so that the first turns of the span
// loop, or all of a small matrix's, wait on the activations alone, and a pass of several rows
// decodes them once. add_to adds them to acc[t] (t < n) times activation rows t0 + t, in turn,
// where the span loop would have; the loop then starts TAKEN spans later. The unsplit instance
// takes two turns (the 1.5B's rows of q, k, v and o are 48 spans: all of them), the split one
// one: two cost its down projection's launches a sixth of their resident blocks (68 registers
// against 62 at sm_90), and decode 905-910 tok/s against 893-904 on the H200. The four- and
// eight-row instances load their first span in its turn: held across the wait, it took the
// four-row Q4_K instance from 82 registers to 159.
template <typename Block, int TOKENS, int TURNS, bool LOADED = (TOKENS == 1)> struct FirstSpans {
    static constexpr int TAKEN = TURNS * WARP_SIZE;
    QSpan span[TURNS];
    bool present[TURNS];
    __device__ __forceinline__ FirstSpans(const uint8_t *w_row, int s, int last) {
#pragma unroll
        for (int i = 0; i < TURNS; i++) {
            present[i] = s + i * WARP_SIZE < last;
            if (present[i]) {
                span[i] = qspan<Block>(w_row, s + i * WARP_SIZE);
            }
        }
    }
    __device__ __forceinline__ void add_to(float acc[TOKENS], int cols, const QuantizedRow &x,
                                           int t0, int n) const {
#pragma unroll
        for (int i = 0; i < TURNS; i++) {
            if (present[i]) {
#pragma unroll
                for (int t = 0; t < TOKENS; t++) {
                    if (t < n) {
                        acc[t] += qspan_dot(span[i], activation_row(x, cols, t0 + t));
                    }
                }
            }
        }
    }
};

template <typename Block, int TOKENS, int TURNS> struct FirstSpans<Block, TOKENS, TURNS, false> {
    static constexpr int TAKEN = 0;
    __device__ __forceinline__ FirstSpans(const uint8_t *, int, int) {}
    __device__ __forceinline__ void add_to(float *, int, const QuantizedRow &, int, int) const {}
};

// Quantized weights times quantized activations, TOKENS activation rows at a time; cols is a
// multiple of 32. With PARTS = 3, one launch covers up to three matrices of the same format and
// width over the same activations (a layer's q, k and v; its gate and up), warp r taking row r
// of their rows end to end, so that each costs one launch and one wait less; an absent part has
// no rows. That pays where launches dominate, in decode and short verify steps (the one-row and
// four-row instances). The eight-row instance takes the first part only: choosing the part
// made ptxas allocate it 168 registers instead of 200 and made it 41% slower on the H200
// (prefill of 512 tokens: 812 against 1,381 tok/s), which prefill and large batches would pay.
//
// A decode step (one row) has its own instance: it needs a quarter of the registers of eight
// rows' accumulators, and the span loop is not unrolled, so that many warps fit on an SM: more
// warps, each with one span's loads in flight, beat fewer warps with two (on the H200, 435
// tok/s of 1.5B decode against 380 with the loop unrolled twice). Two to four rows (short verify
// steps, small batches) have a four-row instance for the same reason. Every instance sums each
// activation row in the same order, so a row's result does not depend on which one ran it, nor
// on the matrices launched with it.
template <typename Block, int TOKENS, int PARTS>
static __device__ void mmv_q8(MatvecPart part, const MatvecPart second, const MatvecPart third,
                              unsigned long long row_bytes, int cols, const signed char *x_hi,
                              const signed char *x_lo, const float2 *x_scales,
                              const float *x_sums, int tokens) {
    const int lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (!locate_row<PARTS>(part, second, third, row)) {
        return;
    }
    const uint8_t *w_row = part.w + (size_t)row * row_bytes;
    const int spans = cols / SPAN;
    START_NEXT_KERNEL();
    // The row's weights are on their way while the kernel before finishes, and the lane's
    // first span is decoded by then (weights are written by no kernel).
    prefetch_l2(w_row, 0, row_bytes);
    const FirstSpans<Block, TOKENS, 2> first_span(w_row, lane, spans);
    WAIT_FOR_PREVIOUS_KERNEL();
    const float b = part.bias ? part.bias[row] : 0.0f;
    const QuantizedRow x = {x_hi, x_lo, x_scales, x_sums};
    for (int t0 = 0; t0 < tokens; t0 += TOKENS) {
        const int n = min(TOKENS, tokens - t0);
        float acc[TOKENS] = {0};
        first_span.add_to(acc, cols, x, t0, n);
        dot_spans<Block, TOKENS>(acc, w_row, lane + first_span.TAKEN, spans, cols, x, t0, n);
        write_sums<TOKENS>(acc, n, t0, part.rows, row, b, part.out);
    }
}

// mmv_q8 for one activation row, two weight rows per warp, for rows of 32k + 16 spans (the
// 1.5B's 1,536 columns are 48), which leave half the lanes idle in a warp's last turn: the warp
// takes the 2 * spans spans of rows 2w and 2w + 1 as one run, lane i spans i, i + 32, ..., and
// so makes three turns where two warps make four. Each row's spans still fall to the lanes of
// mmv_q8, and in its order: the second row's are those of lane i ^ 16, and the first level of
// the warp's butterfly adds lanes i and i ^ 16, so every sum is the same, operands swapped, and
// floating-point addition is commutative. The host launches it only for such rows.
template <typename Block, int PARTS>
static __device__ void mmv_q8_pairs(const MatvecPart first, const MatvecPart second,
                                    const MatvecPart third, unsigned long long row_bytes,
                                    int cols, const signed char *x_hi, const signed char *x_lo,
                                    const float2 *x_scales, const float *x_sums, int tokens) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int pair = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    MatvecPart part0 = first, part1 = first;
    int row0 = 2 * pair, row1 = 2 * pair + 1;
    if (!locate_row<PARTS>(part0, second, third, row0)) {
        return;
    }
    const bool has_row1 = locate_row<PARTS>(part1, second, third, row1);
    const uint8_t *w0 = part0.w + (size_t)row0 * row_bytes;
    const uint8_t *w1 = has_row1 ? part1.w + (size_t)row1 * row_bytes : w0;
    const unsigned spans = cols / SPAN, end = has_row1 ? 2 * spans : spans;
    // Span s of the run (row 0's spans, then row 1's), by one decode whichever the row: two
    // calls made two paths, and a turn whose lanes hold spans of both rows ran both.
    const auto span_of = [&](unsigned s) {
        const bool second_row = s >= spans;
        return qspan<Block>(second_row ? w1 : w0, second_row ? s - spans : s);
    };
    START_NEXT_KERNEL();
    // The rows' weights are on their way while the kernel before finishes, and the lane's
    // first span is decoded by then (as in mmv_q8).
    prefetch_l2(w0, 0, row_bytes);
    if (has_row1) {
        prefetch_l2(w1, 0, row_bytes);
    }
    const unsigned first_s = lane;
    const bool has_first = first_s < end;
    QSpan first_span;
    if (has_first) {
        first_span = span_of(first_s);
    }
    WAIT_FOR_PREVIOUS_KERNEL();
    const float b0 = part0.bias ? part0.bias[row0] : 0.0f;
    const float b1 = has_row1 && part1.bias ? part1.bias[row1] : 0.0f;
    for (int t = 0; t < tokens; t++) {
        const QuantizedRow x = activation_row({x_hi, x_lo, x_scales, x_sums}, cols, t);
        float acc0 = 0.0f, acc1 = 0.0f;
        if (has_first) {
            const float value = qspan_dot(first_span, x);
            if (first_s >= spans) {
                acc1 += value;
            } else {
                acc0 += value;
            }
        }
#pragma unroll 1
        for (unsigned s = first_s + WARP_SIZE; s < end; s += WARP_SIZE) {
            const float value = qspan_dot(span_of(s), x);
            if (s >= spans) {
                acc1 += value;
            } else {
                acc0 += value;
            }
        }
        const float sum0 = warp_sum(acc0), sum1 = warp_sum(acc1);
        if (lane == 0) {
            part0.out[(size_t)t * part0.rows + row0] = sum0 + b0;
            if (has_row1) {
                part1.out[(size_t)t * part1.rows + row1] = sum1 + b1;
            }
        }
    }
}

// mmv_q8 for one activation row over three matrices of which the third is in another format,
// Third: a Q4_K_M file's q and k are Q4_K, and in half its layers v is Q6_K, which took a
// launch, and a wait for the previous kernel, of its own in each of those layers of a decode
// step. A warp's row lies in one part, so each warp runs the one-row instance of its row's
// format (the third's rows are those past an empty part as long as the first two), with its
// bits. Third's rows are (cols / Third::QK) * Third::BYTES long.
template <typename Block, typename Third>
static __device__ void mmv_q8_mixed(const MatvecPart first, const MatvecPart second,
                                    const MatvecPart third, unsigned long long row_bytes,
                                    int cols, const signed char *x_hi, const signed char *x_lo,
                                    const float2 *x_scales, const float *x_sums, int tokens) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    const int before_third = first.rows + second.rows;
    const MatvecPart none = {nullptr, 0, nullptr, nullptr};
    if (row < before_third) {
        mmv_q8<Block, 1, 3>(first, second, none, row_bytes, cols, x_hi, x_lo, x_scales, x_sums,
                            tokens);
    } else {
        mmv_q8<Third, 1, 3>({nullptr, before_third, nullptr, nullptr}, third, none,
                            (unsigned long long)(cols / Third::QK) * Third::BYTES, cols, x_hi,
                            x_lo, x_scales, x_sums, tokens);
    }
}

// mmv_q8 for one matrix whose rows are wider than `split_spans` spans (the feed-forward's down
// projection: 280 spans in the 1.5B): each row is cut into pieces of that many spans, one warp
// each, so that it is not one warp's long chain of dependent loads, and the row's first warp
// adds the pieces' sums in order, plus the bias. A block holds whole rows. The host derives
// `split_spans` from the width alone, so every instance sums a row in the same order, as
// mmv_q8 does for unsplit rows.
template <typename Block, int TOKENS>
static __device__ void mmv_q8_split(const MatvecPart part, unsigned long long row_bytes, int cols,
                                    int split_spans, const signed char *x_hi,
                                    const signed char *x_lo, const float2 *x_scales,
                                    const float *x_sums, int tokens) {
    __shared__ float partials[MMV_MAX_WARPS][TOKENS];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int spans = cols / SPAN;
    const int split = (spans + split_spans - 1) / split_spans;
    const int piece = warp % split;
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE / split) + warp / split;
    // A warp past the last row still meets the block's barriers, with nothing to add.
    const bool valid = row < part.rows;
    const int first = piece * split_spans;
    const int last = valid ? min(spans, first + split_spans) : first;
    const uint8_t *w_row = part.w + (size_t)row * row_bytes;
    START_NEXT_KERNEL();
    // The warp's piece of the row is on its way while the kernel before finishes, and the
    // lane's first span is decoded by then.
    if (valid) {
        constexpr int SPANS_PER_BLOCK = Block::QK / SPAN;
        prefetch_l2(w_row, (size_t)(first / SPANS_PER_BLOCK) * Block::BYTES,
                    (size_t)((last + SPANS_PER_BLOCK - 1) / SPANS_PER_BLOCK) * Block::BYTES);
    }
    const FirstSpans<Block, TOKENS, 1> first_span(w_row, first + lane, last);
    WAIT_FOR_PREVIOUS_KERNEL();
    const float b = valid && part.bias ? part.bias[row] : 0.0f;
    const QuantizedRow x = {x_hi, x_lo, x_scales, x_sums};
    for (int t0 = 0; t0 < tokens; t0 += TOKENS) {
        const int n = min(TOKENS, tokens - t0);
        float acc[TOKENS] = {0};
        first_span.add_to(acc, cols, x, t0, n);
        dot_spans<Block, TOKENS>(acc, w_row, first + lane + first_span.TAKEN, last, cols, x, t0,
                                 n);
#pragma unroll
        for (int t = 0; t < TOKENS; t++) {
            const float sum = warp_sum(acc[t]);
            if (lane == 0) {
                partials[warp][t] = sum;
            }
        }
        __syncthreads();
        if (valid && piece == 0 && lane == 0) {
            for (int t = 0; t < n; t++) {
                float sum = partials[warp][t];
                for (int q = 1; q < split; q++) {
                    sum += partials[warp + q][t];
                }
                part.out[(size_t)(t0 + t) * part.rows + row] = sum + b;
            }
        }
        // The next tokens' sums reuse `partials`.
        __syncthreads();
    }
}

// Float weights (f32, f16) times f32 activations, element by element; columns past the row's
// end count 0.
template <typename Block>
static __device__ void mmv_f32(const uint8_t *w, unsigned long long row_bytes, int rows, int cols,
                               const float *x, int tokens, const float *bias, float *out) {
    AFTER_PREVIOUS_KERNEL();
    const int lane = threadIdx.x % WARP_SIZE;
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= rows) {
        return;
    }
    const uint8_t *w_row = w + (size_t)row * row_bytes;
    const float b = bias ? bias[row] : 0.0f;
    for (int t0 = 0; t0 < tokens; t0 += MMV_TOKENS) {
        const int n = min(MMV_TOKENS, tokens - t0);
        float acc[MMV_TOKENS] = {0};
        for (int j = lane; j < cols; j += WARP_SIZE) {
            const float weight = row_at<Block>(w_row, j);
#pragma unroll
            for (int t = 0; t < MMV_TOKENS; t++) {
                if (t < n) {
                    acc[t] += weight * x[(size_t)(t0 + t) * cols + j];
                }
            }
        }
        write_sums<MMV_TOKENS>(acc, n, t0, rows, row, b, out);
    }
}

// out[t] = table[tokens[t]]: one block of threads per token.
template <typename Block>
static __device__ void get_rows(const uint8_t *table, unsigned long long row_bytes, int cols,
                                const unsigned *tokens, float *out) {
    AFTER_PREVIOUS_KERNEL();
    const int t = blockIdx.x;
    const uint8_t *row = table + (size_t)tokens[t] * row_bytes;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        out[(size_t)t * cols + j] = row_at<Block>(row, j);
    }
}

// A quantized matvec over up to three matrices as `symbol`: the device function `...`
// (mmv_q8 or mmv_q8_pairs, with their template arguments) with the launch's parts.
#define PARTS_INSTANCE(symbol, ...)                                                            \
    extern "C" __global__ void symbol(                                                         \
        const uint8_t *w0, int rows0, const float *bias0, float *out0, const uint8_t *w1,      \
        int rows1, const float *bias1, float *out1, const uint8_t *w2, int rows2,              \
        const float *bias2, float *out2, unsigned long long row_bytes, int cols,               \
        const signed char *x_hi, const signed char *x_lo, const float2 *x_scales,              \
        const float *x_sums, int tokens) {                                                     \
        __VA_ARGS__({w0, rows0, bias0, out0}, {w1, rows1, bias1, out1},                        \
                    {w2, rows2, bias2, out2}, row_bytes, cols, x_hi, x_lo, x_scales, x_sums,   \
                    tokens);                                                                   \
    }
// The same as `symbol`, for rows split into pieces of split_spans spans.
#define SPLIT_INSTANCE(symbol, Block, TOKENS)                                                  \
    extern "C" __global__ void symbol(const uint8_t *w, int rows, const float *bias,           \
                                      float *out, unsigned long long row_bytes, int cols,      \
                                      int split_spans, const signed char *x_hi,                \
                                      const signed char *x_lo, const float2 *x_scales,         \
                                      const float *x_sums, int tokens) {                       \
        mmv_q8_split<Block, TOKENS>({w, rows, bias, out}, row_bytes, cols, split_spans, x_hi,  \
                                    x_lo, x_scales, x_sums, tokens);                           \
    }
#define QUANT_INSTANCES(name, Block)                                                           \
    PARTS_INSTANCE(mmv_##name, mmv_q8<Block, MMV_TOKENS, 1>)                                   \
    PARTS_INSTANCE(mmv1_##name, mmv_q8<Block, 1, 3>)                                           \
    PARTS_INSTANCE(mmv1p_##name, mmv_q8_pairs<Block, 3>)                                       \
    PARTS_INSTANCE(mmv4_##name, mmv_q8<Block, 4, 3>)                                           \
    SPLIT_INSTANCE(mmvs_##name, Block, MMV_TOKENS)                                             \
    SPLIT_INSTANCE(mmv1s_##name, Block, 1)                                                     \
    SPLIT_INSTANCE(mmv4s_##name, Block, 4)
#define FLOAT_INSTANCES(name, Block)                                                           \
    extern "C" __global__ void mmv_##name(const uint8_t *w, unsigned long long row_bytes,      \
                                          int rows, int cols, const float *x, int tokens,     \
                                          const float *bias, float *out) {                    \
        mmv_f32<Block>(w, row_bytes, rows, cols, x, tokens, bias, out);                        \
    }
#define GET_ROWS_INSTANCES(name, Block)                                                        \
    extern "C" __global__ void get_rows_##name(const uint8_t *table,                           \
                                               unsigned long long row_bytes, int cols,         \
                                               const unsigned *tokens, float *out) {           \
        get_rows<Block>(table, row_bytes, cols, tokens, out);                                  \
    }
FOR_EACH_QUANT_FORMAT(QUANT_INSTANCES)
// mmv1m_<format>_<third format>: the one-row matvec whose third part is in another format
// (GpuBackend::mixed_matvec), for the pairs that quantization mixes in one layer.
PARTS_INSTANCE(mmv1m_q4_k_q6_k, mmv_q8_mixed<BlockQ4_K, BlockQ6_K>)
FOR_EACH_FLOAT_FORMAT(FLOAT_INSTANCES)
FOR_EACH_FORMAT(GET_ROWS_INSTANCES)
