#!/usr/bin/env python3
"""The client side of a benchmark stream, shared by scripts/bench.py and scripts/locustfile.py:
an incremental SSE parser, one streamed /completion request's measurements (`CompletionStream`,
`RequestResult`) and the check of an OpenAI chat stream's shape. Standard library only.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

# ----------------------------------------------------------------------------- SSE parsing
class SSEParser:
    """Incremental server-sent-events parser (WHATWG rules, the parts servers use).

    ``feed(bytes)`` returns the ``data`` payloads of the events completed by that chunk.
    Comment lines (``:`` ping), ``event:``/``id:``/``retry:`` fields are ignored; several
    ``data:`` lines of one event are joined with ``\\n``; CRLF, CR and LF all end a line.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += chunk
        out: list[str] = []
        while True:
            idx = _find_line_end(self._buf)
            if idx is None:
                break
            end, nxt = idx
            line = self._buf[:end].decode("utf-8")
            self._buf = self._buf[nxt:]
            ev = self._line(line)
            if ev is not None:
                out.append(ev)
        return out

    def close(self) -> list[str]:
        """End of stream: a final unterminated event is dispatched (lenient)."""
        out = self.feed(b"\n\n") if self._buf else []
        if self._data:
            out.append("\n".join(self._data))
            self._data = []
        return out

    def _line(self, line: str) -> str | None:
        if line == "":
            if not self._data:
                return None
            ev = "\n".join(self._data)
            self._data = []
            return ev
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        return None


def _find_line_end(buf: bytes) -> tuple[int, int] | None:
    """(end of line, start of next line) for the first complete line in buf, else None.

    A trailing lone CR is not treated as complete: it may be the first half of CRLF.
    """
    lf, cr = buf.find(b"\n"), buf.find(b"\r")
    if cr == -1 or (lf != -1 and lf < cr):
        return None if lf == -1 else (lf, lf + 1)
    if cr + 1 == len(buf):
        return None
    return (cr, cr + 2) if buf[cr + 1] == 0x0A else (cr, cr + 1)


# ----------------------------------------------------------------------------- results
@dataclass
class RequestResult:
    """One streamed request. Times are time.perf_counter() seconds."""
    ok: bool
    error: str = ""
    t_start: float = 0.0
    t_first: float | None = None     # first chunk carrying a token
    t_last: float | None = None      # last chunk carrying a token
    t_end: float = 0.0
    n_gen: int = 0                   # generated tokens (server count when given)
    n_prompt: int = 0                # prompt tokens the server evaluated (0 when not reported)
    n_predict: int = 0               # tokens asked for

    @property
    def ttft_s(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_start

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Decode steps (tokens - 1) per second after the first token."""
        if self.t_first is None or self.t_last is None or self.n_gen < 2:
            return None
        dt = self.t_last - self.t_first
        return (self.n_gen - 1) / dt if dt > 0 else None


class StreamError(Exception):
    pass


@dataclass
class CompletionStream:
    """Folds the events of one streamed /completion response into token counts/times."""
    n_chunk_tokens: int = 0
    n_server_tokens: int | None = None
    n_prompt: int = 0
    t_first: float | None = None
    t_last: float | None = None
    stopped: bool = False
    done: bool = False

    def on_event(self, data: str, now: float) -> None:
        if data == "[DONE]":
            if not self.stopped:
                raise StreamError("[DONE] before a chunk with stop=true")
            self.done = True
            return
        if self.done:
            raise StreamError("event after [DONE]")
        try:
            obj = json.loads(data)
        except json.JSONDecodeError as e:
            raise StreamError(f"malformed JSON event: {data[:80]!r}") from e
        if not isinstance(obj, dict):
            raise StreamError(f"event is not an object: {data[:80]!r}")
        if "error" in obj:
            raise StreamError(f"server error event: {json.dumps(obj['error'])[:200]}")
        if self.stopped:
            raise StreamError("event after the stop chunk")
        toks = obj.get("tokens")
        n = len(toks) if isinstance(toks, list) and toks else (1 if obj.get("content") else 0)
        if n:
            self.n_chunk_tokens += n
            if self.t_first is None:
                self.t_first = now
            self.t_last = now
        if obj.get("stop") is True:
            self.stopped = True
            timings = obj.get("timings") or {}
            pred = obj.get("tokens_predicted", timings.get("predicted_n"))
            if isinstance(pred, int):
                self.n_server_tokens = pred
            ev = obj.get("tokens_evaluated")
            if not isinstance(ev, int):
                ev = int(timings.get("prompt_n", 0)) + int(timings.get("cache_n", 0))
            self.n_prompt = ev
        elif "stop" not in obj:
            raise StreamError(f"chunk without 'stop' field: {data[:80]!r}")

    @property
    def n_gen(self) -> int:
        return self.n_server_tokens if self.n_server_tokens is not None else self.n_chunk_tokens


def check_chat_stream(events: list[str]) -> int:
    """Validate the data payloads of a streamed chat completion; returns content chunks seen.

    Raises StreamError unless: every event before the last is a JSON chunk without "error",
    some chunk carries a finish_reason, and the last event is [DONE].
    """
    finished = False
    n_content = 0
    for i, data in enumerate(events):
        if data == "[DONE]":
            if i != len(events) - 1:
                raise StreamError("[DONE] before the end of the stream")
            continue
        try:
            obj = json.loads(data)
        except json.JSONDecodeError as e:
            raise StreamError(f"malformed JSON event: {data[:80]!r}") from e
        if not isinstance(obj, dict) or "error" in obj:
            raise StreamError(f"error event: {data[:200]}")
        if obj.get("object") != "chat.completion.chunk":
            raise StreamError(f"unexpected object {obj.get('object')!r}")
        for choice in obj.get("choices") or []:
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                raise StreamError("choice without delta")
            if delta.get("content"):
                n_content += 1
            if choice.get("finish_reason"):
                finished = True
    if not finished:
        raise StreamError("no chunk carried a finish_reason")
    if events[-1] != "[DONE]":
        raise StreamError("stream did not end with data: [DONE]")
    return n_content
