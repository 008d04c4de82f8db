/* Shared by the CPU kernels (kernels/cpu/*.c): 16-float vectors and their loads. */
#ifndef TRITIUM_CPU_COMMON_H
#define TRITIUM_CPU_COMMON_H
#include <math.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
typedef float v16 __attribute__((vector_size(64)));

static inline v16 ld(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }

/* float16 tiles and cache rows widened to float32 exactly (16 at a time). */
#if defined(__AVX512F__)
static inline v16 ldh(const unsigned short *p) { return (v16)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
#elif defined(__F16C__) && defined(__AVX__)
static inline v16 ldh(const unsigned short *p) {
    __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
    v16 v; memcpy(&v, &lo, 32); memcpy((char *)&v + 32, &hi, 32); return v;
}
#else
static inline v16 ldh(const unsigned short *p) {
    _Float16 h[16]; float f[16]; memcpy(h, p, sizeof h);
    for (int i = 0; i < 16; ++i) f[i] = (float)h[i];
    v16 v; memcpy(&v, f, sizeof v); return v;
}
#endif
#endif  /* TRITIUM_CPU_COMMON_H */
