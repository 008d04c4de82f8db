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
   rs: NULL, or one scale per tile row ([nt * 64]) multiplied into the sums (no caller passes one
   since the int8 head moved to head_scan_i8; kept for int8 / scaled instantiations).
   Threads: runs of tiles handed out by kernels/cpu/pool.c.
   One body, instantiated for float32, float16 and bfloat16 tiles (weights kept in their file type). */
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
BGEMV_TILES64(bgemv_tiles64_f16, unsigned short, ldv_f16)
BGEMV_TILES64(bgemv_tiles64_bf16, unsigned short, ldv_bf16)

/* ---- the output head's first pass in integers (kernels/cpu/topk.py) ------------------------------
   y[m, n] = ((float)sum_k qx[m, k] q[n, k] * sx[m]) * s[n]: int8 activations (one scale per row of
   x) times the int8 head, summed exactly in int32 (AVX2: vpsignb + vpmaddubsw + vpmaddwd, no
   saturation since |q| <= 127). q4: [nt, K4 / 4, 64, 4], 4 consecutive k of one head row in 4
   bytes; qx: [M, K4] (K4 a multiple of 4, zero-padded); s: [nt * 64]. */
struct scan_args { const signed char *qx; const float *sx; const signed char *q4; const float *s; float *y;
                   int M, N, K4, nt, per; long ldy; };

static inline void scan_store(const struct scan_args *A, int m, int n0, int c, const int *acc, int ncols) {
    const int nn = A->N - n0 < 64 ? A->N - n0 : 64;
    for (int j = 0; j < ncols && c + j < nn; ++j)
        A->y[(size_t)m * A->ldy + n0 + c + j] = ((float)acc[j] * A->sx[m]) * A->s[n0 + c + j];
}

#if defined(__AVX2__)
/* MR rows of x (rows past M repeat row M - 1, not stored) against 16 columns of tile t. */
#define SCAN_BLOCK(MR)                                                                         \
static void scan_block##MR(const struct scan_args *A, int t, int c, int m0) {                  \
    const int K4 = A->K4, M = A->M;                                                            \
    const signed char *w = A->q4 + (size_t)t * K4 * 64 + (size_t)c * 4;                        \
    const signed char *xr[MR];                                                                 \
    for (int i = 0; i < MR; ++i) xr[i] = A->qx + (size_t)(m0 + i < M ? m0 + i : M - 1) * K4;   \
    const __m256i ones = _mm256_set1_epi16(1);                                                 \
    __m256i acc[MR][2];                                                                        \
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();               \
    for (int k = 0; k < K4; k += 4, w += 256) {                                                \
        if (c == 0 && m0 == 0) __builtin_prefetch(w + PF_ROWS * 256), __builtin_prefetch(w + PF_ROWS * 256 + 64), \
            __builtin_prefetch(w + PF_ROWS * 256 + 128), __builtin_prefetch(w + PF_ROWS * 256 + 192); \
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)w);                             \
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + 32));                      \
        for (int i = 0; i < MR; ++i) {                                                         \
            int xi; memcpy(&xi, xr[i] + k, 4);                                                 \
            const __m256i xb = _mm256_set1_epi32(xi), ax = _mm256_abs_epi8(xb);                \
            acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w0, xb)), ones)); \
            acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w1, xb)), ones)); \
        }                                                                                      \
    }                                                                                          \
    for (int i = 0; i < MR && m0 + i < M; ++i) {                                               \
        int out[16];                                                                           \
        memcpy(out, acc[i], sizeof out);                                                       \
        scan_store(A, m0 + i, t * 64, c, out, 16);                                             \
    }                                                                                          \
}
SCAN_BLOCK(4)
/* One row of x against all 64 columns of tile t: the tile read as one sequential stream. */
static void scan_row(const struct scan_args *A, int t, int m) {
    const int K4 = A->K4;
    const signed char *w = A->q4 + (size_t)t * K4 * 64, *x = A->qx + (size_t)m * K4;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_si256();
    for (int k = 0; k < K4; k += 4, w += 256) {
        int xi; memcpy(&xi, x + k, 4);
        const __m256i xb = _mm256_set1_epi32(xi), ax = _mm256_abs_epi8(xb);
        for (int j = 0; j < 8; ++j) {
            const __m256i wj = _mm256_loadu_si256((const __m256i *)(w + 32 * j));
            acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(wj, xb)), ones));
        }
    }
    int out[64];
    memcpy(out, acc, sizeof out);
    scan_store(A, m, t * 64, 0, out, 64);
}
static void scan_tile(const struct scan_args *A, int t) {
    const int m4 = A->M == 1 ? 0 : (A->M + 3) / 4 * 4;  /* rows in 4-row blocks (clamped), or one row alone */
    for (int c = 0; c < 64 && m4; c += 16)
        for (int m0 = 0; m0 < m4; m0 += 4) scan_block4(A, t, c, m0);
    if (!m4) scan_row(A, t, 0);
}
#else
static void scan_tile(const struct scan_args *A, int t) {
    const int K4 = A->K4;
    const signed char *tile = A->q4 + (size_t)t * K4 * 64;
    for (int m = 0; m < A->M; ++m) {
        int acc[64] = {0};
        const signed char *x = A->qx + (size_t)m * K4;
        for (int k = 0; k < K4; k += 4)
            for (int j = 0; j < 64; ++j)
                for (int b = 0; b < 4; ++b) acc[j] += (int)x[k + b] * tile[((size_t)k / 4 * 64 + j) * 4 + b];
        scan_store(A, m, t * 64, 0, acc, 64);
    }
}
#endif

