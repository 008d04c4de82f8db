"""The cases of tests/test_kv_quant.py's bit-exact comparison with llama.cpp (recorded by
scripts/record_kv_quant_ggml.py): shapes, cache types and seeded inputs, shared by both."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# GGML type ids
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL = 0, 1, 2, 3, 6, 7, 8, 20
QUANT = {"q8_0": Q8_0, "q4_0": Q4_0, "q4_1": Q4_1, "q5_0": Q5_0, "q5_1": Q5_1, "iq4_nl": IQ4_NL}


@dataclass(frozen=True)
class Case:
    name: str
    k_type: int
    v_type: int
    D: int = 64
    H: int = 4
    KVH: int = 2
    n_kv: int = 37
    n_q: int = 3  # rows at positions n_kv - n_q .. n_kv - 1, causal
    softcap: float = 0.0
    window: int = 0
    seed: int = 0

    @property
    def scale(self) -> float:
        return float(np.float32(1.0 / np.sqrt(self.D)))


CASES = (
    *(Case(n, t, t, seed=i) for i, (n, t) in enumerate(QUANT.items())),
    Case("iq4_nl-d96", IQ4_NL, IQ4_NL, D=96, seed=10),
    Case("q5_1-d96", Q5_1, Q5_1, D=96, seed=11),
    Case("q8_0-70rows", Q8_0, Q8_0, n_kv=90, n_q=70, seed=12),
    Case("k-q8_0-v-f16", Q8_0, F16, seed=13),
    Case("k-f16-v-q4_0", F16, Q4_0, seed=14),
    Case("k-q4_1-v-iq4_nl", Q4_1, IQ4_NL, seed=15),
    Case("q8_0-softcap", Q8_0, Q8_0, softcap=2.0, seed=16),
    Case("q4_0-window", Q4_0, Q4_0, window=9, seed=17),
)


def inputs(c: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q [n_q, H, D], k / v [n_kv, KVH, D] float32 from the case's seed."""
    g = np.random.default_rng(1000 + c.seed)
    q = (g.standard_normal((c.n_q, c.H, c.D)) * 2.0).astype(np.float32)
    k = (g.standard_normal((c.n_kv, c.KVH, c.D)) * 1.5).astype(np.float32)
    v = g.standard_normal((c.n_kv, c.KVH, c.D)).astype(np.float32)
    k[:, :, 5] *= 6  # an outlier channel, as real keys have
    return q, k, v
