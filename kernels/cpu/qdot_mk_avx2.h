/* The integer-dot micro-kernels of the 256-bit builds (AVX2, AVX-VNNI, emulated VNNI), as
   always-inline templates: qdot_mk_avx2.c instantiates them in qdot's own float order (qd_mk_panel),
   qdot_exact.c the K-quants' with llama.cpp's tiled epilogue (QD_TILED_K). Layout: qdot.h.

   Micro-kernels (8 weight rows x MR <= 4 activation rows, int32 lanes = weight rows):
   - 32-blocks (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0): per block int32 sum of code * x over 32 columns, minus
     offset * (sum of the activation codes), then y += (d_w * d_x) * isum (+ m_w * d_x * sum_x);
   - K-quants: per 256-block int32 sum over sub-blocks of scale_j * (sum of code * x), the mins /
     offsets as sum_j mn_j * bsum_j, then y += (d_w d_x) isum - (dmin_w d_x) mins.
   The int8 dot: AVX2 vpmaddubsw (u8 x s8 -> int16, summed over as many k-groups as cannot
   overflow: 8 for 4-bit codes, 4 for 5-bit, 2 for 6-bit, 1 for Q8_0 with the sign trick), then
   vpmaddwd by 1 or by the sub-block scale; VNNI vpdpbusd straight into int32 (Q8_0 codes biased
   by +128, the bias removed through the block sums), sub-block scales by vpmulld. */
#ifndef QDOT_MK_AVX2_H
#define QDOT_MK_AVX2_H
#include "qdot.h"
#include "qdot_codes.h"

#if defined(QD_AVX2)
/* Small batches stream the weights from memory once. With 4 activation rows per kernel call the
   kernels software-prefetch QD_PF bytes ahead (the panels are contiguous, so this runs on into the
   next panel's scales and codes); with 1-3 rows the hardware prefetcher alone does better. On a
   2-core AMD EPYC, the matmuls of one 1.5B-shaped Q4_K_M decode step, two builds interleaved
   (32.5 against 34.8 ms at one row, 38.3 against 39.5 at three; 47.1 against 50.3 at four the
   other way): with the scale fields read in place the kernels got fast enough that the prefetches
   only took issue slots and line-fill buffers from the demand stream. 1 KB at four rows: 4 KB was
   41-43 ms against 36-37 on that machine in the whole step, 8 KB 43, 16 KB 45. */
#ifndef QD_PF
#define QD_PF 1024
#endif
#ifndef QD_PF_MR
#define QD_PF_MR 4
#endif
ALWAYS void prefetch_ahead(const uint8_t *p, int n) {
    for (int o = 0; o < n; o += 64) _mm_prefetch((const char *)(p + QD_PF + o), _MM_HINT_T0);
}

/* 32-block types. off: offset subtracted from the codes (through the activation sums);
   chunk: k-groups summed in int16 (AVX2); has_m: Q4_1 / Q5_1 add m_w * d_x * sum_x;
   Q8_0 codes are signed (AVX2: sign trick; VNNI: +128 bias, removed through the sums). */
ALWAYS void mk_a(const int type, const int fused, const int MR, const int chunk, int off, const int has_m,
                 const uint8_t *codes, int stride, const qd_scratch *s, int nb, const qd_acts *a, int m0, float *out) {
    __m256 accf[MRMAX];
    /* rows as one base pointer + stride: x86 addressing does the rest (no pointer array to spill) */
    const size_t K = (size_t)a->K;
    const int8_t *const xq0 = a->xq + (size_t)m0 * K;
    const int s8 = type == QD_Q8_0;
    #pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) accf[m] = _mm256_setzero_ps();
#if defined(QD_VNNI)
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    if (s8) off = 128;
#else
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    for (int b = 0; b < nb; ++b) {
        __m256i acc[MRMAX];
        #pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_si256();
        if (fused && MR >= QD_PF_MR) prefetch_ahead(codes + (size_t)b * stride, stride);
#if defined(QD_VNNI)
        #pragma GCC unroll 8
        for (int kg = 0; kg < 8; ++kg) {
            __m256i w = wv(type, fused, codes, stride, stride, 32, b, kg);
            if (s8) w = _mm256_xor_si256(w, bias);
            #pragma GCC unroll 4
            for (int m = 0; m < MR; ++m) acc[m] = QD_DPBUSD(acc[m], w, bcast4(xq0 + m * K + 32 * b + 4 * kg));
        }
#else
        if (s8) {
            #pragma GCC unroll 8
            for (int kg = 0; kg < 8; ++kg) {
                const __m256i w = wv(type, fused, codes, stride, stride, 32, b, kg), aw = _mm256_sign_epi8(w, w);
                #pragma GCC unroll 4
                for (int m = 0; m < MR; ++m)
                    acc[m] = _mm256_add_epi32(acc[m], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(aw, _mm256_sign_epi8(bcast4(xq0 + m * K + 32 * b + 4 * kg), w)), ones));
            }
        } else {
            #pragma GCC unroll 2
            for (int c0 = 0; c0 < 8; c0 += chunk) {
                __m256i a16[MRMAX];
                #pragma GCC unroll 4
                for (int m = 0; m < MR; ++m) a16[m] = _mm256_setzero_si256();
                #pragma GCC unroll 8
                for (int kg = c0; kg < c0 + chunk; ++kg) {
                    const __m256i w = wv(type, fused, codes, stride, stride, 32, b, kg);
                    #pragma GCC unroll 4
                    for (int m = 0; m < MR; ++m)
                        a16[m] = _mm256_add_epi16(a16[m], _mm256_maddubs_epi16(w, bcast4(xq0 + m * K + 32 * b + 4 * kg)));
                }
                #pragma GCC unroll 4
                for (int m = 0; m < MR; ++m) acc[m] = _mm256_add_epi32(acc[m], _mm256_madd_epi16(a16[m], ones));
            }
        }
#endif
        const __m256 dw = _mm256_loadu_ps(s->d + 8 * b);
        #pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) {
            const size_t i = (size_t)(m0 + m) * nb + b;
            const float xd = a->xd[i];
            __m256i isum = acc[m];
            if (off) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(off * a->xs[i]));
            accf[m] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xd)), _mm256_cvtepi32_ps(isum), accf[m]);
            if (has_m)
                accf[m] = _mm256_fmadd_ps(_mm256_loadu_ps(s->dm + 8 * b), _mm256_set1_ps(xd * (float)a->xs[i]), accf[m]);
        }
    }
    #pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) _mm256_storeu_ps(out + 8 * m, accf[m]);
}

