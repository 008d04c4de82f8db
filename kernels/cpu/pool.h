/* A small thread pool for the CPU kernels (gemv.c, attention.c) that never waits for a thread that
   is not running (kernels/cpu/pool.c). */
#ifndef TRITIUM_CPU_POOL_H
#define TRITIUM_CPU_POOL_H
typedef void (*chunk_fn)(void *arg, int chunk);
/* fn(arg, c) for c = 0 .. nchunks-1, on the calling thread and up to nthreads - 1 helpers. */
void pool_run(chunk_fn fn, void *arg, int nchunks, int nthreads);
/* The same on the OpenMP team where omp (callers between qdot's OpenMP regions), else pool_run. */
void pool_run_on(chunk_fn fn, void *arg, int nchunks, int nthreads, int omp);
/* log2(BS), or -1 where BS is not a power of 2 (the paged attention kernels shift positions). */
int pool_block_shift(int BS);
#endif
