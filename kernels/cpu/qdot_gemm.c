/* Integer-dot matmul y[M][N] = x[M][K] . W[N][K]^T on x8 panels (qdot.h) and quantized
   activations (qdot_quant.c).

   Driver: OpenMP over groups of panels. A thread decodes the panels of its group once into
   scratch (codes + scales, L1/L2 resident) and then runs every activation row over them, 4 rows
   per micro-kernel call: one pass over the weights in memory per call whatever the batch (decode
   steps of 1..n sequences), and for prefill a cache-blocked GEMM (group of panels in L2, 4
   activation rows in L1).

   Micro-kernels (8 weight rows x MR <= 4 activation rows, int32 lanes = weight rows):
   - 32-blocks (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0): per block int32 sum of code * x over 32 columns, minus
     offset * (sum of the activation codes), then y += (d_w * d_x) * isum (+ m_w * d_x * sum_x);
   - K-quants: per 256-block int32 sum over sub-blocks of scale_j * (sum of code * x), the mins /
     offsets as sum_j mn_j * bsum_j, then y += (d_w d_x) isum - (dmin_w d_x) mins.
   The int8 dot: AVX2 vpmaddubsw (u8 x s8 -> int16, summed over as many k-groups as cannot
   overflow: 8 for 4-bit codes, 4 for 5-bit, 2 for 6-bit, 1 for Q8_0 with the sign trick), then
   vpmaddwd by 1 or by the sub-block scale; VNNI vpdpbusd straight into int32 (Q8_0 codes biased
   by +128, the bias removed through the block sums), sub-block scales by vpmulld. */
#include "qdot.h"
#include "qdot_codes.h"
#include <omp.h>

#define MRMAX 4
#define QD_GROUP_MAX 8  /* weights in one qd_group (qdot_lib.GROUP_MAX) */

/* Small batches of the K-quants on VNNI read the scale fields straight from the panel (each block's
   just before its codes, qdot.h) instead of a decoded copy in scratch: no round trip through
   memory. 1: Q6_K (one vpmovsxbd per
   sub-block; each sub-block's int32 sum starts at -32 * its activation sum, so no mins pass);
   2: Q4_K / Q5_K (the 6-bit fields unpacked in registers; the mins by four vpdpbusd against the
   sub-block sums split into bytes). The same integers as the scratch path: the same bits. */
#if defined(QD_VNNI)
#define QD_INLINE_SCALES(type, fused) \
    ((fused) ? (type) == QD_Q6_K ? 1 : ((type) == QD_Q4_K || (type) == QD_Q5_K) ? 2 : 0 : 0)
#else
#define QD_INLINE_SCALES(type, fused) 0
#endif


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
   chunk: k-groups summed in int16 per vpmaddwd (AVX2); fold: the mins share d (Q6_K, Q3_K). */
ALWAYS void mk_k(const int type, const int fused, const int MR, const int nsub, const int chunk, const int fold,
                 const uint8_t *codes, int stride, const uint8_t *scl, const qd_scratch *s, int nb, const qd_acts *a,
                 int m0, float *out) {
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
            if (inl == 1 && a->exact && a->M >= 8) {  /* Q6_K, llama.cpp's tiled order (qdot_exact.c) */
                accf[m] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[m]), dw), _mm256_set1_ps(xd), accf[m]);
                continue;
            }
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
            if (fold && a->exact && a->M >= 8) {  /* Q6_K / Q3_K, llama.cpp's tiled order (qdot_exact.c) */
                const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[m], mins)), dw);
                accf[m] = _mm256_fmadd_ps(t, xdv, accf[m]);
            } else if (fold) {
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

/* Every type's micro-kernel parameters, once for both drivers below:
   32-blocks A(type, chunk, off, has_m), K-quants K(type, nsub, chunk, fold) (see mk_a / mk_k). */
#define QD_TYPE_TABLE(A, K) \
    A(QD_Q4_0, 8, 8, 0) A(QD_Q4_1, 8, 0, 1) A(QD_Q5_0, 4, 16, 0) A(QD_Q5_1, 4, 0, 1) A(QD_Q8_0, 1, 0, 0) \
    K(QD_Q2_K, 16, 4, 0) K(QD_Q3_K, 16, 4, 1) K(QD_Q4_K, 8, 8, 0) K(QD_Q5_K, 8, 4, 0) K(QD_Q6_K, 16, 2, 1)

/* F(n, ...) with the row count n = MR as a constant (1..4) */
#define MR_SWITCH(F, ...) switch (MR) { case 1: F(1, __VA_ARGS__); break; case 2: F(2, __VA_ARGS__); break; \
                                        case 3: F(3, __VA_ARGS__); break; default: F(4, __VA_ARGS__); }

