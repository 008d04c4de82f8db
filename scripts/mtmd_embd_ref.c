// The image (and audio) embeddings of the reference build's libmtmd (llama.cpp b1-0c1e570) for tests: each
// image file is tokenized with the default media marker (mtmd_tokenize, add_special and
// parse_special as llama-server) and its image chunk encoded (mtmd_encode_chunk), with
// llama-server's mtmd parameters (flash attention auto, n_threads 2, the given token bounds).
// Built and run by scripts/record_vision_reference.py.
//   mtmd_embd_ref MODEL MMPROJ MIN_TOKENS MAX_TOKENS OUT IMAGE...
// OUT receives per image: int32 n_text_before, the text tokens before the image chunk, int32 nx,
// int32 ny, int32 n_tokens, int32 n_pos, int32 n_embd, then n_tokens * n_embd float32, then int32
// n_text_after and those tokens (a file with several media chunks: use short audio clips, one chunk).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"
#include "mtmd.h"
#include "mtmd-helper.h"

static void quiet(enum ggml_log_level level, const char * text, void * ud) { (void) level; (void) text; (void) ud; }

static void put_i32(FILE * f, int v) { fwrite(&v, sizeof(int), 1, f); }

int main(int argc, char ** argv) {
    if (argc < 7) { fprintf(stderr, "usage: %s MODEL MMPROJ MIN_TOKENS MAX_TOKENS OUT IMAGE...\n", argv[0]); return 2; }
    llama_log_set(quiet, NULL);
    mtmd_helper_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) { fprintf(stderr, "failed to load model\n"); return 1; }
    struct mtmd_context_params mp = mtmd_context_params_default();
    mp.use_gpu = false; mp.print_timings = false; mp.n_threads = 2;
    mp.image_min_tokens = atoi(argv[3]); mp.image_max_tokens = atoi(argv[4]);
    mtmd_context * ctx = mtmd_init_from_file(argv[2], model, mp);
    if (!ctx) { fprintf(stderr, "failed to load mmproj\n"); return 1; }
    const int n_embd = llama_model_n_embd_inp(model);
    FILE * out = fopen(argv[5], "wb");
    if (!out) { fprintf(stderr, "cannot write %s\n", argv[5]); return 1; }
    for (int a = 6; a < argc; ++a) {
        struct mtmd_helper_bitmap_wrapper bw = mtmd_helper_bitmap_init_from_file(ctx, argv[a], false, mtmd_helper_init_opt_default());
        if (!bw.bitmap) { fprintf(stderr, "cannot load %s\n", argv[a]); return 1; }
        mtmd_input_chunks * chunks = mtmd_input_chunks_init();
        const char * prompt = mtmd_default_marker();
        struct mtmd_input_text txt = { prompt, strlen(prompt), true, true };
        const mtmd_bitmap * bmps[1] = { bw.bitmap };
        if (mtmd_tokenize(ctx, chunks, &txt, bmps, 1) != 0) { fprintf(stderr, "tokenize failed\n"); return 1; }
        int seen_image = 0, text_after = 0;
        put_i32(out, 0);  // placeholder rewritten below when text comes first
        long count_at = ftell(out) - (long) sizeof(int);
        for (size_t i = 0; i < mtmd_input_chunks_size(chunks); ++i) {
            const mtmd_input_chunk * c = mtmd_input_chunks_get(chunks, i);
            if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
                size_t n = 0;
                const llama_token * t = mtmd_input_chunk_get_tokens_text(c, &n);
                if (seen_image) { put_i32(out, (int) n); text_after = 1; }
                else { long here = ftell(out); fseek(out, count_at, SEEK_SET); put_i32(out, (int) n); fseek(out, here, SEEK_SET); }
                for (size_t j = 0; j < n; ++j) put_i32(out, t[j]);
                continue;
            }
            const mtmd_image_tokens * it = mtmd_input_chunk_get_tokens_image(c);  // NULL: audio
            const int n_tok = (int) mtmd_input_chunk_get_n_tokens(c);
            put_i32(out, it ? (int) mtmd_image_tokens_get_nx(it) : n_tok);
            put_i32(out, it ? (int) mtmd_image_tokens_get_ny(it) : 1);
            put_i32(out, n_tok);
            put_i32(out, (int) mtmd_input_chunk_get_n_pos(c));
            put_i32(out, n_embd);
            if (mtmd_encode_chunk(ctx, c) != 0) { fprintf(stderr, "encode failed\n"); return 1; }
            fwrite(mtmd_get_output_embd(ctx), sizeof(float), (size_t) n_tok * n_embd, out);
            seen_image = 1;
        }
        if (!text_after) put_i32(out, 0);
        mtmd_input_chunks_free(chunks);
        mtmd_bitmap_free(bw.bitmap);
    }
    fclose(out);
    mtmd_free(ctx);
    llama_model_free(model);
    return 0;
}
