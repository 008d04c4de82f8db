/* RMSNorm (with the residual add) and RoPE on float32 rows (kernels/cpu/pointwise.py): one C call
   instead of the 5-10 torch ops of the reference, which on the decode step of a small model cost
   more than the arithmetic (lesson model: ~2 ms of a ~12 ms step on one thread). */
#include <math.h>
#include <stddef.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Row-parallel: a call of at least PW_MIN_ROWS rows splits them evenly over OpenMP threads, the
   team the qdot matmuls before and after run on (its threads are still spinning then; pool.c's
   helpers, woken instead, had to share the second core with them: no gain measured); fewer rows
   (decode) stay on the caller. Rows are independent, so the bits do not depend on the split. */
#define PW_MIN_ROWS 16

typedef void (*rows_fn)(const void *job, int t0, int t1);
static void run_rows(rows_fn fn, const void *job, int T, int nthreads) {
    if (nthreads <= 1 || T < PW_MIN_ROWS) {
        fn(job, 0, T);
        return;
    }
    const int per = (T + nthreads - 1) / nthreads;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int c = 0; c < nthreads; ++c) {
        const int t0 = c * per, t1 = t0 + per < T ? t0 + per : T;
        if (t0 < t1) fn(job, t0, t1);
    }
}

/* o = (s * rsqrt(mean(s^2) + eps)) * w over C floats. The squares (float) are summed in double, in
   order, as ggml_compute_forward_rms_norm_f32. */
static inline void rms_row(const float *restrict s, const float *restrict w, float *restrict o, int C, float eps) {
    double ss = 0.0;
    for (int c = 0; c < C; ++c) ss += (double)(s[c] * s[c]);  /* as ggml: the square in float */
    const float inv = 1.0f / sqrtf((float)(ss / C) + eps);
    for (int c = 0; c < C; ++c) o[c] = (s[c] * inv) * w[c];
}

/* out[t] = rms_row(s[t]) with s = x (+ r, stored to sum when r is given); x, r, out, sum: [T, C]. */
struct norm_job { const float *x, *r, *w; float *out, *sum; int C; float eps; };
static void norm_rows(const void *job, int t0, int t1) {
    const struct norm_job *j = (const struct norm_job *)job;
    const int C = j->C;
    for (int t = t0; t < t1; ++t) {
        const float *xt = j->x + (size_t)t * C;
        const float *st = xt;
        if (j->r) {
            const float *rt = j->r + (size_t)t * C;
            float *su = j->sum + (size_t)t * C;
            for (int c = 0; c < C; ++c) su[c] = xt[c] + rt[c];
            st = su;
        }
        rms_row(st, j->w, j->out + (size_t)t * C, C, j->eps);
    }
}
void add_rms_norm_f32(const float *x, const float *r, const float *w, float *out, float *sum, int T, int C, float eps,
                      int nthreads) {
    const struct norm_job j = {x, r, w, out, sum, C, eps};
    run_rows(norm_rows, &j, T, nthreads);
}

/* The RoPE angles of one position: cs[i], sn[i] = cos, sin of the angle of pair i < R, times mscale
   (ggml's rope_yarn: cosf(theta) * mscale; YaRN's magnitude factor, 1 otherwise: exact). With
   theta_scale > 0 as ggml's rope computes them (ggml_rope_cache_init): t = (float)pos, then
   t *= theta_scale per pair (rounded each step), angle = inv_freq[0] * t (ggml's freq_scale; 1 for
   unscaled RoPE); else angle = (float)pos * inv_freq[i]. */
static inline void rope_angles(long pos, const float *restrict inv_freq, int R, float theta_scale, float mscale,
                               float *restrict cs, float *restrict sn) {
    if (theta_scale > 0.0f) {
        float t = (float)pos;
        for (int i = 0; i < R; ++i) {
            const float a = inv_freq[0] * t;
            cs[i] = cosf(a) * mscale;
            sn[i] = sinf(a) * mscale;
            t *= theta_scale;
        }
        return;
    }
    for (int i = 0; i < R; ++i) {
        const float a = (float)pos * inv_freq[i];
        cs[i] = cosf(a) * mscale;
        sn[i] = sinf(a) * mscale;
    }
}

