/* One x8 panel -> decoded scratch (qdot.h): unsigned 8-bit codes [K / 4][32] and per-block float
   scales and integer sub-block scales / mins, ready for the dot kernels (qd_route names them). A
   panel is decoded once per matmul call and then read by every activation row (decode batch or
   prefill). */
#include "qdot.h"
#include "qdot_codes.h"

static inline int32_t pair16(int a, int b) { return (int32_t)((uint32_t)(uint16_t)a | (uint32_t)(uint16_t)b << 16); }

/* Q8_0's codes need no decoding: its signed bytes as they are, made contiguous */
static const uint8_t *q8_0_codes(const qd_type *t, const uint8_t *panel, int nb, qd_scratch *s) {
    for (int b = 0; b < nb; ++b) memcpy(s->codes + (size_t)b * 256, qd_codes_at(t, panel, b), 256);
    return s->codes;
}

/* ---------------------------------------------------------------------------------- portable */

static void s_scales(const qd_type *t, const uint8_t *scl, int nb, qd_scratch *s) {
    for (int b = 0; b < nb; ++b) {
        const uint8_t *p = qd_scales_at(t, scl, b);
        float *d = s->d + 8 * b, *dm = s->dm + 8 * b;
        int32_t *sc = s->sc + (size_t)b * t->nsub * 8, *mn = s->mn + (size_t)b * 64;
        for (int r = 0; r < 8; ++r) {
            uint16_t h; memcpy(&h, p + 2 * r, 2); d[r] = qd_f16(h);
            switch (t->type) {
            case QD_Q4_1: case QD_Q5_1: case QD_Q4_K: case QD_Q5_K: case QD_Q2_K:
                memcpy(&h, p + 16 + 2 * r, 2); dm[r] = qd_f16(h); break;
            default: dm[r] = 0.0f;
            }
            switch (t->type) {
            case QD_Q4_K: case QD_Q5_K: {
                uint32_t u[4];
                for (int w = 0; w < 3; ++w) memcpy(&u[w], p + 32 + 4 * (8 * w + r), 4);
                const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
                u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
                const uint32_t aux = u[1] & k1;
                u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
                u[2] = aux;
                u[0] &= k1;
                for (int j = 0; j < 8; ++j) {
                    sc[8 * j + r] = (u[j / 4] >> (8 * (j % 4))) & 0xFF;
                    const int m = (u[2 + j / 4] >> (8 * (j % 4))) & 0xFF;
                    mn[8 * j + r] = pair16(m, m);
                }
                break;
            }
            case QD_Q6_K: {
                int v[16];
                for (int j = 0; j < 16; ++j) { v[j] = (int8_t)p[16 + 8 * j + r]; sc[8 * j + r] = v[j]; }
                for (int i = 0; i < 8; ++i) mn[8 * i + r] = pair16(32 * v[2 * i], 32 * v[2 * i + 1]);
                break;
            }
            case QD_Q3_K: {
                uint32_t w[3], a[4];
                for (int k = 0; k < 3; ++k) memcpy(&w[k], p + 16 + 4 * (8 * k + r), 4);
                const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f;
                a[0] = (w[0] & k2) | (((w[2] >> 0) & k1) << 4);
                a[1] = (w[1] & k2) | (((w[2] >> 2) & k1) << 4);
                a[2] = ((w[0] >> 4) & k2) | (((w[2] >> 4) & k1) << 4);
                a[3] = ((w[1] >> 4) & k2) | (((w[2] >> 6) & k1) << 4);
                int v[16];
                for (int j = 0; j < 16; ++j) { v[j] = (int)((a[j / 4] >> (8 * (j % 4))) & 0xFF) - 32; sc[8 * j + r] = v[j]; }
                for (int i = 0; i < 8; ++i) mn[8 * i + r] = pair16(4 * v[2 * i], 4 * v[2 * i + 1]);
                break;
            }
            case QD_Q2_K: {
                int m[16];
                for (int j = 0; j < 16; ++j) { const uint8_t x = p[32 + 8 * j + r]; sc[8 * j + r] = x & 15; m[j] = x >> 4; }
                for (int i = 0; i < 8; ++i) mn[8 * i + r] = pair16(m[2 * i], m[2 * i + 1]);
                break;
            }
            default: break;
            }
        }
    }
}

