/* qdot's own float order in the portable build (no AVX2): one panel, decoded into scratch, in
   plain C (run_panel, through qd_mk_panel: qdot.h). The same integers as the vector
   micro-kernels (qdot_mk_avx2.h); llama.cpp's orders are qdot_exact.c's. Vector builds compile
   nothing here. */
#include "qdot.h"

#if !defined(QD_AVX2)
static void run_panel(int type, int MR, const uint8_t *c, const qd_scratch *s, int nb, const qd_acts *a, int m0,
                      float *out) {
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

void qd_mk_panel(int type, int fused, int MR, const uint8_t *c, int stride, const uint8_t *scl,
                 const qd_scratch *s, int nb, const qd_acts *a, int m0, float *out) {
    (void)fused; (void)stride; (void)scl;  /* the portable build always decodes into scratch */
    run_panel(type, MR, c, s, nb, a, m0, out);
}
#else
typedef int qd_no_portable_panel;  /* ISO C: a translation unit holds at least one declaration */
#endif
