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

#define MRMAX 4

#if defined(QD_AVX2)
#define ALWAYS static inline __attribute__((always_inline))

ALWAYS __m256i bcast4(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return _mm256_set1_epi32(v); }
ALWAYS __m256i ldv(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

enum { M_U = 0, M_S8 = 1 };  /* unsigned codes / signed Q8_0 codes */

/* 32-block types. off: offset subtracted from the codes (through the activation sums);
   chunk: k-groups summed in int16 (AVX2); has_m: Q4_1 / Q5_1 add m_w * d_x * sum_x. */
ALWAYS void mk_a(const int MR, const int mode, const int chunk, int off, const int has_m,
                 const uint8_t *codes, const qd_scratch *s, int nb, const qd_acts *a, int m0, float *out) {
    __m256 accf[MRMAX];
    const int8_t *xq[MRMAX];
    const int K = a->K;
    #pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) { accf[m] = _mm256_setzero_ps(); xq[m] = a->xq + (size_t)(m0 + m) * K; }
#if defined(QD_VNNI)
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    if (mode == M_S8) off = 128;
#else
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    for (int b = 0; b < nb; ++b) {
        __m256i acc[MRMAX];
        #pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_si256();
        const uint8_t *cb = codes + (size_t)b * 256;
#if defined(QD_VNNI)
        #pragma GCC unroll 8
        for (int kg = 0; kg < 8; ++kg) {
            __m256i w = ldv(cb + 32 * kg);
            if (mode == M_S8) w = _mm256_xor_si256(w, bias);
            #pragma GCC unroll 4
            for (int m = 0; m < MR; ++m) acc[m] = QD_DPBUSD(acc[m], w, bcast4(xq[m] + 32 * b + 4 * kg));
        }
#else
        if (mode == M_S8) {
            #pragma GCC unroll 8
            for (int kg = 0; kg < 8; ++kg) {
                const __m256i w = ldv(cb + 32 * kg), aw = _mm256_sign_epi8(w, w);
                #pragma GCC unroll 4
                for (int m = 0; m < MR; ++m)
                    acc[m] = _mm256_add_epi32(acc[m], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(aw, _mm256_sign_epi8(bcast4(xq[m] + 32 * b + 4 * kg), w)), ones));
            }
        } else {
            #pragma GCC unroll 2
            for (int c0 = 0; c0 < 8; c0 += chunk) {
                __m256i a16[MRMAX];
                #pragma GCC unroll 4
                for (int m = 0; m < MR; ++m) a16[m] = _mm256_setzero_si256();
                #pragma GCC unroll 8
                for (int kg = c0; kg < c0 + chunk; ++kg) {
                    const __m256i w = ldv(cb + 32 * kg);
                    #pragma GCC unroll 4
                    for (int m = 0; m < MR; ++m)
                        a16[m] = _mm256_add_epi16(a16[m], _mm256_maddubs_epi16(w, bcast4(xq[m] + 32 * b + 4 * kg)));
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
ALWAYS void mk_k(const int MR, const int nsub, const int chunk, const int fold,
                 const uint8_t *codes, const qd_scratch *s, int nb, const qd_acts *a, int m0, float *out) {
    __m256 accf[MRMAX];
    const int8_t *xq[MRMAX];
    const int16_t *bsv[MRMAX];
    const int K = a->K, kgs = 64 / nsub;
    #pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
        accf[m] = _mm256_setzero_ps();
        xq[m] = a->xq + (size_t)(m0 + m) * K;
        bsv[m] = a->bsum + (size_t)(m0 + m) * (K / 16);
    }
    for (int b = 0; b < nb; ++b) {
        __m256i acc[MRMAX];
        #pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_si256();
        const uint8_t *cb = codes + (size_t)b * 2048;
        const int32_t *scb = s->sc + (size_t)b * nsub * 8;
        #pragma GCC unroll 1
        for (int j = 0; j < nsub; ++j) {
            const __m256i scv = _mm256_loadu_si256((const __m256i *)(scb + 8 * j));
#if defined(QD_VNNI)
            __m256i t[MRMAX];
            #pragma GCC unroll 4
            for (int m = 0; m < MR; ++m) t[m] = _mm256_setzero_si256();
            #pragma GCC unroll 8
            for (int kg = 0; kg < kgs; ++kg) {
                const int k = j * kgs + kg;
                const __m256i w = ldv(cb + 32 * k);
                #pragma GCC unroll 4
                for (int m = 0; m < MR; ++m) t[m] = QD_DPBUSD(t[m], w, bcast4(xq[m] + 256 * b + 4 * k));
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
                    const __m256i w = ldv(cb + 32 * k);
                    #pragma GCC unroll 4
                    for (int m = 0; m < MR; ++m)
                        a16[m] = _mm256_add_epi16(a16[m], _mm256_maddubs_epi16(w, bcast4(xq[m] + 256 * b + 4 * k)));
                }
                #pragma GCC unroll 4
                for (int m = 0; m < MR; ++m) acc[m] = _mm256_add_epi32(acc[m], _mm256_madd_epi16(a16[m], scv));
            }
#endif
        }
        const __m256 dw = _mm256_loadu_ps(s->d + 8 * b);
        const int32_t *mnb = s->mn + (size_t)b * 64;
        #pragma GCC unroll 4
        for (int m = 0; m < MR; ++m) {
            const float xd = a->xd[(size_t)(m0 + m) * nb + b];
            const int16_t *bs = bsv[m] + 16 * b;
            __m256i mins = _mm256_setzero_si256();
            #pragma GCC unroll 8
            for (int i = 0; i < 8; ++i) {
                int32_t p; memcpy(&p, bs + 2 * i, 4);
                mins = _mm256_add_epi32(mins, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(mnb + 8 * i)),
                                                                _mm256_set1_epi32(p)));
            }
            const __m256 xdv = _mm256_set1_ps(xd);
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

#define DISPATCH(CALL) do { switch (MR) { case 1: CALL(1); break; case 2: CALL(2); break; \
                                          case 3: CALL(3); break; default: CALL(4); } } while (0)

static void run_panel(int type, int MR, const uint8_t *c, const qd_scratch *s, int nb, const qd_acts *a, int m0, float *out) {
    switch (type) {
#define A(MRc, mode, chunk, off, hm) mk_a(MRc, mode, chunk, off, hm, c, s, nb, a, m0, out)
    case QD_Q4_0: {
#define C(n) A(n, M_U, 8, 8, 0)
        DISPATCH(C); break;
#undef C
    }
    case QD_Q4_1: {
#define C(n) A(n, M_U, 8, 0, 1)
        DISPATCH(C); break;
#undef C
    }
    case QD_Q5_0: {
#define C(n) A(n, M_U, 4, 16, 0)
        DISPATCH(C); break;
#undef C
    }
    case QD_Q5_1: {
#define C(n) A(n, M_U, 4, 0, 1)
        DISPATCH(C); break;
#undef C
    }
    case QD_Q8_0: {
#define C(n) A(n, M_S8, 1, 0, 0)
        DISPATCH(C); break;
#undef C
    }
#undef A
#define KQ(MRc, nsub, chunk, fold) mk_k(MRc, nsub, chunk, fold, c, s, nb, a, m0, out)
    case QD_Q2_K: {
#define C(n) KQ(n, 16, 4, 0)
        DISPATCH(C); break;
#undef C
    }
    case QD_Q3_K: {
#define C(n) KQ(n, 16, 4, 1)
        DISPATCH(C); break;
#undef C
    }
    case QD_Q4_K: {
#define C(n) KQ(n, 8, 8, 0)
        DISPATCH(C); break;
#undef C
    }
    case QD_Q5_K: {
#define C(n) KQ(n, 8, 4, 0)
        DISPATCH(C); break;
#undef C
    }
    case QD_Q6_K: {
#define C(n) KQ(n, 16, 2, 1)
        DISPATCH(C); break;
#undef C
    }
#undef KQ
    }
}

#else  /* ------------------------------------------------------------------ portable */

static void run_panel(int type, int MR, const uint8_t *c, const qd_scratch *s, int nb, const qd_acts *a, int m0, float *out) {
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
                    if (type == QD_Q6_K || type == QD_Q3_K) acc[r] += (s->d[8 * b + r] * xd) * (float)(isum - mins);
                    else acc[r] += (s->d[8 * b + r] * xd) * (float)isum - (s->dm[8 * b + r] * xd) * (float)mins;
                }
            }
        }
        memcpy(out + 8 * m, acc, sizeof acc);
    }
}
#endif

