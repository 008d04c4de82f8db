/* Paged decode attention (kernels/cpu/attention.py), at the build's vector width (common.h).
   Every build computes the same bits: dot products are kept as 16 partial sums (lane i of the
   16 sums d = i (mod 16) in order, by fma) reduced by the same tree, the softmax runs in order in
   scalar float32 (expf), and each output is the fma chain over the cached positions in order. */
#include "common.h"
#include "pool.h"

#define LV (16 / VW)  /* vectors per 16 floats */
#define GB 8          /* query heads side by side: per K row, and per pass over the V rows */
#define PF_AHEAD 16   /* K rows prefetched ahead */

/* Lanes 0..15 of s[0 .. LV-1] summed as: for h = 8, 4, 2, 1: s[i] += s[i + h] (i < h); s[0]. */
static inline float sum16(const vf *s) {
#if VW == 16
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256((__m512)s[0]),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd((__m512)s[0]), 1)));
#elif VW == 8
    __m256 a = _mm256_add_ps((__m256)s[0], (__m256)s[1]);
#endif
#if VW >= 8
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
#else
    float f[16];
    memcpy(f, s, sizeof f);
    for (int h = 8; h >= 1; h /= 2)
        for (int i = 0; i < h; ++i) f[i] += f[i + h];
    return f[0];
#endif
}

/* e^x for x <= 0 (softmax terms), the same operations in every lane of every build and in exp_1:
   n = round(x log2 e) (fma with 1.5 * 2^23, explicit: no compiler contraction can differ), r = x - n ln 2 in two fma steps (Cody-Waite),
   e^r by a degree-6 polynomial (Horner, fma), times 2^n through the exponent bits; x < -87 gives
   ~1e-38 instead of 0 (negligible next to the maximum's 1). Relative error ~2 ulp. */
#define EXP_BODY(T, FMA, SPLAT, ROUND_INT_SHIFT, MAX)                                             \
    x = MAX(x, SPLAT(-87.0f));                                                                     \
    const T n = FMA(x, SPLAT(1.44269504088896341f), SPLAT(12582912.0f)) - SPLAT(12582912.0f);     \
    T r = FMA(n, SPLAT(-0.693145751953125f), x);                                                   \
    r = FMA(n, SPLAT(-1.428606765330187045e-06f), r);                                              \
    T q = SPLAT(1.0f / 720.0f);                                                                    \
    q = FMA(q, r, SPLAT(1.0f / 120.0f));                                                           \
    q = FMA(q, r, SPLAT(1.0f / 24.0f));                                                            \
    q = FMA(q, r, SPLAT(1.0f / 6.0f));                                                             \
    q = FMA(q, r, SPLAT(0.5f));                                                                    \
    q = FMA(q, r, SPLAT(1.0f));                                                                    \
    q = FMA(q, r, SPLAT(1.0f));                                                                    \
    return q * ROUND_INT_SHIFT(n);
