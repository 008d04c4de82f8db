/* qdot: integer-dot quantized matmul for the CPU path (see kernels/cpu/qdot.py).

   Weights: every GGUF quantized type is repacked once into "x8" panels of 8 output rows, holding
   exactly the bits of the GGUF blocks (same size, up to < 64 bytes of padding per panel):

     panel p (rows 8p .. 8p+7) = [scales of block 0][codes of block 0][scales of block 1][codes of
                                 block 1]... (padded to 64 bytes)

   The codes of a block are grouped by 32 columns; inside a group every plane is one 32-byte vector
   of "8 rows x 4 consecutive columns" (byte r * 4 + j is row r, column 4 * kg + j of k-group kg),
   so one u8 x s8 dot instruction against 4 broadcast activation bytes gives the 8 rows' partial
   sums in the 8 int32 lanes: no horizontal reductions, per-row scales applied lane-wise.

     nib  (4 x 32 B): plane v: low nibble = bits 0-3 of k-group v, high nibble = of k-group v + 4
     bit1 (1 x 32 B): bit kg of byte (r, j) = one more bit (bit 4 of Q5_*, bit 2 of Q3_K)
     bit2 (2 x 32 B): plane h: bits 2t, 2t+1 = a 2-bit field of k-group 4h + t
                      (bits 4-5 of Q6_K, bits 0-1 of Q3_K / Q2_K)
     b8   (8 x 32 B): plane kg: the signed Q8_0 bytes

   Codes are unsigned (0 .. 2^bits - 1); the signed offset of a type (Q4_0: -8, Q5_0: -16,
   Q6_K: -32, Q3_K: -4) is applied through the activation block sums. Scale fields keep their
   GGUF encoding (fp16 d / dmin, packed 6-bit K-quant scales), 8 rows side by side.

   Activations: quantized per row like llama.cpp (Q8_0-style per 32 for the 32-blocks, Q8_K-style
   per 256 with per-16 sums for the K-quants), int8 codes + float32 scale + integer sums. */
#ifndef QDOT_H
#define QDOT_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <stdatomic.h>

#if defined(__AVX2__)
#include <immintrin.h>
#define QD_AVX2 1
#endif

/* The int8 dot primitive: acc(int32 x 8) += sum over 4 bytes of u8 x s8.
   VNNI where the CPU has it (AVX-512 VNNI with VL, or AVX-VNNI); QDOT_EMULATE_VNNI builds the same
   VNNI code paths on plain AVX2 with an exact emulation of vpdpbusd (tests only). */
#if defined(QD_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define QD_VNNI 1
#define QD_DPBUSD(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#elif defined(QD_AVX2) && defined(__AVXVNNI__)
#define QD_VNNI 1
#define QD_DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#elif defined(QD_AVX2) && defined(QDOT_EMULATE_VNNI)
#define QD_VNNI 1
static inline __m256i qd_dpbusd_emu(__m256i acc, __m256i u, __m256i s) {
    /* exact: widen to 16 bits (no saturation), pairwise products in 32 bits, then pairs of pairs */
    const __m256i m = _mm256_set1_epi16(0x00FF);
    __m256i ue = _mm256_and_si256(u, m), uo = _mm256_srli_epi16(u, 8);
    __m256i se = _mm256_srai_epi16(_mm256_slli_epi16(s, 8), 8), so = _mm256_srai_epi16(s, 8);
    __m256i pe = _mm256_madd_epi16(ue, se), po = _mm256_madd_epi16(uo, so); /* per 32-bit lane: 2 products each */
    return _mm256_add_epi32(acc, _mm256_add_epi32(pe, po));
}
#define QD_DPBUSD(acc, u, s) qd_dpbusd_emu((acc), (u), (s))
#endif
/* AVX-512 VNNI builds run prefill's panels in pairs, 16 weight rows per 512-bit vector
   (qdot_mk_avx512.c) */
#if defined(QD_VNNI) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define QD_ZMM 1
#endif

