"""The recurrent state of a hybrid model's linear-attention layers (qwen35 / qwen35moe), tensors only.

A `RecurrentStore` holds, per recurrent layer and per cell, the two states llama.cpp's
llama_memory_recurrent keeps per sequence (float32, as it keeps them):
- `conv[l]` [NC, K - 1, C]: the last K - 1 inputs of the short convolution (C = 2 key_dim +
  value_dim channels);
- `ssm[l]` [NC, H, S, S]: the gated delta rule's state per value head, [h, j, i] = S[i][j] (ggml's
  layout).
A cell is one sequence's state after some number of its tokens. The serving room owns which cell
belongs to which slot or checkpoint (runtime/serving/); the model reads and writes the cells a
forward batch names (`SeqBatch.rs`), starting from zeros when the batch starts at position 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RecurrentShape:
    n_layers: int  # recurrent layers (in layer order)
    conv_rows: int  # K - 1
    conv_channels: int  # C
    n_heads: int  # value heads H
    head_dim: int  # S

    def cell_bytes(self) -> int:
        """Bytes of one cell's state over every recurrent layer (float32)."""
        return 4 * self.n_layers * (self.conv_rows * self.conv_channels + self.n_heads * self.head_dim ** 2)


class RecurrentStore:
    def __init__(self, shape: RecurrentShape, n_cells: int, device: str | torch.device = "cpu"):
        self.shape, self.n_cells = shape, n_cells
        self.device = torch.device(device)
        L = shape.n_layers
        self.conv = torch.zeros(L, n_cells, shape.conv_rows, shape.conv_channels, dtype=torch.float32, device=self.device)
        self.ssm = torch.zeros(L, n_cells, shape.n_heads, shape.head_dim, shape.head_dim, dtype=torch.float32,
                               device=self.device)

    def clear(self, cell: int) -> None:
        self.conv[:, cell].zero_()
        self.ssm[:, cell].zero_()

    def copy(self, src: int, dst: int) -> None:
        """Cell dst becomes a copy of cell src (a checkpoint taken or restored)."""
        if src != dst:
            self.conv[:, dst] = self.conv[:, src]
            self.ssm[:, dst] = self.ssm[:, src]

    def export(self, cell: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv [L, K - 1, C], ssm [L, H, S, S]) of one cell, on the CPU (a copy)."""
        return self.conv[:, cell].to("cpu", copy=True), self.ssm[:, cell].to("cpu", copy=True)

    def load(self, cell: int, conv: torch.Tensor, ssm: torch.Tensor) -> None:
        """Cell `cell` takes an exported state (shapes checked)."""
        if tuple(conv.shape) != tuple(self.conv[:, cell].shape) or tuple(ssm.shape) != tuple(self.ssm[:, cell].shape):
            raise ValueError(f"recurrent state of shape {tuple(conv.shape)} / {tuple(ssm.shape)} does not fit "
                             f"{tuple(self.conv[:, cell].shape)} / {tuple(self.ssm[:, cell].shape)}")
        self.conv[:, cell] = conv.to(self.device)
        self.ssm[:, cell] = ssm.to(self.device)

    @property
    def nbytes(self) -> int:
        return self.conv.numel() * 4 + self.ssm.numel() * 4
