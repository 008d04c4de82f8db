/* Activation quantization, as llama.cpp's CPU backend does it (ggml-cpu/arch/x86/quants.c):

   q8_0 (for the 32-block weight types), per block of 32:
       amax = max |x|, d = amax / 127, id = amax ? 127 / amax : 0, q = round_half_even(x * id)
       (llama.cpp's AVX2 quantize_row_q8_0); d is rounded to fp16 as llama.cpp stores it (the codes
       use the unrounded id, as there), and the int32 sum of the 32 codes is kept exactly, and
       beside it llama.cpp's q8_1 `s` (for Q4_1 / Q5_1, quantize_row_q8_1: the same codes and d,
       s = fp16(d * sum) with the unrounded d). Keeping d in float32 instead parted greedy tokens
       from llama-server's on Q8_0 models (tests/test_qwen3moe.py).
   q8_K (for the K-quants), per block of 256 (quantize_row_q8_K_ref):
       max = the first x of largest |x|, iscale = -127 / max, q = min(127, round_half_even(iscale * x)),
       d = 1 / iscale, bsum[16] = sums of 16 consecutive codes.
   All float arithmetic is single IEEE operations (no contraction), so tests can replay it in numpy
   float32 exactly. |q| <= 127 always. */
#include "qdot.h"

static void q8_0_row_scalar(const float *x, int K, int8_t *q, float *d, int32_t *s, float *s1) {
    for (int b = 0; b < K / 32; ++b) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) { const float a = fabsf(xb[j]); amax = a > amax ? a : amax; }
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const float dd = amax / 127.0f;
        d[b] = qd_round_f16(dd);
        int sum = 0;
        for (int j = 0; j < 32; ++j) {
            const int v = (int)nearbyintf(xb[j] * id);
            q[32 * b + j] = (int8_t)v; sum += v;
        }
        s[b] = sum;
        s1[b] = qd_round_f16(dd * (float)sum);
    }
}

static void q8_K_row_scalar(const float *x, int K, int8_t *q, float *d, int16_t *bs) {
    for (int b = 0; b < K / 256; ++b) {
        const float *xb = x + 256 * b;
        int8_t *qb = q + 256 * b;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 256; ++j) { const float a = fabsf(xb[j]); if (a > amax) { amax = a; max = xb[j]; } }
        if (amax == 0.0f) {
            d[b] = 0.0f; memset(qb, 0, 256);
            for (int j = 0; j < 16; ++j) bs[16 * b + j] = 0;
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < 256; ++j) {
            const int v = (int)nearbyintf(iscale * xb[j]);
            qb[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < 16; ++j) {
            int sum = 0;
            for (int i = 0; i < 16; ++i) sum += qb[16 * j + i];
            bs[16 * b + j] = (int16_t)sum;
        }
        d[b] = 1.0f / iscale;
    }
}

#if defined(QD_AVX2)
static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
static inline int hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_extracti128_si256(v, 1), _mm256_castsi256_si128(v));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}
/* 4 x 8 int32 (|v| <= 127) -> 32 int8 in order */
static inline __m256i pack32(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
    const __m256i a = _mm256_packs_epi32(i0, i1), b = _mm256_packs_epi32(i2, i3);
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static void q8_0_row(const float *x, int K, int8_t *q, float *d, int32_t *s, float *s1) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int b = 0; b < K / 32; ++b) {
        const float *xb = x + 32 * b;
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8), v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        const float amax = hmax8(m);
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const float dd = amax / 127.0f;
        d[b] = qd_round_f16(dd);
        const __m256 mul = _mm256_set1_ps(id);
        const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, mul)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, mul));
        const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, mul)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, mul));
        _mm256_storeu_si256((__m256i *)(q + 32 * b), pack32(i0, i1, i2, i3));
        s[b] = hsum8i(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
        s1[b] = qd_round_f16(dd * (float)s[b]);
    }
}

static void q8_K_row(const float *x, int K, int8_t *q, float *d, int16_t *bs) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int b = 0; b < K / 256; ++b) {
        const float *xb = x + 256 * b;
        int8_t *qb = q + 256 * b;
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < 256; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)));
        const float amax = hmax8(m);
        if (amax == 0.0f) {
            d[b] = 0.0f; memset(qb, 0, 256);
            for (int j = 0; j < 16; ++j) bs[16 * b + j] = 0;
            continue;
        }
        const __m256 am = _mm256_set1_ps(amax);
        int first = 0;
        for (int j = 0; j < 256; j += 8) {
            const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)), am, _CMP_EQ_OQ));
            if (mask) { first = j + __builtin_ctz(mask); break; }
        }
        const float iscale = -127.0f / xb[first];
        const __m256 mul = _mm256_set1_ps(iscale);
        const __m256i lim = _mm256_set1_epi32(127);
        for (int j = 0; j < 256; j += 32) {
            __m256i i[4];
            for (int k = 0; k < 4; ++k)
                i[k] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 8 * k), mul)), lim);
            _mm256_storeu_si256((__m256i *)(qb + j), pack32(i[0], i[1], i[2], i[3]));
            bs[16 * b + j / 16] = (int16_t)hsum8i(_mm256_add_epi32(i[0], i[1]));
            bs[16 * b + j / 16 + 1] = (int16_t)hsum8i(_mm256_add_epi32(i[2], i[3]));
        }
        d[b] = 1.0f / iscale;
    }
}
#else
#define q8_0_row q8_0_row_scalar
#define q8_K_row q8_K_row_scalar
#endif

void qd_quant_row_q8_0(const float *x, int K, int8_t *q, float *d, int32_t *s, float *s1) { q8_0_row(x, K, q, d, s, s1); }
void qd_quant_row_q8_K(const float *x, int K, int8_t *q, float *d, int16_t *bs) { q8_K_row(x, K, q, d, bs); }

void qd_quantize_q8_0(const float *x, long ldx, int M, int K, int8_t *q, float *d, int32_t *s, float *s1, int nthreads) {
    const int nb = K / 32;
    #pragma omp parallel for schedule(static) num_threads(M >= 8 ? nthreads : 1)
    for (int m = 0; m < M; ++m)
        q8_0_row(x + (size_t)m * ldx, K, q + (size_t)m * K, d + (size_t)m * nb, s + (size_t)m * nb, s1 + (size_t)m * nb);
}

void qd_quantize_q8_K(const float *x, long ldx, int M, int K, int8_t *q, float *d, int16_t *bs, int nthreads) {
    const int nb = K / 256;
    #pragma omp parallel for schedule(static) num_threads(M >= 8 ? nthreads : 1)
    for (int m = 0; m < M; ++m) q8_K_row(x + (size_t)m * ldx, K, q + (size_t)m * K, d + (size_t)m * nb, bs + (size_t)m * K / 16);
}
