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
     [sinks (gpt-oss), per head sk: if sk > M: ms = expf(M - sk), acc32 = f32(acc) * ms, else
      vs = expf(sk - M); S = fma(S, ms, vs)  (ggml applies them after the last key, in float32)]
     out = f32(acc) * (1 / S)

   A float32 cache takes ggml's float32 branch (no float16 rounding, ggml_vec_dot_f32's order).
   The vector width is the build's (common.h): ggml's own reduction trees for AVX-512 (16 lanes) and
   AVX2 (8 lanes), its scalar loops without SIMD; so on each machine the bits are those of a
   llama.cpp built there natively. No flush-to-zero (ggml sets none). */
#include "common.h"
#include "pool.h"
#include "fattn_vec.h"

struct fa_args {
    const float *q; const char *kc, *vc; const int *bt, *lens; float *out;
    int maxb, H, KVH, D, BS, bs_shift, f16; float scale, softcap; int window;
    const float *sinks;  /* [H] or NULL: gpt-oss's attention sinks */
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
    for (int i = 0; i < D; ++i) out[i] = f16 ? (float)((_Float16 *)acc)[i] : acc[i];  /* VKQ32 */
    sinks_and_normalize(out, D, S, M, A->sinks, h);
}

/* q: [S, H, D] f32; k/v cache: [NB, BS, KVH, D] float16 (kv_f16 = 1) or float32, BS a power of 2;
   bt: [S, maxb] int32; lens: [S] (row s attends to positions < lens[s]); out: [S, H, D] f32.
   omp = 1: on the OpenMP team (callers between qdot's OpenMP regions), else pool.c's threads. */
void fattn_rows_sinks(const float *q, const void *kc, const void *vc, const int *bt, int maxb, const int *lens,
                      float *out, int S, int H, int KVH, int D, int BS, float scale, float softcap, int kv_f16,
                      int nthreads, int window, int omp, const float *sinks) {
    const int bs_shift = pool_block_shift(BS);
    if (bs_shift < 0 || H % KVH) return;  /* attention.py passes power-of-2 blocks only */
    struct fa_args a = {q, kc, vc, bt, lens, out, maxb, H, KVH, D, BS, bs_shift, kv_f16, scale, softcap, window,
                        sinks};
    pool_run_on(fa_item, &a, S * H, nthreads, omp);
}

void fattn_rows(const float *q, const void *kc, const void *vc, const int *bt, int maxb, const int *lens,
                float *out, int S, int H, int KVH, int D, int BS, float scale, float softcap, int kv_f16,
                int nthreads, int window, int omp) {
    fattn_rows_sinks(q, kc, vc, bt, maxb, lens, out, S, H, KVH, D, BS, scale, softcap, kv_f16, nthreads, window, omp,
                     0);
}

/* ---- batches of 64 rows or more: ggml_compute_forward_flash_attn_ext_tiled ---------------------
   llama.cpp takes float32 tiles of 64 query rows x 64 keys there. Per query row and head, for each
   64-key tile (cell index 0, 64, ...) with a key the row sees:
       s_t = (q . k_t) x scale       simd_gemm: an fma chain over d from 0 (K widened from float16)
       masked keys -inf; m = max_t s_t
       Mnew = max(M, m); if Mnew > M: ms = expf(M - Mnew), acc *= ms, S *= ms; M = Mnew
       p_t = ggml_v_expf(s_t - Mnew) (AVX-512: 16 lanes), S = (float)((double)S + the four 16-lane
       sums added in double)     ggml_vec_soft_max_f32
       acc_d = fma(v_t,d, p_t, acc_d) over t in order      simd_gemm
   out = acc x (1 / S). On CPUs with AVX-512F + DQ as llama.cpp's AVX-512 build; on CPUs with AVX2 +
   FMA as its AVX2 build (p_t by its 8-lane ggml_v_expf, each 8-lane sum by its SSE tree, added in
   double); no soft-cap; else attention.c. The scores' fma chains are the same bits at any width.
   One sequence per call: rows j = 0 .. n-1 at positions p0 + j. */
#if defined(__x86_64__)
#define TILE 64
#define AVX512_T __attribute__((target("avx512f,avx512dq,fma")))
#define AVX2_T __attribute__((target("avx2,fma")))
#include "ggml_expf.h"
struct ft_args {
    const float *q; const char *kc, *vc; const int *bt; float *out;
    int n, p0, H, KVH, D, BS, bs_shift, f16; float scale; int window, rows_per_item, avx512;
};

