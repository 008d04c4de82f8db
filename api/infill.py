"""`POST /infill`: llama-server's fill-in-the-middle prompt layout (format_infill in
tools/server), built from token ids; the request then runs like `/completion`.

    [FIM_REP]myproject\\n [FIM_SEP]filename0\\n chunk0 ... [FIM_SEP]filename\\n
    [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID]

The prefix keeps its last 3/4 of a batch, the suffix what remains of the first quarter, and extra
chunks fill the context up to n_ctx - n_batch - 2 n_predict tokens, as llama-server does.
"""
from __future__ import annotations

from typing import Any

from api.errors import ApiError, not_supported

_CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"


def check_model(fim_ids: dict[str, int]) -> None:
    missing = "".join(msg for key, msg in (("pre", "prefix token is missing. "), ("suf", "suffix token is missing. "),
                                            ("mid", "middle token is missing. ")) if fim_ids.get(key, -1) < 0)
    if missing:
        raise not_supported(f"Infill is not supported by this model: {missing}")


def parse_extra(extra: Any) -> list[tuple[str, str]]:
    """`input_extra`: a list of {"filename": str, "text": str} -> [(filename, text)]."""
    if extra is None:
        return []
    msg = '"input_extra" must be an array of {"filename": string, "text": string}'
    if not isinstance(extra, list):
        raise ApiError(msg)
    out = []
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str) or \
                not isinstance(chunk.get("filename", "tmp"), str):
            raise ApiError(msg)
        out.append((chunk.get("filename", "tmp"), chunk["text"]))
    return out


def format_infill(tok: Any, prefix: str, suffix: str, extra: list[tuple[str, str]], prompt_tokens: list[int],
                  n_batch: int, n_predict: int, n_ctx: int, spm_infill: bool = False) -> list[int]:
    fim = tok.fim_ids

    def enc(text: str) -> list[int]:
        return list(tok.encode(text, add_special=False, parse_special=False))

    extra_tokens: list[int] = []
    if fim.get("rep", -1) >= 0:
        extra_tokens += [fim["rep"], *enc("myproject\n")]
    for filename, text in extra:
        if fim.get("sep", -1) >= 0:
            extra_tokens += [fim["sep"], *enc(filename + "\n")]
        else:
            extra_tokens += enc(_CHUNK_SEPARATOR)
        extra_tokens += enc(text)
    if fim.get("sep", -1) >= 0:
        extra_tokens += [fim["sep"], *enc("filename\n")]

    tokens_prefix, tokens_suffix = enc(prefix), enc(suffix)
    n_prefix_take = min(len(tokens_prefix), 3 * (n_batch // 4))
    n_suffix_take = min(len(tokens_suffix), max(0, n_batch // 4 - (2 + len(prompt_tokens))))
    n_extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))

    pre = [fim["pre"], *tokens_prefix[len(tokens_prefix) - n_prefix_take:], *prompt_tokens]
    suf = [fim["suf"], *tokens_suffix[:n_suffix_take]]
    inp, end = (suf, pre) if spm_infill else (pre, suf)
    if tok.add_bos and tok.bos_id is not None and tok.bos_id >= 0:
        inp = [tok.bos_id, *inp]
    if n_extra_take:
        inp = extra_tokens[len(extra_tokens) - n_extra_take:] + inp
    return inp + end + [fim["mid"]]