static void run_panel(int type, int fused, int MR, const uint8_t *c, int stride, const uint8_t *scl,
                      const qd_scratch *s, int nb, const qd_acts *a, int m0, float *out) {
#define MKA(n, T, f, chunk, off, hm) mk_a(T, f, n, chunk, off, hm, c, stride, s, nb, a, m0, out)
#define MKK(n, T, f, nsub, chunk, fold) mk_k(T, f, n, nsub, chunk, fold, c, stride, scl, s, nb, a, m0, out)
#define A_CASE(T, chunk, off, hm) \
    case T: if (fused) MR_SWITCH(MKA, T, 1, chunk, off, hm) else MR_SWITCH(MKA, T, 0, chunk, off, hm) break;
#define K_CASE(T, nsub, chunk, fold) \
    case T: if (fused) MR_SWITCH(MKK, T, 1, nsub, chunk, fold) else MR_SWITCH(MKK, T, 0, nsub, chunk, fold) break;
    switch (type) { QD_TYPE_TABLE(A_CASE, K_CASE) }
#undef MKA
#undef MKK
#undef A_CASE
#undef K_CASE
}

/* ---- prefill on AVX-512: two panels (16 weight rows) per 512-bit vector ----------------------
   Where the build has AVX-512 VNNI, prefill (weights decoded into scratch) runs the panels of an
   item in pairs: their decoded codes are interleaved once per item ([K / 4] k-groups of 64 bytes:
   panel A's 32, then panel B's 32), so that one 512-bit load feeds 16 weight rows and every
   activation broadcast two panels' dot products (the 256-bit kernels above: half the width).
   Each output lane does exactly the operations of mk_a / mk_k, in the same order: same bits. */
#if defined(QD_VNNI) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define QD_ZMM 1

ALWAYS __m512i z_ld2i(const int32_t *a, const int32_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}
ALWAYS __m512 z_ld2f(const float *a, const float *b) {
    return _mm512_castsi512_ps(z_ld2i((const int32_t *)a, (const int32_t *)b));
}
ALWAYS __m512i z_bcast4(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return _mm512_set1_epi32(v); }

/* codes of panels A and B ([K / 4][32] each) -> dst [K / 4][64] */
static void z_interleave(const uint8_t *A, const uint8_t *B, int K, uint8_t *dst) {
    for (int k = 0; k < K / 4; ++k) {
        _mm256_storeu_si256((__m256i *)(dst + 64 * (size_t)k), _mm256_loadu_si256((const __m256i *)(A + 32 * (size_t)k)));
        _mm256_storeu_si256((__m256i *)(dst + 64 * (size_t)k + 32), _mm256_loadu_si256((const __m256i *)(B + 32 * (size_t)k)));
    }
}

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