/* K-quants. nsub: scale sub-blocks per 256 (8: 32 columns each, 16: 16 columns each);
   chunk: k-groups summed in int16 per vpmaddwd (AVX2); fold: the mins share d (Q6_K, Q3_K);
   tiled: each block's float step is QD_TILED_K (fold types) / QD_TILED_KM (the others), llama.cpp's
   tiled K-quant order, which qdot_exact.c defines before it includes this file (qdot's own order
   leaves them undefined). */
ALWAYS void mk_k(const int type, const int fused, const int MR, const int nsub, const int chunk, const int fold,
                 const int tiled, const uint8_t *codes, int stride, const uint8_t *scl, const qd_scratch *s, int nb,
                 const qd_acts *a, int m0, float *out) {
    __m256 accf[MRMAX];
    const size_t K = (size_t)a->K, K16 = K / 16;
    const int8_t *const xq0 = a->xq + (size_t)m0 * K;
    const int16_t *const bs0 = a->bsum + (size_t)m0 * K16;
    /* code bytes of a 32-column group (the type is a constant here: the lookup folds away) */
    const int kgs = 64 / nsub, gbytes = qd_type_info(type)->codes / 8;
    const int inl = QD_INLINE_SCALES(type, fused);
    #pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) accf[m] = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        __m256i acc[MRMAX];
        #pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_si256();
        const int32_t *scb = s->sc + (size_t)b * nsub * 8;
        const uint8_t *sb = scl + (size_t)b * stride;  /* inl: this block's scale fields */
        if (fused && MR >= QD_PF_MR) prefetch_ahead(codes + (size_t)b * stride, stride);
        __m256i u[4];  /* inl 2: bytes j of lanes: u[0] sc 0-3, u[1] sc 4-7, u[2] m 0-3, u[3] m 4-7 */
        if (inl == 2) {
            const __m256i k1 = _mm256_set1_epi32(0x3f3f3f3f), k2 = _mm256_set1_epi32(0x0f0f0f0f),
                          k3 = _mm256_set1_epi32(0x03030303);
            const __m256i w0 = ldv(sb + 32), w1 = ldv(sb + 64), w2 = ldv(sb + 96);
            u[0] = _mm256_and_si256(w0, k1);
            u[1] = _mm256_or_si256(_mm256_and_si256(w2, k2), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w0, 6), k3), 4));
            u[2] = _mm256_and_si256(w1, k1);
            u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), k2),
                                   _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w1, 6), k3), 4));
        }
        #pragma GCC unroll 16
        for (int j = 0; j < nsub; ++j) {
            const __m256i scv =
                inl == 1 ? _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sb + 16 + 8 * j)))
                : inl == 2 ? _mm256_and_si256(_mm256_srli_epi32(u[j / 4], 8 * (j % 4)), _mm256_set1_epi32(0xFF))
                : _mm256_loadu_si256((const __m256i *)(scb + 8 * j));
#if defined(QD_VNNI)
            __m256i t[MRMAX];
            /* inl: the -32 offset of the codes starts each sub-block's sum (scale * (sum c x - 32 sum x)
               is the same integer as the folded mins below) */
            #pragma GCC unroll 4
            for (int m = 0; m < MR; ++m)
                t[m] = inl == 1 ? _mm256_set1_epi32(a->boff[(size_t)(m0 + m) * K16 + 16 * b + j]) : _mm256_setzero_si256();
            #pragma GCC unroll 8
            for (int kg = 0; kg < kgs; ++kg) {
                const int k = j * kgs + kg;
                const __m256i w = wv(type, fused, codes, stride, gbytes, 256, b, k);
                #pragma GCC unroll 4
                for (int m = 0; m < MR; ++m) t[m] = QD_DPBUSD(t[m], w, bcast4(xq0 + m * K + 256 * b + 4 * k));
            }
            #pragma GCC unroll 4
            for (int m = 0; m < MR; ++m) acc[m] = _mm256_add_epi32(acc[m], _mm256_mullo_epi32(t[m], scv));
