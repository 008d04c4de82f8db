"""Reference (plain torch) ops of the gated linear-attention layers (qwen35 / qwen35moe's gated delta
net), as ggml b1-0c1e570 computes them: `ssm_conv` (ggml_ssm_conv + ggml_silu with the state kept
as llama.cpp's build_conv_state keeps it) and `gated_delta_net` (ggml_gated_delta_net, the fused op
llama.cpp's CPU backend runs for prompts and for single tokens), plus `gated_delta_net_chunked`,
the chunked form of llama.cpp's non-fused prompt graph (build_delta_net_chunking: chunks of 64,
a triangular solve per chunk, the state carried from chunk to chunk), the same function in
another order of operations.

States are kept per cell (a sequence's row of the state tensors the serving room hands out):
- conv state [NC, K - 1, C]: the last K - 1 inputs (rows) of the convolution;
- recurrent state [NC, H, S, S], head h's matrix stored as ggml stores it: entry [h, j, i] is
  S[i][j] (row j of the stored matrix = column j of the state), so o = S^T q is a row-dot.
Value head h reads key head h % Hk (ggml's broadcast of q and k over the value heads).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def ssm_conv(x: torch.Tensor, w: torch.Tensor, conv_state: torch.Tensor, cells: torch.Tensor,
             cu: torch.Tensor) -> torch.Tensor:
    """silu(causal depthwise conv) of each sequence's rows x[cu[s]:cu[s+1]] ([T, C] float32) with
    weights w [C, K], the K - 1 rows before them read from conv_state[cells[s]] ([NC, K - 1, C]),
    which then holds the sequence's last K - 1 inputs. y[t, c] = silu(sum_i in[t + i, c] w[c, i])
    (the sum in float32 from i = 0, each step one fused multiply-add, as ggml's loop compiles)."""
    K = w.shape[1]
    out = torch.empty_like(x)
    wd = w.double()
    for s, cell in enumerate(cells.tolist()):
        a, b = int(cu[s]), int(cu[s + 1])
        if b == a:
            continue
        inp = torch.cat([conv_state[cell].to(x.dtype), x[a:b]])  # [K - 1 + n, C]
        n = b - a
        acc = torch.zeros(n, x.shape[1], dtype=torch.float32, device=x.device)
        for i in range(K):
            acc = (acc.double() + inp[i:i + n].double() * wd[:, i]).float()  # fmaf(in, w, acc)
        out[a:b] = F.silu(acc)
        conv_state[cell] = inp[n:].to(conv_state.dtype)
    return out


def _heads(x: torch.Tensor, Hv: int) -> torch.Tensor:
    """[n, Hk, S] -> [n, Hv, S]: value head h reads key head h % Hk."""
    Hk = x.shape[1]
    return x if Hk == Hv else x.repeat(1, Hv // Hk, 1)


def gated_delta_net(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    state: torch.Tensor, cells: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """The gated delta rule, token by token (ggml_gated_delta_net): for each sequence s (rows
    cu[s]:cu[s+1] of q, k [T, Hk, S], v [T, Hv, S], g, beta [T, Hv]) and head h, starting from
    state[cells[s], h] (M = S^T, [S, S]):
        M *= exp(g);  d = (v - M k) * beta;  M += d k^T;  o = (M q) / sqrt(S)
    Returns o [T, Hv, S] (float32, float64 for float64 inputs); state[cells[s]] holds the final state."""
    T, Hv, S = v.shape
    dt = torch.promote_types(v.dtype, torch.float32)  # float64 inputs: the tests' oracle
    o = torch.empty(T, Hv, S, dtype=dt, device=v.device)
    scale = 1.0 / math.sqrt(S)
    for s, cell in enumerate(cells.tolist()):
        a, b = int(cu[s]), int(cu[s + 1])
        if b == a:
            continue
        M = state[cell].to(dt).clone()  # [Hv, S(j), S(i)]
        qs, ks = _heads(q[a:b].to(dt), Hv), _heads(k[a:b].to(dt), Hv)
        vs, gs, bs = v[a:b].to(dt), g[a:b].to(dt), beta[a:b].to(dt)
        for t in range(b - a):
            M *= torch.exp(gs[t])[:, None, None]
            d = (vs[t] - torch.einsum("hji,hi->hj", M, ks[t])) * bs[t][:, None]  # [Hv, S]
            M += d[:, :, None] * ks[t][:, None, :]
            o[a + t] = torch.einsum("hji,hi->hj", M, qs[t]) * scale
        state[cell] = M.to(state.dtype)
    return o


CHUNK = 64  # llama.cpp's chunk size (CS) of build_delta_net_chunking for scalar gates


def _chunk_one(q, k, v, g, beta, M, chunk: int = CHUNK):
    """One sequence, one head, in llama.cpp's chunked order (float64 or float32 tensors): q, k, v
    [n, S], g, beta [n], M [S(j), S(i)] (M = S^T). Returns (o [n, S] unscaled by 1/sqrt(S) and
    already scaled q, final M)."""
    n, S = k.shape
    pad = (-n) % chunk
    if pad:
        z = lambda t: torch.cat([t, t.new_zeros((pad, *t.shape[1:]))])  # noqa: E731
        q, k, v, g, beta = z(q), z(k), z(v), z(g), z(beta)
    St = M.transpose(0, 1).clone()  # S [S(i) keys, S(j) values]
    outs = []
    tri_strict = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool, device=k.device), -1)
    tri = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool, device=k.device))
    eye = torch.eye(chunk, dtype=k.dtype, device=k.device)
    for c0 in range(0, n + pad, chunk):
        qc, kc, vc = q[c0:c0 + chunk], k[c0:c0 + chunk], v[c0:c0 + chunk]
        gc, bc = g[c0:c0 + chunk], beta[c0:c0 + chunk]
        gcs = torch.cumsum(gc, 0)  # [CS]
        decay = torch.exp((gcs[:, None] - gcs[None, :]).masked_fill(~tri, 0)).masked_fill(~tri, 0)  # [i, j] i >= j
        kb = kc * bc[:, None]
        vb = vc * bc[:, None]
        A = ((kb @ kc.T) * decay).masked_fill(~tri_strict, 0)  # strictly lower [CS, CS]
        # (I + A) X = -A, attn = X + I  ->  attn = (I + A)^-1
        attn = torch.linalg.solve_triangular(eye + A, -A, upper=False, unitriangular=True) + eye
        v_new_base = attn @ vb  # [CS, S]
        k_cd = attn @ (kb * torch.exp(gcs)[:, None])  # [CS, S]
        kq = ((qc @ kc.T) * decay).masked_fill(~tri, 0)  # [CS(i), CS(j)] lower incl. diagonal
        v_t_new = v_new_base - k_cd @ St  # [CS, S]
        o = kq @ v_t_new + (qc * torch.exp(gcs)[:, None]) @ St
        outs.append(o)
        g_last = gcs[-1]
        kg = kc * torch.exp(g_last - gcs)[:, None]
        St = St * torch.exp(g_last) + kg.T @ v_t_new
    o = torch.cat(outs)[:n]
    return o, St.transpose(0, 1).contiguous()