static void scan_run(void *args, int chunk) {
    const struct scan_args *A = args;
    const int t1 = (chunk + 1) * A->per < A->nt ? (chunk + 1) * A->per : A->nt;
    for (int t = chunk * A->per; t < t1; ++t) scan_tile(A, t);
}

void head_scan_i8(const signed char *qx, const float *sx, const signed char *q4, const float *s, float *y,
                  int M, int N, int K4, long ldy, int nthreads) {
    const int nt = (N + 63) / 64;
    int nchunks = nthreads > 1 ? CHUNKS_PER_THREAD * nthreads : 1;
    nchunks = nchunks < nt ? nchunks : nt;
    const int per = (nt + nchunks - 1) / nchunks;
    struct scan_args a = {qx, sx, q4, s, y, M, N, K4, nt, per, ldy};
    pool_run(scan_run, &a, (nt + per - 1) / per, nthreads);
}

/* The int8 copy of a float32 head in 64-row tiles ([nt, K, 64]), kernels/cpu/gemv.py `pack_i8`:
   per row r (tile t, column j) scale_r = max_k |w| / 127 (1 for an all-zero row), q = round-half-even
   (w / scale_r) clamped to +-127, err_r = |w_r - scale_r q_r|_2 and norm_r = |w_r|_2 in double. The
   same float32 arithmetic as the torch version, so the same q and scales. */
struct pack_i8_args { const float *w; signed char *q; float *scale; double *err, *norm; int K, nt, per; };

static void pack_i8_run(void *args, int chunk) {
    const struct pack_i8_args *A = args;
    const int K = A->K, t1 = (chunk + 1) * A->per < A->nt ? (chunk + 1) * A->per : A->nt;
    for (int t = chunk * A->per; t < t1; ++t) {
        const float *w = A->w + (size_t)t * K * 64;
        signed char *q = A->q + (size_t)t * K * 64;
        float s[64];
        double e2[64], n2[64];
        for (int j = 0; j < 64; ++j) { s[j] = 0.0f; e2[j] = 0.0; n2[j] = 0.0; }
        for (int k = 0; k < K; ++k)
            for (int j = 0; j < 64; ++j) { const float a = fabsf(w[(size_t)k * 64 + j]); s[j] = a > s[j] ? a : s[j]; }
        for (int j = 0; j < 64; ++j) { s[j] = s[j] / 127.0f; if (!(s[j] > 0.0f)) s[j] = 1.0f; }
        for (int k = 0; k < K; ++k)
            for (int j = 0; j < 64; ++j) {
                const float x = w[(size_t)k * 64 + j];
                float r = nearbyintf(x / s[j]);
                r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
                q[(size_t)k * 64 + j] = (signed char)r;
                const double d = (double)x - (double)r * (double)s[j];
                e2[j] += d * d;
                n2[j] += (double)x * (double)x;
            }
        for (int j = 0; j < 64; ++j) {
            A->scale[t * 64 + j] = s[j];
            A->err[t * 64 + j] = sqrt(e2[j]);
            A->norm[t * 64 + j] = sqrt(n2[j]);
        }
    }
}

void pack_i8_f32(const float *w, signed char *q, float *scale, double *err, double *norm, int nt, int K,
                 int nthreads) {
    int nchunks = nthreads > 1 ? CHUNKS_PER_THREAD * nthreads : 1;
    nchunks = nchunks < nt ? nchunks : nt;
    if (nchunks < 1) return;
    const int per = (nt + nchunks - 1) / nchunks;
    struct pack_i8_args a = {w, q, scale, err, norm, K, nt, per};
    pool_run(pack_i8_run, &a, (nt + per - 1) / per, nthreads);
}
