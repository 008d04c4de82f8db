/* Batched GEMV on 64-row float tiles (kernels/cpu/gemv.py), at the build's vector width (common.h). */
#include "common.h"
#include "pool.h"

int i8_widening_is_vectorized(void) { return VW > 4; }
const char *cpu_kernels_isa(void) { return ISA_NAME; }

#define NV (64 / VW)  /* vectors per row of a tile */
#if VW == 16
#define CV 4          /* 4 rows x 4 vectors: 16 of the 32 zmm registers hold sums */
#else
#define CV 2          /* 4 rows x 2 vectors: 8 of the 16 ymm / xmm registers */
#endif
#define CV1 (NV < 8 ? NV : 8)  /* one row: up to 8 vectors of sums */
#define PF_ROWS 8  /* several rows: the first chunk's walk prefetches whole tile rows this far ahead */
#define CHUNKS_PER_THREAD 8  /* tiles split in this many chunks per thread: a late helper still takes some */

/* Columns [c, c + n * VW) of a tile's output row, clipped to the nn valid ones. */
static inline void store_cols(float *restrict yrow, int c, const vf *a, int n, int nn) {
    int len = nn - c < n * VW ? nn - c : n * VW;
    if (len > 0) memcpy(yrow + c, a, (size_t)len * sizeof(float));
}

struct bgemv_args { const float *x; const void *Wt; const float *rs; float *y; int M, N, K, nt, per; long ldy; };

/* Batched GEMV on 64-row tiles. Wt: [nt, K, 64]; x: [M, K] (Mp: unused, kept for the ABI);
   y[m * ldy + n] for m < M, n < N. Every output is the chain acc = fma(x[m, k], w[k, n],
   acc) over k = 0 .. K-1 in order, then times the row scale: the same bits on every build and for
   every M. Each tile is read from memory once per call whatever M is: it is walked in column chunks
   of CV vectors, each chunk (K lines, L1/L2-resident) once per 4 rows of x.
   rs: NULL, or one scale per tile row ([nt * 64]) multiplied into the sums.
   Threads: runs of tiles handed out by kernels/cpu/pool.c.
   One body, instantiated for float32, float16 and bfloat16 tiles (weights kept in their file type)
   and for int8 tiles with row scales (a quarter of the bytes to read: the approximate first pass
   over an output head, see kernels/cpu/gemv.py). */
#define BGEMV_TILES64(NAME, WT, LOAD)                                                          \
static void NAME##_run(void *args, int chunk) {                                                \
    const struct bgemv_args *A = args;                                                         \
    const float *restrict x = A->x;                                                            \
    const WT *restrict Wt = A->Wt;                                                             \
    const float *restrict rs = A->rs;                                                          \
    float *restrict y = A->y;                                                                  \
    const int M = A->M, N = A->N, K = A->K;                                                    \
    const long ldy = A->ldy;                                                                   \
    const int t1 = (chunk + 1) * A->per < A->nt ? (chunk + 1) * A->per : A->nt;                \
    for (int t = chunk * A->per; t < t1; ++t) {                                                \
        const WT *restrict tile = Wt + (size_t)t * K * 64;                                     \
        const int n0 = t * 64, nn = N - n0 < 64 ? N - n0 : 64;                                 \
        if (M == 1) {  /* one sequence: one row of sums per chunk */                           \
            for (int c = 0; c < NV; c += CV1) {                                                \
                vf a[CV1];                                                                     \
                for (int j = 0; j < CV1; ++j) a[j] = splat(0.0f);                              \
                const WT *w = tile + c * VW;                                                   \
                for (int k = 0; k < K; ++k, w += 64) {                                         \
                    const vf s = splat(x[k]);                                                  \
                    _Pragma("GCC unroll 8")                                                    \
                    for (int j = 0; j < CV1; ++j) a[j] = fma_v(s, LOAD(w + j * VW), a[j]);     \
                }                                                                              \
                if (rs)                                                                        \
                    for (int j = 0; j < CV1; ++j) a[j] *= ldv(rs + n0 + (c + j) * VW);         \
                store_cols(y + n0, c * VW, a, CV1, nn);                                        \
            }                                                                                  \
            continue;                                                                          \
        }                                                                                      \
        for (int c = 0; c < NV; c += CV)                                                       \
            for (int m0 = 0; m0 < M; m0 += 4) {                                                \
                vf a[4][CV];                                                                   \
                for (int i = 0; i < 4; ++i)                                                    \
                    for (int j = 0; j < CV; ++j) a[i][j] = splat(0.0f);                        \
                const float *xr[4];  /* rows past M repeat row M - 1 (computed, not stored) */ \
                for (int i = 0; i < 4; ++i) xr[i] = x + (size_t)(m0 + i < M ? m0 + i : M - 1) * K; \
                const WT *w = tile + c * VW;                                                   \
                const int pf = c == 0 && m0 == 0; /* first walk: fetch whole rows ahead */     \
                for (int k = 0; k < K; ++k, w += 64) {                                         \
                    if (pf)                                                                    \
                        for (int b = 0; b < 64 * (int)sizeof(WT); b += 64)                     \
                            __builtin_prefetch((const char *)(w + PF_ROWS * 64) + b);          \
                    vf wv[CV];                                                                 \
                    _Pragma("GCC unroll 4")                                                    \
                    for (int j = 0; j < CV; ++j) wv[j] = LOAD(w + j * VW);                     \
                    _Pragma("GCC unroll 4")                                                    \
                    for (int i = 0; i < 4; ++i) {                                              \
                        const vf s = splat(xr[i][k]);                                          \
                        _Pragma("GCC unroll 4")                                                \
                        for (int j = 0; j < CV; ++j) a[i][j] = fma_v(s, wv[j], a[i][j]);       \
                    }                                                                          \
                }                                                                              \
                for (int i = 0; i < 4 && m0 + i < M; ++i) {                                    \
                    if (rs)                                                                    \
                        for (int j = 0; j < CV; ++j) a[i][j] *= ldv(rs + n0 + (c + j) * VW);   \
                    store_cols(y + (size_t)(m0 + i) * ldy + n0, c * VW, a[i], CV, nn);         \
                }                                                                              \
            }                                                                                  \
    }                                                                                          \
}                                                                                              \
void NAME(const float *x, const WT *Wt, const float *rs, float *y, int M, int Mp, int N, int K, \
          long ldy, int nthreads) {                                                            \
    (void)Mp;                                                                                  \
    const int nt = (N + 63) / 64;                                                              \
    int nchunks = nthreads > 1 ? CHUNKS_PER_THREAD * nthreads : 1;                             \
    nchunks = nchunks < nt ? nchunks : nt;                                                     \
    const int per = (nt + nchunks - 1) / nchunks;                                              \
    struct bgemv_args a = {x, Wt, rs, y, M, N, K, nt, per, ldy};                               \
    pool_run(NAME##_run, &a, (nt + per - 1) / per, nthreads);                                  \
}

BGEMV_TILES64(bgemv_tiles64, float, ldv)
BGEMV_TILES64(bgemv_tiles64_i8, signed char, ldv_i8)
BGEMV_TILES64(bgemv_tiles64_f16, unsigned short, ldv_f16)
BGEMV_TILES64(bgemv_tiles64_bf16, unsigned short, ldv_bf16)
