/* RMSNorm (with the residual add) and RoPE on float32 rows (kernels/cpu/pointwise.py): one C call
   instead of the 5-10 torch ops of the reference, which on the decode step of a small model cost
   more than the arithmetic (lesson model: ~2 ms of a ~12 ms step on one thread). */
#include <math.h>
#include <stddef.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* out[t] = (s[t] * rsqrt(mean(s[t]^2) + eps)) * w with s = x (+ r, stored to sum when r is given);
   x, r, out, sum: [T, C]. The squares (float) are summed in double, in order, as ggml_compute_forward_rms_norm_f32. */
void add_rms_norm_f32(const float *restrict x, const float *restrict r, const float *restrict w,
                      float *restrict out, float *restrict sum, int T, int C, float eps) {
    for (int t = 0; t < T; ++t) {
        const float *xt = x + (size_t)t * C;
        float *ot = out + (size_t)t * C;
        const float *st = xt;
        if (r) {
            const float *rt = r + (size_t)t * C;
            float *su = sum + (size_t)t * C;
            for (int c = 0; c < C; ++c) su[c] = xt[c] + rt[c];
            st = su;
        }
        double ss = 0.0;
        for (int c = 0; c < C; ++c) ss += (double)(st[c] * st[c]);  /* as ggml: the square in float */
        const float inv = 1.0f / sqrtf((float)(ss / C) + eps);
        for (int c = 0; c < C; ++c) ot[c] = (st[c] * inv) * w[c];
    }
}

/* x, out: [T, NH, D]; pairs (2i, 2i + 1) (neox = 0) or (i, i + R) (neox = 1) rotated by the angle
   (float)pos[t] * inv_freq[i], i < R; dimensions past 2R copied. */
void rope_f32(const float *restrict x, const long *restrict pos, const float *restrict inv_freq,
              float *restrict out, int T, int NH, int D, int R, int neox) {
    float cs[512], sn[512];
    if (R > 512) return;  /* pointwise.py checks */
    for (int t = 0; t < T; ++t) {
        for (int i = 0; i < R; ++i) {
            const float a = (float)pos[t] * inv_freq[i];
            cs[i] = cosf(a);
            sn[i] = sinf(a);
        }
        for (int h = 0; h < NH; ++h) {
            const float *xh = x + ((size_t)t * NH + h) * D;
            float *oh = out + ((size_t)t * NH + h) * D;
            for (int d = 2 * R; d < D; ++d) oh[d] = xh[d];
            for (int i = 0; i < R; ++i) {
                const int i0 = neox ? i : 2 * i, i1 = neox ? i + R : 2 * i + 1;
                const float x0 = xh[i0], x1 = xh[i1];
                oh[i0] = x0 * cs[i] - x1 * sn[i];
                oh[i1] = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
}

/* k, v: [T, W] float32 (W = KVH * D) -> rows slot[t] of k_cache / v_cache ([NB * BS, W] float16 when
   f16, else float32); negative slots are skipped (padding). The conversion rounds to nearest even,
   as torch's .to(torch.float16). Returns -1, or the first slot >= n_slots (nothing written then). */
long write_kv_f32(const float *restrict k, const float *restrict v, void *restrict kc, void *restrict vc,
                  const long *restrict slot, int T, int W, int f16, long n_slots) {
    for (int t = 0; t < T; ++t)
        if (slot[t] >= n_slots) return slot[t];
    for (int t = 0; t < T; ++t) {
        if (slot[t] < 0) continue;
        const float *kt = k + (size_t)t * W, *vt = v + (size_t)t * W;
        const size_t off = (size_t)slot[t] * W;
        if (f16) {
            _Float16 *kd = (_Float16 *)kc + off, *vd = (_Float16 *)vc + off;
            for (int i = 0; i < W; ++i) kd[i] = (_Float16)kt[i];
            for (int i = 0; i < W; ++i) vd[i] = (_Float16)vt[i];
        } else {
            float *kd = (float *)kc + off, *vd = (float *)vc + off;
            for (int i = 0; i < W; ++i) kd[i] = kt[i];
            for (int i = 0; i < W; ++i) vd[i] = vt[i];
        }
    }
    return -1;
}

/* SwiGLU as llama.cpp's CPU backend computes it on an AVX-512F + DQ machine: ggml-cpu/vec.cpp
   ggml_vec_swiglu_f32 with vec.h's AVX-512 ggml_v_silu / ggml_v_expf ("adapted from arm limited
   optimized routine"), the same intrinsics in the same order, compiled for AVX-512 whatever this
   build's target (pointwise.py calls it only on a CPU that has AVX-512F and DQ); the elements past
   the last full vector of 16 through ggml's scalar ggml_silu_f32 (libm expf). y = silu(x) * g. */
#if defined(__x86_64__)
#define AVX512_FN static inline __attribute__((target("avx512f,avx512dq,fma"), always_inline))
AVX512_FN __m512 ggml_v_expf_avx512(__m512 x) {
    const __m512 r = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
    const __m512 n = _mm512_sub_ps(z, r);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                      _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __mmask16 d = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192), _CMP_GT_OQ);
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                        _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
        u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0F)));
    const __m512 res = _mm512_scalef_ps(j, n);
    if (_mm512_kortestz(d, d)) return res;
    const __m512 zero = _mm512_setzero_ps();
    const __m512 alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, zero, _CMP_LE_OQ), _mm512_set1_ps(INFINITY), zero);
    return _mm512_mask_blend_ps(d, res, alt);
}

/* x, g: [rows, n] with row strides ldx, ldg; y: [rows, n] with row stride ldy. */
__attribute__((target("avx512f,avx512dq,fma")))
void swiglu_f32(const float *restrict x, const float *restrict g, float *restrict y, long n, long ldx, long ldg,
                long ldy, int rows) {
    for (int t = 0; t < rows; ++t) {
        const float *xt = x + t * ldx, *gt = g + t * ldg;
        float *yt = y + t * ldy;
        long i = 0;
        for (; i + 15 < n; i += 16) {
            const __m512 xv = _mm512_loadu_ps(xt + i);
            const __m512 e = ggml_v_expf_avx512(_mm512_sub_ps(_mm512_setzero_ps(), xv));
            const __m512 s = _mm512_div_ps(xv, _mm512_add_ps(_mm512_set1_ps(1), e));
            _mm512_storeu_ps(yt + i, _mm512_mul_ps(s, _mm512_loadu_ps(gt + i)));
        }
        for (; i < n; ++i) yt[i] = (xt[i] / (1.0f + expf(-xt[i]))) * gt[i];
    }
}
#else
void swiglu_f32(const float *x, const float *g, float *y, long n, long ldx, long ldg, long ldy, int rows) {
    (void)x; (void)g; (void)y; (void)n; (void)ldx; (void)ldg; (void)ldy; (void)rows;  /* never called */
}
#endif
