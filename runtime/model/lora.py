"""LoRA adapters in the GGUF layout llama.cpp's convert_lora_to_gguf.py writes, applied per row.

File: `general.type = adapter`, `general.architecture` = the base model's, `adapter.type = lora`,
`adapter.lora.alpha` (f32, 0 = none), optional `adapter.lora.task_name` / `prompt_prefix`; tensors
`<base tensor name>.lora_a` (GGML shape [cols, r], torch [r, cols]) and `.lora_b` (GGML [r, rows],
torch [rows, r]) in F32, F16, BF16 or a quantized type. As llama.cpp (src/llama-adapter.cpp,
`build_lora_mm`): y = W x + sum over adapters of scale * B (A x), with
scale = adapter_scale * alpha / r when alpha != 0, else adapter_scale.

Per-row: `RowLora` holds, for each adapter some row of a forward uses, the token rows that use it
and their scales, so sequences with different adapter sets share one batch and each row gets its
own: out[rows] += (x[rows] @ A^T * scale[rows]) @ B^T. Adapters on token_embd (a transposed
layout in llama.cpp) and on norms are not supported (a clear error at load).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter

import kernels
from kernels.qweight import QWeight
from runtime.model.gguf import read_gguf, tensor_data

__all__ = ["LoraWeight", "LoraAdapter", "load_lora", "RowLora", "write_lora"]


@dataclass
class LoraWeight:
    a: torch.Tensor  # [r, cols] float32
    b: torch.Tensor  # [rows, r] float32

    def scale(self, alpha: float, adapter_scale: float) -> float:
        rank = self.b.shape[1]
        return adapter_scale * alpha / rank if alpha else adapter_scale


@dataclass
class LoraAdapter:
    path: str
    alpha: float
    weights: dict[str, LoraWeight] = field(default_factory=dict)  # base tensor name -> (A, B)
    task_name: str = ""
    prompt_prefix: str = ""


def _matrix(gf, info, device) -> torch.Tensor:
    """A 2-D GGUF tensor as float32 torch [rows, cols] (GGML shape [cols, rows])."""
    arr = tensor_data(gf, info)
    t = torch.from_numpy(np.array(arr))
    if info.qtype == GGMLQuantizationType.BF16:
        t = t.view(torch.bfloat16)
    cols = info.shape[0]
    rows = info.n_elements // cols
    return kernels.dequantize(QWeight(t.reshape(rows, -1), info.qtype, rows, cols), torch.float32).to(device)


def load_lora(path: str | Path, arch: str, shapes: dict[str, tuple[int, int]],
              device: torch.device | str = "cpu") -> LoraAdapter:
    """Reads and checks an adapter against the base model (`shapes`: tensor name -> (rows, cols)).
    Raises ValueError with llama.cpp's messages."""
    path = str(path)
    try:
        gf = read_gguf(path, map_data=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"failed to load lora adapter from file '{path}': {e}") from e
    md = gf.metadata
    if md.get("general.type", "") != "adapter":
        raise ValueError(f"expect general.type to be 'adapter', but got: {md.get('general.type', '')}")
    if md.get("general.architecture") != arch:
        raise ValueError("model arch and LoRA arch mismatch")
    if md.get("adapter.type", "") != "lora":
        raise ValueError(f"expect adapter.type to be 'lora', but got: {md.get('adapter.type', '')}")
    ad = LoraAdapter(path, float(md.get("adapter.lora.alpha", 0.0) or 0.0),
                     task_name=str(md.get("adapter.lora.task_name", "")),
                     prompt_prefix=str(md.get("adapter.lora.prompt_prefix", "")))
    pairs: dict[str, dict[str, object]] = {}
    for info in gf.tensors:
        for suffix in (".lora_a", ".lora_b"):
            if info.name.endswith(suffix):
                pairs.setdefault(info.name[: -len(suffix)], {})[suffix[-1]] = info
                break
        else:
            if not info.name.endswith("_norm.weight"):  # llama.cpp skips norm vectors too
                raise ValueError(f"LoRA tensor '{info.name}' has unexpected suffix")
    for name, pair in pairs.items():
        if "a" not in pair or "b" not in pair:
            raise ValueError(f"LoRA tensor pair for '{name}' is missing one component")
        if name not in shapes:
            raise ValueError(f"LoRA tensor '{name}' does not exist in base model (hint: maybe wrong base model?)")
        if name.endswith("token_embd.weight"):
            raise ValueError(f"LoRA on '{name}' (the token embedding) is not supported by tritium")
        a, b = _matrix(gf, pair["a"], device), _matrix(gf, pair["b"], device)
        rows, cols = shapes[name]
        if a.shape[1] != cols or b.shape[0] != rows:
            raise ValueError(f"tensor '{name}' has incorrect shape (hint: maybe wrong base model?)")
        if a.shape[0] != b.shape[1]:
            raise ValueError('lora_a tensor is not transposed (hint: adapter from "finetune" example is no '
                             'longer supported)')
        ad.weights[name] = LoraWeight(a, b)
    return ad