static void s_nib(const uint8_t *g, uint8_t *o) {
    for (int v = 0; v < 4; ++v)
        for (int i = 0; i < 32; ++i) { o[32 * v + i] = g[32 * v + i] & 15; o[32 * (v + 4) + i] = g[32 * v + i] >> 4; }
}
static void s_bit1(const uint8_t *pl, int dst, uint8_t *o) {
    for (int kg = 0; kg < 8; ++kg)
        for (int i = 0; i < 32; ++i) o[32 * kg + i] |= (uint8_t)(((pl[i] >> kg) & 1) << dst);
}
static void s_bit2(const uint8_t *pl, int dst, uint8_t *o) {
    for (int kg = 0; kg < 8; ++kg)
        for (int i = 0; i < 32; ++i) o[32 * kg + i] |= (uint8_t)(((pl[32 * (kg / 4) + i] >> (2 * (kg % 4))) & 3) << dst);
}

const uint8_t *qd_decode_panel_scalar(const qd_type *t, const uint8_t *panel, int K, qd_scratch *s) {
    const int nb = K / t->bs, ng = t->bs / 32, gbytes = t->codes / ng;
    s_scales(t, panel, nb, s);
    if (t->type == QD_Q8_0) return q8_0_codes(t, panel, nb, s);
    for (int b = 0; b < nb; ++b)
        for (int g = 0; g < ng; ++g) {
            const uint8_t *gp = qd_codes_at(t, panel, b) + (size_t)g * gbytes;
            uint8_t *o = s->codes + ((size_t)b * ng + g) * 256;
            switch (t->type) {
            case QD_Q4_0: case QD_Q4_1: case QD_Q4_K: s_nib(gp, o); break;
            case QD_Q5_0: case QD_Q5_1: case QD_Q5_K: s_nib(gp, o); s_bit1(gp + 128, 4, o); break;
            case QD_Q6_K: s_nib(gp, o); s_bit2(gp + 128, 4, o); break;
            case QD_Q3_K: memset(o, 0, 256); s_bit2(gp, 0, o); s_bit1(gp + 64, 2, o); break;
            case QD_Q2_K: memset(o, 0, 256); s_bit2(gp, 0, o); break;
            }
        }
    return s->codes;
}

/* Rows `ids` of the weight as float32, computed like ggml's dequantize_row_* (bit-identical to
   kernels/dequant_ref.py): embedding lookups from a repacked table, and the tests. */
void qd_dequant_rows(int type, const uint8_t *W, int N, int K, const int64_t *ids, int n, float *out, int nthreads) {
    const qd_type *t = qd_type_info(type);
    const int nb = K / t->bs;
    const size_t pb = qd_panel_bytes(t, K);
    #pragma omp parallel num_threads(nthreads)
    {
        qd_scratch s;
        s.codes = (uint8_t *)malloc((size_t)K * 8);
        s.d = (float *)malloc(sizeof(float) * 8 * nb); s.dm = (float *)malloc(sizeof(float) * 8 * nb);
        s.sc = (int32_t *)malloc(sizeof(int32_t) * 128 * nb); s.mn = (int32_t *)malloc(sizeof(int32_t) * 64 * nb);
        #pragma omp for schedule(static)
        for (int i = 0; i < n; ++i) {
            const int64_t id = ids[i];
            float *o = out + (size_t)i * K;
            if (id < 0 || id >= N) { for (int k = 0; k < K; ++k) o[k] = NAN; continue; }
            const int r = (int)(id % 8);
            const uint8_t *c = qd_decode_panel_scalar(t, W + (size_t)(id / 8) * pb, K, &s);
            for (int k = 0; k < K; ++k) {
                const int b = k / t->bs, kk = k % t->bs;
                const int code = c[(size_t)(k / 4) * 32 + 4 * r + k % 4];
                const float d = s.d[8 * b + r], dm = s.dm[8 * b + r];
                float v;
                switch (type) {
                case QD_Q4_0: v = (float)(code - 8) * d; break;
                case QD_Q5_0: v = (float)(code - 16) * d; break;
                case QD_Q8_0: v = (float)(int8_t)code * d; break;
                case QD_Q4_1: case QD_Q5_1: v = (float)code * d + dm; break;
                case QD_Q4_K: case QD_Q5_K: {
                    const int j = kk / 32;
                    const float dl = d * (float)s.sc[(size_t)(b * 8 + j) * 8 + r];
                    const float ml = dm * (float)(int16_t)(s.mn[(size_t)(b * 8 + j) * 8 + r] & 0xFFFF);
                    v = (float)code * dl - ml;
                    break;
                }
                case QD_Q2_K: {
                    const int j = kk / 16;
                    const float dl = d * (float)s.sc[(size_t)(b * 16 + j) * 8 + r];
                    const int32_t pr = s.mn[(size_t)(b * 8 + j / 2) * 8 + r];
                    const float ml = dm * (float)(j % 2 ? (int16_t)((uint32_t)pr >> 16) : (int16_t)(pr & 0xFFFF));
                    v = (float)code * dl - ml;
                    break;
                }
                case QD_Q6_K: v = (float)(code - 32) * (d * (float)s.sc[(size_t)(b * 16 + kk / 16) * 8 + r]); break;
                case QD_Q3_K: v = (float)(code - 4) * (d * (float)s.sc[(size_t)(b * 16 + kk / 16) * 8 + r]); break;
                default: v = NAN;
                }
                o[k] = v;
            }
        }
        free(s.codes); free(s.d); free(s.dm); free(s.sc); free(s.mn);
    }
}

