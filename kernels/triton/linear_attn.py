"""The gated linear-attention layers' sequential ops (qwen35's gated delta net). References:
`kernels.ref_linear.ssm_conv`, `kernels.ref_linear.gated_delta_net`.

- `_ssm_conv_kernel`: one program per (sequence, block of channels): each token's K-tap causal
  depthwise convolution (the window's first K - 1 rows from the sequence's conv-state cell), SiLU,
  then the last K - 1 inputs written back into the cell.
- `_gdn_kernel`: one program per (sequence, value head, block of BJ state rows): the rows j of the
  state M = S^T are independent in the delta rule (d_j = (v_j - M_j . k) beta, M_j += d_j k,
  o_j = M_j . q), so a program keeps its [BJ, S] block in registers for the whole sequence: one
  read and one write of the state per step however many tokens; prompts and single tokens alike
  (the token loop is sequential, the parallelism is over sequences, heads and row blocks).
Float32 throughout (the states are float32, as llama.cpp keeps them).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import ref_linear

reference = ref_linear.gated_delta_net


@triton.jit
def _ssm_conv_kernel(x_ptr, w_ptr, st_ptr, cells_ptr, cu_ptr, y_ptr, C, stride_x, K: tl.constexpr,
                     BC: tl.constexpr):
    s = tl.program_id(0)
    offs = tl.program_id(1) * BC + tl.arange(0, BC)
    m = offs < C
    a = tl.load(cu_ptr + s)
    n = tl.load(cu_ptr + s + 1) - a
    cell = tl.load(cells_ptr + s).to(tl.int64)
    st = st_ptr + cell * (K - 1) * C
    for t in range(0, n):
        acc = tl.zeros([BC], dtype=tl.float32)
        for i in tl.static_range(K):
            r = offs * 0 + t + i  # row of the window: < K - 1 from the state, else token a + r - (K - 1)
            from_state = r < K - 1
            xs = tl.load(st + r * C + offs, mask=m & from_state, other=0.0)
            xr = tl.load(x_ptr + (a + r - (K - 1)).to(tl.int64) * stride_x + offs, mask=m & (r >= K - 1), other=0.0)
            w = tl.load(w_ptr + offs * K + i, mask=m, other=0.0)
            acc += tl.where(from_state, xs, xr) * w
        y = acc / (1.0 + tl.exp(-acc))
        tl.store(y_ptr + (a + t).to(tl.int64) * C + offs, y, mask=m)
    for r in tl.static_range(K - 1):  # rows n .. n + K - 2 of the window become the state (src > r)
        src = offs * 0 + n + r
        xs = tl.load(st + src * C + offs, mask=m & (src < K - 1), other=0.0)
        xr = tl.load(x_ptr + (a + src - (K - 1)).to(tl.int64) * stride_x + offs, mask=m & (src >= K - 1), other=0.0)
        tl.store(st + r * C + offs, tl.where(src < K - 1, xs, xr), mask=m)


def ssm_conv(x: torch.Tensor, w: torch.Tensor, conv_state: torch.Tensor, cells: torch.Tensor,
             cu: torch.Tensor) -> torch.Tensor:
    T, C = x.shape
    K = w.shape[1]
    x = x.float() if x.stride(1) == 1 and x.dtype == torch.float32 else x.float().contiguous()
    y = torch.empty(T, C, dtype=torch.float32, device=x.device)
    S = cells.shape[0]
    if T == 0 or S == 0:
        return y
    BC = min(256, triton.next_power_of_2(C))
    _ssm_conv_kernel[(S, triton.cdiv(C, BC))](
        x, w.contiguous(), conv_state, cells.to(device=x.device, dtype=torch.int64).contiguous(),
        cu.to(device=x.device, dtype=torch.int32).contiguous(), y, C, x.stride(0), K=K, BC=BC)
    return y


@triton.jit
def _gdn_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, st_ptr, cells_ptr, cu_ptr, o_ptr, H, HK, D, scale,
                BJ: tl.constexpr, BD: tl.constexpr):
    s = tl.program_id(0)
    h = tl.program_id(1)
    rows = tl.program_id(2) * BJ + tl.arange(0, BJ)
    cols = tl.arange(0, BD)
    mr, mc = rows < D, cols < D
    a = tl.load(cu_ptr + s)
    n = tl.load(cu_ptr + s + 1) - a
    cell = tl.load(cells_ptr + s).to(tl.int64)
    sp = st_ptr + (cell * H + h) * D * D + rows[:, None] * D + cols[None, :]
    M = tl.load(sp, mask=mr[:, None] & mc[None, :], other=0.0)  # [BJ, BD]: rows j, columns i
    hk = h % HK
    for t in range(0, n):
        row = (a + t).to(tl.int64)
        q = tl.load(q_ptr + (row * HK + hk) * D + cols, mask=mc, other=0.0)
        k = tl.load(k_ptr + (row * HK + hk) * D + cols, mask=mc, other=0.0)
        v = tl.load(v_ptr + (row * H + h) * D + rows, mask=mr, other=0.0)
        e = tl.exp(tl.load(g_ptr + row * H + h))
        beta = tl.load(b_ptr + row * H + h)
        M = M * e
        d = (v - tl.sum(M * k[None, :], axis=1)) * beta  # [BJ]
        M = M + d[:, None] * k[None, :]
        o = tl.sum(M * q[None, :], axis=1) * scale
        tl.store(o_ptr + (row * H + h) * D + rows, o, mask=mr)
    tl.store(sp, M, mask=mr[:, None] & mc[None, :])


def gated_delta_net(q, k, v, g, beta, state, cells, cu) -> torch.Tensor:
    T, H, D = v.shape
    HK = q.shape[1]
    q, k, v, g, beta = (t.float().contiguous() for t in (q, k, v, g, beta))
    o = torch.empty(T, H, D, dtype=torch.float32, device=v.device)
    S = cells.shape[0]
    if T == 0 or S == 0:
        return o
    BD = triton.next_power_of_2(D)
    BJ = min(BD, max(16, 4096 // BD))  # a [BJ, D] block of the state per program (16 KiB of float32 at D = 128)
    _gdn_kernel[(S, H, triton.cdiv(D, BJ))](
        q, k, v, g, beta, state, cells.to(device=v.device, dtype=torch.int64).contiguous(),
        cu.to(device=v.device, dtype=torch.int32).contiguous(), o, H, HK, D, 1.0 / math.sqrt(D), BJ=BJ, BD=BD)
    return o