def gated_delta_net_chunked(q, k, v, g, beta, state, cells, cu, dtype: torch.dtype = torch.float32,
                            chunk: int = CHUNK) -> torch.Tensor:
    """`gated_delta_net` in llama.cpp's chunked form (build_delta_net_chunking, scalar gates): the
    same results within rounding; computed in `dtype` (float64 for the tests' oracle)."""
    T, Hv, S = v.shape
    o = torch.empty(T, Hv, S, dtype=torch.float32, device=v.device)
    scale = 1.0 / math.sqrt(S)
    for s, cell in enumerate(cells.tolist()):
        a, b = int(cu[s]), int(cu[s + 1])
        if b == a:
            continue
        qs, ks = _heads(q[a:b], Hv).to(dtype) * scale, _heads(k[a:b], Hv).to(dtype)
        for h in range(Hv):
            oh, Mh = _chunk_one(qs[:, h], ks[:, h], v[a:b, h].to(dtype), g[a:b, h].to(dtype),
                                beta[a:b, h].to(dtype), state[cell, h].to(dtype), chunk)
            o[a:b, h] = oh.float()
            state[cell, h] = Mh.to(state.dtype)
    return o


def gdn_gates(b: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, A: torch.Tensor):
    """(beta, g) [T, H] float32 of the projections b, a [T, H]: beta = sigmoid(b), g = softplus(a +
    dt_bias) * A (ggml_softplus: x above 20 as is)."""
    beta = torch.sigmoid(b.float())
    g = F.softplus(a.float() + dt_bias.float()) * A.float()
    return beta, g


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + exp(-x)), in x.dtype (ggml_sigmoid)."""
    return torch.sigmoid(x.float()).to(x.dtype)
