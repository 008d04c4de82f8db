"""GBNF (llama.cpp grammar format) parser and lowering to flat rules.

`parse_gbnf(text) -> Grammar` parses rules `name ::= alternatives`, with string literals,
character classes (`[a-z]`, `[^...]`), `.` (any character), grouping, `*` `+` `?` `{m}` `{m,}`
`{m,n}`, comments and rule references, and lowers every repetition and group into generated
rules so that each rule is a list of alternatives, each a sequence of elements:

  * `("char", class_id)` - one code point matching `grammar.classes[class_id]`
  * `("ref", rule_id)`  - the rule `grammar.rule_names[rule_id]`
  * `("rep", rule_id, lo, hi)` - the rule repeated lo..hi times (hi -1: unbounded): a counted
    repetition `{m,n}` with m > 1 or n > 1 is one element run by a counter in the recognizer,
    never m copies, so `x{1000000000}` costs what `x{2}` costs

Errors raise `GrammarError` naming the rule and the line/column. A grammar is refused when its
lowered form passes `MAX_GRAMMAR_ELEMENTS`, when groups nest more than `MAX_GRAMMAR_NESTING` deep,
or when an item that may be empty is repeated more than `MAX_NULLABLE_REPEAT` times. Nothing
recurses on the client's input: groups are parsed on an explicit stack, and the whole-grammar
checks (gbnf_analysis.py: left recursion, nullable rules, cycles) are worklists.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from .gbnf_analysis import check_left_recursion, find_cycle

MAX_CODEPOINT = 0x10FFFF
MAX_GRAMMAR_ELEMENTS = 250_000  # elements of the lowered grammar (about 1 per literal char)
MAX_NULLABLE_REPEAT = 64  # `x{m,n}` where x may match "" is a chain of n frames: keep n small
MAX_GRAMMAR_NESTING = 1000  # parenthesised groups inside groups (parsed on an explicit stack)


class GrammarError(ValueError):
    """A grammar (or JSON schema) that cannot be parsed or compiled."""


class GrammarTooLarge(GrammarError):
    """A grammar over tritium's own bounds (size, nesting), which llama-server does not have: the
    server answers with this message, not b1's parse failure."""


@dataclass(frozen=True)
class CharClass:
    """Sorted, merged, inclusive code point intervals; `negated` flips membership."""
    ranges: tuple[tuple[int, int], ...]
    negated: bool = False

    def matches(self, cp: int) -> bool:
        i = bisect.bisect_right(self.ranges, (cp, MAX_CODEPOINT + 1)) - 1
        inside = i >= 0 and self.ranges[i][0] <= cp <= self.ranges[i][1]
        return inside != self.negated

    def intersects(self, lo: int, hi: int) -> bool:
        """True when some code point in [lo, hi] matches."""
        if not self.negated:
            return any(a <= hi and lo <= b for a, b in self.ranges)
        # negated: fails only if [lo, hi] is fully covered by the ranges
        cur = lo
        for a, b in self.ranges:
            if b < cur:
                continue
            if a > cur:
                return True
            cur = b + 1
            if cur > hi:
                return False
        return cur <= hi