/* s[0..63] = (q . kt[:, t]) x scale: one fma chain over d per key, from 0 (simd_gemm). */
AVX512_T static void ft_scores_512(const float *kt, const float *q, int D, float scale, float *s) {
    __m512 s4[4];
    for (int j = 0; j < 4; ++j) s4[j] = _mm512_setzero_ps();
    for (int d = 0; d < D; ++d) {
        const __m512 qd = _mm512_set1_ps(q[d]);
        for (int j = 0; j < 4; ++j) s4[j] = _mm512_fmadd_ps(_mm512_load_ps(kt + (size_t)d * TILE + 16 * j), qd, s4[j]);
    }
    for (int j = 0; j < 4; ++j) _mm512_store_ps(s + 16 * j, _mm512_mul_ps(s4[j], _mm512_set1_ps(scale)));
}
AVX2_T static void ft_scores_256(const float *kt, const float *q, int D, float scale, float *s) {
    __m256 s8[8];
    for (int j = 0; j < 8; ++j) s8[j] = _mm256_setzero_ps();
    for (int d = 0; d < D; ++d) {
        const __m256 qd = _mm256_set1_ps(q[d]);
        for (int j = 0; j < 8; ++j) s8[j] = _mm256_fmadd_ps(_mm256_load_ps(kt + (size_t)d * TILE + 8 * j), qd, s8[j]);
    }
    for (int j = 0; j < 8; ++j) _mm256_store_ps(s + 8 * j, _mm256_mul_ps(s8[j], _mm256_set1_ps(scale)));
}

/* s[t] = exp(s[t] - M) in place; returns their sum as ggml_vec_soft_max_f32 forms it. */
AVX512_T static double ft_softmax_512(float *s, float M) {
    double sum = 0.0;
    for (int j = 0; j < 4; ++j) {
        const __m512 p = ggml_v_expf_avx512(_mm512_sub_ps(_mm512_load_ps(s + 16 * j), _mm512_set1_ps(M)));
        _mm512_store_ps(s + 16 * j, p);
        sum += (double)_mm512_reduce_add_ps(p);
    }
    return sum;
}
AVX2_T static double ft_softmax_256(float *s, float M) {
    double sum = 0.0;
    for (int j = 0; j < 8; ++j) {
        const __m256 p = ggml_v_expf_avx2(_mm256_sub_ps(_mm256_load_ps(s + 8 * j), _mm256_set1_ps(M)));
        _mm256_store_ps(s + 8 * j, p);
        __m128 h = _mm_add_ps(_mm256_extractf128_ps(p, 1), _mm256_castps256_ps128(p));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_movehdup_ps(h));
        sum += (double)_mm_cvtss_f32(h);
    }
    return sum;
}

