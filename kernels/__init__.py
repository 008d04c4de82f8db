"""Kernel dispatch surface (docs/DESIGN.md, "Kernel dispatch surface"): every op the runtime uses.

Three implementations of the same ops (`OPS`):

- `"cpu"` (`kernels.cpu`): the CPU engine's fastest paths (C kernels compiled on first use,
  BLAS, numpy), falling back to the reference;
- `"triton"` (`kernels.triton`): Triton kernels, for CUDA tensors (CPU tensors need
  TRITON_INTERPRET=1 set before triton is imported);
- `"torch"` (`kernels.ref`): the plain torch reference, the oracle of the other two.

Two ways to call an op, and no global setting:

- `Backend.for_device(device, name=None, numerics=None)`: the op set of one implementation,
  resolved once; the default (`name` None or "auto") is "triton" for CUDA devices and "cpu"
  otherwise, and `name` forces one (tests, benchmarks). `numerics` (`Numerics`, default GGML:
  llama.cpp's float order where the CPU kernels have it, kernels/numerics.py) is fixed in it: the
  ops whose arithmetic depends on it get it from there, never from the environment.
  `runtime.model.decoder.Model` holds one per model.
- the module functions below (`kernels.qmatmul(...)`, ...): the default backend of the device of
  their tensors (in `Numerics.GGML`), chosen per call.

The backends are imported when first asked for, so a CPU-only engine never imports triton; this
module itself imports neither torch nor a backend (`prepack_quantized` runs before torch is imported,
runtime/launch/preload.py), and `QWeight`, `Experts`, `DecoderLayer`, `DecoderShape` are loaded when first named.
"""
from __future__ import annotations

import functools
import importlib
import types
from typing import TYPE_CHECKING

from .numerics import Numerics

if TYPE_CHECKING:
    import torch

    from .cpu.prepack import Matrix as PackMatrix, Packed
    from .decoder import DecoderLayer, DecoderShape
    from .qweight import Experts, QWeight

_LAZY = {"DecoderLayer": ".decoder", "DecoderShape": ".decoder", "Experts": ".qweight", "QWeight": ".qweight",
         "PackMatrix": ".cpu.prepack"}


