/* GGUF blocks -> x8 panels (layout in qdot.h). Plain C: it runs once at load, over every quantized
   weight of the model, threaded over panels. */
#include "qdot.h"

/* One GGUF block -> its unsigned codes (canonical value per weight, see qdot.h). */
static void gguf_codes(int type, const uint8_t *b, uint8_t *q) {
    switch (type) {
    case QD_Q4_0: case QD_Q4_1: {
        const uint8_t *qs = b + (type == QD_Q4_0 ? 2 : 4);
        for (int j = 0; j < 16; ++j) { q[j] = qs[j] & 15; q[j + 16] = qs[j] >> 4; }
        break;
    }
    case QD_Q5_0: case QD_Q5_1: {
        const uint8_t *ph = b + (type == QD_Q5_0 ? 2 : 4), *qs = ph + 4;
        const uint32_t qh = (uint32_t)ph[0] | (uint32_t)ph[1] << 8 | (uint32_t)ph[2] << 16 | (uint32_t)ph[3] << 24;
        for (int j = 0; j < 16; ++j) {
            q[j] = (uint8_t)((qs[j] & 15) | ((qh >> j) & 1) << 4);
            q[j + 16] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
        }
        break;
    }
    case QD_Q8_0: memcpy(q, b + 2, 32); break;
    case QD_Q2_K: {
        const uint8_t *qs = b + 16;
        for (int n = 0; n < 2; ++n)
            for (int l = 0; l < 4; ++l)
                for (int i = 0; i < 32; ++i) q[128 * n + 32 * l + i] = (qs[32 * n + i] >> (2 * l)) & 3;
        break;
    }
    case QD_Q3_K: {
        const uint8_t *hm = b, *qs = b + 32;
        for (int n = 0; n < 2; ++n)
            for (int l = 0; l < 4; ++l)
                for (int i = 0; i < 32; ++i)
                    q[128 * n + 32 * l + i] = (uint8_t)(((qs[32 * n + i] >> (2 * l)) & 3) | ((hm[i] >> (4 * n + l)) & 1) << 2);
        break;
    }
    case QD_Q4_K: case QD_Q5_K: {
        const uint8_t *qs = b + (type == QD_Q4_K ? 16 : 48), *qh = b + 16;
        for (int j = 0; j < 4; ++j)
            for (int l = 0; l < 32; ++l) { q[64 * j + l] = qs[32 * j + l] & 15; q[64 * j + 32 + l] = qs[32 * j + l] >> 4; }
        if (type == QD_Q5_K)
            for (int s = 0; s < 8; ++s)
                for (int l = 0; l < 32; ++l) q[32 * s + l] |= (uint8_t)(((qh[l] >> s) & 1) << 4);
        break;
    }
    case QD_Q6_K: {
        for (int n = 0; n < 2; ++n) {
            const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
            for (int l = 0; l < 32; ++l) {
                q[128 * n + l] = (uint8_t)((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4);
                q[128 * n + 32 + l] = (uint8_t)((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4);
                q[128 * n + 64 + l] = (uint8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
                q[128 * n + 96 + l] = (uint8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
            }
        }
        break;
    }
    }
}

/* Planes of one 32-column group, row r: c[32] canonical codes -> group bytes g. */
static inline uint32_t ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline void st32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

static void put_nib(uint8_t *g, int r, const uint8_t *c) {
    for (int v = 0; v < 4; ++v)
        st32(g + 32 * v + 4 * r, (ld32(c + 4 * v) & 0x0F0F0F0Fu) | (ld32(c + 4 * v + 16) & 0x0F0F0F0Fu) << 4);
}

/* bit `src` of the 32 codes as a 32-bit mask (bit i = code i) */
static inline uint32_t bitmask32(const uint8_t *c, int src) {
#if defined(QD_AVX2)
    const __m256i v = _mm256_loadu_si256((const __m256i *)c);
    return (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(v, 7 - src));
#else
    uint32_t m = 0;
    for (int i = 0; i < 32; ++i) m |= (uint32_t)((c[i] >> src) & 1) << i;
    return m;
#endif
}

/* bits j, j + 4, ..., j + 28 of m, packed (pext with the mask 0x11111111 << j) */
static inline uint32_t every4th(uint32_t m, int j) {
#if defined(__BMI2__)
    return _pext_u32(m, 0x11111111u << j);
#else
    uint32_t b = 0;
    for (int kg = 0; kg < 8; ++kg) b |= ((m >> (4 * kg + j)) & 1u) << kg;
    return b;
#endif
}

/* one bit plane from the mask of that bit (bit i = weight i of the group) */
static void put_bit1_mask(uint8_t *g, int r, uint32_t m) {
    for (int j = 0; j < 4; ++j) g[4 * r + j] = (uint8_t)every4th(m, j);
}
static void put_bit1(uint8_t *g, int r, const uint8_t *c, int src) { put_bit1_mask(g, r, bitmask32(c, src)); }

static void put_bit2(uint8_t *g, int r, const uint8_t *c, int src) {
    const uint32_t m0 = bitmask32(c, src), m1 = bitmask32(c, src + 1);
    for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 4; ++j) {
            /* k-groups 4h + t, t = 0..3: bits 16h + 4t + j */
            const uint32_t b0 = every4th(m0 >> (16 * h), j) & 15, b1 = every4th(m1 >> (16 * h), j) & 15;
            unsigned byte = 0;
            for (int t = 0; t < 4; ++t) byte |= (((b0 >> t) & 1u) | ((b1 >> t) & 1u) << 1) << (2 * t);
            g[32 * h + 4 * r + j] = (uint8_t)byte;
        }
}
static void put_b8(uint8_t *g, int r, const uint8_t *c) {
    for (int kg = 0; kg < 8; ++kg) st32(g + 32 * kg + 4 * r, ld32(c + 4 * kg));
}

static void put_group(int type, uint8_t *g, int r, const uint8_t *c) {
    switch (type) {
    case QD_Q4_0: case QD_Q4_1: case QD_Q4_K: put_nib(g, r, c); break;
    case QD_Q5_0: case QD_Q5_1: case QD_Q5_K: put_nib(g, r, c); put_bit1(g + 128, r, c, 4); break;
    case QD_Q6_K: put_nib(g, r, c); put_bit2(g + 128, r, c, 4); break;
    case QD_Q3_K: put_bit2(g, r, c, 0); put_bit1(g + 64, r, c, 2); break;
    case QD_Q2_K: put_bit2(g, r, c, 0); break;
    case QD_Q8_0: put_b8(g, r, c); break;
    }
}

/* Scale fields of one GGUF block (row r) -> the block's scale region s (8 rows side by side). */
static void put_scales(int type, uint8_t *s, int r, const uint8_t *b) {
    switch (type) {
    case QD_Q4_0: case QD_Q5_0: case QD_Q8_0: memcpy(s + 2 * r, b, 2); break;
    case QD_Q4_1: case QD_Q5_1: memcpy(s + 2 * r, b, 2); memcpy(s + 16 + 2 * r, b + 2, 2); break;
    case QD_Q4_K: case QD_Q5_K:
        memcpy(s + 2 * r, b, 2); memcpy(s + 16 + 2 * r, b + 2, 2);
        for (int w = 0; w < 3; ++w) memcpy(s + 32 + 4 * (8 * w + r), b + 4 + 4 * w, 4);
        break;
    case QD_Q6_K:
        memcpy(s + 2 * r, b + 208, 2);
        for (int j = 0; j < 16; ++j) s[16 + 8 * j + r] = b[192 + j];
        break;
    case QD_Q3_K:
        memcpy(s + 2 * r, b + 108, 2);
        for (int w = 0; w < 3; ++w) memcpy(s + 16 + 4 * (8 * w + r), b + 96 + 4 * w, 4);
        break;
    case QD_Q2_K:
        memcpy(s + 2 * r, b + 80, 2); memcpy(s + 16 + 2 * r, b + 82, 2);
        for (int j = 0; j < 16; ++j) s[32 + 8 * j + r] = b[j];
        break;
    }
}

/* src: N rows of K / bs GGUF blocks each (row stride src_stride bytes); dst: ceil(N / 8) panels of
   qd_panel_bytes(K) bytes. Rows past N are zero (zero scales: they contribute nothing). */
int qd_repack(int type, const uint8_t *src, long src_stride, int N, int K, uint8_t *dst, int nthreads) {
    const qd_type *t = qd_type_info(type);
    if (!t || K % t->bs) return -1;
    const int nb = K / t->bs, ng = t->bs / 32, gbytes = t->codes / ng, np = (N + 7) / 8;
    const size_t pb = qd_panel_bytes(t, K);
    #pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int p = 0; p < np; ++p) {
        uint8_t *panel = dst + (size_t)p * pb;
        uint8_t q[256];
        memset(panel, 0, pb);
        for (int r = 0; r < 8 && 8 * p + r < N; ++r) {
            const uint8_t *row = src + (size_t)(8 * p + r) * src_stride;
            for (int b = 0; b < nb; ++b) {
                const uint8_t *blk = row + (size_t)b * t->ts;
                if (!t->kq) {  /* 32-blocks: GGUF qs are already our nibble plane; qh our bit mask */
                    uint8_t *g = (uint8_t *)qd_codes_at(t, panel, b);
                    const int o = type == QD_Q4_0 || type == QD_Q5_0 || type == QD_Q8_0 ? 2 : 4;
                    if (type == QD_Q8_0) {
                        for (int kg = 0; kg < 8; ++kg) st32(g + 32 * kg + 4 * r, ld32(blk + 2 + 4 * kg));
                    } else {
                        const int hb = type == QD_Q5_0 || type == QD_Q5_1;
                        const uint8_t *qs = blk + o + (hb ? 4 : 0);
                        for (int v = 0; v < 4; ++v) st32(g + 32 * v + 4 * r, ld32(qs + 4 * v));
                        if (hb) put_bit1_mask(g + 128, r, ld32(blk + o));
                    }
                    put_scales(type, (uint8_t *)qd_scales_at(t, panel, b), r, blk);
                    continue;
                }
                gguf_codes(type, blk, q);
                for (int g = 0; g < ng; ++g) put_group(type, (uint8_t *)qd_codes_at(t, panel, b) + g * gbytes, r, q + 32 * g);
                put_scales(type, (uint8_t *)qd_scales_at(t, panel, b), r, blk);
            }
        }
    }
    return 0;
}

/* Drop the pages of [p, p + n) (page-aligned interior only) from this process: for the mapped GGUF
   bytes of a tensor just repacked, so that the load never holds two copies. Clean file-backed pages
   are only unmapped (a later read faults them back from the page cache); never call this on
   memory that was written. Returns 0 or the errno of madvise. */
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#include <errno.h>
int qd_release(const void *p, size_t n) {
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1), e = ((uintptr_t)p + n) & ~(pg - 1);
    if (e <= a) return 0;
    return madvise((void *)a, e - a, MADV_DONTNEED) ? errno : 0;
}
#else
int qd_release(const void *p, size_t n) { (void)p; (void)n; return 0; }
#endif

size_t qd_repacked_bytes(int type, int N, int K) {
    const qd_type *t = qd_type_info(type);
    return t ? (size_t)((N + 7) / 8) * qd_panel_bytes(t, K) : 0;
}

/* n matrices in one call (the server's start-up repack runs beside Python imports: one release of
   the GIL for all of them, not one per matrix): qd_repack of each, then with `release` qd_release of
   its source rows. Returns 0, or 1 + the index of the first matrix that failed. */
int qd_repack_many(int n, const int *types, const uint8_t *const *src, const long *src_stride, const int *N,
                   const int *K, uint8_t *const *dst, int nthreads, int release) {
    for (int i = 0; i < n; ++i) {
        if (qd_repack(types[i], src[i], src_stride[i], N[i], K[i], dst[i], nthreads)) return 1 + i;
        if (release) qd_release(src[i], (size_t)N[i] * (size_t)src_stride[i]);
    }
    return 0;
}
