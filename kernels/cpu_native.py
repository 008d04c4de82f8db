"""The CPU-only C kernels (batched GEMV on tiled weights, paged decode attention), compiled on
first use with the system compiler (gcc/cc, -O3 -march=native, OpenMP) into `$TRITIUM_CACHE`
(default ~/.cache/tritium) and loaded with ctypes. `lib()` is None without a compiler (or with
TRITIUM_NO_CPU_KERNELS set); callers then use the torch/BLAS paths."""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

_SOURCE = r"""
#include <math.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
typedef float v16 __attribute__((vector_size(64)));

static inline v16 ld(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }

/* int8 tiles are widened to float32 exactly; their per-row scales are applied to the sums. */
#if defined(__AVX512F__)
#include <immintrin.h>
static inline v16 ldi8(const signed char *p) {
    return (v16)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
int i8_widening_is_vectorized(void) { return 1; }
#elif defined(__AVX2__)
#include <immintrin.h>
static inline v16 ldi8(const signed char *p) {
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
    v16 v; memcpy(&v, &lo, 32); memcpy((char *)&v + 32, &hi, 32); return v;
}
int i8_widening_is_vectorized(void) { return 1; }
#else  /* gcc scalarizes this on x86 without AVX2 (~8x slower than a float32 read) */
typedef signed char i8x16 __attribute__((vector_size(16)));
typedef int i32x16 __attribute__((vector_size(64)));
static inline v16 ldi8(const signed char *p) {
    i8x16 h; memcpy(&h, p, sizeof h);
    return __builtin_convertvector(__builtin_convertvector(h, i32x16), v16);
}
int i8_widening_is_vectorized(void) { return 0; }
#endif

/* float16 / bfloat16 tiles widened to float32 exactly (16 at a time). */
#if defined(__AVX512F__)
static inline v16 ldh(const unsigned short *p) { return (v16)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
#elif defined(__F16C__) && defined(__AVX__)
static inline v16 ldh(const unsigned short *p) {
    __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
    v16 v; memcpy(&v, &lo, 32); memcpy((char *)&v + 32, &hi, 32); return v;
}
#else
static inline v16 ldh(const unsigned short *p) {
    _Float16 h[16]; float f[16]; memcpy(h, p, sizeof h);
    for (int i = 0; i < 16; ++i) f[i] = (float)h[i];
    v16 v; memcpy(&v, f, sizeof v); return v;
}
#endif
typedef unsigned short u16x16 __attribute__((vector_size(32)));
typedef unsigned int u32x16 __attribute__((vector_size(64)));
static inline v16 ldbf(const unsigned short *p) {
    u16x16 h; memcpy(&h, p, sizeof h);
    u32x16 w = __builtin_convertvector(h, u32x16) << 16;
    v16 f; memcpy(&f, &w, sizeof f); return f;
}

/* Batched GEMV on 64-row tiles. Wt: [nt, K, 64]; x: [Mp, K] with Mp a multiple of 4 (zero rows
   past M); y[m * ldy + n] for m < M, n < N. For every k, x[m, k] is broadcast against the 64
   weights of row k of the tile: 4 x 4 accumulators of 16 floats, no horizontal reductions.
   rs: NULL, or one scale per tile row ([nt * 64]) multiplied into the sums.
   One body, instantiated for float32, float16 and bfloat16 tiles (weights kept in their file type)
   and for int8 tiles with row scales (a quarter of the bytes to read: the approximate first pass
   over an output head, see kernels/cpu_gemv.py). */
#define BGEMV_TILES64(NAME, WT, LOAD)                                                          \
void NAME(const float *restrict x, const WT *restrict Wt, const float *restrict rs,            \
          float *restrict y, int M, int Mp, int N, int K, long ldy, int nthreads) {            \
    const int nt = (N + 63) / 64;                                                              \
    _Pragma("omp parallel for schedule(static) num_threads(nthreads)")                         \
    for (int t = 0; t < nt; ++t) {                                                             \
        const WT *restrict tile = Wt + (size_t)t * K * 64;                                     \
        const int n0 = t * 64, nn = N - n0 < 64 ? N - n0 : 64;                                 \
        if (M == 1) {  /* one sequence: 4 accumulators, a quarter of the arithmetic */         \
            v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};                                        \
            for (int k = 0; k < K; ++k) {                                                      \
                const WT *w = tile + (size_t)k * 64;                                           \
                float s = x[k];                                                                \
                a0 += s * LOAD(w); a1 += s * LOAD(w + 16);                                     \
                a2 += s * LOAD(w + 32); a3 += s * LOAD(w + 48);                                \
            }                                                                                  \
            if (rs) {                                                                          \
                a0 *= ld(rs + n0); a1 *= ld(rs + n0 + 16);                                     \
                a2 *= ld(rs + n0 + 32); a3 *= ld(rs + n0 + 48);                                \
            }                                                                                  \
            v16 acc[4] = {a0, a1, a2, a3};                                                     \
            memcpy(y + n0, acc, (size_t)nn * sizeof(float));                                   \
            continue;                                                                          \
        }                                                                                      \
        for (int m0 = 0; m0 < Mp; m0 += 4) {                                                   \
            v16 a00 = {0}, a01 = {0}, a02 = {0}, a03 = {0};                                    \
            v16 a10 = {0}, a11 = {0}, a12 = {0}, a13 = {0};                                    \
            v16 a20 = {0}, a21 = {0}, a22 = {0}, a23 = {0};                                    \
            v16 a30 = {0}, a31 = {0}, a32 = {0}, a33 = {0};                                    \
            const float *x0 = x + (size_t)m0 * K, *x1 = x0 + K, *x2 = x1 + K, *x3 = x2 + K;    \
            for (int k = 0; k < K; ++k) {                                                      \
                const WT *w = tile + (size_t)k * 64;                                           \
                v16 w0 = LOAD(w), w1 = LOAD(w + 16), w2 = LOAD(w + 32), w3 = LOAD(w + 48);     \
                float s0 = x0[k], s1 = x1[k], s2 = x2[k], s3 = x3[k];                          \
                a00 += s0 * w0; a01 += s0 * w1; a02 += s0 * w2; a03 += s0 * w3;                \
                a10 += s1 * w0; a11 += s1 * w1; a12 += s1 * w2; a13 += s1 * w3;                \
                a20 += s2 * w0; a21 += s2 * w1; a22 += s2 * w2; a23 += s2 * w3;                \
                a30 += s3 * w0; a31 += s3 * w1; a32 += s3 * w2; a33 += s3 * w3;                \
            }                                                                                  \
            v16 acc[4][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13},                       \
                             {a20, a21, a22, a23}, {a30, a31, a32, a33}};                      \
            for (int i = 0; i < 4 && m0 + i < M; ++i) {                                        \
                if (rs)                                                                        \
                    for (int j = 0; j < 4; ++j) acc[i][j] *= ld(rs + n0 + 16 * j);             \
                float buf[64];                                                                 \
                memcpy(buf, acc[i], sizeof buf);                                               \
                memcpy(y + (size_t)(m0 + i) * ldy + n0, buf, (size_t)nn * sizeof(float));      \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
}

BGEMV_TILES64(bgemv_tiles64, float, ld)
BGEMV_TILES64(bgemv_tiles64_i8, signed char, ldi8)
BGEMV_TILES64(bgemv_tiles64_f16, unsigned short, ldh)
BGEMV_TILES64(bgemv_tiles64_bf16, unsigned short, ldbf)

/* 64 weight codes of one k as 4 x 16 floats: signed 8-bit codes (64 bytes) or 4-bit codes
   (32 bytes: byte j holds row j in its low nibble and row j + 32 in its high nibble). */
#if defined(__AVX512F__)
static inline void ldc8(const unsigned char *p, v16 c[4]) {
    for (int j = 0; j < 4; ++j)
        c[j] = (v16)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * j))));
}
static inline void ldc4(const unsigned char *p, v16 c[4]) {
    const __m128i m = _mm_set1_epi8(0x0F);
    for (int j = 0; j < 2; ++j) {
        __m128i b = _mm_loadu_si128((const __m128i *)(p + 16 * j));
        c[j] = (v16)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, m)));
        c[j + 2] = (v16)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), m)));
    }
}
#elif defined(__AVX2__)
static inline v16 cat8(__m256 lo, __m256 hi) { v16 v; memcpy(&v, &lo, 32); memcpy((char *)&v + 32, &hi, 32); return v; }
static inline void ldc8(const unsigned char *p, v16 c[4]) {
    for (int j = 0; j < 4; ++j) {
        __m128i b = _mm_loadu_si128((const __m128i *)(p + 16 * j));
        c[j] = cat8(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))));
    }
}
static inline void ldc4(const unsigned char *p, v16 c[4]) {
    const __m128i m = _mm_set1_epi8(0x0F);
    for (int j = 0; j < 2; ++j) {
        __m128i b = _mm_loadu_si128((const __m128i *)(p + 16 * j));
        __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
        c[j] = cat8(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))));
        c[j + 2] = cat8(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))));
    }
}
#else
static inline void ldc8(const unsigned char *p, v16 c[4]) {
    float f[64]; for (int i = 0; i < 64; ++i) f[i] = (float)(signed char)p[i];
    memcpy(c, f, sizeof f);
}
static inline void ldc4(const unsigned char *p, v16 c[4]) {
    float f[64]; for (int i = 0; i < 32; ++i) { f[i] = (float)(p[i] & 15); f[i + 32] = (float)(p[i] >> 4); }
    memcpy(c, f, sizeof f);
}
#endif

/* Batched GEMV on affine-integer tiles: W[r, k] = A[g, r] * code[k, r] + B[g, r], g = k / gs
   (every GGUF quantized type repacked exactly, see kernels/cpu_qgemv.py). codes: [nt, K, CB] bytes
   (CB = 64 for 8-bit codes, 32 for 4-bit); A, B: [nt, K / gs, 64] float; x: [Mp, K] with Mp even
   (zero rows past M); xs: [Mp, K / gs] per-group sums of x; B may be NULL (all zero). For each
   group the code sums
   s = sum_k x[m, k] code[k, :] are kept for 2 rows of x at a time, then acc += A * s + B * xs. */
#define QGEMV_TILES64(NAME, CB, LOADC)                                                         \
void NAME(const float *restrict x, const float *restrict xs, const unsigned char *restrict codes, \
          const float *restrict A, const float *restrict B, float *restrict y,                 \
          int M, int N, int K, int gs, long ldy, int nthreads) {                               \
    const int nt = (N + 63) / 64, ng = K / gs;                                                 \
    _Pragma("omp parallel for schedule(static) num_threads(nthreads)")                         \
    for (int t = 0; t < nt; ++t) {                                                             \
        const unsigned char *ct = codes + (size_t)t * K * CB;                                  \
        const float *At = A + (size_t)t * ng * 64, *Bt = B ? B + (size_t)t * ng * 64 : 0;      \
        const int n0 = t * 64, nn = N - n0 < 64 ? N - n0 : 64;                                 \
        if (M == 1) {  /* one sequence: half the arithmetic of a pair */                       \
            v16 a0[4] = {{0}};                                                                 \
            for (int g = 0; g < ng; ++g) {                                                     \
                v16 s0[4] = {{0}}, c[4];                                                       \
                for (int k = g * gs; k < (g + 1) * gs; ++k) {                                  \
                    LOADC(ct + (size_t)k * CB, c);                                             \
                    const float u0 = x[k];                                                     \
                    for (int j = 0; j < 4; ++j) s0[j] += u0 * c[j];                            \
                }                                                                              \
                for (int j = 0; j < 4; ++j) {                                                  \
                    a0[j] += ld(At + (size_t)g * 64 + 16 * j) * s0[j];                         \
                    if (B) a0[j] += ld(Bt + (size_t)g * 64 + 16 * j) * xs[g];                  \
                }                                                                              \
            }                                                                                  \
            float buf[64];                                                                     \
            memcpy(buf, a0, sizeof buf);                                                       \
            memcpy(y + n0, buf, (size_t)nn * sizeof(float));                                   \
            continue;                                                                          \
        }                                                                                      \
        for (int m0 = 0; m0 < M; m0 += 2) {                                                    \
            const float *x0 = x + (size_t)m0 * K, *x1 = x0 + K;                                \
            const float *xs0 = xs + (size_t)m0 * ng, *xs1 = xs0 + ng;                          \
            v16 a0[4] = {{0}}, a1[4] = {{0}};                                                  \
            for (int g = 0; g < ng; ++g) {                                                     \
                v16 s0[4] = {{0}}, s1[4] = {{0}}, c[4];                                        \
                for (int k = g * gs; k < (g + 1) * gs; ++k) {                                  \
                    LOADC(ct + (size_t)k * CB, c);                                             \
                    const float u0 = x0[k], u1 = x1[k];                                        \
                    for (int j = 0; j < 4; ++j) { s0[j] += u0 * c[j]; s1[j] += u1 * c[j]; }    \
                }                                                                              \
                for (int j = 0; j < 4; ++j) {                                                  \
                    const v16 a = ld(At + (size_t)g * 64 + 16 * j);                            \
                    a0[j] += a * s0[j];                                                        \
                    a1[j] += a * s1[j];                                                        \
                    if (B) {                                                                   \
                        const v16 b = ld(Bt + (size_t)g * 64 + 16 * j);                        \
                        a0[j] += b * xs0[g];                                                   \
                        a1[j] += b * xs1[g];                                                   \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
            float buf[64];                                                                     \
            memcpy(buf, a0, sizeof buf);                                                       \
            memcpy(y + (size_t)m0 * ldy + n0, buf, (size_t)nn * sizeof(float));                \
            if (m0 + 1 < M) {                                                                  \
                memcpy(buf, a1, sizeof buf);                                                   \
                memcpy(y + (size_t)(m0 + 1) * ldy + n0, buf, (size_t)nn * sizeof(float));      \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
}

QGEMV_TILES64(qgemv_tiles64_c8, 64, ldc8)
QGEMV_TILES64(qgemv_tiles64_c4, 32, ldc4)

static inline float hsum(v16 a) {
    float f[16]; memcpy(f, &a, sizeof f);
    float r = 0.0f;
    for (int i = 0; i < 16; ++i) r += f[i];
    return r;
}

/* One cached K or V row as float32. */
static inline void load_row(const void *cache, size_t row, int D, int f16, float *out) {
    if (f16) { const _Float16 *r = (const _Float16 *)cache + row; for (int d = 0; d < D; ++d) out[d] = (float)r[d]; }
    else { memcpy(out, (const float *)cache + row, (size_t)D * sizeof(float)); }
}

/* Paged decode attention, one query per sequence. q: [S, H, D] f32; k/v cache: [NB, BS, KVH, D]
   of float16 (kv_f16 = 1) or float32; bt: [S, maxb] int32 block tables; lens: [S];
   out: [S, H, D] f32; scratch: [S * KVH, G, maxL] f32 scores. Two passes per (sequence, KV head):
   scores of its G query heads against every cached key, then softmax and the weighted V sum. */
void paged_decode(const float *restrict q, const void *kc, const void *vc, const int *restrict bt,
                  int maxb, const int *restrict lens, float *restrict out, float *restrict scratch,
                  int S, int H, int KVH, int D, int BS, int maxL, float scale, float softcap,
                  int kv_f16, int nthreads) {
    const int G = H / KVH;
    #pragma omp parallel for collapse(2) schedule(dynamic) num_threads(nthreads)
    for (int s = 0; s < S; ++s) {
        for (int kh = 0; kh < KVH; ++kh) {
            const int L = lens[s];
            float *sc = scratch + ((size_t)s * KVH + kh) * G * maxL;
            const float *qs = q + ((size_t)s * H + (size_t)kh * G) * D;
            if (D % 16 == 0) {  /* vector path: K row widened once, G dot products of D / 16 vectors */
                const int nc = D / 16;
                for (int t = 0; t < L; ++t) {
                    const size_t row = (((size_t)bt[(size_t)s * maxb + t / BS] * BS + t % BS) * KVH + kh) * D;
                    v16 kv[16];
                    for (int c = 0; c < nc; ++c)
                        kv[c] = kv_f16 ? ldh((const unsigned short *)kc + row + 16 * c) : ld((const float *)kc + row + 16 * c);
                    for (int g = 0; g < G; ++g) {
                        v16 a = {0};
                        for (int c = 0; c < nc; ++c) a += ld(qs + (size_t)g * D + 16 * c) * kv[c];
                        float acc = hsum(a) * scale;
                        if (softcap > 0.0f) acc = softcap * tanhf(acc / softcap);
                        sc[(size_t)g * maxL + t] = acc;
                    }
                }
            } else
            for (int t = 0; t < L; ++t) {
                const size_t row = (((size_t)bt[(size_t)s * maxb + t / BS] * BS + t % BS) * KVH + kh) * D;
                float kf[256];
                load_row(kc, row, D, kv_f16, kf);
                for (int g = 0; g < G; ++g) {
                    float acc = 0.0f;
                    for (int d = 0; d < D; ++d) acc += qs[(size_t)g * D + d] * kf[d];
                    acc *= scale;
                    if (softcap > 0.0f) acc = softcap * tanhf(acc / softcap);
                    sc[(size_t)g * maxL + t] = acc;
                }
            }
            for (int g = 0; g < G; ++g) {
                float *p = sc + (size_t)g * maxL, mx = -INFINITY, sum = 0.0f;
                for (int t = 0; t < L; ++t) mx = p[t] > mx ? p[t] : mx;
                for (int t = 0; t < L; ++t) { p[t] = expf(p[t] - mx); sum += p[t]; }
                float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
                for (int t = 0; t < L; ++t) p[t] *= inv;
            }
            float *os = out + ((size_t)s * H + (size_t)kh * G) * D;
            if (D % 16 == 0) {  /* vector path: V row widened once, accumulated into G rows in registers */
                const int nc = D / 16;
                for (int g = 0; g < G; ++g) {
                    v16 acc[16] = {{0}};
                    const float *p = sc + (size_t)g * maxL;
                    for (int t = 0; t < L; ++t) {
                        const size_t row = (((size_t)bt[(size_t)s * maxb + t / BS] * BS + t % BS) * KVH + kh) * D;
                        for (int c = 0; c < nc; ++c)
                            acc[c] += p[t] * (kv_f16 ? ldh((const unsigned short *)vc + row + 16 * c)
                                                     : ld((const float *)vc + row + 16 * c));
                    }
                    memcpy(os + (size_t)g * D, acc, (size_t)D * sizeof(float));
                }
                continue;
            }
            for (int i = 0; i < G * D; ++i) os[i] = 0.0f;
            for (int t = 0; t < L; ++t) {
                const size_t row = (((size_t)bt[(size_t)s * maxb + t / BS] * BS + t % BS) * KVH + kh) * D;
                float vf[256];
                load_row(vc, row, D, kv_f16, vf);
                for (int g = 0; g < G; ++g) {
                    const float p = sc[(size_t)g * maxL + t];
                    for (int d = 0; d < D; ++d) os[(size_t)g * D + d] += p * vf[d];
                }
            }
        }
    }
}
"""

