"""kernels/cpu/pointwise.c swiglu_f32 / swiglu_f32_avx2 against llama.cpp's own SwiGLU: ggml-cpu's
ggml_vec_swiglu_f32 with vec.h's AVX-512 and AVX2 ggml_v_silu / ggml_v_expf, copied verbatim below
and compiled with the intrinsics on this machine; every output bit must agree (random gates over the
whole range, the overflow/underflow edges, tails shorter than a vector)."""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
import torch

from kernels import cpu, ref
from kernels.cpu import native, pointwise

GGML_AVX512_SWIGLU = r"""
#include <immintrin.h>
#include <math.h>
inline static __m512 ggml_v_expf(__m512 x) {
  const __m512 r = _mm512_set1_ps(0x1.8p23f);
  const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
  const __m512 n = _mm512_sub_ps(z, r);
  const __m512 b =
      _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                       _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
  const __mmask16 d =
      _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192), _CMP_GT_OQ);
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 j = _mm512_fmadd_ps(
      _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b,
                                      _mm512_set1_ps(0x1.573e2ep-5f)),
                      u,
                      _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b,
                                      _mm512_set1_ps(0x1.fffdb6p-2f))),
      u,
      _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0F)));
  const __m512 res = _mm512_scalef_ps(j, n);
  if (_mm512_kortestz(d, d))
    return res;
  const __m512 zero = _mm512_setzero_ps();
  const __m512 alt = _mm512_mask_blend_ps(
      _mm512_cmp_ps_mask(n, zero, _CMP_LE_OQ), _mm512_set1_ps(INFINITY), zero);
  return _mm512_mask_blend_ps(d, res, alt);
}
inline static __m512 ggml_v_silu(__m512 x) {
    const __m512 one = _mm512_set1_ps(1);
    const __m512 zero = _mm512_setzero_ps();
    const __m512 neg_x = _mm512_sub_ps(zero, x);
    const __m512 exp_neg_x = ggml_v_expf(neg_x);
    const __m512 one_plus_exp_neg_x = _mm512_add_ps(one, exp_neg_x);
    return _mm512_div_ps(x, one_plus_exp_neg_x);
}
inline static float ggml_silu_f32(float x) { return x/(1.0f + expf(-x)); }
void ggml_vec_swiglu_f32(const int n, float * y, const float * x, const float * g) {
    int i = 0;
    for (; i + 15 < n; i += 16) {
        _mm512_storeu_ps(y + i, _mm512_mul_ps(ggml_v_silu(_mm512_loadu_ps(x + i)), _mm512_loadu_ps(g + i)));
    }
    for (; i < n; ++i) {
        y[i] = ggml_silu_f32(x[i]) * g[i];
    }
}
"""


GGML_AVX2_SWIGLU = r"""
#include <immintrin.h>
#include <math.h>
inline static __m256 ggml_v_expf(__m256 x) {
  const __m256 r = _mm256_set1_ps(0x1.8p23f);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
  const __m256 n = _mm256_sub_ps(z, r);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                    _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
  const __m256 k = _mm256_castsi256_ps(
      _mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
  const __m256i c = _mm256_castps_si256(
      _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n),
                    _mm256_set1_ps(126), _CMP_GT_OQ));
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b,
                                                                   _mm256_set1_ps(0x1.573e2ep-5f)), u,
                                                   _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b,
                                                                   _mm256_set1_ps(0x1.fffdb6p-2f))),
                                   u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
  if (!_mm256_movemask_ps(_mm256_castsi256_ps(c)))
    return _mm256_fmadd_ps(j, k, k);
  const __m256i g = _mm256_and_si256(
      _mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
      _mm256_set1_epi32(0x82000000u));
  const __m256 s1 =
      _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000u)));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
  const __m256i d = _mm256_castps_si256(
      _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n),
                    _mm256_set1_ps(192), _CMP_GT_OQ));
  return _mm256_or_ps(
      _mm256_and_ps(_mm256_castsi256_ps(d), _mm256_mul_ps(s1, s1)),
      _mm256_andnot_ps(
          _mm256_castsi256_ps(d),
          _mm256_or_ps(
              _mm256_and_ps(_mm256_castsi256_ps(c),
                            _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
              _mm256_andnot_ps(_mm256_castsi256_ps(c), _mm256_fmadd_ps(k, j, k)))));
}
inline static __m256 ggml_v_silu(__m256 x) {
    const __m256 one = _mm256_set1_ps(1);
    const __m256 zero = _mm256_setzero_ps();
    const __m256 neg_x = _mm256_sub_ps(zero, x);
    const __m256 exp_neg_x = ggml_v_expf(neg_x);
    const __m256 one_plus_exp_neg_x = _mm256_add_ps(one, exp_neg_x);
    return _mm256_div_ps(x, one_plus_exp_neg_x);
}
inline static float ggml_silu_f32(float x) { return x/(1.0f + expf(-x)); }
void ggml_vec_swiglu_f32(const int n, float * y, const float * x, const float * g) {
    int i = 0;
    for (; i + 7 < n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_mul_ps(ggml_v_silu(_mm256_loadu_ps(x + i)), _mm256_loadu_ps(g + i)));
    }
    for (; i < n; ++i) {
        y[i] = ggml_silu_f32(x[i]) * g[i];
    }
}
"""