/* One head of D floats: pairs (2i, 2i + 1) (neox = 0) or (i, i + R) (neox = 1) rotated, i < R;
   dimensions past 2R copied. x0' = fma(x0, cos, -(x1 sin)), x1' = fma(x0, sin, x1 cos). */
static inline void rope_head(const float *restrict xh, float *restrict oh, const float *restrict cs,
                             const float *restrict sn, int D, int R, int neox) {
    for (int d = 2 * R; d < D; ++d) oh[d] = xh[d];
    for (int i = 0; i < R; ++i) {
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + R : 2 * i + 1;
        const float x0 = xh[i0], x1 = xh[i1];
        /* as llama.cpp's build contracts ggml's rotate_pairs: the x0 product fused, the x1 product rounded */
        const float p1 = x1 * sn[i], p2 = x1 * cs[i];
        oh[i0] = __builtin_fmaf(x0, cs[i], -p1);
        oh[i1] = __builtin_fmaf(x0, sn[i], p2);
    }
}

/* x, out: [T, NH, D]; every head rotated by the angles of pos[t] (rope_head). */
struct rope_job { const float *x; const long *pos; const float *inv_freq; float *out; int NH, D, R, neox; float ts, ms; };
static void rope_rows(const void *job, int t0, int t1) {
    const struct rope_job *j = (const struct rope_job *)job;
    float cs[512], sn[512];
    for (int t = t0; t < t1; ++t) {
        rope_angles(j->pos[t], j->inv_freq, j->R, j->ts, j->ms, cs, sn);
        for (int h = 0; h < j->NH; ++h)
            rope_head(j->x + ((size_t)t * j->NH + h) * j->D, j->out + ((size_t)t * j->NH + h) * j->D, cs, sn, j->D,
                      j->R, j->neox);
    }
}
void rope_f32(const float *x, const long *pos, const float *inv_freq, float *out, int T, int NH, int D, int R, int neox,
              float theta_scale, float mscale, int nthreads) {
    if (R > 512) return;  /* pointwise.py checks */
    const struct rope_job j = {x, pos, inv_freq, out, NH, D, R, neox, theta_scale, mscale};
    run_rows(rope_rows, &j, T, nthreads);
}

static inline void store_row(const float *restrict x, void *restrict cache, size_t off, int W, int f16) {
    if (f16) {
        _Float16 *d = (_Float16 *)cache + off;
        for (int i = 0; i < W; ++i) d[i] = (_Float16)x[i];
    } else {
        float *d = (float *)cache + off;
        for (int i = 0; i < W; ++i) d[i] = x[i];
    }
}

/* k, v: [T, W] float32 (W = KVH * D) -> rows slot[t] of k_cache / v_cache ([NB * BS, W] float16 when
   f16, else float32); negative slots are skipped (padding). The conversion rounds to nearest even,
   as torch's .to(torch.float16). Returns -1, or the first slot >= n_slots (nothing written then). */
long write_kv_f32(const float *restrict k, const float *restrict v, void *restrict kc, void *restrict vc,
                  const long *restrict slot, int T, int W, int f16, long n_slots) {
    for (int t = 0; t < T; ++t)
        if (slot[t] >= n_slots) return slot[t];
    for (int t = 0; t < T; ++t) {
        if (slot[t] < 0) continue;
        store_row(k + (size_t)t * W, kc, (size_t)slot[t] * W, W, f16);
        store_row(v + (size_t)t * W, vc, (size_t)slot[t] * W, W, f16);
    }
    return -1;
}

