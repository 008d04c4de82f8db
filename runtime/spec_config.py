"""Speculative decoding's settings (llama-server's `common_params_speculative`, from the --spec-*
flags): plain data the CLI builds without importing the engine; the drafters that read them are
runtime/serving/spec.py's."""
from __future__ import annotations

import enum
from dataclasses import dataclass


class SpecType(enum.Enum):
    NONE = "none"
    DRAFT_SIMPLE = "draft-simple"
    DRAFT_EAGLE3 = "draft-eagle3"
    DRAFT_MTP = "draft-mtp"
    DRAFT_DFLASH = "draft-dflash"
    DRAFT_DSPARK = "draft-dspark"
    NGRAM_SIMPLE = "ngram-simple"
    NGRAM_MAP_K = "ngram-map-k"
    NGRAM_MAP_K4V = "ngram-map-k4v"
    NGRAM_MOD = "ngram-mod"
    NGRAM_CACHE = "ngram-cache"


# the draft-free types, in llama.cpp's order of preference (draft-simple: runtime/serving/spec_draft.py;
# the others are ignored with a warning)
DRAFT_FREE = (SpecType.NGRAM_SIMPLE, SpecType.NGRAM_MAP_K, SpecType.NGRAM_MAP_K4V, SpecType.NGRAM_MOD,
              SpecType.NGRAM_CACHE)


@dataclass(frozen=True)
class NgramMapParams:
    """common_params_speculative_ngram_map: key n-gram, drafted m-gram, hits before a draft."""
    size_n: int = 12
    size_m: int = 48
    min_hits: int = 1


@dataclass(frozen=True)
class NgramModParams:
    n_match: int = 24
    n_max: int = 64
    n_min: int = 48


@dataclass(frozen=True)
class SpecConfig:
    """llama-server's `common_params_speculative` (the parts the draft-free types read)."""
    types: tuple[SpecType, ...] = ()
    draft_n_max: int = 3  # --spec-draft-n-max / -min: the draft-model types' sizes
    draft_n_min: int = 0
    ngram_simple: NgramMapParams = NgramMapParams()
    ngram_map_k: NgramMapParams = NgramMapParams()
    ngram_map_k4v: NgramMapParams = NgramMapParams()
    ngram_mod: NgramModParams = NgramModParams()
    # draft-simple (runtime/serving/spec_draft.py): -md, --spec-draft-p-min, -ctkd / -ctvd
    draft_model: str | None = None
    draft_p_min: float = 0.0
    draft_cache_type_k: str = "f16"
    draft_cache_type_v: str = "f16"
    lookup_cache_static: str = ""  # -lcs / -lcd: ngram-cache's files (common_params_speculative_ngram_cache)
    lookup_cache_dynamic: str = ""

    @property
    def enabled(self) -> bool:
        return any(t is not SpecType.NONE for t in self.types)

    def n_max(self) -> int:
        """common_speculative_n_max: the longest draft the configured types can make."""
        sizes = {SpecType.NGRAM_SIMPLE: self.ngram_simple.size_m, SpecType.NGRAM_MAP_K: self.ngram_map_k.size_m,
                 SpecType.NGRAM_MAP_K4V: self.ngram_map_k4v.size_m, SpecType.NGRAM_MOD: max(0, self.ngram_mod.n_max),
                 SpecType.NGRAM_CACHE: 8}
        return max((sizes.get(t, max(0, self.draft_n_max)) for t in self.types if t is not SpecType.NONE), default=0)


def parse_spec_types(value: str) -> tuple[SpecType, ...]:
    """--spec-type's comma-separated names (ValueError for an unknown one, llama.cpp's message)."""
    out = []
    for name in value.split(","):
        try:
            out.append(SpecType(name))
        except ValueError:
            raise ValueError(f"unknown speculative type: {name}") from None
    return tuple(out)
