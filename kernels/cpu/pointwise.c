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

/* k, v: [T, W] float32 (W = KVH * D) -> rows slot[t] of k_cache / v_cache ([NB * BS, W] float16 when
   f16, else float32); negative slots are skipped (padding). The conversion rounds to nearest even,
   as torch's .to(torch.float16). */
void write_kv_f32(const float *restrict k, const float *restrict v, void *restrict kc, void *restrict vc,
                  const long *restrict slot, int T, int W, int f16) {
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
}
