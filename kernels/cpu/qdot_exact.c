/* llama.cpp's own float arithmetic for the quantized matmuls of the common GGUF types, bit for bit
   (kernels/cpu/qdot.py, the `exact` groups).

   The integer dot products of qdot are exact; what differs between two correct implementations is
   how the float32 partial sums are formed and added. llama-server's CPU backend (ggml-cpu, x86,
   b1-0c1e570) forms them per output as follows (8 float lanes, fma, then ggml's hsum_float_8
   tree ((l4 + l0) + (l6 + l2)) + ((l5 + l1) + (l7 + l3))):

   Q5_0, Q8_0 (ggml_vec_dot_q5_0_q8_0 / _q8_0_q8_0 for one row; llamafile's tinyBLAS_Q0_AVX for
   batches: the same operations): lane l of block b holds the integer sum over columns
   32 b + 4 l .. 32 b + 4 l + 3; acc_l = fma(d_w * d_x, float(sum), acc_l) block after block.
   Q4_1, Q5_1 (ggml_vec_dot_q4_1_q8_1 / _q5_1_q8_1 for every row count: no repack, no llamafile):
   the same lanes over the unsigned codes, and beside them summs = fma(m_w, s_x, summs) block after
   block (s_x: the q8_1 activations' fp16 d * sum, qdot_quant.c); out = hsum(acc) + summs.

   Q6_K (ggml_vec_dot_q6_K_q8_K): per 256-block, lane l = sum over the eight 32-column chunks c of
   scale(16-column sub-block of column 32 c + 4 l) * (code . x over columns 32 c + 4 l .. + 3),
   minus 32 * (scale_2l bsum_2l + scale_2l+1 bsum_2l+1) (the codes' -32 offset, lane by lane);
   acc_l = fma(d_x * d_w, float(lane), acc_l).

   Q6_K and Q3_K from 8 rows (ggml's tiled K-quant matmul): one integer per output and 256-block,
   acc = fma(float(isum) * d_w, d_x, acc): the integer-dot micro-kernels' sums (qdot_mk_avx2.h,
   qdot_mk_avx512.h, instantiated here with this epilogue, QD_TILED_K), or ref_k_tiled.

   Q4_K (repacked to q4_K_8x8, ggml_gemv / ggml_gemm_q4_K_8x8_q8_K): one float lane per output;
   the integer sum of scale * dot and of min * bsum over a 256-block (gemv: rows of the batch past
   the last multiple of 4) or over each 64-column half-pair of sub-blocks (gemm: the first
   M - M % 4 rows), acc = fma(float(isum), d_w * d_x, acc), accm likewise with dmin; out =
   acc - accm. In AVX-512 VNNI prefill the same on pairs of panels (z_mk_q4k_exact).

   The portable C below is the reference of these orders (every float operation a single IEEE
   operation; the build has -ffp-contract=off), on the panels decoded into scratch (qdot_panel.c).
   Which of these kernels runs where: qd_route (qdot_route.c), the table in kernels/README.md. */
#include "qdot.h"
#include "qdot_codes.h"

/* llama.cpp's tiled K-quant epilogue of one block and row: acc = fma(float(isum) * d_w, d_x, acc)
   (isum: the block's integer sum, the mins subtracted), in the micro-kernel templates below */
#define QD_TILED_K(accf, isum, dw, xdv) _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(isum), (dw)), (xdv), (accf))
#define QD_Z_TILED_K(accf, isum, dw, xdv) _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum), (dw)), (xdv), (accf))
/* the same with separate mins (Q5_K, Q2_K: HAS_MIN): res = d_w float(isum) - dmin_w float(mins)
   (one fnmadd), acc = fma(res, d_x, acc) */
#define QD_TILED_KM(accf, isum, mins, dw, dmw, xdv) \
    _mm256_fmadd_ps(_mm256_fnmadd_ps((dmw), _mm256_cvtepi32_ps(mins), _mm256_mul_ps(_mm256_cvtepi32_ps(isum), (dw))), (xdv), (accf))
#define QD_Z_TILED_KM(accf, isum, mins, dw, dmw, xdv) \
    _mm512_fmadd_ps(_mm512_fnmadd_ps((dmw), _mm512_cvtepi32_ps(mins), _mm512_mul_ps(_mm512_cvtepi32_ps(isum), (dw))), (xdv), (accf))
#include "qdot_mk_avx2.h"
#include "qdot_mk_avx512.h"

