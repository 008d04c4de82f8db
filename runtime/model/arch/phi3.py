"""phi3 as llama.cpp b1-0c1e570 computes it (src/models/phi3.cpp, llama_model_rope_type).

- RMSNorm before attention and FFN, no post-norms, no embedding scale, no biases in Phi-3 files
  (a fused `attn_qkv.bias` or separate q/k/v biases are read when a file has them);
- attention: `attn_qkv` [n_embd + 2 n_embd_gqa, n_embd] holds q, k and v stacked by rows (q the
  first n_embd rows, then k and v, n_embd_gqa each); files with separate `attn_q/k/v` are read
  too (llama.cpp's create_tensor_qkv accepts both). NEOX RoPE (LLM_ARCH_PHI3 is in the NEOX list),
  q scaled by 1/sqrt(head_dim) before the attention (the same scores as scaling q.k);
- FFN: `ffn_up` [2 n_ff, n_embd] holds gate and up (LLM_FFN_SWIGLU with no gate tensor:
  ggml_swiglu of the fused output is silu(first half) * second half), then `ffn_down`;
- `phi3.attention.sliding_window`: read and ignored, as llama.cpp b1-0c1e570 does ("Phi SWA is
  currently disabled": load_arch_hparams resets n_swa to 0 and swa_type to NONE), so every layer
  attends to the whole context;
- `rope_factors_long` / `rope_factors_short` (LongRoPE, the 128k Phi-3 files): llama.cpp picks one
  set per context (long when the per-sequence context exceeds the original training context) and
  scales cos/sin by `rope.scaling.attn_factor`; tritium does not implement that choice, so such
  files are refused at load with a clear error instead of being run with the wrong frequencies.

The fused tensors are split at load (`split_weights`) into the names every architecture uses
(`attn_q/k/v.weight`, `ffn_gate.weight` = the first half of `ffn_up`, `ffn_up.weight` = the
second): row views of the mapped file, no copy, whatever the GGUF type (blocks run along a row).
The forward is then the default llama-style one (`ArchSpec()`). A LoRA adapter for phi3 names the
fused tensors (`attn_qkv`), which the split model no longer has: it is refused at load
("does not exist in base model").
"""
from __future__ import annotations

from typing import Any

from kernels.qweight import QWeight

ARCHS = ("phi3",)

LONGROPE_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")


def configure(md: dict[str, Any], cfg) -> None:
    # llama.cpp b1-0c1e570 disables phi3's sliding window whatever the file says (see above)
    cfg.sliding_window = 0
    cfg.swa_layers = None


def _rows(w: QWeight, r0: int, r1: int) -> QWeight:
    """Rows r0..r1 of a file-layout matrix (a view: same storage, same type)."""
    return QWeight(w.data[r0:r1], w.qtype, r1 - r0, w.cols, mapped=w.mapped)


def split_weights(cfg, weights: dict[str, Any]) -> None:
    """Replace the fused `attn_qkv` and the gate+up `ffn_up` of every layer by the separate
    q / k / v / gate / up matrices (in place). Raises ValueError for LongRoPE files and for fused
    tensors whose shapes do not match the hyper-parameters."""
    longrope = sorted({n for n in weights if n.endswith(LONGROPE_TENSORS)})
    if longrope:
        raise ValueError(f"{cfg.arch}: LongRoPE frequency factors ({', '.join(longrope[:2])}) are not supported "
                         "by tritium (Phi-3 128k-context files); use a 4k-context Phi-3 file")
    q_dim, kv_dim = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        qkv = weights.pop(p + "attn_qkv.weight", None)
        if qkv is not None:
            if (qkv.rows, qkv.cols) != (q_dim + 2 * kv_dim, cfg.n_embd):
                raise ValueError(f"{p}attn_qkv.weight: shape {(qkv.rows, qkv.cols)}, expected "
                                 f"{(q_dim + 2 * kv_dim, cfg.n_embd)}")
            bounds = [(0, q_dim), (q_dim, q_dim + kv_dim), (q_dim + kv_dim, q_dim + 2 * kv_dim)]
            for n, (r0, r1) in zip("qkv", bounds):
                weights[p + f"attn_{n}.weight"] = _rows(qkv, r0, r1)
            bias = weights.pop(p + "attn_qkv.bias", None)
            if bias is not None:  # 1-D float32 [q_dim + 2 kv_dim]
                for n, (r0, r1) in zip("qkv", bounds):
                    weights[p + f"attn_{n}.bias"] = bias[r0:r1]
        elif p + "attn_q.weight" not in weights:
            raise ValueError(f"{cfg.arch}: layer {i} has neither attn_qkv.weight nor attn_q/k/v.weight")
        up = weights[p + "ffn_up.weight"]
        F = cfg.n_ff
        if (up.rows, up.cols) != (2 * F, cfg.n_embd):
            raise ValueError(f"{p}ffn_up.weight: shape {(up.rows, up.cols)}, expected {(2 * F, cfg.n_embd)} "
                             "(gate and up stacked)")
        weights[p + "ffn_gate.weight"] = _rows(up, 0, F)
        weights[p + "ffn_up.weight"] = _rows(up, F, 2 * F)
    cfg.has_qkv_bias = "blk.0.attn_q.bias" in weights