/* ---------------------------------------------------------------------------------- AVX2 */
#if defined(QD_AVX2)

static inline __m256i ld(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline void st(void *p, __m256i v) { _mm256_storeu_si256((__m256i *)p, v); }
#if defined(QD_VNNI)
static inline __m256i sc_form(__m256i v) { return v; }
#else  /* int16 pair (s, s) per lane for vpmaddwd */
static inline __m256i sc_form(__m256i v) { return pairs(v, v); }
#endif
static inline __m256i byte_of(__m256i v, int j) {
    return _mm256_and_si256(_mm256_srli_epi32(v, 8 * j), _mm256_set1_epi32(0xFF));
}

static void v_scales(const qd_type *t, const uint8_t *scl, int nb, qd_scratch *s) {
    for (int b = 0; b < nb; ++b) {
        const uint8_t *p = qd_scales_at(t, scl, b);
        int32_t *sc = s->sc + (size_t)b * t->nsub * 8, *mn = s->mn + (size_t)b * 64;
        _mm256_storeu_ps(s->d + 8 * b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)));
        switch (t->type) {
        case QD_Q4_1: case QD_Q5_1: case QD_Q4_K: case QD_Q5_K: case QD_Q2_K:
            _mm256_storeu_ps(s->dm + 8 * b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16))));
            break;
        default: break;
        }
        switch (t->type) {
        case QD_Q4_K: case QD_Q5_K: {
            const __m256i k1 = _mm256_set1_epi32(0x3f3f3f3f), k2 = _mm256_set1_epi32(0x0f0f0f0f),
                          k3 = _mm256_set1_epi32(0x03030303);
            const __m256i w0 = ld(p + 32), w1 = ld(p + 64), w2 = ld(p + 96);
            __m256i u[4];
            u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), k2),
                                   _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w1, 6), k3), 4));
            u[2] = _mm256_and_si256(w1, k1);
            u[1] = _mm256_or_si256(_mm256_and_si256(w2, k2),
                                   _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w0, 6), k3), 4));
            u[0] = _mm256_and_si256(w0, k1);
            for (int j = 0; j < 8; ++j) {
                st(sc + 8 * j, sc_form(byte_of(u[j / 4], j % 4)));
                const __m256i m = byte_of(u[2 + j / 4], j % 4);
                st(mn + 8 * j, _mm256_or_si256(m, _mm256_slli_epi32(m, 16)));
            }
            break;
        }
        case QD_Q6_K: {
            __m256i v[16];
            for (int j = 0; j < 16; ++j) {
                v[j] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 16 + 8 * j)));
                st(sc + 8 * j, sc_form(v[j]));
            }
            for (int i = 0; i < 8; ++i)
                st(mn + 8 * i, pairs(_mm256_slli_epi32(v[2 * i], 5), _mm256_slli_epi32(v[2 * i + 1], 5)));
            break;
        }
        case QD_Q3_K: {
            const __m256i k1 = _mm256_set1_epi32(0x03030303), k2 = _mm256_set1_epi32(0x0f0f0f0f);
            const __m256i w0 = ld(p + 16), w1 = ld(p + 48), w2 = ld(p + 80);
            __m256i a[4], v[16];
            a[0] = _mm256_or_si256(_mm256_and_si256(w0, k2), _mm256_slli_epi32(_mm256_and_si256(w2, k1), 4));
            a[1] = _mm256_or_si256(_mm256_and_si256(w1, k2), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w2, 2), k1), 4));
            a[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w0, 4), k2),
                                   _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w2, 4), k1), 4));
            a[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w1, 4), k2),
                                   _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w2, 6), k1), 4));
            for (int j = 0; j < 16; ++j) {
                v[j] = _mm256_sub_epi32(byte_of(a[j / 4], j % 4), _mm256_set1_epi32(32));
                st(sc + 8 * j, sc_form(v[j]));
            }
            for (int i = 0; i < 8; ++i)
                st(mn + 8 * i, pairs(_mm256_slli_epi32(v[2 * i], 2), _mm256_slli_epi32(v[2 * i + 1], 2)));
            break;
        }
        case QD_Q2_K: {
            __m256i m[16];
            for (int j = 0; j < 16; ++j) {
                const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 32 + 8 * j)));
                st(sc + 8 * j, sc_form(_mm256_and_si256(x, _mm256_set1_epi32(15))));
                m[j] = _mm256_srli_epi32(x, 4);
            }
            for (int i = 0; i < 8; ++i) st(mn + 8 * i, pairs(m[2 * i], m[2 * i + 1]));
            break;
        }
        default: break;
        }
    }
}

