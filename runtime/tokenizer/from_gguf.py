"""Building a Tokenizer from GGUF metadata, as llama_vocab::impl::load does (src/llama-vocab.cpp).

`tokenizer_from_gguf_metadata(md)` takes the key/values `runtime.model.gguf.read_gguf_metadata` returns
(or any mapping like it: string arrays of `str` or `bytes`, numeric arrays any sequence). Steps:

1. the vocab type from `tokenizer.ggml.model` (`VOCAB_KINDS`: "llama" -> SPM, "gpt2" -> BPE, "gemma4" ->
   Gemma 4's SPM-style BPE: spaces escaped to U+2581, merges over raw UTF-8 per line, `<0xXX>` byte
   fallback, U+2581 pieces, add_bos forced; the
   other llama.cpp types, "bert" WPM and "t5" UGM, are not supported) and its defaults: special
   ids, space prefix, add_bos; for BPE the pre-tokenizer of `tokenizer.ggml.pre`;
2. the `tokenizer.ggml.*` keys that override them (`_apply_keys`);
3. text-based detection of EOT / EOM / EOG / FIM tokens and the control-type overrides llama.cpp
   warns about (`_detect_eog`), then per-model attributes (phi-3 rstrip);
4. the fragment encoder of the vocab type (a `tokenizers` BPE: GGUF merges for BPE, merges ranked
   by the result-token scores for SPM, byte fallback to `<0xXX>` tokens) and the token pieces.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np
import tokenizers
from tokenizers import models

from runtime.model.model_files import cache_root
from runtime.tokenizer.core import Tokenizer
from runtime.tokenizer.pretokenizers import PRE_TYPES, PreSpec, hf_pre_tokenizer
from runtime.tokenizer.vocab import (ATTR_CONTROL, ATTR_NORMAL, ATTR_RSTRIP, ATTR_SPECIAL, ATTR_UNDEFINED,
                                     ATTR_UNUSED, ATTR_USER_DEFINED, EOG_TEXTS, EOT_TEXTS,
                                     FIM_EOG_TEXTS, FIM_TEXTS, TYPE_TO_ATTR, VOCAB_TYPE_BPE,
                                     VOCAB_TYPE_SPM, token_pieces)

__all__ = ["tokenizer_from_gguf_metadata", "VOCAB_KINDS", "EncoderRecipe"]


@dataclass
class _Settings:
    """What llama_vocab::impl::load decides before it builds the encoder."""
    vocab_type: int
    pre: str | None
    spec: PreSpec | None  # BPE: the pre-tokenizer
    bos: int
    eos: int
    unk: int
    add_space_prefix: bool = False
    clean_spaces: bool = True
    add_bos: bool = False
    add_eos: bool = False
    eot: int = -1
    eom: int = -1
    pad: int = -1


# ---------------------------------------------------------------------------------------------
# per vocab type: defaults and fragment encoder

def _spm_settings(pre: str | None) -> _Settings:
    return _Settings(VOCAB_TYPE_SPM, pre, None, bos=1, eos=2, unk=0, add_space_prefix=True,
                     clean_spaces=False, add_bos=True, add_eos=False)


def _bpe_settings(pre: str | None) -> _Settings:
    pre = pre or "default"
    spec = PRE_TYPES.get(pre)
    if spec is None:
        raise ValueError(f"unknown pre-tokenizer type: '{pre}'")
    s = _Settings(VOCAB_TYPE_BPE, pre, spec, bos=11, eos=11, unk=-1, clean_spaces=spec.clean_spaces)
    if spec.add_bos is not None:
        s.add_bos = spec.add_bos
    if spec.no_bos:
        s.bos = -1
    return s


def _merge_strings(vocab: dict[str, int], ab: np.ndarray) -> list[tuple[str, str]]:
    """Ranked merges as int32 [n, 2] ids -> pairs of the vocabulary's own strings."""
    strs: list[str | None] = [None] * (max(vocab.values()) + 1 if vocab else 0)
    for t, i in vocab.items():
        strs[i] = t
    return [(strs[a], strs[b]) for a, b in zip(ab[:, 0].tolist(), ab[:, 1].tolist())]


