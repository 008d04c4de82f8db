"""Tokenizer with llama.cpp's semantics, built on the Rust `tokenizers` library.

`load_tokenizer(path)` accepts a GGUF file (a full model or a vocab-only file) or a Hugging Face
folder (`tokenizer.json`, `tokenizer_config.json`).

What follows llama.cpp (`src/llama-vocab.cpp`):
- vocab types: `tokenizer.ggml.model` "llama" -> SPM (1), "gpt2" -> BPE (2).
- BPE pre-tokenization: the regex list chosen by `tokenizer.ggml.pre`, applied one after the
  other (each splits the pieces of the previous one, matches isolated), then GPT-2 byte encoding.
  Implemented as a `tokenizers` pre-tokenizer Sequence of `Split(..., "isolated")` + `ByteLevel`.
- SPM: spaces -> U+2581, a space prefix for every text fragment that is first or follows a special
  token, merges by score (as a `tokenizers` BPE whose merge ranks are the result-token scores), byte
  fallback to `<0xXX>` tokens.
- special tokens: control / unknown tokens are matched in the text only with `parse_special`,
  user-defined ones always; longest token text first (`tokenizer_st_partition`), with the
  lstrip/rstrip attributes llama.cpp sets (phi-3).
- token attributes, EOG ids (`special_eog_ids`), add_bos / add_eos defaults and overrides.
- `piece(id)` is `token_to_piece(id, special=True)`; `decode(ids)` concatenates pieces and, like
  `llama_detokenize`, drops the leading space of the first piece for SPM vocabs.

GGUF metadata is read by a small header parser (`read_gguf_metadata`): `gguf.GGUFReader` needs
~7 s for a 150k-token vocab because it builds a numpy array per string, we need well under 2 s.
"""
from __future__ import annotations

import json
import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import tokenizers
from tokenizers import Regex, models, pre_tokenizers

__all__ = [
    "Tokenizer",
    "IncrementalDecoder",
    "load_tokenizer",
    "tokenizer_from_gguf_metadata",
    "read_gguf_metadata",
    "VOCAB_TYPE_NONE",
    "VOCAB_TYPE_SPM",
    "VOCAB_TYPE_BPE",
    "VOCAB_TYPE_WPM",
    "VOCAB_TYPE_UGM",
]

# llama_vocab_type
VOCAB_TYPE_NONE = 0
VOCAB_TYPE_SPM = 1
VOCAB_TYPE_BPE = 2
VOCAB_TYPE_WPM = 3
VOCAB_TYPE_UGM = 4

# llama_token_type (the values stored in tokenizer.ggml.token_type)
TOKEN_TYPE_UNDEFINED = 0
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

# llama_token_attr bits
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_NORMALIZED = 1 << 6
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8
ATTR_SINGLE_WORD = 1 << 9

_TYPE_TO_ATTR = {
    TOKEN_TYPE_UNKNOWN: ATTR_UNKNOWN,
    TOKEN_TYPE_UNUSED: ATTR_UNUSED,
    TOKEN_TYPE_NORMAL: ATTR_NORMAL,
    TOKEN_TYPE_CONTROL: ATTR_CONTROL,
    TOKEN_TYPE_USER_DEFINED: ATTR_USER_DEFINED,
    TOKEN_TYPE_BYTE: ATTR_BYTE,
    TOKEN_TYPE_UNDEFINED: ATTR_UNDEFINED,
}

_SPACE_ESC = "\u2581"  # SentencePiece's escaped space

# ---------------------------------------------------------------------------------------------
# Pre-tokenizer regexes, copied from llm_tokenizer_bpe's constructor in llama.cpp.
# ---------------------------------------------------------------------------------------------

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
class _PreSpec:
    regexes: tuple[str, ...]
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool | None = None  # default add_bos before the GGUF key overrides it
    no_bos: bool = False         # chatglm: special_bos_id = NULL


def _pre(regexes: Sequence[str], **kw: Any) -> _PreSpec:
    return _PreSpec(tuple(regexes), **kw)


# tokenizer.ggml.pre -> (regexes, flags), as llama_vocab::impl::load maps them.
_PRE_TYPES: dict[str, _PreSpec] = {}
for _names, _spec in [
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
]:
    for _n in _names:
        _PRE_TYPES[_n] = _spec

# Texts llama.cpp treats as end of generation (llama_vocab::impl::load, special_eog_ids).
_EOG_TEXTS = frozenset([
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
])
# Texts llama.cpp auto-detects as the EOT token when tokenizer.ggml.eot_token_id is absent.
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>",
              "<end_of_utterance>")
