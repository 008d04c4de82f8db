/* Paged decode attention (kernels/cpu/attention.py). */
#include "common.h"

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
   scores of its G query heads against every cached key, then softmax and the weighted V sum.
   window > 0: only the last `window` keys are read (query at position L - 1 sees keys at
   positions > L - 1 - window, llama.cpp's LLAMA_SWA_TYPE_STANDARD). */
void paged_decode(const float *restrict q, const void *kc, const void *vc, const int *restrict bt,
                  int maxb, const int *restrict lens, float *restrict out, float *restrict scratch,
                  int S, int H, int KVH, int D, int BS, int maxL, float scale, float softcap,
                  int kv_f16, int nthreads, int window) {
    const int G = H / KVH;
    #pragma omp parallel for collapse(2) schedule(dynamic) num_threads(nthreads)
    for (int s = 0; s < S; ++s) {
        for (int kh = 0; kh < KVH; ++kh) {
            const int L = lens[s];
            const int t0 = window > 0 && L > window ? L - window : 0;  /* sliding window: the last `window` keys */
            float *sc = scratch + ((size_t)s * KVH + kh) * G * maxL;
            const float *qs = q + ((size_t)s * H + (size_t)kh * G) * D;
            if (D % 16 == 0) {  /* vector path: K row widened once, G dot products of D / 16 vectors */
                const int nc = D / 16;
                for (int t = t0; t < L; ++t) {
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
            for (int t = t0; t < L; ++t) {
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
                for (int t = t0; t < L; ++t) mx = p[t] > mx ? p[t] : mx;
                for (int t = t0; t < L; ++t) { p[t] = expf(p[t] - mx); sum += p[t]; }
                float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
                for (int t = t0; t < L; ++t) p[t] *= inv;
            }
            float *os = out + ((size_t)s * H + (size_t)kh * G) * D;
            if (D % 16 == 0) {  /* vector path: V row widened once, accumulated into G rows in registers */
                const int nc = D / 16;
                for (int g = 0; g < G; ++g) {
                    v16 acc[16] = {{0}};
                    const float *p = sc + (size_t)g * maxL;
                    for (int t = t0; t < L; ++t) {
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
            for (int t = t0; t < L; ++t) {
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
