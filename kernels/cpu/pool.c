/* The CPU kernels' thread pool (pool.h).

   Why not OpenMP: a parallel region ends at a barrier that waits for every thread of the team,
   including one the OS has not scheduled yet. On a machine with more runnable threads than cores
   (a 2-core host shared with other processes) a region of 0.1 ms then lasts a scheduler time
   slice (measured: the lesson model's decode attention 0.25 ms -> 30 ms per layer with 2 threads).
   Here the caller claims chunks from an atomic counter like its helpers, and once none are left
   it waits only for chunks already running: a helper that wakes late finds nothing to do. Idle
   helpers sleep on a condition variable (no spinning that would take a core from the HTTP thread).
   Still, a helper preempted in the middle of its chunk makes the caller wait for it; when the
   caller waited longer than half its own work plus 100 us, the next BACKOFF_JOBS calls run on
   the caller alone (an oversubscribed machine: measured there, the lesson model's decode step is
   faster on one thread), then helpers are tried again. And while the host's 1-minute load average
   is above twice its cores (checked once a second) every call runs on the caller alone: there
   the helpers' time slices arrive too late to help (measured on the 2-core development host at a
   load of ~20: the lesson model's decode step 43 ms on one thread, 92-107 ms on two).
   One job at a time: a call made while another runs (another thread) runs all its chunks inline. */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MAX_HELPERS 255
#define BACKOFF_JOBS 64
#define SLACK_NS 100000L

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;  /* guards gen, n_helpers, the job fields' publication */
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t run_mu = PTHREAD_MUTEX_INITIALIZER;  /* one job at a time */
static unsigned gen;       /* bumped per job (under mu) */
static int n_helpers;      /* started (never stopped: they sleep) */
static chunk_fn job_fn;
static void *job_arg;
static int job_n;
static atomic_int job_next;    /* next unclaimed chunk */
static atomic_int job_closed = 1;  /* 1: no new helper may join */
static atomic_int job_refs;    /* helpers inside the current job */
static atomic_int job_slots;   /* helpers that joined it (at most job_max work) */
static int job_max;
static int backoff;            /* calls left to run inline (touched under run_mu only) */

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static long load_checked_ns = -2000000000L;  /* touched under run_mu only */
static int overloaded;

/* Whether the host runs more than twice as many threads as it has cores (1-minute load average). */
static int host_overloaded(long now) {
    if (now - load_checked_ns > 1000000000L) {
        double l;
        const long cores = sysconf(_SC_NPROCESSORS_ONLN);
        overloaded = getloadavg(&l, 1) == 1 && cores > 0 && l > 2.0 * (double)cores;
        load_checked_ns = now;
    }
    return overloaded;
}

static void work(void) {
    for (;;) {
        int c = atomic_fetch_add(&job_next, 1);
        if (c >= job_n) return;
        job_fn(job_arg, c);
    }
}

static void *helper(void *unused) {
    (void)unused;
    unsigned seen;
    pthread_mutex_lock(&mu);
    seen = gen;
    for (;;) {
        while (gen == seen) pthread_cond_wait(&cv, &mu);
        seen = gen;
        pthread_mutex_unlock(&mu);
        atomic_fetch_add(&job_refs, 1);
        /* the job's fields were published before closed = 0; at most nthreads - 1 helpers join */
        if (!atomic_load(&job_closed) && atomic_fetch_add(&job_slots, 1) < job_max) work();
        atomic_fetch_sub(&job_refs, 1);
        pthread_mutex_lock(&mu);
    }
    return NULL;
}

void pool_run(chunk_fn fn, void *arg, int nchunks, int nthreads) {
    if (nthreads > MAX_HELPERS + 1) nthreads = MAX_HELPERS + 1;
    if (nthreads <= 1 || nchunks <= 1 || pthread_mutex_trylock(&run_mu) != 0) {
        for (int c = 0; c < nchunks; ++c) fn(arg, c);
        return;
    }
    if (backoff > 0 || host_overloaded(now_ns())) {
        if (backoff > 0) --backoff;
        for (int c = 0; c < nchunks; ++c) fn(arg, c);
        pthread_mutex_unlock(&run_mu);
        return;
    }
    pthread_mutex_lock(&mu);
    while (n_helpers < nthreads - 1) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int ok = pthread_create(&t, &at, helper, NULL) == 0;
        pthread_attr_destroy(&at);
        if (!ok) break;
        ++n_helpers;
    }
    job_fn = fn;
    job_arg = arg;
    job_n = nchunks;
    job_max = nthreads - 1;
    atomic_store(&job_slots, 0);
    atomic_store(&job_next, 0);
    atomic_store(&job_closed, 0);
    ++gen;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    const long t0 = now_ns();
    work();
    atomic_store(&job_closed, 1);
    const long t1 = now_ns();
    for (int spins = 0; atomic_load(&job_refs) != 0; ++spins)  /* only chunks already running */
        if (spins > 64) sched_yield();
    if (now_ns() - t1 > (t1 - t0) / 2 + SLACK_NS) backoff = BACKOFF_JOBS;
    pthread_mutex_unlock(&run_mu);
}

void pool_run_on(chunk_fn fn, void *arg, int nchunks, int nthreads, int omp) {
    if (!omp) {
        pool_run(fn, arg, nchunks, nthreads);
    } else if (nthreads <= 1 || nchunks <= 1) {
        for (int i = 0; i < nchunks; ++i) fn(arg, i);
    } else {
        #pragma omp parallel for num_threads(nthreads < nchunks ? nthreads : nchunks) schedule(dynamic, 1)
        for (int i = 0; i < nchunks; ++i) fn(arg, i);
    }
}

int pool_block_shift(int BS) {
    int shift = 0;
    while ((1 << shift) < BS) ++shift;
    return (1 << shift) == BS ? shift : -1;
}