_FIM_EOG_TEXTS = {  # fim pad / repo / sep tokens are EOG too
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
    "<|file_sep|>",
}
_CONTROL_LOOKING = _EOG_TEXTS | {"<|eom_id|>"}
# Fill-in-the-middle tokens: GGUF key suffix -> texts llama.cpp auto-detects when the key is absent.
_FIM_TEXTS = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "\u2581<PRE>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "\u2581<SUF>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "\u2581<MID>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>", "<file_sep>", "<fim-sep>", "<fim_sep>"),
}


# ---------------------------------------------------------------------------------------------
# GPT-2 byte <-> unicode mapping
# ---------------------------------------------------------------------------------------------

def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) \
        + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_BYTE_TO_UNICODE = _bytes_to_unicode()
# str.translate table: byte-level char -> the latin-1 char of its byte
_UNICODE_TO_LATIN1 = {ord(c): chr(b) for b, c in _BYTE_TO_UNICODE.items()}


def _byte_level_decode(text: str) -> bytes:
    """llama_decode_text: byte-level unicode chars back to bytes."""
    mapped = text.translate(_UNICODE_TO_LATIN1)
    try:
        return mapped.encode("latin-1")
    except UnicodeEncodeError:
        out = bytearray()
        for ch in text:
            b = _UNICODE_TO_LATIN1.get(ord(ch))
            if b is not None:
                out.append(ord(b))
            else:  # llama.cpp renders chars outside the byte alphabet this way
                out += b"[UNK_BYTE_0x" + ch.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
        return bytes(out)


# ---------------------------------------------------------------------------------------------
# GGUF metadata
# ---------------------------------------------------------------------------------------------

_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
            6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}


def read_gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """Key/value metadata of a GGUF file (v2/v3), without the tensors.

    Strings come back as `str`, string arrays as `list[bytes]` (raw, may be invalid UTF-8),
    numeric arrays as numpy arrays, scalars as Python numbers/bools.
    """
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        if mm[:4] != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version, = struct.unpack_from("<I", mm, 4)
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        _n_tensors, n_kv = struct.unpack_from("<QQ", mm, 8)
        off = 24
        unpack_q = struct.Struct("<Q").unpack_from
        unpack_i = struct.Struct("<I").unpack_from

        def read_str() -> bytes:
            nonlocal off
            n, = unpack_q(mm, off)
            s = mm[off + 8: off + 8 + n]
            off += 8 + n
            return s

        out: dict[str, Any] = {}
        for _ in range(n_kv):
            key = read_str().decode("utf-8", errors="replace")
            vtype, = unpack_i(mm, off)
            off += 4
            if vtype == 8:
                out[key] = read_str().decode("utf-8", errors="replace")
            elif vtype == 9:
                etype, = unpack_i(mm, off)
                n, = unpack_q(mm, off + 4)
                off += 12
                if etype == 8:
                    items = []
                    append = items.append
                    for _j in range(n):
                        ln, = unpack_q(mm, off)
                        append(mm[off + 8: off + 8 + ln])
                        off += 8 + ln
                    out[key] = items
                elif etype in _GGUF_NP:
                    dt = np.dtype(_GGUF_NP[etype])
                    out[key] = np.frombuffer(mm, dtype=dt, count=n, offset=off).copy()
                    off += dt.itemsize * n
                else:
                    raise ValueError(f"{path}: unsupported GGUF array type {etype} for {key}")
            elif vtype in _GGUF_SCALARS:
                fmt = _GGUF_SCALARS[vtype]
                out[key], = struct.unpack_from(fmt, mm, off)
                off += struct.calcsize(fmt)
            else:
                raise ValueError(f"{path}: unsupported GGUF value type {vtype} for {key}")
        return out
    finally:
        mm.close()


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Special:
    id: int
    text: str
    lstrip: bool
    rstrip: bool
    parse_only: bool  # control/unknown: only split out with parse_special


