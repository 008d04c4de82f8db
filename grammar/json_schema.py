"""JSON Schema -> GBNF with llama.cpp's semantics and rule names.

Reimplements the behaviour of llama.cpp's `json_schema_to_grammar` (common/json-schema-to-grammar
and examples/json_schema_to_grammar.py): the same rule names (`root`, `space`, `char`, `<prop>-kv`,
...), the same whitespace rule, digit-range rules for integer bounds, `char{m,n}` for string
lengths, regex `pattern` translation, string formats, `$ref`/`$defs` (recursion allowed),
anyOf/oneOf/allOf, enum/const, tuples and arrays with min/max items.

Public: `json_schema_to_gbnf(schema: dict) -> str`; `JSON_OBJECT_GBNF` for
response_format {"type": "json_object"} (any JSON object).
"""
from __future__ import annotations

import json
import re
from typing import Any

from .gbnf import GrammarError

SPACE_RULE = '| " " | "\\n"{1,2} [ \\t]{0,20}'

# name -> (body, dependencies)
_PRIMITIVES: dict[str, tuple[str, list[str]]] = {
    "boolean": ('("true" | "false")', []),
    "decimal-part": ("[0-9]{1,16}", []),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", []),
    "number": ('("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?',
               ["integral-part", "decimal-part"]),
    "integer": ('("-"? integral-part)', ["integral-part"]),
    "value": ("object | array | string | number | boolean | null",
              ["object", "array", "string", "number", "boolean", "null"]),
    "object": ('"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"',
               ["string", "value"]),
    "array": ('"[" space ( value ("," space value)* )? space "]"', ["value"]),
    "uuid": ('"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
             '[0-9a-fA-F]{12} "\\""', []),
    "char": ('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})', []),
    "string": ('"\\"" char* "\\""', ["char"]),
    "null": ('"null"', []),
}

_FORMATS: dict[str, tuple[str, list[str]]] = {
    "date": ('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )', []),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? '
             '( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )', []),
    "date-time": ('date "T" time', ["date", "time"]),
    "date-string": ('"\\"" date "\\""', ["date"]),
    "time-string": ('"\\"" time "\\""', ["time"]),
    "date-time-string": ('"\\"" date-time "\\""', ["date-time"]),
}

_DOT = "[^\\x0A\\x0D]"
_RESERVED = {"root", "dot", *_PRIMITIVES, *_FORMATS}
_BAD_NAME_CHARS = re.compile(r"[^a-zA-Z0-9-]+")
_LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}
_NON_LITERAL = set("|.()[]{}*+?")
_REGEX_ONLY_ESCAPES = set("^$.[]()|{}*+?")


def _literal(s: str) -> str:
    return '"' + "".join(_LITERAL_ESCAPES.get(c, c) for c in s) + '"'


def _const(value: Any) -> str:
    return _literal(json.dumps(value))


def _repeat(item: str, lo: int, hi: int | None, sep: str = "") -> str:
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
    body = item + " " + _repeat(f"({sep} {item})", max(lo - 1, 0), None if hi is None else hi - 1)
    return f"({body})?" if lo == 0 else body


class _IntRange:
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