def __getattr__(name: str):
    """The torch-dependent names of `__all__`, imported when first used (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), "Matrix" if name == "PackMatrix" else name)
    globals()[name] = value
    return value

NAMES = ("torch", "cpu", "triton")
_MODULES = {"torch": "kernels.ref", "cpu": "kernels.cpu", "triton": "kernels.triton"}
OPS = (
    "prepare_weight", "prepare_weights", "packs_quantized", "dequantize", "qmatmul", "embedding", "rms_norm",
    "add_rms_norm", "rope", "silu_mul", "gelu_mul", "write_kv", "rope_write_kv", "paged_attention", "topk",
    "prepare_topk_head", "topk_logits", "moe_route", "prepare_experts", "moe_ffn", "fused_decoder", "layer_norm",
    "dense_attention", "ssm_conv", "gated_delta_net", "gdn_gates", "sigmoid", "router_matmul",
)
__all__ = ["Backend", "DecoderLayer", "DecoderShape", "Experts", "QWeight", "NAMES", "Numerics", "OPS", "PackMatrix",
           "prepack_quantized", "decode_image", "kv_quantized", "kv_row_bytes", "dequantize_kv", "kv_rotation_sizes", "hadamard", *OPS]


class Backend:
    """The ops of one implementation, as attributes named as in `OPS`, with the signatures of the
    module functions below (`packs_quantized` takes no device), and the `numerics` they compute in:
    the ops an implementation lists in its `NUMERICS_OPS` take it as a keyword, bound here.
    Immutable; `Backend.for_device` shares one instance per (name, numerics)."""

    _instances: dict[tuple[str, Numerics], Backend] = {}

    def __init__(self, name: str, numerics: Numerics | str = Numerics.GGML):
        if name not in NAMES:
            raise ValueError(f"unknown kernel backend {name!r}; expected one of {NAMES}")
        numerics = Numerics(numerics)
        impl = importlib.import_module(_MODULES[name])
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "numerics", numerics)
        takes = getattr(impl, "NUMERICS_OPS", ())
        for op in OPS:
            fn = getattr(impl, op)
            if isinstance(fn, types.ModuleType):  # a submodule of the same name (kernels/cpu/topk.py defines
                fn = getattr(fn, op)  # `topk`): importing it directly rebinds the package's attribute
            if op in takes:
                fn = functools.partial(fn, numerics=numerics)
            object.__setattr__(self, op, fn)

    def __setattr__(self, key, value):
        raise AttributeError("a kernel Backend is immutable")

    def __repr__(self) -> str:
        return f"Backend({self.name!r}, numerics={self.numerics.value!r})"

    @classmethod
    def for_device(cls, device: torch.device | str, name: str | None = None,
                   numerics: Numerics | str | None = None) -> Backend:
        """The backend for tensors on `device`: `name` ("torch" | "cpu" | "triton") when given,
        else (None or "auto") Triton for CUDA and the CPU backend otherwise; computing in
        `numerics` (default `Numerics.GGML`)."""
        if name is None or name == "auto":
            import torch

            name = "triton" if torch.device(device).type == "cuda" else "cpu"
        key = (name, Numerics.GGML if numerics is None else Numerics(numerics))
        b = cls._instances.get(key)
        if b is None:
            b = cls._instances[key] = cls(*key)
        return b


def _on(device: torch.device) -> Backend:
    return Backend.for_device(device)


def prepare_weight(w: QWeight, unpack_quantized: bool = False, pack_quantized: bool = True) -> QWeight:
    """Once at load: `w` in the layout its backend reads fastest (CPU: 64-row float tiles for the
    batched GEMV or [cols, rows] float32 for BLAS; quantized weights repacked exactly into integer
    tiles when `pack_quantized` and that kernel exists, else dequantized once when
    `unpack_quantized`; reference and Triton: the GGUF layout unchanged)."""
    return _on(w.data.device).prepare_weight(w, unpack_quantized, pack_quantized)


def prepare_weights(ws: list[QWeight], unpack_quantized: bool = False, pack_quantized: bool = True) -> list[QWeight]:
    """Once at load, weights that read the same input (q/k/v, gate/up), prepared together: the
    returned weights' `qmatmul` outputs, concatenated along dim 1, are x @ [W_0; W_1; ...]^T (CPU:
    one integer-dot group where qdot has the types; else rows concatenated where the types match)."""
    return _on(ws[0].data.device).prepare_weights(ws, unpack_quantized, pack_quantized)


def prepack_quantized(source, groups: list[list[PackMatrix]], n_threads: int = 1,
                      release_source: bool = False) -> dict[str, Packed]:
    """Before a CPU model is built, and without importing torch: the panels the CPU backend's
    `prepare_weights(..., pack_quantized=True)` makes of each group of quantized matrices in `source`
    (a flat uint8 buffer, e.g. a GGUF file's mapping; `PackMatrix` gives each matrix's place), as
    {name: Packed} for the groups its integer-dot kernels take whole ({} without them). A QWeight
    whose `repacked` is its Packed is then prepared without repacking (kernels/cpu/prepack.py)."""
    from .cpu.prepack import prepack

    return prepack(source, groups, n_threads, release_source)


def packs_quantized(device: torch.device | str) -> bool:
    """Whether `prepare_weight` on `device` can repack quantized weights for a kernel."""
    return Backend.for_device(device).packs_quantized()


def dequantize(w: QWeight, dtype: torch.dtype | None = None) -> torch.Tensor:
    """[rows, cols] matrix of `w` in `dtype` (default float32)."""
    b = _on(w.data.device)
    return b.dequantize(w) if dtype is None else b.dequantize(w, dtype)


def qmatmul(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """y[T, rows] = x[T, cols] @ dequant(w)^T, in x.dtype."""
    return _on(x.device).qmatmul(x, w)


def embedding(ids: torch.Tensor, w: QWeight) -> torch.Tensor:
    """[T, cols] float32: rows `ids` of `w`, dequantized."""
    return _on(w.data.device).embedding(ids, w)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x[T, C] * rsqrt(mean(x^2) + eps) * weight[C], float32 math, in x.dtype."""
    return _on(x.device).rms_norm(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """(rms_norm(x + residual), x + residual)."""
    return _on(x.device).add_rms_norm(x, residual, weight, eps)


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, neox: bool,
         theta_scale: float = 0.0, mscale: float = 1.0) -> torch.Tensor:
    """x[T, NH, D] rotated by positions[T] * inv_freq[R] (GGML "norm" or "neox" pairs); with
    theta_scale > 0 the angles as ggml chains them (`ref.rope`); cos and sin times `mscale` (ggml's
    YaRN magnitude factor, float32), as ggml_rope_ext rotates."""
    return _on(x.device).rope(x, positions, inv_freq, neox, theta_scale, mscale)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate[T, F]) * up[T, F]."""
    return _on(gate.device).silu_mul(gate, up)


def gelu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate[T, F]) * up[T, F] (GeGLU) with ggml's float16-table GELU."""
    return _on(gate.device).gelu_mul(gate, up)


