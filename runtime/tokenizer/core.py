"""The Tokenizer: llama.cpp's tokenize / detokenize semantics over a `tokenizers` fragment encoder.

Built by `from_gguf.tokenizer_from_gguf_metadata` or `from_hf.tokenizer_from_hf_folder` (use
`runtime.tokenizer.load_tokenizer`). What follows llama.cpp (`src/llama-vocab.cpp`):
- special tokens: control / unknown tokens are matched in the text only with `parse_special`,
  user-defined ones always; longest token text first (`tokenizer_st_partition`), with the
  lstrip/rstrip attributes llama.cpp sets (phi-3).
- SPM: spaces -> U+2581 and a space prefix for every text fragment that is first or follows a
  special token, done here before the fragment encoder.
- add_bos / add_eos with `encode(add_special=True)`; EOG ids (`eot_ids`).
- `piece(id)` is `token_to_piece(id, special=True)`; `decode(ids)` concatenates pieces and, like
  `llama_detokenize`, drops the leading space of the first piece for SPM vocabs.
- `IncrementalDecoder` turns a stream of ids into text without splitting UTF-8 characters.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import tokenizers

from runtime.tokenizer.vocab import (ATTR_CONTROL, ATTR_LSTRIP, ATTR_RSTRIP, ATTR_SPECIAL, ATTR_UNKNOWN,
                                     FIM_TEXTS, SPACE_ESC, VOCAB_TYPE_BPE, VOCAB_TYPE_SPM, VOCAB_TYPE_UGM,
                                     attr_to_type)

__all__ = ["Tokenizer", "IncrementalDecoder"]

_GIL_FREE_CHARS = 1 << 16  # fragments longer than this are encoded with the GIL released


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
        #                                  (or its from_gguf.EncoderRecipe until build_encoder)
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
        self.fim_ids: dict[str, int] = {k: -1 for k in FIM_TEXTS}  # fill-in-the-middle tokens
        type_of = {a: attr_to_type(a) for a in set(attrs)}  # a handful of distinct attribute sets
        self._types = [type_of[a] for a in attrs]
        self._control_ids = frozenset(i for i, a in enumerate(attrs) if a & ATTR_CONTROL)

        specials = []
        for tid, a in enumerate(attrs):
            if a & ATTR_SPECIAL:
                txt = texts[tid].decode("utf-8", errors="replace") or f"[EMPTY_{tid}]"
                specials.append(_Special(tid, txt, bool(a & ATTR_LSTRIP), bool(a & ATTR_RSTRIP),
                                         bool(a & (ATTR_CONTROL | ATTR_UNKNOWN))))
        specials.sort(key=lambda s: -len(texts[s.id]))  # stable: longest text first
        self._specials_all = tuple(specials)
        self._specials_user = tuple(s for s in specials if not s.parse_only)
        self._special_firsts = frozenset(s.text[0] for s in specials)

    def build_encoder(self) -> Tokenizer:
        """Make the fragment encoder of a Tokenizer built with `build_encoder=False` (or
        unpickled); returns self."""
        if not isinstance(self._hf, tokenizers.Tokenizer):
            self._hf = self._hf.build()
        return self

    def __getstate__(self) -> dict:
        """Pickled before its encoder is built (a forked start-up sends it to the server, which
        builds the encoder: `tokenizers` objects pickle as JSON, slower to read than to build)."""
        if isinstance(self._hf, tokenizers.Tokenizer):
            raise TypeError("a Tokenizer pickles only before build_encoder "
                            "(tokenizer_from_gguf_metadata(md, build_encoder=False))")
        return {**self.__dict__, "_token_to_id": None}  # rebuilt on first use

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
                    raw.append(frag.replace(" ", SPACE_ESC))
                    prev_special = False
        else:
            raw = [f for f in frags if isinstance(f, str)]
        encode = self._hf.encode
        k = 0
        for frag in frags:
            if isinstance(frag, int):
                out.append(frag)
            elif len(raw[k]) > _GIL_FREE_CHARS:
                # encode_batch releases the GIL (encode does not): a huge prompt tokenized in a
                # worker thread must not stop the server's event loop for seconds
                out.extend(self._hf.encode_batch([raw[k]], add_special_tokens=False)[0].ids)
                k += 1
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