class _Converter:
    def __init__(self) -> None:
        self.rules: dict[str, str] = {"space": SPACE_RULE}
        self.refs: dict[str, Any] = {}
        self.resolving: set[str] = set()

    # --- rule table ---------------------------------------------------------------------------
    def add_rule(self, name: str, body: str) -> str:
        key = _BAD_NAME_CHARS.sub("-", name)
        if key in self.rules and self.rules[key] != body:
            i = 0
            while f"{key}{i}" in self.rules and self.rules[f"{key}{i}"] != body:
                i += 1
            key = f"{key}{i}"
        self.rules[key] = body
        return key

    def add_primitive(self, name: str, prim: tuple[str, list[str]]) -> str:
        key = self.add_rule(name, prim[0])
        for dep in prim[1]:
            if dep not in self.rules:
                self.add_primitive(dep, _PRIMITIVES.get(dep) or _FORMATS[dep])
        return key

    def format(self) -> str:
        return "\n".join(f"{k} ::= {v}" for k, v in sorted(self.rules.items()))

    # --- $ref ---------------------------------------------------------------------------------
    def collect_refs(self, root: Any) -> None:
        def visit(node: Any) -> None:
            if isinstance(node, list):
                for x in node:
                    visit(x)
            elif isinstance(node, dict):
                ref = node.get("$ref")
                if isinstance(ref, str) and ref not in self.refs:
                    if not ref.startswith("#"):
                        raise GrammarError(f"unsupported $ref {ref!r} (only local '#/...' references)")
                    target = root
                    for sel in ref[1:].split("/")[1:]:
                        sel = sel.replace("~1", "/").replace("~0", "~")
                        if isinstance(target, list) and sel.isdigit() and int(sel) < len(target):
                            target = target[int(sel)]
                        elif isinstance(target, dict) and sel in target:
                            target = target[sel]
                        else:
                            raise GrammarError(f"error resolving $ref {ref!r}: {sel!r} not found")
                    self.refs[ref] = target
                for v in node.values():
                    visit(v)
        visit(root)

    def resolve_ref(self, ref: str) -> str:
        name = "ref" + _BAD_NAME_CHARS.sub("-", ref.split("#")[-1])
        if name not in self.rules and ref not in self.resolving:
            self.resolving.add(ref)
            name = self.visit(self.refs[ref], name)
            self.resolving.discard(ref)
        return name

    # --- schema nodes -------------------------------------------------------------------------
    def union(self, name: str, alts: list[Any]) -> str:
        return " | ".join(self.visit(s, f"{name}{'-' if name else 'alternative-'}{i}") for i, s in enumerate(alts))

    def visit(self, schema: Any, name: str) -> str:
        if schema is True:
            schema = {}
        if not isinstance(schema, dict):
            raise GrammarError(f"unrecognized schema: {json.dumps(schema)}")
        typ = schema.get("type")
        fmt = schema.get("format")
        rule_name = name + "-" if name in _RESERVED else (name or "root")

        if "$ref" in schema:
            return self.add_rule(rule_name, self.resolve_ref(schema["$ref"]))
        if "oneOf" in schema or "anyOf" in schema:
            return self.add_rule(rule_name, self.union(name, schema.get("oneOf") or schema["anyOf"]))
        if isinstance(typ, list):
            return self.add_rule(rule_name, self.union(name, [{**schema, "type": t} for t in typ]))
        if "const" in schema:
            return self.add_rule(rule_name, _const(schema["const"]))
        if "enum" in schema:
            return self.add_rule(rule_name, "(" + " | ".join(_const(v) for v in schema["enum"]) + ")")
        if typ in (None, "object") and ("properties" in schema or (
                "additionalProperties" in schema and schema["additionalProperties"] is not True)):
            props = list(schema.get("properties", {}).items())
            return self.add_rule(rule_name, self.object_rule(props, set(schema.get("required", [])), name,
                                                             schema.get("additionalProperties")))
        if typ in (None, "object", "string") and "allOf" in schema:
            return self.all_of(schema, name, rule_name)
        if typ in (None, "array") and ("items" in schema or "prefixItems" in schema):
            items = schema.get("items", schema.get("prefixItems"))
            sep = "-" if name else ""
            if isinstance(items, list):
                parts = ' "," space '.join(self.visit(it, f"{name}{sep}tuple-{i}") for i, it in enumerate(items))
                return self.add_rule(rule_name, f'"[" space {parts} space "]"')
            item = self.visit(items, f"{name}{sep}item")
            rep = _repeat(item, int(schema.get("minItems", 0)),
                          None if schema.get("maxItems") is None else int(schema["maxItems"]), sep='"," space')
            return self.add_rule(rule_name, f'"[" space {rep} space "]"')
        if typ in (None, "string") and "pattern" in schema:
            return self.pattern(schema["pattern"], rule_name)
        if typ in (None, "string") and re.fullmatch(r"uuid[1-5]?", fmt or ""):
            return self.add_primitive("root" if rule_name == "root" else fmt, _PRIMITIVES["uuid"])
        if typ in (None, "string") and f"{fmt}-string" in _FORMATS:
            prim = f"{fmt}-string"
            return self.add_rule(rule_name, self.add_primitive(prim, _FORMATS[prim]))
        if typ == "string" and ("minLength" in schema or "maxLength" in schema):
            char = self.add_primitive("char", _PRIMITIVES["char"])
            hi = schema.get("maxLength")
            rep = _repeat(char, int(schema.get("minLength", 0)), None if hi is None else int(hi))
            return self.add_rule(rule_name, f'"\\"" {rep} "\\""')
        if typ in (None, "integer") and any(k in schema for k in ("minimum", "exclusiveMinimum", "maximum",
                                                                   "exclusiveMaximum")):
            lo = hi = None
            if "minimum" in schema:
                lo = schema["minimum"]
            elif "exclusiveMinimum" in schema:
                lo = schema["exclusiveMinimum"] + 1
            if "maximum" in schema:
                hi = schema["maximum"]
            elif "exclusiveMaximum" in schema:
                hi = schema["exclusiveMaximum"] - 1
            lo = None if lo is None else _int_bound(lo, up=True)
            hi = None if hi is None else _int_bound(hi, up=False)
            if lo is not None and hi is not None and lo > hi:
                raise GrammarError(f"integer range [{lo}, {hi}] is empty")
            r = _IntRange()
            r.build(lo, hi)
            return self.add_rule(rule_name, "(" + "".join(r.out) + ")")
        if typ == "object" or len(schema) == 0:
            return self.add_rule(rule_name, self.add_primitive("object", _PRIMITIVES["object"]))
        if typ is None:
            return self.add_rule(rule_name, self.add_primitive("value", _PRIMITIVES["value"]))
        if typ not in _PRIMITIVES:
            raise GrammarError(f"unrecognized schema: {json.dumps(schema)}")
        return self.add_primitive("root" if rule_name == "root" else typ, _PRIMITIVES[typ])

    def all_of(self, schema: dict, name: str, rule_name: str) -> str:
        required: set[str] = set()
        props: list[tuple[str, Any]] = []
        enum_sets: list[list[Any]] = []

        def add(comp: dict, is_required: bool) -> None:
            if "$ref" in comp:
                comp = self.refs[comp["$ref"]]
            for k, v in comp.get("properties", {}).items():
                props.append((k, v))
                if is_required:
                    required.add(k)
            if "enum" in comp:
                enum_sets.append(list(comp["enum"]))

        for comp in schema["allOf"]:
            if "anyOf" in comp:
                for sub in comp["anyOf"]:
                    add(sub, False)
            else:
                add(comp, True)
        if enum_sets:
            common = [v for v in enum_sets[0] if all(v in s for s in enum_sets[1:])]
            if common:
                try:
                    common = sorted(common)
                except TypeError:
                    pass
                return self.add_rule(rule_name, "(" + " | ".join(_const(v) for v in common) + ")")
        return self.add_rule(rule_name, self.object_rule(props, required, name, None))

    def object_rule(self, props: list[tuple[str, Any]], required: set[str], name: str, additional: Any) -> str:
        sep = "-" if name else ""
        kv: dict[str, str] = {}
        for prop, sub in props:
            value_rule = self.visit(sub, f"{name}{sep}{prop}")
            kv[prop] = self.add_rule(f"{name}{sep}{prop}-kv", f"{_const(prop)} space \":\" space {value_rule}")
        names = [p for p, _ in props]
        req = [p for p in names if p in required]
        opt = [p for p in names if p not in required]
        if additional is not None and additional is not False:
            sub_name = f"{name}{sep}additional"
            value_rule = (self.visit(additional, f"{sub_name}-value") if isinstance(additional, dict)
                          else self.add_primitive("value", _PRIMITIVES["value"]))
            key_rule = (self.add_primitive("string", _PRIMITIVES["string"]) if not names
                        else self.add_rule(f"{sub_name}-k", self.not_strings(names)))
            kv["*"] = self.add_rule(f"{sub_name}-kv", f'{key_rule} ":" space {value_rule}')
            opt.append("*")

        rule = '"{" space ' + ' "," space '.join(kv[k] for k in req)
        if opt:
            rule += " ("
            if req:
                rule += ' "," space ( '

            def chain(keys: list[str], first_optional: bool) -> str:
                k, rest = keys[0], keys[1:]
                comma = f'( "," space {kv[k]} )'
                if first_optional:
                    res = comma + ("*" if k == "*" else "?")
                else:
                    res = kv[k] + (" " + comma + "*" if k == "*" else "")
                if rest:
                    res += " " + self.add_rule(f"{name}{sep}{k}-rest", chain(rest, True))
                return res

            rule += " | ".join(chain(opt[i:], False) for i in range(len(opt)))
            if req:
                rule += " )"
            rule += " )?"
        return rule + ' space "}"'

    def not_strings(self, strings: list[str]) -> str:
        """A JSON string that is none of `strings` (for additionalProperties keys)."""
        trie: dict = {}
        for s in strings:
            node = trie
            for c in s:
                node = node.setdefault(c, {})
            node[""] = True  # end marker
        char = self.add_primitive("char", _PRIMITIVES["char"])
        out = ['["] ( ']

        def visit(node: dict) -> None:
            rejects = []
            first = True
            for c in sorted(k for k in node if k != ""):
                child = node[c]
                rejects.append(c)
                if not first:
                    out.append(" | ")
                first = False
                out.append(f"[{c}]")
                if any(k != "" for k in child):
                    out.append(" (")
                    visit(child)
                    out.append(")")
                elif child.get(""):
                    out.append(f" {char}+")
            if any(k != "" for k in node):
                if not first:
                    out.append(" | ")
                out.append(f'[^"{"".join(rejects)}] {char}*')

        visit(trie)
        out.append(f' ){"" if trie.get("") else "?"} ["]')
        return "".join(out)

    def pattern(self, pattern: str, name: str) -> str:
        """Translate a JSON-schema regex (unanchored unless ^/$ given) into a GBNF rule."""
        pattern = pattern[1:] if pattern.startswith("^") else ".*" + pattern
        pattern = pattern[:-1] if pattern.endswith("$") else pattern + ".*"
        sub_ids: dict[str, str] = {}
        n = len(pattern)
        pos = 0

        def to_rule(item: tuple[str, bool]) -> str:
            return f'"{item[0]}"' if item[1] else item[0]

        def dot() -> str:
            return self.add_rule("dot", _DOT)

        def seq_until_close(start: int) -> tuple[str, bool]:
            nonlocal pos
            seq: list[tuple[str, bool]] = []

            def joined() -> tuple[str, bool]:
                merged: list[tuple[str, bool]] = []
                for item in seq:
                    if item[1] and merged and merged[-1][1]:
                        merged[-1] = (merged[-1][0] + item[0], True)
                    else:
                        merged.append(item)
                if len(merged) == 1:
                    return merged[0]
                return " ".join(to_rule(x) for x in seq), False

            while pos < n:
                c = pattern[pos]
                if c == ".":
                    seq.append((dot(), False))
                    pos += 1
                elif c == "(":
                    pos += 1
                    if pos < n and pattern[pos] == "?":
                        raise GrammarError(f"unsupported pattern syntax '(?' at index {pos} of /{pattern}/")
                    seq.append((f"({to_rule(seq_until_close(pos))})", False))
                elif c == ")":
                    pos += 1
                    if not (start > 0 and pattern[start - 1] == "("):
                        raise GrammarError(f"unbalanced parentheses in pattern /{pattern}/")
                    return joined()
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
                            sid = self.add_rule(f"{name}-{len(sub_ids) + 1}", sub)
                            sub_ids[sub] = sid
                        sub = sid
                    seq[-1] = (_repeat(f'"{sub}"' if is_lit else sub, lo, hi), False)
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
            return joined()

        body = seq_until_close(0)
        return self.add_rule(name, '"\\"" (' + to_rule(body) + ') "\\""')


def _int_bound(v: Any, up: bool) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise GrammarError(f"integer bound must be a number, got {v!r}")
    if isinstance(v, float) and not v.is_integer():
        import math
        return math.ceil(v) if up else math.floor(v)
    return int(v)


def json_schema_to_gbnf(schema: Any) -> str:
    """Convert a JSON schema (dict) to llama.cpp-style GBNF. Raises GrammarError."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(f"invalid JSON schema: {e}") from None
    conv = _Converter()
    try:
        conv.collect_refs(schema)
        conv.visit(schema, "")
    except RecursionError:
        raise GrammarError("JSON schema nests too deeply") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, GrammarError):
            raise
        raise GrammarError(f"unsupported JSON schema: {type(e).__name__}: {e}") from None
    return conv.format()


JSON_OBJECT_GBNF = json_schema_to_gbnf({"type": "object"})