/* K-quants (mk_k): out [MR][16] */
ALWAYS void z_mk_k(const int MR, const int nsub, const int fold, const uint8_t *c2,
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
            if (fold && a->exact && a->M >= 8) {  /* Q6_K / Q3_K, llama.cpp's tiled order (qdot_exact.c) */
                const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[m], mins)), dw);
                accf[m] = _mm512_fmadd_ps(t, xdv, accf[m]);
            } else if (fold) {
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

/* Q4_K in llama.cpp's float order (qdot_exact.c: q4_K_8x8 gemm for the first M - M % 4 rows, a
   float step per 64 columns, gemv for the others, per 256; the mins in their own accumulator):
   the integers of z_mk_k, its float epilogue per row. out [MR][16]. */
ALWAYS void z_mk_q4k_exact(const int MR, const uint8_t *c2, const qd_scratch *sA, const qd_scratch *sB, int nb,
                           const qd_acts *a, int m0, float *out) {
    __m512 accf[MRMAX], accm[MRMAX];
    const size_t K = (size_t)a->K, K16 = K / 16;
    const int8_t *const xq0 = a->xq + (size_t)m0 * K;
    const int16_t *const bs0 = a->bsum + (size_t)m0 * K16;
    const int gemm_rows = a->M - a->M % 4;
    #pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) accf[m] = accm[m] = _mm512_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        const __m512 dw = z_ld2f(sA->d + 8 * b, sB->d + 8 * b), dmw = z_ld2f(sA->dm + 8 * b, sB->dm + 8 * b);
        __m512i acc[MRMAX], mins[MRMAX];
        #pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) acc[m] = mins[m] = _mm512_setzero_si512();
        for (int j = 0; j < 8; ++j) {
            __m512i t[MRMAX];
            #pragma GCC unroll 4
            for (int m = 0; m < MR; ++m) t[m] = _mm512_setzero_si512();
            #pragma GCC unroll 8
            for (int kg = 0; kg < 8; ++kg) {
                const int k = j * 8 + kg;
                const __m512i w = _mm512_loadu_si512((const void *)(c2 + ((size_t)b * 2048 + 32 * k) * 2));
                #pragma GCC unroll 4
                for (int m = 0; m < MR; ++m) t[m] = _mm512_dpbusd_epi32(t[m], w, z_bcast4(xq0 + m * K + 256 * b + 4 * k));
            }
            const __m512i scv = z_ld2i(sA->sc + (size_t)b * 64 + 8 * j, sB->sc + (size_t)b * 64 + 8 * j);
            const __m512i mnv = z_ld2i(sA->mn + (size_t)b * 64 + 8 * j, sB->mn + (size_t)b * 64 + 8 * j);
            #pragma GCC unroll 4
            for (int m = 0; m < MR; ++m) {
                int32_t q; memcpy(&q, bs0 + m * K16 + 16 * b + 2 * j, 4);
                acc[m] = _mm512_add_epi32(acc[m], _mm512_mullo_epi32(t[m], scv));
                mins[m] = _mm512_add_epi32(mins[m], _mm512_madd_epi16(mnv, _mm512_set1_epi32(q)));
            }
            #pragma GCC unroll 4
            for (int m = 0; m < MR; ++m)
                if ((j & 1 && m0 + m < gemm_rows) || j == 7) {  /* gemm: every 2 sub-blocks; gemv: the block */
                    const __m512 xdv = _mm512_set1_ps(a->xd[(size_t)(m0 + m) * nb + b]);
                    accf[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[m]), _mm512_mul_ps(dw, xdv), accf[m]);
                    accm[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins[m]), _mm512_mul_ps(dmw, xdv), accm[m]);
                    acc[m] = mins[m] = _mm512_setzero_si512();
                }
        }
    }
    #pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) _mm512_storeu_ps(out + 16 * m, _mm512_sub_ps(accf[m], accm[m]));
}

/* A pair of panels: interleaved codes c2, scratch sA / sB -> out [MR][16]. */
static void run_pair(int type, int MR, const uint8_t *c2, const qd_scratch *sA, const qd_scratch *sB, int nb,
                     const qd_acts *a, int m0, float *out) {
#define Q4KX(n, unused) z_mk_q4k_exact(n, c2, sA, sB, nb, a, m0, out)
    if (type == QD_Q4_K && a->exact) {
        MR_SWITCH(Q4KX, 0)
        return;
    }
#undef Q4KX
#define ZMKA(n, T, off, hm) z_mk_a(T, n, off, hm, c2, sA, sB, nb, a, m0, out)
#define ZMKK(n, nsub, fold) z_mk_k(n, nsub, fold, c2, sA, sB, nb, a, m0, out)
#define A_CASE(T, chunk, off, hm) case T: MR_SWITCH(ZMKA, T, off, hm) break;
#define K_CASE(T, nsub, chunk, fold) case T: MR_SWITCH(ZMKK, nsub, fold) break;
    switch (type) { QD_TYPE_TABLE(A_CASE, K_CASE) }
#undef ZMKA
#undef ZMKK
#undef A_CASE
#undef K_CASE
}
#endif  /* QD_ZMM */

#else  /* ------------------------------------------------------------------ portable */