/* GGML type ids */
enum { QD_Q4_0 = 2, QD_Q4_1 = 3, QD_Q5_0 = 6, QD_Q5_1 = 7, QD_Q8_0 = 8,
       QD_Q2_K = 10, QD_Q3_K = 11, QD_Q4_K = 12, QD_Q5_K = 13, QD_Q6_K = 14 };

typedef struct {
    int type;
    int bs;        /* weights per GGUF block (32 or 256) */
    int ts;        /* bytes per GGUF block */
    int kq;        /* 1: K-quant (Q8_K activations), 0: 32-block type (Q8_0 activations) */
    int codes;     /* code bytes per block per panel (8 rows) */
    int scales;    /* scale bytes per block per panel */
    int nsub;      /* K-quants: scale sub-blocks per 256 (8 or 16) */
} qd_type;

static inline const qd_type *qd_type_info(int type) {
    static const qd_type T[] = {
        {QD_Q4_0, 32, 18, 0, 128, 16, 0},   {QD_Q4_1, 32, 20, 0, 128, 32, 0},
        {QD_Q5_0, 32, 22, 0, 160, 16, 0},   {QD_Q5_1, 32, 24, 0, 160, 32, 0},
        {QD_Q8_0, 32, 34, 0, 256, 16, 0},   {QD_Q2_K, 256, 84, 1, 512, 160, 16},
        {QD_Q3_K, 256, 110, 1, 768, 112, 16}, {QD_Q4_K, 256, 144, 1, 1024, 128, 8},
        {QD_Q5_K, 256, 176, 1, 1280, 128, 8}, {QD_Q6_K, 256, 210, 1, 1536, 144, 16},
    };
    for (unsigned i = 0; i < sizeof T / sizeof T[0]; ++i)
        if (T[i].type == type) return &T[i];
    return 0;
}

/* panel = for each block: [its scale fields][its codes], the blocks one after another, the whole
   padded to 64 bytes: one sequential stream over the weight, each block's scales just before the
   codes they scale (read front to back by the small-batch kernels, which take the scale fields in
   place: with all scales of a panel ahead of all its codes, two streams a panel apart, the hardware
   prefetchers left the scale reads of a 1.5B model's decode step waiting on memory) */
static inline size_t qd_block_stride(const qd_type *t) { return (size_t)t->scales + (size_t)t->codes; }
static inline size_t qd_panel_bytes(const qd_type *t, int K) {
    return ((size_t)(K / t->bs) * qd_block_stride(t) + 63) & ~(size_t)63;
}
static inline const uint8_t *qd_scales_at(const qd_type *t, const uint8_t *panel, int b) {
    return panel + (size_t)b * qd_block_stride(t);
}
static inline const uint8_t *qd_codes_at(const qd_type *t, const uint8_t *panel, int b) {
    return panel + (size_t)b * qd_block_stride(t) + t->scales;
}

static inline float qd_f16(uint16_t h) {
    const uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    uint32_t u;
    if (e == 0) {
        if (m == 0) u = s;
        else { /* subnormal: normalise */
            int ee = -1; uint32_t mm = m;
            do { ++ee; mm <<= 1; } while (!(mm & 0x400));
            u = s | ((uint32_t)(127 - 15 - ee) << 23) | ((mm & 0x3FF) << 13);
        }
    } else if (e == 31) u = s | 0x7F800000 | (m << 13);
    else u = s | ((e + 112) << 23) | (m << 13);
    float f; memcpy(&f, &u, 4); return f;
}

/* x rounded to the nearest IEEE half (ties to even; half subnormals kept, underflow to 0), back
   in float32: what llama.cpp's GGML_CPU_FP32_TO_FP16 stores (F16C's vcvtps2ph with rounding mode
   0, or ggml's portable bit trick, which this one is). */