static inline vf pow2_v(vf n) { return (vf)((__builtin_convertvector(n, vi) + 127) << 23); }
static inline float pow2_1(float n) { int i = ((int)n + 127) << 23; float f; memcpy(&f, &i, 4); return f; }
static inline float fma_1(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
static inline float splat_1(float s) { return s; }
static inline vf max_v(vf a, vf b) { vi m = a < b; return (vf)(((vi)a & ~m) | ((vi)b & m)); }
static inline float max_1(float a, float b) { return a < b ? b : a; }
static inline vf exp_v(vf x) { EXP_BODY(vf, fma_v, splat, pow2_v, max_v) }
static inline float exp_1(float x) { EXP_BODY(float, fma_1, splat_1, pow2_1, max_1) }

/* 16 cached values from a float16 (f16 = 1) or float32 cache row, as LV vectors. */
static inline void ld16(const void *cache, size_t off, int f16, vf *out) {
    for (int j = 0; j < LV; ++j)
        out[j] = f16 ? ldv_f16((const unsigned short *)cache + off + j * VW) : ldv((const float *)cache + off + j * VW);
}
static inline float ld1(const void *cache, size_t off, int f16) {
    return f16 ? (float)((const _Float16 *)cache)[off] : ((const float *)cache)[off];
}

struct att_args {
    const float *q; const void *kc, *vc; const int *bt, *lens; float *out, *scratch;
    int maxb, H, KVH, D, BS, bs_shift, maxL, kv_f16; float scale, softcap; int window;
};

/* The helpers below are inlined at call sites with a constant head count n (a switch over n),
   so that their n accumulators live in registers: with a run-time count they were kept in memory,
   one store and reload per fma (the 430-key decode of a 1.5B model spent ~3x its arithmetic). */
#define INLINE static inline __attribute__((always_inline))

/* dots[g] = q[g] . kf for g < n (q rows D floats apart): lanes of 16 partial sums by fma in order,
   reduced by sum16, then the D % 16 tail by fma in order. */
INLINE void dot_heads(const int n, const float *q, const float *kf, int D, int D16, float *dots) {
    vf a[GB][LV];
    for (int g = 0; g < n; ++g)
        for (int j = 0; j < LV; ++j) a[g][j] = splat(0.0f);
    for (int c = 0; c < D16; c += 16) {
        vf k[LV];
        for (int j = 0; j < LV; ++j) k[j] = ldv(kf + c + j * VW);
        for (int g = 0; g < n; ++g)
            for (int j = 0; j < LV; ++j) a[g][j] = fma_v(ldv(q + (size_t)g * D + c + j * VW), k[j], a[g][j]);
    }
    for (int g = 0; g < n; ++g) {
        float acc = D16 ? sum16(a[g]) : 0.0f;
        for (int d = D16; d < D; ++d) acc = __builtin_fmaf(q[(size_t)g * D + d], kf[d], acc);
        dots[g] = acc;
    }
}

/* Element offset of position t's row of KV head kh in a [NB, BS, KVH, D] cache: one block-table
   entry per block (a shift: BS is a power of 2). */
static inline size_t kv_row(const struct att_args *A, const int *tab, int kh, int t) {
    return ((((size_t)tab[t >> A->bs_shift] << A->bs_shift) + (t & (A->BS - 1))) * A->KVH + kh) * A->D;
}

/* out[g][c .. c+15] = sum over t in [t0, L) of p[g][t] * V[t][c .. c+15] (p rows maxL apart), by
   fma in order of t, for the n query heads of KV head kh (sequence block table tab). */
INLINE void v_heads(const int n, const struct att_args *A, const int *tab, int kh, const float *p, int c,
                    int t0, int L, float *out) {
    vf a[GB][LV];
    for (int g = 0; g < n; ++g)
        for (int j = 0; j < LV; ++j) a[g][j] = splat(0.0f);
    for (int t = t0; t < L; ++t) {
        vf v[LV];
        ld16(A->vc, kv_row(A, tab, kh, t) + c, A->kv_f16, v);
        for (int g = 0; g < n; ++g) {
            const vf w = splat(p[(size_t)g * A->maxL + t]);
            for (int j = 0; j < LV; ++j) a[g][j] = fma_v(w, v[j], a[g][j]);
        }
    }
    for (int g = 0; g < n; ++g) memcpy(out + (size_t)g * A->D + c, a[g], 16 * sizeof(float));
}

/* CALL(n) with the head count n = `count` (1 .. GB) as a constant */
#define PER_HEADS(count, CALL) switch (count) { \
    case 8: CALL(8); break; case 7: CALL(7); break; case 6: CALL(6); break; case 5: CALL(5); break; \
    case 4: CALL(4); break; case 3: CALL(3); break; case 2: CALL(2); break; default: CALL(1); break; }

/* One (sequence, KV head) pair: item = s * KVH + kh. Denormals are flushed to zero while it runs
   (FTZ + DAZ, every build the same): the softmax terms of keys far below the maximum are ~1e-38,
   and each one that reaches an FMA as a denormal costs a microcode assist on Intel cores (a
   430-key decode of a 1.5B model ran 8x slower); their share of any output is below its rounding. */
static void attend_item(void *args, int item);
static void attend(void *args, int item) {
#if defined(__x86_64__)
    const unsigned csr = __builtin_ia32_stmxcsr();
    __builtin_ia32_ldmxcsr(csr | 0x8040u);
    attend_item(args, item);
    __builtin_ia32_ldmxcsr(csr);
#else
    attend_item(args, item);
#endif
}