static void run_panel(int type, int fused, int MR, const uint8_t *c, int stride, const uint8_t *scl,
                      const qd_scratch *s, int nb, const qd_acts *a, int m0, float *out) {
    (void)fused; (void)stride; (void)scl;  /* the portable build always decodes into scratch */
    const qd_type *t = qd_type_info(type);
    const int K = a->K;
    for (int m = 0; m < MR; ++m) {
        const int8_t *x = a->xq + (size_t)(m0 + m) * K;
        float acc[8] = {0};
        for (int b = 0; b < nb; ++b) {
            const size_t ib = (size_t)(m0 + m) * nb + b;
            const float xd = a->xd[ib];
            for (int r = 0; r < 8; ++r) {
                if (!t->kq) {
                    int isum = 0;
                    for (int k = 0; k < 32; ++k) {
                        const uint8_t cv = c[(size_t)(b * 8 + k / 4) * 32 + 4 * r + k % 4];
                        isum += (type == QD_Q8_0 ? (int)(int8_t)cv : (int)cv) * x[32 * b + k];
                    }
                    const int off = type == QD_Q4_0 ? 8 : type == QD_Q5_0 ? 16 : 0;
                    isum -= off * a->xs[ib];
                    acc[r] += (s->d[8 * b + r] * xd) * (float)isum;
                    if (type == QD_Q4_1 || type == QD_Q5_1) acc[r] += s->dm[8 * b + r] * (xd * (float)a->xs[ib]);
                } else {
                    const int kgs = 64 / t->nsub;
                    int isum = 0, mins = 0;
                    for (int j = 0; j < t->nsub; ++j) {
                        int sub = 0;
                        for (int k = 4 * j * kgs; k < 4 * (j + 1) * kgs; ++k)
                            sub += c[(size_t)(b * 64 + k / 4) * 32 + 4 * r + k % 4] * x[256 * b + k];
                        isum += s->sc[((size_t)b * t->nsub + j) * 8 + r] * sub;
                    }
                    const int16_t *bs = a->bsum + (size_t)(m0 + m) * (K / 16) + 16 * b;
                    for (int i = 0; i < 8; ++i) {
                        const int32_t p = s->mn[(size_t)b * 64 + 8 * i + r];
                        mins += (int16_t)(p & 0xFFFF) * bs[2 * i] + (int16_t)((uint32_t)p >> 16) * bs[2 * i + 1];
                    }
                    if ((type == QD_Q6_K || type == QD_Q3_K) && a->exact && a->M >= 8)  /* llama.cpp's tiled order */
                        acc[r] = fmaf((float)(isum - mins) * s->d[8 * b + r], xd, acc[r]);
                    else if (type == QD_Q6_K || type == QD_Q3_K) acc[r] += (s->d[8 * b + r] * xd) * (float)(isum - mins);
                    else acc[r] += (s->d[8 * b + r] * xd) * (float)isum - (s->dm[8 * b + r] * xd) * (float)mins;
                }
            }
        }
        memcpy(out + 8 * m, acc, sizeof acc);
    }
}
#endif

/* thread-local scratch, grown on demand */
static __thread uint8_t *tl_buf, *tl_act;
static __thread size_t tl_cap, tl_act_cap;
static __thread __attribute__((unused)) uint8_t *tl_pair, *tl_boff, *tl_bm;  /* vector builds only */
static __thread __attribute__((unused)) size_t tl_pair_cap, tl_boff_cap, tl_bm_cap;

static void *tl_grow(uint8_t **buf, size_t *cap, size_t need) {
    if (*cap < need) {
        free(*buf);
        *buf = (uint8_t *)aligned_alloc(64, (need + 63) & ~(size_t)63);
        *cap = *buf ? need : 0;
    }
    return *buf;
}

static size_t scratch_bytes(int K, int nb) {
    return ((size_t)K * 8 + sizeof(float) * 16 * nb + sizeof(int32_t) * (128 + 64) * nb + 63) & ~(size_t)63;
}

static qd_scratch scratch_at(uint8_t *base, int K, int nb) {
    qd_scratch s;
    s.codes = base;
    s.d = (float *)(base + (size_t)K * 8);
    s.dm = s.d + 8 * nb;
    s.sc = (int32_t *)(s.dm + 8 * nb);
    s.mn = s.sc + 128 * nb;
    return s;
}

/* One matmul of a call: weight W (x8 panels, `type`, N x K) -> y columns [0, N) (ldy). */
typedef struct {
    int type, N;
    const uint8_t *W;
    float *y;
    long ldy;
} qd_job;

/* Panels per work item: the decoded scratch of an item kept within ~192 KB of L2 for many rows. */
#ifndef QD_FUSED_MAX
#define QD_FUSED_MAX 8  /* up to this many rows: codes decoded in registers, once per MRMAX rows */
#endif
static int panels_per_item(int K, int nb) {
    int G = (int)((192 * 1024) / scratch_bytes(K, nb));
#if defined(QD_ZMM)
    G = G / 2 * 2;  /* whole pairs (plus their interleaved codes: ~1.5x the scratch in L2) */
    return G < 2 ? 2 : G > 16 ? 16 : G;
#else
    return G < 1 ? 1 : G > 16 ? 16 : G;
#endif
}

