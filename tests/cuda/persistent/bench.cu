// What a decode step's kernel boundaries cost, and what a persistent kernel would save: the
// measurement that decides whether the persistent decode kernel of issue 6 is worth writing.
//
// A step is a list of dependent stages, each reading its weight bytes (none for the norms, the
// rotation, attention at a short context and silu_mul, whose cost is the boundary itself) and
// the activations the stage before wrote, then writing its own. The list is the 1.5B's decode
// step (Qwen2.5-Coder-1.5B Q4_K_M: q, k and v in one stage, gate and up in one, down Q6_K in
// every other layer, the Q6_K output matrix) or the same stages with no weights at all (`sync`:
// the boundaries alone). Each is run:
//   graph        one kernel per stage, recorded in a CUDA graph and replayed, as the backend
//                runs a decode step without programmatic launch (LUCEBOX_CUDA_PDL=0)
//   graph+pdl    the same with programmatic dependent launch, each kernel asking L2 for its
//                weights before it waits for the one before, as the backend's matvecs do
//   persistent   one kernel for the whole step, resident on every SM, with a grid-wide barrier
//                between stages (a release add to one count, acquire loads until it is full)
//   persistent+prefetch  the same, each block asking L2 for its share of the next stage's
//                weights between arriving at the barrier and waiting at it
//   cooperative  the persistent kernel with cooperative groups' grid barrier
//   stream       every weight byte of the step in one kernel: the memory's floor
// and the median time of a step over the repetitions is printed, with the time per stage above
// the floor. The stages read 16-byte words and add them, so no load can be dropped.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o persistent-bench tests/cuda/persistent/bench.cu
//   ./persistent-bench [THREADS_PER_BLOCK [BLOCKS_PER_SM]]     (default 512 and 2)

#include "../check.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

// The activations a stage reads and writes: the 1.5B's hidden size.
constexpr int ACTIVATIONS = 1536;

struct Stage {
    size_t offset, bytes; // the stage's weights in the weight buffer
};

// What every stage kernel and the persistent kernel are given.
struct Step {
    const uint4 *weights;
    const Stage *stages;
    int count;
    float *activations; // two buffers of ACTIVATIONS, the stages write them in turn
    unsigned *sink;     // written only if a sum hits a value it never does (add_words)
};

// `sum` plus this thread's share of the 16-byte words of `bytes` at w, each word's four parts
// xored; written to the sink only if it hits a value it never does, so no load is dropped.
static __device__ __forceinline__ unsigned add_words(const Step &step, const uint4 *w,
                                                     size_t bytes, size_t thread,
                                                     size_t threads, unsigned sum) {
    for (size_t i = thread; i < bytes / 16; i += threads) {
        const uint4 v = __ldcs(w + i);
        sum += v.x ^ v.y ^ v.z ^ v.w;
    }
    if (sum == 0x9e3779b9u) {
        *step.sink = sum;
    }
    return sum;
}

// Stage s's share of one thread among `threads`, added up with the activation the stage before
// wrote (read past L1: another SM wrote it), and this thread's activation written.
static __device__ __forceinline__ void run_stage(const Step &step, int s, size_t thread,
                                                 size_t threads) {
    const Stage stage = step.stages[s];
    const uint4 *w = step.weights + stage.offset / 16;
    const float *in = step.activations + (s % 2) * ACTIVATIONS;
    float *out = step.activations + ((s + 1) % 2) * ACTIVATIONS;
    const unsigned sum = add_words(step, w, stage.bytes, thread, threads,
                                   __float_as_uint(__ldcg(in + thread % ACTIVATIONS)));
    if (thread < ACTIVATIONS) {
        __stcg(out + thread, (float)(sum & 1));
    }
}

// Asks L2 for stage s's 128-byte lines that fall to this thread.
static __device__ __forceinline__ void prefetch_stage(const Step &step, int s, size_t thread,
                                                      size_t threads) {
    const Stage stage = step.stages[s];
    const char *w = (const char *)step.weights + stage.offset;
    for (size_t line = thread; line < stage.bytes / 128; line += threads) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(w + line * 128));
    }
}

