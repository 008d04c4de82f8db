/* llama.cpp's CPU flash attention for batches under 64 query rows, bit for bit (kernels/cpu/attention.py).

   llama-server b1-0c1e570 runs attention on the CPU as ggml's FLASH_ATTN_EXT (flash attention is on
   by default). A batch of fewer than 64 query rows (every decode step, short prompts) goes through
   ggml-cpu/ops.cpp `ggml_compute_forward_flash_attn_ext_f16_one_chunk`, which differs from plain
   float32 attention by more than rounding order: with a float16 cache the query is rounded to
   float16, and the weighted V sum is kept in a float16 accumulator, rounded after every key. On a
   model as sensitive as Gemma 3 that moves a logit by up to ~0.25 nats over a few dozen tokens,
   enough to turn near-tied greedy choices. This kernel makes the same operations in the same order:

     q16 = f16(q)
     for each key t in position order (the cache's cell order for one sequence):
         s = dot(K[t], q16) * scale            ggml_vec_dot_f16: 4 accumulators of VW lanes over
                                               4 * VW elements, summed by ggml's reduction tree,
                                               the D % (4 VW) tail in double
         [soft-cap: s = cap * tanhf(s), scale divided by cap first]
         if s > M: ms = expf(M - s), M = s, acc = f16(acc * ms)      (ggml_vec_scale_f16)
         else:     vs = expf(s - M)
         acc = f16(fma(V[t], vs, acc))                               (ggml_vec_mad_f16)
         S = fma(S, ms, vs)                                          (contracted, as b1's build)
     out = f32(acc) * (1 / S)

   A float32 cache takes ggml's float32 branch (no float16 rounding, ggml_vec_dot_f32's order).
   The vector width is the build's (common.h): ggml's own reduction trees for AVX-512 (16 lanes) and
   AVX2 (8 lanes), its scalar loops without SIMD; so on each machine the bits are those of a
   llama.cpp built there natively. No flush-to-zero (ggml sets none). */
#include "common.h"
#include "pool.h"

#define ARR 4  /* ggml's GGML_F32_ARR: accumulators per dot product */

static inline vf ld_row(const void *row, int i, int f16) {
    return f16 ? ldv_f16((const unsigned short *)row + i) : ldv((const float *)row + i);
}
static inline float ld_one(const void *row, int i, int f16) {
    return f16 ? (float)((const _Float16 *)row)[i] : ((const float *)row)[i];
}

/* ggml's GGML_F32x16_REDUCE / GGML_F32x8_REDUCE of x[0..3] */
static inline float reduce4(vf *x) {
    x[0] += x[2];
    x[1] += x[3];
    x[0] += x[1];
#if VW == 16
    return _mm512_reduce_add_ps((__m512)x[0]);
#elif VW == 8
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128((__m256)x[0]), _mm256_extractf128_ps((__m256)x[0], 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
#else
    return 0.0f;  /* unused: the scalar build takes ggml's plain loop */
#endif
}

/* ggml_vec_dot_f16 (f16 = 1) / ggml_vec_dot_f32 (f16 = 0) of a cache row and the query q (stored
   as the cache is: float16 or float32). */
static float dot_row(const void *k, const void *q, int D, int f16) {
#if VW >= 8
    const int np = D & ~(ARR * VW - 1);
    vf sum[ARR];
    for (int j = 0; j < ARR; ++j) sum[j] = splat(0.0f);
    for (int i = 0; i < np; i += ARR * VW)
        for (int j = 0; j < ARR; ++j)
            sum[j] = fma_v(ld_row(k, i + j * VW, f16), ld_row(q, i + j * VW, f16), sum[j]);
    double sumf = np ? (double)reduce4(sum) : 0.0;
    for (int i = np; i < D; ++i) sumf += (double)(ld_one(k, i, f16) * ld_one(q, i, f16));
    return (float)sumf;
#else
    double sumf = 0.0;
    for (int i = 0; i < D; ++i) sumf += (double)(ld_one(k, i, f16) * ld_one(q, i, f16));
    return (float)sumf;
#endif
}

static inline void st_f16(unsigned short *p, vf v) {
#if VW == 16
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph((__m512)v, 0));
#elif VW == 8
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph((__m256)v, 0));
#else
    _Float16 h[VW];
    for (int i = 0; i < VW; ++i) h[i] = (_Float16)v[i];
    memcpy(p, h, sizeof h);
#endif
}

/* acc = acc * ms (ggml_vec_scale_f16 / _f32): one rounding to the accumulator's type per element */
static void scale_acc(void *acc, int D, float ms, int f16) {
    const int nv = D / VW * VW;
    if (f16) {
        unsigned short *a = acc;
        for (int i = 0; i < nv; i += VW) st_f16(a + i, ldv_f16(a + i) * splat(ms));
        for (int i = nv; i < D; ++i) ((_Float16 *)a)[i] = (_Float16)((float)((_Float16 *)a)[i] * ms);
    } else {
        float *a = acc;
        for (int i = 0; i < nv; i += VW) stv(a + i, ldv(a + i) * splat(ms));
        for (int i = nv; i < D; ++i) a[i] *= ms;
    }
}