#if defined(QD_AVX2)
#define QD_FUSED(M) ((M) <= QD_FUSED_MAX)
#else
#define QD_FUSED(M) 0  /* the portable build always decodes into scratch */
#endif

/* Runs inside a parallel region, for more than QD_FUSED_MAX rows: this thread's share of the work
   items of all jobs, split by weight bytes (jobs of different types and sizes balance). The panels
   of an item are decoded once into scratch, then read by every MRMAX rows. */
static void run_jobs(const qd_job *jobs, int nj, int K, const qd_acts *a8_0, const qd_acts *a8_K, int M) {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    double total = 0;
    for (int j = 0; j < nj; ++j) {
        const qd_type *t = qd_type_info(jobs[j].type);
        total += (double)((jobs[j].N + 7) / 8) * (double)qd_panel_bytes(t, K);
    }
    const double lo = total * tid / nt, hi = total * (tid + 1) / nt;
    double at = 0;
    for (int j = 0; j < nj; ++j) {
        const qd_job *jb = &jobs[j];
        const qd_type *t = qd_type_info(jb->type);
        const qd_acts *a = t->kq ? a8_K : a8_0;
        const int nb = K / t->bs, np = (jb->N + 7) / 8, G = panels_per_item(K, nb);
        const size_t pb = qd_panel_bytes(t, K), sb = scratch_bytes(K, nb);
        const double jbytes = (double)np * (double)pb;
        if (at + jbytes <= lo || at >= hi) { at += jbytes; continue; }
        /* items whose middle byte falls in [lo, hi) */
        const int ni = (np + G - 1) / G;
        int i0 = 0, i1 = ni;
#define MID(i) (at + ((double)(i) * G + 0.5 * (np - (i) * G < G ? np - (i) * G : G)) * (double)pb)
        while (i0 < ni && MID(i0) < lo) ++i0;
        while (i1 > i0 && MID(i1 - 1) >= hi) --i1;
#undef MID
        at += jbytes;
        if (i0 >= i1) continue;
        uint8_t *buf = (uint8_t *)tl_grow(&tl_buf, &tl_cap, sb * (size_t)G + 64);
        /* panels in llama.cpp's float order through qdot_exact.c, except where the integer-dot kernels
           have its epilogue: Q6_K from 8 rows (mk_k / z_mk_k), Q4_K in AVX-512 pairs (z_mk_q4k_exact) */
        const int exact = qd_exact_route(a, jb->type);
#if defined(QD_ZMM)
        const int pair_ok = !exact || (jb->type == QD_Q4_K && a->exact == 1);
#endif
        qd_scratch sc[16];
        const uint8_t *codes[16];
        for (int g = 0; g < G; ++g) sc[g] = scratch_at(buf + sb * (size_t)g, K, nb);
        for (int it = i0; it < i1; ++it) {
            const int p0 = it * G, p1 = p0 + G < np ? p0 + G : np;
            for (int p = p0; p < p1; ++p) codes[p - p0] = qd_decode_panel(t, jb->W + (size_t)p * pb, K, &sc[p - p0]);
#if defined(QD_ZMM)
            uint8_t *pairs = NULL;
            if (p1 - p0 >= 2 && pair_ok) {
                pairs = (uint8_t *)tl_grow(&tl_pair, &tl_pair_cap, (size_t)(G / 2) * K * 16 + 64);
                for (int p = p0; p + 1 < p1; p += 2)
                    z_interleave(codes[p - p0], codes[p + 1 - p0], K, pairs + (size_t)((p - p0) / 2) * K * 16);
            }
#endif
            for (int m0 = 0; m0 < M; m0 += MRMAX) {
                const int MR = M - m0 < MRMAX ? M - m0 : MRMAX;
                int p = p0;
#if defined(QD_ZMM)
                for (; pairs && p + 1 < p1; p += 2) {
                    float out[MRMAX * 16];
                    run_pair(jb->type, MR, pairs + (size_t)((p - p0) / 2) * K * 16, &sc[p - p0], &sc[p + 1 - p0], nb, a, m0, out);
                    for (int q = 0; q < 2; ++q) {
                        const int n0 = 8 * (p + q), nn = jb->N - n0 < 8 ? jb->N - n0 : 8;
                        for (int m = 0; m < MR; ++m)
                            memcpy(jb->y + (size_t)(m0 + m) * jb->ldy + n0, out + 16 * m + 8 * q, sizeof(float) * nn);
                    }
                }
#endif
                for (; p < p1; ++p) {
                    float out[MRMAX * 8];
                    if (exact)
                        qd_exact_panel(jb->type, 0, codes[p - p0], (int)qd_block_stride(t), &sc[p - p0], nb, a, m0, MR,
                                       out, a->exact == 2);
                    else
                        run_panel(jb->type, 0, MR, codes[p - p0], (int)qd_block_stride(t), jb->W + (size_t)p * pb,
                                  &sc[p - p0], nb, a, m0, out);
                    const int n0 = 8 * p, nn = jb->N - n0 < 8 ? jb->N - n0 : 8;
                    for (int m = 0; m < MR; ++m) memcpy(jb->y + (size_t)(m0 + m) * jb->ldy + n0, out + 8 * m, sizeof(float) * nn);
                }
            }
        }
    }
}

