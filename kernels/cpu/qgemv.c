/* Batched GEMV on affine-integer tiles of quantized weights (kernels/cpu/qgemv.py). */
#include "common.h"

/* 64 weight codes of one k as 4 x 16 floats: signed 8-bit codes (64 bytes) or 4-bit codes
   (32 bytes: byte j holds row j in its low nibble and row j + 32 in its high nibble). */
#if defined(__AVX512F__)
static inline void ldc8(const unsigned char *p, v16 c[4]) {
    for (int j = 0; j < 4; ++j)
        c[j] = (v16)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * j))));
}
static inline void ldc4(const unsigned char *p, v16 c[4]) {
    const __m128i m = _mm_set1_epi8(0x0F);
    for (int j = 0; j < 2; ++j) {
        __m128i b = _mm_loadu_si128((const __m128i *)(p + 16 * j));
        c[j] = (v16)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, m)));
        c[j + 2] = (v16)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), m)));
    }
}
#elif defined(__AVX2__)
static inline v16 cat8(__m256 lo, __m256 hi) { v16 v; memcpy(&v, &lo, 32); memcpy((char *)&v + 32, &hi, 32); return v; }
static inline void ldc8(const unsigned char *p, v16 c[4]) {
    for (int j = 0; j < 4; ++j) {
        __m128i b = _mm_loadu_si128((const __m128i *)(p + 16 * j));
        c[j] = cat8(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))));
    }
}
static inline void ldc4(const unsigned char *p, v16 c[4]) {
    const __m128i m = _mm_set1_epi8(0x0F);
    for (int j = 0; j < 2; ++j) {
        __m128i b = _mm_loadu_si128((const __m128i *)(p + 16 * j));
        __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
        c[j] = cat8(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))));
        c[j + 2] = cat8(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))));
    }
}
#else
static inline void ldc8(const unsigned char *p, v16 c[4]) {
    float f[64]; for (int i = 0; i < 64; ++i) f[i] = (float)(signed char)p[i];
    memcpy(c, f, sizeof f);
}
static inline void ldc4(const unsigned char *p, v16 c[4]) {
    float f[64]; for (int i = 0; i < 32; ++i) { f[i] = (float)(p[i] & 15); f[i + 32] = (float)(p[i] >> 4); }
    memcpy(c, f, sizeof f);
}
#endif

/* Batched GEMV on affine-integer tiles: W[r, k] = A[g, r] * code[k, r] + B[g, r], g = k / gs
   (every GGUF quantized type repacked exactly, see kernels/cpu/qgemv.py). codes: [nt, K, CB] bytes
   (CB = 64 for 8-bit codes, 32 for 4-bit); A, B: [nt, K / gs, 64] float; x: [Mp, K] with Mp even
   (zero rows past M); xs: [Mp, K / gs] per-group sums of x; B may be NULL (all zero). For each
   group the code sums
   s = sum_k x[m, k] code[k, :] are kept for 2 rows of x at a time, then acc += A * s + B * xs. */
#define QGEMV_TILES64(NAME, CB, LOADC)                                                         \
void NAME(const float *restrict x, const float *restrict xs, const unsigned char *restrict codes, \
          const float *restrict A, const float *restrict B, float *restrict y,                 \
          int M, int N, int K, int gs, long ldy, int nthreads) {                               \
    const int nt = (N + 63) / 64, ng = K / gs;                                                 \
    _Pragma("omp parallel for schedule(static) num_threads(nthreads)")                         \
    for (int t = 0; t < nt; ++t) {                                                             \
        const unsigned char *ct = codes + (size_t)t * K * CB;                                  \
        const float *At = A + (size_t)t * ng * 64, *Bt = B ? B + (size_t)t * ng * 64 : 0;      \
        const int n0 = t * 64, nn = N - n0 < 64 ? N - n0 : 64;                                 \
        if (M == 1) {  /* one sequence: half the arithmetic of a pair */                       \
            v16 a0[4] = {{0}};                                                                 \
            for (int g = 0; g < ng; ++g) {                                                     \
                v16 s0[4] = {{0}}, c[4];                                                       \
                for (int k = g * gs; k < (g + 1) * gs; ++k) {                                  \
                    LOADC(ct + (size_t)k * CB, c);                                             \
                    const float u0 = x[k];                                                     \
                    for (int j = 0; j < 4; ++j) s0[j] += u0 * c[j];                            \
                }                                                                              \
                for (int j = 0; j < 4; ++j) {                                                  \
                    a0[j] += ld(At + (size_t)g * 64 + 16 * j) * s0[j];                         \
                    if (B) a0[j] += ld(Bt + (size_t)g * 64 + 16 * j) * xs[g];                  \
                }                                                                              \
            }                                                                                  \
            float buf[64];                                                                     \
            memcpy(buf, a0, sizeof buf);                                                       \
            memcpy(y + n0, buf, (size_t)nn * sizeof(float));                                   \
            continue;                                                                          \
        }                                                                                      \
        for (int m0 = 0; m0 < M; m0 += 2) {                                                    \
            const float *x0 = x + (size_t)m0 * K, *x1 = x0 + K;                                \
            const float *xs0 = xs + (size_t)m0 * ng, *xs1 = xs0 + ng;                          \
            v16 a0[4] = {{0}}, a1[4] = {{0}};                                                  \
            for (int g = 0; g < ng; ++g) {                                                     \
                v16 s0[4] = {{0}}, s1[4] = {{0}}, c[4];                                        \
                for (int k = g * gs; k < (g + 1) * gs; ++k) {                                  \
                    LOADC(ct + (size_t)k * CB, c);                                             \
                    const float u0 = x0[k], u1 = x1[k];                                        \
                    for (int j = 0; j < 4; ++j) { s0[j] += u0 * c[j]; s1[j] += u1 * c[j]; }    \
                }                                                                              \
                for (int j = 0; j < 4; ++j) {                                                  \
                    const v16 a = ld(At + (size_t)g * 64 + 16 * j);                            \
                    a0[j] += a * s0[j];                                                        \
                    a1[j] += a * s1[j];                                                        \
                    if (B) {                                                                   \
                        const v16 b = ld(Bt + (size_t)g * 64 + 16 * j);                        \
                        a0[j] += b * xs0[g];                                                   \
                        a1[j] += b * xs1[g];                                                   \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
            float buf[64];                                                                     \
            memcpy(buf, a0, sizeof buf);                                                       \
            memcpy(y + (size_t)m0 * ldy + n0, buf, (size_t)nn * sizeof(float));                \
            if (m0 + 1 < M) {                                                                  \
                memcpy(buf, a1, sizeof buf);                                                   \
                memcpy(y + (size_t)(m0 + 1) * ldy + n0, buf, (size_t)nn * sizeof(float));      \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
}

QGEMV_TILES64(qgemv_tiles64_c8, 64, ldc8)
QGEMV_TILES64(qgemv_tiles64_c4, 32, ldc4)
