/* The quantized KV cache on the CPU, in llama.cpp's float order (kernels/cpu/kv_quant.py; reference
   kernels/kv_quant_ref.py).

   Types (GGML ids): Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL, beside F16 / F32 for a cache whose other half
   is quantized. A cache row (one cell, one KV head) is the head's D values as D / 32 GGML blocks.

   Writes (llama.cpp: ggml_set_rows with the CPU type traits' from_float):
     Q8_0: the x86 AVX2 quantize_row_q8_0 (d = amax / 127 stored fp16, q = round_half_even(x * (127 /
     amax))); Q4_0 Q4_1 Q5_0 Q5_1: ggml-quants.c's quantize_row_*_ref; IQ4_NL: quantize_row_iq4_nl_ref
     (quantize_row_iq4_nl_impl with ntry = -1: one pass at d = max / -127, then d = sumqx / sumq2).
     ggml-base is built without FMA: no contraction here (the pragma below), fma written where
     ggml-cpu's -march=native build contracts.
   Attention (ggml_compute_forward_flash_attn_ext_f16_one_chunk, which llama.cpp runs for any number
   of query rows once K or V is quantized: its tiled and split-KV paths take f16 / f32 caches only):
     the query row converted to K's vec_dot_type (Q8_0 for Q8_0 Q4_0 Q5_0 IQ4_NL, Q8_1 for Q4_1
     Q5_1: the AVX2 quantize_row_q8_0 / _q8_1; f16 / f32 for a float K);
     per key in position order: s = vec_dot(K row, Q) in the AVX2 order (lane l of a block: the
     exact integer sum over its elements 4l .. 4l + 3; acc_l = fma(d_k * d_q, float(lane), acc_l)
     block after block (IQ4_NL: even and odd blocks in two accumulators, added before the sum, an
     odd last block in scalar); hsum_float_8; Q4_1 / Q5_1 + summs = fma(m_k, s_q, summs)),
     s *= scale [soft-cap];
     a quantized V: dequantize_row_* (ggml-base, no FMA) into float32, acc = fma(v, vs, acc)
     (ggml_vec_mad_f32) in a float32 accumulator; an f16 V: the float16 accumulator of fattn.c;
     S = fma(S, ms, vs); [sinks (gpt-oss), per head sk, after the last key as ggml applies them on its
     one chunk: acc converted to float32, if sk > M: acc *= expf(M - sk), else vs = expf(sk - M);
     S = fma(S, ms, vs)]; out = acc * (1 / S). */
#pragma GCC optimize("fp-contract=off")
#include <stdint.h>
#include <stdlib.h>
#include "common.h"
#include "pool.h"
#include "fattn_vec.h"

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q8_1 = 9, T_IQ4_NL = 20 };

static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* bytes per 32-block; 0 for a type this file does not take */
int kvq_block_bytes(int type) {
    switch (type) {
    case T_Q4_0: case T_IQ4_NL: return 18;
    case T_Q4_1: return 20;
    case T_Q5_0: return 22;
    case T_Q5_1: return 24;
    case T_Q8_0: return 34;
    case T_Q8_1: return 36;
    default: return 0;
    }
}

static inline uint16_t f16_bits(float x) { _Float16 h = (_Float16)x; uint16_t u; memcpy(&u, &h, 2); return u; }
static inline float f16_at(const uint8_t *p) { _Float16 h; memcpy(&h, p, 2); return (float)h; }
static inline void put16(uint8_t *p, float x) { const uint16_t u = f16_bits(x); memcpy(p, &u, 2); }

/* ---- writes: one 32-block of x into y ----------------------------------------------------------- */
static void q8_block(const float *x, uint8_t *y, int with_s) {  /* AVX2 quantize_row_q8_0 / _q8_1 */
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) { const float a = fabsf(x[j]); amax = a > amax ? a : amax; }
    const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    put16(y, d);
    int8_t *q = (int8_t *)(y + (with_s ? 4 : 2));
    int sum = 0;
    for (int j = 0; j < 32; ++j) { const int v = (int)nearbyintf(x[j] * id); q[j] = (int8_t)v; sum += v; }
    if (with_s) put16(y + 2, d * (float)sum);
}

static void first_absmax(const float *x, float *amax, float *max) {
    *amax = 0.0f; *max = 0.0f;
    for (int j = 0; j < 32; ++j) if (*amax < fabsf(x[j])) { *amax = fabsf(x[j]); *max = x[j]; }
}

