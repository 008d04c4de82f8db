"""The CPU backend: the ops of the dispatch surface (docs/DESIGN.md) for CPU tensors, taking the
fastest path this machine has and falling back to the torch reference (`kernels.ref`).

| file | concern |
| --- | --- |
| `matmul.py` | weight layouts chosen at load (`prepare_weight`); `qmatmul`, `dequantize`, `embedding` over each (C GEMV tiles, BLAS) |
| `attention.py` | `paged_attention`: C decode kernel reading the paged cache in place, batched torch decode, else the reference |
| `topk.py` | `topk` over one long row (numpy); `topk_logits` through an int8 copy of the output head |
| `gemv.py` + `gemv.c` | batched GEMV on 64-row float tiles (float32/float16/bfloat16) and int8 tiles with row scales |
| `qgemv.py` + `qgemv.c` | every GGUF quantized type repacked exactly into affine-integer tiles, and their GEMV |
| `attention.c` | the paged decode attention kernel |
| `common.h` | the vector type and loads the C files share |
| `native.py` | compiling the C files on first use into `$TRITIUM_CACHE` and loading them (ctypes) |

RMSNorm, RoPE, SiLU and the KV write are the reference's: torch is the fastest choice for them here.
Nothing here imports triton.
"""
from ..ref import add_rms_norm, gelu_mul, rms_norm, rope, silu_mul, write_kv  # noqa: F401
from .attention import paged_attention  # noqa: F401
from .matmul import dequantize, embedding, packs_quantized, prepare_weight, qmatmul  # noqa: F401
from .topk import prepare_topk_head, topk, topk_logits  # noqa: F401