def _ggml_swiglu(tmp_path, src_text: str, flags: list[str]):
    src, lib = tmp_path / "swiglu.c", tmp_path / "swiglu.so"
    src.write_text(src_text)
    subprocess.run(["gcc", "-O3", *flags, "-shared", "-fPIC", "-o", str(lib), str(src), "-lm"], check=True)
    fn = ctypes.CDLL(str(lib)).ggml_vec_swiglu_f32
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return fn


def _inputs(n: int):
    g = torch.Generator().manual_seed(n)
    T = 3
    x = torch.randn(T, n, generator=g) * torch.tensor([1.0, 8.0, 40.0]).unsqueeze(1)
    x[0, :12] = torch.tensor([0.0, -0.0, 88.5, -88.5, 103.0, -104.5, 150.0, -150.0, 1e-30, -1e-30,
                              float("inf"), float("-inf")])
    up = torch.randn(T, n, generator=g)
    gate_up = torch.cat([x, up], dim=1)  # strided views, as the model passes them
    return x, up, gate_up[:, :n], gate_up[:, n:]


def _assert_same_bits(ggml, x, up, got):
    n = x.shape[1]
    for t in range(x.shape[0]):
        want = np.zeros(n, dtype=np.float32)
        xc, uc = x[t].contiguous().numpy(), up[t].contiguous().numpy()
        ggml(n, want.ctypes.data, xc.ctypes.data, uc.ctypes.data)
        w, o = want.view(np.int32), got[t].numpy().view(np.int32)
        same = (w == o) | (np.isnan(want) & np.isnan(got[t].numpy()))
        assert same.all(), (t, np.nonzero(~same)[0][:5], want[~same][:5], got[t].numpy()[~same][:5])


@pytest.mark.skipif(shutil.which("gcc") is None or native.lib() is None or pointwise.swiglu_name() != "swiglu_f32",
                    reason="needs gcc, the C kernels and an AVX-512F/DQ CPU (where llama.cpp takes this path)")
@pytest.mark.parametrize("n", [4864, 8960, 37])
def test_swiglu_is_ggmls_avx512_bit_for_bit(tmp_path, n):
    ggml = _ggml_swiglu(tmp_path, GGML_AVX512_SWIGLU, ["-mavx512f", "-mavx512dq", "-mfma"])
    x, up, gate, upv = _inputs(n)
    got = cpu.silu_mul(gate, upv)
    assert cpu.silu_mul is pointwise.silu_mul
    _assert_same_bits(ggml, x, up, got)
    # and it is not torch's silu (whose exp differs in the last bits)
    assert not torch.equal(got[1:], ref.silu_mul(gate, upv)[1:])


@pytest.mark.skipif(shutil.which("gcc") is None or native.lib() is None
                    or not {"avx2", "fma"} <= native.cpu_flags(),
                    reason="needs gcc, the C kernels and an AVX2 + FMA CPU")
@pytest.mark.parametrize("n", [4864, 8960, 37])
def test_swiglu_avx2_is_ggmls_avx2_bit_for_bit(tmp_path, n):
    """swiglu_f32_avx2 (what silu_mul takes on CPUs without AVX-512F/DQ) against llama.cpp's AVX2 branch,
    called directly so that it runs on AVX-512 machines too."""
    ggml = _ggml_swiglu(tmp_path, GGML_AVX2_SWIGLU, ["-mavx2", "-mfma"])
    x, up, gate, upv = _inputs(n)
    got = torch.empty_like(x)
    native.lib().swiglu_f32_avx2(gate.data_ptr(), upv.data_ptr(), got.data_ptr(), n, gate.stride(0), upv.stride(0),
                                 n, x.shape[0], 2)
    _assert_same_bits(ggml, x, up, got)
    assert not torch.equal(got[1:], ref.silu_mul(gate, upv)[1:])
    if pointwise.swiglu_name() == "swiglu_f32_avx2":
        assert torch.equal(cpu.silu_mul(gate, upv).view(torch.int32), got.view(torch.int32))