def _merge(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


Element = tuple  # ("char", class_id) | ("ref", rule_id) | ("rep", rule_id, lo, hi)


@dataclass
class Grammar:
    """Lowered grammar: rule_alts[rule_id] = list of alternatives (lists of elements)."""
    rule_names: list[str] = field(default_factory=list)
    rule_alts: list[list[list[Element]]] = field(default_factory=list)
    classes: list[CharClass] = field(default_factory=list)
    root: int = 0

    def is_recursive(self) -> bool:
        """True when some rule can reach itself other than by a tail self-call (non-regular)."""
        # a rule calling itself as the last element of an alternative (the lowered `x*`) is a
        # loop, not nesting; any other cycle may need a stack
        graph = [{e[1] for alt in alts for k, e in enumerate(alt)
                  if e[0] != "char" and not (e[0] == "ref" and e[1] == r and k == len(alt) - 1)}
                 for r, alts in enumerate(self.rule_alts)]
        return find_cycle(graph) is not None


@dataclass
class _Group:
    """One open parenthesised group (or the rule body itself) while parsing: the alternatives
    finished so far, the sequence being read, and where its last symbol starts (for `*`, `{m,n}`:
    a literal is several chars)."""
    start: int
    alts: list[list[Element]] = field(default_factory=list)
    seq: list[Element] = field(default_factory=list)
    last_start: int = 0


_NAME = re.compile(r"[A-Za-z0-9-]+")  # _is_word_char's characters


def _is_word_char(c: str) -> bool:
    # like llama.cpp: letters, digits and '-' ('_' is reserved for generated rules)
    return c.isascii() and (c.isalnum() or c == "-")


class _Parser:
    def __init__(self, text: str):
        self.src = text
        self.i = 0
        self.g = Grammar()
        self.name_ids: dict[str, int] = {}
        self.defined: set[int] = set()
        self.first_use: dict[int, tuple[int, str]] = {}  # rule id -> (pos, using rule)
        self.class_ids: dict[CharClass, int] = {}
        self.cur_rule = "?"
        self.n_elements = 0  # lowered size so far (MAX_GRAMMAR_ELEMENTS is checked while parsing)

    # --- errors and positions -------------------------------------------------------------
    def where(self, pos: int | None = None) -> str:
        pos = self.i if pos is None else pos
        line = self.src.count("\n", 0, pos) + 1
        col = pos - (self.src.rfind("\n", 0, pos) + 1) + 1
        return f"line {line}, column {col}"

    def error(self, msg: str, pos: int | None = None) -> GrammarError:
        ctx = self.src[(self.i if pos is None else pos):][:20]
        return GrammarError(f"grammar parse error in rule '{self.cur_rule}' at {self.where(pos)}: {msg} (near {ctx!r})")

    # --- helpers --------------------------------------------------------------------------
    def rule_id(self, name: str) -> int:
        if name not in self.name_ids:
            self.name_ids[name] = len(self.g.rule_names)
            self.g.rule_names.append(name)
            self.g.rule_alts.append([])
        return self.name_ids[name]

    def new_rule(self, base: str) -> int:
        k = len(self.g.rule_names)
        name = f"{base}_{k}"
        while name in self.name_ids:
            k += 1
            name = f"{base}_{k}"
        return self.rule_id(name)

    def class_id(self, cc: CharClass) -> int:
        if cc not in self.class_ids:
            self.class_ids[cc] = len(self.g.classes)
            self.g.classes.append(cc)
        return self.class_ids[cc]

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.src[j] if j < len(self.src) else ""

    def skip_space(self, newline_ok: bool) -> None:
        s = self.src
        while self.i < len(s):
            c = s[self.i]
            if c in " \t":
                self.i += 1
            elif c == "#":
                while self.i < len(s) and s[self.i] not in "\r\n":
                    self.i += 1
            elif c in "\r\n" and newline_ok:
                self.i += 1
            else:
                break

    def parse_name(self) -> str:
        m = _NAME.match(self.src, self.i)
        if m is None:
            raise self.error("expecting name")
        self.i = m.end()
        return m.group()

    def parse_int(self) -> int:
        start = self.i
        while self.peek().isdigit() and self.peek().isascii():
            self.i += 1
        if self.i == start:
            raise self.error("expecting integer")
        return int(self.src[start:self.i])

    def parse_char(self) -> int:
        """One (possibly escaped) character inside a literal or class; returns its code point."""
        c = self.peek()
        if c == "":
            raise self.error("unexpected end of input")
        if c != "\\":
            self.i += 1
            return ord(c)
        e = self.peek(1)
        simple = {"n": 10, "t": 9, "r": 13, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45, "/": 47,
                  "'": 39, "0": 0, "f": 12, "v": 11, "b": 8, "a": 7}
        if e in simple:
            self.i += 2
            return simple[e]
        n_hex = {"x": 2, "u": 4, "U": 8}.get(e)
        if n_hex is None:
            raise self.error(f"unknown escape '\\{e}'")
        digits = self.src[self.i + 2:self.i + 2 + n_hex]
        if len(digits) != n_hex or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise self.error(f"expecting {n_hex} hex digits after '\\{e}'")
        cp = int(digits, 16)
        if cp > MAX_CODEPOINT:
            raise self.error(f"code point {cp:#x} out of range")
        self.i += 2 + n_hex
        return cp

    # --- grammar structure ----------------------------------------------------------------
    def parse(self) -> Grammar:
        self.skip_space(True)
        while self.i < len(self.src):
            self.parse_rule()
            self.skip_space(True)
        self.cur_rule = "?"
        for rid, name in enumerate(self.g.rule_names):
            if rid not in self.defined and not name.startswith("\x00"):
                pos, user = self.first_use.get(rid, (0, "?"))
                self.cur_rule = user
                raise self.error(f"undefined rule identifier '{name}'", pos)
        if "root" not in self.name_ids:
            raise GrammarError("grammar does not contain a 'root' rule")
        self.g.root = self.name_ids["root"]
        check_left_recursion(self.g)
        return self.g

    def parse_rule(self) -> None:
        start = self.i
        name = self.parse_name()
        self.cur_rule = name
        self.skip_space(False)
        if not self.src.startswith("::=", self.i):
            raise self.error("expecting '::='")
        self.i += 3
        self.skip_space(True)
        rid = self.rule_id(name)
        if rid in self.defined:
            raise self.error(f"rule '{name}' defined twice", start)
        self.defined.add(rid)
        self.g.rule_alts[rid] = self.parse_alternates(name)
        self.skip_space(False)
        c = self.peek()
        if c == "\r":
            self.i += 2 if self.peek(1) == "\n" else 1
        elif c == "\n":
            self.i += 1
        elif c != "":
            raise self.error("expecting newline or end of input")

    def parse_alternates(self, name: str) -> list[list[Element]]:
        """The alternatives of a rule body, with every parenthesised group inside it lowered to a
        generated rule. Groups are parsed on an explicit stack of `_Group` frames (no recursion),
        at most `MAX_GRAMMAR_NESTING` deep."""
        groups = [_Group(self.i)]
        while True:
            grp = groups[-1]
            nested = len(groups) > 1
            self.parse_symbols(grp, name, nested)
            if self.peek() == "(":
                if len(groups) > MAX_GRAMMAR_NESTING:
                    raise GrammarTooLarge(
                        f"grammar nests too deeply in rule '{self.cur_rule}' at {self.where()}: more than "
                        f"{MAX_GRAMMAR_NESTING} groups inside groups, the limit is {MAX_GRAMMAR_NESTING} "
                        f"(MAX_GRAMMAR_NESTING)")
                self.i += 1
                self.skip_space(True)
                groups.append(_Group(self.i))
                continue
            grp.alts.append(grp.seq)
            if self.peek() == "|":
                self.i += 1
                self.skip_space(True)
                grp.seq, grp.last_start = [], 0
                continue
            self.n_elements += sum(len(a) + 1 for a in grp.alts)
            self.check_size(0)
            if not nested:
                return grp.alts
            if self.peek() != ")":
                raise self.error("expecting ')'")
            self.i += 1
            groups.pop()
            rid = self.new_rule(name)
            self.defined.add(rid)
            self.g.rule_alts[rid] = grp.alts
            outer = groups[-1]
            outer.last_start = len(outer.seq)
            outer.seq.append(("ref", rid))
            self.skip_space(len(groups) > 1)

    def check_size(self, pending: int) -> None:
        size = self.n_elements + pending
        if size > MAX_GRAMMAR_ELEMENTS:
            raise GrammarTooLarge(f"grammar too large: more than {MAX_GRAMMAR_ELEMENTS} elements after lowering "
                                 f"(at {self.where()}), the limit is {MAX_GRAMMAR_ELEMENTS} (MAX_GRAMMAR_ELEMENTS)")

    def parse_symbols(self, grp: "_Group", name: str, nested: bool) -> None:
        """Extend `grp.seq` with the symbols that follow; stops at '(' (the caller opens the group),
        or at anything that ends a sequence ('|', ')', newline, end of input, junk)."""
        seq = grp.seq
        while True:
            self.check_size(len(seq))
            c = self.peek()
            if c == '"':
                self.i += 1
                grp.last_start = len(seq)
                while self.peek() != '"':
                    if self.peek() == "":
                        raise self.error("unterminated string literal")
                    cp = self.parse_char()
                    seq.append(("char", self.class_id(CharClass(((cp, cp),)))))
                    if not len(seq) & 4095:
                        self.check_size(len(seq))
                self.i += 1
                if len(seq) == grp.last_start:  # empty literal: an empty group
                    rid = self.new_rule(name)
                    self.defined.add(rid)
                    self.g.rule_alts[rid] = [[]]
                    seq.append(("ref", rid))
                self.skip_space(nested)
            elif c == "[":
                self.i += 1
                negated = False
                if self.peek() == "^":
                    negated = True
                    self.i += 1
                ranges = []
                while self.peek() != "]":
                    if self.peek() == "":
                        raise self.error("unterminated character class")
                    lo = self.parse_char()
                    hi = lo
                    if self.peek() == "-" and self.peek(1) not in ("]", ""):
                        self.i += 1
                        hi = self.parse_char()
                        if hi < lo:
                            raise self.error("character range out of order")
                    ranges.append((lo, hi))
                self.i += 1
                grp.last_start = len(seq)
                seq.append(("char", self.class_id(CharClass(_merge(ranges), negated))))
                self.skip_space(nested)
            elif c == ".":
                self.i += 1
                grp.last_start = len(seq)
                seq.append(("char", self.class_id(CharClass((), True))))
                self.skip_space(nested)
            elif c and _is_word_char(c):
                pos = self.i
                ref = self.parse_name()
                rid = self.rule_id(ref)
                self.first_use.setdefault(rid, (pos, self.cur_rule))
                grp.last_start = len(seq)
                seq.append(("ref", rid))
                self.skip_space(nested)
            elif c in ("*", "+", "?"):
                if not seq:
                    raise self.error(f"expecting preceding item to '{c}'")
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                self.repeat(seq, grp.last_start, name, lo, hi)
                self.skip_space(nested)
            elif c == "{":
                if not seq:
                    raise self.error("expecting preceding item to '{'")
                self.i += 1
                self.skip_space(False)
                lo = self.parse_int()
                self.skip_space(False)
                hi: int | None = lo
                if self.peek() == ",":
                    self.i += 1
                    self.skip_space(False)
                    hi = self.parse_int() if self.peek().isdigit() else None
                    self.skip_space(False)
                if self.peek() != "}":
                    raise self.error("expecting '}'")
                self.i += 1
                if hi is not None and hi < lo:
                    raise self.error(f"repetition {{{lo},{hi}}} has max < min")
                self.repeat(seq, grp.last_start, name, lo, hi)
                self.skip_space(nested)
            else:
                return  # '(' included: parse_alternates pushes the group

    def repeat(self, seq: list[Element], last_start: int, name: str, lo: int, hi: int | None) -> None:
        """Replace seq[last_start:] (the last symbol) by its repetition {lo, hi} (hi None = inf)."""
        item = seq[last_start:]
        del seq[last_start:]
        if len(item) != 1 or (item[0][0] != "ref" and (lo > 1 or (hi or 0) > 1)):
            # a multi-char literal, or the item of a counter: wrap it in a rule
            rid = self.new_rule(name)
            self.defined.add(rid)
            self.g.rule_alts[rid] = [item]
            item = [("ref", rid)]
        if lo > 1 or (hi is not None and hi > 1):
            seq.append(("rep", item[0][1], lo, -1 if hi is None else hi))
            return
        seq.extend(item * lo)
        if hi is None:
            # star ::= item star | ""   (right recursion: constant stack depth, tail call)
            rid = self.new_rule(name)
            self.defined.add(rid)
            self.g.rule_alts[rid] = [item + [("ref", rid)], []]
            seq.append(("ref", rid))
        elif hi > lo:  # hi == 1, lo == 0: opt ::= item | ""
            rid = self.new_rule(name)
            self.defined.add(rid)
            self.g.rule_alts[rid] = [item, []]
            seq.append(("ref", rid))


def _grammar_size(g: Grammar) -> int:
    return sum(len(alt) + 1 for alts in g.rule_alts for alt in alts)


def parse_gbnf(text: str) -> Grammar:
    """Parse GBNF text; raises GrammarError with rule name and line/column on bad input."""
    if not isinstance(text, str):
        raise GrammarError("grammar must be a string")
    g = _Parser(text).parse()
    size = _grammar_size(g)
    if size > MAX_GRAMMAR_ELEMENTS:
        raise GrammarTooLarge(f"grammar too large: {size} elements after lowering, the limit is "
                              f"{MAX_GRAMMAR_ELEMENTS} (MAX_GRAMMAR_ELEMENTS)")
    return g
