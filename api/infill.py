"""`POST /infill`: llama-server's fill-in-the-middle prompt layout (format_infill in
tools/server), built from token ids; the request then runs like `/completion`.

    [FIM_REP]myproject\\n [FIM_SEP]filename0\\n chunk0 ... [FIM_SEP]filename\\n
    [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID]

The prefix keeps its last 3/4 of a batch, the suffix what remains of the first quarter, and extra
chunks fill the context up to n_ctx - n_batch - 2 n_predict tokens, as llama-server does.
"""
from __future__ import annotations

from typing import Any

from api.errors import ApiError, json_type_name, not_supported

_CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"


def check_model(fim_ids: dict[str, int]) -> None:
    missing = "".join(msg for key, msg in (("pre", "prefix token is missing. "), ("suf", "suffix token is missing. "),
                                            ("mid", "middle token is missing. ")) if fim_ids.get(key, -1) < 0)
    if missing:
        raise not_supported(f"Infill is not supported by this model: {missing}")


def parse_extra(body: dict[str, Any]) -> list[tuple[str, str]]:
    """`input_extra`: a list of {"filename": str, "text": str} -> [(filename, text)], with b1's
    400s (a present input_extra that is not an array, null included, and each bad chunk)."""
    if "input_extra" not in body:
        return []
    extra = body["input_extra"]
    if not isinstance(extra, list):
        raise ApiError('"input_extra" must be an array of {"filename": string, "text": string}')
    out = []
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ApiError('extra_context chunk must contain a "text" field with a string value')
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise ApiError('extra_context chunk\'s "filename" field must be a string')
        out.append((chunk.get("filename", "tmp"), chunk["text"]))
    return out


def prefix_and_suffix(body: dict[str, Any]) -> tuple[str, str]:
    """`input_prefix` and `input_suffix` as b1 ends up reading them: its 400s for a missing one are
    overwritten (no return), so the read that follows answers 500 (the suffix read first, GCC's
    argument order), as does a value that is not a string."""
    for key in ("input_suffix", "input_prefix"):
        if key not in body:
            raise ApiError(f"[json.exception.out_of_range.403] key '{key}' not found", "server_error", 500)
    for key in ("input_suffix", "input_prefix"):
        if not isinstance(body[key], str):
            raise ApiError(f"[json.exception.type_error.302] type must be string, but is {json_type_name(body[key])}",
                           "server_error", 500)
    return body["input_prefix"], body["input_suffix"]


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