def write_kv(k, v, k_cache, v_cache, slot_mapping, k_type=None, v_type=None) -> None:
    """k/v[T, KVH, D] stored in place at slot = block * BS + offset of k/v_cache[NB, BS, KVH, D]
    (negative slots skipped); k_type / v_type: a quantized cache's GGML type (uint8 [NB, BS, KVH,
    row_bytes], kernels/kv_quant_ref.py), None for a float cache."""
    return _on(k_cache.device).write_kv(k, v, k_cache, v_cache, slot_mapping, k_type, v_type)


def rope_write_kv(q, k, v, positions, inv_freq, neox: bool, theta_scale: float, mscale: float, k_cache, v_cache,
                  slot_mapping, k_type=None, v_type=None):
    """`rope` of q [T, H, D] and k [T, KVH, D], then `write_kv` of the rotated k and v; returns
    the rotated q (Triton: one launch for all three, kernels/triton/rope_write_kv.py)."""
    return _on(k_cache.device).rope_write_kv(q, k, v, positions, inv_freq, neox, theta_scale, mscale, k_cache,
                                             v_cache, slot_mapping, k_type, v_type)


def paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale: float, softcap: float = 0.0,
                    max_q_len: int | None = None, window: int = 0, k_type=None, v_type=None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q[T, H, D] over the paged k/v_cache[NB, BS, KVH, D] -> [T, H, D] (docs/DESIGN.md); window > 0:
    a query at position p sees only keys at positions > p - window (sliding-window layers);
    k_type / v_type: quantized caches' GGML types, as in `write_kv`; sinks [H] float32: per head one
    more softmax logit with a zero value (gpt-oss's attention sinks)."""
    return _on(q.device).paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale,
                                         softcap, max_q_len, window, k_type, v_type, sinks)


def kv_quantized(t) -> bool:
    """Whether ggml type t is one of the quantized KV cache types (-ctk / -ctv q8_0 q4_0 q4_1 q5_0
    q5_1 iq4_nl; kernels/kv_quant_ref.py): a cache of it is uint8 [NB, BS, KVH, kv_row_bytes(t, D)]."""
    from . import kv_quant_ref
    return kv_quant_ref.is_quantized(t)


def kv_row_bytes(t, head_dim: int) -> int:
    """Bytes of one (cell, KV head) row of a quantized KV cache of type t."""
    from . import kv_quant_ref
    return kv_quant_ref.row_bytes(t, head_dim)


