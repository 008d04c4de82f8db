"""Stop strings matched with work bounded by the new text (runtime/serving/stop_match.py) give
exactly the answers of llama.cpp's per-token check over every stop string (find_stopping_strings,
kept here as the reference): the same cut, the same stopping word, the same held-back text."""
from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.serving.stop_match import StopMatcher, StopScan
from runtime.serving.stopping import TextState


class ReferenceText:
    """The previous TextState.push: every stop string against the unsent tail, each token."""

    def __init__(self, stop):
        self.stop = [w for w in stop if w]
        self.text, self.n_sent, self.stopping_word = "", 0, ""

    def push(self, new: str, is_eog: bool = False):
        self.text += new
        pos = self.n_sent
        tail = self.text[pos:]
        best = None
        for w in self.stop:
            start = max(0, len(tail) - len(new) - len(w))
            i = tail.find(w, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, w)
        if best is not None:
            self.text = self.text[: pos + best[0]]
            self.stopping_word = best[1]
            delta = self.text[self.n_sent:]
            self.n_sent = len(self.text)
            return best[1], delta
        if not is_eog:
            for w in self.stop:
                for k in range(min(len(w) - 1, len(tail)), 0, -1):
                    if tail.endswith(w[:k]):
                        return None, ""
        delta = self.text[self.n_sent:]
        self.n_sent = len(self.text)
        return None, delta


ALPHA = st.text(alphabet="abc\n", min_size=0, max_size=4)


@settings(max_examples=400, deadline=None)
@given(stops=st.lists(st.text(alphabet="abc\n", min_size=0, max_size=5), max_size=6),
       pieces=st.lists(ALPHA, min_size=1, max_size=30), eog_last=st.booleans())
def test_same_answers_as_the_per_stop_string_check(stops, pieces, eog_last):
    ref, new = ReferenceText(stops), TextState(stops)
    for i, piece in enumerate(pieces):
        eog = eog_last and i == len(pieces) - 1
        want = ref.push(piece, eog)
        got = new.push(piece.encode(), eog)
        assert got == want, (stops, pieces[: i + 1])
        assert new.text == ref.text
        if want[0] is not None:
            assert new.stopping_word == ref.stopping_word
            break


def test_lazy_trigger_scan_finds_the_earliest_word():
    scan = StopScan(StopMatcher(["<tool_call>", "call>", "[TOOL"]))
    text = ""
    for piece in ["Sure: <to", "ol_ca", "ll> {"]:
        text += piece
        found = scan.feed(text)
    assert min(found) == (6, "<tool_call>")


def test_work_per_token_does_not_grow_with_the_number_of_stop_strings():
    """200,000 stop strings cost a token about what 2 do (the previous check took ~35x)."""
    words = [f"zq{i:06d}xj" for i in range(200_000)]
    pieces = ["The quick brown fox jumps over the lazy dog. "[i % 44] for i in range(2000)]

    def run(stops) -> float:
        ts = TextState(StopMatcher(stops))
        t0 = time.perf_counter()
        for p in pieces:
            ts.push(p.encode())
        return time.perf_counter() - t0
    few, many = min(run(words[:2]) for _ in range(3)), min(run(words) for _ in range(3))
    assert many < 3 * few + 0.01, (few, many)
