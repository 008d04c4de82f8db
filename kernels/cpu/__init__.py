"""The CPU backend: the ops of the dispatch surface (docs/DESIGN.md) for CPU tensors, taking the
fastest path this machine has and falling back to the torch reference (`kernels.ref`).

| file | concern |
| --- | --- |
| `matmul.py` | weight layouts chosen at load (`prepare_weight`, `prepare_weights`); `qmatmul`, `dequantize`, `embedding` over each (C GEMV tiles, BLAS) |
| `attention.py` | `paged_attention`: C decode kernel reading the paged cache in place, batched torch decode, else the reference |
| `moe.py` | mixture-of-experts FFN: experts prepared one by one at load, tokens grouped by expert, one matmul per used expert |
| `topk.py` | `topk` over one long row (numpy); `topk_logits` through an int8 copy of the output head |
| `gemv.py` + `gemv.c` | batched GEMV on 64-row float tiles (float32/float16/bfloat16) and int8 tiles with row scales |
| `qdot.py` + `qdot*.c` | integer-dot quantized matmul: GGUF blocks regrouped into 8-row panels (same size), activations quantized to 8 bits per block, one ISA build each (scalar, AVX2, AVX-VNNI, AVX-512 VNNI) |
| `qgemv.py` + `qgemv.c` | the fallback for quantized types qdot lacks: repacked exactly into affine-integer tiles, float32 GEMV |
| `attention.c` | the paged decode attention kernel |
| `decoder.py` | `fused_decoder`: a decode step's layers as one loop of direct C calls (the per-op wrappers' torch calls cost more than the work once the weight stream has evicted them) |
| `common.h` | the vector type and loads the C files share |
| `pointwise.py` + `pointwise.c` | `rms_norm`, `add_rms_norm`, `rope`, `write_kv`, `silu_mul`, `gelu_mul` on float32 rows (and the fused decoder's q/k/v step), else the reference |
| `linear_attn.py` + `linear_attn.c` | the gated linear-attention ops (short convolution, gated delta rule, its gates, sigmoid) in llama.cpp's CPU float order |
| `pool.c` | the C kernels' thread pool (never waits for a thread that has not started) |
| `prepack.py` + `qdot_lib.py` | the qdot repack of a GGUF file's matrices before torch is imported (the server's start-up), through the library alone |
| `native.py` | compiling the C files on first use into `$TRITIUM_CACHE` and loading them (ctypes; qdot's ISA variants are `Library`s too) |

RMSNorm, RoPE, the KV write, SwiGLU (where llama.cpp's AVX-512 exp applies) and GeGLU (ggml's
float16 GELU table) are one C call each (`pointwise.py` + `pointwise.c`: the torch ops' overhead
outweighed their arithmetic at decode).
Nothing here imports triton.
"""
import importlib

# the ops whose arithmetic depends on the numerics (kernels.Numerics): they take it as a keyword,
# which kernels.Backend binds to its own
NUMERICS_OPS = ("prepare_weight", "prepare_weights", "prepare_experts", "paged_attention", "fused_decoder")
# op -> the module defining it; imported when first asked for (PEP 562), so that `prepack.py`,
# `qdot_lib.py` and `native.py` load without torch
_OPS = {
    **dict.fromkeys(("dense_attention", "layer_norm"), "..ref"),
    **dict.fromkeys(("ssm_conv", "gated_delta_net", "gdn_gates", "sigmoid"), ".linear_attn"),
    **dict.fromkeys(("add_rms_norm", "gelu_mul", "rms_norm", "rope", "rope_write_kv", "silu_mul", "write_kv"),
                    ".pointwise"),
    "paged_attention": ".attention",
    "router_matmul": ".mxfp4",
    "fused_decoder": ".decoder",
    **dict.fromkeys(("dequantize", "embedding", "packs_quantized", "prepare_weight", "prepare_weights", "qmatmul"),
                    ".matmul"),
    **dict.fromkeys(("moe_ffn", "moe_route", "prepare_experts"), ".moe"),
    **dict.fromkeys(("prepare_topk_head", "topk", "topk_logits"), ".topk"),
}


def __getattr__(name: str):
    if name not in _OPS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_OPS[name], __name__), name)
    globals()[name] = value
    return value