def dequantize_kv(rows: torch.Tensor, t) -> torch.Tensor:
    """A quantized KV cache's rows [..., row_bytes] (uint8, any device) -> float32 [..., D] on the same
    device (ggml's dequantize_row_*; the CPU kernel where it is built)."""
    from . import kv_quant_ref
    if rows.device.type == "cpu":
        from .cpu import kv_quant
        return kv_quant.dequantize_rows(rows, t)
    return kv_quant_ref.dequantize_rows(rows.cpu(), t).to(rows.device)


def kv_rotation_sizes(type_k, type_v, head_dim: int) -> tuple[int, int]:
    """llama.cpp's Hadamard rotation sizes (K and query, V and output) for these cache types, 0: none."""
    from . import kv_quant_ref
    return kv_quant_ref.rotation_sizes(type_k, type_v, head_dim)


def hadamard(x: torch.Tensor, n: int) -> torch.Tensor:
    """Every n consecutive values of x times the normalized Hadamard matrix, in ggml-cpu's FWHT order
    (float32 out; torch ops on x's device)."""
    from . import kv_quant_ref
    return kv_quant_ref.fwht(x, n)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """(x[T, C] - mean) / sqrt(var + eps) * weight[C] + bias[C] (LayerNorm; weight/bias may be None), in x.dtype."""
    return _on(x.device).layer_norm(x, weight, bias, eps)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                    mask: torch.Tensor | None = None, softcap: float = 0.0) -> torch.Tensor:
    """Dense attention q[T, H, D] over k/v[S, KVH, D] -> [T, H, D]: keys hidden where mask[T, S] is
    False (none without a mask), optional tanh soft-cap, float32 softmax (`ref.dense_attention`)."""
    return _on(q.device).dense_attention(q, k, v, scale, mask, softcap)