class RowLora:
    """The adapters of one forward, per token row (see the module docstring)."""

    def __init__(self, adapters: list[LoraAdapter], used: list[tuple[int, torch.Tensor, torch.Tensor]]):
        self.adapters = adapters
        self.used = used  # (adapter index, row indices [n] int64, adapter scales [n] float32)

    @staticmethod
    def build(adapters: list[LoraAdapter], seq_scales: list[tuple[float, ...]], seq_rows: list[int],
              device: torch.device) -> "RowLora | None":
        """seq_scales[s]: sequence s's scale per adapter (() = none); seq_rows[s]: its token rows.
        None when no row uses any adapter."""
        used = []
        for ai in range(len(adapters)):
            rows, scales, start = [], [], 0
            for sc, n in zip(seq_scales, seq_rows):
                if ai < len(sc) and sc[ai] != 0.0:
                    rows.extend(range(start, start + n))
                    scales.extend([sc[ai]] * n)
                start += n
            if rows:
                used.append((ai, torch.tensor(rows, dtype=torch.int64, device=device),
                             torch.tensor(scales, dtype=torch.float32, device=device)))
        return RowLora(adapters, used) if used else None

    def select(self, rows: list[int]) -> "RowLora | None":
        """The same adapters for a subset of the rows (renumbered 0..len(rows)-1), e.g. the rows
        that compute logits."""
        where = {r: i for i, r in enumerate(rows)}
        used = []
        for ai, idx, sc in self.used:
            keep = [(where[r], s) for r, s in zip(idx.tolist(), sc.tolist()) if r in where]
            if keep:
                used.append((ai, torch.tensor([k for k, _ in keep], dtype=torch.int64, device=idx.device),
                             torch.tensor([s for _, s in keep], dtype=torch.float32, device=idx.device)))
        return RowLora(self.adapters, used) if used else None

    def has(self, name: str) -> bool:
        return any(name in self.adapters[ai].weights for ai, _, _ in self.used)

    def add(self, out: torch.Tensor, x: torch.Tensor, names: list[str], widths: list[int] | None = None) -> None:
        """out[:, cols of names[i]] += the adapters' deltas of weight names[i] for x (in place);
        `widths`: the output columns of each weight when out holds several side by side."""
        widths = widths or [out.shape[1]]
        for ai, idx, sc in self.used:
            ad = self.adapters[ai]
            xs = None
            c0 = 0
            for name, width in zip(names, widths):
                w = ad.weights.get(name)
                if w is not None:
                    if xs is None:
                        xs = x.index_select(0, idx).float()
                    d = (xs @ w.a.T) * (sc * w.scale(ad.alpha, 1.0))[:, None]
                    out[:, c0:c0 + width].index_add_(0, idx, (d @ w.b.T).to(out.dtype))
                c0 += width


def write_lora(path: str | Path, arch: str, weights: dict[str, tuple[np.ndarray, np.ndarray]], alpha: float,
               qtype: GGMLQuantizationType = GGMLQuantizationType.F32) -> None:
    """Writes an adapter as convert_lora_to_gguf.py does: weights[name] = (A [r, cols], B [rows, r])
    float arrays (F32 or F16 tensors)."""
    w = GGUFWriter(str(path), arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(alpha))
    dtype = np.float16 if qtype == GGMLQuantizationType.F16 else np.float32
    for name, (a, b) in weights.items():
        w.add_tensor(name + ".lora_a", np.ascontiguousarray(a, dtype=dtype))
        w.add_tensor(name + ".lora_b", np.ascontiguousarray(b, dtype=dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
