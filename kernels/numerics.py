"""`Numerics`: which float order the CPU kernels compute in, a value fixed in a kernel `Backend` when
it is built (`kernels.Backend.for_device(device, name, numerics=...)`), never read per call.

- `GGML` (the default): llama.cpp b1-0c1e570's CPU float32 arithmetic, bit for bit, where the kernels
  have it (the quantized matmuls of Q5_0 / Q8_0 / Q4_K / Q6_K, Q3_K / Q6_K from 8 rows, attention
  below and above 64 query rows: kernels/README.md, "Numerics");
- `OWN`: the kernels' own order (faster on the quantized matmuls; float32 attention).

The serving engine reads it once at start-up (`--numerics`, else `TRITIUM_FAST_NUMERICS`:
runtime/serving/bootstrap.resolve_config) into its config and builds its model's backend with it.
The Triton and torch backends compute one order whatever it says.
"""
from __future__ import annotations

import enum


class Numerics(str, enum.Enum):
    GGML = "ggml"
    OWN = "own"

    @property
    def qdot_exact(self) -> int:
        """The `exact` of qdot's C kernels (qdot.h QD_NUM_*): 1 llama.cpp's order, 0 its own."""
        return 1 if self is Numerics.GGML else 0
