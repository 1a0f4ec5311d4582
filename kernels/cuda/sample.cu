// Each row's next token drawn where its logits are, so that a sampled decode step copies one
// token per sequence to the host instead of a vocabulary of logits and spends no host time on
// it. The transforms are the engine's sampler's (crates/engine/src/sampling.rs), in its order:
// repetition, frequency and presence penalties, temperature, top-k, top-p, min-p; then one draw
// with the host's uniform number, walking the surviving tokens in id order as the host does.
//
// One block per row. Probabilities are kept as fixed-point integers, exp(s - max) * 2^45, so
// that every sum is exact and the same whatever the order of additions (the draw is
// reproducible from the seed), and a token whose probability relative to the most likely one is
// below 2^-45 (about 3e-14) has none. Top-k and top-p keep a prefix of the tokens ordered by
// scaled logit, then id (the host's order): the row's candidates for it (those close enough to
// the maximum to hold the prefix, found by passes that count and weigh the tokens under a few
// distances from it) are sorted in shared memory. Where they are more than SAMPLE_CANDIDATES, the row's token is SAMPLE_ON_HOST and the
// host samples it.

#include "common.cuh"

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / WARP_SIZE)
#define SAMPLE_CANDIDATES 4096
#define SAMPLE_ON_HOST 0xffffffffu
// The fixed-point unit of a probability relative to the most likely token's: 2^45, so that
// vocabularies up to 2^18 tokens sum below 2^64 (the host checks the vocabulary).
#define MASS_ONE 35184372088832.0f
// Thresholds per pass, and passes, of the search for the candidates of top-k and top-p.
#define SAMPLE_BOUNDS 8
#define SAMPLE_PASSES 5

// A row's sampling, as crates/backend/src/gpu/sample.rs lays it out.
struct SampleRow {
    unsigned row, top_k;
    // 1 / temperature; 0 picks the most likely token after the penalties.
    float inv_temperature, top_p, min_p;
    float repetition, presence, frequency;
    // The row's (token, count) pairs in the launch's penalty list.
    unsigned penalties_from, penalties_to;
    double uniform;
};

// Larger floats give larger keys; NaN gives 0, below every number.
static __device__ __forceinline__ unsigned order_key(float s) {
    if (isnan(s)) {
        return 0;
    }
    const unsigned b = __float_as_uint(s);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

static __device__ __forceinline__ float key_value(unsigned key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// exp(s - max) in units of MASS_ONE.
static __device__ __forceinline__ unsigned long long fixed_mass(float s, float max) {
    return (unsigned long long)(expf(s - max) * MASS_ONE);
}

// Scratch of the block reductions.
struct Reduce {
    unsigned long long u64[SAMPLE_WARPS];
    float f32[SAMPLE_WARPS];
    unsigned u32[SAMPLE_WARPS];
};

static __device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long v) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        v += SHFL_XOR(v, offset);
    }
    return v;
}

// The sum over the block, in every thread.
static __device__ unsigned long long block_sum(unsigned long long v, Reduce &scratch) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    v = warp_sum_u64(v);
    if (lane == 0) {
        scratch.u64[warp] = v;
    }
    __syncthreads();
    v = warp_sum_u64(lane < SAMPLE_WARPS ? scratch.u64[lane] : 0);
    __syncthreads();
    return v;
}

// The largest value over the block and the lowest index holding it (0xffffffff where every
// value is NaN), in every thread.
static __device__ void block_argmax(float &value, unsigned &index, Reduce &scratch) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const auto merge = [&](float v, unsigned i) {
        if (v > value || (v == value && i < index) || (isnan(value) && !isnan(v))) {
            value = v;
            index = i;
        }
    };
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        merge(SHFL_XOR(value, offset), SHFL_XOR(index, offset));
    }
    if (lane == 0) {
        scratch.f32[warp] = value;
        scratch.u32[warp] = index;
    }
    __syncthreads();
    value = scratch.f32[lane];
    index = scratch.u32[lane];
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        merge(SHFL_XOR(value, offset), SHFL_XOR(index, offset));
    }
    __syncthreads();
}

// The inclusive prefix sum of v over the lanes of a warp.
static __device__ __forceinline__ unsigned long long warp_inclusive_scan(unsigned long long v) {
    const int lane = threadIdx.x % WARP_SIZE;
#pragma unroll
    for (int offset = 1; offset < WARP_SIZE; offset <<= 1) {
        const unsigned long long from = SHFL_UP(v, offset);
        if (lane >= offset) {
            v += from;
        }
    }
    return v;
}

