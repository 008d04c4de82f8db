/* llama.cpp's own float arithmetic for the quantized matmuls of the common GGUF types, bit for bit
   (kernels/cpu/qdot.py, the `exact` groups).

   The integer dot products of qdot are exact; what differs between two correct implementations is
   how the float32 partial sums are formed and added. llama-server's CPU backend (ggml-cpu, x86,
   b1-0c1e570) forms them per output as follows (8 float lanes, fma, then ggml's hsum_float_8
   tree ((l4 + l0) + (l6 + l2)) + ((l5 + l1) + (l7 + l3))):

   Q5_0, Q8_0 (ggml_vec_dot_q5_0_q8_0 / _q8_0_q8_0 for one row; llamafile's tinyBLAS_Q0_AVX for
   batches: the same operations): lane l of block b holds the integer sum over columns
   32 b + 4 l .. 32 b + 4 l + 3; acc_l = fma(d_w * d_x, float(sum), acc_l) block after block.

   Q6_K (ggml_vec_dot_q6_K_q8_K): per 256-block, lane l = sum over the eight 32-column chunks c of
   scale(16-column sub-block of column 32 c + 4 l) * (code . x over columns 32 c + 4 l .. + 3),
   minus 32 * (scale_2l bsum_2l + scale_2l+1 bsum_2l+1) (the codes' -32 offset, lane by lane);
   acc_l = fma(d_x * d_w, float(lane), acc_l).

   Q4_K (repacked to q4_K_8x8, ggml_gemv / ggml_gemm_q4_K_8x8_q8_K): one float lane per output;
   the integer sum of scale * dot and of min * bsum over a 256-block (gemv: rows of the batch past
   the last multiple of 4) or over each 64-column half-pair of sub-blocks (gemm: the first
   M - M % 4 rows), acc = fma(float(isum), d_w * d_x, acc), accm likewise with dmin; out =
   acc - accm.

   The portable C below is the reference of these orders (every float operation a single IEEE
   operation; the build has -ffp-contract=off), on the panels decoded into scratch (qdot_panel.c). */
#include "qdot.h"

static inline float hsum8(const float *l) {
    return ((l[4] + l[0]) + (l[6] + l[2])) + ((l[5] + l[1]) + (l[7] + l[3]));
}

/* The integer dot of row r (0..7) of k-group k with 4 activation codes, from decoded scratch
   codes ([K / 4][32]: byte 4 r + j is row r, column 4 k + j); Q8_0's codes are signed. */
static inline int kg_dot(const uint8_t *codes, size_t k, int r, const int8_t *x, int s8) {
    const uint8_t *c = codes + k * 32 + 4 * r;
    int s = 0;
    for (int j = 0; j < 4; ++j) s += (s8 ? (int)(int8_t)c[j] : (int)c[j]) * x[j];
    return s;
}

static void exact_32(int type, const uint8_t *codes, const qd_scratch *s, int nb, const qd_acts *a, int m0, int MR,
                     float *out) {
    const int K = a->K, s8 = type == QD_Q8_0, off = type == QD_Q5_0 ? 16 : 0;
    for (int m = 0; m < MR; ++m) {
        const int8_t *x = a->xq + (size_t)(m0 + m) * K;
        for (int r = 0; r < 8; ++r) {
            float acc[8] = {0};
            for (int b = 0; b < nb; ++b) {
                const float d = s->d[8 * b + r] * a->xd[(size_t)(m0 + m) * nb + b];
                for (int l = 0; l < 8; ++l) {
                    const int8_t *xl = x + 32 * b + 4 * l;
                    int isum = kg_dot(codes, (size_t)b * 8 + l, r, xl, s8);
                    if (off) isum -= off * (xl[0] + xl[1] + xl[2] + xl[3]);
                    acc[l] = fmaf(d, (float)isum, acc[l]);
                }
            }
            out[8 * m + r] = hsum8(acc);
        }
    }
}

static void exact_q6_K(const uint8_t *codes, const qd_scratch *s, int nb, const qd_acts *a, int m0, int MR, float *out) {
    const int K = a->K;
    if (a->M >= 8) {  /* ggml's tiled K-quant matmul: per 256-block, acc = fma(float(isum) * d_w, d_x, acc) */
        for (int m = 0; m < MR; ++m) {
            const int8_t *x = a->xq + (size_t)(m0 + m) * K;
            const int16_t *bs = a->bsum + (size_t)(m0 + m) * (K / 16);
            for (int r = 0; r < 8; ++r) {
                float acc = 0.0f;
                for (int b = 0; b < nb; ++b) {
                    const int32_t *sc = s->sc + (size_t)b * 16 * 8;
                    int isum = 0;
                    for (int j = 0; j < 16; ++j) {
                        int raw = 0;
                        for (int k = 4 * j; k < 4 * j + 4; ++k)
                            raw += kg_dot(codes, (size_t)b * 64 + k, r, x + 256 * b + 4 * k, 0);
                        isum += sc[j * 8 + r] * (raw - 32 * bs[16 * b + j]);
                    }
                    const float t = (float)isum * s->d[8 * b + r];
                    acc = fmaf(t, a->xd[(size_t)(m0 + m) * nb + b], acc);  /* contracted by b1's build */
                }
                out[8 * m + r] = acc;
            }
        }
        return;
    }
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
                        isum += sc[(k / 4) * 8 + r] * kg_dot(codes, (size_t)b * 64 + k, r, x + 256 * b + 4 * k, 0);
                    }
                    isum -= 32 * (sc[(2 * l) * 8 + r] * bs[16 * b + 2 * l] + sc[(2 * l + 1) * 8 + r] * bs[16 * b + 2 * l + 1]);
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

static void exact_q4_K(const uint8_t *codes, const qd_scratch *s, int nb, const qd_acts *a, int m0, int MR, float *out) {
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
                        isum += s->sc[((size_t)b * 8 + j) * 8 + r] * dot;
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

int qd_exact_type(int type) {
    return type == QD_Q5_0 || type == QD_Q8_0 || type == QD_Q6_K || type == QD_Q4_K;
}

/* One panel (8 weight rows) for MR activation rows from m0: out [MR][8]. */
void qd_exact_panel(int type, const uint8_t *codes, const qd_scratch *s, int nb, const qd_acts *a, int m0, int MR,
                    float *out) {
    switch (type) {
    case QD_Q6_K: exact_q6_K(codes, s, nb, a, m0, MR, out); break;
    case QD_Q4_K: exact_q4_K(codes, s, nb, a, m0, MR, out); break;
    default: exact_32(type, codes, s, nb, a, m0, MR, out); break;
    }
}