static void q4_0_block(const float *x, uint8_t *y) {
    float amax, max;
    first_absmax(x, &amax, &max);
    const float d = max / -8, id = d != 0.0f ? 1.0f / d : 0.0f;
    put16(y, d);
    for (int j = 0; j < 16; ++j) {
        const int a = (int8_t)(x[j] * id + 8.5f), b = (int8_t)(x[16 + j] * id + 8.5f);
        y[2 + j] = (uint8_t)((a < 15 ? a : 15) | ((b < 15 ? b : 15) << 4));
    }
}

static void q5_0_block(const float *x, uint8_t *y) {
    float amax, max;
    first_absmax(x, &amax, &max);
    const float d = max / -16, id = d != 0.0f ? 1.0f / d : 0.0f;
    put16(y, d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
        int a = (int8_t)(x[j] * id + 16.5f), b = (int8_t)(x[16 + j] * id + 16.5f);
        a = a < 31 ? a : 31; b = b < 31 ? b : 31;
        y[6 + j] = (uint8_t)((a & 15) | ((b & 15) << 4));
        qh |= (uint32_t)((a & 0x10) >> 4) << j;
        qh |= (uint32_t)((b & 0x10) >> 4) << (j + 16);
    }
    memcpy(y + 2, &qh, 4);
}

static void q_1_block(const float *x, uint8_t *y, int bits) {  /* Q4_1 (bits 4) / Q5_1 (bits 5) */
    float min = 3.402823466e+38f, max = -3.402823466e+38f;
    for (int j = 0; j < 32; ++j) { if (x[j] < min) min = x[j]; if (x[j] > max) max = x[j]; }
    const float d = (max - min) / ((1 << bits) - 1), id = d != 0.0f ? 1.0f / d : 0.0f;
    put16(y, d);
    put16(y + 2, min);
    uint32_t qh = 0;
    uint8_t *qs = y + (bits == 4 ? 4 : 8);
    for (int j = 0; j < 16; ++j) {
        int a, b;
        if (bits == 4) {
            a = (int8_t)((x[j] - min) * id + 0.5f); b = (int8_t)((x[16 + j] - min) * id + 0.5f);
            a = a < 15 ? a : 15; b = b < 15 ? b : 15;
        } else {
            a = (uint8_t)((x[j] - min) * id + 0.5f); b = (uint8_t)((x[16 + j] - min) * id + 0.5f);
        }
        qs[j] = (uint8_t)((a & 15) | ((b & 15) << 4));
        qh |= (uint32_t)((a & 0x10) >> 4) << j;
        qh |= (uint32_t)((b & 0x10) >> 4) << (j + 16);
    }
    if (bits == 5) memcpy(y + 4, &qh, 4);
}