/* acc = fma(v, vs, acc) (ggml_vec_mad_f16 / _f32) */
static void mad_acc(void *acc, const void *v, int D, float vs, int f16) {
    const int nv = D / VW * VW;
    const vf w = splat(vs);
    if (f16) {
        unsigned short *a = acc;
        for (int i = 0; i < nv; i += VW) st_f16(a + i, fma_v(ld_row(v, i, 1), w, ldv_f16(a + i)));
        for (int i = nv; i < D; ++i)
            ((_Float16 *)a)[i] = (_Float16)__builtin_fmaf(ld_one(v, i, 1), vs, (float)((_Float16 *)a)[i]);
    } else {
        float *a = acc;
        for (int i = 0; i < nv; i += VW) stv(a + i, fma_v(ld_row(v, i, 0), w, ldv(a + i)));
        for (int i = nv; i < D; ++i) a[i] = __builtin_fmaf(ld_one(v, i, 0), vs, a[i]);
    }
}

struct fa_args {
    const float *q; const char *kc, *vc; const int *bt, *lens; float *out;
    int maxb, H, KVH, D, BS, bs_shift, f16; float scale, softcap; int window;
};

/* One (sequence, query head): item = s * H + h. */
static void fa_item(void *args, int item) {
    const struct fa_args *A = args;
    const int H = A->H, D = A->D, G = H / A->KVH, f16 = A->f16, esz = f16 ? 2 : 4;
    const int s = item / H, h = item % H, kh = h / G;
    const int L = A->lens[s];
    const int t0 = A->window > 0 && L > A->window ? L - A->window : 0;  /* sliding window */
    const int *tab = A->bt + (size_t)s * A->maxb;
    const float *q = A->q + ((size_t)s * H + h) * D;
    float *out = A->out + ((size_t)s * H + h) * D;
    const float softcap = A->softcap, scale = softcap != 0.0f ? A->scale / softcap : A->scale;
    float qs[D], acc[D];  /* the query as the cache stores it; the accumulator (float16 in its first half) */
    if (f16) {
        for (int i = 0; i < D; ++i) ((_Float16 *)qs)[i] = (_Float16)q[i];
        memset(acc, 0, D * 2);
    } else {
        memcpy(qs, q, D * sizeof(float));
        memset(acc, 0, D * sizeof(float));
    }
    float M = -INFINITY, S = 0.0f;
    for (int t = t0; t < L; ++t) {
        const size_t cell = ((size_t)tab[t >> A->bs_shift] << A->bs_shift) + (t & (A->BS - 1));
        const size_t off = (cell * A->KVH + kh) * D * esz;
        float sc = dot_row(A->kc + off, qs, D, f16) * scale;
        if (softcap != 0.0f) sc = softcap * tanhf(sc);
        float ms = 1.0f, vs = 1.0f;
        if (sc > M) {
            const float Mold = M;
            M = sc;
            ms = expf(Mold - M);
            scale_acc(acc, D, ms, f16);
        } else {
            vs = expf(sc - M);
        }
        mad_acc(acc, A->vc + off, D, vs, f16);
        S = __builtin_fmaf(S, ms, vs);
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int i = 0; i < D; ++i) out[i] = (f16 ? (float)((_Float16 *)acc)[i] : acc[i]) * inv;
}

/* q: [S, H, D] f32; k/v cache: [NB, BS, KVH, D] float16 (kv_f16 = 1) or float32, BS a power of 2;
   bt: [S, maxb] int32; lens: [S] (row s attends to positions < lens[s]); out: [S, H, D] f32.
   omp = 1: on the OpenMP team (callers between qdot's OpenMP regions), else pool.c's threads. */
void fattn_rows(const float *q, const void *kc, const void *vc, const int *bt, int maxb, const int *lens,
                float *out, int S, int H, int KVH, int D, int BS, float scale, float softcap, int kv_f16,
                int nthreads, int window, int omp) {
    int bs_shift = 0;
    while ((1 << bs_shift) < BS) ++bs_shift;
    if ((1 << bs_shift) != BS || H % KVH) return;  /* attention.py passes power-of-2 blocks only */
    struct fa_args a = {q, kc, vc, bt, lens, out, maxb, H, KVH, D, BS, bs_shift, kv_f16, scale, softcap, window};
    const int n = S * H;
    if (!omp) {
        pool_run(fa_item, &a, n, nthreads);
    } else if (nthreads <= 1 || n <= 1) {
        for (int i = 0; i < n; ++i) fa_item(&a, i);
    } else {
        #pragma omp parallel for num_threads(nthreads < n ? nthreads : n) schedule(dynamic, 1)
        for (int i = 0; i < n; ++i) fa_item(&a, i);
    }
}