def _spm_search(vocab: dict[str, int], scores: np.ndarray) -> np.ndarray:
    """The SPM merges: every (a, b) with a, b, a+b tokens, ranked by the score of a+b (higher first;
    ties by the id of a+b, then the split point), as int32 [n, 2] (id of a, id of b). Built lean:
    Gemma 3's vocabulary gives 514,847 merges, so the candidates are collected as (id, split)
    integers and sorted in numpy (`_merge_strings` then pairs the vocabulary's own strings, no
    copies). `_spm_merge_ids` keeps the result in the cache: found again at the next start, it skips
    the search (Gemma 3: ~1.4 of its ~1.5 s)."""
    found = [tid << 20 | k for tok, tid in vocab.items() for k in range(1, min(len(tok), 1 << 20))
             if tok[:k] in vocab and tok[k:] in vocab]  # (id, split) packed in one int
    packed = np.array(found, dtype=np.int64)
    del found
    ids, ks = packed >> 20, packed & ((1 << 20) - 1)
    neg = -np.asarray(scores, dtype=np.float64)[ids]
    order = np.lexsort((ks, ids, neg))
    text = {tid: tok for tok, tid in vocab.items()}
    tk = list(zip(map(text.__getitem__, ids[order].tolist()), ks[order].tolist()))
    ab = np.empty((len(tk), 2), dtype=np.int32)  # filled from generators: no list of int pairs
    ab[:, 0] = np.fromiter((vocab[t[:k]] for t, k in tk), dtype=np.int32, count=len(tk))
    ab[:, 1] = np.fromiter((vocab[t[k:]] for t, k in tk), dtype=np.int32, count=len(tk))
    return ab


def _spm_merge_ids(vocab: dict[str, int], scores: np.ndarray, texts: list[bytes] | None) -> np.ndarray:
    """`_spm_search`, kept in `$TRITIUM_CACHE/tokenizers` under a digest of the token texts and
    scores (best effort: a cache that cannot be read or written is recomputed / skipped)."""
    if texts is None:
        return _spm_search(vocab, scores)
    h = hashlib.sha256(b"tritium spm merges v1\0")
    h.update(np.asarray(scores, dtype="<f4").tobytes())
    h.update(np.fromiter(map(len, texts), dtype="<i8", count=len(texts)).tobytes())
    h.update(b"".join(texts))
    path = cache_root() / "tokenizers" / f"spm-merges-{h.hexdigest()[:40]}.npy"
    try:
        ab = np.load(path, allow_pickle=False)
        if ab.dtype == np.int32 and ab.ndim == 2 and ab.shape[1] == 2 and (
                ab.size == 0 or (int(ab.min()) >= 0 and int(ab.max()) < len(texts))):
            known = np.zeros(len(texts), dtype=bool)  # every id one of the vocabulary's strings
            known[np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab))] = True
            if bool(known[ab].all()):
                return ab
    except (OSError, ValueError):
        pass
    ab = _spm_search(vocab, scores)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")
        np.save(tmp, ab, allow_pickle=False)
        os.replace(tmp, path)
    except OSError:
        pass
    return ab


_MERGE = re.compile(r"([^ \n]+) ([^\n]*)")  # "a b..." -> (a, b...): split at the first space