static inline float hsum8(const float *l) {
    return ((l[4] + l[0]) + (l[6] + l[2])) + ((l[5] + l[1]) + (l[7] + l[3]));
}

/* A sub-block scale from the scratch (qdot_panel.c keeps int32, or on AVX2 builds without VNNI
   the int16 pair (s, s)): the low 16 bits, signed. */
static inline int scale_at(const int32_t *p) { return (int16_t)(*p & 0xFFFF); }

/* The integer dot of row r (0..7) of k-group k with 4 activation codes, from decoded scratch
   codes ([K / 4][32]: byte 4 r + j is row r, column 4 k + j); Q8_0's codes are signed. */
static inline int kg_dot(const uint8_t *codes, size_t k, int r, const int8_t *x, int s8) {
    const uint8_t *c = codes + k * 32 + 4 * r;
    int s = 0;
    for (int j = 0; j < 4; ++j) s += (s8 ? (int)(int8_t)c[j] : (int)c[j]) * x[j];
    return s;
}

static void ref_32(int type, const uint8_t *codes, const qd_scratch *s, int nb, const qd_acts *a, int m0, int MR,
                     float *out) {
    const int K = a->K, s8 = type == QD_Q8_0, off = type == QD_Q5_0 ? 16 : 0;
    const int hm = type == QD_Q4_1 || type == QD_Q5_1;  /* + m_w x s_x per block, in its own sum */
    for (int m = 0; m < MR; ++m) {
        const int8_t *x = a->xq + (size_t)(m0 + m) * K;
        for (int r = 0; r < 8; ++r) {
            float acc[8] = {0}, summs = 0.0f;
            for (int b = 0; b < nb; ++b) {
                const float d = s->d[8 * b + r] * a->xd[(size_t)(m0 + m) * nb + b];
                if (hm) summs = fmaf(s->dm[8 * b + r], a->xs1[(size_t)(m0 + m) * nb + b], summs);  /* contracted by b1's build */
                for (int l = 0; l < 8; ++l) {
                    const int8_t *xl = x + 32 * b + 4 * l;
                    int isum = kg_dot(codes, (size_t)b * 8 + l, r, xl, s8);
                    if (off) isum -= off * (xl[0] + xl[1] + xl[2] + xl[3]);
                    acc[l] = fmaf(d, (float)isum, acc[l]);
                }
            }
            out[8 * m + r] = hm ? hsum8(acc) + summs : hsum8(acc);
        }
    }
}

/* The K-quants from 8 rows, ggml's tiled K-quant matmul: per 256-block one integer (Q6_K / Q3_K:
   the codes' offset subtracted through the mn pairs, qdot_panel.c), acc = fma(float(isum) * d_w,
   d_x, acc); Q5_K / Q2_K (HAS_MIN): the mins' integer apart, acc = fma(fma(-dmin_w, float(mins),
   float(isum) * d_w), d_x, acc) */
static void ref_k_tiled(int type, const uint8_t *codes, const qd_scratch *s, int nb, const qd_acts *a, int m0, int MR,
                        float *out) {
    const int K = a->K, nsub = qd_type_info(type)->nsub, kgs = 64 / nsub;
    for (int m = 0; m < MR; ++m) {
        const int8_t *x = a->xq + (size_t)(m0 + m) * K;
        const int16_t *bs = a->bsum + (size_t)(m0 + m) * (K / 16);
        for (int r = 0; r < 8; ++r) {
            float acc = 0.0f;
            for (int b = 0; b < nb; ++b) {
                int isum = 0, mins = 0;
                for (int j = 0; j < nsub; ++j) {
                    int sub = 0;
                    for (int k = j * kgs; k < (j + 1) * kgs; ++k)
                        sub += kg_dot(codes, (size_t)b * 64 + k, r, x + 256 * b + 4 * k, 0);
                    isum += scale_at(s->sc + ((size_t)b * nsub + j) * 8 + r) * sub;
                }
                for (int i = 0; i < 8; ++i) {
                    const int32_t p = s->mn[(size_t)b * 64 + 8 * i + r];
                    mins += (int16_t)(p & 0xFFFF) * bs[16 * b + 2 * i] + (int16_t)((uint32_t)p >> 16) * bs[16 * b + 2 * i + 1];
                }
                const int hm = type == QD_Q5_K || type == QD_Q2_K;
                const float t = hm ? fmaf(-s->dm[8 * b + r], (float)mins, (float)isum * s->d[8 * b + r])
                                   : (float)(isum - mins) * s->d[8 * b + r];
                acc = fmaf(t, a->xd[(size_t)(m0 + m) * nb + b], acc);  /* contracted by b1's build */
            }
            out[8 * m + r] = acc;
        }
    }
}