class Tokenizer:
    """llama.cpp-compatible tokenizer. Construct with `load_tokenizer`."""

    def __init__(self, *, texts: list[bytes], attrs: list[int], scores: np.ndarray | None,
                 vocab_type: int, hf: tokenizers.Tokenizer, pieces: list[bytes],
                 bos_id: int, eos_id: int, eot_id: int, unk_id: int, pad_id: int,
                 eog_ids: set[int], add_bos: bool, add_eos: bool, add_space_prefix: bool,
                 clean_spaces: bool, chat_template: str | None, pre: str | None,
                 model: str, spm_escape: bool | None = None) -> None:
        self._texts = texts              # [n_vocab] raw token texts as stored (GGUF form)
        self._attrs = attrs              # [n_vocab] llama_token_attr bits
        self._scores = scores
        self._hf = hf                    # fragment encoder: no added tokens, no post-processor
        self._pieces = pieces            # [n_vocab] token_to_piece(id, special=True)
        self.vocab_type = vocab_type
        self.n_vocab = len(texts)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eot_id = eot_id
        self.unk_id = unk_id
        self.pad_id = pad_id
        self.eot_ids = frozenset(eog_ids)
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.add_space_prefix = add_space_prefix
        # SPM pre-processing (space prefix, " " -> U+2581) done here rather than by `hf`
        self._spm_escape = vocab_type == VOCAB_TYPE_SPM if spm_escape is None else spm_escape
        self.clean_spaces = clean_spaces
        self.chat_template = chat_template
        self.pre = pre
        self.model = model
        self._token_to_id: dict[bytes, int] | None = None
        self.warnings: list[str] = []    # llama.cpp's load-time vocab warnings, for the log
        self.fim_ids: dict[str, int] = {k: -1 for k in _FIM_TEXTS}  # fill-in-the-middle tokens
        self._types = [_attr_to_type(a) for a in attrs]
        self._control_ids = frozenset(i for i, a in enumerate(attrs) if a & ATTR_CONTROL)

        specials = []
        for tid, a in enumerate(attrs):
            if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN):
                txt = texts[tid].decode("utf-8", errors="replace") or f"[EMPTY_{tid}]"
                specials.append(_Special(tid, txt, bool(a & ATTR_LSTRIP), bool(a & ATTR_RSTRIP),
                                         bool(a & (ATTR_CONTROL | ATTR_UNKNOWN))))
        specials.sort(key=lambda s: -len(texts[s.id]))  # stable: longest text first
        self._specials_all = tuple(specials)
        self._specials_user = tuple(s for s in specials if not s.parse_only)
        self._special_firsts = frozenset(s.text[0] for s in specials)

    # -- token properties ---------------------------------------------------------------------

    def token_type(self, tid: int) -> int:
        """llama_token_type of `tid` (after llama.cpp's control-token overrides)."""
        return self._types[tid]

    def control_ids(self) -> frozenset[int]:
        """Ids of control tokens (rendered as b"" by piece(id, special=False))."""
        return self._control_ids

    def token_attr(self, tid: int) -> int:
        return self._attrs[tid]

    def is_eog(self, tid: int) -> bool:
        return tid in self.eot_ids

    def is_control(self, tid: int) -> bool:
        return bool(self._attrs[tid] & ATTR_CONTROL)

    def token_text(self, tid: int) -> bytes:
        """The token's text as stored in the vocab (byte-level / U+2581 form)."""
        return self._texts[tid]

    def token_score(self, tid: int) -> float:
        return 0.0 if self._scores is None else float(self._scores[tid])

    def token_id(self, text: str | bytes) -> int | None:
        """Id of a token by its stored text (llama_vocab::text_to_token), or None."""
        if self._token_to_id is None:
            self._token_to_id = {t: i for i, t in enumerate(self._texts)}
        if isinstance(text, str):
            text = text.encode("utf-8")
        return self._token_to_id.get(text)

    # -- encode -------------------------------------------------------------------------------

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """tokenizer_st_partition: split out special token texts, longest first."""
        frags: list[str | int] = [text]
        specials = self._specials_all if parse_special else self._specials_user
        if not specials:
            return frags
        firsts = {c for c in self._special_firsts if c in text}
        if not firsts:
            return frags
        for sp in specials:
            if sp.text[0] not in firsts or sp.text not in text:
                continue
            new: list[str | int] = []
            tt = sp.text
            for frag in frags:
                if isinstance(frag, int) or tt not in frag:
                    new.append(frag)
                    continue
                start = 0
                n = len(frag)
                while True:
                    m = frag.find(tt, start)
                    if m < 0:
                        if start < n:
                            new.append(frag[start:])
                        break
                    left = frag[start:m]
                    if sp.lstrip:
                        left = left.rstrip(" \t\n\v\f\r")
                    if left:
                        new.append(left)
                    new.append(sp.id)
                    start = m + len(tt)
                    if sp.rstrip:
                        while start < n and frag[start] in " \t\n\v\f\r":
                            start += 1
            frags = new
        return frags

    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """llama_tokenize(text, add_special, parse_special).

        Lone surrogates (invalid in UTF-8, e.g. from a JSON "\\ud83d") become U+FFFD."""
        out: list[int] = []
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                text = re.sub("[\ud800-\udfff]", "\ufffd", text)
        frags = self._partition(text, parse_special) if text else []
        if add_special and self.add_bos and self.vocab_type in (VOCAB_TYPE_SPM, VOCAB_TYPE_BPE,
                                                                 VOCAB_TYPE_UGM):
            if self.bos_id < 0:
                raise ValueError("add_bos is set but the vocab has no BOS token")
            out.append(self.bos_id)
        if self._spm_escape:
            raw: list[str] = []
            prev_special = True
            for frag in frags:
                if isinstance(frag, int):
                    prev_special = True
                else:
                    if self.add_space_prefix and prev_special:
                        frag = " " + frag
                    raw.append(frag.replace(" ", _SPACE_ESC))
                    prev_special = False
        else:
            raw = [f for f in frags if isinstance(f, str)]
        encode = self._hf.encode
        k = 0
        for frag in frags:
            if isinstance(frag, int):
                out.append(frag)
            else:
                out.extend(encode(raw[k], add_special_tokens=False).ids)
                k += 1
        if add_special and self.add_eos:
            if self.eos_id < 0:
                raise ValueError("add_eos is set but the vocab has no EOS token")
            out.append(self.eos_id)
        return out

    # -- decode -------------------------------------------------------------------------------

    def piece(self, tid: int, special: bool = True) -> bytes:
        """token_to_piece(tid, special): the raw bytes of one token (may be partial UTF-8).

        With special=False, control and unknown tokens render as b"" (llama.cpp's default for
        generated text); user-defined tokens always render as their text.
        """
        if not special and self._attrs[tid] & (ATTR_CONTROL | ATTR_UNKNOWN):
            return b""
        return self._pieces[tid]

    def token_pieces(self) -> list[bytes]:
        """piece(id, special=True) for every id (shared list: do not modify)."""
        return self._pieces

    def decode_bytes(self, ids: Iterable[int], special: bool = True,
                     remove_leading_space: bool | None = None) -> bytes:
        pieces = [self.piece(int(t), special) for t in ids]
        if remove_leading_space is None:
            remove_leading_space = self.add_space_prefix
        if remove_leading_space and pieces and pieces[0][:1] == b" ":
            pieces[0] = pieces[0][1:]  # only the first token, as llama_detokenize
        return b"".join(pieces)

    def decode(self, ids: Iterable[int], special: bool = True,
               remove_leading_space: bool | None = None) -> str:
        """Text of `ids`: the concatenated pieces, invalid UTF-8 replaced by U+FFFD.

        Like llama_detokenize(remove_special=False, unparse_special=special), the first
        piece loses one leading space when the vocab adds a space prefix (SPM); pass
        remove_leading_space=False for the plain concatenation llama-server's /detokenize
        returns. llama.cpp's `clean_spaces` post-pass is not applied.
        """
        return self.decode_bytes(ids, special, remove_leading_space).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.model!r}, pre={self.pre!r}, n_vocab={self.n_vocab}, "
                f"bos={self.bos_id}, eos={self.eos_id}, eog={sorted(self.eot_ids)})")