// The exclusive prefix sum of v over the threads in order, and the block's total.
static __device__ unsigned long long block_exclusive_scan(unsigned long long v,
                                                          unsigned long long &total,
                                                          Reduce &scratch) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const unsigned long long inclusive = warp_inclusive_scan(v);
    if (lane == WARP_SIZE - 1) {
        scratch.u64[warp] = inclusive;
    }
    __syncthreads();
    unsigned long long before = 0;
    total = 0;
    for (int w = 0; w < SAMPLE_WARPS; w++) {
        before += w < warp ? scratch.u64[w] : 0;
        total += scratch.u64[w];
    }
    __syncthreads();
    return before + inclusive - v;
}

// Sorts the first n (a power of two) entries of a: descending, or ascending.
static __device__ void bitonic_sort(unsigned long long *a, unsigned n, bool descending) {
    for (unsigned k = 2; k <= n; k <<= 1) {
        for (unsigned j = k >> 1; j > 0; j >>= 1) {
            for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
                const unsigned partner = i ^ j;
                if (partner > i) {
                    const bool ascending = ((i & k) == 0) != descending;
                    const unsigned long long a_i = a[i], a_p = a[partner];
                    if ((a_i > a_p) == ascending) {
                        a[i] = a_p;
                        a[partner] = a_i;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// Where a uniform number in [0, 1) falls in a total mass (> 0).
static __device__ __forceinline__ unsigned long long draw(double uniform,
                                                          unsigned long long total) {
    const unsigned long long at = (unsigned long long)(uniform * (double)total);
    return at < total ? at : total - 1;
}

static __device__ __forceinline__ unsigned power_of_two_above(unsigned n) {
    unsigned p = 1;
    while (p < n) {
        p <<= 1;
    }
    return p;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows(float *x, int cols, const SampleRow *rows, const unsigned *penalties,
                unsigned *out) {
    __shared__ unsigned long long candidates[SAMPLE_CANDIDATES];
    __shared__ Reduce scratch;
    __shared__ unsigned found, count;
    AFTER_PREVIOUS_KERNEL();
    const SampleRow r = rows[blockIdx.x];
    float *logits = x + (size_t)r.row * cols;
    const unsigned vocab = cols;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    // Each warp takes a run of ids, its lanes every 32nd, so that a warp walks its run in order.
    const unsigned run = (vocab + SAMPLE_WARPS * WARP_SIZE - 1) / (SAMPLE_WARPS * WARP_SIZE) *
                         WARP_SIZE;
    const unsigned run_from = warp * run, run_to = min(vocab, run_from + run);

    // Penalties, in place and as the host spells them (no fused multiply-adds). The pairs name
    // distinct tokens, so no two threads touch one logit.
    for (unsigned p = r.penalties_from + threadIdx.x; p < r.penalties_to; p += blockDim.x) {
        const unsigned token = penalties[2 * p], seen = penalties[2 * p + 1];
        if (token < vocab) {
            float l = logits[token];
            l = l > 0.0f ? __fdiv_rn(l, r.repetition) : __fmul_rn(l, r.repetition);
            logits[token] =
                __fsub_rn(l, __fadd_rn(__fmul_rn(r.frequency, (float)seen), r.presence));
        }
    }
    __syncthreads();

    // The largest scaled logit, the first token holding it, and how many are numbers.
    const float inv_t = r.inv_temperature;
    const bool greedy = inv_t == 0.0f;
    float max = NAN;
    unsigned best = 0xffffffffu, numbers = 0;
    for (unsigned i = run_from + lane; i < run_to; i += WARP_SIZE) {
        const float s = greedy ? logits[i] : __fmul_rn(logits[i], inv_t);
        if (!isnan(s)) {
            numbers++;
            if (isnan(max) || s > max) {
                max = s;
                best = i;
            }
        }
    }
    numbers = (unsigned)block_sum(numbers, scratch);
    block_argmax(max, best, scratch);
    if (greedy || numbers == 0 || isinf(max)) {
        // Greedy; a row of NaN or -infinity (the host's argmax gives 0); or an infinite logit,
        // which takes all the probability.
        if (threadIdx.x == 0) {
            out[blockIdx.x] = numbers == 0 || max == -INFINITY ? 0 : best;
        }
        return;
    }

    const bool top_k = r.top_k > 0 && r.top_k < numbers, top_p = r.top_p < 1.0f;
    const float min_p = r.min_p;
    const double uniform = r.uniform;
    if (!top_k && !top_p) {
        // Every number survives but those below min_p: walk the whole row.
        unsigned long long mass = 0;
        for (unsigned i = run_from + lane; i < run_to; i += WARP_SIZE) {
            const float s = __fmul_rn(logits[i], inv_t);
            const float e = expf(s - max);
            mass += !isnan(s) && e >= min_p ? (unsigned long long)(e * MASS_ONE) : 0;
        }
        mass = warp_sum_u64(mass);
        unsigned long long before;
        {
            unsigned long long total;
            before = block_exclusive_scan(lane == 0 ? mass : 0, total, scratch);
            // Each warp's lane 0 carried its warp's mass: `before` there is the warps' before it.
            before = SHFL(before, 0);
            const unsigned long long target = draw(uniform, total);
            if (target < before || target >= before + mass) {
                return;
            }
            // This warp's run holds the draw: walk it 32 tokens at a time.
            unsigned long long walked = before;
            for (unsigned base = run_from; base < run_to; base += WARP_SIZE) {
                const unsigned i = base + lane;
                unsigned long long m = 0;
                if (i < run_to) {
                    const float s = __fmul_rn(logits[i], inv_t);
                    const float e = expf(s - max);
                    m = !isnan(s) && e >= min_p ? (unsigned long long)(e * MASS_ONE) : 0;
                }
                const unsigned long long inclusive = warp_inclusive_scan(m);
                const bool here = m > 0 && target < walked + inclusive &&
                                  target >= walked + inclusive - m;
                if (here) {
                    out[blockIdx.x] = i;
                }
                walked += SHFL(inclusive, WARP_SIZE - 1);
                if (walked > target) {
                    return;
                }
            }
        }
        return;
    }

    // The candidates are the tokens less than `bound` below the maximum, for a bound whose
    // tokens hold the prefix (top-k's count, or top-p's share of the mass when alone). Each pass
    // counts, and weighs, the tokens under SAMPLE_BOUNDS thresholds: doublings from 1/2 at
    // first, then even steps between the last that did not hold and the first that did, until
    // the candidates fit.
    const bool by_mass = !top_k;
    unsigned long long mass_all = 0;
    float lo = 0.0f, bound = INFINITY;
    unsigned n = numbers;
    for (int pass = 0; pass < SAMPLE_PASSES && n > SAMPLE_CANDIDATES; pass++) {
        if (pass > 0 && isinf(bound)) {
            break;
        }
        float at[SAMPLE_BOUNDS];
        unsigned within[SAMPLE_BOUNDS];
        unsigned long long mass_within[SAMPLE_BOUNDS], mass = 0;
#pragma unroll
        for (int b = 0; b < SAMPLE_BOUNDS; b++) {
            at[b] = pass == 0 ? 0.5f * (float)(1 << b)
                              : lo + (bound - lo) * (float)(b + 1) / (float)SAMPLE_BOUNDS;
            within[b] = 0;
            mass_within[b] = 0;
        }
        for (unsigned i = run_from + lane; i < run_to; i += WARP_SIZE) {
            const float s = __fmul_rn(logits[i], inv_t);
            if (isnan(s)) {
                continue;
            }
            const float below = max - s;
            const unsigned long long m = by_mass ? fixed_mass(s, max) : 0;
            mass += m;
#pragma unroll
            for (int b = 0; b < SAMPLE_BOUNDS; b++) {
                within[b] += below < at[b];
                mass_within[b] += below < at[b] ? m : 0;
            }
        }
        if (pass == 0 && by_mass) {
            mass_all = block_sum(mass, scratch);
        }
        const double need = (double)r.top_p * (double)mass_all;
        bool held = false;
#pragma unroll
        for (int b = 0; b < SAMPLE_BOUNDS; b++) {
            const unsigned count_b = (unsigned)block_sum(within[b], scratch);
            const unsigned long long mass_b = by_mass ? block_sum(mass_within[b], scratch) : 0;
            const bool holds = by_mass ? (double)mass_b >= need : count_b >= r.top_k;
            if (!held && holds) {
                bound = at[b];
                n = count_b;
                held = true;
            } else if (!held) {
                lo = at[b];
            }
        }
        if (!held) {
            break;
        }
    }
    if (n > SAMPLE_CANDIDATES) {
        if (threadIdx.x == 0) {
            out[blockIdx.x] = SAMPLE_ON_HOST;
        }
        return;
    }

    // The candidates as (key, !id), so that a descending sort puts them in the host's order.
    if (threadIdx.x == 0) {
        count = 0;
    }
    __syncthreads();
    for (unsigned base = run_from; base < run_to; base += WARP_SIZE) {
        const unsigned i = base + lane;
        const float s = i < run_to ? __fmul_rn(logits[i], inv_t) : NAN;
        const bool in = !isnan(s) && max - s < bound;
        const unsigned ballot = BALLOT(in);
        unsigned at = 0;
        if (lane == 0 && ballot != 0) {
            at = atomicAdd(&count, (unsigned)__popc(ballot));
        }
        at = SHFL(at, 0);
        if (in) {
            candidates[at + __popc(ballot & ((1u << lane) - 1))] =
                ((unsigned long long)order_key(s) << 32) | (unsigned)~i;
        }
    }
    __syncthreads();
    // The count, not the bound's: a -infinity is a number, but never within a bound.
    n = count;
    const unsigned padded = power_of_two_above(n);
    for (unsigned i = n + threadIdx.x; i < padded; i += blockDim.x) {
        candidates[i] = 0;
    }
    __syncthreads();
    bitonic_sort(candidates, padded, true);

    // Top-k, top-p and min-p each keep a prefix of the order: each thread takes
    // SAMPLE_CANDIDATES / SAMPLE_THREADS candidates in a row.
    constexpr unsigned per_thread = SAMPLE_CANDIDATES / SAMPLE_THREADS;
    const unsigned first = threadIdx.x * per_thread;
    unsigned long long m[per_thread], own = 0;
    unsigned kept = top_k ? min(r.top_k, n) : n;
#pragma unroll
    for (unsigned j = 0; j < per_thread; j++) {
        const unsigned i = first + j;
        m[j] = i < kept ? fixed_mass(key_value((unsigned)(candidates[i] >> 32)), max) : 0;
        own += m[j];
    }
    if (top_p) {
        unsigned long long total;
        unsigned long long before = block_exclusive_scan(own, total, scratch);
        // Without top-k the prefix's share is of the whole row's mass, which the candidates
        // hold when they are every token.
        const double need =
            (double)r.top_p * (double)(top_k || isinf(bound) ? total : mass_all);
        if (threadIdx.x == 0) {
            found = kept;
        }
        __syncthreads();
#pragma unroll
        for (unsigned j = 0; j < per_thread; j++) {
            before += m[j];
            if (first + j < kept && (double)before >= need) {
                atomicMin(&found, first + j + 1);
                break;
            }
        }
        __syncthreads();
        kept = found;
        // Every thread has read it before the next step writes it.
        __syncthreads();
    }
    if (min_p > 0.0f) {
        if (threadIdx.x == 0) {
            found = kept;
        }
        __syncthreads();
#pragma unroll
        for (unsigned j = 0; j < per_thread; j++) {
            const unsigned i = first + j;
            if (i < kept && expf(key_value((unsigned)(candidates[i] >> 32)) - max) < min_p) {
                atomicMin(&found, i);
                break;
            }
        }
        __syncthreads();
        kept = found;
        // Every thread has read it before the next step writes it.
        __syncthreads();
    }

    // The survivors in id order, as (id, key), then the draw.
    const unsigned padded_kept = power_of_two_above(kept);
    for (unsigned i = threadIdx.x; i < padded_kept; i += blockDim.x) {
        const unsigned long long c = candidates[i];
        candidates[i] = i < kept ? ((unsigned long long)~(unsigned)c << 32) | (c >> 32)
                                 : ~0ull;
    }
    __syncthreads();
    bitonic_sort(candidates, padded_kept, false);
    own = 0;
#pragma unroll
    for (unsigned j = 0; j < per_thread; j++) {
        const unsigned i = first + j;
        m[j] = i < kept ? fixed_mass(key_value((unsigned)candidates[i]), max) : 0;
        own += m[j];
    }
    unsigned long long total;
    unsigned long long before = block_exclusive_scan(own, total, scratch);
    const unsigned long long target = draw(uniform, total);
#pragma unroll
    for (unsigned j = 0; j < per_thread; j++) {
        if (m[j] > 0 && target >= before && target < before + m[j]) {
            out[blockIdx.x] = (unsigned)(candidates[first + j] >> 32);
        }
        before += m[j];
    }
}
