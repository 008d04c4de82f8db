"""The launches `scripts/aot_compile.py` compiles ahead of time: the registry of every Triton kernel
of this package and the dispatch calls that reach it, with the shapes, dtypes and options the
supported architectures really use.

Each case calls the real dispatch function (`kernels.triton.<op>`) on CPU tensors of the real
shapes and dtypes; the compile script intercepts the kernel launches (no kernel runs), so the
argument types, constexprs, `num_warps`/`num_stages` and the autotune configs left after pruning
are those of a real launch, not a copy of them. A new kernel: add its launching op to `CASES` (or a
new case function); `KERNELS` is discovered from the modules, and the script fails when a kernel
is reached by no case.

`quick=True` keeps the variants that bound the resources (largest tiles, every kernel at least
once) for CI; `quick=False` is every variant a supported model can launch.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from gguf import GGMLQuantizationType

from .. import kv_quant_ref
from ..qweight import QWeight

Q_ALL = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "F32", "F16", "BF16")
Q_QUICK = ("Q6_K",)  # the most registers in every matmul config (measured)
ACTS = (torch.float32, torch.float16, torch.bfloat16)
ACT_QUICK = (torch.bfloat16,)
CACHES = (torch.float16, torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class Shape:
    """One model's layer sizes (the dims every kernel sees)."""
    name: str
    C: int  # n_embd
    F: int  # n_ff
    H: int  # query heads
    KVH: int  # KV heads
    D: int  # head dim
    V: int  # vocabulary
    softcap: float = 0.0  # attention logit soft-capping (gemma2-style); 0: off
    neox: bool = True


# the supported architectures at the sizes that change a kernel's variant (head dim, GQA group,
# row lengths' divisibility); llama 8B is the GPU check's model
SHAPES = (
    Shape("llama3-8b", 4096, 14336, 32, 8, 128, 128256, neox=False),
    Shape("qwen2.5-7b", 3584, 18944, 28, 4, 128, 152064),
    Shape("qwen2.5-0.5b", 896, 4864, 14, 2, 64, 151936),
    Shape("gemma-270m", 640, 2048, 4, 1, 256, 262144, softcap=50.0),
    Shape("qwen3-235b-attn", 4096, 1536, 64, 4, 128, 151936),  # 16 heads per KV head: tl.dot decode
)
SHAPES_QUICK = (SHAPES[0], SHAPES[3])


def _qtype(name: str):
    from gguf import GGMLQuantizationType, GGML_QUANT_SIZES  # noqa: F401

    return GGMLQuantizationType[name]