__global__ void stage_kernel(Step step, int s, int pdl_prefetch) {
    const size_t thread = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t threads = (size_t)gridDim.x * blockDim.x;
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (pdl_prefetch) {
        prefetch_stage(step, s, thread, threads);
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    run_stage(step, s, thread, threads);
}

// Blocks arrived at the persistent kernel's barriers since its launch (the host zeroes it).
__device__ unsigned g_arrived;

// The persistent kernel: every stage in turn, a grid-wide barrier between them. A block's first
// thread arrives once its block's writes are visible (a release add on one count that only
// grows, so no one resets it) and waits until every block has arrived at this stage (acquire
// loads of the count); with `prefetch_next`, the block asks L2 for its share of the next
// stage's weights in between.
__global__ void persistent_kernel(Step step, int prefetch_next) {
    const size_t thread = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t threads = (size_t)gridDim.x * blockDim.x;
    for (int s = 0; s < step.count; s++) {
        run_stage(step, s, thread, threads);
        if (s + 1 == step.count) {
            break;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(&g_arrived) : "memory");
        }
        if (prefetch_next) {
            prefetch_stage(step, s + 1, thread, threads);
        }
        if (threadIdx.x == 0) {
            const unsigned all = (unsigned)(s + 1) * gridDim.x;
            unsigned arrived = 0;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                             : "=r"(arrived)
                             : "l"(&g_arrived)
                             : "memory");
            } while (arrived < all);
        }
        __syncthreads();
    }
}

// The same with cooperative groups' grid barrier, CUDA's own.
__global__ void cooperative_kernel(Step step) {
    const size_t thread = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t threads = (size_t)gridDim.x * blockDim.x;
    for (int s = 0; s < step.count; s++) {
        run_stage(step, s, thread, threads);
        if (s + 1 < step.count) {
            cooperative_groups::this_grid().sync();
        }
    }
}

__global__ void stream_kernel(Step step, size_t bytes) {
    const size_t thread = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t threads = (size_t)gridDim.x * blockDim.x;
    add_words(step, step.weights, bytes, thread, threads, 0);
}

