"""JSON-schema string `pattern` (a regex) -> a GBNF rule, and the repetition text helper.

llama.cpp's `_visit_pattern` (common/json-schema-to-grammar.cpp): literals are merged, `.` is
`[^\\x0A\\x0D]`, groups become rules, `{m,n}` becomes GBNF `{m,n}` (compiled to a counter by
gbnf.py, never m copies). `conv` is the converter whose rule table receives the rules.
"""
from __future__ import annotations

from .gbnf import MAX_GRAMMAR_NESTING, GrammarError, GrammarTooLarge

# a group of the regex becomes a group of the GBNF rule: the same bound as gbnf.py's
MAX_PATTERN_NESTING = MAX_GRAMMAR_NESTING - 2

DOT = "[^\\x0A\\x0D]"
_NON_LITERAL = set("|.()[]{}*+?")
_REGEX_ONLY_ESCAPES = set("^$.[]()|{}*+?")


def repeat_text(item: str, lo: int, hi: int | None, sep: str = "") -> str:
    """`item` repeated lo..hi times (hi None: unbounded), optionally separated by `sep`."""
    if hi == 0:
        return ""
    if lo == 0 and hi == 1:
        return f"{item}?"
    if not sep:
        if lo == 1 and hi is None:
            return f"{item}+"
        if lo == 0 and hi is None:
            return f"{item}*"
        return f"{item}{{{lo},{'' if hi is None else hi}}}"
    body = item + " " + repeat_text(f"({sep} {item})", max(lo - 1, 0), None if hi is None else hi - 1)
    return f"({body})?" if lo == 0 else body


def pattern_rule(conv, pattern: str, name: str) -> str:
    """Translate a JSON-schema regex (unanchored unless ^/$ given) into a GBNF rule."""
    pattern = pattern[1:] if pattern.startswith("^") else ".*" + pattern
    pattern = pattern[:-1] if pattern.endswith("$") else pattern + ".*"
    sub_ids: dict[str, str] = {}
    n = len(pattern)
    pos = 0

    def to_rule(item: tuple[str, bool]) -> str:
        return f'"{item[0]}"' if item[1] else item[0]

    def dot() -> str:
        return conv.add_rule("dot", DOT)

    def joined(seq: list[tuple[str, bool]]) -> tuple[str, bool]:
        merged: list[tuple[str, bool]] = []
        for item in seq:
            if item[1] and merged and merged[-1][1]:
                merged[-1] = (merged[-1][0] + item[0], True)
            else:
                merged.append(item)
        if len(merged) == 1:
            return merged[0]
        return " ".join(to_rule(x) for x in seq), False

    def sequence() -> tuple[str, bool]:
        """The whole pattern; open groups are an explicit stack of sequences (no recursion), at
        most MAX_PATTERN_NESTING deep; a group still open at the end closes there, as in llama."""
        nonlocal pos
        groups: list[list[tuple[str, bool]]] = [[]]
        while pos < n:
            seq = groups[-1]
            c = pattern[pos]
            if c == ".":
                seq.append((dot(), False))
                pos += 1
            elif c == "(":
                pos += 1
                if pos < n and pattern[pos] == "?":
                    raise GrammarError(f"unsupported pattern syntax '(?' at index {pos} of /{pattern}/")
                if len(groups) > MAX_PATTERN_NESTING:
                    raise GrammarTooLarge(f"pattern nests too deeply: more than {MAX_PATTERN_NESTING} groups inside "
                                          f"groups at index {pos - 1}, the limit is {MAX_PATTERN_NESTING} "
                                          f"(MAX_PATTERN_NESTING)")
                groups.append([])
            elif c == ")":
                pos += 1
                if len(groups) == 1:
                    raise GrammarError(f"unbalanced parentheses in pattern /{pattern}/")
                inner = joined(groups.pop())
                groups[-1].append((f"({to_rule(inner)})", False))
            elif c == "[":
                cls = c
                pos += 1
                while pos < n and pattern[pos] != "]":
                    if pattern[pos] == "\\":
                        cls += pattern[pos:pos + 2]
                        pos += 2
                    else:
                        cls += pattern[pos]
                        pos += 1
                if pos >= n:
                    raise GrammarError(f"unbalanced square brackets in pattern /{pattern}/")
                cls += "]"
                pos += 1
                seq.append((cls, False))
            elif c == "|":
                seq.append(("|", False))
                pos += 1
            elif c in "*+?":
                if not seq:
                    raise GrammarError(f"nothing to repeat at index {pos} of /{pattern}/")
                seq[-1] = (to_rule(seq[-1]) + c, False)
                pos += 1
            elif c == "{":
                end = pattern.find("}", pos)
                if end < 0:
                    raise GrammarError(f"unbalanced curly brackets in pattern /{pattern}/")
                quant = pattern[pos:end + 1]
                pos = end + 1
                nums = [s.strip() for s in quant[1:-1].split(",")]
                try:
                    if len(nums) == 1:
                        lo = hi = int(nums[0])
                    elif len(nums) == 2:
                        lo = int(nums[0]) if nums[0] else 0
                        hi = int(nums[1]) if nums[1] else None
                    else:
                        raise ValueError
                except ValueError:
                    raise GrammarError(f"invalid quantifier {quant} in /{pattern}/") from None
                if not seq:
                    raise GrammarError(f"nothing to repeat at index {pos} of /{pattern}/")
                sub, is_lit = seq[-1]
                if not is_lit:
                    sid = sub_ids.get(sub)
                    if sid is None:
                        sid = conv.add_rule(f"{name}-{len(sub_ids) + 1}", sub)
                        sub_ids[sub] = sid
                    sub = sid
                seq[-1] = (repeat_text(f'"{sub}"' if is_lit else sub, lo, hi), False)
            else:
                lit = ""
                while pos < n:
                    ch = pattern[pos]
                    if ch == "\\" and pos < n - 1:
                        nxt = pattern[pos + 1]
                        if nxt in _REGEX_ONLY_ESCAPES:
                            lit += nxt
                        else:
                            lit += pattern[pos:pos + 2]
                        pos += 2
                    elif ch == '"':
                        lit += '\\"'
                        pos += 1
                    elif ch not in _NON_LITERAL and (pos == n - 1 or lit == "" or pattern[pos + 1] == "."
                                                     or pattern[pos + 1] not in _NON_LITERAL):
                        lit += ch
                        pos += 1
                    else:
                        break
                if lit:
                    seq.append((lit, True))
        while len(groups) > 1:  # unclosed groups end with the pattern
            inner = joined(groups.pop())
            groups[-1].append((f"({to_rule(inner)})", False))
        return joined(groups[0])

    body = sequence()
    return conv.add_rule(name, '"\\"" (' + to_rule(body) + ') "\\""')
