/* MXFP4 (GGML type 39) weights against q8_0 activations, in llama.cpp b1-0c1e570's float order
   (kernels/cpu/mxfp4.py).

   A block is 17 bytes: an E8M0 exponent e and 16 bytes of 4-bit codes (element j < 16: low nibble
   of byte j, j >= 16: high nibble of byte j - 16); value = kvalues_mxfp4[code] * 2^(e - 128)
   (the E2M1 values doubled, GGML_E8M0_TO_FP32_HALF). On x86 with AVX2, llama-server repacks every
   MXFP4 matrix whose row count is a multiple of 8 (ggml-cpu/repack.cpp, mxfp4_8x8_q8_0; the 3-D
   expert tensors of mul_mat_id too) and computes each output with
   gemv_q4_b32_8x8_q8_0_lut_avx (mul_mat_id: every routed row; mul_mat: rows past the last multiple
   of 4), one float lane per output:

       isum_b = sum over the block's 32 columns of kvalue(code) * x_q (exact int32)
       acc    = fma(float(isum_b), e8m0_half(e_b) * d_x,b, acc)      for b = 0, 1, ... in order

   where x_q / d_x are the activations quantized to q8_0 (kernels/cpu/qdot_quant.c, d_x rounded to
   fp16 as ggml stores it). This file computes exactly that, for any row count (llama.cpp's
   unrepacked ggml_vec_dot_mxfp4_q8_0, used where rows % 8 != 0, sums two interleaved 8-lane
   accumulators instead: not reproduced). Built with -ffp-contract=off semantics made explicit:
   every fma is a fmaf call. */
#include <math.h>
#include <stdint.h>
#include <string.h>

static const int8_t KV_MXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static inline float e8m0_half(uint8_t x) {
    uint32_t bits = x < 2 ? 0x00200000u << x : (uint32_t)(x - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* w: rows x (K / 32) blocks of 17 bytes, row r at w + r * row_bytes; xq int8 [M, K], xd float32
   [M, K / 32]; out[m * out_stride + r]. */
void mxfp4_q8_0_matmul(const uint8_t *w, long row_bytes, int rows, int K, const int8_t *xq, const float *xd, int M,
                       float *out, long out_stride, int nthreads) {
    const int nb = K / 32;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1 && (long)rows * K * M > (1L << 16))
    for (int r = 0; r < rows; ++r) {
        const uint8_t *wr = w + (size_t)r * row_bytes;
        for (int m = 0; m < M; ++m) {
            const int8_t *x = xq + (size_t)m * K;
            const float *d = xd + (size_t)m * nb;
            float acc = 0.0f;
            for (int b = 0; b < nb; ++b) {
                const uint8_t *blk = wr + 17 * (size_t)b;
                const int8_t *xb = x + 32 * b;
                int isum = 0;
                for (int j = 0; j < 16; ++j)
                    isum += KV_MXFP4[blk[1 + j] & 15] * xb[j] + KV_MXFP4[blk[1 + j] >> 4] * xb[j + 16];
                acc = fmaf((float)isum, e8m0_half(blk[0]) * d[b], acc);
            }
            out[(size_t)m * out_stride + r] = acc;
        }
    }
}

/* ggml_swiglu_oai (ggml-cpu/ops.cpp): x = min(g, limit), y = clamp(u, -limit, limit),
   out = x / (1 + expf(alpha * -x)) * (y + 1), over n elements. */
void swiglu_oai_f32(const float *g, const float *u, float *out, long n, float alpha, float limit) {
    for (long k = 0; k < n; ++k) {
        const float x = g[k] < limit ? g[k] : limit;
        const float y = u[k] < -limit ? -limit : (u[k] > limit ? limit : u[k]);
        const float glu = x / (1.f + expf(alpha * (-x)));
        out[k] = glu * (y + 1.f);
    }
}

/* ggml_soft_max over rows of k < 8 values in place (ggml_compute_forward_soft_max_f32 on x86: below
   one vector every exp is expf, the sum in double, then the row times float(1 / sum)). */
void softmax_small_f32(float *x, int rows, int k) {
    for (int r = 0; r < rows; ++r) {
        float *p = x + (size_t)r * k;
        float max = -INFINITY;
        for (int i = 0; i < k; ++i) max = p[i] > max ? p[i] : max;
        double sum = 0.0;
        for (int i = 0; i < k; ++i) { const float v = expf(p[i] - max); sum += (double)v; p[i] = v; }
        const float inv = (float)(1.0 / sum);
        for (int i = 0; i < k; ++i) p[i] *= inv;
    }
}

/* A float32 matmul y[m, r] = W[r, :] . x[m, :] in llama.cpp's AVX2 order for F32 weights (gpt-oss's
   router): one row of x (n == 1, mul_mat's ggml_vec_dot_f32: 4 accumulators of 8 lanes over steps
   of 32, fma; GGML_F32x8_REDUCE: x0 + x2, x1 + x3, then their sum, then (lo + hi) and two hadds;
   the K % 32 tail fma'd after), or several (llamafile's tinyBLAS<8>: one 8-lane fma accumulator
   over K, then its hsum ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))). K % 8 == 0 for more
   than one row (tinyBLAS refuses other K; the caller checks). */
void f32_matmul_ggml_avx2(const float *w, long ldw, int rows, int K, const float *x, long ldx, int M, float *out,
                          long ldo, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1 && (long)rows * K * M > (1L << 16))
    for (int r = 0; r < rows; ++r) {
        const float *wr = w + (size_t)r * ldw;
        for (int m = 0; m < M; ++m) {
            const float *xm = x + (size_t)m * ldx;
            float res;
            if (M == 1) {
                float acc[4][8];
                memset(acc, 0, sizeof acc);
                const int np = K & ~31;
                for (int i = 0; i < np; i += 32)
                    for (int j = 0; j < 4; ++j)
                        for (int l = 0; l < 8; ++l) acc[j][l] = fmaf(wr[i + 8 * j + l], xm[i + 8 * j + l], acc[j][l]);
                float v[8];
                for (int l = 0; l < 8; ++l) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
                const float t0 = v[0] + v[4], t1 = v[1] + v[5], t2 = v[2] + v[6], t3 = v[3] + v[7];
                res = (t0 + t1) + (t2 + t3);
                for (int i = np; i < K; ++i) res = fmaf(wr[i], xm[i], res);
            } else {
                float acc[8] = {0};
                for (int i = 0; i < K; i += 8)
                    for (int l = 0; l < 8; ++l) acc[l] = fmaf(wr[i + l], xm[i + l], acc[l]);
                const float t0 = acc[4] + acc[0], t1 = acc[5] + acc[1], t2 = acc[6] + acc[2], t3 = acc[7] + acc[3];
                res = (t0 + t2) + (t1 + t3);
            }
            out[(size_t)m * ldo + r] = res;
        }
    }
}