def _attr_to_type(a: int) -> int:
    for bit, t in ((ATTR_CONTROL, TOKEN_TYPE_CONTROL), (ATTR_USER_DEFINED, TOKEN_TYPE_USER_DEFINED),
                   (ATTR_BYTE, TOKEN_TYPE_BYTE), (ATTR_UNKNOWN, TOKEN_TYPE_UNKNOWN),
                   (ATTR_UNUSED, TOKEN_TYPE_UNUSED), (ATTR_NORMAL, TOKEN_TYPE_NORMAL)):
        if a & bit:
            return t
    return TOKEN_TYPE_UNDEFINED


class IncrementalDecoder:
    """Feeds token ids one at a time, returns the newly completed UTF-8 text.

    Incomplete multi-byte sequences at the end are held back until the next token completes
    them; bytes that can never become valid UTF-8 come out as U+FFFD. `flush()` returns what
    is left (replacing an unfinished sequence).
    """

    def __init__(self, tokenizer: Tokenizer, special: bool = True) -> None:
        self.tokenizer = tokenizer
        self.special = special
        self._buf = b""

    def push(self, tid: int) -> str:
        return self.push_bytes(self.tokenizer.piece(tid, self.special))

    def push_bytes(self, data: bytes) -> str:
        buf = self._buf + data
        keep = _incomplete_utf8_suffix(buf)
        if keep:
            self._buf = buf[-keep:]
            buf = buf[:-keep]
        else:
            self._buf = b""
        return buf.decode("utf-8", errors="replace")

    @property
    def pending(self) -> bytes:
        return self._buf

    def flush(self) -> str:
        buf, self._buf = self._buf, b""
        return buf.decode("utf-8", errors="replace")