def _parse_merges(raw: Sequence[bytes | str]) -> list[tuple[str, str]]:
    """GGUF merges "a b" -> (a, b), split at the first space after position 0 as llama.cpp.
    Invalid UTF-8 in a merge becomes U+FFFD (such a merge then joins no tokens)."""
    if not raw:
        return []
    if isinstance(raw[0], str):
        lines = list(raw)
        joined = "\n".join(lines)
        if not joined.isascii() and _has_escaped_bytes(joined):
            lines = [_text(m) for m in lines]
            joined = "\n".join(lines)
    else:
        joined = b"\n".join(raw).decode("utf-8", errors="replace")
        lines = joined.split("\n")
        if len(lines) != len(raw):  # a merge contains a newline: decode one by one
            lines = [bytes(m).decode("utf-8", errors="replace") for m in raw]
    if joined.count("\n") == len(lines) - 1 and not joined.startswith(" ") and "\n " not in joined:
        return _MERGE.findall(joined)  # no newline inside a merge, none starts with a space: one pass
    return _split_merges(lines)


def _split_merges(lines: Sequence[str]) -> list[tuple[str, str]]:
    """Merge by merge: split at the first space after position 0; a merge without one is skipped."""
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


@dataclass(frozen=True)
class EncoderRecipe:
    """What builds a vocabulary's fragment encoder (a `tokenizers` BPE), as plain data: a forked
    start-up (runtime/launch/preload.py) computes it in a child process and pickles it, and the server
    only runs `build` (the `tokenizers` constructor, ~0.15 s for 150k tokens, holding the GIL)."""
    vocab: dict[str, int]
    merges: list[tuple[str, str]] | None  # BPE: the GGUF merges; SPM: None, `merge_ids` instead
    merge_ids: np.ndarray | None = None  # SPM: int32 [n, 2] ranked (id of a, id of b)
    pre: PreSpec | None = None  # BPE: the pre-tokenizer
    byte_fallback: bool = False
    unk_token: str | None = None
    split: str | None = None  # without `pre`: a regex the text is split at first (gemma4: lines)

    def build(self) -> tokenizers.Tokenizer:
        merges = self.merges if self.merges is not None else _merge_strings(self.vocab, self.merge_ids)
        if self.pre is None:
            hf = tokenizers.Tokenizer(models.BPE(vocab=self.vocab, merges=merges, byte_fallback=self.byte_fallback,
                                                 unk_token=self.unk_token))
            if self.split is not None:
                from tokenizers import Regex, pre_tokenizers
                hf.pre_tokenizer = pre_tokenizers.Split(Regex(self.split), behavior="isolated")
            return hf
        try:
            bpe = models.BPE(vocab=self.vocab, merges=merges, ignore_merges=self.pre.ignore_merges)
        except Exception:  # a merge whose parts or result are not tokens: llama.cpp never uses it
            vocab = self.vocab
            merges = [(a, b) for a, b in merges if a in vocab and b in vocab and (a + b) in vocab]
            bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=self.pre.ignore_merges)
        hf = tokenizers.Tokenizer(bpe)
        hf.pre_tokenizer = hf_pre_tokenizer(self.pre)
        return hf


def _bpe_encoder(md: Mapping[str, Any], s: _Settings, vocab: dict[str, int], texts: list[bytes],
                 scores: np.ndarray | None) -> EncoderRecipe:
    return EncoderRecipe(vocab, _parse_merges(md.get("tokenizer.ggml.merges", [])), pre=s.spec)


def _spm_encoder(md: Mapping[str, Any], s: _Settings, vocab: dict[str, int], texts: list[bytes],
                 scores: np.ndarray | None) -> EncoderRecipe:
    sc = scores if scores is not None else np.zeros(len(texts), dtype=np.float32)
    unk_text = texts[s.unk].decode("utf-8", errors="replace") if s.unk >= 0 else None
    return EncoderRecipe(vocab, None, _spm_merge_ids(vocab, sc, texts), byte_fallback=True, unk_token=unk_text)


def _gemma4_settings(pre: str | None) -> _Settings:
    """tokenizer.ggml.model "gemma4" (llama_vocab::impl::load): BPE with no default special ids and
    the gemma4 pre-type whatever the file says (SPM-style: spaces escaped to U+2581, merges over raw
    UTF-8 per line, `<0xXX>` byte tokens); add_bos forced on."""
    return _Settings(VOCAB_TYPE_BPE, "gemma4", None, bos=-1, eos=-1, unk=-1, add_bos=True)