/* Q6_K under 8 rows (ggml_vec_dot_q6_K_q8_K) */
static void ref_q6_K(const uint8_t *codes, const qd_scratch *s, int nb, const qd_acts *a, int m0, int MR, float *out) {
    const int K = a->K;
    for (int m = 0; m < MR; ++m) {
        const int8_t *x = a->xq + (size_t)(m0 + m) * K;
        const int16_t *bs = a->bsum + (size_t)(m0 + m) * (K / 16);
        for (int r = 0; r < 8; ++r) {
            float acc[8] = {0};
            for (int b = 0; b < nb; ++b) {
                const float d = a->xd[(size_t)(m0 + m) * nb + b] * s->d[8 * b + r];
                const int32_t *sc = s->sc + (size_t)b * 16 * 8;  /* [16 sub-blocks][8 rows] */
                for (int l = 0; l < 8; ++l) {
                    int isum = 0;
                    for (int c = 0; c < 8; ++c) {
                        const int k = 8 * c + l;  /* k-group in the block: columns 4 k .. 4 k + 3 */
                        isum += scale_at(sc + (k / 4) * 8 + r) * kg_dot(codes, (size_t)b * 64 + k, r, x + 256 * b + 4 * k, 0);
                    }
                    isum -= 32 * (scale_at(sc + (2 * l) * 8 + r) * bs[16 * b + 2 * l] + scale_at(sc + (2 * l + 1) * 8 + r) * bs[16 * b + 2 * l + 1]);
                    acc[l] = fmaf(d, (float)isum, acc[l]);
                }
            }
            out[8 * m + r] = hsum8(acc);
        }
    }
}

/* mn pair i of Q4_K (qdot_panel.c): the min of 32-column sub-block i for both of its 16-sums */
static inline int q4k_min(const qd_scratch *s, int b, int i, int r) {
    return (int16_t)(s->mn[(size_t)b * 64 + 8 * i + r] & 0xFFFF);
}

/* Q2_K / Q3_K / Q5_K under 8 rows (ggml_vec_dot_q2_K_q8_K / _q3_K_ / _q5_K_, AVX2): lane l of a
   256-block = sum over the eight 32-column chunks c of scale(sub-block of column 32 c + 4 l) x
   (code . x over columns 32 c + 4 l .. + 3), Q3_K's codes less 4 column by column;
   d = d_x d_w, dmin = -(d_x dmin_w). Q2_K: acc_l = fma(dmin, float(m_2l bsum_2l + m_2l+1 bsum_2l+1),
   acc_l), then acc_l = fma(d, float(lane), acc_l); out = hsum(acc). Q3_K: acc_l = fma(d,
   float(lane), acc_l); out = hsum(acc). Q5_K: summs = fma(dmin, float(sum_j m_j (bsum_2j +
   bsum_2j+1)), summs), acc_l = fma(d, float(lane), acc_l); out = hsum(acc) + summs. */
static void ref_k_dot(int type, const uint8_t *codes, const qd_scratch *s, int nb, const qd_acts *a, int m0, int MR,
                      float *out) {
    const int K = a->K, nsub = qd_type_info(type)->nsub;
    for (int m = 0; m < MR; ++m) {
        const int8_t *x = a->xq + (size_t)(m0 + m) * K;
        const int16_t *bs = a->bsum + (size_t)(m0 + m) * (K / 16);
        for (int r = 0; r < 8; ++r) {
            float acc[8] = {0}, summs = 0.0f;
            for (int b = 0; b < nb; ++b) {
                const float xd = a->xd[(size_t)(m0 + m) * nb + b];
                const float d = xd * s->d[8 * b + r], dmin = -xd * s->dm[8 * b + r];
                const int32_t *sc = s->sc + (size_t)b * nsub * 8, *mn = s->mn + (size_t)b * 64;
                const int16_t *bb = bs + 16 * b;
                if (type == QD_Q5_K) {
                    int imin = 0;
                    for (int j = 0; j < 8; ++j) imin += q4k_min(s, b, j, r) * (bb[2 * j] + bb[2 * j + 1]);
                    summs = fmaf(dmin, (float)imin, summs);
                }
                for (int l = 0; l < 8; ++l) {
                    int isum = 0;
                    for (int c = 0; c < 8; ++c) {
                        const int k = 8 * c + l;  /* k-group in the block: columns 4 k .. 4 k + 3 */
                        const int8_t *xk = x + 256 * b + 4 * k;
                        int dot = kg_dot(codes, (size_t)b * 64 + k, r, xk, 0);
                        if (type == QD_Q3_K) dot -= 4 * (xk[0] + xk[1] + xk[2] + xk[3]);
                        isum += scale_at(sc + (nsub == 16 ? 2 * c + l / 4 : c) * 8 + r) * dot;
                    }
                    if (type == QD_Q2_K) {
                        const int32_t p = mn[8 * l + r];
                        const int prod = (int16_t)(p & 0xFFFF) * bb[2 * l] + (int16_t)((uint32_t)p >> 16) * bb[2 * l + 1];
                        acc[l] = fmaf(dmin, (float)prod, acc[l]);
                    }
                    acc[l] = fmaf(d, (float)isum, acc[l]);
                }
            }
            out[8 * m + r] = type == QD_Q5_K ? hsum8(acc) + summs : hsum8(acc);
        }
    }
}