def _incomplete_utf8_suffix(buf: bytes) -> int:
    """Length of a trailing UTF-8 sequence that is valid so far but not finished (0..3)."""
    n = len(buf)
    for back in range(1, min(4, n) + 1):
        c = buf[n - back]
        if c & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if c & 0xE0 == 0xC0:
            need = 2
        elif c & 0xF0 == 0xE0:
            need = 3
        elif c & 0xF8 == 0xF0:
            need = 4
        else:
            return 0
        if back >= need:
            return 0
        # check the partial sequence can still be valid (e.g. no overlong / surrogate prefix)
        try:
            buf[n - back:].decode("utf-8")
        except UnicodeDecodeError as e:
            return back if e.reason == "unexpected end of data" else 0
        return 0
    return 0


# ---------------------------------------------------------------------------------------------
# Construction from GGUF metadata
# ---------------------------------------------------------------------------------------------

def _get_int(md: Mapping[str, Any], key: str, default: int) -> int:
    v = md.get(key)
    return int(v) if v is not None else default


def _spm_merges(vocab: dict[str, int], scores: np.ndarray) -> list[tuple[str, str]]:
    """Every (a, b) with a, b, a+b tokens, ranked by the score of a+b (higher first)."""
    cands: list[tuple[float, int, int, str, str]] = []
    for tok, tid in vocab.items():
        if len(tok) < 2:
            continue
        s = -float(scores[tid])
        for k in range(1, len(tok)):
            a, b = tok[:k], tok[k:]
            if a in vocab and b in vocab:
                cands.append((s, tid, k, a, b))
    cands.sort()
    return [(a, b) for _s, _t, _k, a, b in cands]


def _parse_merges(raw: Sequence[bytes | str]) -> list[tuple[str, str]]:
    """GGUF merges "a b" -> (a, b), split at the first space after position 0 as llama.cpp."""
    if not raw:
        return []
    if isinstance(raw[0], str):
        lines = list(raw)
    else:
        lines = b"\n".join(raw).decode("utf-8", errors="replace").split("\n")
        if len(lines) != len(raw):  # a merge contains a newline: decode one by one
            lines = [bytes(m).decode("utf-8", errors="replace") for m in raw]
    out = []
    for m in lines:
        if m[:1] == " ":
            p = m.find(" ", 1)
            if p >= 0:
                out.append((m[:p], m[p + 1:]))
            continue
        ab = m.split(" ", 1)
        if len(ab) == 2:
            out.append((ab[0], ab[1]))
    return out


