/* Shared by the CPU kernels (the C files of kernels/cpu): vectors of the build's natural width (vf, VW floats:
   16 with AVX-512, 8 with AVX2 + FMA, 4 otherwise) and their loads; fma_v, one rounding per lane on
   every build (so every build computes the same bits); and the older 16-float v16 of qgemv.c. */
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

/* ---- natural-width vectors (gemv.c, attention.c) ---------------------------------------------- */
#if defined(__AVX512F__) && defined(__FMA__) && defined(__F16C__)
#define VW 16
#define ISA_NAME "avx512"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define VW 8
#define ISA_NAME "avx2"
#else
#define VW 4
#define ISA_NAME "scalar"
#endif
typedef float vf __attribute__((vector_size(VW * 4)));
typedef int vi __attribute__((vector_size(VW * 4)));

static inline vf ldv(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void stv(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf splat(float s) {
#if VW == 16
    return (vf)_mm512_set1_ps(s);
#elif VW == 8
    return (vf)_mm256_set1_ps(s);
#else
    vf v;
    for (int i = 0; i < VW; ++i) v[i] = s;
    return v;
#endif
}

/* a * b + c rounded once per lane. */
static inline vf fma_v(vf a, vf b, vf c) {
#if VW == 16
    return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif VW == 8
    return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    vf r;
    for (int i = 0; i < VW; ++i) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
    return r;
#endif
}

/* VW float16 / bfloat16 values widened to float32 exactly. */
static inline vf ldv_f16(const unsigned short *p) {
#if VW == 16
    return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif VW == 8
    return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    _Float16 h[VW]; vf v; memcpy(h, p, sizeof h);
    for (int i = 0; i < VW; ++i) v[i] = (float)h[i];
    return v;
#endif
}
static inline vf ldv_bf16(const unsigned short *p) {
#if VW == 16
    return (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
#elif VW == 8
    return (vf)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16);
#else
    unsigned short h[VW]; vi w; memcpy(h, p, sizeof h);
    for (int i = 0; i < VW; ++i) w[i] = (int)((unsigned)h[i] << 16);
    return (vf)w;
#endif
}
#endif  /* TRITIUM_CPU_COMMON_H */
