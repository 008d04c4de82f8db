"""The Triton backend: the ops of the dispatch surface (docs/DESIGN.md) as Triton kernels, for CUDA
tensors (and CPU tensors under TRITON_INTERPRET=1). Imported only when a Triton op is first asked
for (`kernels.Backend`), so a CPU-only engine never imports triton and tests can set
TRITON_INTERPRET before the kernels are decorated.

One kernel per file, its torch reference (`kernels.ref`) named as `reference` at the top and its
autotune configs beside it:

| file | kernel |
| --- | --- |
| `dequant.py` | `_dequant_rows_kernel`: `dequantize`, `embedding` |
| `packed.py` | the GPU repack of quantized weights (`pack`), `_dequant_packed_kernel` |
| `qmatmul_q8.py` | `_quant_act_kernel` + `_qmm_q8_gemv_kernel` (dp4a): `qmatmul` of repacked weights, M <= 8 |
| `qmatmul_tiled.py` | `_qmm_packed_tiled_kernel` (`tl.dot`): repacked weights, larger M; `_qmm_tiled_kernel`: GGUF blocks |
| `qmatmul_gemv.py` | `_qmm_gemv_kernel`: `qmatmul` of types without a repack (GGUF blocks), M <= 16 |
| `paged_decode.py` | `_paged_decode_kernel`: `paged_attention` when every q_len is 1 (split-K, the last split of each sequence and KV head merges: `merge_splits.merge_head`; decode rows: also the output's q8_1 form) |
| `paged_prefill.py` | `_paged_prefill_kernel`: `paged_attention` for prefill / mixed batches |
| `norm.py` | `_rms_norm_kernel`: `rms_norm`, `add_rms_norm` (decode rows: + their q8_1 form) |
| `rope.py` | `_rope_kernel` |
| `rope_write_kv.py` | `_rope_write_kv_kernel`: `rope_write_kv` (q and k rotated, k and v written to the cache: one launch) |
| `silu_mul.py` | `_silu_mul_kernel` (decode rows: + their q8_1 form) |
| `write_kv.py` | `_write_kv_kernel` |
| `moe_gemm.py` | `_moe_gemm_kernel`: `moe_ffn` (tokens grouped by expert, dequantizing grouped GEMM, SwiGLU fused) |
| `dense_attention.py` | `_dense_attention_kernel`: `dense_attention` (contiguous keys, optional mask: the vision encoder, image spans) |
| `layer_norm.py` | `_layer_norm_kernel`: `layer_norm` |
| `linear_attn.py` | `_ssm_conv_kernel`: `ssm_conv`; `_gdn_kernel`: `gated_delta_net` (the gated delta rule, state rows in registers) |

plus the device functions they share: `gguf_tl.py` (GGUF blocks dequantized in registers),
`attend_tile.py` (one online-softmax step) and `merge_splits.py` (the split-K merge); `tuning.py` (the matmul launch configs, timed at
start-up only, kept on disk) and `aot_cases.py` (every kernel's real launches, for
`scripts/aot_compile.py`: a new kernel adds its case there). This module says which kernel serves
each op.
"""
from __future__ import annotations

import torch

from ..qweight import QWeight
from ..ref import cat_rows, gelu_mul, moe_route, packs_quantized, prepare_topk_head, topk  # noqa: F401  (device-agnostic torch)
from ..ref import prepare_experts  # noqa: F401  (the stacked GGUF layout, as the kernels read it)
from ..ref import fused_decoder  # noqa: F401  (none: CUDA graphs cut the per-op cost instead)
from ..ref import gdn_gates, sigmoid  # noqa: F401  (pointwise torch on the device)
from .moe_gemm import moe_ffn  # noqa: F401
from .dense_attention import dense_attention  # noqa: F401
from . import dequant, packed
from .layer_norm import layer_norm  # noqa: F401
from .linear_attn import gated_delta_net, ssm_conv  # noqa: F401
from .norm import add_rms_norm, rms_norm  # noqa: F401
from .paged_decode import paged_decode
from .paged_prefill import paged_prefill
from .qmatmul_gemv import GEMV_MAX_M, qmatmul_gemv
from .qmatmul_q8 import Q8_MAX_M, act_buffers, attach, attached, fuses_quant, qmatmul_q8, quantize_act
from .qmatmul_tiled import qmatmul_packed_tiled, qmatmul_tiled
from .rope import rope  # noqa: F401
from .rope_write_kv import rope_write_kv  # noqa: F401
from .silu_mul import silu_mul  # noqa: F401
from .write_kv import write_kv  # noqa: F401


def prepare_weight(w: QWeight, unpack_quantized: bool = False, pack_quantized: bool = True) -> QWeight:
    """Once at load: the types of `packed.PACKED_TYPES` repacked into the "gpu" layout (codes and
    scale factors apart, aligned for 16-byte loads; same values); the others, and float weights,
    as they are (GGUF blocks). The flags are the CPU path's and change nothing here."""
    return packed.pack(w) if packed.packs(w) else w