static void ref_q4_K(const uint8_t *codes, const qd_scratch *s, int nb, const qd_acts *a, int m0, int MR, float *out) {
    const int K = a->K, gemm_rows = a->M - a->M % 4;
    for (int m = 0; m < MR; ++m) {
        const int8_t *x = a->xq + (size_t)(m0 + m) * K;
        const int16_t *bs = a->bsum + (size_t)(m0 + m) * (K / 16);
        const int parts = m0 + m < gemm_rows ? 4 : 1;  /* float steps per 256-block */
        for (int r = 0; r < 8; ++r) {
            float acc = 0.0f, accm = 0.0f;
            for (int b = 0; b < nb; ++b) {
                const float xd = a->xd[(size_t)(m0 + m) * nb + b];
                const float dd = s->d[8 * b + r] * xd, dm = s->dm[8 * b + r] * xd;
                for (int p = 0; p < parts; ++p) {
                    const int j0 = 8 / parts * p, j1 = j0 + 8 / parts;  /* 32-column sub-blocks */
                    int isum = 0, imin = 0;
                    for (int j = j0; j < j1; ++j) {
                        int dot = 0;
                        for (int kg = 0; kg < 8; ++kg) {
                            const int k = 8 * j + kg;
                            dot += kg_dot(codes, (size_t)b * 64 + k, r, x + 256 * b + 4 * k, 0);
                        }
                        isum += scale_at(s->sc + ((size_t)b * 8 + j) * 8 + r) * dot;
                        imin += q4k_min(s, b, j, r) * (bs[16 * b + 2 * j] + bs[16 * b + 2 * j + 1]);
                    }
                    acc = fmaf((float)isum, dd, acc);
                    accm = fmaf((float)imin, dm, accm);
                }
            }
            out[8 * m + r] = acc - accm;
        }
    }
}

#if defined(QD_AVX2)
/* ---- the same operations, 8 weight rows in the 8 float lanes (AVX2 / VNNI) -------------------
   Integer sums may be formed in any order (they are exact); every float operation is the one
   above, lane by lane. Codes come from the panel itself (fused) or the decoded scratch. */

/* ((l4 + l0) + (l6 + l2)) + ((l5 + l1) + (l7 + l3)) of eight lane vectors */
ALWAYS __m256 hsum8v(const __m256 *l) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(l[4], l[0]), _mm256_add_ps(l[6], l[2])),
                         _mm256_add_ps(_mm256_add_ps(l[5], l[1]), _mm256_add_ps(l[7], l[3])));
}

/* 8 rows' sums of code x activation over one k-group, + init (int32 lanes). Q8_0 (s8): signed
   codes; on VNNI biased by +128, the bias removed through init (-128 * the 4 activations' sum). */
ALWAYS __m256i dot_kg(const int s8, __m256i w, __m256i a4, __m256i init) {
#if defined(QD_VNNI)
    if (s8) w = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));
    return QD_DPBUSD(init, w, a4);
#else
    const __m256i ones = _mm256_set1_epi16(1);
    if (s8) return _mm256_add_epi32(init, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w),
                                                                                   _mm256_sign_epi8(a4, w)), ones));
    return _mm256_add_epi32(init, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a4), ones));
#endif
}