/* The work split of the small batches (qdot_sched.c): this thread's range of the jobs' panels. */
static void init_range(const qd_job *jobs, int nj, int K, qd_range *ranges) {
    int np[QD_GROUP_MAX];
    size_t pb[QD_GROUP_MAX];
    for (int j = 0; j < nj; ++j) {
        np[j] = (jobs[j].N + 7) / 8;
        pb[j] = qd_panel_bytes(qd_type_info(jobs[j].type), K);
    }
    const int tid = omp_get_thread_num();
    qd_range_init(&ranges[tid], np, pb, nj, tid, omp_get_num_threads());
}

#if defined(QD_AVX2)
#ifndef QD_CHUNK_BYTES
#define QD_CHUNK_BYTES 65536  /* weight bytes per take from a thread's own range (qdot_sched.c) */
#endif
/* Runs inside a parallel region, up to QD_FUSED_MAX rows, after every thread's init_range: panels
   from the front of this thread's range, QD_CHUNK_BYTES of weights per take, then one at a time
   from the back of the others' (qdot_sched.c); each
   panel's codes decoded in registers (one read of the weights from memory; a second group of MRMAX
   rows finds the panel in L1/L2). */
static void run_fused(const qd_job *jobs, int nj, int K, const qd_acts *a8_0, const qd_acts *a8_K, int M,
                      qd_range *ranges) {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    /* K-quants whose kernels read the scale fields in place take the activation sums in their own
       form (qd_acts), made once per call by each thread */
    qd_acts aK = *a8_K;
    int need1 = 0, need2 = 0;
    long start[QD_GROUP_MAX + 1];
    size_t sbmax = 0, pbmin = SIZE_MAX;
    start[0] = 0;
    for (int j = 0; j < nj; ++j) {
        const qd_type *t = qd_type_info(jobs[j].type);
        const int inl = QD_INLINE_SCALES(jobs[j].type, 1);
        need1 |= inl == 1;
        need2 |= inl == 2;
        start[j + 1] = start[j] + (jobs[j].N + 7) / 8;
        const size_t sb = scratch_bytes(K, K / t->bs), pb = qd_panel_bytes(t, K);
        sbmax = sb > sbmax ? sb : sbmax;
        pbmin = pb < pbmin ? pb : pbmin;
    }
    const size_t n16 = (size_t)M * (K / 16);
    if (need1) {
        int32_t *bo = (int32_t *)tl_grow(&tl_boff, &tl_boff_cap, 4 * n16);
        for (size_t i = 0; i < n16; ++i) bo[i] = -32 * (int32_t)a8_K->bsum[i];
        aK.boff = bo;
    }
    if (need2) {
        int8_t *bm = (int8_t *)tl_grow(&tl_bm, &tl_bm_cap, n16);
        for (size_t i = 0; i < n16 / 16; ++i)
            for (int j = 0; j < 8; ++j) {
                const int sj = a8_K->bsum[16 * i + 2 * j] + a8_K->bsum[16 * i + 2 * j + 1];  /* |sj| <= 32 * 128 */
                bm[16 * i + j] = (int8_t)(sj & 127);
                bm[16 * i + 8 + j] = (int8_t)(sj >> 7);
            }
        aK.bm = bm;
    }
    uint8_t *buf = (uint8_t *)tl_grow(&tl_buf, &tl_cap, sbmax + 64);
    const int chunk = pbmin >= QD_CHUNK_BYTES ? 1 : (int)(QD_CHUNK_BYTES / pbmin);
    long gi = 0;
    int left = 0, j = 0;
    for (;; ++gi, --left) {
        if (left == 0) {  /* the next panels of this thread's range, or one from the back of another's */
            gi = qd_take_front(&ranges[tid], chunk, &left);
            for (int v = 1; gi < 0 && v < nt; ++v) {
                gi = qd_take_back(&ranges[(tid + v) % nt]);
                left = 1;
            }
            if (gi < 0) break;
            j = 0;
        }
        while (gi >= start[j + 1]) ++j;
        const qd_job *jb = &jobs[j];
        const qd_type *t = qd_type_info(jb->type);
        const qd_acts *a = t->kq ? &aK : a8_0;
        const int nb = K / t->bs, p = (int)(gi - start[j]);
        const uint8_t *panel = jb->W + (size_t)p * qd_panel_bytes(t, K);
        qd_scratch sc = scratch_at(buf, K, nb);
        const int exact = qd_exact_route(a, jb->type);
        const uint8_t *codes;
        if (exact && a->exact == 2) codes = qd_decode_panel(t, panel, K, &sc);  /* the reference reads scratch */
        else {
            if (exact || !QD_INLINE_SCALES(jb->type, 1)) qd_decode_scales(t, panel, K, &sc);
            codes = qd_codes_at(t, panel, 0);
        }
        for (int m0 = 0; m0 < M; m0 += MRMAX) {
            const int MR = M - m0 < MRMAX ? M - m0 : MRMAX;
            float out[MRMAX * 8];
            if (exact) qd_exact_panel(jb->type, a->exact != 2, codes, (int)qd_block_stride(t), &sc, nb, a, m0, MR, out,
                                      a->exact == 2);
            else run_panel(jb->type, 1, MR, codes, (int)qd_block_stride(t), panel, &sc, nb, a, m0, out);
            const int n0 = 8 * p, nn = jb->N - n0 < 8 ? jb->N - n0 : 8;
            for (int m = 0; m < MR; ++m) memcpy(jb->y + (size_t)(m0 + m) * jb->ldy + n0, out + 8 * m, sizeof(float) * nn);
        }
    }
}
#else
static void run_fused(const qd_job *jobs, int nj, int K, const qd_acts *a8_0, const qd_acts *a8_K, int M,
                      qd_range *ranges) {
    (void)jobs; (void)nj; (void)K; (void)a8_0; (void)a8_K; (void)M; (void)ranges;  /* QD_FUSED is 0 */
}
#endif