def prepare_weights(ws: list[QWeight], unpack_quantized: bool = False, pack_quantized: bool = True) -> list[QWeight]:
    """Weights reading the same input: consecutive ones of one type concatenated (`ref.cat_rows`)
    and repacked; when every one repacks, one "gpu" weight whose `parts` are those (a matmul
    quantizes the input once and writes the parts' outputs side by side, no concatenation)."""
    runs: list[list[QWeight]] = []
    for w in ws:
        if runs and runs[-1][0].qtype == w.qtype and runs[-1][0].cols == w.cols:
            runs[-1].append(w)
        else:
            runs.append([w])
    out = []
    for r in runs:
        joined = cat_rows(r)
        if len(joined) != 1:  # not joinable (a layout other than "rows"): each as it is
            return [prepare_weight(w) for w in ws]
        out.append(prepare_weight(joined[0]))
    if len(out) > 1 and all(o.layout == "gpu" for o in out):
        return [QWeight(out[0].data, out[0].qtype, sum(o.rows for o in out), out[0].cols, layout="gpu", parts=out)]
    return out


def dequantize(w: QWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if w.parts is not None:
        return torch.cat([dequantize(p, dtype) for p in w.parts], 0)
    if w.layout == "gpu":
        return packed.dequantize_packed(w, None, dtype)
    return dequant.dequantize(w, dtype)


def embedding(ids: torch.Tensor, w: QWeight) -> torch.Tensor:
    if w.layout == "gpu" and w.parts is None:
        return packed.dequantize_packed(w, ids.to(device=w.data.device, dtype=torch.int64).contiguous(), torch.float32)
    if w.layout == "gpu":
        return dequantize(w)[ids.to(device=w.data.device, dtype=torch.int64)]
    return dequant.embedding(ids, w)


def qmatmul(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """y[M, N] = x[M, K] @ dequant(W)^T in x.dtype. Repacked weights: the dp4a GEMV on activations
    quantized once per call for M <= Q8_MAX_M (or already, by the RMSNorm / SiLU-mul kernel that
    wrote x: `qmatmul_q8.attached`), the `tl.dot` kernel above; GGUF-block weights: the
    dequantizing GEMV for M <= 16, the `tl.dot` kernel above."""
    M, K = x.shape
    assert K == w.cols, (x.shape, w.cols)
    y = torch.empty(M, w.rows, dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    if w.layout != "gpu":
        return qmatmul_gemv(x, w, y) if M <= GEMV_MAX_M else qmatmul_tiled(x, w, y)
    xq = attached(x) if M <= Q8_MAX_M else None  # written by the norm / SiLU kernel that wrote x
    if x.stride(1) != 1:
        x = x.contiguous()
    if xq is None and M <= Q8_MAX_M:
        xq = quantize_act(x)
    if xq is not None and w.parts is not None and len(w.parts) == 2:  # q/k and v of another type: one launch
        return qmatmul_q8(x, w.parts[0], y, xq, w.parts[1])
    r0 = 0
    for p in w.parts or [w]:
        out = y[:, r0:r0 + p.rows]
        if xq is not None:
            qmatmul_q8(x, p, out, xq)
        else:
            qmatmul_packed_tiled(x, p, out)
        r0 += p.rows
    return y


def paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale: float,
                    softcap: float = 0.0, max_q_len: int | None = None, window: int = 0, k_type=None,
                    v_type=None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as `kernels.ref.paged_attention`: the decode kernel when every query run has
    length 1, the prefill kernel otherwise. Without `max_q_len`, one host sync reads the longest
    query run."""
    T, H, D = q.shape
    S = kv_lens.shape[0]
    out = torch.empty_like(q)
    if T == 0 or S == 0:
        return out
    cu = cu_seqlens_q.to(device=q.device, dtype=torch.int32).contiguous()
    lens = kv_lens.to(device=q.device, dtype=torch.int32).contiguous()
    bt = block_tables.to(device=q.device, dtype=torch.int32)
    if max_q_len is None:
        max_q_len = int((cu[1:] - cu[:-1]).max().item())
    if sinks is not None:
        sinks = sinks.to(device=q.device, dtype=torch.float32).contiguous()
    if max_q_len == 1:
        xq = None
        # the output's q8_1 form for o_proj (float caches: over quantized ones the registers of the
        # tiles' dequantization leave no room for it under triton 3.6's 192)
        if fuses_quant(T, H * D) and D >= 32 and D & (D - 1) == 0 and k_type is None and v_type is None:
            flat = torch.empty(T, H * D, dtype=q.dtype, device=q.device)
            out, xq = flat.view(T, H, D), act_buffers(T, H * D, q.device)
            attach(flat, xq)
        return paged_decode(q, k_cache, v_cache, bt, cu, lens, scale, softcap, out=out, window=window,
                            k_type=k_type, v_type=v_type, sinks=sinks, xq=xq)
    return paged_prefill(q, k_cache, v_cache, bt, cu, lens, scale, softcap, max_q_len=max_q_len, out=out,
                         window=window, k_type=k_type, v_type=v_type, sinks=sinks)


def router_matmul(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """`kernels.router_matmul`: this backend's qmatmul in float32."""
    return qmatmul(x.float(), w).float()


def topk_logits(x: torch.Tensor, w: QWeight, head, topk: list[int], banned: list[tuple[int, ...]]) -> torch.Tensor:
    """Every row exact (no top-k head on this backend: `prepare_topk_head` gives None)."""
    return qmatmul(x, w).float()