/* One (KV head, chunk of rows) item. */
static void ft_item(void *args, int item) {
    const struct ft_args *A = args;
    const int H = A->H, KVH = A->KVH, G = H / KVH, D = A->D, esz = A->f16 ? 2 : 4;
    const int kh = item % KVH, r0 = item / KVH * A->rows_per_item;
    const int r1 = r0 + A->rows_per_item < A->n ? r0 + A->rows_per_item : A->n;
    const int nr = r1 - r0;
    float *kt = aligned_alloc(64, sizeof(float) * (size_t)D * TILE);        /* K tile, [D][64] */
    float *vt = aligned_alloc(64, sizeof(float) * (size_t)TILE * D);        /* V tile, [64][D] */
    float *acc = aligned_alloc(64, sizeof(float) * (size_t)nr * G * D + 64); /* per (row, head) */
    float *Ms = malloc(sizeof(float) * (size_t)nr * G * 2), *Ss = Ms + (size_t)nr * G;
    if (!kt || !vt || !acc || !Ms) { free(kt); free(vt); free(acc); free(Ms); return; }
    memset(acc, 0, sizeof(float) * (size_t)nr * G * D);
    for (int i = 0; i < nr * G; ++i) { Ms[i] = -INFINITY; Ss[i] = 0.0f; }
    const int last = A->p0 + r1 - 1;  /* the last key any row here sees */
    const int first = A->window > 0 ? A->p0 + r0 - A->window + 1 : 0;
    for (int k0 = (first > 0 ? first : 0) / TILE * TILE; k0 <= last; k0 += TILE) {
        const int k1 = k0 + TILE - 1 < last ? k0 + TILE - 1 : last;  /* keys up to k1 exist for some row */
        const int kf = first > k0 ? first : k0;  /* and from kf (a sliding window's pool holds no older ones) */
        for (int t = k0; t < kf; ++t)
            for (int d = 0; d < D; ++d) kt[(size_t)d * TILE + (t - k0)] = 0.0f;
        for (int t = kf; t <= k1; ++t) {
            const size_t cell = ((size_t)A->bt[t >> A->bs_shift] << A->bs_shift) + (t & (A->BS - 1));
            const size_t off = (cell * KVH + kh) * D * esz;
            for (int d = 0; d < D; ++d) {
                kt[(size_t)d * TILE + (t - k0)] = A->f16 ? (float)((const _Float16 *)(A->kc + off))[d]
                                                         : ((const float *)(A->kc + off))[d];
                vt[(size_t)(t - k0) * D + d] = A->f16 ? (float)((const _Float16 *)(A->vc + off))[d]
                                                      : ((const float *)(A->vc + off))[d];
            }
        }
        for (int t = k1 + 1 - k0; t < TILE; ++t)
            for (int d = 0; d < D; ++d) kt[(size_t)d * TILE + t] = 0.0f;
        for (int r = r0; r < r1; ++r) {
            const int pos = A->p0 + r;  /* sees keys lo .. pos */
            const int lo = A->window > 0 && pos - A->window + 1 > 0 ? pos - A->window + 1 : 0;
            if (k0 > pos || k0 + TILE - 1 < lo) continue;
            for (int g = 0; g < G; ++g) {
                const int h = kh * G + g, st = (r - r0) * G + g;
                const float *q = A->q + ((size_t)r * H + h) * D;
                float s[TILE] __attribute__((aligned(64)));
                (A->avx512 ? ft_scores_512 : ft_scores_256)(kt, q, D, A->scale, s);
                float m = -INFINITY;
                for (int t = 0; t < TILE; ++t) {
                    const int key = k0 + t;
                    if (key < lo || key > pos) s[t] = -INFINITY;
                    m = s[t] > m ? s[t] : m;
                }
                if (m == -INFINITY) continue;
                float *a = acc + (size_t)st * D;
                const float Mold = Ms[st], Mnew = fmaxf(Mold, m);
                if (Mnew > Mold) {
                    const float ms = expf(Mold - Mnew);
                    for (int d = 0; d < D; ++d) a[d] *= ms;
                    Ss[st] *= ms;
                }
                Ms[st] = Mnew;
                const double sum = (A->avx512 ? ft_softmax_512 : ft_softmax_256)(s, Mnew);
                Ss[st] = (float)((double)Ss[st] + sum);
                const int tv0 = (lo > k0 ? lo : k0) - k0, tv1 = (pos < k0 + TILE - 1 ? pos : k0 + TILE - 1) - k0;
                for (int t = tv0; t <= tv1; ++t)  /* the other keys' p are 0: fma(v, 0, acc) = acc */
                    for (int d = 0; d < D; ++d) a[d] = fmaf(vt[(size_t)t * D + d], s[t], a[d]);
            }
        }
    }
    for (int r = r0; r < r1; ++r)
        for (int g = 0; g < G; ++g) {
            const int h = kh * G + g, st = (r - r0) * G + g;
            const float inv = Ss[st] == 0.0f ? 0.0f : 1.0f / Ss[st];
            float *o = A->out + ((size_t)r * H + h) * D;
            for (int d = 0; d < D; ++d) o[d] = acc[(size_t)st * D + d] * inv;
        }
    free(kt); free(vt); free(acc); free(Ms);
}

/* q: [n, H, D] f32 (rows at positions p0 .. p0 + n - 1 of one sequence); bt: its block table;
   out: [n, H, D]. isa: 2 llama.cpp's AVX-512 order (needs AVX-512F + DQ, D % 16 == 0), 1 its AVX2 order
   (needs AVX2 + FMA, D % 8 == 0: llama.cpp's DV % GGML_F32_EPR). Returns 0, or -1 where this CPU
   cannot (the caller falls back). */
int fattn_tiled_seq(const float *q, const void *kc, const void *vc, const int *bt, int n, int p0, float *out,
                    int H, int KVH, int D, int BS, float scale, int kv_f16, int nthreads, int window, int omp,
                    int isa) {
    const int avx512 = isa == 2;
    if (avx512 ? !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512dq") || D % 16
               : isa != 1 || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || D % 8) return -1;
    if (H % KVH) return -1;
    const int bs_shift = pool_block_shift(BS);
    if (bs_shift < 0) return -1;
    const int rpi = 16;
    struct ft_args a = {q, kc, vc, bt, out, n, p0, H, KVH, D, BS, bs_shift, kv_f16, scale, window, rpi, avx512};
    pool_run_on(ft_item, &a, KVH * ((n + rpi - 1) / rpi), nthreads, omp);
    return 0;
}
#else
int fattn_tiled_seq(const float *q, const void *kc, const void *vc, const int *bt, int n, int p0, float *out,
                    int H, int KVH, int D, int BS, float scale, int kv_f16, int nthreads, int window, int omp,
                    int isa) {
    (void)isa; (void)q; (void)kc; (void)vc; (void)bt; (void)n; (void)p0; (void)out; (void)H; (void)KVH; (void)D; (void)BS;
    (void)scale; (void)kv_f16; (void)nthreads; (void)window; (void)omp;
    return -1;
}
#endif
