/* Work split of the small-batch matmuls (kernels/cpu/qdot_gemm.c, `run_fused`).

   The panels of a call's jobs (weights one after another) are one index space, cut by weight bytes
   into one contiguous range per thread, as the static split of the larger batches is. Each thread
   takes the panels of its range from the front, one at a time, so that it streams its weights
   front to back; once its own range is empty it takes panels from the back of the other threads'
   ranges. The owner takes a few panels per compare-and-swap (QD_CHUNK_BYTES of weights: one per
   panel cost ~2.5 ms of a 1.5B model's ~32 ms step of matmuls here), thieves one at a time.
   A core that another tenant slows, or that got the slower half of the memory, no longer
   holds the whole call up at its barrier: the other one finishes the rest.

   A range is one 64-bit word, front | back << 32, changed only by compare-and-swap: the owner moves
   the front up, thieves move the back down, and a panel is taken by exactly one of them. */
#include "qdot.h"

static inline uint64_t pack(uint32_t front, uint32_t back) { return (uint64_t)front | (uint64_t)back << 32; }

/* panels of a job (first at byte `at`, panel_bytes each) whose middle byte lies below x */
static long below(double x, double at, double panel_bytes, long np) {
    const double v = ceil((x - at) / panel_bytes - 0.5);
    return v <= 0 ? 0 : v >= (double)np ? np : (long)v;
}

void qd_range_init(qd_range *r, const int *np, const size_t *panel_bytes, int nj, int tid, int nt) {
    double total = 0;
    for (int j = 0; j < nj; ++j) total += (double)np[j] * (double)panel_bytes[j];
    /* the thread owns the panels whose middle byte falls in [lo, hi): the same expression gives one
       thread's hi and the next one's lo, so the ranges tile the index space */
    const double lo = total * tid / nt, hi = total * (tid + 1) / nt;
    long front = 0, back = 0;
    double at = 0;
    for (int j = 0; j < nj; ++j) {
        front += below(lo, at, (double)panel_bytes[j], np[j]);
        back += tid == nt - 1 ? np[j] : below(hi, at, (double)panel_bytes[j], np[j]);
        at += (double)np[j] * (double)panel_bytes[j];
    }
    atomic_store_explicit(&r->w, pack((uint32_t)front, (uint32_t)back), memory_order_release);
}

long qd_take_front(qd_range *r, int n, int *got) {
    uint64_t w = atomic_load_explicit(&r->w, memory_order_acquire);
    for (;;) {
        const uint32_t f = (uint32_t)w, b = (uint32_t)(w >> 32);
        if (f >= b) return -1;
        const uint32_t e = b - f < (uint32_t)n ? b : f + (uint32_t)n;
        if (atomic_compare_exchange_weak_explicit(&r->w, &w, pack(e, b), memory_order_acq_rel, memory_order_acquire)) {
            *got = (int)(e - f);
            return f;
        }
    }
}

long qd_take_back(qd_range *r) {
    uint64_t w = atomic_load_explicit(&r->w, memory_order_acquire);
    for (;;) {
        const uint32_t f = (uint32_t)w, b = (uint32_t)(w >> 32);
        if (f >= b) return -1;
        if (atomic_compare_exchange_weak_explicit(&r->w, &w, pack(f, b - 1), memory_order_acq_rel, memory_order_acquire))
            return (long)b - 1;
    }
}
