/* Prefill on AVX-512: two panels (16 weight rows) per 512-bit vector, as always-inline templates
   (qdot_mk_avx512.c instantiates them in qdot's own order, qdot_exact.c z_mk_k with llama.cpp's
   tiled epilogue, QD_Z_TILED_K).
   Where the build has AVX-512 VNNI, prefill (weights decoded into scratch) runs the panels of an
   item in pairs: their decoded codes are interleaved once per item ([K / 4] k-groups of 64 bytes:
   panel A's 32, then panel B's 32, qd_interleave), so that one 512-bit load feeds 16 weight rows and
   every activation broadcast two panels' dot products (the 256-bit kernels of qdot_mk_avx2.h: half
   the width). Each output lane does exactly the operations of mk_a / mk_k, in the same order: same
   bits. */
#ifndef QDOT_MK_AVX512_H
#define QDOT_MK_AVX512_H
#include "qdot.h"
#include "qdot_codes.h"

#if defined(QD_ZMM)
ALWAYS __m512i z_ld2i(const int32_t *a, const int32_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}
ALWAYS __m512 z_ld2f(const float *a, const float *b) {
    return _mm512_castsi512_ps(z_ld2i((const int32_t *)a, (const int32_t *)b));
}
ALWAYS __m512i z_bcast4(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return _mm512_set1_epi32(v); }

/* 32-block types (mk_a): out [MR][16] */
ALWAYS void z_mk_a(const int type, const int MR, int off, const int has_m, const uint8_t *c2,
                   const qd_scratch *sA, const qd_scratch *sB, int nb, const qd_acts *a, int m0, float *out) {
    __m512 accf[MRMAX];
    const size_t K = (size_t)a->K;
    const int8_t *const xq0 = a->xq + (size_t)m0 * K;
    const int s8 = type == QD_Q8_0;
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    if (s8) off = 128;
    #pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) accf[m] = _mm512_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        __m512i acc[MRMAX];
        #pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_si512();
        #pragma GCC unroll 8
        for (int kg = 0; kg < 8; ++kg) {
            __m512i w = _mm512_loadu_si512((const void *)(c2 + ((size_t)b * 256 + 32 * kg) * 2));
            if (s8) w = _mm512_xor_si512(w, bias);
            #pragma GCC unroll 4
            for (int m = 0; m < MR; ++m) acc[m] = _mm512_dpbusd_epi32(acc[m], w, z_bcast4(xq0 + m * K + 32 * b + 4 * kg));
        }
        const __m512 dw = z_ld2f(sA->d + 8 * b, sB->d + 8 * b);
        #pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) {
            const size_t i = (size_t)(m0 + m) * nb + b;
            const float xd = a->xd[i];
            __m512i isum = acc[m];
            if (off) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(off * a->xs[i]));
            accf[m] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xd)), _mm512_cvtepi32_ps(isum), accf[m]);
            if (has_m)
                accf[m] = _mm512_fmadd_ps(z_ld2f(sA->dm + 8 * b, sB->dm + 8 * b), _mm512_set1_ps(xd * (float)a->xs[i]), accf[m]);
        }
    }
    #pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) _mm512_storeu_ps(out + 16 * m, accf[m]);
}

/* K-quants (mk_k): out [MR][16]; tiled: QD_Z_TILED_K / QD_Z_TILED_KM, qdot_exact.c's, as mk_k */
ALWAYS void z_mk_k(const int MR, const int nsub, const int fold, const int tiled, const uint8_t *c2,
                   const qd_scratch *sA, const qd_scratch *sB, int nb, const qd_acts *a, int m0, float *out) {
    __m512 accf[MRMAX];
    const size_t K = (size_t)a->K, K16 = K / 16;
    const int8_t *const xq0 = a->xq + (size_t)m0 * K;
    const int16_t *const bs0 = a->bsum + (size_t)m0 * K16;
    const int kgs = 64 / nsub;
    #pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) accf[m] = _mm512_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        __m512i acc[MRMAX];
        #pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_si512();
        for (int j = 0; j < nsub; ++j) {
            __m512i t[MRMAX];
            #pragma GCC unroll 4
            for (int m = 0; m < MR; ++m) t[m] = _mm512_setzero_si512();
            #pragma GCC unroll 8
            for (int kg = 0; kg < kgs; ++kg) {
                const int k = j * kgs + kg;
                const __m512i w = _mm512_loadu_si512((const void *)(c2 + ((size_t)b * 2048 + 32 * k) * 2));
                #pragma GCC unroll 4
                for (int m = 0; m < MR; ++m) t[m] = _mm512_dpbusd_epi32(t[m], w, z_bcast4(xq0 + m * K + 256 * b + 4 * k));
            }
            const __m512i scv = z_ld2i(sA->sc + (size_t)b * nsub * 8 + 8 * j, sB->sc + (size_t)b * nsub * 8 + 8 * j);
            #pragma GCC unroll 4
            for (int m = 0; m < MR; ++m) acc[m] = _mm512_add_epi32(acc[m], _mm512_mullo_epi32(t[m], scv));
        }
        const __m512 dw = z_ld2f(sA->d + 8 * b, sB->d + 8 * b);
        __m512i mn[8];
        #pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) mn[i] = z_ld2i(sA->mn + (size_t)b * 64 + 8 * i, sB->mn + (size_t)b * 64 + 8 * i);
        #pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) {
            const float xd = a->xd[(size_t)(m0 + m) * nb + b];
            const int16_t *bs = bs0 + m * K16 + 16 * b;
            __m512i mins = _mm512_setzero_si512();
            #pragma GCC unroll 8
            for (int i = 0; i < 8; ++i) {
                int32_t q; memcpy(&q, bs + 2 * i, 4);
                mins = _mm512_add_epi32(mins, _mm512_madd_epi16(mn[i], _mm512_set1_epi32(q)));
            }
            const __m512 xdv = _mm512_set1_ps(xd);
#if defined(QD_Z_TILED_K)
            if (tiled && fold) {
                accf[m] = QD_Z_TILED_K(accf[m], _mm512_sub_epi32(acc[m], mins), dw, xdv);
                continue;
            }
            if (tiled) {
                accf[m] = QD_Z_TILED_KM(accf[m], acc[m], mins, dw, z_ld2f(sA->dm + 8 * b, sB->dm + 8 * b), xdv);
                continue;
            }
#endif
            if (fold) {
                accf[m] = _mm512_fmadd_ps(_mm512_mul_ps(dw, xdv), _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[m], mins)), accf[m]);
            } else {
                accf[m] = _mm512_fmadd_ps(_mm512_mul_ps(dw, xdv), _mm512_cvtepi32_ps(acc[m]), accf[m]);
                accf[m] = _mm512_fnmadd_ps(_mm512_mul_ps(z_ld2f(sA->dm + 8 * b, sB->dm + 8 * b), xdv),
                                           _mm512_cvtepi32_ps(mins), accf[m]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) _mm512_storeu_ps(out + 16 * m, accf[m]);
}

#endif  /* QD_ZMM */
#endif  /* QDOT_MK_AVX512_H */
