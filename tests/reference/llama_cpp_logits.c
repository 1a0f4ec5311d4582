// Logits at every position of one token sequence, from llama.cpp through its public C API.
//
//   llama_cpp_logits MODEL.gguf OUT.f32 TOKEN...
//
// Writes OUT.f32: little-endian float32, row-major [n_tokens, vocab]. The KV cache is float32
// and flash attention is off, so on F32 weights the only difference from the float64 reference
// is float32 arithmetic; on quantized weights llama.cpp also rounds activations to 8 bits.
// Built and run by cross_check_llama_cpp.py.
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

static bool no_progress_dots(float progress, void * user_data) {
    (void) progress;
    (void) user_data;
    return true;
}

static void quiet(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    if (level >= GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf OUT.f32 TOKEN...\n", argv[0]);
        return 2;
    }
    const int n_tokens = argc - 3;
    llama_log_set(quiet, NULL);
    llama_backend_init();

    struct llama_model_params model_params = llama_model_default_params();
    model_params.progress_callback = no_progress_dots;
    struct llama_model * model = llama_model_load_from_file(argv[1], model_params);
    if (model == NULL) {
        fprintf(stderr, "llama_cpp_logits: cannot load %s\n", argv[1]);
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    struct llama_context_params params = llama_context_default_params();
    params.n_ctx = (uint32_t) n_tokens;
    params.n_batch = (uint32_t) n_tokens;
    params.n_ubatch = (uint32_t) n_tokens;
    params.type_k = GGML_TYPE_F32;
    params.type_v = GGML_TYPE_F32;
    params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context * ctx = llama_init_from_model(model, params);
    if (ctx == NULL) {
        fprintf(stderr, "llama_cpp_logits: cannot create a context\n");
        return 1;
    }

    struct llama_batch batch = llama_batch_init(n_tokens, 0, 1);
    for (int i = 0; i < n_tokens; i++) {
        char * end = NULL;
        const long id = strtol(argv[3 + i], &end, 10);
        if (*end != '\0' || id < 0 || id >= n_vocab) {
            fprintf(stderr, "llama_cpp_logits: token %s is not an id below %d\n", argv[3 + i], n_vocab);
            return 2;
        }
        batch.token[i] = (llama_token) id;
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n_tokens;
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "llama_cpp_logits: llama_decode failed\n");
        return 1;
    }

    FILE * out = fopen(argv[2], "wb");
    if (out == NULL) {
        fprintf(stderr, "llama_cpp_logits: cannot write %s\n", argv[2]);
        return 1;
    }
    for (int i = 0; i < n_tokens; i++) {
        const float * row = llama_get_logits_ith(ctx, i);
        if (fwrite(row, sizeof(float), (size_t) n_vocab, out) != (size_t) n_vocab) {
            fprintf(stderr, "llama_cpp_logits: short write to %s\n", argv[2]);
            return 1;
        }
    }
    fclose(out);

    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