// The 1.5B's decode step (with weights) or its boundaries alone.
static std::vector<size_t> stage_bytes(bool weights) {
    const size_t q4_k = 144, q6_k = 210, cols = 1536 / 256, ffn_cols = 8960 / 256;
    std::vector<size_t> bytes;
    const auto add = [&](size_t b) { bytes.push_back(weights ? b : 0); };
    add(0); // the embedding row and the first norm
    for (int layer = 0; layer < 28; layer++) {
        add(2048 * cols * q4_k);                           // q, k and v
        add(0);                                            // rope_store_kv
        add(0);                                            // attention
        add(1536 * cols * q4_k);                           // o
        add(0);                                            // add_rms_norm
        add(17920 * cols * q4_k);                          // gate and up
        add(0);                                            // silu_mul
        add(1536 * ffn_cols * (layer % 2 ? q4_k : q6_k)); // down
        add(0);                                            // add_rms_norm
    }
    add(0);                         // the output norm
    add(151936 * cols * q6_k);      // the output matrix
    return bytes;
}

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 512;
    int per_sm = argc > 2 ? atoi(argv[2]) : 2;
    int device = 0, sms = 0;
    CHECK(cudaGetDevice(&device));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    int fit = 0, cooperative_fit = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, persistent_kernel, threads, 0));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&cooperative_fit, cooperative_kernel,
                                                        threads, 0));
    per_sm = std::min({per_sm, fit, cooperative_fit});
    const int blocks = sms * per_sm;
    printf("%d SMs, %d blocks of %d threads (%d per SM)\n", sms, blocks, threads, per_sm);

    const int repetitions = 50;
    for (const bool weights : {false, true}) {
        const std::vector<size_t> sizes = stage_bytes(weights);
        std::vector<Stage> stages;
        size_t total = 0;
        for (const size_t b : sizes) {
            stages.push_back({total, b});
            total += (b + 255) / 256 * 256;
        }
        Step step{};
        uint4 *weight_buffer = nullptr;
        Stage *stage_buffer = nullptr;
        CHECK(cudaMalloc(&weight_buffer, std::max<size_t>(total, 256)));
        CHECK(cudaMemset(weight_buffer, 1, std::max<size_t>(total, 256)));
        CHECK(cudaMalloc(&stage_buffer, stages.size() * sizeof(Stage)));
        CHECK(cudaMemcpy(stage_buffer, stages.data(), stages.size() * sizeof(Stage),
                         cudaMemcpyHostToDevice));
        CHECK(cudaMalloc(&step.activations, 2 * ACTIVATIONS * sizeof(float)));
        CHECK(cudaMemset(step.activations, 0, 2 * ACTIVATIONS * sizeof(float)));
        CHECK(cudaMalloc(&step.sink, sizeof(unsigned)));
        step.weights = weight_buffer;
        step.stages = stage_buffer;
        step.count = (int)stages.size();

        cudaStream_t stream;
        CHECK(cudaStreamCreate(&stream));
        cudaEvent_t start, stop;
        CHECK(cudaEventCreate(&start));
        CHECK(cudaEventCreate(&stop));
        const auto time = [&](auto &&launch) {
            std::vector<float> ms;
            for (int r = 0; r < repetitions + 3; r++) {
                CHECK(cudaEventRecord(start, stream));
                launch();
                CHECK(cudaEventRecord(stop, stream));
                CHECK(cudaEventSynchronize(stop));
                float t = 0;
                CHECK(cudaEventElapsedTime(&t, start, stop));
                if (r >= 3) {
                    ms.push_back(t * 1000.0f);
                }
            }
            CHECK(cudaGetLastError());
            return median(ms);
        };
        const auto graph_of = [&](bool pdl) {
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
            for (int s = 0; s < step.count; s++) {
                cudaLaunchConfig_t config{};
                config.gridDim = blocks;
                config.blockDim = threads;
                config.stream = stream;
                cudaLaunchAttribute attribute{};
                attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
                attribute.val.programmaticStreamSerializationAllowed = 1;
                config.attrs = &attribute;
                config.numAttrs = pdl ? 1 : 0;
                CHECK(cudaLaunchKernelEx(&config, stage_kernel, step, s, pdl ? 1 : 0));
            }
            CHECK(cudaStreamEndCapture(stream, &graph));
            CHECK(cudaGraphInstantiate(&exec, graph, 0));
            return exec;
        };
        const cudaGraphExec_t plain = graph_of(false), pdl = graph_of(true);
        const float floor = time([&] {
            stream_kernel<<<blocks, threads, 0, stream>>>(step, total);
        });
        unsigned *arrived = nullptr;
        CHECK(cudaGetSymbolAddress((void **)&arrived, g_arrived));
        const auto persistent = [&](int prefetch) {
            CHECK(cudaMemsetAsync(arrived, 0, sizeof(unsigned), stream));
            void *args[] = {&step, &prefetch};
            CHECK(cudaLaunchCooperativeKernel((void *)persistent_kernel, blocks, threads, args, 0,
                                              stream));
        };
        const auto cooperative = [&] {
            void *args[] = {&step};
            CHECK(cudaLaunchCooperativeKernel((void *)cooperative_kernel, blocks, threads, args,
                                              0, stream));
        };
        struct Row {
            const char *name;
            float us;
        };
        const Row rows[] = {
            {"graph", time([&] { CHECK(cudaGraphLaunch(plain, stream)); })},
            {"graph+pdl", time([&] { CHECK(cudaGraphLaunch(pdl, stream)); })},
            {"persistent", time([&] { persistent(0); })},
            {"persistent+prefetch", time([&] { persistent(1); })},
            {"cooperative", time(cooperative)},
            {"stream", floor},
        };
        printf("\n%s: %d stages, %.1f MB of weights (median of %d steps, us)\n",
               weights ? "1.5B decode step" : "sync (no weights)", step.count, total / 1e6,
               repetitions);
        for (const Row &row : rows) {
            printf("  %-20s %8.1f us  %6.2f us a stage above the floor", row.name, row.us,
                   (row.us - floor) / step.count);
            if (weights) {
                printf("  %6.0f steps/s  %5.0f GB/s", 1e6 / row.us, total / row.us / 1e3);
            }
            printf("\n");
        }
        CHECK(cudaGraphExecDestroy(plain));
        CHECK(cudaGraphExecDestroy(pdl));
        CHECK(cudaFree(weight_buffer));
        CHECK(cudaFree(stage_buffer));
        CHECK(cudaFree(step.activations));
        CHECK(cudaFree(step.sink));
        CHECK(cudaStreamDestroy(stream));
    }
    return 0;
}
