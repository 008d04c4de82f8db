"""Integer bounds of a JSON schema -> digit-by-digit GBNF (llama.cpp's `_build_min_max_int`)."""
from __future__ import annotations

import math
from typing import Any

from .gbnf import GrammarError


class IntRange:
    """Digit-by-digit GBNF for integers in [lo, hi] (either bound may be None)."""

    def __init__(self) -> None:
        self.out: list[str] = []

    def digits(self, a: str, b: str) -> None:
        self.out.append(f"[{a}]" if a == b else f"[{a}-{b}]")

    def more(self, lo: int, hi: int | None) -> None:
        self.out.append("[0-9]")
        if lo == hi == 1:
            return
        self.out.append("{" + str(lo))
        if hi != lo:
            self.out.append("," + ("" if hi is None else str(hi)))
        self.out.append("}")

    def same_length(self, a: str, b: str) -> None:
        """Numbers with len(a) == len(b) digits between a and b."""
        i = 0
        while i < len(a) and a[i] == b[i]:
            i += 1
        if i:
            self.out.append(f'"{a[:i]}"')
        if i == len(a):
            return
        if i:
            self.out.append(" ")
        rest = len(a) - i - 1
        if rest == 0:
            self.out.append(f"[{a[i]}-{b[i]}]")
            return
        a_sub, b_sub = a[i + 1:], b[i + 1:]
        zeros, nines = "0" * rest, "9" * rest
        done = False
        self.out.append("(")
        if a_sub == zeros:
            self.digits(a[i], chr(ord(b[i]) - 1))
            self.out.append(" ")
            self.more(rest, rest)
        else:
            self.out.append(f"[{a[i]}] (")
            self.same_length(a_sub, nines)
            self.out.append(")")
            if ord(a[i]) < ord(b[i]) - 1:
                self.out.append(" | ")
                if b_sub == nines:
                    self.digits(chr(ord(a[i]) + 1), b[i])
                    done = True
                else:
                    self.digits(chr(ord(a[i]) + 1), chr(ord(b[i]) - 1))
                self.out.append(" ")
                self.more(rest, rest)
        if not done:
            self.out.append(" | ")
            self.digits(b[i], b[i])
            self.out.append(" ")
            self.same_length(zeros, b_sub)
        self.out.append(")")

    def build(self, lo: int | None, hi: int | None, left: int = 16, top: bool = True) -> None:
        out = self.out
        if lo is not None and hi is not None:
            if lo < 0 and hi < 0:
                out.append('"-" (')
                self.build(-hi, -lo, left, True)
                out.append(")")
                return
            if lo < 0:
                out.append('"-" (')
                self.build(0, -lo, left, True)
                out.append(") | ")
                lo = 0
            a, b = str(lo), str(hi)
            for n in range(len(a), len(b)):
                self.same_length(a, "9" * n)
                a = "1" + "0" * n
                out.append(" | ")
            self.same_length(a, b)
            return
        fewer = max(left - 1, 1)
        if lo is not None:
            if lo < 0:
                out.append('"-" (')
                self.build(None, -lo, left, False)
                out.append(") | [0] | [1-9] ")
                self.more(0, left - 1)
            elif lo == 0:
                if top:
                    out.append("[0] | [1-9] ")
                    self.more(0, fewer)
                else:
                    self.more(1, left)
            elif lo <= 9:
                c = str(lo)
                start = "1" if top else "0"
                if c > start:
                    self.digits(start, chr(ord(c) - 1))
                    out.append(" ")
                    self.more(1, fewer)
                    out.append(" | ")
                self.digits(c, "9")
                out.append(" ")
                self.more(0, fewer)
            else:
                s = str(lo)
                c = s[0]
                if c > "1":
                    self.digits("1" if top else "0", chr(ord(c) - 1))
                    out.append(" ")
                    self.more(len(s), fewer)
                    out.append(" | ")
                self.digits(c, c)
                out.append(" (")
                self.build(int(s[1:]), None, fewer, False)
                out.append(")")
                if c < "9":
                    out.append(" | ")
                    self.digits(chr(ord(c) + 1), "9")
                    out.append(" ")
                    self.more(len(s) - 1, fewer)
            return
        if hi is not None:
            if hi >= 0:
                if top:
                    out.append('"-" [1-9] ')
                    self.more(0, fewer)
                    out.append(" | ")
                self.build(0, hi, left, True)
            else:
                out.append('"-" (')
                self.build(-hi, None, left, False)
                out.append(")")
            return
        raise GrammarError("integer range needs a minimum or a maximum")


def int_bound(v: Any, up: bool) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise GrammarError(f"integer bound must be a number, got {v!r}")
    if isinstance(v, float) and not v.is_integer():
        return math.ceil(v) if up else math.floor(v)
    return int(v)
