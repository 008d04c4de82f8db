/* llama.cpp's CPU matmul on one weight, for scripts/bench_qdot.py --llama (A/B in one process).

   Built against a llama.cpp build tree (libggml*.so): y[M][N] = x[M][K] . W^T through
   ggml_mul_mat on the CPU backend, the weight placed in the CPU "extra" (repack) buffer type when
   llama.cpp would place it there (the loader does the same check: the buffer type supports the
   op), else in the plain CPU buffer. Activation quantization (src1 -> vec_dot_type) is inside the
   timed graph, as in llama.cpp. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

typedef struct {
    ggml_backend_t be;
    struct ggml_context *cw, *cx;
    ggml_backend_buffer_t bw, bx;
    struct ggml_tensor *w, *x, *y;
    struct ggml_cgraph *gf;
    int repacked;
} gb;

void gb_free(gb *h) {
    if (!h) return;
    if (h->bx) ggml_backend_buffer_free(h->bx);
    if (h->bw) ggml_backend_buffer_free(h->bw);
    if (h->cx) ggml_free(h->cx);
    if (h->cw) ggml_free(h->cw);
    if (h->be) ggml_backend_free(h->be);
    free(h);
}

/* wdata: N rows of GGUF blocks of `type` (K columns). Returns NULL on failure. */
gb *gb_setup(int type, int N, int K, const void *wdata, int M, int nthreads, int allow_repack) {
    gb *h = (gb *)calloc(1, sizeof(gb));
    h->be = ggml_backend_cpu_init();
    if (!h->be) { gb_free(h); return NULL; }
    ggml_backend_cpu_set_n_threads(h->be, nthreads);

    struct ggml_init_params pw = {ggml_tensor_overhead() * 4, NULL, true};
    h->cw = ggml_init(pw);
    h->w = ggml_new_tensor_2d(h->cw, (enum ggml_type)type, K, N);
    struct ggml_init_params px = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), NULL, true};
    h->cx = ggml_init(px);
    h->x = ggml_new_tensor_2d(h->cx, GGML_TYPE_F32, K, M);
    h->y = ggml_mul_mat(h->cx, h->w, h->x);

    ggml_backend_buffer_type_t buft = ggml_backend_cpu_buffer_type();
    if (allow_repack) {
        ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        ggml_backend_dev_get_extra_bufts_t get_extra =
            (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
        if (get_extra) {
            for (ggml_backend_buffer_type_t *e = get_extra(dev); e && *e; ++e) {
                /* as llama.cpp's loader: the first extra buffer type that supports this matmul */
                struct ggml_tensor *save = h->w;
                h->w->buffer = NULL;
                ggml_backend_buffer_t probe = ggml_backend_buft_alloc_buffer(*e, 0);
                h->w->buffer = probe;
                int ok = ggml_backend_dev_supports_op(dev, h->y);
                h->w->buffer = NULL;
                if (probe) ggml_backend_buffer_free(probe);
                h->w = save;
                if (ok) { buft = *e; h->repacked = 1; break; }
            }
        }
    }
    h->bw = ggml_backend_alloc_ctx_tensors_from_buft(h->cw, buft);
    if (!h->bw) { gb_free(h); return NULL; }
    ggml_backend_buffer_set_usage(h->bw, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    ggml_backend_tensor_set(h->w, wdata, 0, ggml_nbytes(h->w));  /* the repack happens here */

    h->bx = ggml_backend_alloc_ctx_tensors_from_buft(h->cx, ggml_backend_cpu_buffer_type());
    if (!h->bx) { gb_free(h); return NULL; }
    h->gf = ggml_new_graph(h->cx);
    ggml_build_forward_expand(h->gf, h->y);
    return h;
}

int gb_repacked(gb *h) { return h->repacked; }
void gb_set_x(gb *h, const float *x) { ggml_backend_tensor_set(h->x, x, 0, ggml_nbytes(h->x)); }
int gb_run(gb *h) { return (int)ggml_backend_graph_compute(h->be, h->gf); }
/* y as [M][N] float32 */
void gb_get_y(gb *h, float *y) { ggml_backend_tensor_get(h->y, y, 0, ggml_nbytes(h->y)); }