def _gemma4_encoder(md: Mapping[str, Any], s: _Settings, vocab: dict[str, int], texts: list[bytes],
                    scores: np.ndarray | None) -> EncoderRecipe:
    merges = [(a, b) for a, b in _parse_merges(md.get("tokenizer.ggml.merges", []))
              if a in vocab and b in vocab and (a + b) in vocab]
    return EncoderRecipe(vocab, merges, byte_fallback=True, split="[^\n]+|[\n]+")


class VocabKind(NamedTuple):
    settings: Callable[[str | None], _Settings]  # (tokenizer.ggml.pre) -> defaults
    encoder: Callable[..., EncoderRecipe]  # (md, settings, vocab, texts, scores)


# tokenizer.ggml.model -> how to build it
VOCAB_KINDS: Mapping[str, VocabKind] = MappingProxyType({
    "llama": VocabKind(_spm_settings, _spm_encoder),
    "gpt2": VocabKind(_bpe_settings, _bpe_encoder),
    "gemma4": VocabKind(_gemma4_settings, _gemma4_encoder),
})


# ---------------------------------------------------------------------------------------------
# GGUF values

def _has_escaped_bytes(s: str) -> bool:
    """Whether a string read by runtime.model.gguf holds invalid UTF-8 (as surrogate escapes)."""
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _text(v: Any) -> Any:
    """A GGUF string value as llama.cpp shows it: invalid UTF-8 replaced by U+FFFD."""
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, str) and not v.isascii() and _has_escaped_bytes(v):
        try:
            return v.encode("utf-8", "surrogateescape").decode("utf-8", errors="replace")
        except UnicodeEncodeError:  # a lone surrogate that is no escaped byte: leave it
            return v
    return v


def _texts_and_vocab_fast(raw: Sequence[str | bytes]) -> tuple[list[bytes], dict[str, int]] | None:
    """`_texts_and_vocab` of the common case in a few whole-list passes (~0.15 s less for a 150k
    vocabulary at start-up): every text a non-empty valid `str`. None otherwise."""
    if not isinstance(raw, list) or not raw or not all(type(t) is str for t in raw) or not min(map(len, raw)):
        return None
    try:
        texts = list(map(str.encode, raw))  # strict UTF-8: a surrogate-escaped byte raises
    except UnicodeEncodeError:
        return None
    # iterated last to first, so that a repeated text keeps its first id
    return texts, dict(zip(reversed(raw), range(len(raw) - 1, -1, -1)))


def _texts_and_vocab(raw: Sequence[str | bytes]) -> tuple[list[bytes], dict[str, int]]:
    """The token texts as stored (bytes; an empty one as "[EMPTY_<id>]" like llama.cpp) and the
    fragment encoder's vocabulary: text -> first id, for the texts that are valid UTF-8."""
    fast = _texts_and_vocab_fast(raw)
    if fast is not None:
        return fast
    texts: list[bytes] = []
    vocab: dict[str, int] = {}
    for i, t in enumerate(raw):
        s: str | None
        if isinstance(t, str):
            try:
                b, s = t.encode("utf-8"), t
            except UnicodeEncodeError:  # invalid UTF-8 in the file, read with surrogateescape
                b, s = t.encode("utf-8", "surrogateescape"), None
        else:
            b = bytes(t)
            try:
                s = b.decode("utf-8")
            except UnicodeDecodeError:
                s = None
        if not b:
            s = f"[EMPTY_{i}]"
            b = s.encode()
        texts.append(b)
        if s is not None:
            vocab.setdefault(s, i)
    return texts, vocab


def _attrs_of_types(ttypes: Sequence[int]) -> list[int]:
    """llama_token_attr of each token type (unknown types: undefined), looked up in one numpy pass."""
    t = np.asarray(ttypes, dtype=np.int64)
    lut = np.full(max(TYPE_TO_ATTR) + 2, ATTR_UNDEFINED, dtype=np.int64)
    for k, v in TYPE_TO_ATTR.items():
        lut[k] = v
    t = np.where((t < 0) | (t >= len(lut)), len(lut) - 1, t)
    return lut[t].tolist()


