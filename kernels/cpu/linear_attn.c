/* The gated linear-attention layers of qwen35 / qwen35moe on the CPU, in llama.cpp b1-0c1e570's CPU
   float order (kernels/cpu/linear_attn.py; the contracts are kernels/ref_linear.py's):

   - ssm_conv_f32: ggml_compute_forward_ssm_conv_f32 (per channel, sum over the K taps from tap 0,
     each step one fused multiply-add as GCC contracts `sumf += s * c`), the sequence's last K - 1
     inputs written back into its conv-state cell (build_conv_state). SiLU is applied by the caller
     (pointwise.c's SwiGLU against ones: ggml_vec_silu_f32's bits);
   - gdn_f32: ggml_compute_forward_gated_delta_net_one_chunk (scalar gate): per token the state
     scaled by expf(g) (ggml_vec_scale_f32: one product per element), d_j = (v_j - dot(M_j, k)) *
     beta, M_j += k d_j (ggml_vec_mad_f32: one fma per element), o_j = dot(M_j, q) / sqrt(S), with
     ggml_vec_dot_f32's order for the vector width llama.cpp's build uses here (`lanes`: 8 for its
     AVX2 + FMA branch, 16 for AVX-512F: 4 accumulators of `lanes` lanes, fused multiply-adds, then
     its REDUCE macro; the elements past the last 4 * lanes one fma each);
   - gdn_gates_f32: beta = sigmoid(b) and g = softplus(a + dt_bias) * A (ggml's unary ops with libm's
     expf / logf: 1 / (1 + expf(-x)); x > 20 ? x : logf(1 + expf(x)));
   - sigmoid_f32: ggml's sigmoid of a row.
   Work is split by (sequence, value head) across the pool's threads. */
#include <math.h>
#include <string.h>

#include "pool.h"

/* ggml_vec_dot_f32 on an x86 build with `lanes`-wide vectors (8: AVX2 + FMA, 16: AVX-512F). */
static inline float dot_ggml(const float *restrict x, const float *restrict y, int n, int lanes) {
    float acc[4][16];
    memset(acc, 0, sizeof acc);
    const int step = 4 * lanes, np = n & ~(step - 1);
    for (int i = 0; i < np; i += step)
        for (int j = 0; j < 4; ++j)
            for (int l = 0; l < lanes; ++l)
                acc[j][l] = fmaf(x[i + j * lanes + l], y[i + j * lanes + l], acc[j][l]);
    for (int l = 0; l < lanes; ++l) {
        acc[0][l] += acc[2][l];
        acc[1][l] += acc[3][l];
    }
    for (int l = 0; l < lanes; ++l) acc[0][l] += acc[1][l];
    float r;
    if (lanes == 16) {  /* _mm512_reduce_add_ps: halves, quarters, then lanes (0, 2), (1, 3), then 0 + 1 */
        float t3[8], t6[4];
        for (int i = 0; i < 8; ++i) t3[i] = acc[0][i] + acc[0][i + 8];
        for (int i = 0; i < 4; ++i) t6[i] = t3[i] + t3[i + 4];
        r = (t6[0] + t6[2]) + (t6[1] + t6[3]);
    } else {  /* GGML_F32x8_REDUCE: the 128-bit halves, then two horizontal adds */
        float t0[4];
        for (int i = 0; i < 4; ++i) t0[i] = acc[0][i] + acc[0][i + 4];
        r = (t0[0] + t0[1]) + (t0[2] + t0[3]);
    }
    for (int i = np; i < n; ++i) r = fmaf(x[i], y[i], r);
    return r;
}

/* x [T, C] (row stride ldx), w [C, K], conv_state [NC, K - 1, C], cells [S], cu [S + 1];
   y [T, C]: the convolution (no SiLU). */
struct conv_job {
    const float *x; long ldx; const float *w; float *state; const long *cells; const int *cu;
    float *y; int C, K;
};