def empty_qweight(qtype_name: str, rows: int, cols: int) -> QWeight:
    """A weight of the given GGUF type and shape; its bytes are never read (nothing runs)."""
    from gguf import GGML_QUANT_SIZES

    qt = _qtype(qtype_name)
    if qtype_name in ("F32", "F16", "BF16"):
        dt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[qtype_name]
        return QWeight(torch.empty(rows, cols, dtype=dt), qt, rows, cols)
    bs, ts = GGML_QUANT_SIZES[qt]
    return QWeight(torch.empty(rows, cols // bs * ts, dtype=torch.uint8), qt, rows, cols)


def _block(qtype_name: str) -> int:
    from gguf import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[_qtype(qtype_name)][0]


Case = Callable[[], object]


@dataclass(frozen=True)
class Scope:
    """What the cases cover: `quick` (the resource-bounding subset), optionally narrowed to some
    model shapes and activation dtypes (the GPU check precompiles its own)."""
    quick: bool = False
    shapes: tuple[str, ...] = ()  # Shape.name; empty: all of the mode's
    acts: tuple[torch.dtype, ...] = ()

    def models(self, quick_default=SHAPES_QUICK) -> tuple[Shape, ...]:
        base = quick_default if self.quick else SHAPES
        if self.shapes:
            base = tuple(s for s in SHAPES if s.name in self.shapes)
        return base

    def act_dtypes(self) -> tuple[torch.dtype, ...]:
        return self.acts or (ACT_QUICK if self.quick else ACTS)


def prepared(w: QWeight) -> QWeight:
    """`w` as the Triton backend prepares it at load (repacked types: the "gpu" layout), its arrays
    on the meta device (shapes only: nothing is computed or read)."""
    from . import prepare_weight

    return prepare_weight(QWeight(w.data.to("meta"), w.qtype, w.rows, w.cols))


def qmatmul_cases(sc: Scope) -> Iterator[tuple[str, Case]]:
    """Every GGUF type x activation dtype x decode row count (GEMV BLOCK_M 1..16) and a prefill
    batch (tiled kernel), over each model's (N, K) pairs whose K the type's block divides; both
    for the weights as loaded (repacked where the type has a repack) and in GGUF blocks."""
    from . import prepare_weights, qmatmul

    quick = sc.quick
    for s in sc.models():
        pairs = {((s.H + 2 * s.KVH) * s.D, s.C), (s.C, s.H * s.D), (2 * s.F, s.C), (s.C, s.F)}
        if not quick:
            pairs.add((s.V, s.C))
        for qn in Q_QUICK if quick else Q_ALL:
            for N, K in sorted(pairs):
                if K % _block(qn):
                    continue
                w = empty_qweight(qn, N, K)
                wp = prepared(w)
                for act in sc.act_dtypes():
                    for M in ((1, 8, 16, 64) if quick else (1, 2, 3, 5, 8, 9, 16, 32, 64)):
                        if quick and (N, K) != (s.C, s.F):
                            continue
                        x = torch.empty(M, K, dtype=act)
                        if not quick or M != 8:
                            yield f"qmatmul {s.name} {qn} {N}x{K} M={M} {str(act)[6:]}", (
                                lambda x=x, w=w: qmatmul(x, w))
                        if wp.layout == "gpu" and (not quick or M != 16):
                            yield f"qmatmul {s.name} {qn} {N}x{K} M={M} {str(act)[6:]} repacked", (
                                lambda x=x, w=wp: qmatmul(x, w))
        # q/k of Q4_K and v of Q6_K (Q4_K_M's use_more_bits layers): the two-part GEMV, one launch
        g = prepare_weights([empty_qweight("Q4_K", s.H * s.D, s.C), empty_qweight("Q4_K", s.KVH * s.D, s.C),
                             empty_qweight("Q6_K", s.KVH * s.D, s.C)])[0]
        for act in sc.act_dtypes():
            for M in (1, 8):
                x = torch.empty(M, s.C, dtype=act)
                yield f"qmatmul {s.name} Q4_K+Q6_K qkv M={M} {str(act)[6:]} repacked", (lambda x=x, g=g: qmatmul(x, g))


def dequant_cases(sc: Scope) -> Iterator[tuple[str, Case]]:
    """Embedding lookups (float32 rows) and whole-matrix dequantization, per GGUF type."""
    from . import dequantize, embedding

    quick = sc.quick
    for s in sc.models():
        for qn in Q_QUICK if quick else Q_ALL:
            if s.C % _block(qn):
                continue
            w = empty_qweight(qn, 1024, s.C)
            ids = torch.zeros(7, dtype=torch.int64)
            yield f"embedding {s.name} {qn}", (lambda w=w, ids=ids: embedding(ids, w))
            wp = prepared(w)
            if wp.layout == "gpu":  # a tied output head is also the embedding table
                yield f"embedding {s.name} {qn} repacked", (lambda w=wp, ids=ids: embedding(ids, w))
            for dt in () if quick else (torch.float32, torch.float16, torch.bfloat16):
                yield f"dequantize {s.name} {qn} {dt}", (lambda w=w, dt=dt: dequantize(w, dt))


Q5_0, Q5_1, Q8_0, IQ4_NL = (GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q5_1, GGMLQuantizationType.Q8_0,
                             GGMLQuantizationType.IQ4_NL)
KV_TYPES = kv_quant_ref.KV_QUANT_TYPES


def _paged(s: Shape, S: int, ctx: int, q_len: int, act, cache, BS: int = 16):
    nb = (ctx + BS - 1) // BS
    kc = torch.empty(S * nb + 1, BS, s.KVH, s.D, dtype=cache)
    vc = torch.empty_like(kc)
    bt = torch.zeros(S, nb, dtype=torch.int32)
    cu = torch.arange(0, S + 1, dtype=torch.int32) * q_len
    lens = torch.full((S,), ctx, dtype=torch.int32)
    q = torch.empty(S * q_len, s.H, s.D, dtype=act)
    return q, kc, vc, bt, cu, lens


def attention_cases(sc: Scope) -> Iterator[tuple[str, Case]]:
    """Decode (every split count the split heuristic picks, merge kernel included) and prefill
    (short and long query runs), per head dim / GQA group, cache dtype and soft-capping."""
    from . import paged_attention

    quick = sc.quick
    for s in sc.models():
        caps = [s.softcap] if quick else sorted({0.0, s.softcap})
        for act in sc.act_dtypes():
            for cache in (torch.bfloat16,) if quick else CACHES:
                for cap in caps:
                    # (S, ctx): 1, 2, 4, ... 32 splits on 132 SMs
                    for S, ctx in ((1, 32768), (64, 4096)) if quick else (
                            (1, 32768), (1, 4096), (2, 4096), (4, 2048), (8, 4096), (16, 4096), (64, 4096), (1, 64)):
                        args = _paged(s, S, ctx, 1, act, cache)
                        yield f"decode {s.name} S={S} ctx={ctx} {act} {cache} cap={cap}", (
                            lambda a=args, cap=cap: paged_attention(*a, 0.125, cap, max_q_len=1))
                    for ql in (8, 512) if not quick or cap == s.softcap else ():
                        args = _paged(s, 1, 1024, ql, act, cache)
                        yield f"prefill {s.name} q={ql} {act} {cache} cap={cap}", (
                            lambda a=args, cap=cap, ql=ql: paged_attention(*a, 0.125, cap, max_q_len=ql))
    # quantized caches (-ctk / -ctv): dequantized in the tiles; quick: head dim 256 (the registers'
    # bound), the 5-bit pair (the most decoding work per element) and IQ4_NL's table
    for s in sc.models(SHAPES[3:4]):
        for kt, vt in ((Q5_1, Q5_0), (IQ4_NL, Q8_0)) if quick else ((t, t) for t in KV_TYPES):
            q, kc, vc, bt, cu, lens = _paged(s, 1, 4096, 1, sc.act_dtypes()[0], torch.float16)
            kq = torch.empty(*kc.shape[:3], kv_quant_ref.row_bytes(kt, s.D), dtype=torch.uint8)
            vq = torch.empty(*kc.shape[:3], kv_quant_ref.row_bytes(vt, s.D), dtype=torch.uint8)
            yield f"decode {s.name} k={kt.name} v={vt.name}", (
                lambda a=(q, kq, vq, bt, cu, lens), kt=kt, vt=vt: paged_attention(
                    *a, 0.125, 0.0, max_q_len=1, k_type=kt, v_type=vt))
            q8 = torch.empty(64, s.H, s.D, dtype=sc.act_dtypes()[0])
            yield f"prefill {s.name} k={kt.name} v={vt.name}", (
                lambda a=(q8, kq, vq, bt, torch.tensor([0, 64], dtype=torch.int32), torch.tensor([1024], dtype=torch.int32)),
                kt=kt, vt=vt: paged_attention(*a, 0.125, 0.0, max_q_len=64, k_type=kt, v_type=vt))
    # gpt-oss's attention sinks (64 query heads, 8 KV heads of 64): decode with and without split-K (the
    # merge adds the sink), prefill; full set only
    if not quick:
        s = Shape("gpt-oss-attn", 2880, 2880, 64, 8, 64, 201088)
        sinks = torch.empty(s.H, dtype=torch.float32)
        for act in sc.act_dtypes():
            for S, ctx in ((1, 32768), (64, 4096)):
                args = _paged(s, S, ctx, 1, act, torch.float16)
                yield f"decode {s.name} S={S} ctx={ctx} {act} sinks", (
                    lambda a=args: paged_attention(*a, 0.125, 0.0, max_q_len=1, sinks=sinks))
            args = _paged(s, 1, 1024, 512, act, torch.float16)
            yield f"prefill {s.name} q=512 {act} sinks", (
                lambda a=args: paged_attention(*a, 0.125, 0.0, max_q_len=512, sinks=sinks))


def small_cases(sc: Scope) -> Iterator[tuple[str, Case]]:
    """RMSNorm (with and without residual, rows of n_embd and of head_dim for q/k norms; 7 rows:
    with the q8_1 epilogue), RoPE (both modes, full and partial rotary), SiLU-mul (3 rows: with the
    q8_1 epilogue), the KV write and RoPE fused with it, per activation dtype."""
    from . import add_rms_norm, rms_norm, rope, rope_write_kv, silu_mul, write_kv

    quick = sc.quick
    for s in sc.models(SHAPES[:1]):
        for act in sc.act_dtypes():
            w = torch.empty(s.C, dtype=torch.float32)
            for T in (7,) if quick else (1, 7):
                x = torch.empty(T, s.C, dtype=act)
                yield f"rms_norm {s.name} {act}", (lambda x=x, w=w: rms_norm(x, w, 1e-6))
                yield f"add_rms_norm {s.name} {act}", (lambda x=x, w=w: add_rms_norm(x, x, w, 1e-6))
            hx = torch.empty(3 * s.H, s.D, dtype=act)
            if not quick:
                yield f"rms_norm head {s.name} {act}", (
                    lambda hx=hx, wd=torch.empty(s.D): rms_norm(hx, wd, 1e-6))
            q = torch.empty(3, s.H, s.D, dtype=act)
            pos = torch.zeros(3, dtype=torch.int64)
            for R in (s.D // 2,) if quick else (s.D // 2, s.D // 4):
                for neox in (s.neox,) if quick else (False, True):
                    yield f"rope {s.name} R={R} neox={neox} {act}", (
                        lambda q=q, pos=pos, R=R, neox=neox: rope(q, pos, torch.empty(R), neox))
            gu = torch.empty(3, 2 * s.F, dtype=act)
            yield f"silu_mul {s.name} {act}", (lambda gu=gu, F=s.F: silu_mul(gu[:, :F], gu[:, F:]))
            for cache in (torch.bfloat16,) if quick else CACHES:
                k = torch.empty(3, s.KVH, s.D, dtype=act)
                kc = torch.empty(4, 16, s.KVH, s.D, dtype=cache)
                slots = torch.zeros(3, dtype=torch.int64)
                yield f"write_kv {s.name} {act} {cache}", (
                    lambda k=k, kc=kc, slots=slots: write_kv(k, k, kc, kc.clone(), slots))
                for neox in (s.neox,) if quick else (False, True):  # RoPE of q and k fused with the KV write
                    yield f"rope_write_kv {s.name} neox={neox} {act} {cache}", (
                        lambda q=q, k=k, kc=kc, slots=slots, pos=pos, R=s.D // 2, neox=neox: rope_write_kv(
                            q, k, k, pos, torch.empty(R), neox, 0.0, 1.0, kc, kc.clone(), slots))
            for t in (IQ4_NL,) if quick else KV_TYPES:  # quantized KV writes (-ctk / -ctv)
                k = torch.empty(3, s.KVH, s.D, dtype=act)
                kq = torch.empty(4, 16, s.KVH, kv_quant_ref.row_bytes(t, s.D), dtype=torch.uint8)
                slots = torch.zeros(3, dtype=torch.int64)
                yield f"write_kv {s.name} {act} {t.name}", (
                    lambda k=k, kq=kq, slots=slots, t=t: write_kv(k, k, kq, kq.clone(), slots, k_type=t, v_type=t))


# mixture-of-experts FFN shapes: (name, n_embd, expert FFN length, experts, experts per token);
# the expert count changes no variant, so the cases hold 8 of Qwen3-30B-A3B's 128
MOE_SHAPES = (("qwen3-30b-a3b", 2048, 768, 8, 8),)


def moe_cases(sc: Scope) -> Iterator[tuple[str, Case]]:
    """The fused MoE grouped GEMM (gated gate/up launch and down launch) per type mix, activation
    dtype and pair count (BLOCK_M 16 for decode batches, 64 for prefill)."""
    from . import moe_ffn
    from ..qweight import Experts

    mixes = (("Q4_K", "Q6_K"),) if sc.quick else tuple((q, q) for q in Q_ALL) + (("Q4_K", "Q6_K"),)
    for name, C, F, E, k in MOE_SHAPES:
        for qa, qd in mixes:
            ex = Experts(E, F, C, empty_qweight(qa, E * F, C), empty_qweight(qa, E * F, C), empty_qweight(qd, E * C, F))
            for act in sc.act_dtypes():
                for T in ((1, 16) if sc.quick else (1, 3, 16, 64)):
                    x = torch.empty(T, C, dtype=act)
                    ids = torch.zeros(T, k, dtype=torch.int64)
                    w = torch.ones(T, k)
                    yield f"moe_ffn {name} {qa}/{qd} T={T} {str(act)[6:]}", (
                        lambda x=x, ex=ex, w=w, ids=ids: moe_ffn(x, ex, w, ids))


# gated linear attention (qwen35 / qwen35moe, runtime/model/arch/qwen35.py): (name, key heads, value heads,
# state size, convolution taps): Qwen3-Next / Qwen3.5's 16 key and 32 value heads of 128, 4 taps
LINEAR_SHAPES = (("qwen35", 16, 32, 128, 4),)


def linear_cases(sc: Scope) -> Iterator[tuple[str, Case]]:
    """The short convolution and the gated delta rule per batch shape (one decode row, a prompt,
    several sequences)."""
    from .linear_attn import gated_delta_net, ssm_conv

    for name, HK, HV, S, K in LINEAR_SHAPES:
        C = 2 * HK * S + HV * S
        for T, n in ((1, 1), (64, 2)) if sc.quick else ((1, 1), (8, 8), (64, 2), (512, 1)):
            cu = torch.tensor([T * i // n for i in range(n + 1)], dtype=torch.int32)
            cells = torch.arange(n, dtype=torch.int32)
            x, w, cst = torch.empty(T, C), torch.empty(C, K), torch.empty(n, K - 1, C)
            yield f"ssm_conv {name} T={T} n={n}", (lambda x=x, w=w, c=cst, cells=cells, cu=cu: ssm_conv(x, w, c, cells, cu))
            q, k, v = torch.empty(T, HK, S), torch.empty(T, HK, S), torch.empty(T, HV, S)
            g, b, st = torch.empty(T, HV), torch.empty(T, HV), torch.empty(n, HV, S, S)
            yield f"gated_delta_net {name} T={T} n={n}", (
                lambda q=q, k=k, v=v, g=g, b=b, st=st, cells=cells, cu=cu: gated_delta_net(q, k, v, g, b, st, cells, cu))


# vision encoders (runtime/vision): (name, width, heads, head dim, patches of a large image)
VISION_SHAPES = (("siglip-so400m", 1152, 16, 72, 4096), ("qwen2.5-vl-vit", 1280, 16, 80, 4096))


def vision_cases(sc: Scope) -> Iterator[tuple[str, Case]]:
    """The vision encoders' dense attention (float16 q/k/v as clip.cpp's flash attention, with and
    without Qwen2.5-VL's window mask; float32 for an image span of a prompt) and LayerNorm."""
    from . import dense_attention, layer_norm

    for name, C, H, D, n in VISION_SHAPES[:1] if sc.quick else VISION_SHAPES:
        for dt in (torch.float16,) if sc.quick else (torch.float16, torch.float32):
            q = torch.empty(n, H, D, dtype=dt)
            for masked in (False, True):
                mask = torch.ones(n, n, dtype=torch.bool) if masked else None
                yield f"dense_attention {name} {dt} mask={masked}", (
                    lambda q=q, mask=mask: dense_attention(q, q, q, 0.125, mask))
        x = torch.empty(n, C, dtype=torch.float32)
        w = torch.empty(C)
        yield f"layer_norm {name}", (lambda x=x, w=w: layer_norm(x, w, w, 1e-6))


def alternative_cases(sc: Scope) -> Iterator[tuple[str, Case]]:
    """Kernels compiled for comparison only (`scripts/gpu_model.py`): the dequantize-to-FMA GEMV
    beside the dp4a one, on the repacked weights."""
    from .qmatmul_q8 import qmatmul_fma

    for s in sc.models(SHAPES[:1]):
        for qn in Q_QUICK if sc.quick else ("Q4_K", "Q6_K", "Q8_0"):
            w = prepared(empty_qweight(qn, s.C, s.F))
            x = torch.empty(1, s.F, dtype=torch.bfloat16)
            yield f"fma gemv {s.name} {qn}", (lambda x=x, w=w: qmatmul_fma(x, w, torch.empty(1, w.rows, dtype=x.dtype)))


# op family -> its cases; extend here when a kernel is added
CASES: dict[str, Callable[[Scope], Iterator[tuple[str, Case]]]] = {
    "qmatmul": qmatmul_cases,
    "dequant": dequant_cases,
    "attention": attention_cases,
    "small": small_cases,
    "moe": moe_cases,
    "vision": vision_cases,
    "linear": linear_cases,
    "alternatives": alternative_cases,
}


def kernels() -> dict[str, object]:
    """Every launchable Triton kernel of this package: module-level `@triton.jit` (or autotuned)
    objects whose name ends in `_kernel`, as {"module.name": object}."""
    import triton

    from .. import triton as pkg

    found = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("aot"):
            continue
        mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
        for name, obj in vars(mod).items():
            if name.endswith("_kernel") and isinstance(obj, triton.runtime.KernelInterface):
                found[f"{info.name}.{name}"] = obj
    return found