/* thread-local scratch, grown on demand */
static __thread uint8_t *tl_buf;
static __thread size_t tl_cap;

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

/* y[m * ldy + n] for m < M, n < N. Activations from qd_quantize_q8_0 (32-block types) or
   qd_quantize_q8_K (K-quants). Returns 0, or -1 for an unknown type. */
int qd_matmul(int type, const uint8_t *W, int N, int K, const int8_t *xq, const float *xd, const int32_t *xs,
              const int16_t *bsum, int M, float *y, long ldy, int nthreads) {
    const qd_type *t = qd_type_info(type);
    if (!t || K % t->bs) return -1;
    const qd_acts a = {xq, xd, xs, bsum, M, K};
    const int nb = K / t->bs, np = (N + 7) / 8;
    const size_t pb = qd_panel_bytes(t, K), sb = scratch_bytes(K, nb);
    /* panels per group: decoded scratch of a group kept within ~192 KB of L2 when rows are many */
    int G = 1;
    if (M > MRMAX) {
        G = (int)((192 * 1024) / sb);
        G = G < 1 ? 1 : G > 16 ? 16 : G;
    }
    const int ng = (np + G - 1) / G;
    if (nthreads > ng) nthreads = ng;
    #pragma omp parallel num_threads(nthreads)
    {
        const size_t need = sb * (size_t)G + 64;
        if (tl_cap < need) {
            free(tl_buf);
            tl_buf = (uint8_t *)aligned_alloc(64, (need + 63) & ~(size_t)63);
            tl_cap = tl_buf ? need : 0;
        }
        qd_scratch sc[16];
        const uint8_t *codes[16];
        for (int g = 0; g < G; ++g) sc[g] = scratch_at(tl_buf + sb * (size_t)g, K, nb);
        #pragma omp for schedule(static)
        for (int gi = 0; gi < ng; ++gi) {
            const int p0 = gi * G, p1 = p0 + G < np ? p0 + G : np;
            for (int p = p0; p < p1; ++p) codes[p - p0] = qd_decode_panel(t, W + (size_t)p * pb, K, &sc[p - p0]);
            for (int m0 = 0; m0 < M; m0 += MRMAX) {
                const int MR = M - m0 < MRMAX ? M - m0 : MRMAX;
                for (int p = p0; p < p1; ++p) {
                    float out[MRMAX * 8];
                    run_panel(type, MR, codes[p - p0], &sc[p - p0], nb, &a, m0, out);
                    const int n0 = 8 * p, nn = N - n0 < 8 ? N - n0 : 8;
                    for (int m = 0; m < MR; ++m) memcpy(y + (size_t)(m0 + m) * ldy + n0, out + 8 * m, sizeof(float) * nn);
                }
            }
        }
    }
    return 0;
}

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
