"""The BPE pre-tokenizers of llama.cpp, as data: `tokenizer.ggml.pre` -> the regexes that split
the text before the merges (copied from llm_tokenizer_bpe's constructor in src/llama-vocab.cpp)
and the per-type flags llama_vocab::impl::load sets.

The regexes of one type are applied one after the other (each splits the pieces of the previous
one, matches isolated), then the GPT-2 byte encoding: `hf_pre_tokenizer(spec)` is that pipeline
as a `tokenizers` pre-tokenizer.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Sequence

from tokenizers import Regex, pre_tokenizers

__all__ = ["PreSpec", "PRE_TYPES", "hf_pre_tokenizer"]

_R_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_R_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_R_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_R_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_R_JAIS2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)"
            r"|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}")
# DeepSeek LLM: the cased-letter class of its tokenizer.json, written as code point escapes.
_DS_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
    "\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5"
    "\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a"
    "\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d"
    "\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3"
    "\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115"
    "\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149"
    "\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943"
)
_DS_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_RS_DEEPSEEK_LLM = [
    "[\r\n]",
    r"\s?[" + _DS_LETTERS + "]+",
    r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    _DS_CJK,
    r"\p{N}+",
]
_RS_DEEPSEEK_CODER = ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _DS_CJK, r"\p{N}"]
_RS_DEEPSEEK3 = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^" "\r\n" r"\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[" "\r\n" r"]*|\s*[" "\r\n" r"]+|\s+(?!\S)|\s+",
]
_RS_FALCON = [r"[\p{P}\$\+<=>\^~\|`]+", _R_GPT2, "[0-9][0-9][0-9]"]
_RS_STARCODER = [r"\p{N}", _R_GPT2]
_RS_PORO = [" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"]
_RS_VIKING = [" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+", r"\p{N}"]
_R_TEKKEN = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
             r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
             r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_R_GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
            r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_R_TINY_AYA = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
               + _CONTRACTIONS + "?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
               + _CONTRACTIONS + "?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_R_BAILINGMOE = (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+")
_R_SEED_CODER = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_R_EXAONE_MOE = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+")
_R_MINICPM5 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_RS_CHAMELEON = [
    r"<sentinel:[0-9]+>",
    r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    r"([\t\n]|    |  )",
    r"\p{N}",
    r"[\p{P}!-/:-@\[-`{-~]",
    _R_GPT2,
]
_RS_DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", _R_GPT2, r"\p{N}+", "[0-9][0-9][0-9]"]


@dataclass(frozen=True)
class PreSpec:
    regexes: tuple[str, ...]
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool | None = None  # default add_bos before the GGUF key overrides it
    no_bos: bool = False         # chatglm: special_bos_id = NULL


def _pre(regexes: Sequence[str], **kw: Any) -> PreSpec:
    return PreSpec(tuple(regexes), **kw)


def _pre_types() -> MappingProxyType:
    """tokenizer.ggml.pre -> PreSpec, as llama_vocab::impl::load maps the names."""
    table: list[tuple[tuple[str, ...], PreSpec]] = [
        (("default",), _pre(_RS_DEFAULT)),
        (("minicpm5",), _pre([r"\p{N}{1,3}", _R_MINICPM5], ignore_merges=True)),
        (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
          "jina-v5-nano"), _pre([_R_LLAMA3], ignore_merges=True, add_bos=True)),
        (("deepseek-llm",), _pre(_RS_DEEPSEEK_LLM, clean_spaces=False)),
        (("deepseek-coder",), _pre(_RS_DEEPSEEK_CODER, clean_spaces=False)),
        (("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"), _pre(_RS_DEEPSEEK3, clean_spaces=False)),
        (("falcon",), _pre(_RS_FALCON)),
        (("mpt", "olmo", "jais", "exaone4"), _pre([_R_GPT2])),
        (("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"), _pre(_RS_STARCODER)),
        (("command-r", "smollm"), _pre(_RS_STARCODER, clean_spaces=False)),
        (("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
          "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe"), _pre([_R_GPT2])),
        (("trillion", "granite-docling"), _pre([_R_GPT2], clean_spaces=False)),
        (("jais-2",), _pre([_R_JAIS2])),
        (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open", "grok-2"),
         _pre([_R_QWEN2], clean_spaces=False)),
        (("megrez", "stablelm2"), _pre([_R_QWEN2])),
        (("qwen35",), _pre([_R_QWEN35], clean_spaces=False)),
        (("dbrx", "smaug-bpe"), _pre([_R_LLAMA3])),
        (("poro-chat",), _pre(_RS_PORO, clean_spaces=False)),
        (("bloom", "gpt3-finnish"), _pre(_RS_PORO)),
        (("glm4", "chatglm-bpe"), _pre([_R_LLAMA3], no_bos=True)),
        (("viking",), _pre(_RS_VIKING, clean_spaces=False)),
        (("tekken",), _pre([_R_TEKKEN], clean_spaces=False, ignore_merges=True, add_bos=True)),
        (("chameleon",), _pre(_RS_CHAMELEON, clean_spaces=False, add_bos=True)),
        (("exaone-moe",), _pre([_R_EXAONE_MOE])),
        (("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _pre([_R_GPT4O], clean_spaces=False)),
        (("tiny_aya", "cohere2moe"), _pre([r"\d{1,3}(?=(?:\d{3})*\b)", _R_TINY_AYA], clean_spaces=False)),
        (("superbpe",), _pre([r"\p{N}+", r"(?=(\d{3})+(?!\d))"], clean_spaces=False)),
        (("bailingmoe", "bailingmoe2", "llada-moe"), _pre([_R_BAILINGMOE], clean_spaces=False)),
        (("seed-coder",), _pre([_R_SEED_CODER], clean_spaces=False)),
    ]
    return MappingProxyType({name: spec for names, spec in table for name in names})


PRE_TYPES = _pre_types()


def hf_pre_tokenizer(spec: PreSpec) -> pre_tokenizers.PreTokenizer:
    """The `tokenizers` pipeline of a pre-type: each regex as an isolated Split, then ByteLevel."""
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in spec.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