static void conv_seq(void *arg, int s) {
    const struct conv_job *j = arg;
    const int a = j->cu[s], n = j->cu[s + 1] - a, C = j->C, K = j->K;
    if (n <= 0) return;
    float *st = j->state + j->cells[s] * (long)(K - 1) * C;
    /* input row r of the sequence's window: r < K - 1 the state, else x[a + r - (K - 1)] */
    for (int t = 0; t < n; ++t) {
        float *yt = j->y + (long)(a + t) * C;
        for (int c = 0; c < C; ++c) {
            float sum = 0.0f;
            for (int i = 0; i < K; ++i) {
                const int r = t + i;
                const float in = r < K - 1 ? st[(long)r * C + c] : j->x[(long)(a + r - (K - 1)) * j->ldx + c];
                sum = fmaf(in, j->w[(long)c * K + i], sum);
            }
            yt[c] = sum;
        }
    }
    /* the last K - 1 inputs become the state (rows of the window n .. n + K - 2) */
    for (int r = 0; r < K - 1; ++r) {
        const int src = n + r;
        if (src < K - 1) memmove(st + (long)r * C, st + (long)src * C, sizeof(float) * C);
        else memcpy(st + (long)r * C, j->x + (long)(a + src - (K - 1)) * j->ldx, sizeof(float) * C);
    }
}

void ssm_conv_f32(const float *x, long ldx, const float *w, float *state, const long *cells, const int *cu, float *y,
                  int S, int C, int K, int nthreads) {
    struct conv_job j = {x, ldx, w, state, cells, cu, y, C, K};
    pool_run(conv_seq, &j, S, nthreads);
}

/* q, k [T, Hk, D], v [T, H, D], g, beta [T, H], state [NC, H, D, D] ([h][j][i] = S[i][j]); o [T, H, D]. */
struct gdn_job {
    const float *q, *k, *v, *g, *beta; float *state; const long *cells; const int *cu; float *o;
    int H, Hk, D, lanes;
};

static void gdn_item(void *arg, int item) {
    const struct gdn_job *j = arg;
    const int s = item / j->H, h = item % j->H, H = j->H, Hk = j->Hk, D = j->D;
    const int a = j->cu[s], n = j->cu[s + 1] - a;
    if (n <= 0) return;
    float *M = j->state + (j->cells[s] * (long)H + h) * D * D;
    const float scale = 1.0f / sqrtf((float)D);
    float delta[512];
    for (int t = 0; t < n; ++t) {
        const long row = a + t;
        const float *q = j->q + (row * Hk + h % Hk) * D, *k = j->k + (row * Hk + h % Hk) * D;
        const float *v = j->v + (row * H + h) * D;
        const float b = j->beta[row * H + h], e = expf(j->g[row * H + h]);
        for (long i = 0; i < (long)D * D; ++i) M[i] *= e;
        for (int r = 0; r < D; ++r) delta[r] = (v[r] - dot_ggml(M + (long)r * D, k, D, j->lanes)) * b;
        for (int r = 0; r < D; ++r) {
            float *Mr = M + (long)r * D;
            const float dr = delta[r];
            for (int i = 0; i < D; ++i) Mr[i] = fmaf(k[i], dr, Mr[i]);
        }
        float *o = j->o + (row * H + h) * D;
        for (int r = 0; r < D; ++r) o[r] = dot_ggml(M + (long)r * D, q, D, j->lanes) * scale;
    }
}

/* Returns 0, or -1 when the head size is beyond the kernel's scratch (the caller uses the reference). */
int gdn_f32(const float *q, const float *k, const float *v, const float *g, const float *beta, float *state,
            const long *cells, const int *cu, float *o, int S, int H, int Hk, int D, int lanes, int nthreads) {
    if (D > 512 || (lanes != 8 && lanes != 16)) return -1;
    struct gdn_job j = {q, k, v, g, beta, state, cells, cu, o, H, Hk, D, lanes};
    pool_run(gdn_item, &j, S * H, nthreads);
    return 0;
}

/* b, a [T, H] (row strides ldb, lda), dt_bias, A [H] -> beta, g [T, H]. */
void gdn_gates_f32(const float *b, long ldb, const float *a, long lda, const float *dt_bias, const float *A, float *beta,
                   float *g, int T, int H) {
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h) {
            const float x = b[(long)t * ldb + h];
            beta[(long)t * H + h] = 1.f / (1.f + expf(-x));
            const float z = a[(long)t * lda + h] + dt_bias[h];
            const float sp = (z > 20.0f) ? z : logf(1.0f + expf(z));
            g[(long)t * H + h] = sp * A[h];
        }
}

/* y = 1 / (1 + expf(-x)) of n floats. */
void sigmoid_f32(const float *x, float *y, long n) {
    for (long i = 0; i < n; ++i) y[i] = 1.f / (1.f + expf(-x[i]));
}