/* NR (1 or 2) activation rows from m at once: the code vectors decoded once for both. */
ALWAYS void simd_32_rows(const int type, const int fused, const int NR, const uint8_t *codes, int stride,
                         const qd_scratch *s, int nb, const qd_acts *a, int m, float *out) {
    const int K = a->K, s8 = type == QD_Q8_0;
#if defined(QD_VNNI)
    const int off = s8 ? 128 : type == QD_Q5_0 ? 16 : 0;
#else
    const int off = type == QD_Q5_0 ? 16 : 0;
#endif
    const int32_t *nsum = off == 16 ? a->n16 : a->n128;
    const int hm = type == QD_Q4_1 || type == QD_Q5_1;
    __m256 acc[2][8], summs[2];
    for (int r = 0; r < NR; ++r) {
        summs[r] = _mm256_setzero_ps();
        for (int l = 0; l < 8; ++l) acc[r][l] = _mm256_setzero_ps();
    }
    for (int b = 0; b < nb; ++b) {
        __m256 d[2];
        for (int r = 0; r < NR; ++r) {
            d[r] = _mm256_mul_ps(_mm256_loadu_ps(s->d + 8 * b), _mm256_set1_ps(a->xd[(size_t)(m + r) * nb + b]));
            if (hm)
                summs[r] = _mm256_fmadd_ps(_mm256_loadu_ps(s->dm + 8 * b), _mm256_set1_ps(a->xs1[(size_t)(m + r) * nb + b]),
                                           summs[r]);
        }
        #pragma GCC unroll 8
        for (int l = 0; l < 8; ++l) {
            const __m256i w = wv(type, fused, codes, stride, stride, 32, b, l);
            for (int r = 0; r < NR; ++r) {
                /* -off x the 4 activations' sum: the codes' offset (Q5_0), the +128 bias (Q8_0, VNNI) */
                const __m256i init = off ? _mm256_set1_epi32(nsum[(size_t)(m + r) * (K / 4) + 8 * b + l])
                                         : _mm256_setzero_si256();
                const __m256i isum = dot_kg(s8, w, bcast4(a->xq + (size_t)(m + r) * K + 32 * b + 4 * l), init);
                acc[r][l] = _mm256_fmadd_ps(d[r], _mm256_cvtepi32_ps(isum), acc[r][l]);
            }
        }
    }
    for (int r = 0; r < NR; ++r)
        _mm256_storeu_ps(out + 8 * r, hm ? _mm256_add_ps(hsum8v(acc[r]), summs[r]) : hsum8v(acc[r]));
}

ALWAYS void simd_32(const int type, const int fused, const uint8_t *codes, int stride, const qd_scratch *s, int nb,
                    const qd_acts *a, int m0, int MR, float *out) {
    int m = 0;
#if defined(__AVX512VL__)  /* 32 vector registers: two rows' 16 accumulators fit */
    for (; m + 2 <= MR; m += 2) simd_32_rows(type, fused, 2, codes, stride, s, nb, a, m0 + m, out + 8 * m);
#endif
    for (; m < MR; ++m) simd_32_rows(type, fused, 1, codes, stride, s, nb, a, m0 + m, out + 8 * m);
}

/* sub-block scales (int32 lanes) as vpmaddwd pairs (s, s) */
ALWAYS __m256i sc_pair(const int32_t *p) { const __m256i v = _mm256_loadu_si256((const __m256i *)p); return pairs(v, v); }
ALWAYS __m256i bcast_pair(const int16_t *p) { int32_t v; memcpy(&v, p, 4); return _mm256_set1_epi32(v); }

/* Q6_K / Q4_K: sub-block j's scale x (code . x) over k-group k, added to acc (int32 lanes) */
ALWAYS __m256i add_scaled(__m256i acc, __m256i w, __m256i a4, __m256i sc16) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, a4), sc16));
}

