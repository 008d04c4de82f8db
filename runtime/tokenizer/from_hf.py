"""Building a Tokenizer from a Hugging Face folder: `tokenizer.json`, `tokenizer_config.json`
(special tokens, add_bos/add_eos, chat template), `generation_config.json` (extra EOS ids) and
`chat_template.jinja`.

The fragment encoder is the folder's own `tokenizers` pipeline without its post-processor; special
tokens are split out by `Tokenizer` with llama.cpp's rules, like a GGUF vocab. Token types follow
the added tokens (special -> control, others user-defined), the vocab type the model type
(BPE with a ByteLevel step -> BPE, other BPE -> SPM, WordPiece -> WPM, Unigram -> UGM).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping

import tokenizers

from runtime.tokenizer.core import Tokenizer
from runtime.tokenizer.vocab import (ATTR_BYTE, ATTR_CONTROL, ATTR_LSTRIP, ATTR_NORMAL, ATTR_RSTRIP,
                                     ATTR_UNDEFINED, ATTR_USER_DEFINED, EOG_TEXTS, EOT_TEXTS,
                                     FIM_EOG_TEXTS, SPACE_ESC, VOCAB_TYPE_BPE, VOCAB_TYPE_SPM,
                                     VOCAB_TYPE_UGM, VOCAB_TYPE_WPM, token_pieces)

__all__ = ["tokenizer_from_hf_folder"]


def _token_content(v: Any) -> str | None:
    if isinstance(v, dict):
        return v.get("content")
    return v if isinstance(v, str) else None


def _any_node(node: Any, pred: Callable[[dict], bool]) -> bool:
    """Whether some object in a tokenizer.json subtree satisfies `pred`."""
    if isinstance(node, dict):
        return pred(node) or any(_any_node(v, pred) for v in node.values())
    if isinstance(node, list):
        return any(_any_node(v, pred) for v in node)
    return False


def _prepends_space(node: dict) -> bool:
    """A Metaspace / Prepend step that adds a leading U+2581."""
    t = node.get("type")
    if t == "Metaspace" and node.get("prepend_scheme", "always") != "never" \
            and node.get("add_prefix_space", True):
        return True
    return t == "Prepend" and node.get("prepend") == SPACE_ESC


def _hf_prepends_space(spec: Mapping[str, Any]) -> bool:
    """Whether a tokenizer.json pipeline adds a leading U+2581 (Metaspace / Prepend)."""
    return _any_node(spec.get("normalizer"), _prepends_space) \
        or _any_node(spec.get("pre_tokenizer"), _prepends_space)


def _vocab_type(spec: Mapping[str, Any], model_type: str) -> int:
    def byte_level(node: dict) -> bool:
        return node.get("type") == "ByteLevel"

    if model_type == "BPE":
        is_byte_level = _any_node(spec.get("pre_tokenizer"), byte_level) \
            or _any_node(spec.get("decoder"), byte_level)
        return VOCAB_TYPE_BPE if is_byte_level else VOCAB_TYPE_SPM
    return {"WordPiece": VOCAB_TYPE_WPM, "Unigram": VOCAB_TYPE_UGM}.get(model_type, VOCAB_TYPE_BPE)


def _texts_and_attrs(id_to_str: list[str | None], added: Mapping[int, Any],
                     vocab_type: int) -> tuple[list[bytes], list[int]]:
    """Token texts (an id without a token as "[EMPTY_<id>]") and attributes: added tokens are
    control (special) or user-defined with their lstrip/rstrip, SPM `<0xXX>` tokens bytes."""
    texts: list[bytes] = []
    attrs: list[int] = []
    for i, s in enumerate(id_to_str):
        if s is None:
            texts.append(f"[EMPTY_{i}]".encode())
            attrs.append(ATTR_UNDEFINED)
            continue
        texts.append(s.encode("utf-8"))
        if i in added:
            at = added[i]
            a = ATTR_CONTROL if at.special else ATTR_USER_DEFINED
            if at.lstrip:
                a |= ATTR_LSTRIP
            if at.rstrip:
                a |= ATTR_RSTRIP
            attrs.append(a)
        elif len(s) == 6 and s.startswith("<0x") and s.endswith(">") and vocab_type == VOCAB_TYPE_SPM:
            attrs.append(ATTR_BYTE)
        else:
            attrs.append(ATTR_NORMAL)
    return texts, attrs


def _eog_ids(folder: Path, id_to_str: list[str | None], attrs: list[int], eos: int) -> set[int]:
    """EOG ids: tokens with one of llama.cpp's EOG texts (made control), the EOS, and the
    generation_config.json `eos_token_id`s."""
    n = len(id_to_str)
    eog: set[int] = set()
    for i, s in enumerate(id_to_str):
        if s is not None and (s in EOG_TEXTS or s in FIM_EOG_TEXTS):
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
    return eog


def _chat_template(folder: Path, cfg: Mapping[str, Any]) -> str | None:
    chat_template = cfg.get("chat_template")
    if isinstance(chat_template, list):  # [{"name": ..., "template": ...}]
        named = {d.get("name"): d.get("template") for d in chat_template if isinstance(d, dict)}
        chat_template = named.get("default") or next(iter(named.values()), None)
    if chat_template is None and (folder / "chat_template.jinja").exists():
        chat_template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    return chat_template


def tokenizer_from_hf_folder(folder: Path) -> Tokenizer:
    hf_full = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.exists() else {}

    n = hf_full.get_vocab_size(with_added_tokens=True)
    id_to_str: list[str | None] = [None] * n
    for s, i in hf_full.get_vocab(with_added_tokens=True).items():
        if i < n:
            id_to_str[i] = s
    model_type = spec.get("model", {}).get("type", "BPE")
    vocab_type = _vocab_type(spec, model_type)
    texts, attrs = _texts_and_attrs(id_to_str, hf_full.get_added_tokens_decoder(), vocab_type)
    pieces = token_pieces(texts, attrs, vocab_type)  # before the EOG texts become control

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
    eog = _eog_ids(folder, id_to_str, attrs, eos)
    eot = next((vocab[s] for s in EOT_TEXTS if s in vocab), -1)

    # Fragment encoder: same pipeline, specials are split out by Tokenizer._partition.
    hf = tokenizers.Tokenizer.from_str(hf_full.to_str())
    hf.encode_special_tokens = True
    hf.post_processor = None
    return Tokenizer(texts=texts, attrs=attrs, scores=None, vocab_type=vocab_type, hf=hf,
                     pieces=pieces, bos_id=bos, eos_id=eos, eot_id=eot, unk_id=unk, pad_id=pad,
                     eog_ids=eog, add_bos=add_bos, add_eos=add_eos,
                     add_space_prefix=_hf_prepends_space(spec), spm_escape=False,
                     clean_spaces=bool(cfg.get("clean_up_tokenization_spaces", False)),
                     chat_template=_chat_template(folder, cfg), pre=None,
                     model=f"hf-{model_type.lower()}")
