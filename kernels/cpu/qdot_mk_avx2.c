/* qdot's own float order on the 256-bit builds (AVX2, AVX-VNNI, emulated VNNI): one panel through
   the micro-kernel templates of qdot_mk_avx2.h (qd_mk_panel, qdot.h; qd_route names it mk_a /
   mk_k). The portable build's qd_mk_panel is qdot_portable.c's. */
#include "qdot_mk_avx2.h"

#if defined(QD_AVX2)
void qd_mk_panel(int type, int fused, int MR, const uint8_t *c, int stride, const uint8_t *scl,
                 const qd_scratch *s, int nb, const qd_acts *a, int m0, float *out) {
#define MKA(n, T, f, chunk, off, hm) mk_a(T, f, n, chunk, off, hm, c, stride, s, nb, a, m0, out)
#define MKK(n, T, f, nsub, chunk, fold) mk_k(T, f, n, nsub, chunk, fold, 0, c, stride, scl, s, nb, a, m0, out)
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
#endif  /* QD_AVX2 */
