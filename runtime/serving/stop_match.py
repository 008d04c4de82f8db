"""Stop strings (and lazy-grammar trigger words) found with work bounded by the new text.

llama.cpp's process_token checks every stop string against the text's tail after each token
(find_stopping_strings: a full match starting at the earliest position, or a partial one at the
end that holds the text back): (number of stop strings) x (tail) per token, which one request
with 200,000 stop strings turns into the engine thread's main cost. `StopMatcher` gives the same
answers from the state of an automaton: `depth`, the length of the longest suffix of the text
scanned so far that is a prefix of some word. Each new character can only extend a suffix that
was such a prefix, so the next depth is the longest of depth + 1, depth, ... that still is one
(a prefix test is a bisection in the sorted words), and a full match ending at that character is
one of the words of those lengths (a set lookup each). Building it (a sort of the words) is done
once per request, off the engine thread for long lists (`Engine.submit`).
"""
from __future__ import annotations

import bisect


class StopMatcher:
    """The words of one request; immutable (shared by the request's `n` children)."""

    def __init__(self, words: list[str]):
        self.order: dict[str, int] = {}
        for i, w in enumerate(words):
            if w and w not in self.order:
                self.order[w] = i  # list order breaks ties between matches at one position
        self.words = sorted(self.order)
        self.lengths = sorted({len(w) for w in self.words})
        self.max_len = self.lengths[-1] if self.lengths else 0

    def __bool__(self) -> bool:
        return bool(self.words)

    def is_prefix(self, s: str) -> bool:
        """s is a prefix of some word (the words starting with s follow s in sorted order)."""
        i = bisect.bisect_left(self.words, s)
        return i < len(self.words) and self.words[i].startswith(s)

    def is_proper_prefix(self, s: str) -> bool:
        """s is a prefix of some longer word."""
        i = bisect.bisect_left(self.words, s)
        if i < len(self.words) and self.words[i] == s:
            i += 1
        return i < len(self.words) and self.words[i].startswith(s)

    def scan(self, text: str, start: int, depth: int) -> tuple[int, list[tuple[int, str]]]:
        """Feed text[start:] (depth: the state at `start`): the state at the end and the full
        matches (start position, word) that end after `start`."""
        found: list[tuple[int, str]] = []
        if not self.words:
            return 0, found
        order = self.order
        for end in range(start + 1, len(text) + 1):
            n = min(depth + 1, self.max_len, end)
            while n > 0 and not self.is_prefix(text[end - n:end]):
                n -= 1
            depth = n
            if depth:
                for L in self.lengths:
                    if L > depth:
                        break
                    w = text[end - L:end]
                    if w in order:
                        found.append((end - L, w))
        return depth, found

    def earliest(self, found: list[tuple[int, str]], min_start: int = 0) -> tuple[int, str] | None:
        """The match starting first (at or after min_start); ties go to the word listed first."""
        best = None
        for pos, w in found:
            if pos >= min_start and (best is None or (pos, self.order[w]) < (best[0], self.order[best[1]])):
                best = (pos, w)
        return best

    def holds_partial(self, text: str, depth: int, min_start: int) -> bool:
        """Does text end with a proper prefix of some word that starts at or after min_start?"""
        for n in range(min(depth, len(text) - min_start), 0, -1):
            if self.is_proper_prefix(text[len(text) - n:]):
                return True
        return False


class StopScan:
    """A running scan of one text by a matcher: what was scanned and the automaton's state."""

    def __init__(self, matcher: StopMatcher):
        self.matcher, self.scanned, self.depth = matcher, 0, 0

    def feed(self, text: str) -> list[tuple[int, str]]:
        """Scan what was added to text since the last call; the full matches that end in it."""
        if self.scanned > len(text):  # the text was cut: scan again from its start
            self.scanned, self.depth = 0, 0
        self.depth, found = self.matcher.scan(text, self.scanned, self.depth)
        self.scanned = len(text)
        return found
