"""kernels.ref.gelu_mul is ggml's CPU GeGLU: the gate rounded to float16 and looked up in
`ggml_table_gelu_f16`, which ggml fills at start-up with its scalar tanh GELU. The table is
rebuilt here by compiling that very expression (ggml-cpu/vec.h `ggml_gelu_f32`, in ggml_cpu_init)
with the flags llama.cpp's CPU build uses (-O3 -march=native: GCC contracts `1 + A*x*x` into an
FMA), and compared entry by entry with kernels.ref's."""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
import torch

from kernels import ref

GGML_GELU = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
static const float GELU_COEF_A    = 0.044715f;
static const float SQRT_2_OVER_PI = 0.79788456080286535587989211986876f;
inline static float ggml_gelu_f32(float x) {
    return 0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f + GELU_COEF_A*x*x)));
}
void table(uint16_t *out) {
    for (int i = 0; i < 65536; ++i) {
        uint16_t u = (uint16_t)i; _Float16 h; memcpy(&h, &u, 2);
        _Float16 r = (_Float16)ggml_gelu_f32((float)h); memcpy(&out[i], &r, 2);
    }
}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_gelu_table_is_ggmls(tmp_path):
    src, lib = tmp_path / "gelu.c", tmp_path / "gelu.so"
    src.write_text(GGML_GELU)
    subprocess.run(["gcc", "-O3", "-march=native", "-shared", "-fPIC", "-o", str(lib), str(src), "-lm"], check=True)
    want = np.zeros(65536, dtype=np.uint16)
    ctypes.CDLL(str(lib)).table(ctypes.c_void_p(want.ctypes.data))
    want_f = torch.from_numpy(want.view(np.float16).astype(np.float32))
    got = ref._gelu_f16_table("cpu")
    x = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    used = torch.isfinite(x) & (x.abs() < 10)  # gelu_mul bypasses the table outside (-10, 10)
    assert torch.equal(got[used], want_f[used])
    # torch's own tanh GELU is not this table (so the lookup is what makes it ggml's)
    theirs = torch.nn.functional.gelu(x[used], approximate="tanh").half().float()
    assert int((theirs != want_f[used]).sum()) > 0


def test_gelu_mul_uses_the_table():
    g = torch.tensor([[-1.9990234375, -12.0, 12.0, 0.5, -5.07]])
    up = torch.tensor([[2.0, 3.0, 0.5, 1.0, 1.0]])
    out = ref.gelu_mul(g, up)
    tab = ref._gelu_f16_table("cpu")
    idx = g.half().view(torch.int16).long() & 0xFFFF
    assert out[0, 0] == tab[idx[0, 0]] * 2.0 and out[0, 1] == 0.0 and out[0, 2] == 6.0
    assert out[0, 3] == tab[idx[0, 3]] and out[0, 4] == tab[idx[0, 4]]


def test_cpu_gelu_mul_is_the_references_bits():
    """kernels.cpu's GeGLU (one C call, pointwise.c gelu_table_mul_f32) against the reference: every
    float16 value, values between them (rounded to float16 first), the +-10 edges, inf and NaN,
    and strided rows (the gate and up halves of one matmul output)."""
    from kernels.cpu import native, pointwise
    if native.lib() is None:
        pytest.skip("no compiled CPU kernels")
    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    edges = torch.tensor([-10.0, 10.0, -9.99999, 9.99999, -10.00001, 10.00001, 1e-8, -1e-8, 3.3e38,
                          float("inf"), float("-inf"), float("nan")])
    g = torch.cat([every, edges, torch.randn(4000, generator=torch.Generator().manual_seed(1)) * 4]).reshape(4, -1)
    gu = torch.cat([g, torch.randn(g.shape, generator=torch.Generator().manual_seed(2))], dim=1)
    gate, up = gu.split(g.shape[1], dim=1)
    got, want = pointwise.gelu_mul(gate, up), ref.gelu_mul(gate, up)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
