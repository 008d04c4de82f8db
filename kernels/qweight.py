"""The one definition of how a weight matrix is stored in memory.

A `QWeight` keeps a GGUF tensor in its on-disk block format (no dequantization at load):

- quantized types (Q4_0 ... Q6_K): `data` is uint8 `[rows, row_bytes]`, each row the
  concatenation of the GGUF blocks of that row (`row_bytes = cols // block_size * type_size`).
- F32 / F16 / BF16: `data` is a float tensor `[rows, cols]` of that dtype.

`rows` is the output dimension (GGUF ne[1]), `cols` the input dimension (GGUF ne[0]), so a
linear layer computes `y[T, rows] = x[T, cols] @ W^T`.

`layout` (the CPU backend's `prepare_weight` chooses it once at load; every other backend reads "rows"):
- "rows" (default): `data` is `[rows, cols]`, as in the file;
- "cols": `data` is `[cols, rows]` contiguous, what BLAS reads fastest for small batches;
- "tiles64" (float types): `data` is `[ceil(rows / 64), cols, 64]` (float32, float16 or bfloat16),
  rows zero-padded to a multiple of 64: each tile of 64 output rows is one contiguous stream, what
  the CPU batched-GEMV kernel reads.

Quantized types on the CPU path may instead be repacked by `kernels.cpu.qgemv.pack` (same values)
into "tiles64_c8" / "tiles64_c4": `data` holds integer codes in 64-row tiles, `scales` and
`offsets` the per-group factors A and B ([ceil(rows / 64), cols / group, 64] float32), `group` the
group size, with W[r, k] = A * code + B (see that module).

Or, where the integer-dot kernels exist (`kernels.cpu.qdot`), into "x8": `data` holds the GGUF
bits regrouped into panels of 8 rows (the same size), `kernel` the `qdot.QdotGroup` that reads them.
One "x8" weight may hold several matrices that read the same input (q/k/v, gate/up; their types
may differ, `qtype` is the first one's): `rows` is their sum and a matmul returns their outputs
side by side.

`repacked`: a "rows" weight's x8 panels already computed by `kernels.prepack_quantized` (the server
repacks while it imports), which the CPU backend's `prepare_weights` then takes as they are.

Or, on CUDA (`kernels.triton.prepare_weight`), into "gpu": the codes and the scale factors of
Q8_0 Q4_0 Q5_0 Q4_K Q5_K Q6_K in arrays of their own, aligned for 128-bit loads (`GpuPack`; layout
in kernels/triton/packed.py); `data` is the codes (`gpu.lo`). A "gpu" weight with `parts` holds
several such matrices that read the same input (q/k/v, gate/up, of different types): `rows` is
their sum and a matmul returns their outputs side by side (the input quantized once).

`mapped`: `data` views a file mapping that is never written (the GGUF loader's), so a backend that
repacks the weight may drop those pages from memory afterwards (no second copy of the model).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

FLOAT_TYPES = {
    GGMLQuantizationType.F32: torch.float32,
    GGMLQuantizationType.F16: torch.float16,
    GGMLQuantizationType.BF16: torch.bfloat16,
}


@dataclass
class GpuPack:
    """A quantized matrix in the "gpu" layout (kernels/triton/packed.py): codes and factors apart."""
    lo: torch.Tensor  # int32 [rows, K/8] nibble words (Q8_0: [rows, K/4] int8 words)
    hi: torch.Tensor | None  # int32 high-bit plane: Q5_0/Q5_K [rows, K/32], Q6_K [rows, K/16]
    d: torch.Tensor  # float16 super-scales (see packed.py)
    sc: torch.Tensor | None  # sub-block scales: uint8 [rows, K/32] (Q4_K, Q5_K), int8 [rows, K/16] (Q6_K)
    mn: torch.Tensor | None  # uint8 sub-block mins [rows, K/32] (Q4_K, Q5_K)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.lo, self.hi, self.d, self.sc, self.mn) if t is not None)


@dataclass
class QWeight:
    data: torch.Tensor  # uint8 [rows, row_bytes] (quantized) or float [rows, cols]
    qtype: GGMLQuantizationType
    rows: int  # output features
    cols: int  # input features
    layout: str = "rows"  # "rows" | "cols" | "tiles64" | "tiles64_c8" | "tiles64_c4" | "x8" | "gpu" (module docstring)
    scales: torch.Tensor | None = None  # tiles64_c*: A [tiles, cols / group, 64]
    offsets: torch.Tensor | None = None  # tiles64_c*: B
    group: int = 0  # tiles64_c*: weights per (A, B) pair along a row
    mapped: bool = False  # data views a never-written file mapping (module docstring)
    kernel: Any = None  # x8: the backend's handle on the repacked weight (kernels.cpu.qdot.QdotGroup)
    repacked: Any = None  # "rows": its x8 panels computed ahead (kernels.prepack_quantized), for prepare_weights
    gpu: GpuPack | None = None  # "gpu": the arrays (data is gpu.lo)
    parts: list["QWeight"] | None = None  # "gpu" group: member weights reading one input, outputs side by side

    @property
    def is_float(self) -> bool:
        return self.qtype in FLOAT_TYPES

    @property
    def block_size(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][0]

    @property
    def type_size(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][1]

    @property
    def nbytes(self) -> int:
        if self.parts is not None:
            return sum(p.nbytes for p in self.parts)
        if self.gpu is not None:
            return self.gpu.nbytes
        extra = [t for t in (self.scales, self.offsets) if t is not None]
        return sum(t.numel() * t.element_size() for t in [self.data, *extra])

    def to(self, device: torch.device | str) -> "QWeight":
        def mv(t):
            return None if t is None else t.to(device)
        if torch.device(device) == self.data.device:
            return self
        if self.kernel is not None or self.layout == "gpu":
            raise ValueError(f"a {self.layout!r} weight stays on the device it was prepared for")
        return QWeight(self.data.to(device), self.qtype, self.rows, self.cols, self.layout,
                       mv(self.scales), mv(self.offsets), self.group)

    @staticmethod
    def from_float(t: torch.Tensor) -> "QWeight":
        """Wrap a float matrix [rows, cols] (F32/F16/BF16)."""
        qtype = {v: k for k, v in FLOAT_TYPES.items()}[t.dtype]
        return QWeight(t.contiguous(), qtype, t.shape[0], t.shape[1])


@dataclass
class Experts:
    """The experts of one mixture-of-experts FFN layer, as `kernels.prepare_experts` returns them.

    `gate` / `up` [n_expert * n_ff, n_embd] and `down` [n_expert * n_embd, n_ff]: every expert's
    rows stacked (the GGUF 3-D tensors `ffn_*_exps`, expert e's rows at e * n_ff / e * n_embd), in
    the GGUF layout (reference, Triton). `split` (the CPU backend): per expert, its gate and up as
    `prepare_weights` returned them (read together) and its down as `prepare_weight` did; then
    the stacked fields are None. `bias` (gpt-oss): per expert the biases of its gate, up and down
    outputs ([n_expert, n_ff], [n_expert, n_ff], [n_expert, n_embd] float32, llama.cpp's add_id);
    `act`: the gated activation, "silu" (SwiGLU) or "swiglu_oai" (gpt-oss's clamped SwiGLU, alpha
    1.702, limit 7)."""
    n_expert: int
    n_ff: int  # rows of each expert's gate / up, cols of its down
    n_embd: int
    gate: QWeight | None
    up: QWeight | None
    down: QWeight | None
    split: list[tuple[list[QWeight], QWeight]] | None = None
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    act: str = "silu"

    @staticmethod
    def rows_of(w: QWeight, e: int, n: int) -> QWeight:
        """Expert e's `n` rows of a stacked GGUF-layout weight (a view)."""
        return QWeight(w.data[e * n:(e + 1) * n], w.qtype, n, w.cols, mapped=w.mapped)