static int threads_for(double bytes, int M, int nthreads) {
    /* below ~64 KB of weights a second thread costs more than it saves */
    nthreads = nthreads < QD_MAX_THREADS ? nthreads : QD_MAX_THREADS;
    return bytes * (M < 4 ? M : 4) < 65536.0 ? 1 : nthreads;
}

/* y[m * ldy + n] for m < M, n < N. Activations from qd_quantize_q8_0 (32-block types) or
   qd_quantize_q8_K (K-quants). Returns 0, or -1 for an unknown type. */
int qd_matmul(int type, const uint8_t *W, int N, int K, const int8_t *xq, const float *xd, const int32_t *xs,
              const int16_t *bsum, int M, float *y, long ldy, int nthreads, int exact) {
    const qd_type *t = qd_type_info(type);
    if (!t || K % t->bs || M <= 0) return t && K % t->bs == 0 ? 0 : -1;
    qd_acts a = {xq, xd, xs, bsum, M, K, NULL, NULL, exact, NULL, NULL};
    if (exact && !t->kq) {
        int32_t *n16 = (int32_t *)tl_grow(&tl_act, &tl_act_cap, 2 * (size_t)M * K + 64), *n128 = n16 + (size_t)M * (K / 4);
        for (int m = 0; m < M; ++m) qd_exact_sums(xq + (size_t)m * K, K, n16 + (size_t)m * (K / 4), n128 + (size_t)m * (K / 4));
        a.n16 = n16;
        a.n128 = n128;
    }
    const qd_job job = {type, N, W, y, ldy};
    nthreads = threads_for((double)((N + 7) / 8) * qd_panel_bytes(t, K), M, nthreads);
    qd_range ranges[QD_MAX_THREADS];
    const int fused = QD_FUSED(M);
    #pragma omp parallel num_threads(nthreads)
    {
        if (fused) {
            init_range(&job, 1, K, ranges);
            #pragma omp barrier
            run_fused(&job, 1, K, &a, &a, M, ranges);
        } else {
            run_jobs(&job, 1, K, &a, &a, M);
        }
    }
    return 0;
}

/* A group of weights reading the same input (q/k/v, gate/up): x float32 [M][K] (row stride ldx)
   quantized once per activation kind the group needs, inside the same parallel region as the
   matmuls; weight i writes y columns [off_i, off_i + N_i) with off_i = N_0 + ... + N_{i-1}. */
