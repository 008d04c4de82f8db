/* qdot's own float order on AVX-512 VNNI builds, for prefill: two panels per 512-bit vector
   through the templates of qdot_mk_avx512.h (qd_interleave, qd_mk_pair: qdot.h; qd_route names
   them z_mk_a / z_mk_k). Other builds compile nothing here. */
#include "qdot_mk_avx512.h"

#if defined(QD_ZMM)
/* codes of panels A and B ([K / 4][32] each) -> dst [K / 4][64] */
void qd_interleave(const uint8_t *A, const uint8_t *B, int K, uint8_t *dst) {
    for (int k = 0; k < K / 4; ++k) {
        _mm256_storeu_si256((__m256i *)(dst + 64 * (size_t)k), _mm256_loadu_si256((const __m256i *)(A + 32 * (size_t)k)));
        _mm256_storeu_si256((__m256i *)(dst + 64 * (size_t)k + 32), _mm256_loadu_si256((const __m256i *)(B + 32 * (size_t)k)));
    }
}

/* A pair of panels: interleaved codes c2, scratch sA / sB -> out [MR][16]. */
void qd_mk_pair(int type, int MR, const uint8_t *c2, const qd_scratch *sA, const qd_scratch *sB, int nb,
                const qd_acts *a, int m0, float *out) {
#define ZMKA(n, T, off, hm) z_mk_a(T, n, off, hm, c2, sA, sB, nb, a, m0, out)
#define ZMKK(n, nsub, fold) z_mk_k(n, nsub, fold, 0, c2, sA, sB, nb, a, m0, out)
#define A_CASE(T, chunk, off, hm) case T: MR_SWITCH(ZMKA, T, off, hm) break;
#define K_CASE(T, nsub, chunk, fold) case T: MR_SWITCH(ZMKK, nsub, fold) break;
    switch (type) { QD_TYPE_TABLE(A_CASE, K_CASE) }
#undef ZMKA
#undef ZMKK
#undef A_CASE
#undef K_CASE
}
#else
typedef int qd_no_avx512_kernels;  /* ISO C: a translation unit holds at least one declaration */
#endif  /* QD_ZMM */
