/* The code vectors of qdot's x8 panels (qdot.h), decoded in registers (AVX2): shared by the
   integer-dot micro-kernels (qdot_mk_avx2.h, qdot_mk_avx512.h), the kernels in llama.cpp's float
   order (qdot_exact.c) and the panel decoder (qdot_panel.c); and the micro-kernels' parameters per
   type (QD_TYPE_TABLE). */
#ifndef QDOT_CODES_H
#define QDOT_CODES_H
#include "qdot.h"
#if defined(QD_AVX2)
#define ALWAYS static inline __attribute__((always_inline))

ALWAYS __m256i bcast4(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return _mm256_set1_epi32(v); }
ALWAYS __m256i ldv(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
/* int16 pairs (lo, hi) of the int32 lanes of lo and hi (|lane| < 2^15): vpmaddwd's second operand */
ALWAYS __m256i pairs(__m256i lo, __m256i hi) {
    return _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(hi, 16));
}

/* Code vector of k-group kg (0..7) of one 32-column group of a panel, decoded in registers from the
   x8 planes (qdot.h): the small-batch kernels read the weights once, straight from memory. */
ALWAYS __m256i mvb(__m256i v, int from, int to) {
    return to >= from ? _mm256_slli_epi16(v, to - from) : _mm256_srli_epi16(v, from - to);
}
ALWAYS __m256i nib_kg(const uint8_t *g, int kg) {
    const __m256i n = ldv(g + 32 * (kg % 4)), m4 = _mm256_set1_epi8(15);
    return kg < 4 ? _mm256_and_si256(n, m4) : _mm256_and_si256(_mm256_srli_epi16(n, 4), m4);
}
/* lo | (hi & mask): one vpternlogd where AVX-512VL has it (a K-quant's high bits onto its nibbles) */
ALWAYS __m256i or_masked(__m256i lo, __m256i hi, int mask) {
#if defined(__AVX512VL__)
    return _mm256_ternarylogic_epi32(lo, hi, _mm256_set1_epi8((char)mask), 0xF8);
#else
    return _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi8((char)mask)));
#endif
}
ALWAYS __m256i code_kg(const int type, const uint8_t *g, int kg) {
    switch (type) {
    case QD_Q4_0: case QD_Q4_1: case QD_Q4_K: return nib_kg(g, kg);
    case QD_Q5_0: case QD_Q5_1: case QD_Q5_K:
        return or_masked(nib_kg(g, kg), mvb(ldv(g + 128), kg, 4), 0x10);
    case QD_Q6_K:
        return or_masked(nib_kg(g, kg), mvb(ldv(g + 128 + 32 * (kg / 4)), 2 * (kg % 4), 4), 0x30);
    case QD_Q3_K:
        return _mm256_or_si256(_mm256_and_si256(mvb(ldv(g + 32 * (kg / 4)), 2 * (kg % 4), 0), _mm256_set1_epi8(3)),
                               _mm256_and_si256(mvb(ldv(g + 64), kg, 2), _mm256_set1_epi8(4)));
    case QD_Q2_K:
        return _mm256_and_si256(mvb(ldv(g + 32 * (kg / 4)), 2 * (kg % 4), 0), _mm256_set1_epi8(3));
    default: /* Q8_0 */
        return ldv(g + 32 * kg);
    }
}

/* The code vector of k-group k (0 .. bs/4 - 1) of block b: from the decoded scratch (stride 256 per
   32 columns) or, fused, from the panel itself (codes of block 0 at `codes`, the blocks `stride`
   bytes apart, gbytes per 32-column group). */
ALWAYS __m256i wv(const int type, const int fused, const uint8_t *codes, int stride, int gbytes, int bs, int b, int k) {
    if (fused && type != QD_Q8_0) return code_kg(type, codes + (size_t)b * stride + (size_t)(k / 8) * gbytes, k % 8);
    if (fused) return ldv(codes + (size_t)b * stride + 32 * k);  /* Q8_0 */
    return ldv(codes + (size_t)b * bs * 8 + 32 * k);
}

/* Every type's micro-kernel parameters, once for every instantiation (qd_mk_panel, qd_mk_pair,
   qd_exact_panel, qd_exact_pair): 32-blocks A(type, chunk, off, has_m), K-quants K(type, nsub,
   chunk, fold) (see mk_a / mk_k, qdot_mk_avx2.h). */
#define QD_TYPE_TABLE(A, K) \
    A(QD_Q4_0, 8, 8, 0) A(QD_Q4_1, 8, 0, 1) A(QD_Q5_0, 4, 16, 0) A(QD_Q5_1, 4, 0, 1) A(QD_Q8_0, 1, 0, 0) \
    K(QD_Q2_K, 16, 4, 0) K(QD_Q3_K, 16, 4, 1) K(QD_Q4_K, 8, 8, 0) K(QD_Q5_K, 8, 4, 0) K(QD_Q6_K, 16, 2, 1)

/* F(n, ...) with the row count n = MR as a constant (1..4) */
#define MR_SWITCH(F, ...) switch (MR) { case 1: F(1, __VA_ARGS__); break; case 2: F(2, __VA_ARGS__); break; \
                                        case 3: F(3, __VA_ARGS__); break; default: F(4, __VA_ARGS__); }

#endif  /* QD_AVX2 */
#endif  /* QDOT_CODES_H */