ALWAYS void simd_q6_K(const int fused, const uint8_t *codes, int stride, const qd_scratch *s, int nb,
                      const qd_acts *a, int m0, int MR, float *out) {
    const int K = a->K, gbytes = qd_type_info(QD_Q6_K)->codes / 8;  /* under 8 rows (gemv order) */
    for (int m = 0; m < MR; ++m) {
        const int8_t *x = a->xq + (size_t)(m0 + m) * K;
        const int16_t *bs = a->bsum + (size_t)(m0 + m) * (K / 16);
        __m256 acc[8];
        for (int l = 0; l < 8; ++l) acc[l] = _mm256_setzero_ps();
        for (int b = 0; b < nb; ++b) {
            const int32_t *sc = s->sc + (size_t)b * 16 * 8;
            const int32_t *mn = s->mn + (size_t)b * 64;
            const float xd = a->xd[(size_t)(m0 + m) * nb + b];
            const __m256 dw = _mm256_loadu_ps(s->d + 8 * b);
            const int8_t *xb = x + 256 * b;
            const int16_t *bb = bs + 16 * b;
            __m256i isum[8];
            #pragma GCC unroll 8
            for (int l = 0; l < 8; ++l)  /* the -32 offset of lane l: chunk l's two sub-blocks */
                isum[l] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                           _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(mn + 8 * l)), bcast_pair(bb + 2 * l)));
            for (int c = 0; c < 8; ++c) {
                const __m256i sc_lo = sc_pair(sc + 8 * (2 * c)),
                              sc_hi = sc_pair(sc + 8 * (2 * c + 1));
                #pragma GCC unroll 8
                for (int l = 0; l < 8; ++l) {
                    const int k = 8 * c + l;
                    isum[l] = add_scaled(isum[l], wv(QD_Q6_K, fused, codes, stride, gbytes, 256, b, k), bcast4(xb + 4 * k),
                                         l < 4 ? sc_lo : sc_hi);
                }
            }
            const __m256 d = _mm256_mul_ps(_mm256_set1_ps(xd), dw);
            #pragma GCC unroll 8
            for (int l = 0; l < 8; ++l) acc[l] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum[l]), acc[l]);
        }
        _mm256_storeu_ps(out + 8 * m, hsum8v(acc));
    }
}

ALWAYS void simd_q4_K(const int fused, const uint8_t *codes, int stride, const qd_scratch *s, int nb,
                      const qd_acts *a, int m0, int MR, float *out) {
    const int K = a->K, gbytes = qd_type_info(QD_Q4_K)->codes / 8, gemm_rows = a->M - a->M % 4;
    for (int m = 0; m < MR; ++m) {
        const int8_t *x = a->xq + (size_t)(m0 + m) * K;
        const int16_t *bs = a->bsum + (size_t)(m0 + m) * (K / 16);
        const int step = m0 + m < gemm_rows ? 2 : 8;  /* sub-blocks per float step: gemm 64 columns, gemv 256 */
        __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
        for (int b = 0; b < nb; ++b) {
            const int32_t *sc = s->sc + (size_t)b * 8 * 8;
            const int32_t *mn = s->mn + (size_t)b * 64;
            const __m256 xd = _mm256_set1_ps(a->xd[(size_t)(m0 + m) * nb + b]);
            const __m256 dd = _mm256_mul_ps(_mm256_loadu_ps(s->d + 8 * b), xd),
                         dm = _mm256_mul_ps(_mm256_loadu_ps(s->dm + 8 * b), xd);
            const int8_t *xb = x + 256 * b;
            const int16_t *bb = bs + 16 * b;
            for (int j0 = 0; j0 < 8; j0 += step) {
                __m256i isum = _mm256_setzero_si256(), imin = _mm256_setzero_si256();
                for (int j = j0; j < j0 + step; ++j) {
                    __m256i t16 = _mm256_setzero_si256();  /* 8 k-groups of 4-bit codes: |sum| < 2^15 */
                    #pragma GCC unroll 8
                    for (int kg = 0; kg < 8; ++kg) {
                        const int k = 8 * j + kg;
                        t16 = _mm256_add_epi16(t16, _mm256_maddubs_epi16(wv(QD_Q4_K, fused, codes, stride, gbytes, 256, b, k),
                                                                         bcast4(xb + 4 * k)));
                    }
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(t16, sc_pair(sc + 8 * j)));
                    imin = _mm256_add_epi32(imin, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(mn + 8 * j)),
                                                                    bcast_pair(bb + 2 * j)));
                }
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc);
                accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), dm, accm);
            }
        }
        _mm256_storeu_ps(out + 8 * m, _mm256_sub_ps(acc, accm));
    }
}

