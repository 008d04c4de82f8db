/* The threading drivers of qdot's integer-dot matmul y[M][N] = x[M][K] . W[N][K]^T on x8 panels
   (qdot.h) and quantized activations (qdot_quant.c): qd_matmul, qd_group_run.

   OpenMP over groups of panels. Up to QD_FUSED_MAX rows (decode, vector builds: run_fused) each
   panel's codes are decoded in registers straight from memory, the panels split between threads by
   compare-and-swap ranges with stealing (qdot_sched.c); more rows (prefill: run_jobs) a thread
   decodes the panels of its group once into scratch (codes + scales, L1/L2 resident) and then runs
   every activation row over them, 4 rows per micro-kernel call: one pass over the weights in memory
   per call whatever the batch, and for prefill a cache-blocked GEMM (group of panels in L2, 4
   activation rows in L1). Which kernel computes a panel: qd_route (qdot_route.c); the kernels:
   qdot_mk_avx2.c, qdot_mk_avx512.c, qdot_portable.c (qdot's own float order), qdot_exact.c
   (llama.cpp's). */
#include "qdot.h"
#include <omp.h>

#define QD_GROUP_MAX 8  /* weights in one qd_group (qdot_lib.GROUP_MAX) */
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
static int panels_per_item(int K, int nb) {
    int G = (int)((192 * 1024) / scratch_bytes(K, nb));
#if defined(QD_ZMM)
    G = G / 2 * 2;  /* whole pairs (plus their interleaved codes: ~1.5x the scratch in L2) */
    return G < 2 ? 2 : G > 16 ? 16 : G;
#else
    return G < 1 ? 1 : G > 16 ? 16 : G;
#endif
}

/* One panel through the kernel qd_route named (qdot.h) */
static inline void run_panel(int kernel, int type, int fused, int MR, const uint8_t *codes, int stride,
                             const uint8_t *scl, const qd_scratch *s, int nb, const qd_acts *a, int m0, float *out) {
    if (qd_kernel_is_own(kernel)) qd_mk_panel(type, fused, MR, codes, stride, scl, s, nb, a, m0, out);
    else qd_exact_panel(kernel, type, fused, MR, codes, stride, scl, s, nb, a, m0, out);
}

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
        /* the kernel of these panels; a pair kernel's odd last panel of an item: the 256-bit one's */
        const int kern = QD_ROUTE_KERNEL(qd_route(jb->type, M, a->exact, QD_BUILD_ISA));
        const int pair_ok = qd_kernel_is_pair(kern);
        const int single = pair_ok ? QD_ROUTE_KERNEL(qd_route_odd(jb->type, M, a->exact)) : kern;
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
                    qd_interleave(codes[p - p0], codes[p + 1 - p0], K, pairs + (size_t)((p - p0) / 2) * K * 16);
            }
