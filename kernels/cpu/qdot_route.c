/* Which kernel computes the panels of a matmul (qd_route, qdot.h): the one place that chooses, by
   GGML type x activation rows x numerics x the build's ISA level. The drivers (qdot_gemm.c) call it
   for every matmul; kernels/cpu/kernel_table.py calls it through ctypes to write the table of
   kernels/README.md, which tests/test_kernel_table.py checks against it. Pure: the same answers in
   every build, whatever `isa` asks about. */
#include "qdot.h"

int qd_route(int type, int rows, int numerics, int isa) {
    const qd_type *t = qd_type_info(type);
    if (!t || rows < 1 || numerics < QD_NUM_OWN || numerics > QD_NUM_GGML_REF || isa < QD_ISA_SCALAR
        || isa > QD_ISA_AVX512VNNI)
        return -1;
    /* up to QD_FUSED_MAX rows the vector builds read the panels in place (decode); the portable
       build, and more rows (prefill), decode them into scratch */
    const int fused = isa >= QD_ISA_AVX2 && rows <= QD_FUSED_MAX ? QD_ROUTE_FUSED : 0;
    const int pairs = isa == QD_ISA_AVX512VNNI && !fused;  /* two panels per 512-bit vector */
    /* llama.cpp's AVX-512 build repacks Q2_K (q2_K_8x8 gemv / gemm), an order qdot does not have:
       there Q2_K keeps qdot's own (the router's AVX-512 level stands for llama.cpp's AVX-512 build) */
    const int q2_repacked = type == QD_Q2_K && isa == QD_ISA_AVX512VNNI;
    const int ggml = numerics != QD_NUM_OWN && !q2_repacked;
    /* llama.cpp's tiled K-quant matmul from 8 rows (the K-quants it does not repack) */
    const int tiled = ggml && (type == QD_Q6_K || type == QD_Q3_K || type == QD_Q5_K || type == QD_Q2_K) && rows >= 8;
    /* under 8 rows their ggml_vec_dot_q*_K_q8_K (Q6_K's has its own kernel) */
    const int kdot = ggml && (type == QD_Q2_K || type == QD_Q3_K || type == QD_Q5_K) && rows < 8;
    /* the types whose llama.cpp order has its own kernels (qdot_exact.c), but for the tiled order,
       which the integer-dot kernels have as an epilogue (its reference excepted) */
    const int own_kernel = ggml
                           && (type == QD_Q5_0 || type == QD_Q8_0 || type == QD_Q4_1 || type == QD_Q5_1
                               || type == QD_Q6_K || type == QD_Q4_K || kdot)
                           && !(type == QD_Q6_K && rows >= 8 && numerics == QD_NUM_GGML);
    if (own_kernel) {
        if (numerics == QD_NUM_GGML_REF || isa == QD_ISA_SCALAR)
            return fused | (type == QD_Q6_K ? (tiled ? QD_KN_REF_K_TILED : QD_KN_REF_Q6_K)
                            : type == QD_Q4_K ? QD_KN_REF_Q4_K : kdot ? QD_KN_REF_K_DOT : QD_KN_REF_32);
        if (pairs && type == QD_Q4_K) return QD_KN_Z_MK_Q4K_EXACT;
        return fused | (type == QD_Q6_K ? QD_KN_SIMD_Q6_K : type == QD_Q4_K ? QD_KN_SIMD_Q4_K
                        : kdot ? QD_KN_SIMD_K_DOT : QD_KN_SIMD_32);
    }
    if (isa == QD_ISA_SCALAR) return tiled ? QD_KN_REF_K_TILED : QD_KN_PANEL;
    if (pairs) return tiled ? QD_KN_Z_MK_K_TILED : t->kq ? QD_KN_Z_MK_K : QD_KN_Z_MK_A;
    return fused | (tiled ? QD_KN_MK_K_TILED : t->kq ? QD_KN_MK_K : QD_KN_MK_A);
}

/* A pair kernel's odd last panel of a work item (AVX-512 VNNI): the 256-bit kernel of the same
   float order (qdot's own where the pair kernel is, e.g. Q2_K, which llama.cpp's AVX-512 build repacks) */
int qd_route_odd(int type, int rows, int numerics) {
    const int r = qd_route(type, rows, numerics, QD_ISA_AVX512VNNI);
    if (r < 0) return r;
    return qd_route(type, rows, qd_kernel_is_own(QD_ROUTE_KERNEL(r)) ? QD_NUM_OWN : numerics, QD_ISA_VNNI);
}

static const char *const NAMES[QD_KN_COUNT][2] = {
    [QD_KN_PANEL] = {"run_panel", "qdot_portable.c"},
    [QD_KN_MK_A] = {"mk_a", "qdot_mk_avx2.c"},
    [QD_KN_MK_K] = {"mk_k", "qdot_mk_avx2.c"},
    [QD_KN_Z_MK_A] = {"z_mk_a", "qdot_mk_avx512.c"},
    [QD_KN_Z_MK_K] = {"z_mk_k", "qdot_mk_avx512.c"},
    [QD_KN_MK_K_TILED] = {"mk_k tiled", "qdot_exact.c"},
    [QD_KN_Z_MK_K_TILED] = {"z_mk_k tiled", "qdot_exact.c"},
    [QD_KN_Z_MK_Q4K_EXACT] = {"z_mk_q4k_exact", "qdot_exact.c"},
    [QD_KN_SIMD_32] = {"simd_32", "qdot_exact.c"},
    [QD_KN_SIMD_Q6_K] = {"simd_q6_K", "qdot_exact.c"},
    [QD_KN_SIMD_Q4_K] = {"simd_q4_K", "qdot_exact.c"},
    [QD_KN_SIMD_K_DOT] = {"simd_k_dot", "qdot_exact.c"},
    [QD_KN_REF_32] = {"ref_32", "qdot_exact.c"},
    [QD_KN_REF_Q6_K] = {"ref_q6_K", "qdot_exact.c"},
    [QD_KN_REF_Q4_K] = {"ref_q4_K", "qdot_exact.c"},
    [QD_KN_REF_K_TILED] = {"ref_k_tiled", "qdot_exact.c"},
    [QD_KN_REF_K_DOT] = {"ref_k_dot", "qdot_exact.c"},
};

const char *qd_kernel_name(int k) { return k >= 0 && k < QD_KN_COUNT ? NAMES[k][0] : NULL; }
const char *qd_kernel_file(int k) { return k >= 0 && k < QD_KN_COUNT ? NAMES[k][1] : NULL; }
int qd_kernel_pair(int k) { return qd_kernel_is_pair(k); }  /* qd_kernel_is_pair for ctypes */