# ---------------------------------------------------------------------------------------------
# special tokens

def _apply_keys(md: Mapping[str, Any], s: _Settings, n: int) -> None:
    """The tokenizer.ggml.* keys over the type's defaults; ids outside the vocab are ignored."""
    if "tokenizer.ggml.add_space_prefix" in md:
        s.add_space_prefix = bool(md["tokenizer.ggml.add_space_prefix"])
    s.bos, s.eos, s.unk = (x if x < n else -1 for x in (s.bos, s.eos, s.unk))

    def special_id(key: str, default: int) -> int:
        v = md.get(key)
        if v is None or int(v) >= n or int(v) < 0:
            return default
        return int(v)

    s.bos = special_id("tokenizer.ggml.bos_token_id", s.bos)
    s.eos = special_id("tokenizer.ggml.eos_token_id", s.eos)
    s.eot = special_id("tokenizer.ggml.eot_token_id", -1)
    s.eom = special_id("tokenizer.ggml.eom_token_id", -1)
    s.unk = special_id("tokenizer.ggml.unknown_token_id", s.unk)
    s.pad = special_id("tokenizer.ggml.padding_token_id", -1)
    if "tokenizer.ggml.add_bos_token" in md:
        s.add_bos = bool(md["tokenizer.ggml.add_bos_token"])
    if "tokenizer.ggml.add_eos_token" in md:
        s.add_eos = bool(md["tokenizer.ggml.add_eos_token"])
    if s.add_bos and s.bos < 0:
        raise ValueError("tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set")
    if s.add_eos and s.eos < 0:
        raise ValueError("tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set")


def _special_looking_texts(texts: list[bytes]) -> dict[int, str]:
    """id -> text of the short tokens starting with '<', '[' or '_' (the candidates llama.cpp
    compares with its lists of special texts)."""
    out = {}
    for i in [i for i, t in enumerate(texts) if t.startswith((b"<", b"[", b"_")) and len(t) <= 32]:
        try:
            out[i] = texts[i].decode("utf-8")
        except UnicodeDecodeError:
            pass
    return out


def _detect_eog(s: _Settings, str_texts: dict[int, str], attrs: list[int]) -> tuple[set[int], list[str]]:
    """Text-based detection of the EOT / EOM / EOG tokens as llama.cpp does (sets `s.eot`, `s.eom`
    when their keys are absent; makes them control tokens, with llama.cpp's warning). Returns the
    EOG ids and the warnings."""
    eog: set[int] = set()
    warnings: list[str] = []

    def make_control(i: int, text: str) -> None:
        if not attrs[i] & ATTR_CONTROL:
            warnings.append(f"control-looking token: {i:6d} '{text}' was not control-type; "
                            "this is probably a bug in the model. its type will be overridden")
            attrs[i] |= ATTR_CONTROL

    for i, text in str_texts.items():
        if s.eot < 0 and text in EOT_TEXTS:
            s.eot = i
            make_control(i, text)
        if s.eom < 0 and text == "<|eom_id|>":
            s.eom = i
            make_control(i, text)
        if text in FIM_EOG_TEXTS:
            eog.add(i)
            make_control(i, text)
        if text in EOG_TEXTS:
            eog.add(i)
            make_control(i, text)
    for i, text in str_texts.items():  # control tokens with "unused" in their text
        if attrs[i] & ATTR_CONTROL and "unused" in text:
            attrs[i] |= ATTR_UNUSED
    for i, text in str_texts.items():  # gpt-oss: always render these
        if text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            attrs[i] = ATTR_USER_DEFINED
    for tid in (s.eos, s.eot, s.eom):
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
    return eog, warnings