/* A decode step's attention inputs from the qkv matmul's rows, in one call (decoder.py): qkv [T,
   (H + 2 KVH) D] with row stride ldq, + bias [(H + 2 KVH) D] (or NULL); q and k heads RMS-normed
   by qn / kn [D] when given (qwen3); q and k rotated at pos[t] (rope_head); q -> q_out [T, H, D],
   k and v -> rows slot[t] of the caches (as write_kv_f32). The same operations in the same order
   as the bias add, rms_norm, rope_f32 and write_kv_f32 calls it replaces. D <= 1024, R <= 512.
   Returns -1, -2 for sizes out of range, or the first slot >= n_slots (nothing written then). */
long qkv_rope_store_f32(const float *restrict qkv, long ldq, const float *restrict bias,
                        const float *restrict qn, const float *restrict kn, float eps,
                        const long *restrict pos, const float *restrict inv_freq, int R, int neox, float theta_scale,
                        float mscale, int T, int H, int KVH, int D, float *restrict q_out, void *restrict kc,
                        void *restrict vc, const long *restrict slot, int f16, long n_slots) {
    float cs[512], sn[512], a[1024], b[1024];
    if (R > 512 || D > 1024 || 2 * R > D) return -2;
    for (int t = 0; t < T; ++t)
        if (slot[t] >= n_slots) return slot[t];
    const int W = KVH * D;
    for (int t = 0; t < T; ++t) {
        const float *row = qkv + (size_t)t * ldq;
        rope_angles(pos[t], inv_freq, R, theta_scale, mscale, cs, sn);
        for (int h = 0; h < H + 2 * KVH; ++h) {
            const float *src = row + (size_t)h * D;
            if (bias) {
                for (int d = 0; d < D; ++d) a[d] = src[d] + bias[(size_t)h * D + d];
                src = a;
            }
            if (h >= H + KVH) {  /* v */
                if (slot[t] >= 0) store_row(src, vc, (size_t)slot[t] * W + (size_t)(h - H - KVH) * D, D, f16);
                continue;
            }
            const float *nw = h < H ? qn : kn;
            if (nw) {
                rms_row(src, nw, b, D, eps);
                src = b;
            }
            if (h < H) {
                rope_head(src, q_out + ((size_t)t * H + h) * D, cs, sn, D, R, neox);
            } else if (slot[t] >= 0) {
                float *o = src == a ? b : a;
                rope_head(src, o, cs, sn, D, R, neox);
                store_row(o, kc, (size_t)slot[t] * W + (size_t)(h - H) * D, D, f16);
            }
        }
    }
    return -1;
}

/* GeGLU as ggml's CPU backend computes it: y = gelu(x) * g with gelu read from ggml's float16 table
   (`table`: float32 [65536] indexed by the float16 bits of x, kernels/ref.py _gelu_f16_table), 0 at
   or below -10 and x at or above 10; the product in float32 (kernels.ref.gelu_mul, the same bits).
   x, g: [rows, n] with row strides ldx, ldg; y: [rows, n] with row stride ldy. */
struct glu_job { const float *x, *g; float *y; const float *table; long n, ldx, ldg, ldy; };
static void gelu_rows(const void *job, int t0, int t1) {
    const struct glu_job *j = (const struct glu_job *)job;
    for (int t = t0; t < t1; ++t) {
        const float *xt = j->x + t * j->ldx, *gt = j->g + t * j->ldg;
        float *yt = j->y + t * j->ldy;
        for (long i = 0; i < j->n; ++i) {
            const float v = xt[i];
            const _Float16 h = (_Float16)v;
            unsigned short bits;
            memcpy(&bits, &h, sizeof bits);
            yt[i] = (v <= -10.0f ? 0.0f : v >= 10.0f ? v : j->table[bits]) * gt[i];
        }
    }
}
void gelu_table_mul_f32(const float *x, const float *g, float *y, const float *table, long n, long ldx, long ldg,
                        long ldy, int rows, int nthreads) {
    const struct glu_job j = {x, g, y, table, n, ldx, ldg, ldy};
    run_rows(gelu_rows, &j, rows, nthreads);
}