typedef struct {
    int nw, K;
    int types[QD_GROUP_MAX], Ns[QD_GROUP_MAX];
    const uint8_t *Ws[QD_GROUP_MAX];
    int exact;  /* llama.cpp's float order where qdot_exact.c has it */
} qd_group;

int qd_group_run(const qd_group *g, const float *x, long ldx, int M, float *y, long ldy, int nthreads) {
    const int K = g->K;
    if (g->nw < 1 || g->nw > QD_GROUP_MAX || M <= 0) return g->nw >= 1 && g->nw <= QD_GROUP_MAX ? 0 : -1;
    qd_job jobs[QD_GROUP_MAX];
    int need0 = 0, needK = 0, off = 0;
    double bytes = 0;
    for (int i = 0; i < g->nw; ++i) {
        const qd_type *t = qd_type_info(g->types[i]);
        if (!t || K % t->bs) return -1;
        if (t->kq) needK = 1; else need0 = 1;
        jobs[i] = (qd_job){g->types[i], g->Ns[i], g->Ws[i], y + off, ldy};
        off += g->Ns[i];
        bytes += (double)((g->Ns[i] + 7) / 8) * qd_panel_bytes(t, K);
    }
    /* activation buffers (calling thread's cache; the workers only read them) */
    const size_t q8 = (size_t)M * K, n0 = (size_t)M * (K / 32), nK = (size_t)M * (K / 256);
    const size_t need = (need0 ? q8 + 8 * n0 : 0) + (needK ? q8 + 4 * nK + 2 * (size_t)M * (K / 16) : 0)
                        + (need0 && g->exact ? 2 * q8 + 128 : 0) + 256;
    uint8_t *buf = (uint8_t *)tl_grow(&tl_act, &tl_act_cap, need), *p = buf;
    qd_acts a0 = {0}, aK = {0};
    if (need0) {
        a0.xq = (int8_t *)p; p += q8;
        a0.xd = (float *)p; p += 4 * n0;
        a0.xs = (int32_t *)p; p += 4 * n0;
        a0.M = M; a0.K = K; a0.exact = g->exact;
        if (g->exact) {
            p = (uint8_t *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
            a0.n16 = (int32_t *)p; p += q8;
            a0.n128 = (int32_t *)p; p += q8;
        }
    }
    if (needK) {
        p = (uint8_t *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
        aK.xq = (int8_t *)p; p += q8;
        aK.xd = (float *)p; p += 4 * nK;
        aK.bsum = (int16_t *)p;
        aK.M = M; aK.K = K; aK.exact = g->exact;
    }
    nthreads = threads_for(bytes, M, nthreads);
    qd_range ranges[QD_MAX_THREADS];
    const int fused = QD_FUSED(M);
    #pragma omp parallel num_threads(nthreads)
    {
        if (fused) init_range(jobs, g->nw, K, ranges);
        #pragma omp for schedule(static)
        for (int m = 0; m < M; ++m) {
            if (need0) qd_quant_row_q8_0(x + (size_t)m * ldx, K, (int8_t *)a0.xq + (size_t)m * K,
                                         (float *)a0.xd + (size_t)m * (K / 32), (int32_t *)a0.xs + (size_t)m * (K / 32));
            if (need0 && g->exact) qd_exact_sums(a0.xq + (size_t)m * K, K, (int32_t *)a0.n16 + (size_t)m * (K / 4),
                                                 (int32_t *)a0.n128 + (size_t)m * (K / 4));
            if (needK) qd_quant_row_q8_K(x + (size_t)m * ldx, K, (int8_t *)aK.xq + (size_t)m * K,
                                         (float *)aK.xd + (size_t)m * (K / 256), (int16_t *)aK.bsum + (size_t)m * (K / 16));
        }
        /* the implicit barrier of the omp for: every row quantized, and every range set, before any
           matmul */
        if (fused) run_fused(jobs, g->nw, K, &a0, &aK, M, ranges);
        else run_jobs(jobs, g->nw, K, &a0, &aK, M);
    }
    return 0;
}

int qd_group_size(void) { return (int)sizeof(qd_group); }

/* Which code paths this build has: 0 portable, 1 AVX2, 2 VNNI (native or emulated). */
int qd_isa_level(void) {
#if defined(QD_VNNI)
    return 2;
#elif defined(QD_AVX2)
    return 1;
#else
    return 0;
#endif
}