static inline float qd_round_f16(float x) {
#if defined(__F16C__)
    return _cvtsh_ss(_cvtss_sh(x, 0));
#else
    uint32_t w; memcpy(&w, &x, 4);
    const uint32_t shl1 = w + w, sign = w & 0x80000000u;
    float base = (fabsf(x) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t bias = shl1 & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    const uint32_t bb = (bias >> 1) + 0x07800000u;
    float fb; memcpy(&fb, &bb, 4);
    base = fb + base;
    uint32_t bits; memcpy(&bits, &base, 4);
    const uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
    const uint16_t h = (uint16_t)((sign >> 16) | (shl1 > 0xFF000000u ? 0x7E00u : nonsign));
    return qd_f16(h);
#endif
}

/* Decoded panel (scratch), one per thread: codes [K / 4][32] u8 (Q8_0: its signed bytes, copied;
   the VNNI kernels bias them by +128 as they load them); per block: d [8] and dmin / m [8]
   float32; K-quants also sc [nsub][8] int32 (in the AVX2 build an int16 pair (s, s) per lane, for
   vpmaddwd; int32 otherwise) and mn [8][8] int32 = int16 pairs (mn of the two 16-column halves) that
   multiply the activation block sums pairwise. */
typedef struct {
    uint8_t *codes;
    float *d, *dm;
    int32_t *sc, *mn;
} qd_scratch;

/* Activations of M rows: xq int8 [M][K]; xd float [M][K / bs]; 32-blocks: xs int32 [M][K / 32]
   (sum of the codes of each block) and xs1 float [M][K / 32] (llama.cpp's q8_1 `s`: the fp16 of the
   unrounded d times that sum, for Q4_1 / Q5_1 in its order); K-quants: bsum int16 [M][K / 16]. */
typedef struct {
    const int8_t *xq;
    const float *xd;
    const int32_t *xs;
    const int16_t *bsum;
    int M, K;
    /* made per call by each thread of run_fused for the kernels that read scales in place
       (qdot_gemm.c): Q6_K: boff int32 [M][K / 16] = -32 * bsum; Q4_K / Q5_K: bm int8 [M][K / 256][16], the sums
       of the 8 32-column sub-blocks split as 128 * hi + lo (lo 0..127): lo[8] then hi[8] */
    const int32_t *boff;
    const int8_t *bm;
    int exact;  /* the numerics (QD_NUM_*): 0 qdot's own float order, 1 llama.cpp's where qdot_exact.c
                   has it, 2 the same through its portable reference kernels (tests) */
    const int32_t *n16;  /* exact, 32-block types: int32 [M][K / 4], -16 x the sum of each 4 activation codes */
    const int32_t *n128; /* the same x 8 (Q8_0's +128 bias on VNNI) */
    const float *xs1;    /* 32-blocks: the q8_1 `s` of each block (see above) */
} qd_acts;

/* qdot_sched.c: the small batches' work split. A thread's range of panel indices (over the jobs of
   a call, in order), front | back << 32: the owner takes from the front, other threads steal from
   the back once theirs is empty. One cache line each. */
typedef struct {
    _Alignas(64) _Atomic uint64_t w;
    char pad[56];
} qd_range;
#define QD_MAX_THREADS 64
/* thread tid of nt: the panels whose middle byte falls in its share of the jobs' bytes */
void qd_range_init(qd_range *r, const int *np, const size_t *panel_bytes, int nj, int tid, int nt);
long qd_take_front(qd_range *r, int n, int *got);  /* the first of *got <= n panels, or -1 when empty */
long qd_take_back(qd_range *r);                     /* one panel, or -1 */

/* qdot_panel.c: one panel -> scratch. Returns the codes to read ([K / 4][32]), in the scratch
   (Q8_0's copied as they are). `qd_decode_panel` is the build's vector version,
   `qd_decode_panel_scalar` the portable one (always int32 scales). */
const uint8_t *qd_decode_panel(const qd_type *t, const uint8_t *panel, int K, qd_scratch *s);
const uint8_t *qd_decode_panel_scalar(const qd_type *t, const uint8_t *panel, int K, qd_scratch *s);

/* ---- which kernel computes a panel (qdot_route.c; the table in kernels/README.md) ------------
   qd_route(type, rows, numerics, isa): the kernel (QD_KN_*) that computes the panels of a matmul of
   `rows` activation rows of a weight of GGML `type`, in `numerics`, in a build of `isa`, or'ed with
   QD_ROUTE_FUSED when the panels are read in place (run_fused) rather than decoded into scratch
   (run_jobs); -1 for arguments out of range. A pair kernel's odd last panel of a work item runs
   qd_route_odd(type, rows, numerics). The drivers (qdot_gemm.c) ask it for every call. */
enum { QD_NUM_OWN = 0, QD_NUM_GGML = 1, QD_NUM_GGML_REF = 2 };
/* levels of the ladder (kernels/cpu/isa.py): portable C, AVX2, 256-bit VNNI (AVX-VNNI or emulated),
   AVX-512 VNNI */
enum { QD_ISA_SCALAR = 0, QD_ISA_AVX2 = 1, QD_ISA_VNNI = 2, QD_ISA_AVX512VNNI = 3 };
#if defined(QD_ZMM)
#define QD_BUILD_ISA QD_ISA_AVX512VNNI
#elif defined(QD_VNNI)
#define QD_BUILD_ISA QD_ISA_VNNI
#elif defined(QD_AVX2)
#define QD_BUILD_ISA QD_ISA_AVX2
#else
#define QD_BUILD_ISA QD_ISA_SCALAR
#endif
enum {
    QD_KN_PANEL,          /* qdot_portable.c run_panel: the portable build's own order */
    QD_KN_MK_A,           /* qdot_mk_avx2.c mk_a: 32-block types, 8 rows in 256-bit lanes */
    QD_KN_MK_K,           /* qdot_mk_avx2.c mk_k: K-quants */
    QD_KN_Z_MK_A,         /* qdot_mk_avx512.c z_mk_a: two panels per 512-bit vector */
    QD_KN_Z_MK_K,         /* qdot_mk_avx512.c z_mk_k */
    QD_KN_MK_K_TILED,     /* qdot_exact.c: mk_k with llama.cpp's tiled K-quant epilogue (from 8 rows) */
    QD_KN_Z_MK_K_TILED,   /* qdot_exact.c: z_mk_k with it */
    QD_KN_Z_MK_Q4K_EXACT, /* qdot_exact.c z_mk_q4k_exact: Q4_K's gemm/gemv order in pairs */
    QD_KN_SIMD_32,        /* qdot_exact.c simd_32: Q5_0 / Q8_0 / Q4_1 / Q5_1 in llama.cpp's lanes */
    QD_KN_SIMD_Q6_K,      /* qdot_exact.c simd_q6_K */
    QD_KN_SIMD_Q4_K,      /* qdot_exact.c simd_q4_K */
    QD_KN_SIMD_K_DOT,     /* qdot_exact.c simd_k_dot: Q2_K / Q3_K / Q5_K under 8 rows (their vec_dot) */
    QD_KN_REF_32,         /* qdot_exact.c ref_32: the portable reference of simd_32 */
    QD_KN_REF_Q6_K,       /* qdot_exact.c ref_q6_K */
    QD_KN_REF_Q4_K,       /* qdot_exact.c ref_q4_K */
    QD_KN_REF_K_TILED,    /* qdot_exact.c ref_k_tiled: the tiled K-quant order, portable */
    QD_KN_REF_K_DOT,      /* qdot_exact.c ref_k_dot: the portable reference of simd_k_dot */
    QD_KN_COUNT
};
#define QD_ROUTE_FUSED 0x100
#define QD_ROUTE_KERNEL(r) ((r) & 0xFF)
int qd_route(int type, int rows, int numerics, int isa);
int qd_route_odd(int type, int rows, int numerics);  /* a pair kernel's odd last panel (qdot_route.c) */
const char *qd_kernel_name(int kernel);  /* "mk_k", ... (NULL out of range) */
const char *qd_kernel_file(int kernel);  /* "qdot_mk_avx2.c", ... */
int qd_kernel_pair(int kernel);           /* qd_kernel_is_pair, exported */
static inline int qd_kernel_is_pair(int k) {
    return k == QD_KN_Z_MK_A || k == QD_KN_Z_MK_K || k == QD_KN_Z_MK_K_TILED || k == QD_KN_Z_MK_Q4K_EXACT;
}
/* in qdot's own float order (qdot_mk_avx2.c, qdot_mk_avx512.c, qdot_portable.c), else qdot_exact.c */
static inline int qd_kernel_is_own(int k) {
    return k == QD_KN_PANEL || k == QD_KN_MK_A || k == QD_KN_MK_K || k == QD_KN_Z_MK_A || k == QD_KN_Z_MK_K;
}
/* reads the panel decoded into scratch even where the driver could read it in place */
static inline int qd_kernel_reads_scratch(int k) { return k == QD_KN_PANEL || k >= QD_KN_REF_32; }

/* Up to QD_FUSED_MAX rows (AVX2 builds): the codes decoded in registers from the panels
   (run_fused), MRMAX rows per micro-kernel call. */
#ifndef QD_FUSED_MAX
#define QD_FUSED_MAX 8
#endif
#define MRMAX 4
/* Small batches of the K-quants on VNNI read the scale fields straight from the panel (each block's
   just before its codes) instead of a decoded copy in scratch: no round trip through memory.
   1: Q6_K (one vpmovsxbd per sub-block; each sub-block's int32 sum starts at -32 * its activation
   sum, so no mins pass); 2: Q4_K / Q5_K (the 6-bit fields unpacked in registers; the mins by four
   vpdpbusd against the sub-block sums split into bytes). The same integers as the scratch path:
   the same bits. */
#if defined(QD_VNNI)
#define QD_INLINE_SCALES(type, fused) \
    ((fused) ? (type) == QD_Q6_K ? 1 : ((type) == QD_Q4_K || (type) == QD_Q5_K) ? 2 : 0 : 0)
#else
#define QD_INLINE_SCALES(type, fused) 0
#endif

/* The kernels of one panel (8 weight rows) for MR <= MRMAX activation rows from m0 -> out [MR][8].
   fused: the codes read from the panel itself (`codes` = its first block's, the blocks `stride`
   bytes apart; `scl` its scale fields, read in place where QD_INLINE_SCALES), else from the
   decoded scratch `s`. qd_mk_panel: qdot's own order (qdot_mk_avx2.c, or qdot_portable.c in the
   portable build); qd_exact_panel: the kernel `kernel` of qdot_exact.c. */
void qd_mk_panel(int type, int fused, int MR, const uint8_t *codes, int stride, const uint8_t *scl,
                 const qd_scratch *s, int nb, const qd_acts *a, int m0, float *out);
void qd_exact_panel(int kernel, int type, int fused, int MR, const uint8_t *codes, int stride, const uint8_t *scl,
                    const qd_scratch *s, int nb, const qd_acts *a, int m0, float *out);
/* A pair of panels (AVX-512 VNNI builds): their decoded codes interleaved by qd_interleave
   ([K / 4][64]), scratch sA / sB -> out [MR][16]; qd_mk_pair in qdot_mk_avx512.c, qd_exact_pair
   (the kernel `kernel`) in qdot_exact.c. */
void qd_interleave(const uint8_t *A, const uint8_t *B, int K, uint8_t *dst);
void qd_mk_pair(int type, int MR, const uint8_t *c2, const qd_scratch *sA, const qd_scratch *sB, int nb,
                const qd_acts *a, int m0, float *out);
void qd_exact_pair(int kernel, int type, int MR, const uint8_t *c2, const qd_scratch *sA, const qd_scratch *sB,
                   int nb, const qd_acts *a, int m0, float *out);
void qd_exact_sums(const int8_t *xq, int K, int32_t *n16, int32_t *n128);  /* one row's n16, n128 (qd_acts) */
/* qdot_quant.c: one activation row */
void qd_quant_row_q8_0(const float *x, int K, int8_t *q, float *d, int32_t *s, float *s1);
void qd_quant_row_q8_K(const float *x, int K, int8_t *q, float *d, int16_t *bs);
/* the scales only (the small-batch kernels decode the codes in registers) */
void qd_decode_scales(const qd_type *t, const uint8_t *panel, int K, qd_scratch *s);

#endif