def tokenizer_from_gguf_metadata(md: Mapping[str, Any]) -> Tokenizer:
    """Build a Tokenizer from GGUF key/values (as `read_gguf_metadata` returns them; string
    arrays may be bytes or str, numeric arrays any sequence)."""
    model = md.get("tokenizer.ggml.model")
    if model is None:
        raise ValueError("GGUF has no tokenizer.ggml.model")
    pre = md.get("tokenizer.ggml.pre")
    texts = [t.encode("utf-8") if isinstance(t, str) else bytes(t) for t in md["tokenizer.ggml.tokens"]]
    n = len(texts)
    ttypes = md.get("tokenizer.ggml.token_type")
    scores = md.get("tokenizer.ggml.scores")
    if scores is not None:
        scores = np.asarray(scores, dtype=np.float32)
    if ttypes is not None:
        attrs = [_TYPE_TO_ATTR.get(int(t), ATTR_UNDEFINED) for t in ttypes]
    else:
        attrs = [ATTR_NORMAL] * n
    for i, t in enumerate(texts):
        if not t:
            texts[i] = f"[EMPTY_{i}]".encode()

    add_space_prefix = False
    clean_spaces = True
    add_bos = False
    add_eos = False
    spec: _PreSpec | None = None
    if model == "llama":
        vocab_type = VOCAB_TYPE_SPM
        bos, eos, unk = 1, 2, 0
        add_space_prefix, clean_spaces, add_bos, add_eos = True, False, True, False
    elif model == "gpt2":
        vocab_type = VOCAB_TYPE_BPE
        bos, eos, unk = 11, 11, -1
        if not pre:
            pre = "default"
        spec = _PRE_TYPES.get(pre)
        if spec is None:
            raise ValueError(f"unknown pre-tokenizer type: '{pre}'")
        clean_spaces = spec.clean_spaces
        if spec.add_bos is not None:
            add_bos = spec.add_bos
        if spec.no_bos:
            bos = -1
    else:
        raise ValueError(f"unsupported tokenizer model: '{model}'")
    if "tokenizer.ggml.add_space_prefix" in md:
        add_space_prefix = bool(md["tokenizer.ggml.add_space_prefix"])

    if bos >= n:
        bos = -1
    if eos >= n:
        eos = -1
    if unk >= n:
        unk = -1

    def special_id(key: str, default: int) -> int:
        v = md.get(key)
        if v is None or int(v) >= n or int(v) < 0:
            return default
        return int(v)

    bos = special_id("tokenizer.ggml.bos_token_id", bos)
    eos = special_id("tokenizer.ggml.eos_token_id", eos)
    eot = special_id("tokenizer.ggml.eot_token_id", -1)
    eom = special_id("tokenizer.ggml.eom_token_id", -1)
    unk = special_id("tokenizer.ggml.unknown_token_id", unk)
    pad = special_id("tokenizer.ggml.padding_token_id", -1)
    if "tokenizer.ggml.add_bos_token" in md:
        add_bos = bool(md["tokenizer.ggml.add_bos_token"])
    if "tokenizer.ggml.add_eos_token" in md:
        add_eos = bool(md["tokenizer.ggml.add_eos_token"])
    if add_bos and bos < 0:
        raise ValueError("tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set")
    if add_eos and eos < 0:
        raise ValueError("tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set")

    # Text-based detection of EOT / EOG / FIM tokens, as llama.cpp does.
    str_texts = {}
    for i, t in enumerate(texts):
        if len(t) <= 32 and (t[:1] in (b"<", b"[", b"_")):
            try:
                str_texts[i] = t.decode("utf-8")
            except UnicodeDecodeError:
                pass
    eog: set[int] = set()
    warnings: list[str] = []

    def make_control(i: int, s: str) -> None:
        if not attrs[i] & ATTR_CONTROL:
            warnings.append(f"control-looking token: {i:6d} '{s}' was not control-type; "
                            "this is probably a bug in the model. its type will be overridden")
            attrs[i] |= ATTR_CONTROL

    for i, s in str_texts.items():
        if eot < 0 and s in _EOT_TEXTS:
            eot = i
            make_control(i, s)
        if eom < 0 and s == "<|eom_id|>":
            eom = i
            make_control(i, s)
        if s in _FIM_EOG_TEXTS:
            eog.add(i)
            make_control(i, s)
        if s in _EOG_TEXTS:
            eog.add(i)
            make_control(i, s)
    for i, s in str_texts.items():  # control tokens with "unused" in their text
        if attrs[i] & ATTR_CONTROL and "unused" in s:
            attrs[i] |= ATTR_UNUSED
    for i, s in str_texts.items():  # gpt-oss: always render these
        if s in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            attrs[i] = ATTR_USER_DEFINED
    for tid in (eos, eot, eom):
        if tid >= 0:
            eog.add(tid)
    eog_texts = {str_texts.get(i) for i in eog}
    if ({"<|return|>", "<|call|>", "<|end|>"} <= eog_texts
            or {"<|calls|>", "<|flush|>", "<|end|>"} <= eog_texts):
        for i in list(eog):
            if str_texts.get(i) == "<|end|>":
                eog.discard(i)
                attrs[i] = ATTR_USER_DEFINED
    if {"<|tool_response>", "</s>"} <= eog_texts:
        for i in list(eog):
            if str_texts.get(i) == "</s>":
                eog.discard(i)
                attrs[i] = ATTR_NORMAL

    # Per-model token attributes (phi-3: special tokens strip the whitespace after them).
    name = str(md.get("general.name", "")).lower()
    if "phi-3" in name or "phi3" in name:
        for i, a in enumerate(attrs):
            if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN):
                attrs[i] |= ATTR_RSTRIP
        by_text = {s: i for i, s in str_texts.items()}
        if "</s>" in by_text:
            attrs[by_text["</s>"]] |= ATTR_RSTRIP
        for s in ("<unk>", "<s>", "<|endoftext|>"):
            if s in by_text:
                attrs[by_text[s]] &= ~ATTR_RSTRIP

    # The fragment encoder.
    vocab: dict[str, int] = {}
    for i, t in enumerate(texts):
        try:
            s = t.decode("utf-8")
        except UnicodeDecodeError:
            continue
        vocab.setdefault(s, i)
    if vocab_type == VOCAB_TYPE_BPE:
        merges = _parse_merges(md.get("tokenizer.ggml.merges", []))
        try:
            bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=spec.ignore_merges)
        except Exception:  # a merge whose parts or result are not tokens: llama.cpp never uses it
            merges = [(a, b) for a, b in merges if a in vocab and b in vocab and (a + b) in vocab]
            bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=spec.ignore_merges)
        hf = tokenizers.Tokenizer(bpe)
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in spec.regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        pieces = []
        for i, t in enumerate(texts):
            a = attrs[i]
            if a & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED):
                pieces.append(t)
            elif a & ATTR_NORMAL:
                pieces.append(_byte_level_decode(t.decode("utf-8", errors="replace")))
            elif a & ATTR_BYTE:
                pieces.append(bytes([int(t[3:5], 16)]))
            else:
                pieces.append(b"")
    else:
        sc = scores if scores is not None else np.zeros(n, dtype=np.float32)
        merges = _spm_merges(vocab, sc)
        unk_text = texts[unk].decode("utf-8", errors="replace") if unk >= 0 else None
        bpe = models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token=unk_text)
        hf = tokenizers.Tokenizer(bpe)
        esc = _SPACE_ESC.encode("utf-8")
        pieces = []
        for i, t in enumerate(texts):
            a = attrs[i]
            if a & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED):
                pieces.append(t)
            elif a & ATTR_NORMAL:
                pieces.append(t.replace(esc, b" "))
            elif a & ATTR_BYTE:
                pieces.append(bytes([int(t[3:5], 16)]))
            else:
                pieces.append(b"")

    chat_template = md.get("tokenizer.chat_template")
    if isinstance(chat_template, (bytes, bytearray)):
        chat_template = chat_template.decode("utf-8", errors="replace")
    tok = Tokenizer(texts=texts, attrs=attrs, scores=scores, vocab_type=vocab_type, hf=hf,
                    pieces=pieces, bos_id=bos, eos_id=eos, eot_id=eot, unk_id=unk, pad_id=pad,
                    eog_ids=eog, add_bos=add_bos, add_eos=add_eos,
                    add_space_prefix=add_space_prefix, clean_spaces=clean_spaces,
                    chat_template=chat_template, pre=pre, model=model)
    tok.warnings = warnings
    tok.fim_ids = _fim_ids(md, tok)
    return tok