MAX_HEAD_DIM = 256
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


def _cache_dir() -> Path:
    env = os.environ.get("TRITIUM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tritium"


def _build(extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """Compile (or reuse the cached build of) the kernels; `extra_flags` (tests) narrow the target,
    e.g. ("-mno-avx512f",) for the AVX2 code paths."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None or os.environ.get("TRITIUM_NO_CPU_KERNELS"):
        return None
    flags = ["-O3", "-march=native", *extra_flags, "-fopenmp", "-shared", "-fPIC"]
    key = hashlib.sha256((_SOURCE + " ".join(flags) + platform.machine() + platform.node()).encode()).hexdigest()[:16]
    out = _cache_dir() / f"cpu_native-{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            src = Path(tmp) / "cpu_native.c"
            src.write_text(_SOURCE)
            so = Path(tmp) / "cpu_native.so"
            r = subprocess.run([cc, *flags, str(src), "-o", str(so), "-lm"], capture_output=True, text=True)
            if r.returncode != 0:
                return None
            os.replace(so, out)  # atomic: concurrent builders see a whole file or none
    lib = ctypes.CDLL(str(out))
    c_int, c_long, c_float, ptr = ctypes.c_int, ctypes.c_long, ctypes.c_float, ctypes.c_void_p
    for fn in (lib.bgemv_tiles64, lib.bgemv_tiles64_i8, lib.bgemv_tiles64_f16, lib.bgemv_tiles64_bf16):
        fn.argtypes = [ptr, ptr, ptr, ptr, c_int, c_int, c_int, c_int, c_long, c_int]
        fn.restype = None
    lib.paged_decode.argtypes = [ptr, ptr, ptr, ptr, c_int, ptr, ptr, ptr, c_int, c_int, c_int, c_int, c_int,
                                 c_int, c_float, c_float, c_int, c_int]
    lib.paged_decode.restype = None
    for fn in (lib.qgemv_tiles64_c8, lib.qgemv_tiles64_c4):
        fn.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, c_int, c_int, c_int, c_int, c_long, c_int]
        fn.restype = None
    lib.i8_widening_is_vectorized.argtypes = []
    lib.i8_widening_is_vectorized.restype = c_int
    return lib


def lib() -> ctypes.CDLL | None:
    global _lib, _tried
    if not _tried:
        with _lock:
            if not _tried:
                try:
                    _lib = _build()
                except OSError:
                    _lib = None
                _tried = True
    return _lib