/* Q2_K / Q3_K / Q5_K under 8 rows: ref_k_dot's lanes, 8 weight rows in the float lanes */
ALWAYS void simd_k_dot(const int type, const int fused, const uint8_t *codes, int stride, const qd_scratch *s, int nb,
                       const qd_acts *a, int m0, int MR, float *out) {
    const int K = a->K, nsub = qd_type_info(type)->nsub, gbytes = qd_type_info(type)->codes / 8;
    const __m256i four = _mm256_set1_epi8(4);
    for (int m = 0; m < MR; ++m) {
        const int8_t *x = a->xq + (size_t)(m0 + m) * K;
        const int16_t *bs = a->bsum + (size_t)(m0 + m) * (K / 16);
        __m256 acc[8], summs = _mm256_setzero_ps();
        for (int l = 0; l < 8; ++l) acc[l] = _mm256_setzero_ps();
        for (int b = 0; b < nb; ++b) {
            const int32_t *sc = s->sc + (size_t)b * nsub * 8, *mn = s->mn + (size_t)b * 64;
            const float xd = a->xd[(size_t)(m0 + m) * nb + b];
            const __m256 d = _mm256_mul_ps(_mm256_set1_ps(xd), _mm256_loadu_ps(s->d + 8 * b));
            const __m256 dmin = _mm256_mul_ps(_mm256_set1_ps(-xd), _mm256_loadu_ps(s->dm + 8 * b));
            const int8_t *xb = x + 256 * b;
            const int16_t *bb = bs + 16 * b;
            if (type == QD_Q5_K) {
                __m256i imin = _mm256_setzero_si256();
                #pragma GCC unroll 8
                for (int j = 0; j < 8; ++j)
                    imin = _mm256_add_epi32(imin, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(mn + 8 * j)),
                                                                    bcast_pair(bb + 2 * j)));
                summs = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(imin), summs);
            }
            __m256i isum[8];
            #pragma GCC unroll 8
            for (int l = 0; l < 8; ++l) isum[l] = _mm256_setzero_si256();
            for (int c = 0; c < 8; ++c) {
                const __m256i sc_lo = sc_pair(sc + 8 * (nsub == 16 ? 2 * c : c)),
                              sc_hi = nsub == 16 ? sc_pair(sc + 8 * (2 * c + 1)) : sc_lo;
                #pragma GCC unroll 8
                for (int l = 0; l < 8; ++l) {
                    const int k = 8 * c + l;
                    const __m256i w = wv(type, fused, codes, stride, gbytes, 256, b, k), a4 = bcast4(xb + 4 * k);
                    __m256i p16 = _mm256_maddubs_epi16(w, a4);
                    if (type == QD_Q3_K) p16 = _mm256_sub_epi16(p16, _mm256_maddubs_epi16(four, a4));
                    isum[l] = _mm256_add_epi32(isum[l], _mm256_madd_epi16(p16, l < 4 ? sc_lo : sc_hi));
                }
            }
            #pragma GCC unroll 8
            for (int l = 0; l < 8; ++l) {
                if (type == QD_Q2_K)
                    acc[l] = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(_mm256_madd_epi16(
                        _mm256_loadu_si256((const __m256i *)(mn + 8 * l)), bcast_pair(bb + 2 * l))), acc[l]);
                acc[l] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum[l]), acc[l]);
            }
        }
        _mm256_storeu_ps(out + 8 * m, type == QD_Q5_K ? _mm256_add_ps(hsum8v(acc), summs) : hsum8v(acc));
    }
}

static void simd_panel(int type, int fused, const uint8_t *codes, int stride, const qd_scratch *s, int nb,
                       const qd_acts *a, int m0, int MR, float *out) {
#define CASES(F) \
    switch (type) { \
    case QD_Q5_0: simd_32(QD_Q5_0, F, codes, stride, s, nb, a, m0, MR, out); break; \
    case QD_Q4_1: simd_32(QD_Q4_1, F, codes, stride, s, nb, a, m0, MR, out); break; \
    case QD_Q5_1: simd_32(QD_Q5_1, F, codes, stride, s, nb, a, m0, MR, out); break; \
    case QD_Q8_0: simd_32(QD_Q8_0, F, codes, stride, s, nb, a, m0, MR, out); break; \
    case QD_Q6_K: simd_q6_K(F, codes, stride, s, nb, a, m0, MR, out); break; \
    case QD_Q2_K: simd_k_dot(QD_Q2_K, F, codes, stride, s, nb, a, m0, MR, out); break; \
    case QD_Q3_K: simd_k_dot(QD_Q3_K, F, codes, stride, s, nb, a, m0, MR, out); break; \
    case QD_Q5_K: simd_k_dot(QD_Q5_K, F, codes, stride, s, nb, a, m0, MR, out); break; \
    default: simd_q4_K(F, codes, stride, s, nb, a, m0, MR, out); break; }
    if (fused) CASES(1) else CASES(0)
#undef CASES
}
#endif  /* QD_AVX2 */

