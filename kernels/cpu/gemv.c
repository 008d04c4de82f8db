/* Batched GEMV on 64-row float tiles (kernels/cpu/gemv.py). */
#include "common.h"

/* int8 tiles are widened to float32 exactly; their per-row scales are applied to the sums. */
#if defined(__AVX512F__)
#include <immintrin.h>
static inline v16 ldi8(const signed char *p) {
    return (v16)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
int i8_widening_is_vectorized(void) { return 1; }
#elif defined(__AVX2__)
#include <immintrin.h>
static inline v16 ldi8(const signed char *p) {
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
    v16 v; memcpy(&v, &lo, 32); memcpy((char *)&v + 32, &hi, 32); return v;
}
int i8_widening_is_vectorized(void) { return 1; }
#else  /* gcc scalarizes this on x86 without AVX2 (~8x slower than a float32 read) */
typedef signed char i8x16 __attribute__((vector_size(16)));
typedef int i32x16 __attribute__((vector_size(64)));
static inline v16 ldi8(const signed char *p) {
    i8x16 h; memcpy(&h, p, sizeof h);
    return __builtin_convertvector(__builtin_convertvector(h, i32x16), v16);
}
int i8_widening_is_vectorized(void) { return 0; }
#endif

/* bfloat16 tiles widened to float32 exactly (16 at a time). */
typedef unsigned short u16x16 __attribute__((vector_size(32)));
typedef unsigned int u32x16 __attribute__((vector_size(64)));
static inline v16 ldbf(const unsigned short *p) {
    u16x16 h; memcpy(&h, p, sizeof h);
    u32x16 w = __builtin_convertvector(h, u32x16) << 16;
    v16 f; memcpy(&f, &w, sizeof f); return f;
}

/* Batched GEMV on 64-row tiles. Wt: [nt, K, 64]; x: [Mp, K] with Mp a multiple of 4 (zero rows
   past M); y[m * ldy + n] for m < M, n < N. For every k, x[m, k] is broadcast against the 64
   weights of row k of the tile: 4 x 4 accumulators of 16 floats, no horizontal reductions.
   rs: NULL, or one scale per tile row ([nt * 64]) multiplied into the sums.
   One body, instantiated for float32, float16 and bfloat16 tiles (weights kept in their file type)
   and for int8 tiles with row scales (a quarter of the bytes to read: the approximate first pass
   over an output head, see kernels/cpu/gemv.py). */
#define BGEMV_TILES64(NAME, WT, LOAD)                                                          \
void NAME(const float *restrict x, const WT *restrict Wt, const float *restrict rs,            \
          float *restrict y, int M, int Mp, int N, int K, long ldy, int nthreads) {            \
    const int nt = (N + 63) / 64;                                                              \
    _Pragma("omp parallel for schedule(static) num_threads(nthreads)")                         \
    for (int t = 0; t < nt; ++t) {                                                             \
        const WT *restrict tile = Wt + (size_t)t * K * 64;                                     \
        const int n0 = t * 64, nn = N - n0 < 64 ? N - n0 : 64;                                 \
        if (M == 1) {  /* one sequence: 4 accumulators, a quarter of the arithmetic */         \
            v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};                                        \
            for (int k = 0; k < K; ++k) {                                                      \
                const WT *w = tile + (size_t)k * 64;                                           \
                float s = x[k];                                                                \
                a0 += s * LOAD(w); a1 += s * LOAD(w + 16);                                     \
                a2 += s * LOAD(w + 32); a3 += s * LOAD(w + 48);                                \
            }                                                                                  \
            if (rs) {                                                                          \
                a0 *= ld(rs + n0); a1 *= ld(rs + n0 + 16);                                     \
                a2 *= ld(rs + n0 + 32); a3 *= ld(rs + n0 + 48);                                \
            }                                                                                  \
            v16 acc[4] = {a0, a1, a2, a3};                                                     \
            memcpy(y + n0, acc, (size_t)nn * sizeof(float));                                   \
            continue;                                                                          \
        }                                                                                      \
        for (int m0 = 0; m0 < Mp; m0 += 4) {                                                   \
            v16 a00 = {0}, a01 = {0}, a02 = {0}, a03 = {0};                                    \
            v16 a10 = {0}, a11 = {0}, a12 = {0}, a13 = {0};                                    \
            v16 a20 = {0}, a21 = {0}, a22 = {0}, a23 = {0};                                    \
            v16 a30 = {0}, a31 = {0}, a32 = {0}, a33 = {0};                                    \
            const float *x0 = x + (size_t)m0 * K, *x1 = x0 + K, *x2 = x1 + K, *x3 = x2 + K;    \
            for (int k = 0; k < K; ++k) {                                                      \
                const WT *w = tile + (size_t)k * 64;                                           \
                v16 w0 = LOAD(w), w1 = LOAD(w + 16), w2 = LOAD(w + 32), w3 = LOAD(w + 48);     \
                float s0 = x0[k], s1 = x1[k], s2 = x2[k], s3 = x3[k];                          \
                a00 += s0 * w0; a01 += s0 * w1; a02 += s0 * w2; a03 += s0 * w3;                \
                a10 += s1 * w0; a11 += s1 * w1; a12 += s1 * w2; a13 += s1 * w3;                \
                a20 += s2 * w0; a21 += s2 * w1; a22 += s2 * w2; a23 += s2 * w3;                \
                a30 += s3 * w0; a31 += s3 * w1; a32 += s3 * w2; a33 += s3 * w3;                \
            }                                                                                  \
            v16 acc[4][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13},                       \
                             {a20, a21, a22, a23}, {a30, a31, a32, a33}};                      \
            for (int i = 0; i < 4 && m0 + i < M; ++i) {                                        \
                if (rs)                                                                        \
                    for (int j = 0; j < 4; ++j) acc[i][j] *= ld(rs + n0 + 16 * j);             \
                float buf[64];                                                                 \
                memcpy(buf, acc[i], sizeof buf);                                               \
                memcpy(y + (size_t)(m0 + i) * ldy + n0, buf, (size_t)nn * sizeof(float));      \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
}

BGEMV_TILES64(bgemv_tiles64, float, ld)
BGEMV_TILES64(bgemv_tiles64_i8, signed char, ldi8)
BGEMV_TILES64(bgemv_tiles64_f16, unsigned short, ldh)
BGEMV_TILES64(bgemv_tiles64_bf16, unsigned short, ldbf)