#else
            #pragma GCC unroll 4
            for (int c0 = 0; c0 < kgs; c0 += chunk) {
                __m256i a16[MRMAX];
                #pragma GCC unroll 4
                for (int m = 0; m < MR; ++m) a16[m] = _mm256_setzero_si256();
                #pragma GCC unroll 8
                for (int kg = c0; kg < c0 + chunk; ++kg) {
                    const int k = j * kgs + kg;
                    const __m256i w = wv(type, fused, codes, stride, gbytes, 256, b, k);
                    #pragma GCC unroll 4
                    for (int m = 0; m < MR; ++m)
                        a16[m] = _mm256_add_epi16(a16[m], _mm256_maddubs_epi16(w, bcast4(xq0 + m * K + 256 * b + 4 * k)));
                }
                #pragma GCC unroll 4
                for (int m = 0; m < MR; ++m) acc[m] = _mm256_add_epi32(acc[m], _mm256_madd_epi16(a16[m], scv));
            }
#endif
        }
        const __m256 dw = inl ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sb)) : _mm256_loadu_ps(s->d + 8 * b);
        const int32_t *mnb = s->mn + (size_t)b * 64;
        #pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) {
            const float xd = a->xd[(size_t)(m0 + m) * nb + b];
#if defined(QD_TILED_K)
            if (inl == 1 && tiled) {  /* Q6_K: the -32 offsets are in acc already */
                accf[m] = QD_TILED_K(accf[m], acc[m], dw, _mm256_set1_ps(xd));
                continue;
            }
#endif
            if (inl == 1) {
                accf[m] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xd)), _mm256_cvtepi32_ps(acc[m]), accf[m]);
                continue;
            }
#if defined(QD_VNNI)
            if (inl == 2) {  /* mins = sum_j m_j (128 hi_j + lo_j) */
                const int8_t *bm = a->bm + ((size_t)(m0 + m) * nb + b) * 16;
                const __m256i z = _mm256_setzero_si256();
                const __m256i lo = QD_DPBUSD(QD_DPBUSD(z, u[2], bcast4(bm)), u[3], bcast4(bm + 4));
                const __m256i hi = QD_DPBUSD(QD_DPBUSD(z, u[2], bcast4(bm + 8)), u[3], bcast4(bm + 12));
                const __m256i mins = _mm256_add_epi32(lo, _mm256_slli_epi32(hi, 7));
                const __m256 xdv = _mm256_set1_ps(xd);
                const __m256 dmw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + 16)));
#if defined(QD_TILED_KM)
                if (tiled) {
                    accf[m] = QD_TILED_KM(accf[m], acc[m], mins, dw, dmw, xdv);
                    continue;
                }
#endif
                accf[m] = _mm256_fmadd_ps(_mm256_mul_ps(dw, xdv), _mm256_cvtepi32_ps(acc[m]), accf[m]);
                accf[m] = _mm256_fnmadd_ps(_mm256_mul_ps(dmw, xdv), _mm256_cvtepi32_ps(mins), accf[m]);
                continue;
            }
#endif
            const int16_t *bs = bs0 + m * K16 + 16 * b;
            __m256i mins = _mm256_setzero_si256();
            #pragma GCC unroll 8
            for (int i = 0; i < 8; ++i) {
                int32_t p; memcpy(&p, bs + 2 * i, 4);
                mins = _mm256_add_epi32(mins, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(mnb + 8 * i)),
                                                                _mm256_set1_epi32(p)));
            }
            const __m256 xdv = _mm256_set1_ps(xd);
#if defined(QD_TILED_K)
            if (tiled && fold) {
                accf[m] = QD_TILED_K(accf[m], _mm256_sub_epi32(acc[m], mins), dw, xdv);
                continue;
            }
            if (tiled) {
                accf[m] = QD_TILED_KM(accf[m], acc[m], mins, dw, _mm256_loadu_ps(s->dm + 8 * b), xdv);
                continue;
            }
#endif
            if (fold) {
                accf[m] = _mm256_fmadd_ps(_mm256_mul_ps(dw, xdv), _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[m], mins)), accf[m]);
            } else {
                accf[m] = _mm256_fmadd_ps(_mm256_mul_ps(dw, xdv), _mm256_cvtepi32_ps(acc[m]), accf[m]);
                accf[m] = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(s->dm + 8 * b), xdv), _mm256_cvtepi32_ps(mins), accf[m]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) _mm256_storeu_ps(out + 8 * m, accf[m]);
}

#endif  /* QD_AVX2 */
#endif  /* QDOT_MK_AVX2_H */