static void attend_item(void *args, int item) {
    const struct att_args *A = args;
    const int KVH = A->KVH, H = A->H, D = A->D, maxL = A->maxL;
    const int G = H / KVH, D16 = D / 16 * 16, kv_f16 = A->kv_f16;
    const int s = item / KVH, kh = item % KVH;
    const float scale = A->scale, softcap = A->softcap;
    const void *kc = A->kc, *vc = A->vc;
    const int *bt = A->bt, maxb = A->maxb;
    const int *lens = A->lens;
    const float *q = A->q;
    float *out = A->out, *scratch = A->scratch;
    const int L = lens[s];
    const int t0 = A->window > 0 && L > A->window ? L - A->window : 0;  /* sliding window */
    const int *tab = bt + (size_t)s * maxb;
    float *sc = scratch + ((size_t)s * KVH + kh) * G * maxL;
    const float *qs = q + ((size_t)s * H + (size_t)kh * G) * D;
    float *os = out + ((size_t)s * H + (size_t)kh * G) * D;
    /* bytes of a cache at element offset off; ROW(t): the element offset of position t's row */
#define KROW(cache, off) ((const char *)(cache) + (off) * (kv_f16 ? 2 : 4))
#define ROW(t) kv_row(A, tab, kh, (t))
    float kf[D];  /* one K row widened once for the G query heads */
    const int row_bytes = D * (kv_f16 ? 2 : 4);
    for (int t = t0; t < L && t < t0 + PF_AHEAD; ++t) {
        const char *kn = KROW(kc, ROW(t));
        for (int b = 0; b < row_bytes; b += 64) __builtin_prefetch(kn + b);
    }
    for (int t = t0; t < L; ++t) {
        const size_t row = ROW(t);
        /* the cache is cold here (every layer's weights passed through since this layer's last
           step): each K row PF_AHEAD positions ahead and this position's V row (read by the
           second pass, from L2 then) are requested line by line, so the reads overlap */
        if (t + PF_AHEAD < L) {
            const char *kn = KROW(kc, ROW(t + PF_AHEAD));
            for (int b = 0; b < row_bytes; b += 64) __builtin_prefetch(kn + b);
        }
        {
            const char *vn = KROW(vc, row);
            for (int b = 0; b < row_bytes; b += 64) __builtin_prefetch(vn + b, 0, 2);
        }
        for (int c = 0; c < D16; c += 16) {
            vf k[LV];
            ld16(kc, row + c, kv_f16, k);
            memcpy(kf + c, k, sizeof k);
        }
        for (int d = D16; d < D; ++d) kf[d] = ld1(kc, row + d, kv_f16);
        /* the dot products of up to GB query heads side by side: each head's chain of fmas is
           the same as alone (same bits), but independent chains keep the FMA units busy */
        for (int g0 = 0; g0 < G; g0 += GB) {
            float dots[GB];
            const float *qg = qs + (size_t)g0 * D;
#define DOTS(n) dot_heads(n, qg, kf, D, D16, dots)
            PER_HEADS(G - g0 < GB ? G - g0 : GB, DOTS)
#undef DOTS
            for (int g = 0; g < GB && g0 + g < G; ++g) {
                float acc = dots[g] * scale;
                if (softcap > 0.0f) acc = softcap * tanhf(acc / softcap);
                sc[(size_t)(g0 + g) * maxL + t] = acc;
            }
        }
    }
    for (int g = 0; g < G; ++g) {
        float *p = sc + (size_t)g * maxL + t0, mx = -INFINITY, sum = 0.0f;
        const int n = L - t0;  /* the keys in the window */
        const int L16 = n / 16 * 16;
        /* the maximum (order-free; 16 lanes, a scalar chain of maxss was 4 cycles a key) */
        if (L16) {
            vf m[LV];
            for (int j = 0; j < LV; ++j) m[j] = ldv(p + j * VW);
            for (int t = 16; t < L16; t += 16)
                for (int j = 0; j < LV; ++j) m[j] = max_v(m[j], ldv(p + t + j * VW));
            float f[16];
            memcpy(f, m, sizeof f);
            for (int i = 0; i < 16; ++i) mx = f[i] > mx ? f[i] : mx;
        }
        for (int t = L16; t < n; ++t) mx = p[t] > mx ? p[t] : mx;
        vf acc[LV];
        for (int j = 0; j < LV; ++j) acc[j] = splat(0.0f);
        for (int t = 0; t < L16; t += 16)
            for (int j = 0; j < LV; ++j) {
                const vf e = exp_v(ldv(p + t + j * VW) - splat(mx));
                stv(p + t + j * VW, e);
                acc[j] += e;
            }
        sum = L16 ? sum16(acc) : 0.0f;
        for (int t = L16; t < n; ++t) { p[t] = exp_1(p[t] - mx); sum += p[t]; }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        for (int t = 0; t < n; ++t) p[t] *= inv;
    }
    for (int g0 = 0; g0 < G; g0 += GB) {
        const int gn = G - g0 < GB ? G - g0 : GB;
        const float *pg = sc + (size_t)g0 * maxL;
        float *og = os + (size_t)g0 * D;
        for (int c = 0; c < D16; c += 16) {
#define VSUMS(n) v_heads(n, A, tab, kh, pg, c, t0, L, og)
            PER_HEADS(gn, VSUMS)
#undef VSUMS
        }
        for (int d = D16; d < D; ++d)
            for (int g = g0; g < g0 + gn; ++g) {
                float acc = 0.0f;
                for (int t = t0; t < L; ++t) {
                    const size_t row = ROW(t);
                    acc = __builtin_fmaf(sc[(size_t)g * maxL + t], ld1(vc, row + d, kv_f16), acc);
                }
                os[(size_t)g * D + d] = acc;
            }
    }
}

