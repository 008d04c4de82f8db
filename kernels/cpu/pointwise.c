/* RMSNorm (with the residual add) and RoPE on float32 rows (kernels/cpu/pointwise.py): one C call
   instead of the 5-10 torch ops of the reference, which on the decode step of a small model cost
   more than the arithmetic (lesson model: ~2 ms of a ~12 ms step on one thread). */
#include <math.h>
#include <stddef.h>

/* out[t] = (s[t] * rsqrt(mean(s[t]^2) + eps)) * w with s = x (+ r, stored to sum when r is given);
   x, r, out, sum: [T, C]. The mean is accumulated in double. */
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
        for (int c = 0; c < C; ++c) ss += (double)st[c] * st[c];
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