def _model_attrs(md: Mapping[str, Any], str_texts: dict[int, str], attrs: list[int]) -> None:
    """Per-model token attributes (phi-3: special tokens strip the whitespace after them)."""
    name = str(_text(md.get("general.name", ""))).lower()
    if "phi-3" in name or "phi3" in name:
        for i, a in enumerate(attrs):
            if a & ATTR_SPECIAL:
                attrs[i] |= ATTR_RSTRIP
        by_text = {text: i for i, text in str_texts.items()}
        if "</s>" in by_text:
            attrs[by_text["</s>"]] |= ATTR_RSTRIP
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            if text in by_text:
                attrs[by_text[text]] &= ~ATTR_RSTRIP


def _fim_ids(md: Mapping[str, Any], tok: Tokenizer) -> dict[str, int]:
    """Fill-in-the-middle token ids (-1 when absent): `tokenizer.ggml.fim_<kind>_token_id`, else the
    first of llama.cpp's known texts present in the vocabulary."""
    out = {}
    for kind, texts in FIM_TEXTS.items():
        tid = md.get(f"tokenizer.ggml.fim_{kind}_token_id")
        if tid is None:
            tid = next((t for t in (tok.token_id(x) for x in texts) if t is not None), -1)
        out[kind] = int(tid)
    return out


# ---------------------------------------------------------------------------------------------

def tokenizer_from_gguf_metadata(md: Mapping[str, Any], *, build_encoder: bool = True) -> Tokenizer:
    """Build a Tokenizer from GGUF key/values (as `runtime.model.gguf.read_gguf_metadata` returns them;
    string arrays may be bytes or str, numeric arrays any sequence). `build_encoder=False`: the
    fragment encoder is left as its recipe (picklable; `Tokenizer.build_encoder` makes it)."""
    model = _text(md.get("tokenizer.ggml.model"))
    if model is None:
        raise ValueError("GGUF has no tokenizer.ggml.model")
    pre = _text(md.get("tokenizer.ggml.pre"))
    texts, vocab = _texts_and_vocab(md["tokenizer.ggml.tokens"])
    n = len(texts)
    ttypes = md.get("tokenizer.ggml.token_type")
    scores = md.get("tokenizer.ggml.scores")
    if scores is not None:
        scores = np.asarray(scores, dtype=np.float32)
    if ttypes is not None:
        attrs = _attrs_of_types(ttypes)
    else:
        attrs = [ATTR_NORMAL] * n

    kind = VOCAB_KINDS.get(model)
    if kind is None:
        raise ValueError(f"unsupported tokenizer model: '{model}'")
    s = kind.settings(pre)
    _apply_keys(md, s, n)
    gemma4 = model == "gemma4"
    if gemma4:  # llama.cpp's workaround: add_bos overridden to true for Gemma 4
        s.add_bos = True
    str_texts = _special_looking_texts(texts)
    eog, warnings = _detect_eog(s, str_texts, attrs)
    _model_attrs(md, str_texts, attrs)
    recipe = kind.encoder(md, s, vocab, texts, scores)
    pieces = token_pieces(texts, attrs, VOCAB_TYPE_SPM if gemma4 else s.vocab_type)  # gemma4: U+2581 pieces

    tok = Tokenizer(texts=texts, attrs=attrs, scores=scores, vocab_type=s.vocab_type, hf=recipe,
                    pieces=pieces, bos_id=s.bos, eos_id=s.eos, eot_id=s.eot, unk_id=s.unk,
                    pad_id=s.pad, eog_ids=eog, add_bos=s.add_bos, add_eos=s.add_eos,
                    add_space_prefix=s.add_space_prefix, clean_spaces=s.clean_spaces,
                    chat_template=_text(md.get("tokenizer.chat_template")), pre=s.pre, model=model,
                    spm_escape=True if gemma4 else None)
    tok.warnings = warnings
    tok.fim_ids = _fim_ids(md, tok)
    return tok.build_encoder() if build_encoder else tok
