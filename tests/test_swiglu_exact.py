"""kernels/cpu/pointwise.c swiglu_f32 against llama.cpp's own AVX-512 SwiGLU: ggml-cpu's
ggml_vec_swiglu_f32 with vec.h's AVX-512 ggml_v_silu / ggml_v_expf, copied verbatim below and
compiled with the intrinsics on this machine; every output bit must agree (random gates over the
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


def _ggml_swiglu(tmp_path):
    src, lib = tmp_path / "swiglu.c", tmp_path / "swiglu.so"
    src.write_text(GGML_AVX512_SWIGLU)
    subprocess.run(["gcc", "-O3", "-mavx512f", "-mavx512dq", "-mfma", "-shared", "-fPIC", "-o", str(lib), str(src),
                    "-lm"], check=True)
    fn = ctypes.CDLL(str(lib)).ggml_vec_swiglu_f32
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return fn


@pytest.mark.skipif(shutil.which("gcc") is None or native.lib() is None or not pointwise._ggml_swiglu_is_avx512(),
                    reason="needs gcc, the C kernels and an AVX-512F/DQ CPU (where llama.cpp takes this path)")
@pytest.mark.parametrize("n", [4864, 8960, 37])
def test_swiglu_is_ggmls_avx512_bit_for_bit(tmp_path, n):
    ggml = _ggml_swiglu(tmp_path)
    g = torch.Generator().manual_seed(n)
    T = 3
    x = torch.randn(T, n, generator=g) * torch.tensor([1.0, 8.0, 40.0]).unsqueeze(1)
    x[0, :12] = torch.tensor([0.0, -0.0, 88.5, -88.5, 103.0, -104.5, 150.0, -150.0, 1e-30, -1e-30,
                              float("inf"), float("-inf")])
    up = torch.randn(T, n, generator=g)
    gate_up = torch.cat([x, up], dim=1)  # strided views, as the model passes them
    gate, upv = gate_up[:, :n], gate_up[:, n:]
    got = cpu.silu_mul(gate, upv)
    assert cpu.silu_mul is pointwise.silu_mul
    for t in range(T):
        want = np.zeros(n, dtype=np.float32)
        xc, uc = x[t].contiguous().numpy(), up[t].contiguous().numpy()
        ggml(n, want.ctypes.data, xc.ctypes.data, uc.ctypes.data)
        w, o = want.view(np.int32), got[t].numpy().view(np.int32)
        same = (w == o) | (np.isnan(want) & np.isnan(got[t].numpy()))
        assert same.all(), (t, np.nonzero(~same)[0][:5], want[~same][:5], got[t].numpy()[~same][:5])
    # and it is not torch's silu (whose exp differs in the last bits)
    assert not torch.equal(got[1:], ref.silu_mul(gate, upv)[1:])