def topk(row: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k largest entries of a row [V], values descending (torch.topk's
    contract; ties may be ordered differently)."""
    return _on(row.device).topk(row, k)


def prepare_topk_head(w: QWeight):
    """Once at load, for an output head `w` as `prepare_weight` returned it: the state
    `topk_logits` reads, or None where the backend has none (then compute full logits)."""
    return _on(w.data.device).prepare_topk_head(w)


def topk_logits(x: torch.Tensor, w: QWeight, head, topk: list[int], banned: list[tuple[int, ...]]) -> torch.Tensor:
    """Logits [n, rows] float32 of x [n, cols]: row i exact when topk[i] <= 0, else exact at least
    where it can be among its topk[i] largest (banned[i] excluded) and possibly -inf elsewhere."""
    return _on(x.device).topk_logits(x, w, head, topk, banned)


def moe_route(logits: torch.Tensor, k: int, norm: bool = True, scale: float = 0.0, softmax_after: bool = False):
    """Router logits [T, E] -> (weights [T, k] float32, expert ids [T, k] int64): softmax over the
    experts, the k largest, divided by their sum when `norm`, times `scale` unless 0 or 1;
    `softmax_after` (gpt-oss): the k largest logits, then the softmax over those k."""
    return _on(logits.device).moe_route(logits, k, norm, scale, softmax_after)


def router_matmul(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """Router logits [T, rows] float32 = x [T, cols] @ W^T of a mixture-of-experts router kept in
    its GGUF layout (not prepared): the CPU computes an F32 router in llama.cpp's F32 order (one
    row: ggml_vec_dot_f32, more: tinyBLAS; AVX2 builds), the others `qmatmul`."""
    return _on(x.device).router_matmul(x, w)


def prepare_experts(gate: QWeight, up: QWeight, down: QWeight, n_expert: int, unpack_quantized: bool = False,
                    pack_quantized: bool = True) -> Experts:
    """Once at load, a mixture-of-experts layer's stacked expert weights (`kernels.qweight.Experts`)
    in the layout the backend's `moe_ffn` reads (CPU: each expert prepared like any matmul weight;
    reference and Triton: the GGUF layout)."""
    return _on(gate.data.device).prepare_experts(gate, up, down, n_expert, unpack_quantized, pack_quantized)


def moe_ffn(x: torch.Tensor, experts: Experts, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """sum_j weights[t, j] * down_e(silu(gate_e x_t) * up_e x_t), e = ids[t, j]: x [T, C], weights /
    ids [T, k] -> [T, C] in x.dtype (each used expert's weights read once for all its tokens)."""
    return _on(x.device).moe_ffn(x, experts, weights, ids)


def fused_decoder(layers: list[DecoderLayer], shape: DecoderShape):
    """Once at load: a callable running a decode step's layers as one loop (`kernels.cpu.decoder`:
    `decoder(h, k_caches, v_caches, pos, slots, tables, kv_lens)` -> final residual stream, with
    `decoder.supports(k_caches, v_caches)`), bit-identical to the per-op path; None where the
    backend has none or the layers do not qualify (the reference and Triton: always None)."""
    return _on(layers[0].attn_norm.device).fused_decoder(layers, shape)


def ssm_conv(x: torch.Tensor, w: torch.Tensor, conv_state: torch.Tensor, cells: torch.Tensor,
             cu: torch.Tensor) -> torch.Tensor:
    """silu of the causal depthwise convolution (ggml_ssm_conv + ggml_silu) of each sequence's rows
    x[cu[s]:cu[s+1]] ([T, C] float32) with w [C, K]; the K - 1 rows before them are read from
    conv_state[cells[s]] ([NC, K - 1, C] float32), which then holds the sequence's last K - 1 inputs
    (in place). -> [T, C] float32 (`kernels.ref_linear`)."""
    return _on(x.device).ssm_conv(x, w, conv_state, cells, cu)


def gated_delta_net(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    state: torch.Tensor, cells: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """The gated delta rule token by token (ggml_gated_delta_net): q, k [T, Hk, S], v [T, Hv, S], g
    (log decay), beta [T, Hv]; sequence s's rows cu[s]:cu[s+1] start from state[cells[s]] ([NC, Hv,
    S, S] float32, [h, j, i] = S[i][j]) and leave their final state there (in place). Value head h
    reads key head h % Hk. -> o [T, Hv, S] float32, scaled by 1/sqrt(S) (`kernels.ref_linear`)."""
    return _on(v.device).gated_delta_net(q, k, v, g, beta, state, cells, cu)


def gdn_gates(b: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, A: torch.Tensor):
    """The gated delta net's gates from its projections b, a [T, H]: (beta = sigmoid(b), g =
    softplus(a + dt_bias) * A) [T, H] float32, as ggml's unary ops compute them."""
    return _on(b.device).gdn_gates(b, a, dt_bias, A)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + exp(-x)) elementwise (ggml_sigmoid), in x.dtype."""
    return _on(x.device).sigmoid(x)


def decode_image(data: bytes, max_pixels: int) -> tuple[int, int, bytes] | None:
    """(width, height, 8-bit RGB bytes) of an encoded image as llama.cpp's mtmd decodes it
    (stb_image; `kernels.cpu.image`), None when it is not an image; `kernels.cpu.image.ImageTooLarge`
    beyond `max_pixels`. Device-independent: no torch."""
    from .cpu.image import decode_image as decode

    return decode(data, max_pixels)


def tune(backend: Backend, weights: list[QWeight], dtype: torch.dtype, max_rows: int,
         head: QWeight | None = None, head_rows: int = 16, head_dtype: torch.dtype | None = None) -> int:
    """Once at start-up: choose the launch configs of every matmul shape a model can run, `weights`
    at 1..`max_rows` rows in `dtype` and the output `head` at 1..`head_rows` in `head_dtype`
    (default float32, what the model's head reads) (Triton on CUDA: each config checked against
    the first one's output, then timed once, the choice kept under $TRITIUM_CACHE so the next start
    skips it; nothing is tuned while serving). Returns the number of shapes timed now (0 for the
    other backends)."""
    if backend.name != "triton" or not weights or weights[0].data.device.type != "cuda":
        return 0
    from .triton.tuning import tune_qmatmul

    return tune_qmatmul(weights, dtype, max_rows, head, head_rows, head_dtype)