static inline void v_nib(const uint8_t *g, __m256i c[8]) {
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int v = 0; v < 4; ++v) {
        const __m256i n = ld(g + 32 * v);
        c[v] = _mm256_and_si256(n, m4);
        c[v + 4] = _mm256_and_si256(_mm256_srli_epi16(n, 4), m4);
    }
}
static inline void v_bit1(const uint8_t *pl, int dst, __m256i c[8]) {
    const __m256i h = ld(pl), m = _mm256_set1_epi8((char)(1 << dst));
    for (int kg = 0; kg < 8; ++kg) c[kg] = _mm256_or_si256(c[kg], _mm256_and_si256(mvb(h, kg, dst), m));
}
static inline void v_bit2(const uint8_t *pl, int dst, __m256i c[8]) {
    const __m256i h0 = ld(pl), h1 = ld(pl + 32), m = _mm256_set1_epi8((char)(3 << dst));
    for (int kg = 0; kg < 8; ++kg)
        c[kg] = _mm256_or_si256(c[kg], _mm256_and_si256(mvb(kg < 4 ? h0 : h1, 2 * (kg % 4), dst), m));
}

void qd_decode_scales(const qd_type *t, const uint8_t *panel, int K, qd_scratch *s) {
    const int nb = K / t->bs;
    v_scales(t, panel, nb, s);
}

const uint8_t *qd_decode_panel(const qd_type *t, const uint8_t *panel, int K, qd_scratch *s) {
    const int nb = K / t->bs, ng = t->bs / 32, gbytes = t->codes / ng;
    v_scales(t, panel, nb, s);
    if (t->type == QD_Q8_0) return q8_0_codes(t, panel, nb, s);
    const int type = t->type;
    for (int b = 0; b < nb; ++b)
        for (int g = 0; g < ng; ++g) {
            const uint8_t *gp = qd_codes_at(t, panel, b) + (size_t)g * gbytes;
            uint8_t *o = s->codes + ((size_t)b * ng + g) * 256;
            __m256i c[8];
            switch (type) {
            case QD_Q4_0: case QD_Q4_1: case QD_Q4_K: v_nib(gp, c); break;
            case QD_Q5_0: case QD_Q5_1: case QD_Q5_K: v_nib(gp, c); v_bit1(gp + 128, 4, c); break;
            case QD_Q6_K: v_nib(gp, c); v_bit2(gp + 128, 4, c); break;
            case QD_Q3_K:
                for (int k = 0; k < 8; ++k) c[k] = _mm256_setzero_si256();
                v_bit2(gp, 0, c); v_bit1(gp + 64, 2, c); break;
            default: /* Q2_K */
                for (int k = 0; k < 8; ++k) c[k] = _mm256_setzero_si256();
                v_bit2(gp, 0, c); break;
            }
            for (int k = 0; k < 8; ++k) st(o + 32 * k, c[k]);
        }
    return s->codes;
}

#else
const uint8_t *qd_decode_panel(const qd_type *t, const uint8_t *panel, int K, qd_scratch *s) {
    return qd_decode_panel_scalar(t, panel, K, s);
}
void qd_decode_scales(const qd_type *t, const uint8_t *panel, int K, qd_scratch *s) {
    s_scales(t, panel, K / t->bs, s);
}
#endif