void qd_exact_sums(const int8_t *xq, int K, int32_t *n16, int32_t *n128) {
    for (int i = 0; i < K / 4; ++i) {
        const int s = xq[4 * i] + xq[4 * i + 1] + xq[4 * i + 2] + xq[4 * i + 3];
        n16[i] = -16 * s;
        n128[i] = -128 * s;
    }
}

#if defined(QD_AVX2)
/* The K-quants from 8 rows: mk_k (qdot_mk_avx2.h) with the tiled epilogue (Q4_K is repacked by
   llama.cpp, never tiled: not instantiated) */
static void tiled_panel(int type, int fused, int MR, const uint8_t *c, int stride, const uint8_t *scl,
                        const qd_scratch *s, int nb, const qd_acts *a, int m0, float *out) {
#define MKKT(n, T, f, nsub, chunk, fold) mk_k(T, f, n, nsub, chunk, fold, 1, c, stride, scl, s, nb, a, m0, out)
#define A_CASE(T, chunk, off, hm)
#define K_CASE(T, nsub, chunk, fold) \
    case T: if (T == QD_Q4_K) break; \
        if (fused) MR_SWITCH(MKKT, T, 1, nsub, chunk, fold) else MR_SWITCH(MKKT, T, 0, nsub, chunk, fold) break;
    switch (type) { QD_TYPE_TABLE(A_CASE, K_CASE) }
#undef MKKT
}
#endif

#if defined(QD_ZMM)
/* Q4_K in llama.cpp's float order (q4_K_8x8 gemm for the first M - M % 4 rows, a float step per 64
   columns, gemv for the others, per 256; the mins in their own accumulator): the integers of
   z_mk_k (qdot_mk_avx512.h), its float epilogue per row. out [MR][16]. */
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

void qd_exact_pair(int kernel, int type, int MR, const uint8_t *c2, const qd_scratch *sA, const qd_scratch *sB,
                   int nb, const qd_acts *a, int m0, float *out) {
#define Q4KX(n, unused) z_mk_q4k_exact(n, c2, sA, sB, nb, a, m0, out)
#define ZMKKT(n, nsub, fold) z_mk_k(n, nsub, fold, 1, c2, sA, sB, nb, a, m0, out)
    if (kernel == QD_KN_Z_MK_Q4K_EXACT) {
        MR_SWITCH(Q4KX, 0)
        return;
    }
#undef K_CASE
#define K_CASE(T, nsub, chunk, fold) case T: if (T == QD_Q4_K) break; MR_SWITCH(ZMKKT, nsub, fold) break;
    switch (type) { QD_TYPE_TABLE(A_CASE, K_CASE) }  /* QD_KN_Z_MK_K_TILED */
#undef Q4KX
#undef ZMKKT
}
#endif  /* QD_ZMM */
#undef A_CASE
#undef K_CASE

/* One panel (8 weight rows) through `kernel` for MR activation rows from m0: out [MR][8] (qdot.h).
   The reference kernels read the decoded scratch only. */
void qd_exact_panel(int kernel, int type, int fused, int MR, const uint8_t *codes, int stride, const uint8_t *scl,
                    const qd_scratch *s, int nb, const qd_acts *a, int m0, float *out) {
    (void)fused; (void)stride; (void)scl;
    switch (kernel) {
#if defined(QD_AVX2)
    case QD_KN_MK_K_TILED: tiled_panel(type, fused, MR, codes, stride, scl, s, nb, a, m0, out); break;
    case QD_KN_SIMD_32: case QD_KN_SIMD_Q6_K: case QD_KN_SIMD_Q4_K: case QD_KN_SIMD_K_DOT:
        simd_panel(type, fused, codes, stride, s, nb, a, m0, MR, out);
        break;
#endif
    case QD_KN_REF_K_TILED: ref_k_tiled(type, codes, s, nb, a, m0, MR, out); break;
    case QD_KN_REF_Q6_K: ref_q6_K(codes, s, nb, a, m0, MR, out); break;
    case QD_KN_REF_Q4_K: ref_q4_K(codes, s, nb, a, m0, MR, out); break;
    case QD_KN_REF_K_DOT: ref_k_dot(type, codes, s, nb, a, m0, MR, out); break;
    default: ref_32(type, codes, s, nb, a, m0, MR, out); break;  /* QD_KN_REF_32 */
    }
}
