"""When a generation stops, and the text it has produced so far.

- `TextState`: detokenized text of a generation with UTF-8 completion, stop strings held back
  until they can no longer match, and llama.cpp's `n_indent` rule;
- `StopType` and `check_stop`: the stop rules applied after each sampled token (stop word,
  context end, n_predict, indentation, time limit, end of generation), in llama.cpp's order;
- `effective_n_predict`: a request's token limit under the server's `-n`.
"""
from __future__ import annotations

import codecs
import enum
import time

from runtime.serving.stop_match import StopMatcher, StopScan


class StopType(enum.Enum):
    """Why a generation ended; `.value` is llama-server's `stop_type` string."""
    NONE = "none"
    EOS = "eos"
    LIMIT = "limit"
    WORD = "word"


def effective_n_predict(requested: int, server_limit: int) -> int:
    """The request's n_predict; the server's -n only when the request leaves it at -1 (llama-server
    b1-0c1e570: `n_predict_max = task n_predict != -1 ? task n_predict : params_base.n_predict`, no cap)."""
    return requested if requested != -1 else server_limit


def check_stop(text: "TextState", stop_word: str | None, is_eog: bool, *, n_cached: int, n_ctx: int,
               n_decoded: int, n_predict: int, n_indent: int, t_max_ms: int,
               t_prompt_done: float) -> tuple[StopType | None, bool]:
    """After a token was sampled and pushed to `text`: (why to stop, or None; whether the context
    ran out). `n_cached` is the number of tokens in the slot's cache; the sampled token would be one
    more. The indentation rule may cut `text`; it and the time limit only apply when nothing else
    stopped the generation; end of generation wins over every other reason."""
    stop: StopType | None = None
    truncated = False
    if stop_word is not None:
        stop = StopType.WORD
    if n_ctx > 0 and n_cached + 1 >= n_ctx:  # (n_ctx 0: --context-shift makes room instead)
        truncated = True
        stop = StopType.LIMIT
    if stop is None and 0 <= n_predict <= n_decoded:
        stop = StopType.LIMIT
    if stop is None and text.indent_stop(n_indent):
        stop = StopType.LIMIT
    if stop is None and t_max_ms > 0 and text.has_new_line and \
            (time.perf_counter() - t_prompt_done) * 1e3 > t_max_ms:
        stop = StopType.LIMIT  # llama.cpp's time limit: applies once a new line was generated
    if is_eog:
        stop = StopType.EOS
    return stop, truncated


class TextState:
    """Accumulates token pieces into text, holding back incomplete UTF-8 sequences and text that
    may be the start of a stop string (as llama.cpp's process_token does)."""

    def __init__(self, stop: list[str] | StopMatcher, tokenizer=None):
        self.matcher = stop if isinstance(stop, StopMatcher) else StopMatcher([w for w in (stop or []) if w])
        self._scan = StopScan(self.matcher)
        self.text = ""
        self.n_sent = 0
        self.stopping_word = ""
        self.has_new_line = False
        self._last_nl = 0  # start of the line after the last newline seen by indent_stop
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")
        self.incomplete = False  # the last token left an incomplete UTF-8 character at the end

    @property
    def stop(self) -> list[str]:
        return list(self.matcher.order)

    def push(self, piece: bytes, is_eog: bool = False) -> tuple[str | None, str]:
        """Add one token's bytes; returns (stop word if one completed, text to send now). The stop
        strings are matched by `StopMatcher` (work bounded by the new text, not by the number of
        stop strings): the earliest full match in the unsent text cuts it; a proper prefix of a
        stop string at its end holds it back."""
        new = self._dec.decode(piece)
        self.text += new
        if "\n" in new:
            self.has_new_line = True
        self.incomplete = bool(self._dec.getstate()[0])
        if self.incomplete:
            return None, ""  # incomplete UTF-8 character at the end
        if self.matcher:
            best = self.matcher.earliest(self._scan.feed(self.text), self.n_sent)
            if best is not None:  # a complete stop string: cut the text there
                self.text = self.text[:best[0]]
                self.stopping_word = best[1]
                delta = self.text[self.n_sent:]
                self.n_sent = len(self.text)
                return best[1], delta
            if not is_eog and self.matcher.holds_partial(self.text, self._scan.depth, self.n_sent):
                return None, ""  # a partial stop string at the end: hold the text back
        delta = self.text[self.n_sent:]
        self.n_sent = len(self.text)
        return None, delta

    def indent_stop(self, n_indent: int) -> bool:
        """llama.cpp's `n_indent` rule: once a line has started after a newline, stop (and cut the
        line's text) when its indentation is shorter than `n_indent`."""
        if n_indent <= 0 or not self.has_new_line:
            return False
        if self._last_nl > 0:
            pos = self._last_nl
            while pos < len(self.text) and self.text[pos] in " \t":
                pos += 1
            if pos < len(self.text) and pos - self._last_nl < n_indent:
                self.text = self.text[:pos]
                self.n_sent = min(self.n_sent, len(self.text))
                return True
        nl = self.text.find("\n", self._last_nl)
        if nl >= 0:
            self._last_nl = nl + 1
        return False

    def final(self) -> str:
        rest = self._dec.decode(b"", final=True)
        if rest and not self.stopping_word:
            self.text += rest
        return self.text

