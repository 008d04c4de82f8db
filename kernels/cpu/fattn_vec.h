/* The vector helpers of llama.cpp's row-by-row CPU flash attention (ggml_vec_dot_f16 / _f32,
   ggml_vec_scale_f16 / _f32, ggml_vec_mad_f16 / _f32 in the build's vector width), shared by
   fattn.c (float caches) and kv_quant.c (quantized caches). */
#ifndef TRITIUM_FATTN_VEC_H
#define TRITIUM_FATTN_VEC_H
#include "common.h"

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
static inline float dot_row(const void *k, const void *q, int D, int f16) {
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
static inline void scale_acc(void *acc, int D, float ms, int f16) {
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
static inline void mad_acc(void *acc, const void *v, int D, float vs, int f16) {
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

/* The end of one head's one_chunk pass: ggml's attention sinks after the last key (the output times
   ms in float32, S = S ms + vs), then the output divided by S. out[D] holds VKQ32; M is the running max. */
static inline void sinks_and_normalize(float *out, int D, float S, float M, const float *sinks, int h) {
    if (sinks) {
        const float sk = sinks[h];
        float ms = 1.0f, vs = 1.0f;
        if (sk > M) {
            ms = expf(M - sk);
            for (int i = 0; i < D; ++i) out[i] *= ms;
        } else {
            vs = expf(sk - M);
        }
        S = __builtin_fmaf(S, ms, vs);
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int i = 0; i < D; ++i) out[i] *= inv;
}

#endif  /* TRITIUM_FATTN_VEC_H */
