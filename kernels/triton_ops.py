"""Triton implementations of the dispatch surface (work in progress: delegates to ref for now)."""
from .ref import (  # noqa: F401
    add_rms_norm, dequantize, embedding, paged_attention, qmatmul, rms_norm, rope, silu_mul, write_kv,
)