def _fim_ids(md: Mapping[str, Any], tok: "Tokenizer") -> dict[str, int]:
    """Fill-in-the-middle token ids (-1 when absent): `tokenizer.ggml.fim_<kind>_token_id`, else the
    first of llama.cpp's known texts present in the vocabulary."""
    out = {}
    for kind, texts in _FIM_TEXTS.items():
        tid = md.get(f"tokenizer.ggml.fim_{kind}_token_id")
        if tid is None:
            tid = next((t for t in (tok.token_id(x) for x in texts) if t is not None), -1)
        out[kind] = int(tid)
    return out


# ---------------------------------------------------------------------------------------------
# Construction from a Hugging Face folder
# ---------------------------------------------------------------------------------------------

def _token_content(v: Any) -> str | None:
    if isinstance(v, dict):
        return v.get("content")
    return v if isinstance(v, str) else None


def _hf_prepends_space(spec: Mapping[str, Any]) -> bool:
    """Whether a tokenizer.json pipeline adds a leading U+2581 (Metaspace / Prepend)."""
    def walk(node: Any) -> bool:
        if isinstance(node, dict):
            t = node.get("type")
            if t == "Metaspace" and node.get("prepend_scheme", "always") != "never" \
                    and node.get("add_prefix_space", True):
                return True
            if t == "Prepend" and node.get("prepend") == _SPACE_ESC:
                return True
            return any(walk(v) for v in node.values())
        if isinstance(node, list):
            return any(walk(v) for v in node)
        return False
    return walk(spec.get("normalizer")) or walk(spec.get("pre_tokenizer"))