static inline int best_index_int8(float x) {
    const int8_t *val = kvalues_iq4nl;
    if (x <= val[0]) return 0;
    if (x >= val[15]) return 15;
    int ml = 0, mu = 15;
    while (mu - ml > 1) { const int mav = (ml + mu) / 2; if (x < val[mav]) mu = mav; else ml = mav; }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

/* L: the row's code scratch, kept across its blocks as ggml's (a block under GROUP_MAX_EPS keeps
   the previous block's codes, with d = 0) */
static void iq4_nl_block(const float *x, uint8_t *y, uint8_t *L) {
    memset(y + 2, 0, 16);
    put16(y, 0.0f);
    float amax = 0.0f, max = 0.0f, d = 0.0f;
    for (int j = 0; j < 32; ++j) { const float ax = fabsf(x[j]); if (ax > amax) { amax = ax; max = x[j]; } }
    if (!(amax < 1e-15f)) {
        d = max / (float)kvalues_iq4nl[0];
        const float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; ++j) {
            const float al = id * x[j];
            const int l = best_index_int8(al);
            L[j] = (uint8_t)l;
            const float q = kvalues_iq4nl[l], w = x[j] * x[j];
            sumqx += w * q * x[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    }
    put16(y, d);
    for (int j = 0; j < 16; ++j) y[2 + j] = (uint8_t)(L[j] | (L[16 + j] << 4));
}

static void quantize_row(const float *x, uint8_t *y, int D, int type) {
    const int bb = kvq_block_bytes(type);
    uint8_t L[32] = {0};
    for (int b = 0; b < D / 32; ++b) {
        const float *xb = x + 32 * b;
        uint8_t *yb = y + (size_t)b * bb;
        switch (type) {
        case T_Q8_0: q8_block(xb, yb, 0); break;
        case T_Q8_1: q8_block(xb, yb, 1); break;
        case T_Q4_0: q4_0_block(xb, yb); break;
        case T_Q5_0: q5_0_block(xb, yb); break;
        case T_Q4_1: q_1_block(xb, yb, 4); break;
        case T_Q5_1: q_1_block(xb, yb, 5); break;
        case T_IQ4_NL: iq4_nl_block(xb, yb, L); break;
        default: break;
        }
    }
}

/* ---- ggml-base's dequantize_row_* (no FMA) ------------------------------------------------------ */
static void dequantize_row(const uint8_t *x, float *y, int D, int type) {
    const int bb = kvq_block_bytes(type);
    for (int b = 0; b < D / 32; ++b, x += bb, y += 32) {
        const float d = f16_at(x);
        switch (type) {
        case T_Q8_0:
            for (int j = 0; j < 32; ++j) y[j] = ((const int8_t *)(x + 2))[j] * d;
            break;
        case T_Q4_0:
            for (int j = 0; j < 16; ++j) { y[j] = ((x[2 + j] & 15) - 8) * d; y[16 + j] = ((x[2 + j] >> 4) - 8) * d; }
            break;
        case T_IQ4_NL:
            for (int j = 0; j < 16; ++j) { y[j] = d * kvalues_iq4nl[x[2 + j] & 15]; y[16 + j] = d * kvalues_iq4nl[x[2 + j] >> 4]; }
            break;
        case T_Q4_1: {
            const float m = f16_at(x + 2);
            for (int j = 0; j < 16; ++j) { y[j] = (x[4 + j] & 15) * d + m; y[16 + j] = (x[4 + j] >> 4) * d + m; }
            break;
        }
        case T_Q5_0: case T_Q5_1: {
            const int one = type == T_Q5_1;
            const float m = one ? f16_at(x + 2) : 0.0f;
            uint32_t qh; memcpy(&qh, x + (one ? 4 : 2), 4);
            const uint8_t *qs = x + (one ? 8 : 6);
            for (int j = 0; j < 16; ++j) {
                const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
                const int a = (qs[j] & 15) | h0, b2 = (qs[j] >> 4) | h1;
                if (one) { y[j] = a * d + m; y[16 + j] = b2 * d + m; }
                else { y[j] = (a - 16) * d; y[16 + j] = (b2 - 16) * d; }
            }
            break;
        }
        default: break;
        }
    }
}

/* ---- vec_dot of a K row with the query in its vec_dot_type (AVX2 order) ------------------------- */
static inline float hsum8(const float *l) {
    return ((l[4] + l[0]) + (l[6] + l[2])) + ((l[5] + l[1]) + (l[7] + l[3]));
}

/* The K block's 32 codes as integers (Q4_1 / Q5_1 unsigned, the others centred / looked up). */
static inline void k_codes(const uint8_t *x, int type, int *c) {
    switch (type) {
    case T_Q8_0: for (int j = 0; j < 32; ++j) c[j] = ((const int8_t *)(x + 2))[j]; break;
    case T_Q4_0: for (int j = 0; j < 16; ++j) { c[j] = (x[2 + j] & 15) - 8; c[16 + j] = (x[2 + j] >> 4) - 8; } break;
    case T_IQ4_NL:
        for (int j = 0; j < 16; ++j) { c[j] = kvalues_iq4nl[x[2 + j] & 15]; c[16 + j] = kvalues_iq4nl[x[2 + j] >> 4]; }
        break;
    case T_Q4_1: for (int j = 0; j < 16; ++j) { c[j] = x[4 + j] & 15; c[16 + j] = x[4 + j] >> 4; } break;
    default: {  /* Q5_0, Q5_1 */
        const int one = type == T_Q5_1;
        uint32_t qh; memcpy(&qh, x + (one ? 4 : 2), 4);
        const uint8_t *qs = x + (one ? 8 : 6);
        for (int j = 0; j < 16; ++j) {
            c[j] = ((qs[j] & 15) | (((qh >> j) << 4) & 0x10)) - (one ? 0 : 16);
            c[16 + j] = ((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - (one ? 0 : 16);
        }
    }
    }
}

#if defined(__AVX2__)
/* ggml's bytes_from_bits_32: byte j = 0xFF where bit j of the 32 bits is set */
static inline __m256i bytes_from_bits_32(const uint8_t *x) {
    uint32_t x32; memcpy(&x32, x, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x32), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}
/* the 16 bytes of nibbles -> 32 bytes: elements 0..15 the low nibbles, 16..31 the high ones */
static inline __m256i nibbles_32(const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(15));
}
/* The K block's 32 codes as bytes (signed, or unsigned for Q4_1 / Q5_1), as ggml's AVX2 vec_dot forms them */
static inline __m256i k_codes_avx2(const uint8_t *x, int type) {
    switch (type) {
    case T_Q8_0: return _mm256_loadu_si256((const __m256i *)(x + 2));
    case T_Q4_0: return _mm256_sub_epi8(nibbles_32(x + 2), _mm256_set1_epi8(8));
    case T_IQ4_NL: {
        const __m128i vals = _mm_loadu_si128((const __m128i *)kvalues_iq4nl);
        const __m128i t = _mm_loadu_si128((const __m128i *)(x + 2)), m4 = _mm_set1_epi8(15);
        return _mm256_set_m128i(_mm_shuffle_epi8(vals, _mm_and_si128(_mm_srli_epi16(t, 4), m4)),
                                _mm_shuffle_epi8(vals, _mm_and_si128(t, m4)));
    }
    case T_Q4_1: return nibbles_32(x + 4);
    case T_Q5_0:  /* nibble | 0xF0 where the fifth bit is clear: nibble - 16 */
        return _mm256_or_si256(nibbles_32(x + 6), _mm256_andnot_si256(bytes_from_bits_32(x + 2), _mm256_set1_epi8((char)0xF0)));
    default:  /* Q5_1 */
        return _mm256_or_si256(nibbles_32(x + 8), _mm256_and_si256(bytes_from_bits_32(x + 4), _mm256_set1_epi8(0x10)));
    }
}
/* lane l = the exact sum over bytes 4l .. 4l + 3 of x * y (|products| small enough for maddubs) */
static inline __m256 lanes_avx2(__m256i x, __m256i y, int unsigned_x) {
    __m256i p;
    if (unsigned_x) p = _mm256_maddubs_epi16(x, y);
    else p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}
static inline float hsum_avx2(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}
#endif

/* x: the K row (D / 32 blocks of `type`), y: the query as Q8_0 (or Q8_1 for Q4_1 / Q5_1) blocks */
static float vec_dot_q(const uint8_t *x, const uint8_t *y, int D, int type) {
#if defined(__AVX2__)
    {
        const int nb = D / 32, bx = kvq_block_bytes(type), one = type == T_Q4_1 || type == T_Q5_1;
        const int by = one ? 36 : 34, two = type == T_IQ4_NL, nb2 = two ? nb & ~1 : nb;
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        float summs = 0.0f;
        for (int b = 0; b < nb2; ++b) {
            const uint8_t *xb = x + (size_t)b * bx, *yb = y + (size_t)b * by;
            const __m256 q = lanes_avx2(k_codes_avx2(xb, type), _mm256_loadu_si256((const __m256i *)(yb + (one ? 4 : 2))), one);
            if (one) summs = __builtin_fmaf(f16_at(xb + 2), f16_at(yb + 2), summs);
            const int a = two ? b & 1 : 0;
            acc[a] = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(xb) * f16_at(yb)), q, acc[a]);
        }
        if (!two) return hsum_avx2(acc[0]) + summs;
        float sumf = hsum_avx2(_mm256_add_ps(acc[0], acc[1]));
        for (int b = nb2; b < nb; ++b) {
            const uint8_t *xb = x + (size_t)b * bx, *yb = y + (size_t)b * by;
            const int8_t *q = (const int8_t *)(yb + 2);
            int c[32], s = 0;
            k_codes(xb, type, c);
            for (int j = 0; j < 32; ++j) s += c[j] * q[j];
            sumf += f16_at(yb) * f16_at(xb) * (float)s;  /* not contracted there */
        }
        return sumf;
    }
#endif
    const int nb = D / 32, bx = kvq_block_bytes(type), one = type == T_Q4_1 || type == T_Q5_1;
    const int by = one ? 36 : 34;
    float acc[2][8] = {{0}}, summs = 0.0f;
    const int two = type == T_IQ4_NL;
    const int nb2 = two ? nb & ~1 : nb;  /* IQ4_NL: pairs of blocks in SIMD, an odd last one in scalar */
    for (int b = 0; b < nb2; ++b) {
        const uint8_t *xb = x + (size_t)b * bx, *yb = y + (size_t)b * by;
        const int8_t *q = (const int8_t *)(yb + (one ? 4 : 2));
        int c[32];
        k_codes(xb, type, c);
        const float d = f16_at(xb) * f16_at(yb);
        if (one) summs = __builtin_fmaf(f16_at(xb + 2), f16_at(yb + 2), summs);
        float *a = acc[two ? b & 1 : 0];
        for (int l = 0; l < 8; ++l) {
            const int s = c[4 * l] * q[4 * l] + c[4 * l + 1] * q[4 * l + 1] + c[4 * l + 2] * q[4 * l + 2]
                          + c[4 * l + 3] * q[4 * l + 3];
            a[l] = __builtin_fmaf(d, (float)s, a[l]);
        }
    }
    float sumf;
    if (two) {
        float t[8];
        for (int l = 0; l < 8; ++l) t[l] = acc[0][l] + acc[1][l];
        sumf = hsum8(t);
        for (int b = nb2; b < nb; ++b) {
            const uint8_t *xb = x + (size_t)b * bx, *yb = y + (size_t)b * by;
            const int8_t *q = (const int8_t *)(yb + 2);
            int c[32], s = 0;
            k_codes(xb, type, c);
            for (int j = 0; j < 32; ++j) s += c[j] * q[j];
            sumf += f16_at(yb) * f16_at(xb) * (float)s;  /* not contracted there */
        }
    } else {
        sumf = hsum8(acc[0]) + summs;
    }
    return sumf;
}

/* ---- attention ---------------------------------------------------------------------------------- */
struct fq_args {
    const float *q; const uint8_t *kc, *vc; const int *bt, *lens; float *out;
    int maxb, H, KVH, D, BS, bs_shift, kt, vt; size_t krow, vrow; float scale, softcap; int window;
    const float *sinks;  /* [H] or NULL: gpt-oss's attention sinks */
};

static inline int is_quant(int t) { return t != T_F32 && t != T_F16; }

/* One (row, query head): item = s * H + h; row s attends to positions < lens[s] through table s. */
static void fq_item(void *args, int item) {
    const struct fq_args *A = args;
    const int H = A->H, D = A->D, G = H / A->KVH, kt = A->kt, vt = A->vt;
    const int s = item / H, h = item % H, kh = h / G;
    const int L = A->lens[s];
    const int t0 = A->window > 0 && L > A->window ? L - A->window : 0;
    const int *tab = A->bt + (size_t)s * A->maxb;
    const float *q = A->q + ((size_t)s * H + h) * D;
    float *out = A->out + ((size_t)s * H + h) * D;
    const float softcap = A->softcap, scale = softcap != 0.0f ? A->scale / softcap : A->scale;
    const int kq = is_quant(kt), vq = is_quant(vt), kone = kt == T_Q4_1 || kt == T_Q5_1;
    const int v16 = vt == T_F16;
    float qs[D + 8], acc[D], v32[D];  /* the query in K's vec_dot_type; the accumulator; a dequantized V row */
    if (kq) quantize_row(q, (uint8_t *)qs, D, kone ? T_Q8_1 : T_Q8_0);
    else if (kt == T_F16) for (int i = 0; i < D; ++i) ((_Float16 *)qs)[i] = (_Float16)q[i];
    else memcpy(qs, q, D * sizeof(float));
    memset(acc, 0, D * sizeof(float));
    float M = -INFINITY, S = 0.0f;
    for (int t = t0; t < L; ++t) {
        const size_t cell = ((size_t)tab[t >> A->bs_shift] << A->bs_shift) + (t & (A->BS - 1));
        const uint8_t *kr = A->kc + (cell * A->KVH + kh) * A->krow, *vr = A->vc + (cell * A->KVH + kh) * A->vrow;
        float sc = (kq ? vec_dot_q(kr, (const uint8_t *)qs, D, kt) : dot_row(kr, qs, D, kt == T_F16)) * scale;
        if (softcap != 0.0f) sc = softcap * tanhf(sc);
        float ms = 1.0f, vs = 1.0f;
        if (sc > M) {
            const float Mold = M;
            M = sc;
            ms = expf(Mold - M);
            scale_acc(acc, D, ms, v16);
        } else {
            vs = expf(sc - M);
        }
        if (vq) {
            dequantize_row(vr, v32, D, vt);
            mad_acc(acc, v32, D, vs, 0);
        } else {
            mad_acc(acc, vr, D, vs, v16);
        }
        S = __builtin_fmaf(S, ms, vs);
    }
    for (int i = 0; i < D; ++i) out[i] = v16 ? (float)((_Float16 *)acc)[i] : acc[i];  /* VKQ32 */
    sinks_and_normalize(out, D, S, M, A->sinks, h);
}

/* q: [S, H, D] f32; k/v cache: [NB, BS, KVH, row] of their types (rows of D / 32 blocks, or D
   float16 / float32), BS a power of 2; bt: [S, maxb] int32; lens: [S]; out: [S, H, D] f32.
   Returns 0, or -1 for shapes or types it does not take (D % 32, H % KVH, BS). */
int kvq_attention_rows(const float *q, const void *kc, const void *vc, const int *bt, int maxb, const int *lens,
                       float *out, int S, int H, int KVH, int D, int BS, float scale, float softcap, int ktype,
                       int vtype, int nthreads, int window, int omp, const float *sinks) {
    const int bs_shift = pool_block_shift(BS);
    if (bs_shift < 0 || H % KVH || D % 32 || D > 1024) return -1;
    const size_t krow = ktype == T_F32 ? 4u * D : ktype == T_F16 ? 2u * D : (size_t)kvq_block_bytes(ktype) * (D / 32);
    const size_t vrow = vtype == T_F32 ? 4u * D : vtype == T_F16 ? 2u * D : (size_t)kvq_block_bytes(vtype) * (D / 32);
    if (krow == 0 || vrow == 0 || ktype == T_Q8_1 || vtype == T_Q8_1) return -1;
    struct fq_args a = {q, kc, vc, bt, lens, out, maxb, H, KVH, D, BS, bs_shift, ktype, vtype, krow, vrow,
                        scale, softcap, window, sinks};
    pool_run_on(fq_item, &a, S * H, nthreads, omp);
    return 0;
}

/* x: [n, D] f32 -> y: [n, D / 32 blocks of type]; -1 for a type it does not take */
int kvq_quantize(const float *x, void *y, long n, int D, int type) {
    if (!kvq_block_bytes(type) || D % 32) return -1;
    const size_t rb = (size_t)kvq_block_bytes(type) * (D / 32);
    for (long i = 0; i < n; ++i) quantize_row(x + (size_t)i * D, (uint8_t *)y + (size_t)i * rb, D, type);
    return 0;
}

int kvq_dequantize(const void *x, float *y, long n, int D, int type) {
    if (!kvq_block_bytes(type) || type == T_Q8_1 || D % 32) return -1;
    const size_t rb = (size_t)kvq_block_bytes(type) * (D / 32);
    for (long i = 0; i < n; ++i) dequantize_row((const uint8_t *)x + (size_t)i * rb, y + (size_t)i * D, D, type);
    return 0;
}

/* The vec_dot of n K rows (type) with one query row quantized here -> out[n] (tests) */
int kvq_vec_dot(const void *k, const float *q, float *out, long n, int D, int type) {
    if (!kvq_block_bytes(type) || type == T_Q8_1 || D % 32 || D > 1024) return -1;
    uint8_t qq[36 * 32];
    quantize_row(q, qq, D, type == T_Q4_1 || type == T_Q5_1 ? T_Q8_1 : T_Q8_0);
    const size_t rb = (size_t)kvq_block_bytes(type) * (D / 32);
    for (long i = 0; i < n; ++i) out[i] = vec_dot_q((const uint8_t *)k + (size_t)i * rb, qq, D, type);
    return 0;
}

/* Rows of x [T, KVH, D] f32 into the cache [NB * BS cells, KVH, row] at slots (negative: skipped) */
void kvq_write(const float *x, void *cache, const long *slots, int T, int KVH, int D, int type) {
    const size_t rb = (size_t)kvq_block_bytes(type) * (D / 32);
    for (int t = 0; t < T; ++t) {
        if (slots[t] < 0) continue;
        for (int h = 0; h < KVH; ++h)
            quantize_row(x + ((size_t)t * KVH + h) * D, (uint8_t *)cache + ((size_t)slots[t] * KVH + h) * rb, D, type);
    }
}