#endif
            for (int m0 = 0; m0 < M; m0 += MRMAX) {
                const int MR = M - m0 < MRMAX ? M - m0 : MRMAX;
                int p = p0;
#if defined(QD_ZMM)
                for (; pairs && p + 1 < p1; p += 2) {
                    float out[MRMAX * 16];
                    const uint8_t *c2 = pairs + (size_t)((p - p0) / 2) * K * 16;
                    if (qd_kernel_is_own(kern)) qd_mk_pair(jb->type, MR, c2, &sc[p - p0], &sc[p + 1 - p0], nb, a, m0, out);
                    else qd_exact_pair(kern, jb->type, MR, c2, &sc[p - p0], &sc[p + 1 - p0], nb, a, m0, out);
                    for (int q = 0; q < 2; ++q) {
                        const int n0 = 8 * (p + q), nn = jb->N - n0 < 8 ? jb->N - n0 : 8;
                        for (int m = 0; m < MR; ++m)
                            memcpy(jb->y + (size_t)(m0 + m) * jb->ldy + n0, out + 16 * m + 8 * q, sizeof(float) * nn);
                    }
                }
#endif
                for (; p < p1; ++p) {
                    float out[MRMAX * 8];
                    run_panel(single, jb->type, 0, MR, codes[p - p0], (int)qd_block_stride(t), jb->W + (size_t)p * pb,
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
    int need1 = 0, need2 = 0, kern[QD_GROUP_MAX];
    long start[QD_GROUP_MAX + 1];
    size_t sbmax = 0, pbmin = SIZE_MAX;
    start[0] = 0;
    for (int j = 0; j < nj; ++j) {
        const qd_type *t = qd_type_info(jobs[j].type);
        kern[j] = QD_ROUTE_KERNEL(qd_route(jobs[j].type, M, (t->kq ? a8_K : a8_0)->exact, QD_BUILD_ISA));
        /* the integer-dot kernels read these scales in place */
        const int inl = qd_kernel_is_own(kern[j]) || kern[j] == QD_KN_MK_K_TILED ? QD_INLINE_SCALES(jobs[j].type, 1) : 0;
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
        const int in_place = !qd_kernel_reads_scratch(kern[j]);
        const uint8_t *codes;
        if (!in_place) codes = qd_decode_panel(t, panel, K, &sc);  /* the reference kernels read scratch */
        else {
            if (!(qd_kernel_is_own(kern[j]) || kern[j] == QD_KN_MK_K_TILED) || !QD_INLINE_SCALES(jb->type, 1))
                qd_decode_scales(t, panel, K, &sc);
            codes = qd_codes_at(t, panel, 0);
        }
        for (int m0 = 0; m0 < M; m0 += MRMAX) {
            const int MR = M - m0 < MRMAX ? M - m0 : MRMAX;
            float out[MRMAX * 8];
            run_panel(kern[j], jb->type, in_place, MR, codes, (int)qd_block_stride(t), panel, &sc, nb, a, m0, out);
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

/* y[m * ldy + n] for m < M, n < N. Activations from qd_quantize_q8_0 (32-block types: xq, xd, xs,
   xs1) or qd_quantize_q8_K (K-quants: xq, xd, bsum). Returns 0, or -1 for an unknown type. */
int qd_matmul(int type, const uint8_t *W, int N, int K, const int8_t *xq, const float *xd, const int32_t *xs,
              const float *xs1, const int16_t *bsum, int M, float *y, long ldy, int nthreads, int exact) {
    const qd_type *t = qd_type_info(type);
    if (!t || K % t->bs || exact < QD_NUM_OWN || exact > QD_NUM_GGML_REF) return -1;
    if (M <= 0) return 0;
    qd_acts a = {xq, xd, xs, bsum, M, K, NULL, NULL, exact, NULL, NULL, xs1};
    if (exact && !t->kq) {
        int32_t *n16 = (int32_t *)tl_grow(&tl_act, &tl_act_cap, 2 * (size_t)M * K + 64), *n128 = n16 + (size_t)M * (K / 4);
        for (int m = 0; m < M; ++m) qd_exact_sums(xq + (size_t)m * K, K, n16 + (size_t)m * (K / 4), n128 + (size_t)m * (K / 4));
        a.n16 = n16;
        a.n128 = n128;
    }
    const qd_job job = {type, N, W, y, ldy};
    nthreads = threads_for((double)((N + 7) / 8) * qd_panel_bytes(t, K), M, nthreads);
    qd_range ranges[QD_MAX_THREADS];
    const int fused = qd_route(type, M, exact, QD_BUILD_ISA) & QD_ROUTE_FUSED;
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
    if (g->nw < 1 || g->nw > QD_GROUP_MAX || g->exact < QD_NUM_OWN || g->exact > QD_NUM_GGML_REF) return -1;
    if (M <= 0) return 0;
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
    const size_t need = (need0 ? q8 + 12 * n0 : 0) + (needK ? q8 + 4 * nK + 2 * (size_t)M * (K / 16) : 0)
                        + (need0 && g->exact ? 2 * q8 + 128 : 0) + 256;
    uint8_t *buf = (uint8_t *)tl_grow(&tl_act, &tl_act_cap, need), *p = buf;
    qd_acts a0 = {0}, aK = {0};
    if (need0) {
        a0.xq = (int8_t *)p; p += q8;
        a0.xd = (float *)p; p += 4 * n0;
        a0.xs = (int32_t *)p; p += 4 * n0;
        a0.xs1 = (float *)p; p += 4 * n0;
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
    const int fused = qd_route(g->types[0], M, g->exact, QD_BUILD_ISA) & QD_ROUTE_FUSED;  /* by M, for every type */
    #pragma omp parallel num_threads(nthreads)
    {
        if (fused) init_range(jobs, g->nw, K, ranges);
        #pragma omp for schedule(static)
        for (int m = 0; m < M; ++m) {
            if (need0) qd_quant_row_q8_0(x + (size_t)m * ldx, K, (int8_t *)a0.xq + (size_t)m * K,
                                         (float *)a0.xd + (size_t)m * (K / 32), (int32_t *)a0.xs + (size_t)m * (K / 32),
                                         (float *)a0.xs1 + (size_t)m * (K / 32));
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

/* Which code paths this build has, the `isa` of qd_route: 0 portable, 1 AVX2, 2 256-bit VNNI
   (native or emulated), 3 AVX-512 VNNI (pairs of panels in 512-bit vectors). */
int qd_isa_level(void) { return QD_BUILD_ISA; }