def _tokenizer_from_hf_folder(folder: Path) -> Tokenizer:
    hf_full = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.exists() else {}

    n = hf_full.get_vocab_size(with_added_tokens=True)
    id_to_str: list[str | None] = [None] * n
    for s, i in hf_full.get_vocab(with_added_tokens=True).items():
        if i < n:
            id_to_str[i] = s
    added = hf_full.get_added_tokens_decoder()  # id -> AddedToken

    model_type = spec.get("model", {}).get("type", "BPE")

    def has_byte_level(node: Any) -> bool:
        if isinstance(node, dict):
            if node.get("type") == "ByteLevel":
                return True
            return any(has_byte_level(v) for v in node.values())
        if isinstance(node, list):
            return any(has_byte_level(v) for v in node)
        return False

    byte_level = has_byte_level(spec.get("pre_tokenizer")) or has_byte_level(spec.get("decoder"))
    if model_type == "BPE":
        vocab_type = VOCAB_TYPE_BPE if byte_level else VOCAB_TYPE_SPM
    elif model_type == "WordPiece":
        vocab_type = VOCAB_TYPE_WPM
    elif model_type == "Unigram":
        vocab_type = VOCAB_TYPE_UGM
    else:
        vocab_type = VOCAB_TYPE_BPE

    texts: list[bytes] = []
    attrs: list[int] = []
    pieces: list[bytes] = []
    esc = _SPACE_ESC.encode("utf-8")
    for i in range(n):
        s = id_to_str[i]
        if s is None:
            texts.append(f"[EMPTY_{i}]".encode())
            attrs.append(ATTR_UNDEFINED)
            pieces.append(b"")
            continue
        t = s.encode("utf-8")
        texts.append(t)
        if i in added:
            at = added[i]
            a = ATTR_CONTROL if at.special else ATTR_USER_DEFINED
            if at.lstrip:
                a |= ATTR_LSTRIP
            if at.rstrip:
                a |= ATTR_RSTRIP
            attrs.append(a)
            pieces.append(t)
        elif len(s) == 6 and s.startswith("<0x") and s.endswith(">") and vocab_type == VOCAB_TYPE_SPM:
            attrs.append(ATTR_BYTE)
            pieces.append(bytes([int(s[3:5], 16)]))
        else:
            attrs.append(ATTR_NORMAL)
            if vocab_type == VOCAB_TYPE_BPE:
                pieces.append(_byte_level_decode(s))
            else:
                pieces.append(t.replace(esc, b" "))

    vocab = {s: i for i, s in enumerate(id_to_str) if s is not None}

    def tok_id(key: str) -> int:
        s = _token_content(cfg.get(key))
        return vocab.get(s, -1) if s is not None else -1

    bos, eos, unk, pad = tok_id("bos_token"), tok_id("eos_token"), tok_id("unk_token"), tok_id("pad_token")
    # Whether the post-processor adds BOS/EOS: compare encodings with and without specials.
    probe_plain = hf_full.encode("a", add_special_tokens=False).ids
    probe_special = hf_full.encode("a", add_special_tokens=True).ids
    add_bos = bool(cfg.get("add_bos_token", bos >= 0 and probe_special[:1] == [bos] != probe_plain[:1]))
    add_eos = bool(cfg.get("add_eos_token", eos >= 0 and probe_special[-1:] == [eos] != probe_plain[-1:]))

    eog: set[int] = set()
    for i, s in enumerate(id_to_str):
        if s is not None and (s in _EOG_TEXTS or s in _FIM_EOG_TEXTS):
            eog.add(i)
            attrs[i] |= ATTR_CONTROL
    if eos >= 0:
        eog.add(eos)
    gen_cfg = folder / "generation_config.json"
    if gen_cfg.exists():
        g = json.loads(gen_cfg.read_text(encoding="utf-8")).get("eos_token_id")
        for e in (g if isinstance(g, list) else [g] if g is not None else []):
            if 0 <= int(e) < n:
                eog.add(int(e))
    eot = next((vocab[s] for s in _EOT_TEXTS if s in vocab), -1)

    chat_template = cfg.get("chat_template")
    if isinstance(chat_template, list):  # [{"name": ..., "template": ...}]
        named = {d.get("name"): d.get("template") for d in chat_template if isinstance(d, dict)}
        chat_template = named.get("default") or next(iter(named.values()), None)
    if chat_template is None and (folder / "chat_template.jinja").exists():
        chat_template = (folder / "chat_template.jinja").read_text(encoding="utf-8")

    # Fragment encoder: same pipeline, specials are split out by Tokenizer._partition.
    hf = tokenizers.Tokenizer.from_str(hf_full.to_str())
    hf.encode_special_tokens = True
    hf.post_processor = None
    return Tokenizer(texts=texts, attrs=attrs, scores=None, vocab_type=vocab_type, hf=hf,
                     pieces=pieces, bos_id=bos, eos_id=eos, eot_id=eot, unk_id=unk, pad_id=pad,
                     eog_ids=eog, add_bos=add_bos, add_eos=add_eos,
                     add_space_prefix=_hf_prepends_space(spec), spm_escape=False,
                     clean_spaces=bool(cfg.get("clean_up_tokenization_spaces", False)),
                     chat_template=chat_template, pre=None, model=f"hf-{model_type.lower()}")


def load_tokenizer(path: str | os.PathLike | Mapping[str, Any]) -> Tokenizer:
    """Tokenizer of a GGUF file, a Hugging Face folder (or its tokenizer.json), or a mapping of
    GGUF metadata already read (e.g. by the model loader)."""
    if isinstance(path, Mapping):
        return tokenizer_from_gguf_metadata(path)
    p = Path(path)
    if p.is_dir():
        if (p / "tokenizer.json").exists():
            return _tokenizer_from_hf_folder(p)
        ggufs = sorted(p.glob("*.gguf"))
        if ggufs:
            return tokenizer_from_gguf_metadata(read_gguf_metadata(ggufs[0]))
        raise FileNotFoundError(f"{p}: no tokenizer.json or .gguf inside")
    if p.name == "tokenizer.json":
        return _tokenizer_from_hf_folder(p.parent)
    return tokenizer_from_gguf_metadata(read_gguf_metadata(p))