/* Paged decode attention, one query per sequence. q: [S, H, D] f32; k/v cache: [NB, BS, KVH, D]
   of float16 (kv_f16 = 1) or float32, BS a power of 2; bt: [S, maxb] int32 block tables;
   lens: [S]; out: [S, H, D] f32; scratch: [S * KVH, G, maxL] f32 scores. Per (sequence, KV head),
   on the threads of kernels/cpu/pool.c: the scores of its G query heads against every cached key
   (each K row widened once), the softmax, then the weighted V sums (GB heads x 16 columns held in
   registers per pass over the V rows). window > 0: only the last `window` keys are read (the query
   at position L - 1 sees keys at positions > L - 1 - window, llama.cpp's LLAMA_SWA_TYPE_STANDARD). */
static void decode_items(const float *q, const void *kc, const void *vc, const int *bt, int maxb, const int *lens,
                         float *out, float *scratch, int S, int H, int KVH, int D, int BS, int maxL, float scale,
                         float softcap, int kv_f16, int nthreads, int window, int omp) {
    const int bs_shift = pool_block_shift(BS);
    if (bs_shift < 0) return;  /* attention.py only passes power-of-2 block sizes */
    struct att_args a = {q, kc, vc, bt, lens, out, scratch, maxb, H, KVH, D, BS, bs_shift, maxL, kv_f16,
                         scale, softcap, window};
    pool_run_on(attend, &a, S * KVH, nthreads, omp);
}

void paged_decode(const float *q, const void *kc, const void *vc, const int *bt, int maxb, const int *lens,
                  float *out, float *scratch, int S, int H, int KVH, int D, int BS, int maxL, float scale,
                  float softcap, int kv_f16, int nthreads, int window) {
    decode_items(q, kc, vc, bt, maxb, lens, out, scratch, S, H, KVH, D, BS, maxL, scale, softcap, kv_f16, nthreads,
                 window, 0);
}

/* The same on the OpenMP team instead of pool.c's helpers: for callers whose matmuls are the qdot
   kernels' OpenMP regions (kernels/cpu/decoder.py), whose threads still spin between them and would
   share a core with a woken pool helper (measured on q15b: attention 2.9-3.6 -> 1.45 ms per step).
   The per-op path keeps the pool (the float GEMV tiles run on it). */
void paged_decode_team(const float *q, const void *kc, const void *vc, const int *bt, int maxb, const int *lens,
                       float *out, float *scratch, int S, int H, int KVH, int D, int BS, int maxL, float scale,
                       float softcap, int kv_f16, int nthreads, int window) {
    decode_items(q, kc, vc, bt, maxb, lens, out, scratch, S, H, KVH, D, BS, maxL, scale, softcap, kv_f16, nthreads,
                 window, 1);
}