/* SwiGLU as llama.cpp's CPU backend computes it: ggml-cpu/vec.cpp ggml_vec_swiglu_f32 with vec.h's
   ggml_v_silu / ggml_v_expf ("adapted from arm limited optimized routine"), the same intrinsics in the
   same order, in the branch of the build for this CPU: AVX-512F + DQ (swiglu_f32: vectors of 16) or
   AVX2 + FMA (swiglu_f32_avx2: vectors of 8), each compiled for its instruction set whatever this
   build's target (pointwise.py calls each only on a CPU that has it); the elements past the last full
   vector through ggml's scalar ggml_silu_f32 (libm expf). y = silu(x) * g. */
#if defined(__x86_64__)
#include "ggml_expf.h"
/* y[i] = silu(x[i]) * g[i] over a row's full vectors; returns the number of elements done. */
typedef long (*swiglu_vec_fn)(const float *x, const float *g, float *y, long n);
__attribute__((target("avx512f,avx512dq,fma")))
static long swiglu_vec_avx512(const float *x, const float *g, float *y, long n) {
    long i = 0;
    for (; i + 15 < n; i += 16) {
        const __m512 xv = _mm512_loadu_ps(x + i);
        const __m512 e = ggml_v_expf_avx512(_mm512_sub_ps(_mm512_setzero_ps(), xv));
        const __m512 s = _mm512_div_ps(xv, _mm512_add_ps(_mm512_set1_ps(1), e));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(s, _mm512_loadu_ps(g + i)));
    }
    return i;
}
__attribute__((target("avx2,fma")))
static long swiglu_vec_avx2(const float *x, const float *g, float *y, long n) {
    long i = 0;
    for (; i + 7 < n; i += 8) {
        const __m256 xv = _mm256_loadu_ps(x + i);
        const __m256 e = ggml_v_expf_avx2(_mm256_sub_ps(_mm256_setzero_ps(), xv));
        const __m256 s = _mm256_div_ps(xv, _mm256_add_ps(_mm256_set1_ps(1), e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(s, _mm256_loadu_ps(g + i)));
    }
    return i;
}
/* x, g: [rows, n] with row strides ldx, ldg; y: [rows, n] with row stride ldy. */
static void swiglu_rows_with(const struct glu_job *j, int t0, int t1, swiglu_vec_fn vec) {
    for (int t = t0; t < t1; ++t) {
        const float *xt = j->x + t * j->ldx, *gt = j->g + t * j->ldg;
        float *yt = j->y + t * j->ldy;
        for (long i = vec(xt, gt, yt, j->n); i < j->n; ++i) yt[i] = (xt[i] / (1.0f + expf(-xt[i]))) * gt[i];
    }
}
static void swiglu_rows_avx512(const void *job, int t0, int t1) { swiglu_rows_with(job, t0, t1, swiglu_vec_avx512); }
static void swiglu_rows_avx2(const void *job, int t0, int t1) { swiglu_rows_with(job, t0, t1, swiglu_vec_avx2); }
void swiglu_f32(const float *x, const float *g, float *y, long n, long ldx, long ldg, long ldy, int rows, int nthreads) {
    const struct glu_job j = {x, g, y, 0, n, ldx, ldg, ldy};
    run_rows(swiglu_rows_avx512, &j, rows, nthreads);
}
void swiglu_f32_avx2(const float *x, const float *g, float *y, long n, long ldx, long ldg, long ldy, int rows,
                     int nthreads) {
    const struct glu_job j = {x, g, y, 0, n, ldx, ldg, ldy};
    run_rows(swiglu_rows_avx2, &j, rows, nthreads);
}
#else
void swiglu_f32(const float *x, const float *g, float *y, long n, long ldx, long ldg, long ldy, int rows, int nthreads) {
    (void)x; (void)g; (void)y; (void)n; (void)ldx; (void)ldg; (void)ldy; (void)rows; (void)nthreads;  /* never called */
}
void swiglu_f32_avx2(const float *x, const float *g, float *y, long n, long ldx, long ldg, long ldy, int rows,
                     int nthreads) {
    swiglu_f32(x, g, y, n, ldx, ldg, ldy, rows, nthreads);  /* never called */
}
#endif
