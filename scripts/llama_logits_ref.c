// The logits of the reference build's libllama (llama.cpp b1-0c1e570), as llama-server computes
// them: the prompt in the given batches (llama-server's batch ends, e.g. before a sliding-window
// checkpoint), then N_DECODE greedy steps of one token (argmax of the last logits). Built and run
// by scripts/record_exact_logits.py.
//   llama_logits_ref MODEL OUT N_DECODE BATCHES TOKEN...
// BATCHES: comma-separated prompt batch sizes summing to the number of tokens. OUT receives the
// float32 logits of every step (n_vocab each): the prompt's last token, then each decode step.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"

static void quiet(enum ggml_log_level level, const char * text, void * ud) { (void) level; (void) text; (void) ud; }

int main(int argc, char ** argv) {
    if (argc < 6) { fprintf(stderr, "usage: %s MODEL OUT N_DECODE BATCHES TOKEN...\n", argv[0]); return 2; }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "failed to load model\n"); return 1; }
    const int n_decode = atoi(argv[3]);
    const int n_tok = argc - 5;
    llama_token * toks = malloc(sizeof(llama_token) * (size_t) n_tok);
    for (int i = 0; i < n_tok; ++i) toks[i] = atoi(argv[5 + i]);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 1024; cp.n_batch = 2048; cp.n_ubatch = 512;  // llama-server's defaults per slot
    cp.n_threads = 2; cp.n_threads_batch = 2;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "failed to create the context\n"); return 1; }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * out = fopen(argv[2], "wb");
    if (!out) { fprintf(stderr, "cannot write %s\n", argv[2]); return 1; }
    int at = 0;
    char * spec = strdup(argv[4]);
    for (char * tok = strtok(spec, ","); tok; tok = strtok(NULL, ",")) {
        const int n = atoi(tok);
        if (n <= 0 || at + n > n_tok) { fprintf(stderr, "bad batches %s\n", argv[4]); return 2; }
        if (llama_decode(ctx, llama_batch_get_one(toks + at, n))) { fprintf(stderr, "decode failed\n"); return 1; }
        at += n;
    }
    if (at != n_tok) { fprintf(stderr, "batches cover %d of %d tokens\n", at, n_tok); return 2; }
    for (int s = 0; s <= n_decode; ++s) {
        const float * lg = llama_get_logits_ith(ctx, -1);
        fwrite(lg, sizeof(float), (size_t) n_vocab, out);
        if (s == n_decode) break;
        llama_token best = 0;
        for (int i = 1; i < n_vocab; ++i) if (lg[i] > lg[best]) best = i;
        if (llama_decode(ctx, llama_batch_get_one(&best, 1))) { fprintf(stderr, "decode failed\n"); return 1; }
    }
    fclose(out);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
