// Greedy tokens from the reference build's libllama (llama.cpp b1-0c1e570) with LoRA adapters:
// what llama-server's /completion computes with temperature 0 (prompt tokenized with
// add_special and parse_special, adapters set with llama_set_adapters_lora, argmax each step over
// the tokens that are not end-of-generation: ignore_eos).
// Built and run by scripts/record_lora_reference.py --via libllama.
//   lora_greedy_ref MODEL N_PREDICT PROMPT_FILE ADAPTER:SCALE[,ADAPTER:SCALE...] ...
// PROMPT_FILE holds one prompt per line; each ADAPTER:SCALE list after it is one case (scales
// only, e.g. "0,0" or "1,0.5", over the adapters named by the environment LORA_ADAPTERS=a0,a1).
// Prints one JSON array of token ids per (case, prompt), case-major.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"

static void quiet(enum ggml_log_level level, const char * text, void * ud) { (void) level; (void) text; (void) ud; }

int main(int argc, char ** argv) {
    if (argc < 5) { fprintf(stderr, "usage: %s MODEL N_PREDICT PROMPT_FILE SCALES...\n", argv[0]); return 2; }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "failed to load model\n"); return 1; }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    int n_predict = atoi(argv[2]);
    struct llama_adapter_lora * adapters[8];
    int n_ad = 0;
    char * names = getenv("LORA_ADAPTERS");
    if (names && *names) {
        char * s = strdup(names);
        for (char * tok = strtok(s, ","); tok && n_ad < 8; tok = strtok(NULL, ",")) {
            adapters[n_ad] = llama_adapter_lora_init(model, tok);
            if (!adapters[n_ad]) { fprintf(stderr, "failed to load adapter %s\n", tok); return 1; }
            n_ad++;
        }
    }
    char prompts[16][512];
    int n_prompts = 0;
    FILE * f = fopen(argv[3], "r");
    if (!f) { fprintf(stderr, "no prompt file\n"); return 1; }
    while (n_prompts < 16 && fgets(prompts[n_prompts], sizeof prompts[0], f)) {
        prompts[n_prompts][strcspn(prompts[n_prompts], "\n")] = 0;
        n_prompts++;
    }
    fclose(f);
    int n_vocab = llama_vocab_n_tokens(vocab);
    for (int c = 4; c < argc; c++) {
        float scales[8] = {0};
        char * s = strdup(argv[c]);
        int k = 0;
        for (char * tok = strtok(s, ","); tok && k < 8; tok = strtok(NULL, ",")) scales[k++] = (float) atof(tok);
        for (int p = 0; p < n_prompts; p++) {
            struct llama_context_params cp = llama_context_default_params();
            cp.n_ctx = 1024;
            cp.n_batch = 1024;
            struct llama_context * ctx = llama_init_from_model(model, cp);
            llama_set_adapters_lora(ctx, adapters, n_ad, scales);
            llama_token toks[1024];
            int n = llama_tokenize(vocab, prompts[p], (int) strlen(prompts[p]), toks, 1024, true, true);
            printf("[");
            struct llama_batch batch = llama_batch_get_one(toks, n);
            llama_token next;
            for (int i = 0; i < n_predict; i++) {
                if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
                const float * logits = llama_get_logits_ith(ctx, -1);
                next = -1;  // argmax over the non-EOG tokens (llama-server's ignore_eos bans them)
                for (int v = 0; v < n_vocab; v++) {
                    if (llama_vocab_is_eog(vocab, v)) continue;
                    if (next < 0 || logits[v] > logits[next]) next = v;
                }
                printf(i ? ",%d" : "%d", next);
                batch = llama_batch_get_one(&next, 1);
            }
            printf("]\n");
            llama_free(ctx);
        }
    }
    llama_model_free(model);
    return 0;
}
